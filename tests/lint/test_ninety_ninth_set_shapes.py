"""Shapes of KL code met in the ninety-ninth fresh set.

GenTang/regression2chatgpt (a book's PPO notebook) computes a k1 reward per response in `play_game`, keeps each
response's tensors in lists, and then takes one optimizer step per response over the lists, with the PPO token ratio:
every step after the first trains the reward on an older policy's samples (row 23, KL008). Three things hid it: its
log-probs are named `lnp` (ln, the natural log), the loop over the responses names each one `_resp`, and the notebook
calls `play_game` once before the training loop to show what it returns, so the function had two callers.

A rollout kept as a list of tuples, `trajectories.append((response, logprobs, rewards))`, and unpacked place by place
in `for response, old_logprobs, rewards in trajectories:` lost the KL reward it carried.

jamesyc23/arena_3_0_solutions (the ARENA RLHF exercise) calls `.backward()` on an objective that subtracts the KL
penalty and steps `AdamW(..., maximize=True)`: the optimizer ascends it, so the penalty is a penalty (no KL011). Its
learning phase steps once per mini-batch of `memory.get_minibatches()`, a list that holds every sample once per round
of `range(batches_per_learning_phase)`: from the second step on the exact-KL loss is on an older policy's samples.

YolanyYwy/AGentCL takes `F.kl_div(..., reduction="batchmean")` of the [1, L, V] logits of one encoded text: divided by
the batch of one, a token sum, not the 1/L mean (row 21) it was read as; and returns the trained loss as
`total_loss.item()` to a caller that sums it for the log, which was read as the KL added without its gradient (KL001).

KangaOnGit/Reinforcement-Learning-Preference-Tuning's PPO notebook computes one PPO loss with a k2 term at top level
and prints it; nothing in it calls `.backward()` or steps an optimizer (`policy.train()` only sets a mode), so the
loss trains nothing.
"""

from __future__ import annotations

import pytest
from snippets import module_codes

# one clipped step on a response's k1 reward-to-go, each response of the rollout in turn
PPO_STEP = """\
        advantages = rewards.flip(0).cumsum(0).flip(0)
        loss = -(advantages * torch.clamp(ratio, 0.8, 1.2)).sum()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
"""

NOTEBOOK_PPO = """\
import torch


def compute_rewards(score, lnp, ref_lnp, beta):
    kl = lnp - ref_lnp
    reward = -beta * kl
    reward[-1] += score
    return reward


def play(model, ref_model, prompts):
    trajectories = []
    for prompt in prompts:
        response = model.generate(prompt)
        with torch.no_grad():
            lnp = model.log_probs(response)
            ref_lnp = ref_model.log_probs(response)
            rewards = compute_rewards(reward_model(response), lnp, ref_lnp, 0.2)
        trajectories.append((response, lnp, rewards))
    return trajectories


optimizer = torch.optim.AdamW(model.parameters())
play(model, ref_model, prompts[:2])
for step in range(100):
    trajectories = play(model, ref_model, prompts)
    for _resp, old_lnp, rewards in trajectories:
        lnp = model.log_probs(_resp)
        ratio = torch.exp(lnp - old_lnp)
""" + PPO_STEP


@pytest.mark.parametrize("loop, codes", [
    ("    for _resp, old_lnp, rewards in trajectories:", [(6, "KL008")]),  # one step per response kept
    ("    if trajectories:\n        _resp, old_lnp, rewards = trajectories[0]", []),  # one step on fresh samples
])
def test_a_k1_reward_kept_per_response_and_trained_one_step_each_is_stale(tmp_path, loop, codes):
    source = NOTEBOOK_PPO.replace("    for _resp, old_lnp, rewards in trajectories:", loop)
    assert module_codes(source, tmp_path) == codes


TUPLES = """\
import torch

optimizer = torch.optim.AdamW(model.parameters())
for step in range(100):
    trajectories = []
    for prompt in prompts:
        response = model.generate(prompt)
        with torch.no_grad():
            logprobs = model.log_probs(response)
            ref_logprobs = ref_model.log_probs(response)
            rewards = -0.1 * (logprobs - ref_logprobs)
            rewards[-1] += reward_model(response)
        trajectories.append((response, logprobs, rewards))
    for response, old_logprobs, rewards in trajectories:
        logprobs = model.log_probs(response)
        ratio = torch.exp(logprobs - old_logprobs)
""" + PPO_STEP


def test_a_rollout_kept_as_tuples_carries_its_kl_reward(tmp_path):
    assert module_codes(TUPLES, tmp_path) == [(11, "KL008")]


ASCENT = """\
import torch


def kl_penalty(logits, ref_logits, coef):
    logprobs = logits.log_softmax(-1)
    ref_logprobs = ref_logits.log_softmax(-1)
    return coef * (logprobs.exp() * (logprobs - ref_logprobs)).sum(-1).mean()


def objective(model, ref_model, batch, coef):
    logits = model(batch.ids).logits
    with torch.no_grad():
        ref_logits = ref_model(batch.ids).logits
    surrogate = (batch.advantages * torch.exp(logits.log_softmax(-1).gather(-1, batch.ids[..., None]).squeeze(-1) - batch.old_logprobs)).mean()
    return surrogate - kl_penalty(logits, ref_logits, coef)


def train(model, ref_model, batches, coef):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, maximize=True)
    for batch in batches:
        optimizer.zero_grad()
        obj = objective(model, ref_model, batch, coef)
        obj.backward()
        optimizer.step()
"""


@pytest.mark.parametrize("optimizer, codes", [
    ("AdamW(model.parameters(), lr=1e-5, maximize=True)", [(23, "KL003"), (23, "KL008")]),
    ("AdamW(model.parameters(), lr=1e-5)", [(23, "KL003"), (23, "KL008"), (23, "KL011")]),  # descended: a bonus
])
def test_an_objective_an_optimizer_ascends_subtracts_its_penalty(tmp_path, optimizer, codes):
    source = ASCENT.replace("AdamW(model.parameters(), lr=1e-5, maximize=True)", optimizer)
    assert module_codes(source, tmp_path) == codes


ONE_TEXT = """\
import torch
import torch.nn.functional as F


class Trainer:
    def train_on_prompt(self, prompt):
        prompt_ids = self.tokenizer.encode(prompt)
        input_ids = self.model.generate(torch.tensor([prompt_ids]), do_sample=True)
        reward = self.reward_fn(input_ids)
        logits = self.model(input_ids=input_ids).logits
        with torch.no_grad():
            ref_logits = self.ref_model(input_ids=input_ids).logits
        logprobs = F.log_softmax(logits, dim=-1).gather(-1, input_ids[..., None]).squeeze(-1)
        kl = F.kl_div(F.log_softmax(logits, dim=-1), F.softmax(ref_logits, dim=-1), reduction="{reduction}")
        total_loss = -(reward * logprobs.sum()) + self.beta * kl
        total_loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad()
        return {{"loss": total_loss.item() if self.is_main else 0.0, "kl": kl.item()}}

    def train_stage(self, prompts):
        total_loss = 0.0
        for prompt in prompts:
            result = self.train_on_prompt(prompt)
            total_loss += result.get("loss", 0.0)
        return total_loss / max(len(prompts), 1)
"""


@pytest.mark.parametrize("reduction, codes", [
    ("batchmean", [(15, "KL002")]),  # the [1, L, V] batch of one text divided by 1: a token sum
    ("mean", [(15, "KL002"), (15, "KL007")]),  # divided by L * V: each text's token mean
])
def test_batchmean_of_one_encoded_text_is_a_token_sum(tmp_path, reduction, codes):
    assert module_codes(ONE_TEXT.format(reduction=reduction), tmp_path) == codes


RETURNED_FOR_THE_LOG = """\
import torch
import torch.nn.functional as F


class Trainer:
    def train_on_run(self, run):
        prompt_ids = self.tokenizer.encode(run.prompt)
        response_ids = self.tokenizer.encode(run.response)
        input_ids = torch.tensor([prompt_ids + response_ids])
        outputs = self.model(input_ids=input_ids, labels=input_ids)
        with torch.no_grad():
            ref_logits = self.ref_model(input_ids=input_ids).logits
        kl = F.kl_div(F.log_softmax(outputs.logits, dim=-1), F.softmax(ref_logits, dim=-1), reduction="batchmean")
        total_loss = outputs.loss + self.beta * kl
        self.accelerator.backward(total_loss)
        self.optimizer.step()
        self.optimizer.zero_grad()
        return {"loss": total_loss.item() if self.accelerator.is_main_process else 0.0}

    def train_stage(self, runs):
        good = [run for run in runs if run.reward > 0]
        total_loss = 0.0
        for run in good:
            result = self.train_on_run(run)
            total_loss += result.get("loss", 0.0)
        return total_loss / max(len(good), 1)
"""


def test_a_trained_loss_returned_as_a_number_and_summed_for_the_log_is_no_detached_kl(tmp_path):
    assert module_codes(RETURNED_FOR_THE_LOG, tmp_path) == []


SHOWN_ONLY = """\
import torch

policy.train()
ids = policy.generate(prompt_ids, do_sample=True)
logprob_policy = policy(ids).logits.log_softmax(-1).gather(-1, ids[..., None]).squeeze(-1)
with torch.no_grad():
    logprob_ref = policy_ref(ids).logits.log_softmax(-1).gather(-1, ids[..., None]).squeeze(-1)
reward = reward_model(ids)
log_ratio = logprob_policy - logprob_ref
kl_loss = torch.mean(log_ratio ** 2)
ppo_loss = -(reward * logprob_policy.sum()) + 0.01 * kl_loss
print(f"loss {ppo_loss.item():.4f}")
"""


@pytest.mark.parametrize("after, codes", [
    ("", []),  # printed, never differentiated
    ("ppo_loss.backward()\n", [(10, "KL003")]),
])
def test_a_loss_a_module_computes_and_never_differentiates_trains_nothing(tmp_path, after, codes):
    assert module_codes(SHOWN_ONLY + after, tmp_path) == codes


LISTED_ROUNDS = """\
from dataclasses import dataclass

import torch


@dataclass
class Args:
    batches_per_learning_phase: int = 2
    num_minibatches: int = 4


class Memory:
    def __init__(self, args, samples):
        self.args = args
        self.samples = samples

    def get_minibatches(self):
        minibatches = []
        for _ in range(self.args.batches_per_learning_phase):
            for idx in torch.randperm(len(self.samples)).chunk(self.args.num_minibatches):
                minibatches.append(self.samples[idx])
        return minibatches


def kl_penalty(logits, ref_logits, coef):
    logprobs = logits.log_softmax(-1)
    return coef * (logprobs.exp() * (logprobs - ref_logits.log_softmax(-1))).sum(-1).mean()


class Trainer:
    def learning_phase(self, memory):
        {loop}
            self.optimizer.zero_grad()
            logits = self.model(minibatch.ids).logits
            loss = minibatch.pg_loss(logits) + kl_penalty(logits, minibatch.ref_logits, self.args.kl_coef)
            loss.backward()
            self.optimizer.step()
"""


@pytest.mark.parametrize("loop, rounds, codes", [
    ("for minibatch in memory.get_minibatches():", 2, [(35, "KL003"), (35, "KL008")]),
    ("minibatches = memory.get_minibatches()\n        for minibatch in minibatches:", 2,
     [(36, "KL003"), (36, "KL008")]),  # the list bound to a name first
    ("for minibatch in memory.get_minibatches():", 1, [(35, "KL003")]),  # one round: each sample once
])
def test_a_list_of_minibatches_filled_over_several_rounds_reuses_the_samples(tmp_path, loop, rounds, codes):
    """jamesyc23/arena_3_0_solutions's ReplayMemory.get_minibatches lists every sample once per round, `for _ in
    range(self.args.batches_per_learning_phase)` (2 by default): the learning phase's steps over that list train
    the exact-KL loss on an older policy's prefixes from its second step on (rows 22-23, KL008), whatever the
    mini-batch size."""
    source = LISTED_ROUNDS.format(loop=loop).replace("batches_per_learning_phase: int = 2",
                                                     f"batches_per_learning_phase: int = {rounds}")
    assert module_codes(source, tmp_path) == codes
