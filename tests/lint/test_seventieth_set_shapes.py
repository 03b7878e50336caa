"""Shapes of KL code met in the sixty-ninth and seventieth fresh sets.

wuwowuyi/DPO-and-GRPO-implementation's GRPO forms k3 = r - 1 - log r per token and returns
`torch.maximum(kl, torch.zeros_like(kl))`, since rounding makes some values slightly negative. k3 is never negative
in exact arithmetic, so the larger of it and 0 is k3 itself: added to the loss it is row 3 of kl-math.md section 8
(KL002); so with k2, a per-token loss (row 2, KL003). The larger of 0 and a k1 log-ratio, which is negative on half the tokens, is a hinge, no estimator.
"""

from __future__ import annotations

import pytest
from snippets import module_codes

CLAMPED_AT_ZERO = """\
import torch


class GRPO:
    def kl_divergence(self, logp, logp_ref):
        kl = torch.exp(logp_ref - logp) - (logp_ref - logp) - 1
        return torch.maximum(kl, torch.zeros_like(kl))

    def compute_loss(self, responses, rewards, logp_ref):
        logp = self.log_prob(responses)
        ratio = torch.exp(logp - logp.detach())
        kl = self.kl_divergence(logp, logp_ref)
        loss = self.config["kl_coef"] * kl - rewards * ratio
        mask = (responses != 0).int()
        return (loss * mask).sum() / mask.sum()
"""


@pytest.mark.parametrize("estimate, codes", [
    ("torch.exp(logp_ref - logp) - (logp_ref - logp) - 1", [(13, "KL002")]),  # k3: never negative, itself
    ("0.5 * (logp - logp_ref) ** 2", [(13, "KL003")]),  # k2: never negative, itself: a per-token loss (row 2)
    ("logp - logp_ref", []),  # k1: relu(k1) is a hinge, no estimator
])
def test_the_larger_of_a_never_negative_estimate_and_zero_is_the_estimate(tmp_path, estimate, codes):
    source = CLAMPED_AT_ZERO.replace("torch.exp(logp_ref - logp) - (logp_ref - logp) - 1", estimate)
    assert module_codes(source, tmp_path) == codes


@pytest.mark.parametrize("first_line, codes", [
    ("#!/usr/bin/env bash", []),  # kirang89/ocamler-grpo's scripts/run-rlvr-training.py: a bash wrapper
    ("#!/bin/sh", []),
    ("#!/usr/bin/env python3", ["KL000"]),  # a Python script that does not parse is still broken
    ("", ["KL000"]),
])
def test_a_file_whose_first_line_runs_another_program_is_no_broken_python(tmp_path, first_line, codes):
    from klaudit.config import Settings
    from klaudit.lint.engine import lint_paths

    script = tmp_path / "run-training.py"
    script.write_text(f"{first_line}\nnohup uv run python -m rlvr.train >training.log 2>&1 &\n")
    found = lint_paths([str(script)], settings=Settings(root=tmp_path), jobs=1).findings
    assert [f.code for f in found] == codes
    # with KL vocabulary it would be analysed: it is not, and an informational KL099 says why
    script.write_text(script.read_text() + "# kl_coef=0.1\n")
    found = lint_paths([str(script)], settings=Settings(root=tmp_path), jobs=1).findings
    assert [(f.code, "not Python" in f.message) for f in found] == [("KL099", True)] if not codes else \
        [f.code for f in found] == codes


# kirang89/ocamler-grpo: rlvr/config.py builds TRL's GRPOConfig inside a function from
# `beta = float(os.environ.get("GRPO_BETA", str(DEFAULT_BETA)))` (DEFAULT_BETA = 0.0); the .envrc that direnv loads,
# as the README says, exports GRPO_BETA=0.01. TRL 1.16 without the bias correction: a plain k3 loss (row 3, KL002).
ENV_CONFIG = """\
import os

from trl import GRPOConfig

DEFAULT_BETA = 0.0


def build():
    beta = float(os.environ.get("GRPO_BETA", str(DEFAULT_BETA)))
    return GRPOConfig(output_dir="out", beta=beta, use_bias_correction_kl=False)
"""


@pytest.mark.parametrize("files, expected", [
    ({".envrc": "export GRPO_BETA=0.01\n"}, [("KL002", "GRPO_BETA=0.01 at .envrc:1")]),
    ({".env": "GRPO_BETA='0.01'  # the run's\n"}, [("KL002", "GRPO_BETA=0.01 at .env:1")]),
    ({}, []),  # the variable unset: the default, beta 0, no KL (nor a finding)
    ({".env": "GRPO_BETA=0.01\n", ".envrc": "export GRPO_BETA=0.0\n"}, []),  # two values: none is assumed
])
def test_an_environment_read_takes_the_value_the_projects_environment_files_set(tmp_path, files, expected):
    from klaudit.config import Settings
    from klaudit.lint.engine import lint_paths

    (tmp_path / "config.py").write_text(ENV_CONFIG)
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\ndependencies = ["trl==1.16.0"]\n')
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    found = lint_paths([str(tmp_path)], settings=Settings(root=tmp_path), jobs=1).findings
    assert [(f.code, next(iter(expected))[1] in f.message if expected else "") for f in found] == \
        [(code, True) for code, _ in expected]
