"""Code that runs its model on one sequence at a time: a loop over the drawn samples one by one (`for trajectory in
group.trajectories:`), or a loop or function that encodes one text (`tokenizer(prompt, return_tensors="pt")`, a batch of
one), and the helpers every caller calls so. Each tensor there holds one sequence, so reducing it whole is reducing over
that sequence's tokens: a `.mean()` is the sequence's own token mean (1/L weights, docs/kl-math.md row 21: KL007), a
`.sum()` its token sum; sums and token counts added up over a loop are the batch's (a constant multiple, row 20)."""

from __future__ import annotations

import libcst as cst
import pytest

from klaudit.lint.engine import lint_paths
from klaudit.lint.syntax import handles_one_sequence, walk

# stateset-agents' GRPO loss (fresh47), reduced: each trajectory of a group is encoded and run alone, its exact
# per-token KL to the frozen reference reduced over its own tokens, and the per-trajectory values averaged.
PER_TRAJECTORY = """\
import torch


def grpo_loss(model, reference_model, groups, encode, beta):
    losses, kls = [], []
    for group in groups:
        rewards = torch.tensor([t.total_reward for t in group.trajectories])
        advantages = (rewards - rewards.mean()) / (rewards.std() + 1e-8)
        for trajectory, advantage in zip(group.trajectories, advantages):
            inputs, labels = encode(trajectory)
            outputs = model(**inputs, labels=labels)
            losses.append(advantage * outputs.loss)
            log_probs = outputs.logits.log_softmax(dim=-1)
            with torch.no_grad():
                ref_log_probs = reference_model(**inputs).logits.log_softmax(dim=-1)
            kl_per_token = (log_probs.exp() * (log_probs - ref_log_probs)).sum(dim=-1)
            loss_mask = labels.ne(-100)
            kls.append({reduction})
    return torch.stack(losses).mean() + beta * torch.stack(kls).mean()
"""

# the same reduction over the samples of a batch counted up first: the batch's token mean, a constant multiple
COUNTED = """\
import torch


def kl_loss(model, reference_model, trajectories, beta):
    kl_total, n_tokens = 0.0, 0
    for traj in trajectories:
        log_probs = model(traj.ids).logits.log_softmax(-1)
        with torch.no_grad():
            ref_log_probs = reference_model(traj.ids).logits.log_softmax(-1)
        kl = (log_probs.exp() * (log_probs - ref_log_probs)).sum(-1)
        kl_total = kl_total + (kl * traj.mask).sum()
        n_tokens = n_tokens + traj.mask.sum()
    return beta * kl_total / n_tokens
"""

# k3 per sample with a policy-gradient term, each sample's sum or mean added to one loss
K3_LOSS = """\
import torch


def train_step(model, ref_model, samples, beta, optimizer):
    total = 0
    for {variable} in {iterated}:
        with torch.no_grad():
            ref_logp = ref_model({variable}["ids"]).log_softmax(-1)
        logp = model({variable}["ids"]).log_softmax(-1)
        log_ratio = ref_logp - logp
        kl = (torch.exp(log_ratio) - log_ratio - 1).{reduce}()
        total = total + beta * kl - ({variable}["advantage"] * logp).{reduce}()
    total.backward()
    optimizer.step()
"""


def _codes(tmp_path, source):
    (tmp_path / "train.py").write_text(source)
    result = lint_paths([str(tmp_path)], jobs=1)
    assert result.errors == []
    return sorted({finding.code for finding in result.findings})


@pytest.mark.parametrize("reduction, expected", [
    # the exact per-token KL as a loss with nothing of the later tokens' in a reward is the local gradient (row 2,
    # KL003); each trajectory's averaged over its own tokens adds 1/L per sequence (row 21, KL007)
    ("(kl_per_token * loss_mask).sum() / loss_mask.sum()", ["KL003", "KL007"]),
    ("kl_per_token.mean()", ["KL003", "KL007"]),
    # its token sum: the sequence's sum of exact KLs, still without the later tokens' term
    ("(kl_per_token * loss_mask).sum()", ["KL003"]),
])
def test_a_trajectory_run_alone_is_one_sequence(tmp_path, reduction, expected):
    assert _codes(tmp_path, PER_TRAJECTORY.format(reduction=reduction)) == expected


@pytest.mark.parametrize("spelt", ["n_tokens = n_tokens + traj.mask.sum()", "n_tokens += traj.mask.sum()"])
def test_sums_and_token_counts_added_over_the_samples_are_the_batchs(tmp_path, spelt):
    source = COUNTED.replace("n_tokens = n_tokens + traj.mask.sum()", spelt)
    assert _codes(tmp_path, source) == ["KL003"]  # the local gradient, not 1/L


@pytest.mark.parametrize("variable, iterated, reduce, expected", [
    # k3 as a loss is KL002 however it is reduced; a sample's mean adds its 1/L
    ("sample", "samples", "mean", ["KL002", "KL007"]),
    ("sample", "samples", "sum", ["KL002"]),
    # a loop over the rows of a dataset is no loop over drawn samples: nothing says one row is one sequence
    ("row", "samples", "mean", ["KL002"]),
    # a loop over a list of drawn samples is, whatever its variable is called (semenishchev-ai/MiniGrid_NanoVLM's
    # `for g, ep in enumerate(episodes)`, fifty-second set)
    ("row", "episodes", "mean", ["KL002", "KL007"]),
    ("row", "self.trajectories", "mean", ["KL002", "KL007"]),
    # nor is a loop over a range, whatever its variable is called
    ("sample", "range(4)", "mean", ["KL002"]),
])
def test_what_a_loop_over_samples_reduces(tmp_path, variable, iterated, reduce, expected):
    source = K3_LOSS.format(variable=variable, iterated=iterated, reduce=reduce)
    assert _codes(tmp_path, source) == expected


# arnav4561/Mini-InstructGPT's phase 4 (fresh22), reduced: a script that encodes one prompt per step, samples one
# response, scores it with a reward model, and puts the k1 of that one sequence, averaged over its tokens and clamped
# at 0, into a REINFORCE reward.
ONE_PROMPT_A_STEP = """\
import torch
import torch.nn.functional as F


def sequence_kl(actor_logits, ref_logits, response_ids):
    actor_lp = F.log_softmax(actor_logits.float(), dim=-1).gather(-1, response_ids.unsqueeze(-1)).squeeze(-1)
    ref_lp = F.log_softmax(ref_logits.float(), dim=-1).gather(-1, response_ids.unsqueeze(-1)).squeeze(-1)
    return (actor_lp - ref_lp).{reduce}()


def reward_of(prompt_text, response_text):
    tokens = reward_tokenizer(prompt_text + response_text, return_tensors="pt")
    with torch.no_grad():
        return reward_model(input_ids=tokens["input_ids"]).logits.squeeze().item()


for step in range(100):
    {text} = prompts[step % len(prompts)]
    enc = tokenizer({text}, return_tensors="pt")
    prompt_len = enc["input_ids"].shape[1]
    with torch.no_grad():
        full_ids = actor.generate(input_ids=enc["input_ids"], do_sample=True)
        ref_logits = reference(input_ids=full_ids[:, :-1]).logits[:, prompt_len - 1:, :]
    response_ids = full_ids[:, prompt_len:]
    actor_logits = actor(input_ids=full_ids[:, :-1]).logits[:, prompt_len - 1:, :]
    kl = sequence_kl(actor_logits, ref_logits, response_ids)
    total_reward = reward_of({text}, response_ids) - 0.1 * {penalty}
    log_probs = F.log_softmax(actor_logits, dim=-1).gather(-1, response_ids.unsqueeze(-1)).squeeze(-1)
    loss = -total_reward * log_probs.sum()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""


@pytest.mark.parametrize("text, reduce, penalty, expected", [
    # one prompt's response: its mean k1 is 1/L of its sum (row 21); clamped at 0 it loses the negative estimates
    ("prompt_text", "mean", "kl.item()", ["KL007"]),
    ("prompt_text", "mean", "max(0.0, kl.item())", ["KL007", "KL010"]),
    # its token sum in the reward is the whole-sequence k1 reward (row 6)
    ("prompt_text", "sum", "kl.item()", []),
])
def test_one_text_encoded_at_a_time(tmp_path, text, reduce, penalty, expected):
    source = ONE_PROMPT_A_STEP.format(text=text, reduce=reduce, penalty=penalty)
    assert _codes(tmp_path, source) == expected


def test_texts_encoded_together_are_a_batch(tmp_path):
    # a list of prompts encoded together: the whole mean is over every token of the batch, no sequence's own 1/L
    source = ONE_PROMPT_A_STEP.format(text="prompts_batch", reduce="mean", penalty="kl.item()")
    assert "KL007" not in _codes(tmp_path, source)


@pytest.mark.parametrize("drawn, one_sequence", [("num_return_sequences=4", False), ("num_return_sequences=1", True)])
def test_several_responses_drawn_for_one_text_are_a_group(tmp_path, drawn, one_sequence):
    # one prompt, four responses drawn for it: the whole mean is over the group's tokens, no sequence's own 1/L
    source = ONE_PROMPT_A_STEP.format(text="prompt_text", reduce="mean", penalty="kl.item()")
    source = source.replace("do_sample=True)", f"do_sample=True, {drawn})")
    assert ("KL007" in _codes(tmp_path, source)) == one_sequence


# a reward model's logits are its score: no policy's log-probs are made of them
SCORED = """\
import torch
import torch.nn.functional as F


def train_step(policy, {scorer}, batch, kl_coef, optimizer):
    with torch.no_grad():
        score = {scorer}(input_ids=batch["ids"]).logits[:, -1]
        ref_logps = batch["ref_logps"]
    logps = F.log_softmax(policy(input_ids=batch["ids"]).logits, dim=-1).gather(-1, batch["ids"][..., None])[..., 0]
    mask = batch["mask"]
    kl = ((logps.detach() - ref_logps) * mask).sum(-1) / mask.sum(-1)
    rewards = score - kl_coef * kl
    loss = -(rewards * logps.sum(-1)).mean()
    loss.backward()
    optimizer.step()
"""


@pytest.mark.parametrize("scorer", ["reward_model", "rm", "critic", "sentiment_classifier"])
def test_a_reward_models_logits_are_a_score(tmp_path, scorer):
    # beside the score, each response's k1 averaged over its own tokens: 1/L weights (row 21), seen through the score
    assert _codes(tmp_path, SCORED.format(scorer=scorer)) == ["KL007"]


def test_a_mean_over_a_padded_batchs_width_divides_every_response_by_the_same_number(tmp_path):
    """PT0X0E/LLM-training-demo (fifty-eighth set), ethanyanjiali/minChatGPT (ninth): `kl.mean(-1)` of a [batch,
    positions] tensor divides each row by the batch's width, the same for every response: a constant divisor (row
    20), not the response's own length. Only one sequence's own tokens averaged give 1/L (row 21)."""
    source = SCORED.format(scorer="reward_model").replace(
        "((logps.detach() - ref_logps) * mask).sum(-1) / mask.sum(-1)", "(logps.detach() - ref_logps).mean(-1)")
    assert _codes(tmp_path, source) == []


# stateset-agents' GSPO-token step (fresh47), reduced: each query's prompt is encoded once (its length), and the
# group's responses are encoded and scored one by one in a loop inside; the query's loop holds the whole group.
ONE_PROMPT_SEVERAL_RESPONSES = """\
import torch


def train_step(self, prompts, groups, optimizer):
    total_loss = 0.0
    for prompt, responses in zip(prompts, groups):
        prompt_len = self.tokenizer(prompt, return_tensors="pt")["input_ids"].shape[1]
        token_log_probs_list = []
        for response in responses:
            inputs = self.tokenizer(prompt + response, return_tensors="pt")
            logp = self.model(**inputs).logits.log_softmax(-1)
            token_log_probs_list.append(logp.gather(-1, inputs["input_ids"][..., None])[0, prompt_len:, 0])
        current_log_probs = torch.stack([t.sum() for t in token_log_probs_list])
        lengths = torch.tensor([float(len(t)) for t in token_log_probs_list])
        loss = torch.tensor(0.0)
        for token_log_probs, length in zip(token_log_probs_list, lengths):
            loss += -token_log_probs.sum() / length
        if self.beta > 0:
            ref_log_prob_values = []
            for response in responses:
                ref_log_prob = self.compute_ref_log_prob(prompt, response)
                ref_log_prob_values.append(ref_log_prob)
            ref_log_probs = torch.tensor(ref_log_prob_values)
            kl_div = (current_log_probs - ref_log_probs) / lengths
            loss += self.beta * kl_div.mean()
        total_loss += loss
    optimizer.zero_grad()
    total_loss.backward()
    optimizer.step()
"""


def test_a_prompt_with_its_responses_scored_one_by_one_is_a_group(tmp_path):
    # the prompt's loop encodes one text, but the loop inside it scores the responses one by one: that loop handles
    # one sequence at each pass, the prompt's loop the group (stateset-agents' step read so had KL001 twice)
    loops = [node for node in walk(cst.parse_module(ONE_PROMPT_SEVERAL_RESPONSES)) if type(node) is cst.For]
    by_iterated = {cst.Module([]).code_for_node(loop.iter): loop for loop in loops}
    assert handles_one_sequence(by_iterated["responses"])
    assert not handles_one_sequence(by_iterated["zip(prompts, groups)"])
    # each response's k1 sum over its own length, as a loss: KL001, reported once, at the loss it enters
    (tmp_path / "train.py").write_text(ONE_PROMPT_SEVERAL_RESPONSES)
    result = lint_paths([str(tmp_path)], jobs=1)
    assert [(finding.code, finding.line) for finding in result.findings] == [("KL001", 25)]


# Dochikhoa2006's PPO (fresh63), reduced: one prompt a step, its response's positions kept in a `slice(...)` name;
# the policy loss's `.mean()` over that one response is its own token mean, 1/L on the k1 reward it carries (row 21)
ONE_RESPONSE_BY_A_SLICE_NAME = """\
import torch


def token_log_probs(model, input_ids):
    logits = model(input_ids)
    targets = input_ids[:, 1:].unsqueeze(-1)
    return torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, targets).squeeze(-1)


def train(policy, reference, prompts, optimizer, beta):
    for prompt in prompts:
        full_ids, prompt_length = policy.generate(prompt)
        with torch.no_grad():
            old = token_log_probs(policy, full_ids)
            ref = token_log_probs(reference, full_ids)
            response = RANGE
            old_response = old[0, response]
            rewards = -beta * (old_response - ref[0, response])
            returns = rewards.flip(-1).cumsum(-1).flip(-1)
        current = token_log_probs(policy, full_ids)[0, response]
        loss = -(torch.exp(current - old_response) * returns).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
"""


@pytest.mark.parametrize("positions, expected", [
    ("slice(prompt_length - 1, None)", ["KL007"]),
    ("slice(None)", []),  # every position: the row's own length is the batch's width, no response cut out
    ("prompt_length - 1", []),  # one position, not a row
])
def test_a_slice_kept_in_a_name_cuts_one_response(tmp_path, positions, expected):
    assert _codes(tmp_path, ONE_RESPONSE_BY_A_SLICE_NAME.replace("RANGE", positions)) == expected
