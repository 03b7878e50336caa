"""Shapes of code met after the forty-third blind set that the lint misread."""

from __future__ import annotations

import pytest

from klaudit.lint.engine import lint_paths

# A trainer class whose step forms a PPO ratio to the rollout's log-probs and takes one optimizer step per call
# (nikq/mathFormer's GRPOTrainer.train_step); nothing in its own module calls it.
TRAINER = """\
import torch


class GRPOTrainer:
    def train_step(self, logp_fn, ids, mask, rewards, old_logprobs, ref_logprobs):
        logprobs = logp_fn(ids)
        ratio = torch.exp(logprobs - old_logprobs)
        policy_loss = -(ratio * rewards[:, None] * mask).sum() / mask.sum()
        kl = torch.exp(ref_logprobs - logprobs) - (ref_logprobs - logprobs) - 1
        loss = policy_loss + 0.1 * (kl * mask).sum() / mask.sum()
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
"""

# The training script beside it: `{body}` is the loop's body, indented by eight spaces.
SCRIPT = """\
from grpo import GRPOTrainer


def generate_responses(model, prompts):
    return [model.generate(p) for p in prompts]


def main(model, trainer, prompts, steps):
    for step in range(steps):
{body}


if __name__ == "__main__":
    main(None, GRPOTrainer(), [], 10)
"""

FRESH = """\
        batch = generate_responses(model, prompts)
        trainer.train_step(model, batch, None, None, None, None)"""
# the same rollout trained by four calls: every call after the first is on an older policy's samples
REUSED = """\
        batch = generate_responses(model, prompts)
        for epoch in range(4):
            trainer.train_step(model, batch, None, None, None, None)"""
# no draw before the call: the batches come from elsewhere (a buffer of earlier rollouts, say)
NO_DRAW = """\
        batch = prompts[step]
        trainer.train_step(model, batch, None, None, None, None)"""


def _found(root):
    result = lint_paths([str(root)], jobs=1)
    return sorted((finding.path.rsplit("/", 1)[-1], finding.code) for finding in result.findings)


@pytest.mark.parametrize("body, stale", [(FRESH, False), (REUSED, True), (NO_DRAW, True)])
def test_a_step_called_by_another_module_right_after_it_draws_is_on_policy(tmp_path, body, stale):
    """A trainer's step that nothing in its module calls, called once by a script right after it generates new
    responses, takes its one optimizer step on the policy that drew them: its PPO ratio is 1 there and the KL is
    on-policy (no KL008). The same call in a loop of four epochs over one rollout, or after no draw, is not."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "grpo.py").write_text(TRAINER)
    (src / "train.py").write_text(SCRIPT.format(body=body))
    codes = {code for _, code in _found(tmp_path)}
    assert "KL002" in codes
    assert ("KL008" in codes) is stale


def test_a_step_called_at_two_places_elsewhere_is_not_read_as_on_policy(tmp_path):
    """Two calls of the step in the modules around it (a second script that trains each rollout twice): which one
    runs is the user's choice, so the lint keeps reading the ratio as a sign of older samples."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "grpo.py").write_text(TRAINER)
    (src / "train.py").write_text(SCRIPT.format(body=FRESH))
    (src / "train_twice.py").write_text(SCRIPT.format(body=REUSED))
    assert ("grpo.py", "KL008") in _found(tmp_path)


# rgurney7/negotiation-rl's grpo/loss.py: a masked mean of its own module, each row averaged by default
MASKED_MEAN = """\
import torch


def masked_mean(values, mask, dim={dim}):
    bool_mask = mask.bool()
    values = torch.where(bool_mask, values, torch.zeros_like(values))
    return values.sum(dim) / bool_mask.to(values.dtype).sum(dim).clamp(min=1.0)


def grpo_loss(new_logps, ref_logps, mask, policy_loss):
    log_ratio = ref_logps - new_logps
    kl = masked_mean(torch.exp(log_ratio) - log_ratio - 1, mask)
    return policy_loss + 0.04 * kl.mean()
"""


@pytest.mark.parametrize("dim, codes", [("-1", ["KL002", "KL007"]), ("1", ["KL002", "KL007"]), ("None", ["KL002"])])
def test_a_helper_default_axis_reaches_its_body(tmp_path, dim, codes):
    """A parameter the caller leaves takes its default in the callee, a negative number (`dim=-1`) too: the helper
    averages each response over its own tokens (1/L weights, KL007); over every axis (`dim=None`) it is one
    batch mean. Zeroing the rejected entries with `torch.where(mask, x, zeros_like(x))` is a padding fill, no
    switch: the findings name no `[bool_mask=True]` branch."""
    (tmp_path / "loss.py").write_text(MASKED_MEAN.format(dim=dim))
    result = lint_paths([str(tmp_path)], jobs=1)
    assert sorted(f.code for f in result.findings) == codes
    assert not any("bool_mask" in f.message for f in result.findings)


# MikeBertin/prometheus's src/rloo.py: each response's log-prob summed over its positions picked by arange
SEQUENCE_SUMS = """\
import torch
import torch.nn.functional as F


def sum_response_logp(model, batch, seqs):
    logits = model(seqs)
    logp_all = F.log_softmax(logits.float(), dim=-1)
    out = torch.zeros(len(batch))
    for i, b in enumerate(batch):
        L, T = b["L"], len(b["actions"])
        pos = torch.arange(L - 1, L - 1 + T)
        act = torch.tensor(b["actions"])
        out[i] = logp_all[i, pos].gather(-1, act.unsqueeze(-1)).squeeze(-1){reduce}
    return out


def train(policy, ref, batch, groups, k, seqs, scores, opt, kl_coef):
    with torch.no_grad():
        oldlp = sum_response_logp(policy, batch, seqs)
        reflp = sum_response_logp(ref, batch, seqs)
    kl = oldlp - reflp
    reward = scores - kl_coef * kl
    adv = torch.zeros_like(reward)
    for gi, g in enumerate(groups):
        idx = list(range(gi * k, gi * k + len(g)))
        r = reward[idx]
        adv[idx] = r - (r.sum() - r) / (len(g) - 1)
    logp = sum_response_logp(policy, batch, seqs)
    loss = -(adv * logp).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


# duterscmy/OPD's opd/trainer.py: the positions of each alignment group, a part of the sequence, in a loop inside it
GROUP_SUMS = """\
import torch


def distillation_loss(student_lp, teacher_lp, inputs):
    terms = []
    for batch_index, groups in enumerate(inputs["alignment_groups"]):
        for group in groups:
            student_pos = [i - 1 for i in group["student"] if i > 0]
            teacher_pos = [i - 1 for i in group["teacher"] if i > 0]
            student_logp = student_lp[batch_index, student_pos].sum()
            teacher_logp = teacher_lp[batch_index, teacher_pos].sum()
            advantage = student_logp.detach() - teacher_logp.detach()
            terms.append(advantage * student_logp)
    return torch.stack(terms).mean()
"""


def test_positions_picked_by_a_vector_keep_the_row_of_their_sequence(tmp_path):
    """`logp_all[i, pos]` with `pos = torch.arange(start, end)` picks the response positions of sequence i: summed,
    one value per sequence. A whole-sequence k1 in the reward that multiplies the whole response's score is right
    (row 6): no finding, where the sum had read as a per-token k1 reward of its own token only (KL003). In a loop
    inside the loop over the sequences (over alignment groups), the positions are a part of the sequence: each
    group's k1 multiplies that group's score only (KL003)."""
    (tmp_path / "rloo.py").write_text(SEQUENCE_SUMS.format(reduce=".sum()"))
    assert lint_paths([str(tmp_path)], jobs=1).findings == []
    (tmp_path / "rloo.py").unlink()
    (tmp_path / "opd.py").write_text(GROUP_SUMS)
    assert [f.code for f in lint_paths([str(tmp_path)], jobs=1).findings] == ["KL003"]


# ibusnowden/ghost's scripts/chat_grpo.py, nanochat's conventions: settings at module level that the configurator
# executed after them may rebind from the command line, and a model forward that returns each target token's loss
NANOCHAT_SCRIPT = """\
import os
import torch

kl_coef = 0.0
num_steps = 10
{configurator}
use_kl = kl_coef > 0

for step in range(num_steps):
    inputs, targets, advantages, mask = next(batches)
    logp_new = -train_model(inputs, targets, loss_reduction='none').view_as(inputs)
    pg_loss = -(logp_new * advantages[:, None] * mask).sum() / mask.sum()
    if use_kl:
        with torch.no_grad():
            logp_ref = -ref_model(inputs, targets, loss_reduction='none').view_as(inputs)
        log_ratio = logp_new - logp_ref
        kl = ((torch.exp(-log_ratio) - 1 + log_ratio) * mask).sum() / mask.sum()
    else:
        kl = torch.zeros(())
    loss = pg_loss + kl_coef * kl
    loss.backward()
    optimizer.step()
"""
CONFIGURATOR = "exec(open(os.path.join('nanochat', 'configurator.py')).read())"


@pytest.mark.parametrize("configurator, codes", [(CONFIGURATOR, ["KL002"]), ("", [])])
def test_a_configurator_leaves_the_defaults_before_it_open(tmp_path, configurator, codes):
    """`model(inputs, targets, loss_reduction='none')` is each target token's cross-entropy, so its negation is the
    token's log-prob (the reference's for `ref_model`): k3 of the two as a loss is row 3 (KL002). `kl_coef = 0.0`
    then `exec(...)` of a configurator is a default the command line may change (the project's docs pass
    --kl_coef=0.02): the KL branch may run. Without the exec, 0.0 is the value and the branch never runs."""
    (tmp_path / "chat_grpo.py").write_text(NANOCHAT_SCRIPT.format(configurator=configurator))
    assert sorted(f.code for f in lint_paths([str(tmp_path)], jobs=1).findings) == codes


# bigwolfeman/Retnet-Distillation's sparse KL: a reverse KL to the teacher beside a cross-entropy to the labels
DISTILLATION = """\
import torch
import torch.nn.functional as F


def distillation_loss(student_logits, teacher_logits, hard_targets, mask, alpha=0.2):
    p_student = F.softmax(student_logits, dim=-1)
    p_teacher = F.softmax(teacher_logits, dim=-1)
    kl = torch.sum(p_student * (torch.log(p_student) - torch.log(p_teacher)), dim=-1)
    kl = (kl * mask).sum() / mask.sum()
    ce = F.cross_entropy(student_logits.reshape(-1, student_logits.size(-1)), hard_targets.reshape(-1))
    return alpha * ce + (1 - alpha) * kl
{sampling}"""


@pytest.mark.parametrize("sampling, codes", [("", []), ("\n\ndef rollout(model, prompts):\n"
                                                       "    return model.generate(prompts)\n", ["KL003"])])
def test_a_kl_fitted_beside_the_labels_cross_entropy_is_teacher_forced(tmp_path, sampling, codes):
    """A per-position KL to a teacher in a loss that also fits the same positions to their labels by cross-entropy
    is on a dataset's sequences (their next tokens are known) where the module samples nothing: its per-position
    gradient is the whole gradient (KL100 at most, off by default). In a module that generates, it may be on the
    student's own samples: KL003."""
    (tmp_path / "losses.py").write_text(DISTILLATION.format(sampling=sampling))
    assert sorted(f.code for f in lint_paths([str(tmp_path)], jobs=1).findings) == codes

