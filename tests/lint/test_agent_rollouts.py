"""An agent's rollouts: a sampler object made for each episode, and token ids put in one row.

HelloRXL/agentic-grpo's multi-turn GRPO makes a client for each episode, `LocalPolicyClient(model, tokenizer)`,
whose `think` generates with the model and records the sampled tokens' log-probs; the environment's own loop,
`run_task(task, llm_client=client)`, calls it. The update then back-propagates every recorded turn and takes one
optimizer step: the ratio to the recorded log-probs is 1 at that step (on-policy, row 3 of kl-math.md section 8,
not row 22). Each turn's log-probs come from `torch.tensor([span.prefix_ids + span.completion_ids])`, a batch of one
sequence, so `kl.mean()` over them is that turn's own token mean (row 21, KL007).
"""

from __future__ import annotations

import pytest
from snippets import module_codes

AGENT = """\
import torch
import torch.nn.functional as F

from envs import run_task


class PolicyClient:
    def __init__(self, model, tokenizer):
        self.model, self.tokenizer = model, tokenizer
        self.turns = []

    @torch.no_grad()
    def think(self, prompt_ids):
        out = self.model.generate(prompt_ids, do_sample=True)
        completion = out[:, prompt_ids.shape[1]:]
        logits = self.model(out[:, :-1]).logits[:, -completion.shape[1]:]
        old = F.log_softmax(logits, -1).gather(-1, completion.unsqueeze(-1)).squeeze(-1)
        self.turns.append((prompt_ids[0].tolist(), completion[0].tolist(), old[0].tolist()))
        return completion


def turn_logprobs(model, prefix_ids, completion_ids):
    ids = torch.tensor([prefix_ids + completion_ids])
    logits = model(ids[:, :-1]).logits[:, -len(completion_ids):]
    return F.log_softmax(logits, -1).gather(-1, ids[:, -len(completion_ids):].unsqueeze(-1)).squeeze(-1)[0]


def turn_loss(model, reference, turn, advantage, beta):
    prefix, completion, old_logprobs = turn
    logp = turn_logprobs(model, prefix, completion)
    with torch.no_grad():
        ref_logp = turn_logprobs(reference, prefix, completion)
    ratio = torch.exp(logp - torch.tensor(old_logprobs))
    kl = torch.exp(ref_logp - logp) - (ref_logp - logp) - 1
    return -(ratio * advantage).mean() + beta * kl.mean()


def train(model, reference, tokenizer, tasks, optimizer, updates, beta=0.01):
    for update in range(updates):
        samples = []
        for task in tasks:
            client = PolicyClient(model, tokenizer)
            result = run_task(task, llm_client=client)
            samples.append((result.reward, client.turns))
        mean = sum(r for r, _ in samples) / len(samples)
        optimizer.zero_grad()
        for reward, spans in samples:
            for span in spans:
                loss = turn_loss(model, reference, span, reward - mean, beta) / len(samples)
                loss.backward()
        optimizer.step()
"""


@pytest.mark.parametrize("made, codes", [
    # the client made with the policy for each episode draws: one step per batch of episodes, on-policy
    ("client = PolicyClient(model, tokenizer)", [(35, "KL002"), (35, "KL007")]),
    # one client for the whole run, made before the loop: nothing in the update loop is seen to draw
    (None, [(35, "KL002"), (35, "KL007"), (35, "KL008")]),
])
def test_a_sampler_made_for_each_episode_draws_its_samples(tmp_path, made, codes):
    source = AGENT
    if made is None:
        source = source.replace("            client = PolicyClient(model, tokenizer)\n", "").replace(
            "    for update in range(updates):\n", "    client = PolicyClient(model, tokenizer)\n"
            "    for update in range(updates):\n")
    assert module_codes(source, tmp_path, envs="def run_task(task, llm_client):\n    ...\n") == codes


def test_ids_put_in_one_row_are_one_sequence(tmp_path):
    batch = AGENT.replace("torch.tensor([prefix_ids + completion_ids])", "torch.tensor(prefix_ids + completion_ids)")
    found = module_codes(AGENT, tmp_path, envs="def run_task(task, llm_client):\n    ...\n")
    assert (35, "KL007") in found
    # a row built for each of many sequences, in a comprehension, is a batch: the mean is over all its tokens
    many = AGENT.replace("torch.tensor([prefix_ids + completion_ids])",
                         "torch.tensor([[t for t in prefix_ids + completion_ids] for _ in range(2)])")
    # zjworacle/LLM's GRPO: one prompt's row copied for the group, `torch.tensor([prompt_ids]).repeat(8, 1)`
    group = AGENT.replace("torch.tensor([prefix_ids + completion_ids])",
                          "torch.tensor([prefix_ids + completion_ids]).repeat(8, 1)")
    for source in (batch, many, group):
        assert (35, "KL007") not in module_codes(source, tmp_path, envs="def run_task(task, llm_client):\n    ...\n")
    # an expand that keeps the rows (-1) leaves the one sequence: its token mean is still that sequence's own
    kept = AGENT.replace("torch.tensor([prefix_ids + completion_ids])",
                         "torch.tensor([prefix_ids + completion_ids]).expand(-1, -1)")
    assert (35, "KL007") in module_codes(kept, tmp_path, envs="def run_task(task, llm_client):\n    ...\n")
