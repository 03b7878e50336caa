"""Shapes of KL code met in the twenty-seventh fresh set's review.

Verdicts (kl-math.md section 8): a KL "to the reference" whose reference is a tensor of zeros compares the policy
with log 1, the one-hot label of a supervised target: no KL between two models, so no row applies. A zero buffer
that the reference's log-probs are then written into stays the reference's (row 1, KL001 for k1 as a loss).
"""

from __future__ import annotations

import pytest
from snippets import module_codes

# Jinghaoleven/RLVR-Schedule's verl copy: compute_sft_loss spells a supervised loss on label tokens with verl's
# kl_penalty, the labels' log 1 standing for the "reference".
SFT_AS_KL = """\
import torch


def kl_penalty(logprob, ref_logprob):
    return logprob - ref_logprob


def sft_loss(logits, labels):
    target_log_probs = torch.log_softmax(logits, -1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    ref_log_prob = torch.zeros_like(target_log_probs)
    loss = kl_penalty(logprob=target_log_probs, ref_logprob=ref_log_prob)
    return loss.mean()
"""

# a zero buffer filled with the reference model's log-probs, sequence by sequence (build-your-own-rlhf's rollout)
FILLED_BUFFER = """\
import torch


def step(model, ref_model, batch, opt):
    logp = model(batch).log_softmax(-1)
    ref_logp = torch.zeros_like(logp)
    for i in range(len(batch)):
        with torch.no_grad():
            ref_logp[i] = ref_model(batch[i]).log_softmax(-1)
    loss = (logp - ref_logp).mean()
    loss.backward()
    opt.step()
"""


def test_a_kl_to_zeros_is_a_supervised_loss_not_a_kl(tmp_path):
    assert module_codes(SFT_AS_KL, tmp_path) == []
    to_a_model = SFT_AS_KL.replace("torch.zeros_like(target_log_probs)", "ref_model(logits).log_softmax(-1)")
    assert module_codes(to_a_model, tmp_path) == [(11, "KL001")]


@pytest.mark.parametrize("buffer", ["torch.zeros_like(logp)", "logp.new_zeros(logp.shape)"])
def test_a_zero_buffer_filled_with_the_references_log_probs_is_the_reference(tmp_path, buffer):
    assert module_codes(FILLED_BUFFER.replace("torch.zeros_like(logp)", buffer), tmp_path) == [(10, "KL001")]


# PRAGA-maker/prorl-on-noma's PPO: one log-prob helper, named for teacher forcing, run on the policy and on the
# reference model alike; k1 of the two as a loss (row 1).
ONE_HELPER_FOR_BOTH = """\
import torch


def _teacher_logp(model, input_ids):
    logits = model(input_ids)
    logprobs = torch.log_softmax(logits, -1)
    return logprobs.gather(-1, input_ids.unsqueeze(-1)).squeeze(-1)


def update(policy, ref_policy, batch, rows, cols, optimizer, beta):
    with torch.no_grad():
        lp_ref = _teacher_logp(ref_policy, batch)
    logp_new_mb = _teacher_logp(policy, batch)
    lp_new = logp_new_mb[rows, cols]
    loss_kl = beta * torch.mean(lp_new - lp_ref[rows, cols])
    loss_kl.backward()
    optimizer.step()
"""


def test_a_helper_named_for_the_reference_and_run_on_the_policy_gives_the_policys_log_probs(tmp_path):
    assert module_codes(ONE_HELPER_FOR_BOTH, tmp_path) == [(15, "KL001")]
    # called only on the policy, the name still says the reference's (a PEFT model with its adapter disabled)
    only_the_policy = ONE_HELPER_FOR_BOTH.replace("_teacher_logp(ref_policy, batch)", "ref_policy(batch)")
    assert module_codes(only_the_policy, tmp_path) == []


# casinca/LLM-quest's RLVR loop: the loss is a static method of a class another module defines and exports.
LOSSES = """\
class GRPOLoss:
    @staticmethod
    def compute(policy_ratio, advantages, beta, kl_div):
        loss = -(policy_ratio * advantages) + beta * kl_div
        return loss.mean()
"""

RLVR_STEP = """\
import torch

from losses import GRPOLoss


def step(model, ref_model, batch, adv, optimizer, beta):
    logp = model(batch).log_softmax(-1)
    with torch.no_grad():
        ref_logp = ref_model(batch).log_softmax(-1)
    log_ratio = ref_logp - logp
    kl_div = torch.exp(log_ratio) - log_ratio - 1
    loss = GRPOLoss.compute(policy_ratio=torch.exp(logp - logp.detach()), advantages=adv, beta=beta, kl_div=kl_div)
    loss.backward()
    optimizer.step()
"""


def test_a_static_method_of_a_class_imported_from_the_tree_is_followed(tmp_path):
    assert module_codes(RLVR_STEP, tmp_path, losses=LOSSES) == [(12, "KL002")]  # k3 as a loss: row 3


def test_in_a_test_a_zero_reference_stands_for_the_reference(tmp_path):
    """NeMo RL's tests of calculate_kl differentiate a loss against `torch.zeros_like(logprobs)` as the reference:
    numbers a test chose for what the name says."""
    in_a_test = SFT_AS_KL.replace("def sft_loss(logits, labels):", "def test_sft_loss(logits, labels):").replace(
        "    return loss.mean()", "    loss.mean().backward()")
    assert module_codes(in_a_test, tmp_path) == [(11, "KL001")]


# suv11235/mtsa-rlvr (nineteenth set): the reference's log-probs from a method named for them, run under no_grad
# like a rollout's; k2 values in the reward (row 9b: only k1 values carry the score-function signal, KL004).
REFERENCE_UNDER_NO_GRAD = """\
import torch
import torch.nn.functional as F


class Trainer:
    def compute_ref_log_probs(self, ids):
        with torch.no_grad():
            outputs = self.ref_model(input_ids=ids, return_dict=True)
            logits = outputs.logits
            log_probs = F.log_softmax(logits, dim=-1)
            selected = torch.gather(log_probs, -1, ids.unsqueeze(-1)).squeeze(-1)
        return selected

    def train_step(self, batch):
        ref_log_probs = self.compute_ref_log_probs(batch["ids"])
        kl = 0.5 * (batch["old_log_probs"] - ref_log_probs) ** 2
        rewards = batch["scores"] - 0.1 * kl
        batch["token_level_rewards"] = rewards
        return batch
"""


def test_a_no_grad_helper_named_for_the_reference_returns_the_references_log_probs(tmp_path):
    assert module_codes(REFERENCE_UNDER_NO_GRAD, tmp_path) == [(17, "KL004")]  # k2 values in the reward


# Rocky18919975029/bandit-RLVR's verl copy: ppo_loss adds a KL loss to the reference under `use_kl_loss` and a
# second KL loss, to another anchor, under `hpf_kl_coef > 0`, both made by verl's `kl_penalty` with its straight-
# through "+" estimators, each with its own estimator switch.
VERL_KL_HELPERS = """\
import torch


def kl_penalty(logprob, ref_logprob, kl_penalty="low_var_kl"):
    forward_score = kl_penalty_forward(logprob, ref_logprob, kl_penalty)
    if not kl_penalty.endswith("+"):
        return forward_score
    backward_score = 0.5 * (logprob - ref_logprob).square()
    return backward_score - backward_score.detach() + forward_score.detach()


def kl_penalty_forward(logprob, ref_logprob, kl_penalty):
    if kl_penalty in ("kl", "k1", "kl+", "k1+"):
        return logprob - ref_logprob
    if kl_penalty in ("abs", "abs+"):
        return (logprob - ref_logprob).abs()
    if kl_penalty in ("mse", "k2", "mse+", "k2+"):
        return 0.5 * (logprob - ref_logprob).square()
    if kl_penalty in ("low_var_kl", "k3", "low_var_kl+", "k3+"):
        kl = ref_logprob - logprob
        ratio = torch.exp(kl)
        return torch.clamp(ratio - kl - 1, min=-10, max=10)
    raise NotImplementedError


def agg_loss(loss_mat, loss_mask, loss_agg_mode):
    if loss_agg_mode == "token-mean":
        return (loss_mat * loss_mask).sum() / loss_mask.sum()
    if loss_agg_mode == "seq-mean-token-sum":
        return (loss_mat * loss_mask).sum(-1).mean()
    if loss_agg_mode == "seq-mean-token-mean":
        return ((loss_mat * loss_mask).sum(-1) / loss_mask.sum(-1)).mean()
    if loss_agg_mode == "seq-mean-token-sum-norm":
        return (loss_mat * loss_mask).sum() / loss_mask.shape[-1]
    raise ValueError(loss_agg_mode)
"""

TWO_KL_LOSSES = """\
from core_algos import agg_loss, kl_penalty


def actor_loss(config, log_prob, data):
    mask = data["response_mask"]
    policy_loss = agg_loss(-data["advantages"] * log_prob, mask, config.loss_agg_mode)
    if config.use_kl_loss:
        kld = kl_penalty(logprob=log_prob, ref_logprob=data["ref_log_prob"], kl_penalty=config.kl_loss_type)
        kl_loss = agg_loss(kld, mask, config.loss_agg_mode)
        policy_loss += kl_loss * config.kl_loss_coef
    anchor_coef = config.anchor_kl_coef
    if anchor_coef > 0:
        anchor_kld = kl_penalty(logprob=log_prob, ref_logprob=data["anchor_ref_log_prob"], kl_penalty=config.anchor_kl_type)
        anchor_kl_loss = agg_loss(anchor_kld, data["anchor_mask"], config.loss_agg_mode)
        policy_loss += anchor_coef * anchor_kl_loss
    return policy_loss
"""


def test_two_kl_losses_under_switches_of_their_own_are_judged_apart(tmp_path):
    """Each KL loss is judged where it is stored (k1 as a loss: row 1, KL001; low_var_kl: row 3, KL002; k2 and the
    straight-through k1+ and k3+: row 2, KL003; abs: KL009; 1/L weights: KL007). Their sum adds two objectives and
    forms no estimator: pairing every value of one switch with every value of the other made mixtures such as
    k1 + k2 that read as k1 at the sum."""
    each = ["KL001", "KL002", "KL003", "KL003", "KL003", "KL007", "KL009"]
    found = module_codes(TWO_KL_LOSSES, tmp_path, name="losses.py", core_algos=VERL_KL_HELPERS)
    assert found == [(9, code) for code in each] + [(14, code) for code in each]


# QuwsarOhi/NanoAgent's MLX GRPO: one helper gives each response's mean token log-prob (padding filled by an
# elementwise `where`, the length counted by another), run on the policy, on a lagging copy of it that samples
# (`model_old`, re-synced every few steps) and on the reference; k3 of the mean log-ratio beside a PPO ratio.
MLX_GRPO = """\
import mlx.core as mx
import mlx.nn as nn


def response_log_probs(model, tokens, answer, pad_id):
    log_probs = nn.log_softmax(model(tokens), axis=-1)
    picked = mx.take_along_axis(log_probs, answer[:, :, None], axis=-1).squeeze(-1)
    n_tokens = mx.where(answer != pad_id, 1, 0).sum(axis=-1) + 1e-8
    picked = mx.where(answer != pad_id, picked, 0)
    return mx.sum(picked, axis=-1) / n_tokens


def grpo_loss(model, model_old, model_ref, tokens, answer, advantages, beta, eps, pad_id):
    logp = response_log_probs(model, tokens, answer, pad_id)
    old_logp = response_log_probs(model_old, tokens, answer, pad_id)
    ratio = mx.exp(logp - old_logp)
    surrogate = mx.minimum(ratio * advantages, mx.clip(ratio, 1 - eps, 1 + eps) * advantages)
    ref_logp = response_log_probs(model_ref, tokens, answer, pad_id)
    log_r = ref_logp - logp
    kl = mx.exp(log_r) - log_r - 1
    return -mx.mean(surrogate - beta * kl)
"""


def test_k3_of_the_mean_log_ratio_beside_a_ratio_to_a_lagging_copy(tmp_path):
    """Row 18b (KL009, with KL007 for its 1/L) on samples of the lagging copy with no importance weight on the
    KL term (row 22, KL008). Before, the copy's log-probs were read as the policy's and the padding fill as a
    second value of every log-prob: the ratio became exp(logp - 0) and the sum matched no estimator (silent)."""
    assert module_codes(MLX_GRPO, tmp_path) == [(21, "KL007"), (21, "KL008"), (21, "KL009")]


def test_the_copy_of_the_policy_is_what_makes_the_samples_older(tmp_path):
    """The same loss with the ratio taken to the policy itself (detached: one step per batch) is on-policy."""
    same_policy = MLX_GRPO.replace("response_log_probs(model_old, tokens, answer, pad_id)",
                                   "mx.stop_gradient(response_log_probs(model, tokens, answer, pad_id))")
    assert module_codes(same_policy, tmp_path) == [(21, "KL007"), (21, "KL009")]


# rui-liu-rl/nano-rl: the trainer module, with no KL words of its own, turns a batch into per-token log-probs
# returned in a dataclass; the GRPO module takes them for the policy and for the frozen reference.
TRAINER_MODULE = """\
from dataclasses import dataclass

import torch


@dataclass
class ForwardOutput:
    logprobs: torch.Tensor
    entropy: torch.Tensor


def forward_logprobs(model, input_ids):
    logits = model(input_ids).logits[:, :-1]
    picked = torch.log_softmax(logits, -1).gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    return ForwardOutput(logprobs=picked, entropy=picked)
"""

GRPO_MODULE = """\
import torch

from trainer import forward_logprobs


def step(policy, frozen, input_ids, mask, opt):
    with torch.no_grad():
        anchor = forward_logprobs(frozen, input_ids).logprobs
    current = forward_logprobs(policy, input_ids).logprobs
    d = anchor - current
    kl = torch.exp(d) - d - 1.0
    loss = (kl * mask).sum() / mask.sum()
    loss.backward()
    opt.step()
"""


def test_a_log_prob_helper_is_followed_into_a_module_without_kl_words(tmp_path):
    """k3 as a loss (row 3, KL002) of log-probs a helper of another module computes: followed by the helper's
    name, as a loss helper is, though that module has no KL vocabulary (before, silent)."""
    assert module_codes(GRPO_MODULE, tmp_path, name="grpo.py", trainer=TRAINER_MODULE) == [(12, "KL002")]
