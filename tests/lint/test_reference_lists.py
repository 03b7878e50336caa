"""Per-response log-prob lists of the reference model, stored under another name, and a KL kept non-negative by relu.

Phonsiriwillbejommarn/Qwen3.5-0.8B-CISPO-RL (seventy-sixth set) computes each response's token log-probs with one
helper that returns a list per model, and stores the reference model's list as `old_logprobs_list`: what the helper
ran on says whose log-probs they are, not the name. Its KL term, exp(d) - 1 - d with d = log pi - log ref (k3 with
the ratio reversed, kl-math.md section 8 row 5b: KL009), is put through `torch.relu` against rounding, which leaves
a value that is never negative as it is; each response's term is its own token mean (row 21: KL007).
"""

from __future__ import annotations

import pytest
from snippets import module_codes

TRAINER = """\
import torch
import torch.nn.functional as F


def token_logprobs(model, ids, prompt_lengths):
    logp = F.log_softmax(model(ids).logits, dim=-1)
    out = []
    for b in range(ids.shape[0]):
        start = prompt_lengths[b]
        out.append(logp[b, start - 1:-1].gather(-1, ids[b, start:].unsqueeze(-1)).squeeze(-1))
    return out, None


def penalised_loss(current, old, advantages, beta):
    pg, kls, n = [], [], 0
    for lp, ref_lp, adv in zip(current, old, advantages):
        pg.append(-(adv * lp).sum())
        n += lp.shape[0]
        log_r = lp - ref_lp.detach()
        kl = torch.relu(torch.exp(log_r) - 1 - log_r)
        kls.append(kl.mean())
    kl_loss = torch.stack(kls).mean()
    return torch.stack(pg).sum() / n + beta * kl_loss


def step(policy, reference, ids, prompt_lengths, advantages, optimizer, beta=0.01):
    with torch.no_grad():
        old_logprobs_list, _ = token_logprobs(reference, ids, prompt_lengths)
    current_logprobs_list, _ = token_logprobs(policy, ids, prompt_lengths)
    loss = penalised_loss(current_logprobs_list, old_logprobs_list, advantages, beta)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
"""


def test_the_reference_models_list_under_an_old_name_is_the_references(tmp_path):
    assert module_codes(TRAINER, tmp_path) == [(22, "KL007"), (22, "KL009")]


@pytest.mark.parametrize("squash, expected", [
    ("torch.sigmoid", []),  # a weight that varies with the log-ratio: no estimate of the table
    ("", [(22, "KL007"), (22, "KL009")]),  # no relu at all: the same estimate
])
def test_relu_leaves_only_a_never_negative_estimate_as_it_is(tmp_path, squash, expected):
    source = TRAINER.replace("torch.relu(", f"{squash}(")
    assert module_codes(source, tmp_path) == expected
