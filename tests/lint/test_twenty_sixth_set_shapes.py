"""Shapes of KL code met in the twenty-sixth fresh set's review.

Verdicts (kl-math.md section 8): a detached k1 reward turned into GAE advantages is a reward-to-go (row 6, right
on-policy); trained over several optimizer steps per rollout with only the PPO token ratio it is row 23 (KL008).
The same reward reaching only its own token's score would be row 2 (KL003).
"""

from __future__ import annotations

import pytest
from snippets import module_codes

# vijaygkd/RL-LLM-foundations' PPO course: GAE written into a zero buffer position by position, the running
# advantage carried to the next (earlier) position in a second name, and masked in place.
GAE_LOOP = """\
import torch


def gae(kl, values, mask, gamma=0.99, lam=0.95):
    rewards = torch.zeros_like(kl)
    rewards -= 0.1 * kl
    td = rewards + gamma * values[:, 1:] - values[:, :-1]
    advantages = torch.zeros_like(td)
    a_next = torch.zeros(td.shape[0])
    for t in range(td.shape[1] - 1, -1, -1):
{step}
        advantages[:, t] = a_t
    return advantages


def train(model, ref_model, opt, batch, old_logp, values, mask):
    with torch.no_grad():
        ref_logp = ref_model(batch).log_softmax(-1)
        kl = old_logp - ref_logp
        adv = gae(kl, values, mask)
    for epoch in range(4):
        logp = model(batch).log_softmax(-1)
        ratio = torch.exp(logp - old_logp)
        loss = -(ratio * adv).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
"""


@pytest.mark.parametrize("step", [
    # the running advantage carried in a second name, then masked in place
    "        a_t = td[:, t] + gamma * lam * a_next\n        a_t = a_t * mask[:, t]\n        a_next = a_t",
    "        a_t = (td[:, t] + gamma * lam * a_next) * mask[:, t]\n        a_next = a_t",
    # carried in one name
    "        a_next = td[:, t] + gamma * lam * a_next\n        a_t = a_next",
])
def test_a_gae_recursion_carried_in_a_second_name_is_a_reward_to_go(tmp_path, step):
    """Each position's advantage sums the later positions' k1 rewards: a reward-to-go (row 6), stale over the four
    epochs with the token ratio only (row 23). Read as each token's own reward it was a false KL003."""
    source = GAE_LOOP.format(step=step)
    assert module_codes(source, tmp_path) == [(_line_of(source, "adv = gae("), "KL008")]


def test_a_position_that_only_masks_its_own_reward_is_no_running_sum(tmp_path):
    """`a_t = td[:, t] * mask[:, t]` with nothing carried: each token's own reward, the local gradient (row 2)."""
    step = "        a_t = td[:, t] * mask[:, t]\n        a_t = a_t * mask[:, t]"
    source = GAE_LOOP.format(step=step)
    line = _line_of(source, "adv = gae(")
    assert module_codes(source, tmp_path) == [(line, "KL003"), (line, "KL008")]


def _line_of(source: str, text: str) -> int:
    """The line of `source` holding `text`: where a term that enters its sink in a callee is reported."""
    return next(number for number, line in enumerate(source.splitlines(), start=1) if text in line)


# Vincethevince/reward-overoptimization's GRPO: `train_step` samples, scores and backpropagates; `train` steps the
# optimizer once every `grad_accum` calls, so every sample of a step comes from the weights that step updates.
ACCUMULATED_STEPS = """\
import torch


class Trainer:
    def loss(self, logp, old_logp, ref_logp, adv):
        ratio = torch.exp(logp - old_logp)
        k3 = torch.exp(ref_logp - logp) - (ref_logp - logp) - 1
        return (-(ratio * adv) + 0.04 * k3).mean()

    def train_step(self, batch):
        ids = self.{draw}(batch)
        with torch.no_grad():
            old_logp = self.model(ids).log_softmax(-1)
            ref_logp = self.ref_model(ids).log_softmax(-1)
        logp = self.model(ids).log_softmax(-1)
        loss = self.loss(logp, old_logp, ref_logp, batch.adv)
        loss.backward()

    def train(self, loader):
        for micro_step, batch in enumerate(loader):
            self.train_step(batch)
            if micro_step % 4 == 0:
                self.optimizer.step()
                self.optimizer.zero_grad()

    def {helper}(self, batch):
{body}
"""
GENERATES = "        return self.model.generate(batch.prompts)"
# TRL's and pure_grpo_trainer's shape: one generation handed out for several steps
BUFFERED = ("        if self.buffered is None or self.steps % 4 == 0:\n"
            "            self.buffered = self.model.generate(batch.prompts)\n"
            "        self.steps += 1\n        return self.buffered")


@pytest.mark.parametrize("draw, helper, body, expected", [
    ("generate_completions", "generate_completions", GENERATES, ["KL002"]),  # a method named as a draw
    ("prepare", "prepare", GENERATES, ["KL002"]),  # a method whose body generates
    ("prepare", "prepare", BUFFERED, ["KL002", "KL008"]),  # a generation kept for later steps
    # ChatLearn: a helper named like a draw that builds masks is no evidence inside another method
    ("prepare", "prepare", "        return generate_loss_mask(batch)", ["KL002", "KL008"]),
    ("cached", "unused", GENERATES, ["KL002", "KL008"]),  # nothing known to draw: the ratio says older samples
])
def test_a_step_after_calls_that_each_draw_samples_trains_the_policy_that_drew_them(tmp_path, draw, helper, body,
                                                                                     expected):
    """The k3 loss is row 3 (KL002); on-policy, the PPO ratio is 1 and no sign of older samples (no row 22)."""
    source = ACCUMULATED_STEPS.format(draw=draw, helper=helper, body=body)
    assert [code for _, code in module_codes(source, tmp_path)] == expected


# rasbt/reasoning-from-scratch: every inner epoch samples anew, but from a copy of the policy taken before them
OLD_COPY = """\
import copy

import torch


def loss_on_fresh_samples(model, old_model, ref_model, prompt):
    ids = sample_response(model=old_model, prompt=prompt)
    with torch.no_grad():
        old_logp = old_model(ids).log_softmax(-1)
        ref_logp = ref_model(ids).log_softmax(-1)
    logp = model(ids).log_softmax(-1)
    ratio = torch.exp(logp - old_logp)
    return (-ratio + 0.01 * (logp - ref_logp)).mean()


def train(model, ref_model, optimizer, prompts):
    for prompt in prompts:
        old_model = copy.deepcopy(model)
        for _ in range(4):
            loss = loss_on_fresh_samples(model, old_model, ref_model, prompt)
            loss.backward()
            optimizer.step()
"""


def test_samples_drawn_from_a_copy_of_the_policy_taken_before_the_steps_are_older(tmp_path):
    """The k1 loss (row 1, KL001) on samples of the copy: stale after the first of the four steps (row 22)."""
    assert [code for _, code in module_codes(OLD_COPY, tmp_path)] == ["KL001", "KL008"]
