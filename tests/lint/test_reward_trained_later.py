"""A KL reward computed where the samples are drawn, trained afterwards by a loop of several optimizer steps.

A PPO trainer often builds its token rewards, k1 KL included, in the function that draws the samples
(`make_experience`, `_rollout`) and hands them on through a buffer the lint does not follow; its caller then runs
`for epoch in range(ppo_epochs)` with an optimizer step inside, on those samples. Every step after the first trains
the reward of an older policy with the PPO token ratio only (kl-math.md section 8, row 23: KL008). One round of
that loop is one step per rollout, and the k1 reward-to-go is right (row 6).
"""

from __future__ import annotations

import textwrap

import pytest
from snippets import module_codes

TRAINER = """\
import torch


class Experience:
    def __init__(self, policy, ref_policy, kl_coef):
        self.policy, self.ref_policy, self.kl_coef = policy, ref_policy, kl_coef

    @torch.no_grad()
    def make_experience(self, prompts):
        sequences = self.policy.generate(prompts)
        old_logprobs = self.policy(sequences)
        ref_logprobs = self.ref_policy(sequences)
        rewards = -self.kl_coef * (old_logprobs - ref_logprobs)
        rewards[:, -1] += self.score(sequences)
        return {"sequences": sequences, "old_logprobs": old_logprobs, "returns": rewards.flip(-1).cumsum(-1).flip(-1)}


def train(maker, buffer, optimizer, prompts):
    buffer.push(maker.make_experience(prompts))
    for epoch in range(EPOCHS):
        for batch in buffer.loader():
            loss = buffer.policy_loss(batch)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
"""


@pytest.mark.parametrize("epochs, expected", [("4", [(13, "KL008")]), ("1", [])])
def test_a_reward_made_with_the_samples_is_stale_under_a_later_loop_of_several_steps(tmp_path, epochs, expected):
    assert module_codes(TRAINER.replace("EPOCHS", epochs), tmp_path) == expected


def test_the_loop_may_sit_in_a_method_the_caller_runs_after_the_draw(tmp_path):
    """The draw in one method of the trainer, the epochs in another that the caller runs after it; the samples
    pass through a buffer, which the lint does not follow."""
    source = textwrap.dedent("""\
        import torch


        class Trainer:
            @torch.no_grad()
            def _rollout(self, prompts):
                sequences = self.policy.generate(prompts)
                old_logprobs = self.policy(sequences)
                ref_logprobs = self.ref_policy(sequences)
                rewards = -self.kl_coef * (old_logprobs - ref_logprobs)
                self.buffer.push(sequences, rewards)

            def _optimize(self):
                for _ in range(self.cfg.ppo_epochs):
                    loss = self.loss(self.buffer.get())
                    loss.backward()
                    self.opt.step()

            def train(self, prompts):
                self._rollout(prompts)
                self._optimize()
        """)
    assert module_codes(source, tmp_path) == [(10, "KL008")]
    two_draws = source.replace("        self._optimize()\n",
                               "        self._rollout(prompts)\n        self._optimize()\n")
    # drawn twice before the loop: it trains both rollouts' rewards over several steps, whichever it reads
    assert module_codes(two_draws, tmp_path) == [(10, "KL008")]
    before = source.replace("        self._rollout(prompts)\n        self._optimize()\n",
                            "        self._optimize()\n        self._rollout(prompts)\n")
    assert module_codes(before, tmp_path) == []  # the loop runs before the draw: it trains earlier samples


@pytest.mark.parametrize("record", ["RolloutBuffer", "Experience", "rollout_buffer_from"])
def test_a_record_made_for_the_samples_inside_the_loop_draws_none(tmp_path, record):
    """JinyuCong/PPO-RLHF (thirty-second set) rebuilds a `RolloutBuffer(...)` of each mini-batch inside its epochs:
    the making of a record or a buffer named for the rollout holds samples drawn before the loop, and draws none,
    so the k1 reward made with the samples is trained stale by every epoch after the first (row 23, KL008)."""
    source = TRAINER.replace("EPOCHS", "4").replace(
        "            loss = buffer.policy_loss(batch)\n",
        f"            mini = {record}(batch)\n            loss = buffer.policy_loss(mini)\n")
    assert module_codes(source, tmp_path) == [(13, "KL008")]


def test_the_step_may_be_taken_by_a_function_of_the_module_the_loop_calls(tmp_path):
    """1998frankchen/TravelMind's script (thirty-second set) trains each mini-batch through `train_step(batch)`, a
    function of the module that steps the optimizer: every epoch after the first trains the k1 reward made with
    the samples on an older policy (row 23, KL008); one epoch is one step per rollout (row 6)."""
    step = TRAINER.replace(
        "            loss = buffer.policy_loss(batch)\n            loss.backward()\n            optimizer.step()\n"
        "            optimizer.zero_grad()\n",
        "            train_step(buffer, batch, optimizer)\n") + """

def train_step(buffer, batch, optimizer):
    loss = buffer.policy_loss(batch)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
"""
    assert "train_step(buffer, batch, optimizer)\n" in step
    assert module_codes(step.replace("EPOCHS", "4"), tmp_path) == [(13, "KL008")]
    assert module_codes(step.replace("EPOCHS", "1"), tmp_path) == []


def test_the_records_check_grad_is_compared_with_carry_the_later_loop_too(tmp_path):
    """klaudit.lint.query.site_verdicts judges the reward as the lint does: with the later loop of several steps
    it carries KL008, so the agreement of the two wings has a record for the finding (it had none)."""
    from klaudit.lint.query import site_verdicts

    path = tmp_path / "trainer.py"
    path.write_text(TRAINER.replace("EPOCHS", "4"))
    assert {rule for site in site_verdicts(str(path)) if site.line == 13 for rule in site.rules} == {"KL008"}


NOTEBOOK_PPO = """\
import torch


def compute_rewards(logp, ref_logp, score):
    with torch.no_grad():
        rewards = -0.2 * (logp - ref_logp)
        rewards[:, -1] += score
    return rewards


def mini_batch_train():
    for ep in range(EPOCHS):
        ratio = torch.exp(model(inputs) - old_logprobs)
        loss = -(ratio * advantages).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


old_logprobs = model(inputs).detach()
rewards = compute_rewards(old_logprobs, ref(inputs), score)
print(rewards[0])
for step in range(10):
    old_logprobs = model(inputs).detach()
    rewards = compute_rewards(old_logprobs, ref(inputs), score)
    advantages = rewards.flip(-1).cumsum(-1).flip(-1)
    mini_batch_train()
"""


@pytest.mark.parametrize("epochs, expected", [("4", [(6, "KL008")]), ("1", [])])
def test_a_trial_call_before_the_training_loop_does_not_hide_it(tmp_path, epochs, expected):
    """williamfowler/CS138_RLAIF_PPO_vs_DPO (fresh66): a notebook calls compute_rewards once to look at the rewards,
    then again in the training loop, which goes on to mini_batch_train(): four optimizer steps on each rollout's k1
    reward (row 23). The reward had been followed only from a function called at a single place."""
    assert module_codes(NOTEBOOK_PPO.replace("EPOCHS", epochs), tmp_path) == expected
