"""The two wings agree on verl and OpenRLHF as released (scripts/agreement.py, run here on two of its three
packages; TRL's takes longer and stays with the script): every KL site the lint reports there is audited by
check-grad, every audited branch carries the lint's rule, and no finding lacks a record. verl 0.9.1's
distillation losses reach kl_penalty through a function of configs and the model's output dict, and clamp
around it; its reward's KL008 comes from the actor's optimizer steps per rollout. Skipped where the wheels
can be neither downloaded nor found in the cache (benchmarks/real_packages.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", ["verl", "openrlhf"])
def test_lint_and_check_grad_agree_on_the_released_package(released_trees, name):
    sys.path.insert(0, str(ROOT))
    try:
        from scripts.agreement import audit_tree
    finally:
        sys.path.remove(str(ROOT))
    result = audit_tree(name, released_trees[name])
    reported = {(Path(f["filename"]).resolve(), f["location"]["row"]) for f in result["findings"]}
    audited = {(Path(v.site.path), v.site.line) for v in result["verdicts"] if v.audited}
    assert reported and reported <= audited, sorted(reported - audited)
    assert not result["unexplained"]
    assert all(v.agree for v in result["verdicts"] if v.audited), [
        (v.site.line, v.modes, v.reason) for v in result["verdicts"] if v.audited and not v.agree]


def test_any_checkout_counts_framework_flags_and_notebooks_apart(tmp_path):
    """`--tree` on a user's checkout: a finding on TRL's GRPOConfig judges TRL's KL code, and one in a notebook
    is code check-grad does not import; neither is a finding no lint record explains. The KL code of the
    checkout's own Python file is audited and agrees."""
    import json
    import shutil

    sys.path.insert(0, str(ROOT))
    try:
        from scripts.agreement import audit_tree
    finally:
        sys.path.remove(str(ROOT))
    for name in ("trl_grpo_config.py", "openrlhf_ppo.py"):
        shutil.copy(ROOT / "fixtures" / "bad" / name, tmp_path / name)
    cell = ["def kl_loss(logprobs, ref_logprobs, mask):\n", "    log_ratio = ref_logprobs - logprobs\n",
            "    kl = log_ratio.exp() - 1 - log_ratio\n", "    return (kl * mask).sum() / mask.sum()\n"]
    (tmp_path / "explore.ipynb").write_text(json.dumps({
        "cells": [{"cell_type": "code", "metadata": {}, "source": cell, "outputs": [], "execution_count": None}],
        "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    result = audit_tree("checkout", tmp_path)
    assert {Path(f["filename"]).name for f in result["flags"]} == {"trl_grpo_config.py"}
    assert {Path(f["filename"]).name for f in result["notebooks"]} == {"explore.ipynb"}
    assert {Path(f["filename"]).name for f in result["findings"]} == {"openrlhf_ppo.py"}
    assert not result["unexplained"] and result["verdicts"]
    assert all(v.agree for v in result["verdicts"] if v.audited)
