"""Shapes of KL code met in the twenty-eighth fresh set's review.

Verdicts (kl-math.md section 8): k3 = exp(ref - logp) - (ref - logp) - 1 as a loss is row 3 (KL002); trained for
several optimizer steps on one rollout with no importance weight on the KL term it is row 22 (KL008).
"""

from __future__ import annotations

from snippets import module_codes

# uygarkurt/post-training-lab's PyTorch GRPO: the sampled tokens' log-probs picked from the vocabulary-level
# log-probs by an index array on every axis (numpy's advanced indexing), then PPO epochs on one rollout.
PICKED_BY_INDEX_ARRAYS = """\
import torch


def token_logprobs(model, ids, rollouts, masks):
    logprobs = torch.log_softmax(model(ids).logits[:, :-1], dim=-1)
    rows = torch.arange(rollouts.shape[0]).unsqueeze(-1)
    cols = torch.arange(rollouts.shape[1]).unsqueeze(0)
    return logprobs[rows, cols, rollouts] * masks


def train_step(policy, frozen, optimizer, ids, rollouts, masks, old, advantage, epochs, kl_coef):
    with torch.no_grad():
        anchor = token_logprobs(frozen, ids, rollouts, masks)
    for _ in range(epochs):
        optimizer.zero_grad()
        current = token_logprobs(policy, ids, rollouts, masks)
        ratio = torch.exp(current - old)
        surrogate = torch.minimum(ratio * advantage, torch.clamp(ratio, 0.8, 1.2) * advantage)
        diff = anchor - current
        kl = torch.exp(diff) - diff - 1
        loss = ((-surrogate + kl_coef * kl) * masks).sum() / masks.sum()
        loss.backward()
        optimizer.step()
"""


def test_log_probs_picked_by_an_index_array_on_every_axis(tmp_path):
    """Before, the index arrays were not read as a gather of the sampled tokens: silent."""
    assert module_codes(PICKED_BY_INDEX_ARRAYS, tmp_path) == [(21, "KL002"), (21, "KL008")]


# the same trainer in MLX: the loss is a closure that nn.value_and_grad differentiates, reading the rollout's
# log-probs and the reference's from the enclosing scope, and optimizer.update applies each step
MLX_CLOSURE = """\
import mlx.core as mx
import mlx.nn as nn


def token_logprobs(model, ids, tokens):
    logprobs = nn.log_softmax(model(ids)[:, :-1], axis=-1)
    return mx.take_along_axis(logprobs, tokens[..., None], axis=-1).squeeze(-1)


def rollout(model, prompt, n):
    tokens = model.sample(prompt, n)
    return tokens, token_logprobs(model, prompt, tokens)


def train(policy, frozen, optimizer, prompts, masks, advantage, epochs, kl_coef):
    for prompt in prompts:
        tokens, sampled_logprobs = rollout(policy, prompt, 8)
        anchor = token_logprobs(frozen, prompt, tokens)

        def grpo_loss(model):
            current = token_logprobs(model, prompt, tokens)
            ratio = mx.exp(current - sampled_logprobs)
            surrogate = mx.minimum(ratio * advantage, mx.clip(ratio, 0.8, 1.2) * advantage)
            diff = anchor - current
            kl = mx.exp(diff) - diff - 1
            return ((-surrogate + kl_coef * kl) * masks).sum() / masks.sum()

        loss_and_grad = nn.value_and_grad(policy, grpo_loss)
        for _ in range(epochs):
            loss, grads = loss_and_grad(policy)
            optimizer.update(policy, grads)
"""


def test_an_mlx_loss_closure_trained_for_several_updates_on_one_rollout(tmp_path):
    """The closure's enclosing arrays are constants to the gradient MLX takes of it, and the log-probs the rollout
    returned are the sampling policy's: the ratio to them compares the policy with the samples' policy, which
    `optimizer.update` in a loop of several rounds makes older (row 22). Before, they were read as the policy's own,
    with their gradient, and `update` was no optimizer step: KL002 alone."""
    assert module_codes(MLX_CLOSURE, tmp_path) == [(26, "KL002"), (26, "KL008")]


def test_one_mlx_update_per_rollout_is_on_policy(tmp_path):
    """One update per rollout: the ratio is 1 at the step and the samples are the policy's (row 3 only)."""
    one_update = MLX_CLOSURE.replace("""        for _ in range(epochs):
            loss, grads = loss_and_grad(policy)
            optimizer.update(policy, grads)""", """        loss, grads = loss_and_grad(policy)
        optimizer.update(policy, grads)""")
    assert module_codes(one_update, tmp_path) == [(26, "KL002")]


# leo-bjpark/llm-rl-tutorial's PPO: the reference's log-probs, computed once per rollout, are moved to the policy's
# device inside the epoch loop; the loss adds k1 summed over the response (row 16, KL001)
MOVED_IN_THE_LOOP = """\
import torch


def train(policy, ref_model, optimizer, ids, labels, advantages, ppo_epochs=4):
    with torch.no_grad():
        ref_logps = ref_model(ids).logits.log_softmax(-1).gather(-1, labels).squeeze(-1).sum(-1)
    for _ in range(ppo_epochs):
        policy_logps = policy(ids).logits.log_softmax(-1).gather(-1, labels).squeeze(-1).sum(-1)
        ref_logps = ref_logps.to(policy_logps.device)
        loss = -(advantages * policy_logps).mean() + 0.1 * (policy_logps - ref_logps).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
"""


def test_reference_log_probs_moved_or_recomputed_in_the_loop_are_no_new_rollout(tmp_path):
    """`ref_logps = ref_logps.to(device)` computes nothing, and the reference's log-probs computed again of the same
    `ids` are no new samples either: the loop still trains four steps on one rollout (row 22, KL008). Before, any
    assignment to a reference-named value read as new samples, and until 2026-12-02 a recomputation still did."""
    assert module_codes(MOVED_IN_THE_LOOP, tmp_path) == [(10, "KL001"), (10, "KL008")]
    computed = MOVED_IN_THE_LOOP.replace("ref_logps = ref_logps.to(policy_logps.device)",
                                         "ref_logps = ref_model(ids).logits.log_softmax(-1).gather(-1, labels).sum(-1)")
    assert (10, "KL008") in module_codes(computed, tmp_path)


# VocenInquisitor/CS_RLHF (a safe-rlhf fork): the PPO trainer's base class, re-exported by its package's
# __init__ from a module with no KL words, computes GAE; the subclass puts a k1 reward on each token and trains
# the actor with a per-sequence token mean of the clipped surrogate.
RL_TRAINER = """\
import torch


class RLTrainer:
    gamma = 1.0
    gae_lambda = 0.95

    def get_advantages_and_returns(self, values, rewards, sequence_mask, start):
        last_gae_lambda = 0.0
        advantages_reversed = []
        rewards = rewards * sequence_mask
        length = rewards.size(-1)
        for t in reversed(range(start, length)):
            next_values = values[:, t + 1] if t < length - 1 else 0.0
            delta = rewards[:, t] + self.gamma * next_values - values[:, t]
            last_gae_lambda = delta + self.gamma * self.gae_lambda * last_gae_lambda
            advantages_reversed.append(last_gae_lambda)
        advantages = torch.stack(advantages_reversed[::-1], dim=1)
        return advantages.detach(), advantages + values[:, start:]
"""

PPO_TRAINER = """\
import torch

from trainers import RLTrainer


def masked_mean(x, mask):
    return ((x * mask).sum(dim=-1) / mask.sum(dim=-1)).mean()


class PPOTrainer(RLTrainer):
    kl_coeff = 0.02

    def kl_rewards(self, reward, log_probs, ref_log_probs, end_index):
        kl_penalty_rewards = -self.kl_coeff * (log_probs - ref_log_probs)
        return torch.scatter_add(kl_penalty_rewards, dim=-1, index=end_index, src=reward.unsqueeze(-1))

    def rl_step(self, batch):
        old_log_probs = batch["log_probs"]
        mask = batch["mask"]
        with torch.no_grad():
            rewards = self.kl_rewards(batch["reward"], old_log_probs, batch["ref_log_probs"], batch["end"])
            advantages, returns = self.get_advantages_and_returns(batch["values"], rewards, mask, 0)
        log_probs = torch.log_softmax(self.actor(batch["ids"]).logits, -1).gather(-1, batch["next"]).squeeze(-1)
        ratios = torch.exp(log_probs - old_log_probs)
        surrogate = torch.minimum(advantages * ratios, advantages * torch.clamp(ratios, 0.8, 1.2))
        loss = -masked_mean(surrogate, mask)
        loss.backward()
        self.optimizer.step()
"""


def test_gae_of_a_base_class_re_exported_from_a_module_without_kl_words(tmp_path):
    """The k1 reward reaches the per-sequence token mean through GAE (row 21, KL007), with a per-token ratio to the
    batch's log-probs (row 23, KL008). Before, the base class was not found (its module has no KL words, and the
    package's __init__ only re-exports it), and the reward went nowhere."""
    (tmp_path / "trainers").mkdir()
    (tmp_path / "trainers" / "__init__.py").write_text("from trainers.rl_trainer import RLTrainer\n")
    assert module_codes(PPO_TRAINER, tmp_path, name="ppo.py", **{"trainers/rl_trainer": RL_TRAINER}) == [
        (14, "KL007"), (14, "KL008")]


# cblog666/MiniMind-KD's GRPO: a module-level loss with a PPO ratio, called by a trainer method that draws the
# samples, computes the old log-probs with the same policy and takes one optimizer step
LOSS_CALLED_BY_A_METHOD = """\
import torch


def grpo_loss(policy_log_probs, old_log_probs, reference_log_probs, advantages, mask, kl_beta=0.04):
    ratio = torch.exp(policy_log_probs - old_log_probs)
    objective = torch.minimum(ratio * advantages, ratio.clamp(0.8, 1.2) * advantages)
    log_ref_over_policy = reference_log_probs - policy_log_probs
    kl = torch.exp(log_ref_over_policy) - log_ref_over_policy - 1.0
    return ((-objective + kl_beta * kl) * mask).sum() / mask.sum()


class Trainer:
    def _rollout(self, records):
        return self.policy.generate(records)

    def step(self, records):
        sequences = self._rollout(records)
        with torch.no_grad():
            old_log_probs = self.log_probs(self.policy, sequences)
            reference_log_probs = self.log_probs(self.reference, sequences)
        loss = grpo_loss(self.log_probs(self.policy, sequences), old_log_probs, reference_log_probs,
                         self.advantages(sequences), sequences.mask)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
"""


def test_a_loss_function_called_by_a_trainer_method_on_fresh_samples(tmp_path):
    """One step per rollout: the ratio is 1 at the step, the k3 loss is row 3 only. Before, a module function's
    callers were looked for among module functions only, so the method drawing the samples was not found and the
    ratio read as a sign of older samples (KL008)."""
    assert module_codes(LOSS_CALLED_BY_A_METHOD, tmp_path) == [(9, "KL002")]


# DON738110198/meddistill-opd: the tinker-style advantages of on-policy distillation, built with numpy from the
# sampler's and the teacher's per-token log-probs, each token's own value (row 2: KL003)
NUMPY_ADVANTAGES = """\
import numpy as np


def sampled_reverse_kl(student_logprobs, teacher_logprobs, coefficient):
    student = np.asarray(student_logprobs, dtype=np.float64)
    teacher = np.asarray(teacher_logprobs, dtype=np.float64)
    advantages = -coefficient * (student - teacher)
    return advantages
"""


def test_arrays_converted_with_a_dtype_keep_their_meaning(tmp_path):
    """np.asarray(x, dtype=...) hands x back: before, only a call with one argument did, so the log-probs
    were lost and the advantages held nothing."""
    assert module_codes(NUMPY_ADVANTAGES, tmp_path) == [(7, "KL003")]


# MAPoRL's vendored legacy TRL PPOTrainer: step() computes the k1 rewards in one of two branches, then runs
# ppo_epochs rounds whose optimizer step is taken in a method the loop calls
LEGACY_PPO_STEP = """\
import torch


class PPOTrainer:
    def compute_rewards(self, scores, logprobs, ref_logprobs):
        rewards = -self.kl_ctl.value * (logprobs - ref_logprobs)
        rewards[:, -1] += scores
        return rewards

    def train_minibatch(self, batch):
        loss = self.loss(batch)
        self.accelerator.backward(loss)
        self.optimizer.step()

    def step(self, queries, responses, scores):
        with torch.no_grad():
            logprobs = self.forward(self.model, queries, responses)
            ref_logprobs = self.forward(self.ref_model, queries, responses)
            if self.is_distributed:
                rewards = self.compute_rewards(scores.float(), logprobs, ref_logprobs)
            else:
                rewards = self.compute_rewards(scores, logprobs, ref_logprobs)
            batch = self.advantages(rewards, logprobs)
        for _ in range(self.config.ppo_epochs):
            for minibatch in batch.split(self.config.mini_batch_size):
                self.train_minibatch(minibatch)
"""


def test_a_reward_computed_in_either_branch_then_trained_by_epochs_stepped_in_a_method(tmp_path):
    """The k1 reward, computed once per step(), meets only PPO's token ratio on the later rounds (row 23, KL008).
    Before, a step taken in a method the loop calls was no step of the loop, and a reward function called in two
    branches had no single caller."""
    assert module_codes(LEGACY_PPO_STEP, tmp_path) == [(6, "KL008")]
    # a method that generates before it steps draws each round's samples itself: no round reuses the reward's
    draws = LEGACY_PPO_STEP.replace("        loss = self.loss(batch)\n",
                                    "        batch = self.model.generate(batch)\n        loss = self.loss(batch)\n")
    assert module_codes(draws, tmp_path) == []


# Shapes from earlier sets that this set's changes first broke, kept here with the reason each reading holds.

# ColossalChat's memory_efficient_logprob fills a zero buffer chunk by chunk (`+=` at the positions of each pass)
# with the log-probs a tensor-parallel helper of another package computes
CHUNKED_FILL = """\
import torch


def memory_efficient_logprob(logits, inputs, num_action, chunk_size=2048):
    action_log_probs = torch.zeros((logits.size(0), num_action), device=logits.device)
    context_length = logits.size(1) - num_action
    for i in range(action_log_probs.size(0)):
        for start in range(context_length, logits.size(1), chunk_size):
            end = min(start + chunk_size, logits.size(1))
            log_probs = dist_log_prob(inputs[i : i + 1, start - 1 : end], logits[i : i + 1, start - 1 : end])
            log_probs = log_probs.squeeze(-1)
            action_log_probs[i, start - context_length : end - context_length] += log_probs[0]
    return action_log_probs
"""

CHUNKED_FILL_CALLER = """\
import torch

from utils import memory_efficient_logprob


def step(model, ref_model, inputs, num_action, beta, opt):
    with torch.no_grad():
        reference_action_log_probs = memory_efficient_logprob(ref_model(inputs).logits, inputs, num_action)
    action_log_probs = memory_efficient_logprob(model(inputs).logits, inputs, num_action)
    d = reference_action_log_probs - action_log_probs
    loss = beta * (torch.exp(d) - d - 1).mean()
    loss.backward()
    opt.step()
"""


def test_a_buffer_filled_chunk_by_chunk_holds_what_is_written(tmp_path):
    """k3 as a loss (row 3): each pass of the innermost loop writes its own positions, so the buffer holds the
    log-probs once, not their sum over the passes the analysis runs (which read as a mixture, KL001)."""
    assert module_codes(CHUNKED_FILL_CALLER, tmp_path, name="consumer.py", utils=CHUNKED_FILL) == [(11, "KL002")]


# sail-sg/oat's PPO: a k1 reward in the advantages of the policy-gradient loss, and a k3 loss under its own switch
REWARD_AND_LOSS = """\
import torch


def loss_fn(logps, old_logps, ref_logps, rewards, mask, beta, kl_penalty_coef):
    if kl_penalty_coef > 0:
        rewards = rewards - kl_penalty_coef * (old_logps - ref_logps)
    advantages = rewards.flip(-1).cumsum(-1).flip(-1)
    pg_loss = -(advantages * torch.exp(logps - logps.detach()) * mask).sum() / mask.sum()
    loss = pg_loss
    if beta > 0:
        log_ratio = ref_logps - logps
        reg_loss = beta * ((torch.expm1(log_ratio) - log_ratio) * mask).sum() / mask.sum()
        loss += reg_loss
    return loss
"""


def test_a_kl_reward_and_a_kl_loss_under_switches_of_their_own_are_one_configuration(tmp_path):
    """Both on: the KL counted twice (row 14, KL006). Two KL losses under switches of their own are two objectives
    (the twenty-seventh set's bandit-RLVR); a reward inside a policy-gradient loss beside a KL loss is not."""
    assert (13, "KL006") in module_codes(REWARD_AND_LOSS, tmp_path)


# MLX-GRPO: a trainer whose responses are drawn by a lagging copy (model_old, synced every few updates), one update
# per draw
LAGGING_COPY_DRAWS = """\
import mlx.core as mx
import mlx.nn as nn


def log_probs_of(model, prompt, response):
    logits = model(mx.concatenate([prompt, response]))
    return mx.take_along_axis(nn.log_softmax(logits, axis=-1), response[:, None], axis=-1).squeeze(-1).sum()


class Trainer:
    def generate_responses(self, prompt):
        responses = [generate(self.model_old, prompt) for _ in range(4)]
        old_log_probs = mx.stack([log_probs_of(self.model_old, prompt, r) for r in responses])
        return responses, old_log_probs

    def grpo_loss(self, model, prompt, responses, advantages, old_log_probs):
        current = mx.stack([log_probs_of(model, prompt, r) for r in responses])
        ref = mx.stack([log_probs_of(self.ref_model, prompt, r) for r in responses])
        ratio = mx.exp(current - old_log_probs)
        log_ratio = ref - current
        objective = mx.minimum(ratio * advantages, mx.clip(ratio, 0.8, 1.2) * advantages) - 0.04 * (
            mx.exp(log_ratio) - log_ratio - 1)
        return -mx.mean(objective)

    def train_step(self, prompt, advantages):
        responses, old_log_probs = self.generate_responses(prompt)

        def loss_fn():
            return self.grpo_loss(self.model, prompt, responses, advantages, old_log_probs)

        loss, grads = nn.value_and_grad(self.model, loss_fn)()
        self.optimizer.update(self.model, grads)
"""


def test_samples_drawn_by_a_lagging_copy_are_older_whatever_the_updates_per_draw(tmp_path):
    """k3 of sequence log-ratios as a loss (row 18, KL002) on samples of the copy, with the ratio to it only (row 22,
    KL008): one update per draw makes them fresh only where the policy itself draws them."""
    assert module_codes(LAGGING_COPY_DRAWS, tmp_path) == [(23, "KL002"), (23, "KL008")]


def test_two_index_arrays_into_logits_pick_positions_not_tokens(tmp_path):
    """`logits[rows, cells]` of [B, T, V] logits is still over the vocabulary: the sampled tokens are gathered after."""
    source = PICKED_BY_INDEX_ARRAYS.replace(
        """    logprobs = torch.log_softmax(model(ids).logits[:, :-1], dim=-1)
    rows = torch.arange(rollouts.shape[0]).unsqueeze(-1)
    cols = torch.arange(rollouts.shape[1]).unsqueeze(0)
    return logprobs[rows, cols, rollouts] * masks""",
        """    rows = torch.arange(rollouts.shape[0]).unsqueeze(-1)
    cols = torch.arange(rollouts.shape[1]).unsqueeze(0)
    picked = model(ids).logits[rows, cols]
    return torch.log_softmax(picked, dim=-1).gather(-1, rollouts.unsqueeze(-1)).squeeze(-1) * masks""")
    assert module_codes(source, tmp_path) == [(21, "KL002"), (21, "KL008")]
