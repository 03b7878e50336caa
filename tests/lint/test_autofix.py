"""`klaudit lint --fix`: every fix applied to a copy of every bad fixture, compared with the fixed twin.

The comparison is semantic: the fixed file re-parses, re-lints without any finding of the codes its
fixes addressed (and with no code it did not have), a file whose every finding was fixed lints as
clean as its twin, and check-grad measures the same objective for the fixed function as for the
twin's. Findings without a fix say why.
"""

from __future__ import annotations

import ast
import json
import shutil
from collections import Counter
from pathlib import Path

import libcst as cst
import pytest
from click.testing import CliRunner

from klaudit import cli
from klaudit.lint.edits import SAFE, UNSAFE, Edit, Fix, apply_edits, apply_fixes
from klaudit.lint.engine import lint_paths
from klaudit.lint.findings import Finding
from klaudit.lint.fixing import applicabilities, fix_findings

FIXTURES = Path(__file__).parents[2] / "fixtures"

# (file, code) of every finding of fixtures/bad that gets a mechanical fix; the others are refused
# with a reason (a fix across a helper whose result the code reshapes, a choice between a loss and
# a reward, a sign, an estimator that needs logits, a name the analysis cannot pin down ...).
FIXED = Counter({
    ("grpo_pkg/loss.py", "KL002"): 1, ("grpo_pkg/loss.py", "KL008"): 1,
    ("grpo_single_file.py", "KL002"): 1, ("grpo_single_file.py", "KL007"): 1,
    ("gspo_token_rollout_fill.py", "KL002"): 1,
    ("indexed_kl_estimator.py", "KL001"): 1, ("indexed_kl_estimator.py", "KL002"): 1,
    ("indexed_kl_estimator.py", "KL003"): 2,
    ("length_normalized_kl.py", "KL007"): 1,
    ("megatron_closure_loss.py", "KL002"): 1, ("megatron_closure_loss.py", "KL008"): 1,
    ("openrlhf_ppo.py", "KL001"): 1, ("openrlhf_ppo.py", "KL002"): 1, ("openrlhf_ppo.py", "KL003"): 1,
    ("orz_flag_kl_loss.py", "KL001"): 1, ("orz_flag_kl_loss.py", "KL002"): 1, ("orz_flag_kl_loss.py", "KL009"): 1,
    ("ppo_gae_trainer.py", "KL004"): 1,
    ("optional_flag_distill.py", "KL003"): 2,
    ("verl_dp_actor.py", "KL001"): 1, ("verl_dp_actor.py", "KL002"): 1, ("verl_dp_actor.py", "KL003"): 3,
    ("verl_dp_actor.py", "KL008"): 1, ("verl_dp_actor.py", "KL009"): 1,
    ("verl_kl_config.yaml", "KL007"): 1, ("verl_ray_trainer.py", "KL004"): 3,
    ("trl_grpo_config.py", "KL007"): 1,  # loss_type="grpo" -> "dapo" in the GRPOConfig subclass
    # OpenRLHF's masked_mean of the clamped estimate -> kl_penalty with the old log-probs, as its fixed twin
    **{("openrlhf_kl_flags.py", code): 1 for code in ("KL001", "KL002", "KL003", "KL008", "KL010")},
})


def _relative(path: str, root: Path) -> str:
    return Path(path).resolve().relative_to(root.resolve()).as_posix()


@pytest.fixture(scope="module")
def fixed_tree(tmp_path_factory):
    """A copy of fixtures/bad with every fix applied: (root, findings before, fix run, findings after)."""
    root = tmp_path_factory.mktemp("autofix") / "bad"
    shutil.copytree(FIXTURES / "bad", root)
    before = lint_paths([str(root)]).findings
    run = fix_findings(before, applicabilities(unsafe=True), write=True)
    after = lint_paths([str(root)]).findings
    return root, before, run, after


def test_the_expected_findings_are_fixed(fixed_tree):
    root, before, run, _ = fixed_tree
    assert Counter((_relative(f.path, root), f.code) for f in run.fixed) == FIXED
    assert run.dropped == []
    assert all(f.autofix.applicability == UNSAFE for f in run.fixed)  # every KL fix changes the gradient


def test_every_finding_has_a_fix_or_says_why(fixed_tree):
    _, before, _, _ = fixed_tree
    for finding in before:
        assert (finding.autofix is None) != (finding.no_autofix == ""), finding


def test_fixed_files_reparse_and_relint_clean_of_the_fixed_codes(fixed_tree):
    root, before, run, after = fixed_tree
    assert run.texts
    for path, text in run.texts.items():
        assert Path(path).read_text() == text
        if path.endswith(".py"):
            ast.parse(text)
            cst.parse_module(text)
    for path in run.texts:
        fixed_codes = {f.code for f in run.fixed if f.path == path}
        left_alone = {f.code for f in before if f.path == path and f not in run.fixed}
        remaining = {f.code for f in after if f.path == path}
        assert not (remaining & (fixed_codes - left_alone)), path
        assert remaining <= {f.code for f in before if f.path == path}, path  # no new kind of finding


def test_a_file_whose_every_finding_was_fixed_lints_as_clean_as_its_twin(fixed_tree):
    root, before, run, after = fixed_tree
    complete = {path for path in run.texts if all(f in run.fixed for f in before if f.path == path)}
    assert {_relative(path, root) for path in complete} >= {"grpo_pkg/loss.py", "gspo_token_rollout_fill.py",
                                                              "megatron_closure_loss.py", "verl_dp_actor.py"}
    for path in complete:
        twin = FIXTURES / "fixed" / _relative(path, root)
        assert lint_paths([str(twin)]).findings == []
        assert [f for f in after if f.path == path] == []


def test_the_fix_keeps_the_kl_scale_of_the_reduction_it_replaces(fixed_tree):
    root, _, run, _ = fixed_tree
    text = {_relative(path, root): content for path, content in run.texts.items()}
    # a batch token-mean (masked_mean) and a per-sequence token-mean: divided by the batch's tokens
    assert ".loss.sum() / response_mask.sum()" in text["megatron_closure_loss.py"]
    assert ".loss.sum() / response_mask.sum()" in text["length_normalized_kl.py"]
    assert ".loss.sum() / completion_mask.sum()" in text["grpo_single_file.py"]
    # k3 stays k3 (R-C) where every verdict there keeps it; off-policy samples get importance weights
    assert 'kl_penalty(logprobs, ref_logprobs, mask, estimator="k3")' in text["gspo_token_rollout_fill.py"]
    assert "old_logprobs=old_log_prob" in text["megatron_closure_loss.py"]
    # the KL reward: the detached k1 at the same tokens
    assert "kl_reward(logprobs, ref_logprobs, masks)" in text["ppo_gae_trainer.py"]
    # the import is added once per file
    assert all(content.count("import klaudit.estimators\n") <= 1 for content in text.values())


def test_comments_and_formatting_outside_the_rewritten_span_are_kept(fixed_tree):
    root, _, run, _ = fixed_tree
    for path, fixed in run.texts.items():
        original = (FIXTURES / "bad" / _relative(path, root)).read_text().splitlines()
        kept = fixed.splitlines()
        # every comment line and every untouched line of the original is still there, in order
        untouched = [line for line in original if line in kept]
        assert len(untouched) >= len(original) - 3, path
        assert [line for line in original if line.lstrip().startswith("#")] == \
            [line for line in kept if line.lstrip().startswith("#")], path


def test_check_grad_measures_the_same_objective_as_the_twin(fixed_tree):
    pytest.importorskip("torch")
    from klaudit.audit.runner import Target, audit_target

    root = fixed_tree[0]
    for file, qualname in (("grpo_pkg/loss.py", "grpo_loss"), ("ppo_gae_trainer.py", "PPOTrainer.compute_rewards")):
        fixed = audit_target(Target(path=str(root / file), qualname=qualname))
        twin = audit_target(Target(path=str(FIXTURES / "fixed" / file), qualname=qualname))
        assert not fixed.errors and not twin.errors
        rows = {(r.placement, r.objective, r.rule) for r in fixed.results}
        assert rows == {(r.placement, r.objective, r.rule) for r in twin.results}, file
        assert all(r.unbiased for r in fixed.results)


def test_suppressed_lines_are_never_touched(tmp_path):
    source = (FIXTURES / "bad" / "gspo_token_rollout_fill.py").read_text()
    # the reduction the fix would extend carries a suppression of another code
    source = source.replace("return (per_token_loss * mask).sum() / mask.sum()",
                            "return (per_token_loss * mask).sum() / mask.sum()  # noqa: KL007")
    path = tmp_path / "gspo.py"
    path.write_text(source)
    [finding] = lint_paths([str(path)]).findings
    assert finding.autofix is None and "suppression" in finding.no_autofix
    # and a suppressed finding offers nothing at all
    path.write_text(source.replace("# <- KL002", "# noqa: KL002"))
    assert lint_paths([str(path)]).findings == []


def test_a_fix_that_does_not_parse_is_dropped_and_reported(tmp_path):
    good = Fix(UNSAFE, "fine", (Edit(1, 5, 1, 6, "2"),))
    broken = Fix(UNSAFE, "broken", (Edit(2, 1, 2, 1, "def (:\n"),))
    findings = [Finding("a.py", 1, 1, "KL002", "m", 1, 2, autofix=good),
                Finding("a.py", 2, 1, "KL003", "m", 2, 2, autofix=broken)]
    applied = apply_fixes("a.py", "x = 1\ny = 2\n", findings, {UNSAFE})
    assert applied.text == "x = 2\ny = 2\n"
    assert applied.fixed == findings[:1]
    assert applied.dropped == [(findings[1], "the fixed code would not parse")]
    # unsafe fixes wait for --unsafe-fixes
    assert apply_fixes("a.py", "x = 1\n", findings[:1], {SAFE}).fixed == []


def test_edits_keep_line_ends_and_refuse_overlaps():
    assert apply_edits("a = 1\r\nb = 2\r\n", [Edit(2, 1, 2, 1, "import x\n")]) == "a = 1\r\nimport x\r\nb = 2\r\n"
    assert apply_edits("abc", [Edit(1, 1, 1, 2, "X"), Edit(1, 1, 1, 2, "X")]) == "Xbc"  # the same edit once
    with pytest.raises(ValueError):
        apply_edits("abc", [Edit(1, 1, 1, 3, "X"), Edit(1, 2, 1, 3, "Y")])


def _cli(*args):
    result = CliRunner().invoke(cli.main, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_diff_previews_without_writing_and_exits_1(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shutil.copy(FIXTURES / "bad" / "megatron_closure_loss.py", "loss.py")
    before = Path("loss.py").read_text()
    # the KL fixes are unsafe: without --unsafe-fixes there is nothing to show
    assert _cli("lint", "--diff", "loss.py")[0] == 0
    code, out, err = _cli("lint", "--diff", "--unsafe-fixes", "loss.py")
    assert code == 1 and Path("loss.py").read_text() == before
    assert out.startswith("--- a/loss.py\n+++ b/loss.py\n") and "+import klaudit.estimators\n" in out
    assert "Would fix 2 errors." in err


def test_fix_writes_and_reports_what_remains(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shutil.copy(FIXTURES / "bad" / "megatron_closure_loss.py", "loss.py")
    shutil.copy(FIXTURES / "bad" / "rloo_wrong_sign.py", "rloo.py")
    code, out, _ = _cli("lint", "--fix", "loss.py", "rloo.py")  # safe fixes only: nothing changes
    assert code == 1 and "[*] 2 fixable with `--fix --unsafe-fixes`" in out
    code, out, err = _cli("lint", "--fix", "--unsafe-fixes", "--output-format", "json", ".")
    assert code == 1 and "Fixed 2 errors." in err
    remaining = json.loads(out)
    assert [(Path(f["filename"]).name, f["code"]) for f in remaining] == [("rloo.py", "KL011")]
    assert remaining[0]["fix"] is None and "sign" in remaining[0]["no_fix_reason"]
    assert "klaudit.estimators.kl_penalty(" in Path("loss.py").read_text()


def test_fix_on_stdin_prints_the_fixed_source(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    source = (FIXTURES / "bad" / "megatron_closure_loss.py").read_text()
    result = CliRunner().invoke(cli.main, ["lint", "--fix", "--unsafe-fixes", "-", "--stdin-filename", "loss.py"],
                                input=source)
    assert result.exit_code == 0
    assert "klaudit.estimators.kl_penalty(" in result.stdout and "All checks passed!" in result.stderr


SNIPPET = """#!/usr/bin/env python
# -*- coding: utf-8 -*-
def masked_mean(values, mask):
    return (values * mask).sum() / mask.sum()


def kl_loss(logprobs, ref_logprobs, mask, beta):
    log_ratio = ref_logprobs - logprobs
    per_token_kl = torch.exp(log_ratio) - log_ratio - 1  # k3
    return beta / 2 * masked_mean(per_token_kl, mask)
"""


def test_the_import_goes_after_a_shebang_and_the_call_binds_as_one_operand(tmp_path):
    path = tmp_path / "k3.py"
    path.write_text(SNIPPET)
    [finding] = lint_paths([str(path)]).findings
    assert finding.code == "KL002" and finding.autofix is not None
    fixed = apply_edits(SNIPPET, finding.autofix.edits)
    lines = fixed.splitlines()
    assert lines[:3] == ["#!/usr/bin/env python", "# -*- coding: utf-8 -*-", "import klaudit.estimators"]
    assert lines[-1] == ("    return beta / 2 * (klaudit.estimators.kl_penalty(logprobs, ref_logprobs, mask, "
                         'estimator="k3").loss.sum() / mask.sum())')
    assert "  # k3" in fixed  # the comment on the estimator's line is kept


def test_a_kl_term_added_under_a_condition_is_not_moved(fixed_tree):
    _, before, _, _ = fixed_tree
    [trl] = [f for f in before if f.path.endswith("trl_grpo_trainer.py")]
    assert trl.autofix is None and "another block" in trl.no_autofix


def test_a_reduction_of_more_than_the_kl_term_is_not_replaced_whole(tmp_path):
    source = SNIPPET.replace("masked_mean(per_token_kl, mask)", "masked_mean(0.5 * per_token_kl, mask)")
    path = tmp_path / "k3.py"
    path.write_text(source)
    [finding] = lint_paths([str(path)]).findings
    assert finding.autofix is None and finding.no_autofix == "the reduction holds more than the KL term"
