"""Python as written in real trainers: closures, comprehensions, containers, calls of callable values.

Each snippet spells a configuration of kl-math.md section 8 through one construct; the expected
code is the row's verdict (k3 as a loss: row 3, KL002; k3 in the reward: row 7, KL004; k2 as a
loss: row 2, KL003), and the same snippet with a correct estimator gives nothing.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import libcst as cst
import pytest

from klaudit.lint.checks import check_module
from klaudit.lint.project import Project

K3 = "torch.exp(ref_logp - logp) - (ref_logp - logp) - 1"


def codes(source: str, tmp_path: Path) -> list:
    path = tmp_path / "snippet.py"
    text = textwrap.dedent(source)
    path.write_text(text)
    findings = check_module(str(path), cst.parse_module(text), Project([tmp_path]), text)
    return sorted((f.line, f.code) for f in findings)


def test_closure_reads_the_enclosing_log_ratio(tmp_path):
    source = """\
        import torch


        def train_step(logp, ref_logp, mask, schedule):
            diff = logp - ref_logp

            def loss_func(pg_loss):
                kl_loss = (0.5 * diff * diff * mask).sum() / mask.sum()
                return pg_loss + kl_loss

            return schedule(loss_func)
        """
    assert codes(source, tmp_path) == [(8, "KL003")]


def test_nested_helper_called_with_arguments(tmp_path):
    source = """\
        import torch


        def train_step(logp, ref_logp, mask):
            def penalty(a, b):
                r = b - a
                return torch.exp(r) - r - 1

            kl_loss = (penalty(logp, ref_logp) * mask).sum() / mask.sum()
            kl_loss.backward()
        """
    assert codes(source, tmp_path) == [(9, "KL002")]


def test_closure_with_a_correct_estimator_is_silent(tmp_path):
    source = """\
        from klaudit.estimators import kl_penalty


        def train_step(logp, ref_logp, mask, schedule):
            def loss_func(pg_loss):
                return pg_loss + kl_penalty(logp, ref_logp, mask).loss.mean()

            return schedule(loss_func)
        """
    assert codes(source, tmp_path) == []


HELPER = f"import torch\n\n\ndef k3(logp, ref_logp):\n    return {K3}\n\n\n"


@pytest.mark.parametrize("body", [
    "kls = [k3(logps[i], ref_logps[i]) for i in range(len(logps))]\n    kl_loss = torch.stack(kls).mean()",
    "kl_loss = sum(k3(lp, rp).mean() for lp, rp in zip(logps, ref_logps))",
    "kl_loss = torch.cat([k3(lp, rp) for lp, rp in zip(logps, ref_logps)]).mean()",
    "for i, (lp, rp) in enumerate(zip(logps, ref_logps)):\n        kl_loss = k3(lp, rp).mean()",
])
def test_lists_of_per_sample_terms_keep_their_meaning(body, tmp_path):
    source = HELPER + f"def step(logps, ref_logps):\n    {body}\n    kl_loss.backward()\n"
    found = codes(source, tmp_path)
    assert [code for _, code in found] == ["KL002"]


def test_comprehension_variables_do_not_leak(tmp_path):
    source = HELPER + (
        "def step(logps, ref_logps, rewards):\n"
        "    stats = [k3(logp, ref_logp).sum() for logp, ref_logp in zip(logps, ref_logps)]\n"
        "    token_rewards = rewards - 0.1 * logp\n"
        "    return token_rewards, stats\n"
    )
    assert codes(source, tmp_path) == []
