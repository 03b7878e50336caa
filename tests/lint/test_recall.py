"""Forms met in trainers klaudit was not built against, that once hid a KL term from the analysis.

Each snippet spells a row of kl-math.md section 8 (k2 as a loss: row 2, KL003) through the form
in question; its correct twin (k1 reward-to-go, row 6; k3 loss + k3 reward-to-go, R-C) gives nothing.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

from snippets import module_codes

from klaudit.catalog import Estimator
from klaudit.lint import algebra as alg
from klaudit.lint.algebra import Atom, Poly


def codes(source: str, tmp_path: Path) -> list:
    return module_codes(source, tmp_path)


# A helper whose parameter is named like rollout log-probs fills masked entries with the function
# forms torch.masked_fill / torch.nan_to_num: the caller's policy log-probs must come back as they
# went in, not as the behaviour policy's (which, detached, made the k2 loss below invisible).
FILL = """\
    import torch


    def fill_invalid(rollout_logprobs, mask):
        rollout_logprobs = torch.masked_fill(rollout_logprobs, ~mask, 1.0)
        rollout_logprobs = torch.nan_to_num(rollout_logprobs, nan=1.0)
        return rollout_logprobs


    def train_step(logprobs, ref_logprobs, mask):
        logprobs = fill_invalid(logprobs, mask)
"""


def test_function_form_fill_keeps_the_policy_log_probs(tmp_path):
    source = FILL + """\
        log_ratio = logprobs - ref_logprobs
        kl_loss = (0.5 * log_ratio * log_ratio * mask).sum() / mask.sum()
        kl_loss.backward()
    """
    assert codes(source, tmp_path) == [(13, "KL003")]


def test_function_form_fill_with_reward_to_go_is_silent(tmp_path):
    source = FILL + """\
        kl = (logprobs - ref_logprobs).detach()
        kl_to_go = kl.flip(-1).cumsum(-1).flip(-1)
        loss = (logprobs * kl_to_go * mask).sum() / mask.sum()
        loss.backward()
    """
    assert codes(source, tmp_path) == []


def test_method_of_an_unknown_receiver_is_not_its_argument(tmp_path):
    # `out.squeeze(-1)` on a model output the analysis cannot explain is not the tensor -1: the
    # target's name gives the policy's log-probs, and the k2 loss stays visible
    source = """\
        import torch


        def train_step(model, batch, ref_logprobs, mask):
            logprobs = model(batch).squeeze(-1)
            log_ratio = logprobs - ref_logprobs
            kl_loss = (0.5 * log_ratio * log_ratio * mask).sum() / mask.sum()
            kl_loss.backward()
        """
    assert codes(source, tmp_path) == [(7, "KL003")]


# Rollout log-probs of the sampling policy next to a teacher's, converted with torch.tensor, the
# penalty written into each datum's advantages: same-token k1 (row 2, KL003) unless summed to go.
PENALTY = """\
    import torch


    def penalize(datums, teacher_logprobs_list, coef):
        for datum, teacher_logprobs in zip(datums, teacher_logprobs_list):
            sampled_logprobs = datum.inputs["logprobs"]
            logprob_diff = sampled_logprobs - torch.tensor(teacher_logprobs)
"""


def test_teacher_log_probs_through_torch_tensor_reach_the_advantage(tmp_path):
    source = PENALTY + """\
            datum.inputs["advantages"] = datum.inputs["advantages"] - coef * logprob_diff
    """
    assert codes(source, tmp_path) == [(8, "KL003")]


def test_teacher_penalty_summed_to_go_is_silent(tmp_path):
    source = PENALTY + """\
            diff_to_go = logprob_diff.flip(-1).cumsum(-1).flip(-1)
            datum.inputs["advantages"] = datum.inputs["advantages"] - coef * diff_to_go
    """
    assert codes(source, tmp_path) == []


# An on-policy GSPO-token policy loss: -A * sg(sequence ratio) * exp(logp - sg logp). Its monomial
# holds two score multipliers and no KL atom; added to the KL term it must not hide the estimator.
GSPO_TOKEN = """\
    import torch


    def grpo_loss(logprobs, ref_logprobs, advantages, mask, beta):
        token_ratio = torch.exp(logprobs - logprobs.detach())
        seq_log_ratio = ((logprobs - logprobs.detach()) * mask).sum(-1, keepdim=True)
        seq_weight = torch.exp(seq_log_ratio).detach()
        pg_loss = -advantages * seq_weight * token_ratio
"""


def test_policy_loss_beside_the_kl_loss_is_another_term(tmp_path):
    source = GSPO_TOKEN + """\
        log_ratio = logprobs - ref_logprobs
        kl = 0.5 * log_ratio * log_ratio
        loss = ((pg_loss + beta * kl) * mask).sum() / mask.sum()
        return loss
    """
    assert codes(source, tmp_path) == [(11, "KL003")]


def test_policy_loss_beside_a_correct_kl_is_silent(tmp_path):
    source = GSPO_TOKEN + """\
        log_ratio = ref_logprobs - logprobs
        k3 = torch.exp(log_ratio) - log_ratio - 1
        k3_to_go = k3.detach().flip(-1).cumsum(-1).flip(-1)
        kl = k3 + logprobs * k3_to_go
        loss = ((pg_loss + beta * kl) * mask).sum() / mask.sum()
        return loss
    """
    assert codes(source, tmp_path) == []


def test_terms_of_sets_aside_the_policy_gradient_part():
    d = Atom(alg.DELTA, True)
    k2 = alg.mul(Poly.atom(d), Poly.atom(d))
    gspo_token = alg.mul(Poly.atom(Atom(alg.SCORE, False, alg.SEQUENCE)), Poly.atom(Atom(alg.SCORE, True), -1.0))
    corrected = alg.mul(Poly.atom(Atom(alg.POLICY, True)), Poly.atom(Atom(alg.IS_RATIO, False), -1.0))
    for policy_part in (gspo_token, corrected):
        terms = alg.terms_of(alg.add(k2, policy_part), "loss")
        assert [(t.place, t.estimator) for t in terms] == [("loss", Estimator.K2)]


def test_terms_of_keeps_reference_atoms_that_spoil_the_form():
    # d + log ref is no estimator: the reference log-prob is not a policy-gradient term to set aside
    d = Atom(alg.DELTA, True)
    terms = alg.terms_of(alg.add(Poly.atom(d), Poly.atom(Atom(alg.REF, False))), "loss")
    assert [(t.place, t.estimator) for t in terms] == [("loss", None)]


def test_terms_of_sets_aside_a_policy_term_weighted_by_pi_over_ref():
    # GCPO: -A * exp(logp - sg logp) * exp(clamp(logp - ref)) beside beta * k3 (the advantage a dropped scale);
    # a preference loss -f * exp(logp - ref) summed over the response beside k2: pi / ref weights the policy's term
    d, r, inv = Atom(alg.DELTA, True), Atom(alg.RATIO, True), Atom(alg.INV_RATIO, True)
    k3 = alg.add(alg.add(Poly.atom(r), Poly.atom(d)), Poly.const(-1.0))
    weighted_pg = alg.mul(Poly.atom(Atom(alg.SCORE, True)), Poly.atom(inv, -1.0))
    assert [(t.place, t.estimator) for t in alg.terms_of(alg.add(k3, weighted_pg), "loss")] == [
        ("loss", Estimator.K3)]
    k2 = alg.mul(Poly.atom(d), Poly.atom(d))
    sequence_weight = Poly.atom(Atom(alg.INV_RATIO, True, alg.SEQUENCE), 9.0)
    assert [(t.place, t.estimator) for t in alg.terms_of(alg.add(k2, sequence_weight), "loss")] == [
        ("loss", Estimator.K2)]


def test_terms_of_keeps_a_detached_pi_over_ref_whose_product_it_does_not_see():
    # OREO's clipped sequence weight of its Bellman losses, detached, beside the exact KL: no reading of the sum
    full, weight = Atom(alg.FULL, True, alg.SEQUENCE), Atom(alg.INV_RATIO, False, alg.SEQUENCE)
    assert [(t.place, t.estimator) for t in alg.terms_of(alg.add(Poly.atom(full), Poly.atom(weight)), "loss")] == [
        ("loss", None)]


def test_terms_of_keeps_pi_over_ref_where_it_is_the_estimator():
    # exp(d) - 1 - d is k3 with the ratio upside down: pi / ref is the estimator's own monomial, not a weight
    d, inv = Atom(alg.DELTA, True), Atom(alg.INV_RATIO, True)
    reversed_k3 = alg.add(alg.add(Poly.atom(inv), Poly.atom(d, -1.0)), Poly.const(-1.0))
    assert [(t.place, t.estimator) for t in alg.terms_of(reversed_k3, "loss")] == [("loss", Estimator.K3_REVERSED)]


# GCPO's loss (gcpo_llama_trainer.py): the clipped surrogate reweighted by the running mean of
# exp(clamp(logp - ref)), plus beta * k3: row 4's k3 loss (KL002), read as k3 itself, unclamped (the clamp is
# inside the policy term's weight, not on the KL).
REWEIGHTED = """\
    import torch


    def compute_loss(per_token_logps, ref_per_token_logps, advantages, mask, beta):
        coef_1 = torch.exp(per_token_logps - per_token_logps.detach())
        coef_2 = torch.clamp(coef_1, 0.8, 1.2)
        per_token_loss = -torch.min(coef_1 * advantages.unsqueeze(1), coef_2 * advantages.unsqueeze(1))
        weight = torch.exp(torch.clamp(per_token_logps - ref_per_token_logps, -0.5, 0.5))
        weight = weight.cumsum(dim=-1) / torch.arange(1, weight.size(1) + 1, device=weight.device)
        per_token_loss = per_token_loss * weight
{kl}
        return (per_token_loss * mask).sum() / mask.sum()
"""
K3_LOSS = """\
        per_token_kl = torch.exp(ref_per_token_logps - per_token_logps) - (ref_per_token_logps - per_token_logps) - 1
        per_token_loss = per_token_loss + beta * per_token_kl"""


def test_a_k3_loss_beside_a_policy_term_weighted_by_pi_over_ref(tmp_path):
    import libcst as cst

    from klaudit.lint.checks import check_module
    from klaudit.lint.project import Project

    path = tmp_path / "gcpo.py"
    text = textwrap.dedent(REWEIGHTED.format(kl=K3_LOSS))
    path.write_text(text)
    findings = check_module(str(path), cst.parse_module(text), Project([tmp_path]), text)
    assert [(f.line, f.code) for f in findings] == [(12, "KL002")]
    assert findings[0].message.startswith("k3 differentiated as a loss")
