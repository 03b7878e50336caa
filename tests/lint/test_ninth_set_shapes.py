"""Shapes of KL code met in the ninth review (the eighth fresh set: MindSpeed-RL, ...).

Verdicts (kl-math.md section 8): k2, |log-ratio| or clamped k3 values in a reward are no KL reward
(rows 7-9, KL004); the k1 value there is row 6, correct.
"""

from __future__ import annotations

import pytest
from snippets import module_codes

# MindSpeed-RL's apply_kl_penalty (a Ray task): the token rewards with the KL subtracted, put back into
# the data queue through helpers the analysis does not see
REWARD_SENT_ON_OUT_OF_SIGHT = """\
    import torch


    def kl_penalty(logprob, ref_logprob, kind="kl"):
        if kind == "kl":
            return logprob - ref_logprob
        if kind == "mse":
            return 0.5 * (logprob - ref_logprob).square()
        raise NotImplementedError


    def apply_kl_penalty(dock, kl_ctrl, penalty="kl"):
        batch = dock.get_experience()
        kld = kl_penalty(batch["old_log_prob"], batch["ref_log_prob"], kind=penalty)
        token_level_rewards = batch["scores"] - kl_ctrl.value * kld
        {send}
"""


@pytest.mark.parametrize("send", [
    'dock.put_experience.remote(data_dict={"token_level_rewards": token_level_rewards})',
    'dock.put_experience(token_level_rewards)',
    'return truncate_rows(token_level_rewards, batch["response_length"])',
])
def test_a_reward_handed_to_code_out_of_sight_is_used_as_one(tmp_path, send):
    assert module_codes(REWARD_SENT_ON_OUT_OF_SIGHT.format(send=send), tmp_path) == [(15, "KL004")]


def test_a_reward_handed_to_a_logger_is_not_one(tmp_path):
    source = REWARD_SENT_ON_OUT_OF_SIGHT.format(send='logger.log({"rewards": token_level_rewards})')
    assert module_codes(source, tmp_path) == []


# TunePPO's PPO recipe (torchtune style): the KL module built from the configuration in `setup`, the
# attribute annotated with its class; its forward names the policy and the reference lhs and rhs
KL_MODULE = """\
    import torch
    import torch.nn as nn


    class KLPenalty(nn.Module):
        def __init__(self, coeff):
            super().__init__()
            self._coeff = coeff

        def forward(self, lhs_logprobs, rhs_logprobs, padding_masks):
            per_token_kl = torch.exp(rhs_logprobs - lhs_logprobs) - (rhs_logprobs - lhs_logprobs) - 1
            return self._coeff * (per_token_kl * padding_masks).sum() / padding_masks.sum()
"""
RECIPE = """\
    from ppo_loss import KLPenalty


    class Recipe:
        def setup(self, cfg):
            self.kl: KLPenalty = {build}

        def train_step(self, logprobs, trajectory, policy_loss):
            kl_penalty = self.kl(logprobs, trajectory.ref_logprobs, padding_masks=~trajectory.pad_mask)
            loss = policy_loss + kl_penalty
            loss.backward()
"""


@pytest.mark.parametrize("build", ["instantiate(cfg.kl_penalty)", "KLPenalty(cfg.kl_coeff)"])
def test_an_attribute_annotated_with_its_class_is_an_instance_of_it(tmp_path, build):
    codes = module_codes(RECIPE.format(build=build), tmp_path, "recipe.py", ppo_loss=KL_MODULE)
    assert codes == [(10, "KL002")]


# nanochat's on-policy distillation script (chat_opd.py): the training loop at the module's top level,
# the per-token reverse KL to the teacher detached and named an advantage, minimised as logp * adv
DISTILLATION_SCRIPT = """\
    import torch

    full = False
    for step in range(num_steps):
        logp = -model(inputs, targets, loss_reduction="none").view_as(inputs)
        with torch.no_grad():
            teacher_logp = -teacher_model(inputs, targets, loss_reduction="none").view_as(inputs)
        valid_mask = targets != -1
        adv = (logp[valid_mask] - teacher_logp[valid_mask]).detach()
        opd_obj = {objective}
        loss = opd_obj / valid_mask.sum()
        loss.backward()
"""


@pytest.mark.parametrize("objective, codes", [
    # minimised, logp * sg(log pi - log teacher) is the score-function term of a penalty on its own token
    ("(logp[valid_mask] * adv).sum()", [(9, "KL003")]),
    # maximised (the loss's sign flipped), the same product is a bonus: the loss decides, not the name
    ("-(logp[valid_mask] * adv).sum()", [(9, "KL003"), (9, "KL011")]),
])
def test_a_training_loop_at_the_top_level_of_a_script_is_linted(tmp_path, objective, codes):
    assert module_codes(DISTILLATION_SCRIPT.format(objective=objective), tmp_path) == codes


def test_a_module_body_of_definitions_and_imports_alone_adds_nothing(tmp_path):
    import libcst as cst

    from klaudit.lint.modules import module_body

    assert module_body(cst.parse_module('"""Doc."""\nimport torch\n\n\ndef f():\n    pass\n')) is None
    body = module_body(cst.parse_module("import torch\nx = 1\nif x:\n    main()\n"))
    assert body is not None and len(body.body.body) == 2


STATISTICS_ONLY = """\
    import torch

    def get_sequence_rewards(policy_logps, reference_logps, lengths):
        token_rewards = (policy_logps - reference_logps).clamp(-5, 5)
        return token_rewards.sum(-1) / lengths

    def step(self, policy_logps, reference_logps, lengths, margin):
        metrics = {}
        chosen_rewards = get_sequence_rewards(policy_logps, reference_logps, lengths) + margin
        metrics["rewards"] = chosen_rewards
        USE
"""


@pytest.mark.parametrize("use, codes", [
    ("queue.put(chosen_rewards)", [(4, "KL007"), (4, "KL010"), (4, "KL011")]),  # handed on: a bonus, 1/L, clamped
    ("summary = torch.Tensor(chosen_rewards)", []),  # an array library's function
    ("count = len(chosen_rewards)", []),  # Python's own
    ('metrics["gathered"] = gather_everywhere(chosen_rewards)', []),  # made to fill a metrics entry
])
def test_statistics_handed_to_code_out_of_sight_are_no_reward(tmp_path, use, codes):
    # HALOs: a preference loss's implicit rewards (log-ratios with a bonus's sign) only logged
    assert module_codes(STATISTICS_ONLY.replace("USE", use), tmp_path) == codes


@pytest.mark.parametrize("array", ["jnp.array([[-0.5, -0.5]])", "torch.tensor([-0.5, -1.0]).float()"])
def test_log_probs_written_out_as_numbers_are_no_model_s(tmp_path, array):
    # EasyDeL's tests/trainers/test_sdpo.py: a loss formula checked on numbers the test chose
    source = f"""\
        import jax.numpy as jnp
        import torch

        def test_kl_loss_positive_when_student_above_teacher():
            student_logps = {array}
            teacher_logps = jnp.array([[-2.0, -2.0]])
            per_token_loss = student_logps - teacher_logps
            assert (per_token_loss > 0).all()
    """
    assert module_codes(source, tmp_path) == []
    differentiated = source.replace(array, "torch.tensor([[-0.5, -0.5]], requires_grad=True)").replace(
        "jnp.array([[-2.0, -2.0]])", "torch.zeros_like(student_logps)").replace(
        "assert (per_token_loss > 0).all()", "per_token_loss.sum().backward()")
    assert module_codes(differentiated, tmp_path) == [(7, "KL001")]  # NeMo RL's tests of a loss's gradient
    model_made = source.replace(array, "per_token_logps(model, ids)").replace(
        "jnp.array([[-2.0, -2.0]])", "per_token_logps(teacher, ids)")
    # named, and made by code out of sight: a KL term, but a test that only checks its value trains nothing
    assert module_codes(model_made, tmp_path) == []
    trained = model_made.replace("assert (per_token_loss > 0).all()", "per_token_loss.sum().backward()")
    assert module_codes(trained, tmp_path) == [(7, "KL001")]


# lucidrains' implicit PRM (held-out PaLM-rlhf-pytorch): `exists(labels)` decides the early return that hands
# the implicit rewards out; the `__main__` demo trains with labels, so the cross-entropy loss is what backs up
IMPLICIT_PRM_DEMO = """\
    import torch
    from torch.nn.functional import logsigmoid


    def exists(v):
        return v is not None


    class ImplicitPRM(torch.nn.Module):
        def forward(self, log_prob, ref_log_prob, labels=None):
            implicit_rewards = 0.1 * (log_prob - ref_log_prob)
            if not exists(labels):
                return implicit_rewards
            loss = labels * logsigmoid(implicit_rewards) + (1.0 - labels) * logsigmoid(-implicit_rewards)
            return loss.mean()


    if __name__ == "__main__":
        prm = ImplicitPRM()
        loss = prm(log_prob, ref_log_prob, {labels})
        loss.backward()
"""


@pytest.mark.parametrize("labels, codes", [("labels", []), ("None", ["KL001"])])
@pytest.mark.parametrize("helper", ["def exists(v):\n        return v is not None", "def exists(v): return v is not None"])
def test_a_helper_that_tests_for_none_decides_the_branch(tmp_path, labels, codes, helper):
    source = IMPLICIT_PRM_DEMO.format(labels=labels).replace("def exists(v):\n        return v is not None", helper)
    demo_call = 19 + helper.count("\n")  # `loss = prm(...)`, where the early return's k1 would reach the backward
    assert module_codes(source, tmp_path) == [(demo_call, code) for code in codes]
