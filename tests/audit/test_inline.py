"""check-grad on a KL term written inline in a training step: the lint's slice, cut out as a function."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from klaudit.audit.inline import inline_slices

STEP = Path(__file__).parent / "data" / "inline" / "grpo_step.py"


def test_the_slice_is_the_kl_statements_with_inputs_bound_by_role_and_switches_as_parameters():
    (piece,), failures = inline_slices(str(STEP))
    assert failures == [] and piece.qualname == "StepTrainer.training_step" and piece.placement == "loss"
    assert (piece.first, piece.last) == (25, 39)  # from the old log-probs to the importance-weighted KL
    namespace: dict = {}
    exec(compile(piece.source, "slice", "exec"), namespace)  # noqa: S102 - klaudit's own generated code
    parameters = inspect.signature(namespace[piece.name]).parameters
    assert {name: p.default for name, p in parameters.items() if p.default is not p.empty} == {
        "ratio_level": "token", "kl_importance_correction": True}
    assert set(parameters) - {"ratio_level", "kl_importance_correction"} == {
        "per_token_logps", "ref_per_token_logps", "old_per_token_logps", "response_mask"}
    called = {node.func.attr for node in ast.walk(ast.parse(piece.source))
              if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)}
    assert "backward" not in called and "log_softmax" not in called  # nothing after the KL, no model


def test_a_value_that_neither_is_arithmetic_nor_binds_is_reported(tmp_path):
    source = STEP.read_text().replace(
        "        if self.kl_coef > 0:\n            token_kl = torch.exp(",
        "        shift = self.reference_shift(batch)\n        if self.kl_coef > 0:\n            token_kl = shift * torch.exp(")
    (tmp_path / "step.py").write_text(source)
    slices, (failure,) = inline_slices(str(tmp_path / "step.py"))
    assert slices == [] and "StepTrainer.training_step" in failure
    assert "'shift' comes from outside the step's arithmetic and does not bind by its name" in failure


def test_check_grad_audits_the_inline_term_on_policy_and_names_the_original_lines():
    pytest.importorskip("torch")
    from klaudit.audit.runner import run

    report = run([str(STEP)])
    assert report.errors == []
    rows = {(row.mode["ratio_level"], row.mode["kl_importance_correction"]): row for row in report.results}
    assert {row.target for row in report.results} == {f"{STEP}:25-39 (inline KL of StepTrainer.training_step)"}
    assert all(row.placement == "loss" and row.used for row in report.results)
    # ratio * k3 with the token ratio: PART, as k2 (kl-math.md row 2); k3 alone: PFWD (row 3)
    assert (rows["token", True].objective, rows["token", True].rule) == ("PART", "KL003")
    assert "ratio*k3 differentiated as a loss, token-sum, on-policy" in rows["token", True].same_gradient_as
    for key in (("token", False), ("sequence", False)):
        assert (rows[key].objective, rows[key].rule) == ("PFWD", "KL002")
    # the sequence ratio adds k3 x the sequence's score: k3 loss + k3 whole-sequence return = REV (rows 13, 6)
    assert rows["sequence", True].objective == "REV" and rows["sequence", True].unbiased
