"""Shapes of KL code met in the fifth fresh set (ReMax, dLLM-RL, cosmos-rl, Quark, mini-grpo, mlx-guided-grpo):
returns filled position by position in a Python loop over a zero buffer, a penalty to the sampling policy
under a name with a token suffix, a reward-to-go computed by a range with a negative step, the exact KL
through a `torch.nn.KLDivLoss` object, a per-sequence mean over lengths read by name, and a ratio times its
inverse.

Verdicts (kl-math.md section 8): a k1 reward that reaches only its own token's score is row 6's local
part (KL003); its reward-to-go (`running += kl[t]` in a loop from the last token back) is row 6,
unbiased (no finding); a divergence to the policy that sampled is a trust region, not the KL to a
reference (no finding); the exact per-step KL differentiated as a loss is the local gradient (KL003); a
per-sequence mean weights each sequence by 1/L (row 21, KL007).
"""

from __future__ import annotations

import pytest
from snippets import module_codes

# ReMax's REINFORCE: the returns of a terminal score discounted back, plus each token's own k1 value
RETURNS_FILLED_IN_A_LOOP = """\
    import torch


    def compute_loss(model, seq, ref_log_probs, old_log_probs, reward_score, mask, kl_ctl, gamma):
        with torch.no_grad():
            kl_divergence = -(old_log_probs - ref_log_probs)
            kl_divergence = kl_ctl * kl_divergence
            returns = torch.zeros_like(kl_divergence)
            for j in range(seq.shape[0]):
                cumulative_reward = reward_score[j]
                cumulative_kl = 0
                for i in reversed(range(seq.shape[1])):
                    {kl_step}
                    cumulative_reward *= gamma
                    returns[j, i] += cumulative_kl + cumulative_reward
        logits = model(seq).logits
        log_probs = torch.log_softmax(logits, dim=-1).gather(-1, seq.unsqueeze(-1)).squeeze(-1)
        actor_loss = torch.sum(-returns * log_probs * mask) / mask.sum()
        return actor_loss
    """


@pytest.mark.parametrize("kl_step, codes", [
    ("cumulative_kl = kl_divergence[j, i]", [(15, "KL003")]),  # its own token's k1 only: the local part
    ("cumulative_kl += kl_divergence[j, i]", []),  # the k1 reward-to-go: row 6
    ("cumulative_kl = kl_divergence[j, i] + cumulative_kl", []),
])
def test_returns_added_into_a_zero_buffer_position_by_position_carry_the_kl(tmp_path, kl_step, codes):
    assert module_codes(RETURNS_FILLED_IN_A_LOOP.format(kl_step=kl_step), tmp_path) == codes


# dLLM-RL's PPO step: the "KL" penalises the distance to the policy that sampled (a trust region)
PENALTY_TO_THE_SAMPLING_POLICY = """\
    import torch
    import torch.nn.functional as F


    def forward_process(model, input_ids, labels, adv, mask, logp_old_tok, logp_ref_tok, beta, eps):
        logits = model(input_ids).logits
        log_probs = F.log_softmax(logits, dim=-1)
        logp_new_tok = log_probs.gather(dim=-1, index=labels.unsqueeze(-1)).squeeze(-1)
        ratio = torch.exp(logp_new_tok - logp_old_tok)
        clipped = torch.clamp(ratio, 1 - eps, 1 + eps)
        policy_loss = -(torch.min(ratio * adv, clipped * adv) * mask).sum() / mask.sum()
        kl_seq = logp_new_tok - {other}
        kl_seq = torch.exp(-kl_seq) - 1.0 + kl_seq
        kl_loss = beta * (kl_seq * mask).sum() / mask.sum()
        return policy_loss + kl_loss
    """


@pytest.mark.parametrize("other, codes", [
    ("logp_old_tok", []),  # a divergence to the sampling policy: no KL to a reference
    ("logp_ref_tok", [(14, "KL002"), (14, "KL008")]),  # k3 to the reference as a loss, beside the PPO ratio
])
def test_a_per_token_suffix_keeps_the_role_a_name_gives(tmp_path, other, codes):
    assert module_codes(PENALTY_TO_THE_SAMPLING_POLICY.format(other=other), tmp_path) == codes


# cosmos-rl's distillation: per-token k1 to the teacher, its discounted reward-to-go computed backwards by
# a range with a negative step
KL_RETURNS_COMPUTED_BACKWARDS = """\
    import torch


    def kl_advantages(logprobs, teacher_logprobs, advantages, coef, gamma):
        kl = -coef * (logprobs.detach() - teacher_logprobs)
        returns = torch.zeros_like(kl)
        running = 0
        for t in {steps}:
            running = kl[:, t] + gamma * running
            returns[:, t] = running
        return advantages + returns


    def loss_fn(logprobs, teacher_logprobs, advantages, mask, coef, gamma):
        adv = kl_advantages(logprobs, teacher_logprobs, advantages, coef, gamma)
        return -(logprobs * adv * mask).sum() / mask.sum()
    """


@pytest.mark.parametrize("steps, codes", [
    ("range(kl.shape[1] - 1, -1, -1)", []),  # from the last token back: the reward-to-go (row 6)
    ("reversed(range(kl.shape[1]))", []),
    ("range(kl.shape[1])", [(10, "KL003")]),  # forwards, the running sum is over the prefix: no reward-to-go
])
def test_a_range_with_a_negative_step_runs_backwards(tmp_path, steps, codes):
    assert module_codes(KL_RETURNS_COMPUTED_BACKWARDS.format(steps=steps), tmp_path) == codes


# Quark's loss: the exact per-step KL over the vocabulary through a torch.nn.KLDivLoss object
KL_DIV_LOSS_OBJECT = """\
    import torch
    import torch.nn.functional as F


    class Trainer:
        def __init__(self, policy, ref_policy, kl_coef):
            self.policy, self.ref_policy, self.kl_coef = policy, ref_policy, kl_coef
            self.kl_loss = torch.nn.KLDivLoss(reduction="none")

        def loss(self, input_ids, masks):
            logits = self.policy(input_ids).logits
            with torch.no_grad():
                ref_logits = self.ref_policy(input_ids).logits
            kl = torch.sum({module}(F.log_softmax(ref_logits, dim=-1), F.softmax(logits, dim=-1)), dim=-1)
            return (self.kl_coef * kl * masks).sum() / masks.sum()
    """


@pytest.mark.parametrize("module", ["self.kl_loss", 'torch.nn.KLDivLoss(reduction="none")'])
def test_a_kl_div_loss_object_computes_f_kl_div(tmp_path, module):
    # the exact KL_t of each position as a loss: the local gradient only (PART, KL003)
    assert module_codes(KL_DIV_LOSS_OBJECT.format(module=module), tmp_path) == [(15, "KL003")]


# mini-grpo's loss: each sequence's token sum divided by its own length, read from the rollout batch
DIVIDED_BY_EACH_LENGTH = """\
    import torch


    def grpo_loss(new_logprobs, ref_logprobs, advantages, mask, batch, beta):
        {lengths} = batch["{lengths}"]
        kl = torch.exp(ref_logprobs - new_logprobs) - (ref_logprobs - new_logprobs) - 1
        per_token = new_logprobs * advantages.unsqueeze(-1) - beta * kl
        per_sequence = (per_token * mask).sum(dim=-1) / {lengths}.float()
        return -per_sequence.mean()
    """


@pytest.mark.parametrize("lengths, codes", [
    ("rollout_lens", [(9, "KL002"), (9, "KL007")]),  # each sequence's own length: 1/L (row 21)
    ("response_lengths", [(9, "KL002"), (9, "KL007")]),
    ("max_len", [(9, "KL002")]),  # a scalar: a constant divisor, no 1/L
    ("cu_seqlens", [(9, "KL002")]),  # packed offsets are no lengths
])
def test_a_division_by_a_name_of_per_sequence_lengths_is_a_per_sequence_mean(tmp_path, lengths, codes):
    assert module_codes(DIVIDED_BY_EACH_LENGTH.format(lengths=lengths), tmp_path) == codes


def test_a_length_name_computed_in_the_code_is_not_read_from_its_name(tmp_path):
    # MiniLLM's remaining lengths, a reverse cumsum of the mask times discounts: what the code computes decides
    source = DIVIDED_BY_EACH_LENGTH.format(lengths="lengths").replace(
        'lengths = batch["lengths"]', "lengths = torch.where(mask < 0.5, 1e-4, mask) * gamma_pow")
    assert (9, "KL007") not in module_codes(source.replace("batch, beta", "batch, beta, gamma_pow"), tmp_path)


# mlx-guided-grpo's KL term: its "importance" weight is exp(logp - sg(ref)), so the first product is
# (pi/ref) * (ref/pi) = 1, value and gradient, and the term is 1 + log(pi/ref) - 1: k1
RATIO_TIMES_ITS_INVERSE = """\
    import torch


    def kl_loss(token_log_probs, ref_token_log_probs, mask, beta):
        coef_1 = torch.exp(token_log_probs - ref_token_log_probs.detach())
        log_ratio_ref_theta = ref_token_log_probs - token_log_probs
        kl_div = coef_1 * torch.exp(log_ratio_ref_theta) - log_ratio_ref_theta - 1
        return beta * (kl_div * mask).sum() / mask.sum()
    """


def test_a_ratio_times_its_inverse_is_one(tmp_path):
    # k1 differentiated as a loss: zero expected gradient (row 1, KL001)
    assert module_codes(RATIO_TIMES_ITS_INVERSE, tmp_path) == [(8, "KL001")]
