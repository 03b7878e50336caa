"""Shapes of KL code met in the ninety-sixth fresh set.

SaintSauce/xxs takes a sequence's log-prob from a model's built-in cross-entropy: `-out.loss * valid_len`, the
mean NLL of the response tokens times their count, `valid_len = (labels != -100).sum(dim=1)`. A token count
times a value the analysis does not explain was read as a count still (`len(tokens) * G`), so the helper's
log-probs were a length and its PPO loss's `beta * (ref_logp - old_logp).mean()` (both detached: a constant,
KL001) was silent.

Ivann1242/PAgent accumulates the gradients of a few groups and steps through a closure, `flush_optimizer()`, that
calls a script function `_optimizer_step(model, optimizer)`; after the loop `flush_optimizer(force=True)` steps
what a last, partial window left. No step was seen (a step helper was read only as a method, and the body of a
function the loop defines was not looked into), so its loss helper's samples were read as stale: a KL008 beside
the right KL002.
"""

from __future__ import annotations

import pytest
from snippets import module_codes

TRAINER = """\
import torch


class Trainer:
    def _log_prob(self, model, seqs):
        labels = seqs.clone()
        out = model(seqs, labels=labels)
        valid_len = (labels != -100).sum(dim=1)
        logp = {product}
        return logp

    def train(self):
        for update in range(100):
            with torch.no_grad():
                seqs = self.policy.generate(self.prompts, do_sample=True)
                old_logp = self._log_prob(self.policy, seqs)
                ref_logp = self._log_prob(self.reference, seqs)
            kl_loss = self.beta * (old_logp - ref_logp).mean()
            for _ in range(4):
                new_logp = self._log_prob(self.policy, seqs)
                ratio = (new_logp - old_logp).exp()
                loss = -(ratio * self.advantages).mean() + kl_loss
                loss.backward()
                self.optimizer.step()
"""


@pytest.mark.parametrize("product, codes", [
    ("-out.loss * valid_len", [(18, "KL001")]),  # a mean NLL times the count: the sequence's log-prob
    ("valid_len * -out.loss", [(18, "KL001")]),
    ("valid_len * self.group_size", []),  # a count times a setting: still a count, no log-prob
])
def test_a_mean_loss_times_its_token_count_is_a_sum_not_a_count(tmp_path, product, codes):
    assert module_codes(TRAINER.format(product=product), tmp_path) == codes


LOSS = """\
import torch


def grpo_loss(cur_lp, old_lp, ref_lp, adv, beta=0.02):
    ratio = torch.exp(cur_lp - old_lp)
    pg = -torch.min(ratio * adv, ratio.clamp(0.8, 1.2) * adv)
    per_kl = torch.exp(ref_lp - cur_lp) - (ref_lp - cur_lp) - 1
    return (pg + beta * per_kl).sum()
"""

ACCUMULATING = """\
import torch
from grpo import grpo_loss


def _optimizer_step(model, optimizer):
    optimizer.step()
    optimizer.zero_grad()


def train(model, rows, window=4):
    optimizer = torch.optim.AdamW(model.parameters())
    pending = 0

    def flush_optimizer(force=False):
        nonlocal pending
        if force or pending >= window:
            {flush}
            pending = 0

    for row in rows:
        completions = generate_group(model, row)
        old_lps = [logprobs(model, c).detach() for c in completions]
        ref_lps = [logprobs(model, c, no_adapter=True).detach() for c in completions]
        for comp, adv, old_lp, ref_lp in zip(completions, advantages(row), old_lps, ref_lps):
            grpo_loss(logprobs(model, comp), old_lp, ref_lp, adv).backward()
        pending += 1
        flush_optimizer()
{after}

if __name__ == "__main__":
    train(load_model(), load_rows())
"""


@pytest.mark.parametrize("flush, after, codes", [
    ("_optimizer_step(model, optimizer)", "    flush_optimizer(force=True)", [(8, "KL002")]),  # one step per window
    ("optimizer.step()", "    flush_optimizer(force=True)", [(8, "KL002")]),
    ("_optimizer_step(model, optimizer)", "", [(8, "KL002")]),
    # a second backward on the last rollout after the loop, then a step: that rollout trains twice
    ("_optimizer_step(model, optimizer)", "    grpo_loss(logprobs(model, comp), old_lp, ref_lp, adv).backward()\n"
     "    flush_optimizer(force=True)", [(8, "KL002"), (8, "KL008")]),
])
def test_a_step_in_a_closure_over_an_accumulation_window_is_one_step_per_rollout(tmp_path, flush, after, codes):
    assert module_codes(LOSS, tmp_path, "grpo.py", train=ACCUMULATING.format(flush=flush, after=after)) == codes
