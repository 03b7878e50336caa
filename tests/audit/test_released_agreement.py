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
