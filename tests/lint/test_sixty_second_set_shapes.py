"""Shapes of code met in the sixty-second blind set that the lint misread.

- safe-rlhf's DPO trainer (UMass-SCALAR-Lab/HC-RLHF, YuxiXie/MCTS-DPO) names the sides of its preference pair
  `better` and `worse`: `better_log_ratio = better_log_prob - ref_better_log_prob` is DPO's implicit reward, returned
  for logging beside the logsigmoid loss, not a KL estimate of samples, and no reward with a bonus's sign (KL011).
- safe-rlhf's `masked_mean(x, mask)` (in a utilities module with no KL words, which the analysis reads by name) has
  no axis parameter: `((x * mask).sum(dim=-1) / mask.sum(dim=-1)).mean()` divides each response by its own length,
  so the PPO loss weights the k1 reward's return by 1/L (kl-math.md section 8, row 21, KL007). It was read as verl's
  batch token mean (fresh9, fresh28 and fresh62 each recorded the miss).
- yosa97/AgulText's SFT trainer adds the exact KL(fine-tuned || base) over the vocabulary at the dataset's labelled
  positions: on teacher-forced sequences no later-token term is missing (KL003's "when this is fine"). Its module
  fixes the model's generation config before saving it, and that word was read as sampling.
- PolarisLiu1/LAT's edited copy of TRL's GRPO trainer keeps TRL's fallback, `if args is None: args =
  GRPOConfig(f"{model_name}-GRPO")`: no configuration of a run (its launch passes the arguments), and the copy's own
  k3 loss is reported where it is written. The fallback was judged as a configuration at the release's defaults.
"""

from __future__ import annotations

import pytest

from klaudit.lint import roles
from klaudit.lint.engine import lint_paths

# safe-rlhf's DPOTrainer.loss, reduced: the log-probs come from a helper of another module, as in the project
GATHER = """\
import torch


def gather_log_probabilities(logits, labels):
    return torch.gather(logits.log_softmax(-1), -1, labels.unsqueeze(-1)).squeeze(-1)
"""
DPO = """\
import torch
import torch.nn.functional as F

from utils import gather_log_probabilities


class DPOTrainer:
    def compute_log_probs(self, model, input_ids, attention_mask):
        logits = model(input_ids, attention_mask=attention_mask).logits
        return gather_log_probabilities(logits[:, :-1], input_ids[:, 1:])

    def loss(self, better_input_ids, better_attention_mask, worse_input_ids, worse_attention_mask):
        better_sequence_log_probs = self.compute_log_probs(self.model, better_input_ids, better_attention_mask)
        worse_sequence_log_probs = self.compute_log_probs(self.model, worse_input_ids, worse_attention_mask)
        with torch.no_grad():
            ref_better_sequence_log_probs = self.compute_log_probs(self.reference_model, better_input_ids,
                                                                   better_attention_mask)
            ref_worse_sequence_log_probs = self.compute_log_probs(self.reference_model, worse_input_ids,
                                                                  worse_attention_mask)
        losses, better_sample_rewards, worse_sample_rewards = [], [], []
        for i in range(better_input_ids.size(0)):
            better_log_prob = better_sequence_log_probs[i].sum(dim=-1)
            worse_log_prob = worse_sequence_log_probs[i].sum(dim=-1)
            ref_better_log_prob = ref_better_sequence_log_probs[i].sum(dim=-1)
            ref_worse_log_prob = ref_worse_sequence_log_probs[i].sum(dim=-1)
            better_log_ratio = better_log_prob - ref_better_log_prob
            worse_log_ratio = worse_log_prob - ref_worse_log_prob
            losses.append(-F.logsigmoid(self.scale_coeff * (better_log_ratio - worse_log_ratio)))
            better_sample_rewards.append(self.scale_coeff * better_log_ratio.detach())
            worse_sample_rewards.append(self.scale_coeff * worse_log_ratio.detach())
        loss = torch.stack(losses).mean()
        better_sample_reward = torch.stack(better_sample_rewards)
        worse_sample_reward = torch.stack(worse_sample_rewards)
        return {"loss": loss, "reward": better_sample_reward + worse_sample_reward,
                "reward_margin": better_sample_reward - worse_sample_reward}

    def train_step(self, **batch):
        loss_dict = self.loss(**batch)
        self.model.backward(loss_dict["loss"])
        self.model.step()
        with torch.no_grad():
            reward = loss_dict["reward"].mean()
        return {"train/loss": loss_dict["loss"].item(), "train/reward": reward.item()}
"""


def test_safe_rlhfs_dpo_implicit_reward_is_no_kl_bonus(tmp_path):
    (tmp_path / "utils.py").write_text(GATHER)
    (tmp_path / "dpo.py").write_text(DPO)
    assert [(f.line, f.code) for f in lint_paths([str(tmp_path)], jobs=1).findings] == []


@pytest.mark.parametrize("name, pair", [
    ("better_log_prob", True), ("ref_worse_sequence_log_probs", True), ("preferred_logps", True),
    ("better_ids", False), ("worse", False),
    ("log_probs_policy_winner", False),  # the best of the policy's samples (fresh52's wordle-GRPO-modal): a sample
])
def test_better_and_worse_name_a_preference_pairs_sides(name, pair):
    assert roles.names_pair_logprobs(name) is pair


MASKED_MEAN = """\
import torch


def masked_mean(x, mask=None):
    if mask is None:
        return x.mean()
    return {reduction}
"""
PPO_STEP = """\
import torch

from utils import masked_mean


def rl_step(policy, ids, mask, old_log_probs, ref_log_probs, scores, optimizer, kl_coeff):
    with torch.no_grad():
        rewards = -kl_coeff * (old_log_probs - ref_log_probs)
        rewards[:, -1] += scores
        returns = rewards.flip(-1).cumsum(-1).flip(-1)
    log_probs = policy(ids).logits.log_softmax(-1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    loss = -masked_mean(torch.exp(log_probs - old_log_probs) * returns, mask)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""


@pytest.mark.parametrize("reduction, per_response", [
    ("((x * mask).sum(dim=-1) / mask.sum(dim=-1)).mean()", True),  # safe-rlhf's
    ("((x * mask).sum(-1) / mask.sum(-1).clamp(min=1)).mean()", True),
    ("(x * mask).sum() / mask.sum()", False),  # every token of the batch
    ("(x * mask).sum(-1).sum() / mask.sum()", False),  # rows summed, then over the batch's tokens
])
def test_an_imported_masked_mean_without_an_axis_is_read_from_its_body(tmp_path, reduction, per_response):
    (tmp_path / "utils.py").write_text(MASKED_MEAN.format(reduction=reduction))
    (tmp_path / "trainer.py").write_text(PPO_STEP)
    codes = {f.code for f in lint_paths([str(tmp_path)], jobs=1).findings}
    assert ("KL007" in codes) is per_response


def test_a_masked_mean_with_an_axis_parameter_keeps_its_default(tmp_path):
    """verl's `masked_mean(values, mask, axis=None)`: the whole batch's tokens, whatever its body sums."""
    helper = "def masked_mean(values, mask, axis=None):\n    return (values * mask).sum(axis=axis) / mask.sum(axis=axis)\n"
    (tmp_path / "utils.py").write_text(helper)
    (tmp_path / "trainer.py").write_text(PPO_STEP)
    assert "KL007" not in {f.code for f in lint_paths([str(tmp_path)], jobs=1).findings}


SFT = """\
import torch
import torch.nn.functional as F
from transformers import Trainer

from helpers import set_generation_config


class KLTrainer(Trainer):
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        input_ids, labels = inputs["input_ids"], inputs["labels"]
        logits = model(input_ids=input_ids, attention_mask=inputs["attention_mask"]).logits
        ce_loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)), labels[:, 1:].reshape(-1))
        mask = labels != -100
        with torch.no_grad():
            base_logits = self.base_model(input_ids=input_ids).logits
        log_ft = F.log_softmax(logits[mask].float(), dim=-1)
        log_base = F.log_softmax(base_logits[mask].float(), dim=-1)
        kl_loss = F.kl_div(log_base, log_ft, reduction="none", log_target=True).sum(dim=-1).mean()
        return ce_loss + self.kl_coef * kl_loss


def main(model, dataset, args):
    {configure}
    KLTrainer(model=model, args=args, train_dataset=dataset).train()
"""


@pytest.mark.parametrize("configure, expected", [
    ("set_generation_config(model)", []),  # a saved model's config: no sampling, the sequences are the dataset's
    ("model.generation_config.pad_token_id = model.config.eos_token_id", []),
    ("dataset = dataset.map(lambda row: {'input_ids': model.generate(row['prompt'])})", ["KL003"]),  # samples
])
def test_an_sft_kl_to_the_base_model_on_labelled_positions(tmp_path, configure, expected):
    (tmp_path / "sft.py").write_text(SFT.format(configure=configure))
    assert [f.code for f in lint_paths([str(tmp_path)], jobs=1).findings] == expected


TRAINER_COPY = """\
import torch
from trl import GRPOConfig


class Qwen2VLGRPOTrainer:
    def __init__(self, model, args=None):
        if args is None:
            model_name = model.split("/")[-1]
            args = GRPOConfig(f"{model_name}-GRPO")
        self.args = args
        self.beta = args.beta

    def compute_loss(self, model, inputs):
        per_token_logps = model(inputs["input_ids"]).logits.log_softmax(-1).gather(
            -1, inputs["completion_ids"].unsqueeze(-1)).squeeze(-1)
        ref = inputs["ref_per_token_logps"]
        per_token_kl = torch.exp(ref - per_token_logps) - (ref - per_token_logps) - 1
        advantages = inputs["advantages"]
        per_token_loss = -(torch.exp(per_token_logps - per_token_logps.detach()) * advantages.unsqueeze(1))
        per_token_loss = per_token_loss + self.beta * per_token_kl
        mask = inputs["completion_mask"]
        return ((per_token_loss * mask).sum(dim=1) / mask.sum(dim=1)).mean()
"""


@pytest.mark.parametrize("name", [
    "Qwen2VLGRPOTrainer",
    "SGRLVRTrainer",  # OuyangKun10/SpaceR (fresh90): a copy named for its method, its `args` still a GRPOConfig
])
def test_a_trainer_copys_fallback_configuration_is_no_run(tmp_path, name):
    (tmp_path / "requirements.txt").write_text("trl==0.14.0\n")
    (tmp_path / "grpo_trainer.py").write_text(TRAINER_COPY.replace("Qwen2VLGRPOTrainer", name))
    found = sorted((f.line, f.code) for f in lint_paths([str(tmp_path)], jobs=1).findings)
    assert found == [(20, "KL002"), (20, "KL007")]
