"""check-grad in process: verdicts on user-style fixtures (kl-math.md section 8), agreement of the
exact audit with the fingerprint, discovery, and one clear error per kind of bad input."""

from __future__ import annotations

import glob
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from klaudit.audit.discover import discover_kl_functions  # noqa: E402
from klaudit.audit.report import JSON_FIELDS, Report  # noqa: E402
from klaudit.audit.runner import Target, TargetError, audit_target, parse_target  # noqa: E402

DATA = Path(__file__).parent / "data"
ROOT = Path(__file__).parents[2]


def _audit(file: str, qualname: str, **options) -> Report:
    return audit_target(Target(path=str(DATA / file), qualname=qualname), **options)


def _by_mode(report: Report, switch: str) -> dict:
    return {(row.mode[switch], row.placement): row for row in report.results}


@pytest.fixture(scope="module")
def verl() -> Report:
    return _audit("verl_style.py", "kl_penalty")


# Expected objective and rule per (switch value, placement), from kl-math.md section 8 (rows 1-10).
VERL_EXPECTED = {
    ("kl", "loss"): ("ZERO", "KL001"), ("kl", "reward"): ("REV", None),
    ("k1", "loss"): ("ZERO", "KL001"), ("k1", "reward"): ("REV", None),
    ("abs", "loss"): ("OTHER", "KL009"), ("abs", "reward"): ("OTHER", "KL004"),
    ("mse", "loss"): ("PART", "KL003"), ("k2", "reward"): ("OTHER", "KL004"),
    # the clamps of low_var_kl act at KL_seq = 1 nat: neither PFWD nor REV - PFWD (row 4)
    ("low_var_kl", "loss"): ("OTHER", "KL002"), ("k3", "reward"): ("OTHER", "KL004"),
    # straight-through: the gradient of k2 as a loss, the value of k1/k3 in the reward (row 2)
    ("k1+", "loss"): ("PART", "KL003"), ("k1+", "reward"): ("REV", None),
    ("k3+", "loss"): ("PART", "KL003"), ("k3+", "reward"): ("OTHER", "KL004"),
}


@pytest.mark.parametrize("key", sorted(VERL_EXPECTED))
def test_verl_switch_values(verl, key):
    row = _by_mode(verl, "kl_penalty")[key]
    objective, rule = VERL_EXPECTED[key]
    assert (row.objective, row.rule) == (objective, rule)
    assert row.unbiased is (objective == "REV")
    assert row.fix or row.unbiased


def test_a_zero_gradient_has_no_cosine(verl):
    """k1 as a loss has expected gradient 0: a cosine would only measure rounding noise."""
    row = _by_mode(verl, "kl_penalty")[("k1", "loss")]
    assert row.objective == "ZERO" and row.cos_rev is None and row.rel_err_rev == pytest.approx(1.0)


def test_verl_values_that_raise_are_not_audited(verl):
    """The lint labels no KL term with "full" (its branch raises NotImplementedError): not a mode."""
    assert not verl.errors
    modes = {row.mode["kl_penalty"] for row in verl.results}
    assert modes >= {"kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3"} and "full" not in modes


def test_value_bias(verl):
    """k1 and k3 values are unbiased for KL_seq; k2's is biased upwards (kl-math.md section 2)."""
    rows = _by_mode(verl, "kl_penalty")
    assert abs(rows[("k1", "loss")].value_bias) < 1e-12
    assert rows[("k2", "loss")].value_bias > 0.01


def test_openrlhf_float32_helper_both_placements():
    rows = _by_mode(_audit("openrlhf_style.py", "compute_approx_kl"), "kl_estimator")
    assert rows[("k1", "loss")].objective == "ZERO" and rows[("k1", "reward")].objective == "REV"
    # the clamp at |log-ratio| = 10 acts on no enumerated policy, only on the far batch (KL010)
    assert (rows[("k1", "reward")].rule, rows[("k1", "reward")].unbiased) == ("KL010", False)
    assert rows[("k1", "reward")].configuration == "k1 in the reward (reward-to-go), token-sum, on-policy"
    assert rows[("k3", "loss")].rule == "KL002"


def test_self_aggregating_losses():
    """A per-sequence token-mean is length-weighted (row 21: not PFWD any more); a batch token-mean
    is a constant over a large batch and keeps k3's PFWD."""
    grpo = _audit("trl_style.py", "grpo_kl_loss").results
    assert [(r.placement, r.objective, r.rule, r.unbiased) for r in grpo] == [("loss", "OTHER", "KL002", False)]
    assert grpo[0].configuration == "k3 differentiated as a loss, seq-token-mean, on-policy"
    dapo = _audit("trl_style.py", "dapo_kl_loss").results
    assert [(r.placement, r.objective, r.rule) for r in dapo] == [("loss", "PFWD", "KL002")]
    assert "token-mean over the batch" in dapo[0].aggregation


@pytest.mark.parametrize("qualname, configuration", [
    ("k1_kl_loss", "k1 in the reward (reward-to-go), token-sum, on-policy"),
    ("k3_kl_loss", "k3 differentiated as a loss + k3 in the reward (reward-to-go), token-sum, on-policy"),
    ("rb_kl_loss", "full differentiated as a loss + full in the reward (future-only), token-sum, on-policy"),
])
def test_klaudit_estimators_are_unbiased(qualname, configuration):
    report = _audit("correct_estimators.py", qualname)
    assert report.unbiased and report.exit_code == 0
    (row,) = report.results
    assert row.objective == "REV" and row.configuration == configuration and row.rule is None
    assert row.cos_rev == pytest.approx(1.0, abs=1e-9) and row.rel_err_rev < 1e-9
    assert abs(row.value_bias) < 1e-9


def _data_targets() -> list[Target]:
    files = sorted(glob.glob(str(DATA / "*.py")))
    return [Target(path=file, qualname=qualname) for file in files if "broken" not in file
            for qualname in discover_kl_functions(file).auditable]


@pytest.mark.parametrize("target", _data_targets(), ids=str)
def test_exact_audit_and_fingerprint_agree(target):
    """On check-grad's own fixtures, the objective the exact audit finds is the objective of the catalog
    row the fingerprint names (kl-math.md section 8), or OTHER when no row matches (the lint's fixtures:
    tests/audit/test_check_grad_fixtures.py)."""
    report = audit_target(target)
    assert report.results and not report.errors, report.errors
    for row in report.results:
        assert row.objective == (row.fingerprint_objective or "OTHER"), (row.mode, row.placement, row.configuration)


def test_discovery_finds_kl_functions_only():
    assert discover_kl_functions(str(DATA / "verl_style.py")).auditable == ["kl_penalty_forward", "kl_penalty"]
    assert discover_kl_functions(str(DATA / "correct_estimators.py")).auditable == [
        "k1_kl_loss", "k3_kl_loss", "rb_kl_loss", "detached_kl_reward"]


def test_target_syntax():
    assert parse_target(f"{DATA}/trl_style.py::grpo_kl_loss") == Target(path=f"{DATA}/trl_style.py",
                                                                        qualname="grpo_kl_loss")
    assert parse_target("pkg.mod:fn") == Target(module="pkg.mod", qualname="fn")
    with pytest.raises(TargetError, match="no such file"):
        parse_target("missing.py::f")
    with pytest.raises(TargetError, match="is not PATH.py"):
        parse_target("just_a_name")


@pytest.mark.parametrize("qualname, message", [
    ("raises_kl", "raises_kl raised RuntimeError: the reference model is not loaded"),
    ("wrong_shape_kl", "returned shape [20, 2]; expected per-token [20, 4]"),
    ("nan_kl", "returned NaN or inf"),
    ("constant_kl", "does not depend on the policy log-probs: no gradient flows, this KL term does nothing"),
    ("not_a_tensor_kl", "returned float, not a torch.Tensor"),
    ("unbindable_kl", "cannot bind parameter frobnicate of unbindable_kl; say what it is with --bind PARAM=ROLE"),
])
def test_bad_terms_give_one_line(qualname, message):
    report = _audit("broken_terms.py", qualname)
    assert not report.results and report.exit_code == 2
    (error,) = report.errors
    assert message in error and "\n" not in error and "broken_terms.py" in error


def test_missing_name_and_import_error():
    (error,) = _audit("broken_terms.py", "no_such_kl").errors
    assert "'no_such_kl' not found" in error
    (error,) = _audit("broken_import.py", "kl_loss").errors
    assert "import failed: RuntimeError: this trainer needs a GPU at import" in error


def test_json_fields_are_the_schema():
    assert JSON_FIELDS == ("target", "mode", "placement", "configuration", "objective", "unbiased", "cos_rev",
                           "rel_err_rev", "value_bias", "rule", "fix")


def test_detached_helper_is_audited_as_a_reward_only():
    report = _audit("correct_estimators.py", "detached_kl_reward")
    assert [(row.placement, row.objective, row.unbiased) for row in report.results] == [("reward", "REV", True)]
    assert any("detached" in note for note in report.notes)
    forced = _audit("correct_estimators.py", "detached_kl_reward", placements=["loss"])
    assert not forced.errors
    assert [(row.placement, row.objective, row.rule) for row in forced.results] == [("loss", "ZERO", "KL001")]


@pytest.mark.parametrize("qualname", ["no_grad_k3_kl_loss", "item_k1_kl_loss"])
def test_a_kl_loss_without_gradient_is_row_1c(qualname):
    """Enumerated, a term that autograd never reaches has zero expected gradient on every policy; the row says
    so with the catalog's row 1c (KL001) instead of failing the audit."""
    report = _audit("detached_kl_loss.py", qualname)
    assert not report.errors
    (row,) = report.results
    assert (row.placement, row.objective, row.unbiased, row.rule) == ("loss", "ZERO", False, "KL001")
    assert row.configuration == "KL estimate added to the loss without its gradient"
    assert set(row.per_policy.values()) == {"ZERO"} and row.cos_rev is None


def test_fingerprint_on_a_model_from_disk(tmp_path):
    """--model DIR: the fingerprint batch comes from a causal LM on disk and still names the row."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(vocab_size=40, n_positions=16, n_embd=16, n_layer=1, n_head=2,
                               bos_token_id=0, eos_token_id=0)).save_pretrained(tmp_path)
    rows = _by_mode(_audit("openrlhf_style.py", "compute_approx_kl", model_dir=str(tmp_path)), "kl_estimator")
    assert rows[("k1", "loss")].configuration == "k1 differentiated as a loss, token-sum, on-policy"
    assert rows[("k1", "reward")].configuration == "k1 in the reward (reward-to-go), token-sum, on-policy"
    assert rows[("k1", "reward")].objective == "REV"
    broken = _audit("openrlhf_style.py", "compute_approx_kl", model_dir=str(tmp_path / "missing"))
    assert "--model" in broken.errors[0] and "cannot load" in broken.errors[0]


@pytest.mark.parametrize("file, qualname, used", [
    ("bad/openrlhf_ppo.py", "compute_approx_kl", {"loss", "reward"}),
    ("bad/verl_ray_trainer.py", "kl_penalty", {"reward"}),
    ("fixed/openrlhf_ppo.py", "compute_approx_kl", set()),
])
def test_the_placement_the_code_uses_is_marked(file, qualname, used):
    """The mark comes from the lint's flow analysis of the fixture (tests/lint/test_query.py)."""
    from klaudit.audit.runner import run

    report = run([f"{ROOT / 'fixtures' / file}::{qualname}"])
    assert report.results and not report.errors
    assert {row.placement for row in report.results if row.used} == used


def test_python_api():
    import klaudit.audit
    from klaudit.estimators import kl_penalty

    def kl_loss(logprobs, ref_logprobs, mask):
        return kl_penalty(logprobs, ref_logprobs, mask, estimator="k3").loss.mean()

    def k3_per_token(logprobs, ref_logprobs, mask):
        return (torch.exp(ref_logprobs - logprobs) - (ref_logprobs - logprobs) - 1) * mask

    assert klaudit.audit.check(kl_loss).unbiased
    report = klaudit.audit.check(k3_per_token, placement="loss")
    assert not report.unbiased and [row.objective for row in report.results] == ["PFWD"]
    assert [row.placement for row in klaudit.audit.check(k3_per_token).results] == ["loss", "reward"]
    failing = klaudit.audit.check(lambda a, b: a, bind={"a": "logprobs"})
    assert not failing.unbiased and "cannot bind parameter b" in failing.errors[0]
    with pytest.raises(ValueError, match="placement"):
        klaudit.audit.check(kl_loss, placement="sideways")


def test_each_estimate_of_a_returned_dict_is_audited_as_its_own_row():
    """kl-math.md section 8: k1 as a loss row 1 (ZERO, KL001), in the reward row 6 (REV); k2 as a loss row 2
    (PART, KL003); k3 as a loss row 3 (PFWD, KL002), in the reward row 7 (REV - PFWD, KL004)."""
    report = _audit("estimator_table.py", "kl_estimates")
    rows = _by_mode(report, "entry")
    assert (rows[("k1", "loss")].objective, rows[("k1", "loss")].rule) == ("ZERO", "KL001")
    assert (rows[("k1", "reward")].objective, rows[("k1", "reward")].rule) == ("REV", None)
    assert (rows[("k2", "loss")].objective, rows[("k2", "loss")].rule) == ("PART", "KL003")
    assert (rows[("k3", "loss")].objective, rows[("k3", "loss")].rule) == ("PFWD", "KL002")
    assert rows[("k3", "reward")].rule == "KL004"
    # a statistic beside the estimates (no gradient, not one value per row) and a string are no estimates
    assert {key for key, _ in rows} == {"k1", "k2", "k3"}
    assert not report.errors


def test_per_token_loss_weights_are_bound_as_the_mask():
    """xtuner's `loss_weights` is the mask over a token count: bound as the mask, the k1 loss is row 1
    (ZERO, KL001) and the k2 loss row 2 (PART, KL003)."""
    rows = _by_mode(_audit("weighted_kl.py", "kl_penalty"), "kl_penalty")
    assert {(value, placement): (row.objective, row.rule) for (value, placement), row in rows.items()} == {
        ("kl", "loss"): ("ZERO", "KL001"), ("k1", "loss"): ("ZERO", "KL001"),
        ("mse", "loss"): ("PART", "KL003"), ("k2", "loss"): ("PART", "KL003")}


def test_bare_current_and_ref_parameters_are_audited():
    """`masked_kl(current, ref, mask)` binds by its names: k3 as a loss is row 3 (PFWD, KL002)."""
    (row,) = [row for row in _audit("bare_names.py", "masked_kl").results if row.placement == "loss"]
    assert (row.objective, row.rule) == ("PFWD", "KL002")


@pytest.mark.parametrize("qualname, switch", [("vocabulary_divergence", "alpha"), ("jsd_loss", "beta")])
def test_a_divergence_weight_is_audited_at_each_value_the_code_branches_on(qualname, switch):
    """A generalized JSD (TRL's GKD and self-distillation helpers) branches on its weight: 0 the forward KL to the
    teacher, 1 the reverse KL. The weight is audited at both values, not set to 1 as the coefficient its name
    (`beta`) suggests; the helper that takes log-probs is fed log-probs over the vocabulary, the only inputs its
    `alpha == 1` branch reads as a KL. Exact forward KL_t as a loss: PFWD (KL002); exact KL_t as a loss: PART
    (KL003), kl-math.md section 8, rows 3b and 2."""
    report = _audit("interpolated_divergence.py", qualname)
    assert not report.errors
    loss = {row.mode[switch]: (row.objective, row.rule) for row in report.results if row.placement == "loss"}
    assert loss == {0.0: ("PFWD", "KL002"), 1.0: ("PART", "KL003")}


def test_a_file_whose_helper_takes_configs_is_audited_through_the_estimator_inside_it(monkeypatch):
    """verl 0.9's distillation losses reach kl_penalty through a function of configs and the model's output
    dict, which check-grad cannot call alone: `check-grad losses.py` audits the estimator that function calls,
    named as the user would name its file, at each switch value (k1 as a loss: ZERO, KL001; k2: PART, KL003;
    k3: PFWD, KL002; kl-math.md section 8, rows 1-3)."""
    from klaudit.audit.runner import run

    monkeypatch.chdir(ROOT)
    report = run(["tests/audit/data/clamped_distill_pkg/losses.py"], placements=["loss"])
    assert not report.errors
    loss = {row.mode["kind"]: (row.objective, row.rule) for row in report.results
            if row.target == "tests/audit/data/clamped_distill_pkg/estimators.py::kl_term"}
    assert loss == {"k1": ("ZERO", "KL001"), "k2": ("PART", "KL003"), "k3": ("PFWD", "KL002")}
    assert not any(note.startswith("/") for note in report.notes)  # no absolute paths


INSTANCE_SWITCHED = '''
import torch


class PPOTrainer:
    def compute_rewards(self, scores, logprobs, ref_logprobs, masks):
        rewards = -self.kl_ctl.value * self._kl_penalty(logprobs, ref_logprobs)
        rewards[:, -1] += scores
        return rewards

    def _kl_penalty(self, logprob, ref_logprob):
        if self.config.kl_penalty == "abs":
            return (logprob - ref_logprob).abs()
        if self.config.kl_penalty == "mse":
            return 0.5 * (logprob - ref_logprob).square()
        return logprob - ref_logprob

    def tempered_penalty(self, logprob, ref_logprob):
        if self.config.kl_penalty == "abs":
            return (logprob - ref_logprob).abs() / self.config.temperature
        return (logprob - ref_logprob) / self.config.temperature
'''


def test_a_method_reading_its_switch_from_instance_state_is_audited_at_each_value(tmp_path):
    """TRL's PPOTrainer before 0.12: compute_rewards calls self._kl_penalty, which branches on
    self.config.kl_penalty. The bare instance serves each value the lint labels the KL terms with, and the
    value past every named one ("other": the k1 fall-through): k1 in the reward is row 6 (REV), |log-ratio|
    and k2 are row 9 and 8 (KL004). State that is no switch (self.config.temperature) keeps the method from
    being called alone, and names itself when read."""
    path = tmp_path / "ppo_trainer.py"
    path.write_text(INSTANCE_SWITCHED)
    found = discover_kl_functions(str(path))
    assert found.auditable == ["PPOTrainer.compute_rewards", "PPOTrainer._kl_penalty"]
    assert any("::PPOTrainer.tempered_penalty " in line and "self.config" in line for line in found.skipped)
    report = audit_target(Target(path=str(path), qualname="PPOTrainer.compute_rewards"))
    assert report.errors == []
    assert sorted((row.mode["kl_penalty"], row.placement, row.objective, row.rule) for row in report.results) == [
        ("abs", "reward", "OTHER", "KL004"), ("mse", "reward", "OTHER", "KL004"), ("other", "reward", "REV", None)]
    failed = audit_target(Target(path=str(path), qualname="PPOTrainer.tempered_penalty"), placements=("reward",))
    assert failed.errors and "self.config.temperature is not set" in failed.errors[0]


CONFIG_SWITCHED = '''
def self_distillation_loss(student_log_probs, teacher_log_probs, response_mask, config):
    log_ratio = student_log_probs - teacher_log_probs
    if config.estimator == "k3":
        per_token = (-log_ratio).exp() - 1 + log_ratio
    else:
        assert config.estimator == "k1", "only k1 and k3"
        per_token = log_ratio.detach() * student_log_probs
    if config.is_clip is not None:
        per_token = per_token.clamp(max=config.is_clip)
    return (per_token * response_mask).sum() / response_mask.sum()
'''


def test_a_config_parameter_is_bound_as_the_switches_it_is_read_for(tmp_path):
    """verl's SDPO loss reads its switches from a config object (config.alpha, config.full_logit_distillation;
    here an estimator): the parameter is bound as an object serving each mode's values, its other settings read
    as None (off) and named in a note. A switch value the code refuses (an assertion: here any estimator but k1
    and k3, audited as "other") is skipped with a note, and k3 as a loss, the value that runs, is row 3 (PFWD,
    KL002). Where every value fails, the failure is the audit's error."""
    path = tmp_path / "sdpo.py"
    path.write_text(CONFIG_SWITCHED)
    assert discover_kl_functions(str(path)).auditable == ["self_distillation_loss"]
    report = audit_target(Target(path=str(path), qualname="self_distillation_loss"))
    assert report.errors == []
    assert [(row.mode, row.objective, row.rule) for row in report.results] == [({"estimator": "k3"}, "PFWD", "KL002")]
    (skipped,) = [note for note in report.notes if note.startswith("skipped:")]
    assert "estimator='other'" in skipped and "AssertionError: only k1 and k3" in skipped
    assert any(note.startswith("config.is_clip of ") and "read as None" in note for note in report.notes)
    path.write_text(CONFIG_SWITCHED.replace("per_token = (-log_ratio)", 'assert False, "never"\n        per_token = (-log_ratio)'))
    failed = audit_target(Target(path=str(path), qualname="self_distillation_loss"))
    assert not failed.results and "AssertionError" in failed.errors[0]


DICT_CONFIGURED = '''
import torch.nn.functional as F


def distillation_loss(response_mask, config=None, teacher_logits=None, student_logits=None):
    kind = config.get("distillation_type", "reverse_kl") if config else "reverse_kl"
    temperature = config["temperature"] if config is not None and "temperature" in config else 1.0
    student = F.log_softmax(student_logits / temperature, dim=-1)
    teacher = F.log_softmax(teacher_logits / temperature, dim=-1)
    if kind == "reverse_kl":
        per_token = (student.exp() * (student - teacher)).sum(-1)
    elif kind == "forward_kl":
        per_token = (teacher.exp() * (teacher - student)).sum(-1)
    else:
        raise ValueError(kind)
    return (per_token * response_mask).sum() / response_mask.sum()
'''


def test_a_dict_config_defaulting_to_none_is_bound_as_the_switches_it_is_read_for(tmp_path):
    """A verl fork's distillation loss reads its switch from an optional dict (`config.get("distillation_type",
    "reverse_kl") if config else ...`, `config: Optional[dict] = None`): bound at its default None, only the
    reverse KL would ever run. The parameter is bound as the switches, read as a dict and tested for truth, and
    each value is audited: the exact per-step reverse KL as a loss is PART (KL003), the forward one PFWD (KL002).
    A setting no switch selects keeps the code's own fallback (the temperature, 1.0)."""
    path = tmp_path / "distill.py"
    path.write_text(DICT_CONFIGURED)
    report = audit_target(Target(path=str(path), qualname="distillation_loss"))
    assert report.errors == []
    assert [(row.mode, row.objective, row.rule) for row in report.results] == [
        ({"distillation_type": "reverse_kl"}, "PART", "KL003"), ({"distillation_type": "forward_kl"}, "PFWD", "KL002")]


def test_a_term_no_row_names_per_sample_whose_expected_gradient_is_zero_is_kl001(tmp_path):
    """The k1 loss with the log-probs swapped (ref - logp, RLinf's kl_penalty(ref_logprobs, logprobs, "kl")) has
    the negated score of row 1 per sample, which no catalog row has; its exact expected gradient is zero on every
    enumerated policy, KL001's claim: no regularisation, only noise."""
    path = tmp_path / "swapped.py"
    path.write_text("def kl_loss(log_probs, ref_log_probs, mask):\n"
                    "    return ((ref_log_probs - log_probs) * mask).sum() / mask.sum()\n")
    [row] = audit_target(Target(path=str(path), qualname="kl_loss"), placements=["loss"]).results
    assert (row.objective, row.unbiased, row.rule) == ("ZERO", False, "KL001")
    assert row.configuration.startswith("unrecognised")


def test_a_parameter_bound_as_switches_that_is_used_whole_names_itself(tmp_path):
    """A parameter bound as `switches` that the code uses whole (calls it, as a scorer or a model) fails naming
    itself and the --bind that would say what it is."""
    path = tmp_path / "step.py"
    path.write_text(
        "def kl(log_probs, ref_log_probs, scorer, config):\n"
        "    log_ratio = ref_log_probs - log_probs\n"
        "    kl = log_ratio.exp() - 1 - log_ratio if config.estimator == 'k3' else -log_ratio\n"
        "    scorer(kl)\n"
        "    return kl\n")
    from klaudit.audit.roles import Role

    report = audit_target(Target(path=str(path), qualname="kl"), overrides={"scorer": Role.SWITCHES})
    assert not report.results and "scorer is not set" in report.errors[0] and "--bind scorer=ROLE" in report.errors[0]
