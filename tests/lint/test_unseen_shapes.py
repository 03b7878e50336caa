"""Shapes of KL code met on repositories in no corpus (PipelineRL, miles, minimind): a loss negated through a
reduction helper of a module without KL words, an entropy bonus over the logits added to the KL loss,
a loop that scales each element of a list of KL tensors in place, and log-probs gathered at the
response's positions from behaviour log-probs a rollout engine returned.

Verdicts (kl-math.md section 8): k3 differentiated as a loss is row 3 (KL002) whatever sign convention
carries it there; a KL added to what the optimiser maximises, or a k1 reward added with a positive
sign, is a bonus (KL011); k1 in the reward with its reward-to-go is row 6, unbiased (no finding).
"""

from __future__ import annotations

import pytest
from snippets import module_codes

from klaudit.catalog import Estimator
from klaudit.lint import algebra as alg
from klaudit.lint.algebra import Atom, Poly
from klaudit.lint.roles import tensor_role

NEGATED_THROUGH_A_HELPER = """\
    import torch
    from reducing import sum_sum


    def rl_step(new_logprobs, ref_logprobs, advantages, masks, weights, kl_coef, segments):
        log_ratio_ref_new = ref_logprobs - new_logprobs
        approx_kl = torch.exp(log_ratio_ref_new) - log_ratio_ref_new - 1
        loss = new_logprobs * advantages - kl_coef * approx_kl
        loss = loss * weights
        policy_loss_total = {total}
        return policy_loss_total
    """

# no KL words (the module is not followed for its vocabulary): only the helper's name says it reduces
REDUCING = """\
    import torch


    def sum_sum(values, masks, segments):
        if segments is None:
            return (values * masks).sum()
        return torch.stack([(values[:, a:b] * masks[:, a:b]).sum() for a, b in segments]).sum()
    """


@pytest.mark.parametrize("total, codes", [
    ("-sum_sum(loss, masks, segments)", [(8, "KL002")]),  # a penalty: the maximised objective, negated
    ("sum_sum(loss, masks, segments)", [(8, "KL002"), (8, "KL011")]),  # the objective minimised: a bonus
])
def test_the_sign_of_a_loss_is_read_through_a_reduction_helper_of_a_module_without_kl_words(tmp_path, total, codes):
    source = NEGATED_THROUGH_A_HELPER.format(total=total)
    assert module_codes(source, tmp_path, "step.py", reducing=REDUCING) == codes


ENTROPY_BONUS = """\
    import torch


    def rl_step(logits, new_logprobs, ref_logprobs, advantages, masks, kl_coef, entropy_coef):
        log_norm = torch.logsumexp(logits, dim=-1)
        logprobs = logits - log_norm.unsqueeze(-1)
        entropy = -(torch.exp(logprobs) * logprobs).sum(dim=-1)
        log_ratio = ref_logprobs - new_logprobs
        approx_kl = torch.exp(log_ratio) - log_ratio - 1
        loss = -(new_logprobs * advantages) + kl_coef * approx_kl - entropy_coef * entropy
        return (loss * masks).sum()
    """


def test_an_entropy_bonus_over_the_logits_leaves_the_k3_loss_it_is_added_to(tmp_path):
    assert module_codes(ENTROPY_BONUS, tmp_path) == [(10, "KL002")]


def test_terms_of_sets_aside_a_monomial_of_the_policys_logits():
    # k3 = r - 1 + d plus a term of the policy's logits alone (an entropy bonus): still k3
    k3 = alg.add(alg.add(Poly.atom(Atom(alg.RATIO, True)), Poly.atom(Atom(alg.DELTA, True))), Poly.const(-1.0))
    bonus = Poly.atom(Atom(alg.LOGITS, True, alg.SEQUENCE))
    terms = alg.terms_of(alg.add(k3, bonus), "loss")
    assert [(t.place, t.estimator) for t in terms] == [("loss", Estimator.K3)]


SCALED_IN_A_LOOP = """\
    from gae import get_advantages_and_returns_batch


    def compute_advantages(args, kl, values):
        token_rewards = []
        kl_coef = {coef}
        for k in kl:
            k *= kl_coef
            token_rewards.append(k)
        return get_advantages_and_returns_batch(values_list=values, rewards_list=token_rewards)


    def step(args, log_probs, ref_log_probs, values):
        kl = [lp - rlp for lp, rlp in zip(log_probs, ref_log_probs)]
        return compute_advantages(args, kl, values)
    """


@pytest.mark.parametrize("coef, codes", [("-args.kl_coef", []), ("args.kl_coef", [(15, "KL011")])])
def test_a_loop_variable_scaled_in_place_is_scaled_once_per_element(tmp_path, coef, codes):
    # each iteration binds k to the next element: the second pass over the body must not scale it twice
    assert module_codes(SCALED_IN_A_LOOP.format(coef=coef), tmp_path) == codes


HINGE = """\
    import torch


    def hinge_loss(logp, ref_logp, mask):
        d = ref_logp - logp
        loss = ({term} * mask).sum() / mask.sum()
        return loss
    """


@pytest.mark.parametrize("term, codes", [
    ("d", [(6, "KL001")]),  # the log-ratio itself: a k1 loss, whatever its sign
    ("torch.relu(d)", []),
    ("torch.max(torch.zeros_like(d).to(d.device), d)", []),  # LMOps dpkd's DPOP term: relu(d), no estimator
])
def test_the_larger_of_a_log_ratio_and_zeros_is_a_hinge_not_the_log_ratio(tmp_path, term, codes):
    assert module_codes(HINGE.format(term=term), tmp_path) == codes


PAIR_DISTILLATION = """\
    import torch


    def ipo_distillation(student_chosen_logps, student_reject_logps, teacher_chosen_logps, teacher_reject_logps,
                         mask, beta):
        relative_logits = (student_chosen_logps - student_reject_logps) - (teacher_chosen_logps - teacher_reject_logps)
        loss = (relative_logits - 1 / (2 * beta)) ** 2
        return (loss * mask).sum() / mask.sum()
    """


def test_a_preference_pair_spelled_reject_forms_no_kl_estimate(tmp_path):
    # LMOps dpkd: the teacher's and the student's log-probs of a chosen and a rejected response (IPO)
    assert tensor_role("teacher_reject_logps") is None
    assert module_codes(PAIR_DISTILLATION, tmp_path) == []


RETURNED_LOG_RATIO = """\
    def kl_rewards(logprobs, ref_logprobs):
        rewards = logprobs - ref_logprobs
        return rewards
    {caller}
    """

CALLER = """
    def make_rewards(scores, logprobs, ref_logprobs, beta):
        rewards = {combined}
        return rewards
    """


@pytest.mark.parametrize("combined, codes", [
    (None, []),  # returned alone: a value whose sign the caller gives, not yet a reward
    ("scores - beta * kl_rewards(logprobs, ref_logprobs)", []),  # a penalty (k1 reward-to-go, row 6)
    ("scores + beta * kl_rewards(logprobs, ref_logprobs)", [(2, "KL011")]),  # added to the score: a bonus (at its entry)
    ("kl_rewards(logprobs, ref_logprobs)", []),  # handed on alone: still the next caller's to give a sign
])
def test_a_kl_estimate_returned_alone_gets_its_sign_from_the_reward_it_is_added_to(tmp_path, combined, codes):
    caller = CALLER.format(combined=combined) if combined else ""
    assert module_codes(RETURNED_LOG_RATIO.format(caller=caller), tmp_path) == codes


SEQUENCE_REWARDS = """\
    import torch.nn.functional as F


    class Trainer:
        def get_sequence_rewards(self, policy_logps, reference_logps):
            token_rewards = policy_logps - reference_logps
            return token_rewards.sum(-1)

        def loss(self, policy_chosen_logps, policy_rejected_logps, reference_chosen_logps, reference_rejected_logps):
            chosen_rewards = self.get_sequence_rewards(policy_chosen_logps, reference_chosen_logps)
            rejected_rewards = self.get_sequence_rewards(policy_rejected_logps, reference_rejected_logps)
            losses = {loss}
            return losses, chosen_rewards.detach(), rejected_rewards.detach()
    """


@pytest.mark.parametrize("loss", [
    "-F.logsigmoid(chosen_rewards - rejected_rewards)",  # DPO
    "(chosen_rewards - rejected_rewards - 0.5).pow(2)",  # IPO
])
def test_a_preference_pairs_log_probs_passed_to_a_helper_form_no_kl_estimate_there(tmp_path, loss):
    # HALOs: the implicit reward log pi - log ref of the chosen and the rejected response, computed by a
    # helper whose parameters are named like a policy's and a reference's log-probs
    assert module_codes(SEQUENCE_REWARDS.format(loss=loss), tmp_path) == []



TRAJECTORY_BALANCE = """\
    def flow_loss(log_z, log_prob, ref_log_prob, reward, response_mask, beta):
        avg_log_prob = (log_prob * response_mask).sum(-1) / response_mask.sum(-1)
        avg_ref_log_prob = (ref_log_prob * response_mask).sum(-1) / response_mask.sum(-1)
        delta = {residual}
        return (delta**2).mean()
    """


@pytest.mark.parametrize("residual, codes", [
    # FlowRL's trajectory balance: the square of a residual holding log Z and the reward, whose cross term
    # with the log-ratio is no KL estimator (nothing to report)
    ("log_z + avg_log_prob - beta * reward.sum(-1) - avg_ref_log_prob", []),
    # the squared mean log-ratio alone: k2 of the sequence's log-ratio, whose gradient is the reverse KL's
    # but for the 1/L of the mean (row 21, KL007)
    ("avg_log_prob - avg_ref_log_prob", [(5, "KL007")]),
])
def test_the_square_of_a_residual_beside_the_log_ratio_is_no_k2(tmp_path, residual, codes):
    assert module_codes(TRAJECTORY_BALANCE.format(residual=residual), tmp_path) == codes


SPPO_STEP = """\
    def sppo_step(log_prob, old_log_prob, ref_log_prob, rewards, response_mask, eta, beta):
        log_ratios = (log_prob * response_mask).sum(1) - (old_log_prob * response_mask).sum(1)
        pg_loss = ((log_ratios - eta * rewards) ** 2).mean()
        kl = ref_log_prob - log_prob
        kl_loss = ((kl.exp() - kl - 1) * response_mask).sum() / response_mask.sum()
        loss = pg_loss + beta * kl_loss
        return loss
    """


def test_a_surrogate_of_the_policy_and_the_behaviour_policy_leaves_the_kl_loss_beside_it(tmp_path):
    # verl-recipe's SPPO: (log pi/pi_old - eta r)^2 beside a k3 loss. The surrogate holds no reference: it is
    # another term of the sum. k3 as a loss is row 3 (KL002); beside the old policy's log-probs, on older
    # samples without prefix weights, row 22 (KL008). Before, the whole sum matched no estimator (KL100).
    assert module_codes(SPPO_STEP, tmp_path) == [(5, "KL002"), (5, "KL008")]


def test_terms_of_sets_aside_a_monomial_of_the_policy_and_the_behaviour_policy():
    w = Atom(alg.IS_LOG, True)
    k3 = Poly.of({(Atom(alg.RATIO, True),): 1.0, (Atom(alg.DELTA, True),): 1.0, (): -1.0})
    surrogate = Poly.of({(w, w): 1.0})
    assert [t.estimator for t in alg.terms_of(alg.add(surrogate, k3), "loss")] == [Estimator.K3]


# minimind's PPO: the sampled tokens' log-probs are then gathered at the response's positions (a [B, R]
# index), and the behaviour policy's come from the rollout engine's result, moved to the device
PPO_FROM_A_ROLLOUT_ENGINE = """\
    import torch
    import torch.nn.functional as F


    def ppo_step(actor, ref_model, rollout_engine, gen_out, labels, logp_pos, advantages, mask, kl_coef):
        rollout_result = rollout_engine.rollout(gen_out)
        old_resp_logp = rollout_result.per_token_logps.to(gen_out.device)
        with torch.no_grad():
            ref_logits = ref_model(gen_out).logits[:, :-1]
            ref_resp_logp = F.log_softmax(ref_logits, dim=-1).gather(2, labels.unsqueeze(-1)).squeeze(-1).gather(1, {index})
        logits = actor(gen_out).logits[:, :-1]
        mb_resp_logp = F.log_softmax(logits, dim=-1).gather(2, labels.unsqueeze(-1)).squeeze(-1).gather(1, {index})
        ratio = torch.exp(mb_resp_logp - old_resp_logp)
        d = ref_resp_logp - mb_resp_logp
        kl_ref = ((torch.exp(d) - d - 1.0) * mask).sum() / mask.sum()
        loss = (-advantages * ratio * mask).sum() / mask.sum() + kl_coef * kl_ref
        loss.backward()
    """


@pytest.mark.parametrize("index, codes", [
    # k3 as a loss (row 3) on the rollout's older samples, with no prefix weights (KL008)
    ("logp_pos", [(16, "KL002"), (16, "KL008")]),
    # the last position only: a KL of the last token (KL005), whatever its estimator
    ("(lengths - 1).unsqueeze(-1)", [(16, "KL005"), (16, "KL008")]),
])
def test_log_probs_gathered_at_positions_keep_their_meaning_and_a_rollouts_are_the_behaviour_policys(
        tmp_path, index, codes):
    source = PPO_FROM_A_ROLLOUT_ENGINE.format(index=index)
    assert module_codes(source, tmp_path) == codes


# ChatLearn's GRPO: the FSDP trainer pads the log-probs back to the batch's length and selects the
# response tokens with masked_select; the Megatron one sets the ratio to 1 on the padding by assignment
CHATLEARN_FSDP = """\
    import torch
    import torch.nn.functional as F


    def train_step(self, data_list, response_token_length_total):
        for inputs in data_list:
            output = self.model(input_ids=inputs["all_tokens"])
            logprobs = logprobs_from_logits(output.logits, inputs["labels"])
            logprobs = F.pad(logprobs, (0, inputs["ori_seq_len"] - logprobs.shape[1]), mode="constant", value=0)
            kl = inputs["ref_logprobs"] - logprobs
            kl = torch.masked_select(kl, inputs["loss_mask"].bool())
            kld = torch.exp(kl) - kl - 1
            kl_loss_mean = torch.sum(kld) / response_token_length_total
            total_loss = self.kl_coef * kl_loss_mean
            total_loss.backward()
    """

CHATLEARN_MEGATRON = """\
    import torch


    def train_step(log_probs, ref_logprobs, training_inputs):
        kl = ref_logprobs - log_probs
        ratio = torch.exp(kl)
        ratio[~training_inputs["all_token_loss_mask"].bool()] = 1
        kld = ratio - kl - 1
        kl_loss = torch.clamp(kld, min=-10, max=10)
        loss = kl_loss.sum()
        loss.backward()
    """


def test_padding_and_masked_select_keep_the_log_probs_meaning(tmp_path):
    # k3 differentiated as a loss (row 3)
    assert module_codes(CHATLEARN_FSDP, tmp_path) == [(13, "KL002")]


def test_padding_entries_set_by_assignment_are_a_masked_fill(tmp_path):
    # the clamped k3 (low_var_kl) as a loss, row 3/4: setting the padding's ratio to 1 makes no k1 (no KL001)
    assert module_codes(CHATLEARN_MEGATRON, tmp_path) == [(9, "KL002")]
