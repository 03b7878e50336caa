"""Shapes of code met in the fifty-seventh blind set that the lint misread.

- deepakvijaykee/minilab scores a sequence longer than the model's context position by position: for each `pos` it
  runs the model on the window ending there and writes the log-prob of its last logits into `token_logp[active,
  pos]`. Read as the last token's alone, the k1 reward made of them looked like a KL at the final token only (three
  false KL005); the loop writes every position in turn.
- The same trainer adds the task score at the last token with `shaped[b, last] = shaped[b, last] + rewards[b]`; the
  place read back on the right was taken for a second, last-token KL term (`+=` was already read right).
- DhawalV1/Negative_Code_Generation steps its discriminator's optimizer in a loop after the actor's: read as a
  second policy step on the same samples (a false KL008).
- The same project's diffusion GRPO sums each denoising step's log-prob into the trajectory's in a loop; the loop's
  second pass doubled the sum, and the k3 of the trajectory's log-ratio was read as k1 (a false KL001).
- JunyiJ/PostTraining-LLM-Small's PPO script keeps each rollout's k1 reward in a list of dicts and trains it over
  PPO_EPOCHS = 2 steps after the rollout loop; the greedy evaluation generation inside the epochs was read as a new
  draw, and the loop after the reward was not looked for in the same function (a missed KL008).
- igreck/GPT's GRPO agent averages the exact KL over `shift_labels.ne(-100)` tokens, a name no mask spelling
  matches: the divisor was unknown and the 1/L of each response missed (KL007).
"""

from __future__ import annotations

import pytest

from klaudit.lint.engine import lint_paths

PPO_ROLLOUT = """\
import torch
import torch.nn.functional as F


def token_logp(model, ids, labels):
    out = torch.zeros(labels.shape)
    for {index} in range(ids.size(1)):
        logits = model(ids[:, : {index} + 1])
        out[:, {index}] = F.log_softmax(logits[:, -1], dim=-1).gather(-1, labels[:, {index}, None]).squeeze(-1)
    return out


def train(policy, ref_model, optimizer, ids, labels, mask, scores, kl_coef):
    with torch.no_grad():
        old_logp = token_logp(policy, ids, labels)
        ref_logp = token_logp(ref_model, ids, labels)
    shaped = -kl_coef * (old_logp - ref_logp) * mask
{score}
    returns = shaped.flip(-1).cumsum(-1).flip(-1)
    logp = token_logp(policy, ids, labels)
    loss = -(logp * returns * mask).sum()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""

SCORE_ADDED = "    shaped[:, -1] = shaped[:, -1] + scores"


@pytest.mark.parametrize("index, score, expected", [
    ("pos", SCORE_ADDED, []),  # k1 at every token with reward-to-go, on-policy: row 6, right
    ("pos", "    shaped[:, -1] += scores", []),
    ("pos", "    for b in range(ids.size(0)):\n        shaped[b, -1] = shaped[b, -1] + scores[b]", []),
    ("t", SCORE_ADDED, []),  # a loop variable spelled as a position
    # a KL term of its own added where the buffer is read back: kept, a KL at the final token (KL005)
    ("pos", "    shaped[:, -1] = shaped[:, -1] - kl_coef * (old_logp - ref_logp)[:, -1]", [(19, "KL005")]),
    # the KL kept at the last token alone: a KL reward at the final token (KL005)
    ("pos", "    shaped = torch.zeros_like(shaped)\n    shaped[:, -1] = -kl_coef * (old_logp - ref_logp)[:, -1] + scores",
     [(20, "KL005")]),
])
def test_a_log_prob_written_position_by_position_is_every_tokens(tmp_path, index, score, expected):
    (tmp_path / "ppo.py").write_text(PPO_ROLLOUT.format(index=index, score=score))
    found = [(finding.line, finding.code) for finding in lint_paths([str(tmp_path)], jobs=1).findings]
    assert found == expected


SEQUENCE_MEAN = """\
import torch
import torch.nn.functional as F


def token_kl(logits, ref_logits, labels):
    logp = F.log_softmax(logits[:, :-1], dim=-1)
    logq = F.log_softmax(ref_logits[:, :-1], dim=-1)
    kl_tok = (logp.exp() * (logp - logq)).sum(dim=-1)
    active = {counted}.float()
    return (kl_tok * active).sum(dim=1) / active.sum(dim=1).clamp_min(1.0)


def train_step(model, ref_model, prompts, optimizer, kl_coef):
    ids = model.generate(prompts, do_sample=True)
    labels = ids.masked_fill(ids == tokenizer.pad_token_id, -100)
    logits = model(ids).logits
    with torch.no_grad():
        ref_logits = ref_model(ids).logits
    loss = kl_coef * token_kl(logits, ref_logits, labels).mean()
    loss.backward()
    optimizer.step()
"""


@pytest.mark.parametrize("counted", ["labels[:, 1:].ne(-100)", "(labels[:, 1:] != -100)",
                                     "labels[:, 1:].ne(tokenizer.pad_token_id)"])
def test_the_tokens_compared_with_the_ignore_index_are_a_mask(tmp_path, counted):
    """igreck/GPT's GRPO agent averages the exact KL over each sequence's `shift_labels.ne(-100)` tokens: a mask by
    how it is made, whatever it is named, so each response is divided by its own length (row 21, KL007, beside the
    exact per-step KL differentiated as a loss, row 5c's KL003)."""
    (tmp_path / "grpo.py").write_text(SEQUENCE_MEAN.format(counted=counted))
    found = [(finding.line, finding.code) for finding in lint_paths([str(tmp_path)], jobs=1).findings]
    assert found == [(19, "KL003"), (19, "KL007")]


DISCRIMINATOR_AFTER = """\
import torch

for step in range(100):
    for prompt in prompts:
        ids = actor.generate(prompt)
        logp_old = actor.logprobs(ids).detach()
        logp_ref = ref_actor.logprobs(ids).detach()
        logp_new = actor.logprobs(ids)
        ratio = torch.exp(logp_new - logp_old)
        kl = torch.exp(logp_ref - logp_new) - (logp_ref - logp_new) - 1
        loss = -(ratio * advantage(ids)).sum() + 0.05 * kl.sum()
        actor_opt.zero_grad()
        loss.backward()
        actor_opt.step()
    for prompt in prompts:
        disc_loss = discriminator_loss(prompt)
        disc_loss.backward()
        {optimizer}.step()
"""


@pytest.mark.parametrize("optimizer, expected", [
    ("disc_opt", []),  # the discriminator's optimizer: the policy still steps once per fresh draw
    ("critic_optimizer", []),
    ("actor_opt", [(11, "KL008")]),  # the policy stepped again after its samples were drawn: they grow old
])
def test_a_step_of_another_models_optimizer_leaves_the_samples_fresh(tmp_path, optimizer, expected):
    """DhawalV1/Negative_Code_Generation steps its actor once per generated sample, then its discriminator in a loop
    of its own: that step trains no policy, and the KL loss is on fresh samples (a false KL008)."""
    (tmp_path / "train.py").write_text(DISCRIMINATOR_AFTER.format(optimizer=optimizer))
    found = [(finding.line, finding.code) for finding in lint_paths([str(tmp_path)], jobs=1).findings
             if finding.code == "KL008"]
    assert found == expected


TRAJECTORY = """\
import torch


def trajectory_logp(model, trace):
    total_logp = torch.zeros(trace[0].size(0))
    for step in trace:
        log_probs = torch.log_softmax(model(step), dim=-1)
        total_logp = {running}
    return total_logp


def train_step(model, ref_model, trace, optimizer, kl_coef):
    logp = trajectory_logp(model, trace)
    with torch.no_grad():
        ref_logp = trajectory_logp(ref_model, trace)
    delta = ref_logp - logp
    kl = (delta.exp() - delta - 1).mean()
    loss = kl_coef * kl
    loss.backward()
    optimizer.step()
"""


@pytest.mark.parametrize("running", [
    "total_logp + log_probs.gather(-1, step.actions[..., None]).squeeze(-1).sum(-1)",
    "log_probs.gather(-1, step.actions[..., None]).squeeze(-1).sum(-1) + total_logp",
])
def test_a_log_prob_summed_over_a_loop_is_one_log_prob_of_the_whole(tmp_path, running):
    """deepakvijaykee/minilab's diffusion GRPO sums each denoising step's log-prob into the trajectory's, `total =
    total + step_logp`; read twice over by the loop's second pass it was 2 log pi, whose exp is no ratio, and the k3
    of the trajectory's log-ratio (row 18's estimator, a loss: KL002) was read as k1 (a false KL001)."""
    (tmp_path / "diffusion.py").write_text(TRAJECTORY.format(running=running))
    found = [(finding.line, finding.code) for finding in lint_paths([str(tmp_path)], jobs=1).findings]
    assert found == [(18, "KL002")]


BUFFERED_SCRIPT = """\
import torch

PPO_EPOCHS = {epochs}

for epoch in range(10):
    buffer_memory = []
    for batch in batches:
        tokens = model.generate(batch, do_sample=True)
        with torch.no_grad():
            log_probs_old = model.logprobs(tokens)
            log_probs_ref = ref_model.logprobs(tokens)
        rewards = (-0.05 * (log_probs_old - log_probs_ref)).detach().clone()
        rewards[:, -1] += score(tokens)
        advantages = advantage_gae(rewards, values(tokens)).detach()
        buffer_memory.append({{"tokens": tokens, "old_log_probs": log_probs_old, "advantages": advantages}})
    for ppo_epoch in range(PPO_EPOCHS):
        for mini_batch in buffer_memory:
            new = model.logprobs(mini_batch["tokens"])
            ratio = torch.exp(new - mini_batch["old_log_probs"])
            loss = -(ratio * mini_batch["advantages"]).mean()
            loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if step % 50 == 0:
            print(model.generate(eval_prompt, {eval_sampling}))
"""


@pytest.mark.parametrize("epochs, eval_sampling, expected", [
    (2, "do_sample=False", [(12, "KL008")]),  # two steps on each rollout's k1 reward: row 23 after the first
    (1, "do_sample=False", []),  # one step per rollout: on-policy, row 6
    (2, "do_sample=True", []),  # a sampled generation inside the epochs: read as fresh samples, nothing claimed
])
def test_a_reward_kept_in_a_buffer_is_trained_by_the_epochs_after_it(tmp_path, epochs, eval_sampling, expected):
    """JunyiJ/PostTraining-LLM-Small's run_train_ppo.py puts each rollout's k1 reward, through GAE, into a list of
    dicts, then runs PPO_EPOCHS = 2 optimizer steps over the list; its greedy evaluation generation inside the epochs
    draws nothing to train on. The reward never reaches the loss the analysis sees, but the loop after it trains it
    on an older policy's samples from the second step (a missed KL008)."""
    (tmp_path / "run_train_ppo.py").write_text(BUFFERED_SCRIPT.format(epochs=epochs, eval_sampling=eval_sampling))
    found = [(finding.line, finding.code) for finding in lint_paths([str(tmp_path)], jobs=1).findings]
    assert found == expected
