"""Shapes of code met in the forty-ninth blind set that the lint misread: a loss helper whose parameter is named for an
older policy's log-probs, given by its only caller the policy's own log-probs detached."""

from __future__ import annotations

import pytest

from klaudit.lint.engine import lint_paths

# ChenyuZhang1123/OPD-GRPO-Model-Distillation-Reproduction's src/opd/trainer.py, reduced: on-policy distillation with
# the teacher's log-ratio as a per-token advantage and a PPO ratio whose "old" side is the new log-probs detached.
OPD = """\
import torch
import torch.nn.functional as F
from transformers import Trainer


class OPDTrainer(Trainer):
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        full_ids, full_mask = self.sample(model, inputs)
        new_logprobs = self._compute_logprobs(model, full_ids, full_mask)
        old_logprobs = {old}
        teacher_logprobs = self.teacher.compute_logprobs(full_ids, full_mask)
        return self._opd_loss(old_logprobs=old_logprobs, new_logprobs=new_logprobs,
                              teacher_logprobs=teacher_logprobs, attention_mask=full_mask)

    def _compute_logprobs(self, model, input_ids, attention_mask):
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
        logprobs = F.log_softmax(logits.float(), dim=-1)
        return logprobs[:, :-1, :].gather(dim=-1, index=input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)

    @staticmethod
    def _opd_loss(old_logprobs, new_logprobs, teacher_logprobs, attention_mask, clip_epsilon=0.2):
        advantages = teacher_logprobs - old_logprobs
        ratio = torch.exp(new_logprobs - old_logprobs)
        loss = torch.max(-ratio * advantages, -torch.clamp(ratio, 1 - clip_epsilon, 1 + clip_epsilon) * advantages)
        return (loss * attention_mask).sum() / attention_mask.sum()
"""

# a unit test beside it that calls the helper with a ratio of 1: it says nothing of how training calls it
UNIT_TEST = """

def test_opd_loss_runs():
    logprobs = torch.randn(2, 5, requires_grad=True)
    teacher_logprobs = torch.randn(2, 5)
    loss = OPDTrainer._opd_loss(old_logprobs=logprobs.detach(), new_logprobs=logprobs,
                                teacher_logprobs=teacher_logprobs, attention_mask=torch.ones(2, 5))
    loss.backward()
"""


def _found(root):
    result = lint_paths([str(root)], jobs=1)
    assert result.errors == []
    return sorted((finding.code, "on-policy" in finding.message) for finding in result.findings)


@pytest.mark.parametrize("old, test, expected", [
    # exp(new - sg new) is 1 in value and the score in gradient: the teacher's k1 reaches its own token only (row 2)
    ("new_logprobs.detach()", "", [("KL003", True)]),
    # the rollout's log-probs read from the batch: a ratio to an older policy, and the samples are older (row 22)
    ('inputs["old_logprobs"]', "", [("KL003", False), ("KL008", False)]),
    ('inputs["old_logprobs"]', UNIT_TEST, [("KL003", False), ("KL008", False)]),
])
def test_a_helpers_callers_say_more_than_its_parameters_names(tmp_path, old, test, expected):
    """Read alone, `_opd_loss` takes `old_logprobs` for an older policy's by its name; its one caller hands it the new
    log-probs detached. What the caller hands it decides the sampling, unless the caller is a unit test."""
    (tmp_path / "trainer.py").write_text(OPD.format(old=old) + test)
    assert _found(tmp_path) == expected


def test_a_unit_test_calling_the_helper_says_nothing_of_training(tmp_path):
    """With only a unit test calling it in its module (its training callers elsewhere), the helper is judged by
    what its parameters are named for: the test's made-up ratio of 1 does not make the samples fresh."""
    helper = OPD[OPD.index("    @staticmethod"):].replace("    @staticmethod\n", "").replace("\n    ", "\n")
    source = "import torch\n\n\n" + helper.strip() + "\n" + UNIT_TEST.replace("OPDTrainer._opd_loss", "_opd_loss")
    (tmp_path / "loss.py").write_text(source)
    assert _found(tmp_path) == [("KL003", False), ("KL008", False)]


# MHGanainy/gsj-envloader-examples' opd/train.py, reduced: on-policy distillation whose teacher log-probs come in a
# record under a namespaced key; each sequence's detached log-ratio weighs that token's own log-prob.
NAMESPACED = """\
import torch


def train(model, loader, optimizer, steps):
    for batch in loader.batches(steps):
        teacher_full = batch.aux["{key}"]
        mask_full = batch.aux["loss_mask"]
        n_total = float(mask_full.sum()) or 1.0
        logp = model(input_ids=batch["input_ids"]).logits[:, :-1].float().log_softmax(-1)
        s_lp = logp.gather(-1, batch["input_ids"][:, 1:, None])[..., 0]
        div = s_lp - teacher_full
        loss = (div.detach() * s_lp * mask_full).sum() / n_total
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
"""


@pytest.mark.parametrize("key, expected", [("opd.teacher_logp_sampled", ["KL003"]), ("rollout/teacher_logps", ["KL003"]),
                                           ("opd.sampled_tokens", [])])
def test_the_last_part_of_a_namespaced_key_names_the_tensor(tmp_path, key, expected):
    """The teacher's log-probs under `opd.teacher_logp_sampled`: the k1 to the teacher reaches only its own token's
    score (row 2, KL003); a key whose last part names no log-probs says nothing."""
    (tmp_path / "train.py").write_text(NAMESPACED.format(key=key))
    assert [code for code, _ in _found(tmp_path)] == expected


# blazingbhavneek/rl's algo/grpo.py, reduced: a batch loss whose policy log-probs are named for the batch, the KL to the
# reference added to each rollout's total detached.
BATCH_NAMED = """\
import torch


def loss_fn_batch({name}, advantages, mask, ref_lp, kl_coeff):
    lengths = mask.sum(dim=1).clamp(min=1.0)
    total = -((advantages.view(-1, 1) * {name} * mask).sum(dim=1) / lengths)
    kl = (({name}.detach() - ref_lp) * mask).sum(dim=1) / lengths
    total = total + kl_coeff * kl
    return total.mean()
"""


@pytest.mark.parametrize("name, expected", [("batch_log_probs", ["KL001"]), ("batch_logps", ["KL001"]),
                                            ("batch_ref_log_probs", [])])
def test_log_probs_named_for_a_batch_are_the_policys(tmp_path, name, expected):
    """`batch_log_probs`: the policy's; k1 detached and added to the loss has no gradient at all (row 1c, KL001). A
    batch of the reference's log-probs stays the reference's (no KL term is made of it and `ref_lp`)."""
    (tmp_path / "grpo.py").write_text(BATCH_NAMED.format(name=name))
    assert [code for code, _ in _found(tmp_path)] == expected


# calisweetleaf/Reinforcement-Learning-Full-Pipeline's rlhf.py (twenty-ninth set), reduced: a GRPO loss method whose
# "old" log-probs are recomputed from the current policy before each step, called through its class by a tree search
# trainer that takes one optimizer step per sample of the rollouts it collected, through a device manager.
TREE = """\
import torch


class GRPOTrainer:
    def _compute_grpo_loss(self, policy_logps, ref_logps, anchor_logps, advantages, completion_mask):
        ratio = torch.exp(policy_logps - anchor_logps)
        policy_loss = -ratio * advantages.unsqueeze(1)
        kl_div = torch.exp(ref_logps - policy_logps) - (ref_logps - policy_logps) - 1
        total_loss = policy_loss + self.config.kl_coeff * kl_div
        return ((total_loss * completion_mask).sum(dim=1) / completion_mask.sum(dim=1)).mean()


class TreeGRPOTrainer:
    def train(self, optimizer, prompts):
        {collect}
        for {sample}, advantage in pairs:
            with torch.no_grad():
                policy_logps_init = self.policy_model.get_log_probs({sample})
                ref_logps = self.reference_model.get_log_probs({sample})
            old_logps = policy_logps_init.detach()
            policy_logps = self.policy_model.get_log_probs({sample})
            loss = GRPOTrainer._compute_grpo_loss(self, policy_logps, ref_logps, old_logps, advantage, {sample}.mask)
            self.device_manager.backward(loss, optimizer)
            self.device_manager.step(optimizer, self.config.max_grad_norm)
            optimizer.zero_grad()
"""


@pytest.mark.parametrize("collect, sample, stale", [
    ("pairs = self.search_trees(prompts)", "sample", True),  # one step per sample of the collected rollouts
    ("pairs = self.search_trees(prompts)", "batch", False),  # a loop over batches may make one step: undecided
    ("pairs = self.search_trees(prompts)", "example", False),  # a dataset's examples: no policy drew them
])
def test_one_step_per_collected_sample_trains_older_samples(tmp_path, collect, sample, stale):
    """The ratio to the log-probs recomputed before each step is 1, but each step after the first is taken on a sample
    drawn before the earlier steps (row 22, KL008 on k3 as a loss): the helper is followed through `Cls.method(self,
    ...)`, and a device manager's `step(optimizer, ...)` is the optimizer's step."""
    (tmp_path / "rlhf.py").write_text(TREE.format(collect=collect, sample=sample))
    codes = [code for code, _ in _found(tmp_path)]
    assert codes == (["KL002", "KL007", "KL008"] if stale else ["KL002", "KL007"])
