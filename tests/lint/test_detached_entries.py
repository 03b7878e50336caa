"""A rollout container's entry is read as data, without gradient, unless the function shows otherwise: an entry it
detaches somewhere (`exp(mb["logps"] - mb["logps"].detach())`) is one its author knows to carry the policy's
gradient, so a KL term made of it is differentiated (kl-math.md section 8: k3 as a loss is row 3, KL002)."""

from __future__ import annotations

from snippets import module_codes

from klaudit.lint.syntax import detached_entries

LOSS = """\
import torch


def actor_loss(cfg, minibatch):
    ratio = torch.exp(minibatch["logps"] - minibatch["logps"]{old})
    losses = -minibatch["advantages"] * ratio
    log_ratio = minibatch["ref_logps"] - minibatch["logps"]
    kl = log_ratio.exp() - 1 - log_ratio
    losses = losses + cfg.kl_coef * kl
    return losses.mean()
"""


def test_an_entry_the_function_detaches_carries_the_gradient(tmp_path):
    assert [code for _, code in module_codes(LOSS.format(old=".detach()"), tmp_path)] == ["KL002"]


def test_an_entry_never_detached_stays_data(tmp_path):
    source = LOSS.format(old="").replace('minibatch["logps"] - minibatch["logps"]', 'minibatch["logps"] - 0.0')
    assert module_codes(source, tmp_path) == []


def test_detached_entries_are_named_by_container_and_key():
    import libcst as cst

    module = cst.parse_module('def f(mb, out):\n    a = mb["logps"].detach() + out.x.detach() + mb["v"]\n')
    assert detached_entries(module.body[0]) == frozenset({("mb", "logps")})
