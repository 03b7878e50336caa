"""Shapes of the fortieth blind set that the lint misread."""

from __future__ import annotations

import pytest
from snippets import module_codes

HELPERS = """\
import torch


def get_per_token_logps(model, input_ids, attention_mask):
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
    log_probs = torch.log_softmax(logits[:, :-1, :], dim=-1)
    return log_probs.gather(2, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
"""
NO_GRAD_LOGITS = """\
    with torch.no_grad():
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
"""

K1_PENALTY = """\
from helpers import get_per_token_logps


def kl_penalty(comp_logps, ref_model, ids, mask):
    ref_logps = get_per_token_logps(ref_model, ids, mask)
    kl = comp_logps - ref_logps
    return ((kl * mask).sum(dim=1) / mask.sum(dim=1)).mean()


def train_step(model, ref_model, ids, mask, advantages, optimizer):
    logits = model(ids).logits
    logps = logits.log_softmax(-1).gather(2, ids.unsqueeze(-1)).squeeze(-1)
    policy_loss = -(advantages * logps.sum(1)).mean()
    loss = policy_loss + 0.05 * kl_penalty(logps, ref_model, ids, mask)
    loss.backward()
    optimizer.step()
"""


@pytest.mark.parametrize("no_grad", [False, True])
def test_a_no_grad_helper_run_on_the_reference_returns_the_references_log_probs(tmp_path, no_grad):
    """karinazad/nano-rlvr's `get_per_token_logps(ref_model, ...)` computes its logits under `torch.no_grad()`:
    what a no_grad function returns was read as the rollout's (old) log-probs before the caller could say it
    ran on the reference model, so the k1 loss `logp - ref_logp` was no KL at all; with or without the block it
    is row 1b, a per-sequence token mean of k1 as a loss."""
    helpers = HELPERS.replace(HELPERS.splitlines(keepends=True)[4], NO_GRAD_LOGITS) if no_grad else HELPERS
    assert module_codes(K1_PENALTY, tmp_path, helpers=helpers) == [(14, "KL001")]


SEQUENCE_K3 = """\
import torch
import torch.nn.functional as F


def get_loss(model, batch, output_ids, kl_coeff):
    logits = model(batch["ids"]).logits
    LOG_PROBS
    pg_loss = -torch.mean(torch.sum(log_probs, dim=-1) * batch["rewards"])
    pretrained_log_probs = batch["pretrained_log_probs"]
    log_ratio = pretrained_log_probs.sum(axis=1) - log_probs.sum(axis=1)
    kl_loss = torch.mean(torch.exp(log_ratio) - log_ratio - 1)
    loss = pg_loss + kl_coeff * kl_loss
    return loss
"""


@pytest.mark.parametrize("log_probs", [
    "log_probs = F.log_softmax(logits, -1).gather(2, output_ids.unsqueeze(-1)).squeeze(-1)",
    # the sampled tokens' probabilities, then their log: log pi(y_t) as well
    "probs = torch.gather(F.softmax(logits, dim=-1), 2, output_ids.unsqueeze(-1)).squeeze(-1); log_probs = probs.log()",
    "probs = F.softmax(logits, dim=-1)[:, :, output_ids]; log_probs = torch.log(probs + 1e-10)",
])
def test_the_pretrained_models_log_probs_are_the_reference_and_a_log_of_picked_probabilities_a_log_prob(
        tmp_path, log_probs):
    """katiekang1998/SimpleGRPO names its reference `pretrained_model` and stores its log-probs under
    `pretrained_log_probs`, and its REINFORCE takes `softmax`, gathers the sampled tokens and then `.log()`:
    the k3 of the summed log-ratio as a loss is row 18 (KL002, the forward KL), which neither name nor the
    log of a picked probability let the lint see."""
    source = SEQUENCE_K3.replace("LOG_PROBS", log_probs.replace("; ", "\n    "))
    line = 12 if ";" in log_probs else 11
    assert module_codes(source, tmp_path) == [(line, "KL002")]


BINARY_KL = """\
import torch


def binary_kd_loss(student_log_probs, teacher_log_probs, target_ids):
    student_p = torch.exp(student_log_probs.gather(1, target_ids.unsqueeze(1)).squeeze(1))
    teacher_p = torch.exp(teacher_log_probs.gather(1, target_ids.unsqueeze(1)).squeeze(1))
    teacher_bin = torch.stack([teacher_p, 1.0 - teacher_p], dim=-1)
    student_bin = torch.stack([student_p, 1.0 - student_p], dim=-1)
    kl_bin = (teacher_bin * (torch.log(teacher_bin) - torch.log(student_bin))).sum(dim=-1)
    loss = kl_bin.mean()
    loss.backward()
"""


def test_the_log_of_probabilities_stacked_with_their_complement_is_no_log_prob(tmp_path):
    """almogtavor/SE-KD3x's AT-KD stacks each target token's probability with its complement, `[p, 1 - p]`, and
    takes a binary KL to the teacher's: once a picked probability's log became its log-prob, the stack's log read
    as the student's log-probs alone, and the binary forward KL as a k1 bonus. The log of pieces of which one has
    no meaning has none as a whole."""
    assert module_codes(BINARY_KL, tmp_path) == []
