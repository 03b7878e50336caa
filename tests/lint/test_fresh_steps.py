"""A PPO ratio in a step that is the first on samples just drawn is 1: no sign of older samples.

wc2395082443-del/rwkv-rlhf's GRPO trainer (twentieth set) draws a group of completions, keeps the rollout
engine's log-probs, and takes one optimizer step on them (`for epoch in range(self.cfg.ppo_epochs)`, defaulted
to 1, around micro-batches that accumulate gradients): its k3 KL loss is on-policy (kl-math.md section 8, row 3:
KL002), not on an older policy's samples (row 22: KL008). A step is the first since the draw when, going out
from it, every loop runs once up to one whose body draws before it, or the function draws before it, or the
function's single caller does so before the call; a loss helper with no step of its own follows its single
caller (of any module: the call hands its freshness on). The same holds for a k1 reward carried by the PPO
surrogate: the ratio exp(logp - old_logp) of the only step on the rollout is the score, and the reward-to-go is
right (row 6), where it used to read as row 23. Two calls of the update for one rollout (the hard buffer's extra step), a mini-batch loop that steps
inside, a count defaulting to more than one round, or a draw from a replay buffer keep the ratio's reading.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from snippets import module_codes

HEAD = """\
    from dataclasses import dataclass

    import torch


    @dataclass
    class Config:
        ppo_epochs: int = {epochs}
        micro_batch: int = 4
        kl_coef: float = 0.05


    def k3(ref_logp, logp):
        log_ratio = ref_logp - logp
        return torch.exp(log_ratio) - log_ratio - 1.0


    class Trainer:
"""

LOSS = """\
                    logp = self.model(batch["tokens"])
                    with torch.no_grad():
                        ref_logp = self.ref_model(batch["tokens"])
                    ratio = torch.exp(logp - batch["old_logp"])
                    policy_loss = -(ratio * batch["adv"]).sum()
                    kl = k3(ref_logp, logp).sum()
                    loss = policy_loss + self.cfg.kl_coef * kl
                    loss.backward()
"""

INLINE = """\
        def train_step(self):
            trajs = self.engine.generate_group(self.prompts)
            for epoch in range(self.cfg.ppo_epochs):
                self.opt.zero_grad()
                for start in range(0, len(trajs), self.cfg.micro_batch):
                    batch = trajs[start:start + self.cfg.micro_batch]
""" + LOSS + """\
                self.opt.step()
"""

CALLED = """\
        def _optimize(self, trajs):
            for epoch in range(self.cfg.ppo_epochs):
                self.opt.zero_grad()
                for start in range(0, len(trajs), self.cfg.micro_batch):
                    batch = trajs[start:start + self.cfg.micro_batch]
""" + LOSS + """\
                self.opt.step()

        def train_step(self):
            trajs = self.engine.generate_group(self.prompts)
{calls}
"""


def codes(tmp_path: Path, body: str, epochs: int = 1) -> list[str]:
    return sorted({code for _, code in module_codes(HEAD.format(epochs=epochs) + body, tmp_path, "train.py")})


def test_one_step_on_samples_drawn_in_the_same_function_is_on_policy(tmp_path):
    assert codes(tmp_path, INLINE) == ["KL002"]


def test_a_count_defaulting_to_several_rounds_reuses_the_samples(tmp_path):
    assert codes(tmp_path, INLINE, epochs=4) == ["KL002", "KL008"]


@pytest.mark.parametrize("calls, expected", [
    ("            self._optimize(trajs)", ["KL002"]),  # one caller, one call, after the draw
    ("            self._optimize(trajs[:8])\n            self._optimize(trajs[8:])", ["KL002", "KL008"]),
    ("            for part in (trajs[:8], trajs[8:]):\n                self._optimize(part)", ["KL002", "KL008"]),
])
def test_the_single_callers_draw_decides_for_the_update(tmp_path, calls, expected):
    """Two updates on one rollout (the hard buffer's extra step): the second trains on samples of the policy
    before the first step."""
    assert codes(tmp_path, CALLED.format(calls=calls)) == expected


def test_a_loss_helper_follows_its_single_callers_step(tmp_path):
    helper = """\
        def _loss(self, batch):
""" + LOSS.replace("                    ", "            ").replace("            loss.backward()\n", "            return loss\n") + """
        def train_step(self):
            trajs = self.engine.generate_group(self.prompts)
            self.opt.zero_grad()
            for start in range(0, len(trajs), self.cfg.micro_batch):
                self._loss(trajs[start:start + self.cfg.micro_batch]).backward()
            self.opt.step()
"""
    assert codes(tmp_path, helper) == ["KL002"]
    several = helper.replace("            self.opt.step()\n", "").replace(
        ".backward()\n", ".backward()\n                self.opt.step()\n")
    assert codes(tmp_path, several) == ["KL002", "KL008"]  # a step per micro-batch: the later ones are stale


def test_a_draw_from_a_replay_buffer_is_no_fresh_sample(tmp_path):
    replay = INLINE.replace("self.engine.generate_group(self.prompts)", "self.replay_buffer.sample(64)")
    assert codes(tmp_path, replay) == ["KL002", "KL008"]


def test_a_call_that_only_sounds_like_a_draw_draws_nothing(tmp_path):
    """`gc.collect()` between the rollout and the update loop is no new batch of samples."""
    stale = INLINE.replace("trajs = self.engine.generate_group(self.prompts)", "trajs = self.buffer_trajs\n            gc.collect()")
    assert codes(tmp_path, stale) == ["KL002", "KL008"]


def test_an_update_loop_that_collects_garbage_still_reuses_its_samples(tmp_path):
    """Four epochs on one rollout, no PPO ratio: the loop alone says the later steps train on older samples."""
    body = """\
        def train_step(self):
            trajs = self.engine.generate_group(self.prompts)
            with torch.no_grad():
                ref_logp = self.ref_model(trajs["tokens"])
            for epoch in range(self.cfg.ppo_epochs):
                gc.collect()
                logp = self.model(trajs["tokens"])
                loss = -(logp * trajs["adv"]).sum() + self.cfg.kl_coef * k3(ref_logp, logp).sum()
                self.opt.zero_grad()
                loss.backward()
                self.opt.step()
"""
    assert codes(tmp_path, body, epochs=4) == ["KL002", "KL008"]


REWARD = """\
        def train_step(self):
            trajs = self.engine.generate_group(self.prompts)
            with torch.no_grad():
                ref_logp = self.ref_model(trajs["tokens"])
            kl = trajs["old_logp"] - ref_logp
            rewards = trajs["scores"] - self.cfg.kl_coef * kl
            advantages = rewards.flip(-1).cumsum(-1).flip(-1)
            for epoch in range(self.cfg.ppo_epochs):
                self.opt.zero_grad()
                logp = self.model(trajs["tokens"])
                {loss}
                loss.backward()
                self.opt.step()
"""
SURROGATE = 'loss = -(torch.exp(logp - trajs["old_logp"]) * advantages).sum()'


@pytest.mark.parametrize("epochs, expected", [(1, []), (4, ["KL008"])])
def test_a_k1_reward_under_the_ratio_of_one_step_per_rollout_is_right(tmp_path, epochs, expected):
    """The ratio to the rollout's own log-probs in the only step on them is exp(logp - sg(logp)): 1 in value,
    the score in gradient, so the k1 reward-to-go is the score-function gradient of the KL (row 6). Four
    steps on the rollout train the later ones on an older policy's reward with a token ratio only (row 23)."""
    assert codes(tmp_path, REWARD.format(loss=SURROGATE), epochs) == expected


def test_a_loss_helper_of_another_module_follows_the_callers_step(tmp_path):
    """The surrogate computed by a helper of another module, which takes no step of its own: the step that calls
    it decides, as for a helper of the same module."""
    helper = """\
        import torch


        def policy_loss(logp, old_logp, advantages):
            ratio = torch.exp(logp - old_logp)
            return -(ratio * advantages).sum()
    """
    body = "from losses import policy_loss\n" + textwrap.dedent(HEAD.format(epochs=1)) + textwrap.indent(
        textwrap.dedent(REWARD.format(loss='loss = policy_loss(logp, trajs["old_logp"], advantages)')), "    ")
    assert module_codes(body, tmp_path, "train.py", losses=helper) == []
    several = body.replace("ppo_epochs: int = 1", "ppo_epochs: int = 4")
    assert {code for _, code in module_codes(several, tmp_path, "train.py", losses=helper)} == {"KL008"}


@pytest.mark.parametrize("call", ["self._log_rollout_data(trajs)", "self._has_rollout_log_probs(trajs)"])
def test_a_call_that_only_names_the_rollout_draws_nothing(tmp_path, call):
    """slime's FSDP actor logs the rollout (`_log_rollout_data`) and asks `_has_rollout_log_probs` before its step
    on samples handed in: neither draws, so the ratio to the rollout's log-probs keeps its reading (row 22)."""
    handed_in = INLINE.replace("trajs = self.engine.generate_group(self.prompts)", f"trajs = self.batches.pop()\n            {call}")
    assert codes(tmp_path, handed_in) == ["KL002", "KL008"]


HANDED_IN = """\
        def compute_loss(self, batch):
            logp = self.model(batch["tokens"])
            with torch.no_grad():
                ref_logp = self.ref_model(batch["tokens"])
            ratio = torch.exp(logp - batch["old_logp"])
            return -(ratio * batch["adv"]).sum() + self.cfg.kl_coef * k3(ref_logp, logp).sum()

        def training_step(self, batch):
            self.opt.zero_grad()
            loss = self.compute_loss(batch)
            loss.backward()
            self.opt.step()

        def train_on_batch(self, batch):
            {take}batch["old_logp"] = self.policy_log_probs(batch)
            for epoch in range(self.cfg.ppo_epochs):
                self.training_step(batch)
"""


@pytest.mark.parametrize("epochs, take, expected", [
    (1, "", ["KL002"]),
    (4, "", ["KL002", "KL008"]),
    (1, "batch = self.batches.pop()\n            ", ["KL002", "KL008"]),
])
def test_an_entry_point_that_counts_its_passes_by_a_setting_of_one_trains_each_batch_once(tmp_path, epochs, take,
                                                                                           expected):
    """ThinkRL's algorithms (twenty-fifth set) take the rollout as an argument of `train_on_rollout`, which nothing
    in the module calls, and pass over it `for epoch in range(self.config.n_epochs)`, defaulted to 1, one optimizer
    step each: the ratio to the log-probs taken before the loop is 1 at the only step, and the k3 loss is on-policy
    (row 3, KL002), not on an older policy's samples (row 22). Four passes, or a batch taken from a queue of earlier
    ones, keep the ratio's reading."""
    assert codes(tmp_path, HANDED_IN.format(take=take), epochs) == expected


SCRIPT = """\
import torch

optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)


def grpo_loss(seqs, rewards, old_logp):
    logp = model(seqs)
    with torch.no_grad():
        ref_logp = ref_model(seqs)
    ratio = torch.exp(logp - old_logp)
    log_ratio = ref_logp - logp
    kl = torch.exp(log_ratio) - log_ratio - 1.0
    return (-(ratio * rewards.unsqueeze(-1)) + 0.04 * kl).mean()


for step in range(1, 1001):
    seqs, rewards, old_logp = sample_batch()
{update}
"""
UPDATE = """\
    loss = grpo_loss(seqs, rewards, old_logp)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""


@pytest.mark.parametrize("update, expected", [
    (UPDATE, ["KL002"]),
    ("    for epoch in range(4):\n" + textwrap.indent(UPDATE, "    "), ["KL002", "KL008"]),
])
def test_a_loss_helper_of_the_scripts_own_loop_follows_its_step(tmp_path, update, expected):
    """tginart/zpo's synchronous GRPO script (twenty-fifth set) draws a batch, computes `grpo_loss` on it and steps
    once, in the module's own loop: the helper's ratio to the generation's log-probs is 1 and its k3 loss on-policy
    (row 3). Four steps on each batch train the later ones on an older policy's samples (row 22)."""
    found = sorted({code for _, code in module_codes(SCRIPT.format(update=update), tmp_path, "train.py")})
    assert found == expected


@pytest.mark.parametrize("helper", ["self.trainer.optim_step(loss)", "self.strategy.optimizer_step(loss, self.model, self.opt)",
                                    "self.step_optimizer(loss)"])
@pytest.mark.parametrize("epochs, expected", [(1, ["KL002"]), (4, ["KL002", "KL008"])])
def test_a_helper_named_for_the_optimizer_step_is_the_step(tmp_path, helper, epochs, expected):
    """rui-liu-rl/nano-rl (twenty-eighth set) steps through its own `Trainer.optim_step(loss)`, and OpenRLHF through
    `strategy.optimizer_step(loss, model, optimizer)`: a method named for the step is the update, whatever object
    holds it, so a ratio to the rollout's log-probs in the only step on them is 1 (row 3, KL002), and four such
    steps on one rollout train the later ones on an older policy's samples (row 22, KL008)."""
    body = f"""\
        def train_step(self):
            trajs = self.engine.generate_group(self.prompts)
            with torch.no_grad():
                ref_logp = self.ref_model(trajs["tokens"])
            for epoch in range(self.cfg.ppo_epochs):
                logp = self.model(trajs["tokens"])
                ratio = torch.exp(logp - trajs["old_logp"])
                loss = -(ratio * trajs["adv"]).sum() + self.cfg.kl_coef * k3(ref_logp, logp).sum()
                {helper}
"""
    assert codes(tmp_path, body, epochs) == expected


@pytest.mark.parametrize("call", ["collect_weight_entropy_stats(self.model)", "self.collect_metrics(batch)"])
def test_a_collection_of_statistics_draws_nothing(tmp_path, call):
    """liv-daliberti/maxent-grpo's learner (fifth set) calls `collect_weight_entropy_stats(...)` inside its
    mini-batch loop before the step: a statistic of the weights, not new samples, so the four epochs over the
    rollout keep their reading (row 22, KL008)."""
    stats = INLINE.replace('batch = trajs[start:start + self.cfg.micro_batch]\n',
                           f'batch = trajs[start:start + self.cfg.micro_batch]\n                    {call}\n')
    assert call in stats
    assert codes(tmp_path, stats, epochs=4) == ["KL002", "KL008"]


def test_a_mixed_precision_step_handed_the_optimizer_is_an_optimizer_step(tmp_path):
    """`self.scaler.step(self.optimizer)` (torch.amp's GradScaler, in a copy of TRL's first PPOTrainer) steps the
    optimizer it is handed: a loop of such steps after the rewards are computed trains the k1 reward of the
    rollout four times, three on an older policy's samples (row 23)."""
    body = REWARD.format(loss='loss = -(logp * advantages).sum()').replace("loss.backward()", "self.scaler.scale(loss).backward()").replace(
        "self.opt.step()", "self.scaler.step(self.opt)\n                self.scaler.update()")
    assert codes(tmp_path, body, epochs=4) == ["KL008"]
    assert codes(tmp_path, body.replace("self.scaler.step(self.opt)", "self.scaler.step(self.batch)"), epochs=4) == []


ACCUMULATED = """\
import torch


def k3(ref_logp, logp):
    log_ratio = ref_logp - logp
    return torch.exp(log_ratio) - log_ratio - 1.0


def train_epoch(loader, model, ref_model, engine, optimizer, scaler, args):
    last_step = 0
    for step, prompts in enumerate(loader, start=1):
        rollout = engine.rollout(prompts)
        logp = model(rollout.ids)
        with torch.no_grad():
            ref_logp = ref_model(rollout.ids)
        old_logp = rollout.per_token_logps
        ratio = torch.exp(logp - old_logp)
        loss = (-(ratio * rollout.adv) + args.beta * k3(ref_logp, logp)).mean() / args.accumulation_steps
        scaler.scale(loss).backward()
        if step % args.accumulation_steps == 0:
            scaler.step(optimizer)
            optimizer.zero_grad()
        last_step = step
    if {flush}:
        scaler.step(optimizer)
        optimizer.zero_grad()
"""


@pytest.mark.parametrize("flush, expected", [
    ("last_step % args.accumulation_steps != 0", ["KL002"]),
    # unguarded, it still takes no gradient of its own: what it applies is what a partial window left (or nothing)
    ("args.finish", ["KL002"]),
])
def test_a_step_that_flushes_the_last_accumulation_window_is_no_second_step(tmp_path, flush, expected):
    """minimind's GRPO trainer (five of its derivatives in the eighty-fourth set) samples each micro-batch from
    the live policy, steps every `accumulation_steps` micro-batches, and after the loop steps once more on the
    gradients a last, partial window left (`if last_step % accumulation_steps != 0:`): that step is on samples no
    step has used, so the PPO ratio of each micro-batch is 1 and its k3 loss is on-policy, kl-math.md row 3
    (KL002), not row 22 (KL008). A backward between the loop and that step would train a batch twice
    (tests/lint/test_ninety_sixth_set_shapes.py)."""
    found = module_codes(ACCUMULATED.format(flush=flush), tmp_path)
    assert sorted({code for _, code in found}) == expected
