"""The check-grad command: JSON schema, exit codes, and one clear line per bad input (child process)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

pytest.importorskip("torch")

from klaudit.cli import main  # noqa: E402

DATA = Path(__file__).parent / "data"


def _run(*args: str):
    return CliRunner().invoke(main, ["check-grad", *args])


def test_json_schema_and_exit_zero_for_an_unbiased_term():
    result = _run(f"{DATA}/correct_estimators.py::k1_kl_loss", "--output-format", "json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert list(report) == ["version", "results", "errors", "notes"] and report["errors"] == []
    (row,) = report["results"]
    assert list(row) == ["target", "mode", "placement", "configuration", "objective", "unbiased", "cos_rev",
                         "rel_err_rev", "value_bias", "rule", "fix", "used"]
    assert row["mode"] == {} and row["placement"] == "loss" and row["objective"] == "REV" and row["unbiased"]


def test_switch_rows_placement_override_and_exit_one():
    result = _run(f"{DATA}/openrlhf_style.py::compute_approx_kl", "--format", "json", "--placement", "reward")
    assert result.exit_code == 1, result.output
    rows = json.loads(result.stdout)["results"]
    assert [(r["mode"], r["placement"], r["objective"]) for r in rows] == [
        ({"kl_estimator": "k1"}, "reward", "REV"), ({"kl_estimator": "k2"}, "reward", "OTHER"),
        ({"kl_estimator": "k3"}, "reward", "OTHER")]
    assert [(r["unbiased"], r["rule"]) for r in rows] == [(False, "KL010"), (False, "KL004"), (False, "KL004")]
    assert rows[1]["configuration"] == "k2 in the reward (reward-to-go), token-sum, on-policy"  # clamped at 10


def test_text_table_and_bind_override(tmp_path):
    source = tmp_path / "custom.py"
    source.write_text("def my_kl(a, b, m):\n    return 0.5 * ((a - b) * m) ** 2\n")
    result = _run(f"{source}::my_kl", "--bind", "a=logprobs", "--bind", "b=ref_logprobs", "--bind", "m=mask",
                  "--placement", "loss")
    assert result.exit_code == 1, result.output
    assert "k2 differentiated as a loss, token-sum, on-policy" in result.stdout and "biased (KL003)" in result.stdout
    assert "PART    sum_t E[grad KL_t(h_t)] with the prefix distribution frozen" in result.stdout  # the legend
    assert "checking" not in result.stderr  # no progress display off a terminal


@pytest.mark.parametrize("target, extra, message", [
    ("broken_import.py::kl_loss", [], "import failed: RuntimeError: this trainer needs a GPU at import"),
    ("broken_terms.py::raises_kl", [], "raises_kl raised RuntimeError: the reference model is not loaded"),
    ("broken_terms.py::unbindable_kl", [], "cannot bind parameter frobnicate"),
    ("broken_terms.py::slow_kl", ["--timeout", "2"], "timed out after 2 s"),
    ("missing.py::kl", [], "missing.py: no such file"),
    ("broken_terms.py::raises_kl", ["--bind", "logprobs"], "--bind 'logprobs' is not PARAM=ROLE"),
])
def test_bad_input_is_one_line_and_exit_two(target, extra, message):
    """Through the child process; every other bad result is covered in process by test_runner.py."""
    result = _run(str(DATA / target) if target != "missing.py::kl" else target, *extra)
    assert result.exit_code == 2, result.output
    error_lines = [line for line in result.output.splitlines() if message in line]
    assert len(error_lines) == 1, result.output
    assert "Traceback" not in result.output


def test_verbose_shows_the_traceback():
    result = _run(f"{DATA}/broken_terms.py::raises_kl", "--verbose")
    assert result.exit_code == 2
    assert "Traceback" in result.stderr and "RuntimeError: the reference model is not loaded" in result.stderr


def test_file_without_kl_functions(tmp_path):
    source = tmp_path / "plain.py"
    source.write_text("def add(a, b):\n    return a + b\n")
    result = _run(str(source))
    assert result.exit_code == 2 and "no KL function that can be called alone" in result.output


def test_a_training_step_is_not_called_but_its_inline_kl_is_audited(tmp_path):
    """A file whose only KL function needs a model and an optimizer: the step is never called; its KL
    statements, with the reference log-probs read from the batch by key, are audited (test_inline.py)."""
    source = tmp_path / "trainer.py"
    source.write_text(
        "def train_step(policy, optimizer, batch, beta):\n"
        "    logprobs = policy(batch['input_ids'])\n"
        "    kl = logprobs - batch['ref_logprobs']\n"
        "    loss = beta * kl.mean()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n")
    result = _run(str(source), "--output-format", "json")
    assert result.exit_code == 1, result.output
    report = json.loads(result.stdout)
    (row,) = report["results"]
    assert row["target"] == f"{source}:3-3 (inline KL of train_step)"
    assert (row["placement"], row["objective"], row["rule"], row["used"]) == ("loss", "ZERO", "KL001", True)
    assert report["notes"] == []  # the step's own "cannot be called alone" line gives way to its audited KL


def test_a_training_step_whose_kl_cannot_be_cut_out_is_listed(tmp_path):
    source = tmp_path / "trainer.py"
    source.write_text(
        "def train_step(policy, optimizer, batch, beta):\n"
        "    logprobs = policy(batch['input_ids'])\n"
        "    kl = (logprobs - batch['ref_logprobs']) * batch['weights']\n"
        "    loss = beta * kl.mean()\n"
        "    loss.backward()\n")
    result = _run(str(source), "--output-format", "json")
    assert result.exit_code == 2
    note, inline = json.loads(result.stdout)["notes"]
    assert "train_step computes a KL term but cannot be called alone" in note
    assert "no parameter takes the policy log-probs or logits" in note and "policy, optimizer, batch" in note
    # batch['weights'] binds to no role: the slice would lack a value
    assert "the KL term formed at line 3 cannot be cut out of it: 'batch' comes from outside" in inline


def test_fail_on_used_counts_the_rows_the_code_uses():
    """The fixed R-C fixture: its k3 helper alone is biased either way, but the code uses it as k3 loss
    plus k3 reward-to-go (row 13, REV): exit 1 by default, 0 with --fail-on used. The bad twin's
    used row (clamped, KL010) still fails."""
    fixtures = Path(__file__).parents[2] / "fixtures"
    fixed = _run(f"{fixtures}/fixed/k3_loss_and_reward_clamped.py::k3")
    assert fixed.exit_code == 1 and "loss+reward (used)" in fixed.output
    assert _run(f"{fixtures}/fixed/k3_loss_and_reward_clamped.py::k3", "--fail-on", "used").exit_code == 0
    bad = _run(f"{fixtures}/bad/k3_loss_and_reward_clamped.py::low_var_kl", "--fail-on", "used")
    assert bad.exit_code == 1


def test_exit_code_for_used_rows_only():
    from klaudit.audit.report import Report, ResultRow

    def row(target, placement, unbiased, used):
        return ResultRow(target=target, mode={}, placement=placement, configuration="", objective="REV",
                         unbiased=unbiased, cos_rev=1.0, rel_err_rev=0.0, value_bias=0.0, rule=None, fix="",
                         used=used)

    known = [row("a", "loss", False, False), row("a", "reward", True, True)]
    assert Report(known).exit_code_for(used_only=False) == 1
    assert Report(known).exit_code_for(used_only=True) == 0
    unknown = [row("b", "loss", False, False), row("b", "reward", True, False)]  # no use found: all count
    assert Report(known + unknown).exit_code_for(used_only=True) == 1
    assert Report(known, ["b: import failed"]).exit_code_for(used_only=True) == 2


def test_a_trainer_file_audits_the_helpers_of_other_files_its_kl_comes_from(tmp_path):
    """check-grad on the file the lint reports (the loss) audits the helper that forms the estimator,
    in the module the lint traces it to, with the placement the trainer gives it."""
    package = tmp_path / "rlpkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "kl.py").write_text(
        "import torch\n\n\ndef k3_estimate(logprobs, ref_logprobs):\n"
        "    log_ratio = ref_logprobs - logprobs\n    return torch.exp(log_ratio) - log_ratio - 1\n")
    (package / "trainer.py").write_text(
        "from rlpkg.kl import k3_estimate\n\n\ndef train_step(policy, batch, optimizer, beta):\n"
        "    logprobs = policy(batch)\n    kl = k3_estimate(logprobs, batch.ref)\n"
        "    loss = beta * kl.mean()\n    loss.backward()\n")
    result = _run(str(package / "trainer.py"), "--output-format", "json")
    report = json.loads(result.stdout)
    assert result.exit_code == 1, result.output
    assert {(row["target"], row["placement"], row["rule"], row["used"]) for row in report["results"]} == {
        (f"{package / 'kl.py'}::k3_estimate", "loss", "KL002", True),
        (f"{package / 'kl.py'}::k3_estimate", "reward", "KL004", False)}


def test_a_verl_shaped_package_is_audited_through_the_helper_its_loss_calls_without_installing_it():
    """verl 0.9's shape: the package's __init__ imports what is not installed (stubbed), the loss calls a
    helper that strips a '+' suffix and calls the plain estimator. check-grad audits the helper the loss
    calls, so the straight-through values are audited too: k1+ and k3+ take k2's gradient (row 2). The loss
    itself reads the estimator from its `config` parameter: bound as the switches, it is audited at the same
    values, with its own aggregation (a sum per sequence, averaged)."""
    package = Path(__file__).parent / "data" / "straight_through_pkg"
    result = _run(str(package / "losses.py"), "--output-format", "json")
    report = json.loads(result.stdout)
    assert not report["errors"], report["errors"]
    # the helper named as the user would name its file: relative to the working directory
    helper = f"{os.path.relpath((package / 'core_algos.py').resolve())}::kl_penalty"
    assert {row["target"] for row in report["results"]} == {helper, f"{package / 'losses.py'}::kl_loss"}
    expected = {"k1": "KL001", "k2": "KL003", "k3": "KL002", "k1+": "KL003", "k2+": "KL003", "k3+": "KL003"}
    loss = {row["mode"]["kl_penalty"]: row["rule"] for row in report["results"]
            if row["placement"] == "loss" and row["target"] == helper}
    assert loss == expected
    assert {row["mode"]["kl_loss_type"]: row["rule"] for row in report["results"] if row["target"] != helper} == expected
    assert any("stubbed: klaudit_fixture_absent_runtime" in note for note in report["notes"])


def test_a_torch_compiled_kl_function_is_audited_as_written_with_its_switch_values(tmp_path):
    # miles' compute_approx_kl: @torch.compile over a string switch. The switch values are read from the
    # user's function, not the compile wrapper, and the function runs as written (no compile worker thread)
    (tmp_path / "compiled_kl.py").write_text(
        "import torch\n\n\n@torch.compile(dynamic=True)\n"
        "def approx_kl(log_probs, log_probs_base, kl_loss_type: str):\n"
        "    log_ratio = log_probs - log_probs_base\n"
        "    if kl_loss_type == 'k1':\n        return log_ratio\n"
        "    if kl_loss_type == 'k3':\n        return (-log_ratio).exp() - 1 + log_ratio\n"
        "    raise ValueError(kl_loss_type)\n")
    result = _run(f"{tmp_path}/compiled_kl.py::approx_kl", "--format", "json", "--placement", "loss")
    report = json.loads(result.stdout)
    assert report["errors"] == [], report
    assert [(r["mode"], r["objective"], r["rule"]) for r in report["results"]] == [
        ({"kl_loss_type": "k1"}, "ZERO", "KL001"), ({"kl_loss_type": "k3"}, "PFWD", "KL002")]
