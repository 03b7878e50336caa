"""Shapes of code met in the fiftieth blind set and after it that the lint misread: a critic regressed on a target
that holds a detached log-ratio (DRO-V's value loss), which is no KL penalty left without its gradient."""

from __future__ import annotations

import pytest

from klaudit.lint.engine import lint_paths

# LLNL/protein_tune_rl's DRO loss, reduced: the policy's part holds the squared log-ratio with gradient; the value's
# part is sg(V - r + tau * log-ratio) * V, whose gradient (V - (r - tau * log-ratio)) grad V regresses the critic.
DRO = """\
import torch


class DRO:
    def calculate_loss(self, batch):
        pi_logits = self.policy(batch["input_ids"]).logits
        with torch.no_grad():
            ref_logits = self.ref_model(batch["input_ids"]).logits
        labels = batch["labels"]
        pi_log_probs = torch.gather(pi_logits.log_softmax(-1), 2, labels.unsqueeze(2)).squeeze(2)
        ref_log_probs = torch.gather(ref_logits.log_softmax(-1), 2, labels.unsqueeze(2)).squeeze(2)
        log_ratio = pi_log_probs - ref_log_probs
        value = {value}.float().flatten()
        value_no_grad = value.clone().detach()
        log_ratio_no_grad = log_ratio.clone().detach()
        policy_loss = -(pi_log_probs.sum(-1) * (batch["rewards"] - value_no_grad)
                        - self.tau / 2 * torch.pow(log_ratio.sum(-1), 2)).mean()
        value_loss = ((value_no_grad - batch["rewards"] + self.tau * log_ratio_no_grad.sum(-1)) * {factor}).mean()
        return policy_loss, value_loss

    def step(self, batch):
        policy_loss, value_loss = self.calculate_loss(batch)
        (policy_loss + value_loss).backward()
"""


def _found(tmp_path, source):
    (tmp_path / "dro.py").write_text(source)
    result = lint_paths([str(tmp_path)], jobs=1)
    assert result.errors == []
    return sorted({(finding.code, finding.line) for finding in result.findings})


@pytest.mark.parametrize("value", ["self.value(batch['prompts'])", "self.critic_model(batch['prompts'])"])
def test_a_detached_log_ratio_in_a_critics_target_is_no_penalty_without_gradient(tmp_path, value):
    assert ("KL001", 18) not in _found(tmp_path, DRO.format(value=value, factor="value"))


@pytest.mark.parametrize("value, factor", [
    ("self.value(batch['prompts'])", "value_no_grad"),  # the critic's output detached: a number like any other
    ("self.config.get_value('scale')", "value"),  # a lookup named like a value, not a value network
])
def test_the_same_detached_log_ratio_times_anything_else_is_still_reported(tmp_path, value, factor):
    assert ("KL001", 18) in _found(tmp_path, DRO.format(value=value, factor=factor))


# Edward-Sun/easy-to-hard, reduced: the subclass draws the rollout and puts a detached k1 in its token rewards; the base
# class, in another module, calls `self.rollout(...)` and then takes several optimizer steps on that rollout (row 23).
BASE_TRAINER = """\
import torch


class RLTrainer:
    def rollout(self, queries):
        raise NotImplementedError

    def step(self, loader):
        rollouts = self.rollout(next(loader))
        return self.step_with_rollouts(rollouts)

    def step_with_rollouts(self, rollouts):
        for epoch in range(self.args.noptepochs):
            logprobs = self.policy(rollouts["queries"], rollouts["responses"]).logprobs
            ratio = torch.exp(logprobs - rollouts["logprobs"])
            loss = -(ratio * rollouts["advantages"]).mean()
            loss.backward()
            self.optimizer.step()
            self.optimizer.zero_grad()
"""

PPO_TRAINER = """\
import torch

from trainers.rl_trainer import RLTrainer


class PPOTrainer(RLTrainer):
    @torch.no_grad()
    def rollout(self, queries):
        responses = self.policy.generate(queries)
        logprobs = self.policy(queries, responses).logprobs
        ref_logprobs = self.ref_policy(queries, responses).logprobs
        rewards = self._shape_reward(self.reward_model(queries, responses), logprobs, ref_logprobs)
        advantages = torch.flip(torch.cumsum(torch.flip(rewards, [1]), 1), [1])
        return dict(queries=queries, responses=responses, logprobs=logprobs, advantages=advantages)

    def _shape_reward(self, scores, logprobs, ref_logprobs):
        kl = logprobs - ref_logprobs
        rewards = -self.kl_coef * kl
        rewards[:, -1] += scores
        return rewards
{override}"""

SINGLE_PASS = """
    def step_with_rollouts(self, rollouts):
        logprobs = self.policy(rollouts["queries"], rollouts["responses"]).logprobs
        loss = -(logprobs * rollouts["advantages"]).mean()
        loss.backward()
        self.optimizer.step()
"""


def _found_in(tmp_path, files):
    for name, source in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(source)
    result = lint_paths([str(tmp_path)], jobs=1)
    assert result.errors == []
    return [(finding.path.replace("\\\\", "/").rsplit("/", 2)[-2:], finding.code, finding.message)
            for finding in result.findings]


def test_a_kl_reward_trained_by_the_epochs_of_a_base_class_in_another_module_is_on_older_samples(tmp_path):
    found = _found_in(tmp_path, {"trainers/__init__.py": "", "trainers/rl_trainer.py": BASE_TRAINER,
                                 "trainers/ppo_trainer.py": PPO_TRAINER.format(override="")})
    assert [(path, code) for path, code, _ in found] == [(["trainers", "ppo_trainer.py"], "KL008")]
    assert "rl_trainer.py:13" in found[0][2]


def test_the_base_class_loop_is_not_the_one_that_runs_where_the_subclass_replaces_it(tmp_path):
    found = _found_in(tmp_path, {"trainers/__init__.py": "", "trainers/rl_trainer.py": BASE_TRAINER,
                                 "trainers/ppo_trainer.py": PPO_TRAINER.format(override=SINGLE_PASS)})
    assert [code for _, code, _ in found] == []


# shihaohou/multimodalOPD, reduced: a KL to a teacher (reverse by default, forward by a switch) over the top-k tokens
# (the full vocabulary where k is not below it), summed chunk by chunk, then renormalised by the all-reduced token count in the
# straight-through form g + (v - g.detach()): the value is the global mean, the gradient the local KL's (row 2's
# per-token loss, KL003, with its clip, KL010); the KL keeps its gradient, so no KL001.
DISTILLATION = """\
import torch
import torch.nn.functional as F


def topk_kl(student_logits, teacher_logits, mask, top_k, chunk, clip, direction):
    if not bool(mask.any()):
        return (student_logits.sum() + teacher_logits.sum()) * 0.0  # both stay in the graph
    positions = mask.nonzero()
    total = student_logits.new_zeros((), dtype=torch.float32)
    for start in range(0, positions.shape[0], chunk):
        rows = positions[start:start + chunk]
        log_p = F.log_softmax(student_logits[rows[:, 0], rows[:, 1]], dim=-1)
        log_q = F.log_softmax(teacher_logits[rows[:, 0], rows[:, 1]], dim=-1)
        if direction == "forward":
            log_p, log_q = log_q, log_p
        if top_k is not None and top_k < log_p.shape[-1]:
            kept = torch.topk(log_p, k=top_k, dim=-1).indices
            log_p = torch.gather(log_p, -1, kept)
            log_q = torch.gather(log_q, -1, kept)
        per_token = (log_p.exp() * (log_p - log_q)).sum(-1)
        if clip is not None:
            per_token = per_token.clamp(min=-clip, max=clip)
        total = total + per_token.sum().float()
    return total / mask.sum().clamp_min(1)


class Distiller:
    def global_mean(self, local_loss, mask):
        local_count = mask.float().sum()
        local_total = local_loss * local_count
        global_total = local_total.detach()
        global_count = local_count.clone()
        torch.distributed.all_reduce(global_total)
        torch.distributed.all_reduce(global_count)
        gradient_loss = local_total * (torch.distributed.get_world_size() / global_count)
        value_loss = global_total / global_count
        return {form}

    def compute_loss(self, model, inputs):
        completions = model.generate(inputs["prompt_ids"])
        student_logits = model(completions).logits
        with torch.no_grad():
            teacher_logits = self.teacher_model(completions).logits
        kl = topk_kl(student_logits, teacher_logits, inputs["mask"], self.top_k, self.chunk, self.clip, self.direction)
        return self.lambda_kl * self.global_mean(kl, inputs["mask"])
"""


@pytest.mark.parametrize("form", ["gradient_loss + (value_loss - gradient_loss.detach())",
                                  "gradient_loss + (value_loss - gradient_loss).detach()",
                                  "(value_loss - gradient_loss).detach() + gradient_loss"])
def test_a_straight_through_renormalisation_keeps_the_gradient_of_the_kl_it_carries(tmp_path, form):
    codes = {code for code, _ in _found(tmp_path, DISTILLATION.format(form=form))}
    assert codes == {"KL003", "KL010"}  # the per-token loss, and its optional clip


@pytest.mark.parametrize("expression, expected", [
    ("g + (v - g.detach())", ("left", "v")),
    ("(v - g.detach()) + g", ("right", "v")),
    ("g + (v - g).detach()", ("left", None)),
    ("(v - g).detach() + g", ("right", None)),
    ("g + (v - h.detach())", (None, None)),  # another value detached: no straight-through sum
    ("g - (v - g.detach())", (None, None)),
    ("g + (v - g)", (None, None)),
])
def test_the_straight_through_sum_is_recognised_by_its_shape(expression, expected):
    import libcst as cst

    from klaudit.lint.arithmetic import _straight_through

    carrier, shown = _straight_through(cst.parse_expression(expression))
    assert (carrier, shown.value if shown is not None else None) == expected


@pytest.mark.parametrize("shown, code_word", [
    ("kl + (kl.clamp(max=10.0) - kl).detach()", "k3"),  # the clamped value, the unclamped gradient
    ("kl + (kl.clamp(max=10.0) - kl.detach())", "low_var_kl"),  # the clamped term keeps its own gradient
])
def test_a_straight_through_clamp_is_judged_by_the_gradient_it_keeps(tmp_path, shown, code_word):
    source = (
        "import torch\n\n\n"
        "def train_step(model, ref_model, optimizer, batch, beta):\n"
        "    completions = model.generate(batch['prompt_ids'])\n"
        "    logp = model(completions).logits.log_softmax(-1).gather(-1, completions.unsqueeze(-1)).squeeze(-1)\n"
        "    with torch.no_grad():\n"
        "        ref_logp = ref_model(completions).logits.log_softmax(-1).gather(-1, completions.unsqueeze(-1)).squeeze(-1)\n"
        "    log_ratio = ref_logp - logp\n"
        "    kl = torch.exp(log_ratio) - log_ratio - 1\n"
        f"    shown = {shown}\n"
        "    loss = beta * (shown * batch['mask']).sum() / batch['mask'].sum()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n")
    (tmp_path / "train.py").write_text(source)
    result = lint_paths([str(tmp_path)], jobs=1)
    assert [(f.code, f.message.split(" differentiated")[0]) for f in result.findings] == [("KL002", code_word)]
