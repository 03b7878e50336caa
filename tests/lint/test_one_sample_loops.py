"""A loop over the drawn samples one by one (`for trajectory in group.trajectories:`) runs a forward pass per sample:
each tensor in its body holds one sequence, so reducing it whole is reducing over that sequence's tokens. A `.mean()`
there is the sequence's own token mean (1/L weights, docs/kl-math.md row 21: KL007); a `.sum()` is its token sum;
sums and token counts added up over the loop are the batch's (a constant multiple, row 20)."""

from __future__ import annotations

import pytest

from klaudit.lint.engine import lint_paths

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
    # nor is a loop over a range, whatever its variable is called
    ("sample", "range(4)", "mean", ["KL002"]),
])
def test_what_a_loop_over_samples_reduces(tmp_path, variable, iterated, reduce, expected):
    source = K3_LOSS.format(variable=variable, iterated=iterated, reduce=reduce)
    assert _codes(tmp_path, source) == expected
