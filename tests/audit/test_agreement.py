"""The two wings agree on the repository's own KL code: where the lint judges a KL site and check-grad can
run the code behind it, check-grad's rows for the same switch values carry the lint's rule for that
code (klaudit.audit.agreement); a disagreement is a failure here, not a user's puzzle.

Every file of fixtures/bad, fixtures/fixed, fixtures/clean and tests/audit/data that the lint finds a KL
site in is compared. Sites check-grad cannot run (a step that needs models, a term that travels through
stored state) are listed in NOT_AUDITED with why, so that a site that stops being audited fails too.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch")

from klaudit.audit.agreement import compare  # noqa: E402
from klaudit.audit.bind import Role  # noqa: E402
from klaudit.audit.runner import Target, audit_target  # noqa: E402
from klaudit.lint.query import site_verdicts  # noqa: E402

ROOT = Path(__file__).parents[2]
FILES = sorted(str(path.relative_to(ROOT)) for folder in ("fixtures/bad", "fixtures/fixed", "fixtures/clean",
                                                          "tests/audit/data")
               for path in (ROOT / folder).rglob("*.py"))

# Known disagreements, file -> why (a new one fails, an old one that agrees again must leave).
KNOWN: dict[str, str] = {}

# file -> number of (site, branch) records check-grad cannot run, and why (in words)
NOT_AUDITED = {
    "fixtures/bad/grpo_kl_double_counted.py": 1,  # the k1 reward's step multiplies it by beta_loss, bound by no name
    "fixtures/bad/gspo_token_rollout_fill.py": 1,  # the rollout's KL, stored for the loss
    "fixtures/bad/keyed_batch_kl.py": 4,  # a batch key written and read elsewhere
    "fixtures/bad/last_token_kl.py": 3,  # the reward method needs the models
    "fixtures/bad/length_normalized_kl.py": 1,  # the loss method needs the models
    "fixtures/bad/loss_module_pkg/learner.py": 2,  # the loss is a torch module held as self.policy_loss
    "fixtures/bad/onpolicy_distill.py": 1,  # a step that needs the teacher model
    "fixtures/bad/ppo_multi_epoch.py": 2,  # rollout values, stored and read by the update
    "fixtures/bad/rloo_wrong_sign.py": 2,  # the rollout needs the models
    "fixtures/bad/sequence_level_kl.py": 3,  # the method's parameter seq_logps binds by no name
    "fixtures/bad/triton_grpo_kernel.py": 1,  # a Triton kernel: the term is formed from a loaded chunk of pointers
    "fixtures/fixed/callable_kl_estimator.py": 4,  # KLEstimator("k1"): the caller fixes the switch self.kl_estimator
    "fixtures/fixed/keyed_batch_kl.py": 4,
    "fixtures/fixed/last_token_kl.py": 3,
    "fixtures/fixed/length_normalized_kl.py": 1,
    "fixtures/fixed/rloo_wrong_sign.py": 2,
    "fixtures/fixed/sequence_level_kl.py": 1,
    "tests/audit/data/broken_import.py": 1,  # the term reaches the loss through an attribute
}


def _audit(scratch: Path):
    """check-grad in this process; a cut-out term is audited from a file of its own, on-policy, as the CLI does."""

    def audit(target: Target, placements, roles):
        overrides = {name: Role(role) for name, role in roles.items()}
        if target.source is not None:
            file = scratch / f"{target.qualname}.py"
            file.write_text(target.source, encoding="utf-8")
            return audit_target(Target(path=str(file), qualname=target.qualname, label=target.label, origin=target.path),
                                overrides=overrides, placements=placements, current_old=True)
        return audit_target(target, overrides=overrides, placements=placements)

    return audit


@pytest.mark.parametrize("file", [file for file in FILES if site_verdicts(str(ROOT / file))])
def test_lint_and_check_grad_agree_on_each_site(file, tmp_path):
    verdicts = compare(str(ROOT / file), _audit(tmp_path))
    audited = [verdict for verdict in verdicts if verdict.audited]
    assert sum(not verdict.audited for verdict in verdicts) == NOT_AUDITED.get(file, 0), [
        verdict.reason for verdict in verdicts if not verdict.audited]
    disagreements = [(verdict.site.line, verdict.lint_rules, verdict.modes, verdict.check_grad_rules, verdict.reason)
                     for verdict in audited if not verdict.agree]
    if file in KNOWN:
        assert disagreements, f"{file} agrees now: drop it from KNOWN"
        pytest.xfail(KNOWN[file])
    assert not disagreements
    assert audited or file in NOT_AUDITED


def test_a_disagreement_is_found(tmp_path):
    """The comparison can fail: a lint verdict that check-grad does not measure is a disagreement."""
    import dataclasses

    path = str(ROOT / "fixtures/bad/openrlhf_ppo.py")
    sites = site_verdicts(path)
    forged = [dataclasses.replace(site, rules=("KL009",), config=dataclasses.replace(site.config, loss=None,
                                                                                      reward=site.config.loss
                                                                                      or site.config.reward))
              for site in sites]
    with_truth = compare(path, _audit(tmp_path), sites)
    assert with_truth and all(verdict.agree for verdict in with_truth if verdict.audited)
    changed = compare(path, _audit(tmp_path), forged)
    assert any(not verdict.agree for verdict in changed if verdict.audited)


def test_a_numeric_label_selects_by_its_own_switch_or_one_that_holds_its_name():
    """`alpha == 1` in a helper is the caller's `distillation_alpha`: false there, it leaves out the audited
    value 1. `temperature == 1` (TRL's selective_log_softmax beside its sampled-token distillation loss) is
    another setting, whatever the number: it decides nothing about `distillation_alpha=1.0`."""
    from types import SimpleNamespace

    from klaudit.audit.agreement import selects

    mode = {"distillation_alpha": 1.0}
    rows = [SimpleNamespace(mode={"distillation_alpha": value}) for value in (0.0, 1.0)]  # check-grad's rows
    assert not selects((("alpha == 1", (False,)),), mode, rows)
    assert selects((("alpha == 1", (True,)),), mode, rows)
    assert selects((("temperature == 1", (False,)),), mode, rows)


def test_a_logged_copy_of_a_trained_term_has_no_record():
    """TRL's self-distillation trainers log `(per_token_loss * mask).sum() / n` with `.item()` beside the loss
    they return: the report leaves that copy of the trained term out, so the records check-grad is compared
    with do too (it read as a detached estimate added to the loss, row 1c, a verdict no finding carries). A
    detached estimate with nothing trained beside it keeps its record."""
    import dataclasses

    from klaudit.catalog import Estimator, Returns, without_gradient
    from klaudit.lint.query import _without_logged_copies

    [trained, *_] = site_verdicts(str(ROOT / "fixtures/bad/openrlhf_ppo.py"))
    detached = dataclasses.replace(trained, config=dataclasses.replace(
        trained.config, loss=None, reward=Estimator.K3, returns=Returns.NOWHERE), rules=("KL001",))
    assert without_gradient(detached.config) and not without_gradient(trained.config)
    assert _without_logged_copies([trained, detached]) == [trained]
    assert _without_logged_copies([detached]) == [detached]


def test_a_term_whose_helpers_take_no_log_probs_is_audited_in_the_function_that_forms_it(tmp_path):
    """TRL's IWOPD trainer forms the per-vocabulary divergence in generalized_jsd_loss and hands it to
    _reduce_divergence_loss, which sums it over the vocabulary (where the lint recognises the exact KL) and
    reduces it: that helper takes a divergence, not log-probs, so check-grad cannot call it alone. The function
    that holds the sink can be: it is audited whole, each reduction against the lint's branch for it."""
    path = tmp_path / "distill.py"
    path.write_text(textwrap.dedent('''
        import torch.nn.functional as F


        def reduce_divergence(per_vocab, mask, reduction="batchmean"):
            per_token = per_vocab.sum(-1)
            if reduction == "batchmean":
                return (per_token * mask).sum() / mask.sum()
            if reduction == "sum":
                return (per_token * mask).sum()
            raise ValueError(reduction)


        def distillation_loss(student_logits, teacher_logits, mask, reduction="batchmean"):
            student = F.log_softmax(student_logits, dim=-1)
            teacher = F.log_softmax(teacher_logits, dim=-1)
            per_vocab = student.exp() * (student - teacher)
            return reduce_divergence(per_vocab, mask, reduction)
    '''))
    sites = site_verdicts(str(path))
    assert {site.helper for site in sites} == {"reduce_divergence"} and not any(site.inline for site in sites)
    verdicts = compare(str(path), _audit(tmp_path))
    assert [(verdict.target.rsplit("::", 1)[-1], verdict.modes, verdict.check_grad_rules, verdict.agree)
            for verdict in verdicts] == [("distillation_loss", ("reduction=batchmean",), ("KL003",), True),
                                         ("distillation_loss", ("reduction=sum",), ("KL003",), True)]


def test_a_helper_handed_an_importance_ratio_is_audited_with_it_bound(tmp_path):
    """slime's policy loss passes compute_approx_kl an importance ratio exp(logp - old) when use_unbiased_kl is
    on, and None otherwise. The lint reads the first branch as ratio*k3 (KL003) and the second as k3 (KL002);
    check-grad audits the helper once with the ratio bound (a loss: the weight is part of its value) and once
    at its default, and each branch agrees with its own audit."""
    path = tmp_path / "loss.py"
    path.write_text(textwrap.dedent('''
        import torch


        def approx_kl(log_probs, log_probs_base, importance_ratio=None):
            log_ratio = log_probs_base - log_probs
            kl = log_ratio.exp() - 1 - log_ratio
            if importance_ratio is not None:
                kl = importance_ratio * kl
            return kl


        def policy_loss(log_probs, old_log_probs, ref_log_probs, advantages, mask, use_unbiased_kl=False):
            ratio = torch.exp(log_probs - old_log_probs)
            loss = -(ratio * advantages * mask).sum() / mask.sum()
            importance_ratio = None
            if use_unbiased_kl:
                importance_ratio = torch.exp(log_probs - old_log_probs)
            kl = approx_kl(log_probs, ref_log_probs, importance_ratio=importance_ratio)
            return loss + 0.1 * (kl * mask).sum() / mask.sum()
    '''))
    sites = site_verdicts(str(path))
    assert {(site.config.loss.value, site.inputs_of((str(path.resolve()), "approx_kl"))) for site in sites
            if site.function == "policy_loss"} == {
        ("k3", ()), ("ratio*k3", (("importance_ratio", "ratio"),))}
    verdicts = [verdict for verdict in compare(str(path), _audit(tmp_path)) if verdict.site.function == "policy_loss"]
    assert {(verdict.target.rsplit("::", 1)[-1], verdict.audited_rules, verdict.check_grad_rules, verdict.agree)
            for verdict in verdicts} == {("approx_kl", ("KL002",), ("KL002",), True),
                                         ("approx_kl (importance_ratio=ratio)", ("KL003",), ("KL003",), True)}


def test_a_branch_whose_switch_value_check_grad_skips_is_listed_not_compared(tmp_path):
    """A helper whose "sparse" value needs an input check-grad does not give (it raises without it): that value
    is skipped with a note, and the lint's branch for it is listed as not audited, saying so, instead of
    disagreeing for want of a row. The other value is compared as usual."""
    path = tmp_path / "kl.py"
    path.write_text(textwrap.dedent('''
        def approx_kl(log_probs, ref_log_probs, mode, sparse_log_probs=None):
            if mode == "sparse":
                if sparse_log_probs is None:
                    raise ValueError("the sparse KL needs sparse_log_probs")
                return 0.5 * (log_probs - ref_log_probs) ** 2
            return log_probs - ref_log_probs


        def kl_loss(log_probs, ref_log_probs, mask, mode):
            return (approx_kl(log_probs, ref_log_probs, mode) * mask).sum() / mask.sum()
    '''))
    verdicts = [verdict for verdict in compare(str(path), _audit(tmp_path)) if verdict.site.function == "kl_loss"]
    skipped = [verdict for verdict in verdicts if not verdict.audited]
    assert skipped and all("check-grad skipped switch values" in verdict.reason for verdict in skipped)
    assert all(("sparse" in str(verdict.site.labels)) for verdict in skipped)
    assert [verdict.agree for verdict in verdicts if verdict.audited] == [True]


def test_a_helper_whose_caller_fixes_its_switch_is_audited_at_that_value_only(tmp_path):
    """ROLL's worker calls compute_approx_kl(..., kl_penalty="k3") for its KL loss: the branch is k3's (KL002),
    whatever the helper's other values do as a loss, and no call reaches them in the loss placement. The reward
    that leaves the switch to a parameter of its own is still compared at every value."""
    path = tmp_path / "worker.py"
    path.write_text(textwrap.dedent('''
        def compute_approx_kl(log_probs, log_probs_base, kl_penalty="kl"):
            if kl_penalty == "kl":
                return log_probs - log_probs_base
            if kl_penalty == "mse":
                return 0.5 * (log_probs - log_probs_base).square()
            if kl_penalty == "k3":
                log_ratio = log_probs_base - log_probs
                return log_ratio.exp() - 1 - log_ratio
            raise NotImplementedError


        def loss_func(log_probs, ref_log_probs, advantages, mask):
            pg_loss = -(log_probs * advantages * mask).sum() / mask.sum()
            kl_loss = compute_approx_kl(log_probs, ref_log_probs, kl_penalty="k3")
            return pg_loss + 0.1 * (kl_loss * mask).sum() / mask.sum()
    '''))
    [site] = site_verdicts(str(path))
    assert (site.helper, site.passed_to((str(path.resolve()), "compute_approx_kl")), site.rules) == (
        "compute_approx_kl", (("kl_penalty", ("k3",)),), ("KL002",))
    verdicts = compare(str(path), _audit(tmp_path))
    assert [(verdict.modes, verdict.check_grad_rules, verdict.agree) for verdict in verdicts] == [
        (("kl_penalty=k3",), ("KL002",), True)]


def test_log_probs_handed_to_a_helper_in_the_other_order_are_bound_as_the_call_passes_them(tmp_path):
    """RLinf's actor calls kl_penalty(ref_logprobs, logprobs, kl_type) on a helper whose parameters are
    (logprob, ref_logprob, ...): the lint reads the swap, k1 becomes ref - logp (zero expected gradient as a loss,
    KL001) and k3 a clamped r - 1 - log r with r = pi / ref (OTHER). check-grad binds the helper as the call passes
    its inputs, and agrees."""
    path = tmp_path / "actor.py"
    path.write_text(textwrap.dedent('''
        def kl_penalty(logprob, ref_logprob, kl_type):
            if kl_type == "kl":
                return logprob - ref_logprob
            if kl_type == "k3":
                kl = ref_logprob - logprob
                return kl.exp() - kl - 1
            raise NotImplementedError


        def actor_loss(logprobs, ref_logprobs, mask, kl_type="kl"):
            kld = kl_penalty(ref_logprobs, logprobs, kl_type)
            return (kld * mask).sum() / mask.sum()
    '''))
    sites = site_verdicts(str(path))
    assert {site.inputs_of((str(path.resolve()), "kl_penalty")) for site in sites} == {
        (("logprob", "ref_logprobs"), ("ref_logprob", "logprobs"))}
    verdicts = compare(str(path), _audit(tmp_path))
    assert {(verdict.modes, verdict.check_grad_rules, verdict.agree) for verdict in verdicts} == {
        (("kl_type=kl",), ("KL001",), True), (("kl_type=k3",), ("KL009",), True)}
    # one side alone read as the other's is no swap: a teacher trained in its own phase (LzyFischer/icml_kd's
    # compute_grpo_loss(teacher_lp, ref_lp, ...)) keeps the binding its parameters' names give
    teacher = tmp_path / "teacher.py"
    teacher.write_text(textwrap.dedent('''
        def grpo_loss(logprobs, ref_logprobs, student_logprobs, mask):
            kl_student = logprobs - student_logprobs
            return (kl_student * mask).sum() / mask.sum()


        def teacher_step(teacher_lp, ref_lp, student_lp, mask):
            loss = grpo_loss(teacher_lp, ref_lp, student_lp, mask)
            return loss
    '''))
    sites = [site for site in site_verdicts(str(teacher)) if site.function == "teacher_step"]
    assert sites and {site.inputs_of((str(teacher.resolve()), "grpo_loss")) for site in sites} == {()}


def test_a_helpers_inputs_are_read_per_call_not_merged_over_its_calls(tmp_path):
    """Legacy TRL's PPOTrainer (and its copies: schinger/FullLLM) calls its KL helper on log-probs over the vocabulary
    when kl_penalty is "full" and on per-token log-probs otherwise. Each branch's term is audited with the inputs
    its own call hands the helper: the "abs" reward (KL004) with per-token log-probs, not the vocabulary's."""
    path = tmp_path / "ppo.py"
    path.write_text(textwrap.dedent('''
        import torch.nn.functional as F


        def penalty(logprob, ref_logprob, kl_type):
            if kl_type == "abs":
                return (logprob - ref_logprob).abs()
            if kl_type == "full":
                return F.kl_div(ref_logprob, logprob, log_target=True, reduction="none").sum(-1)
            return logprob - ref_logprob


        def compute_rewards(logprobs, ref_logprobs, logits, ref_logits, kl_type="kl"):
            if kl_type == "full":
                kl = penalty(F.log_softmax(logits, -1), F.log_softmax(ref_logits, -1), kl_type)
            else:
                kl = penalty(logprobs, ref_logprobs, kl_type)
            rewards = -0.1 * kl
            return rewards
    '''))
    sites = [site for site in site_verdicts(str(path)) if site.function == "compute_rewards"]
    assert {site.inputs_of((str(path.resolve()), "penalty")) for site in sites if ("kl_type", ("abs",)) in site.labels} == {()}
    verdicts = [verdict for verdict in compare(str(path), _audit(tmp_path)) if verdict.modes == ("kl_type=abs",)]
    assert verdicts and all(verdict.audited and verdict.agree and verdict.check_grad_rules == ("KL004",)
                            for verdict in verdicts)
