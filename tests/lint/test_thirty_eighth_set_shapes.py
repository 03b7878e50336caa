"""Shapes of the thirty-eighth blind set that the lint misread."""

from __future__ import annotations

import pytest
from snippets import module_codes

PPO_EPOCHS = """\
import torch
import torch.nn.functional as F


def train_epoch(actor, ref_model, optimizer, gen_out, labels, mask, advantages, args):
    with torch.no_grad():
        old_logp = F.log_softmax(actor(gen_out).logits, dim=-1).gather(2, labels.unsqueeze(-1)).squeeze(-1)
        ref_logp = F.log_softmax(ref_model(gen_out).logits, dim=-1).gather(2, labels.unsqueeze(-1)).squeeze(-1)
    for ppo_epoch in range(args.ppo_update_iters):
        logp = F.log_softmax(actor(gen_out).logits, dim=-1).gather(2, labels.unsqueeze(-1)).squeeze(-1)
        ratio = torch.exp(logp - old_logp)
        kl_ref_penalty = ((torch.exp(ref_logp - logp) - (ref_logp - logp) - 1) * mask).sum() / mask.sum()
        loss = (-advantages * ratio * mask).sum() / mask.sum() + args.kl_coef * kl_ref_penalty
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        NAME = kl_ref_penalty.detach()
"""


@pytest.mark.parametrize("name", ["kl_ref", "ref_kl", "loss_ref"])
def test_a_kl_measured_against_the_reference_is_no_reference_model_run_in_the_loop(tmp_path, name):
    """550-ml/LLM-Minimind's PPO takes `ppo_update_iters` optimizer steps on one rollout, its old log-probs
    recomputed from the actor before the loop, and logs `kl_ref = kl_ref_penalty.detach()`: the name read as a
    reference model run inside the loop, which would mean samples drawn there, so the k3 loss (row 3, KL002) was
    judged on fresh samples. It is trained on an older policy's after the first step (row 22, KL008)."""
    assert module_codes(PPO_EPOCHS.replace("NAME", name), tmp_path) == [(13, "KL002"), (13, "KL008")]


def test_a_reference_model_run_again_in_the_loop_draws_no_samples(tmp_path):
    """`ref_out = ref_model(gen_out)` inside the loop runs the reference again on the rollout drawn before it (as
    karinazad/nano-rlvr's KL helper does in each epoch): no new samples, so still row 22 after the first step.
    Until 2026-12-02 a reference run in the loop was taken for samples drawn there."""
    source = PPO_EPOCHS.replace("NAME = kl_ref_penalty.detach()", "ref_out = ref_model(gen_out)")
    assert module_codes(source, tmp_path) == [(13, "KL002"), (13, "KL008")]
