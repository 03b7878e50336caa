"""Shapes of code met in the fiftieth blind set that the lint misread: log-probs summed over one sequence, collected
in a list one response at a time and stacked (one value per sequence, whatever the list's name says), and a
completion's mean log-prob set against the reference's values cached one per completion."""

from __future__ import annotations

import pytest

from klaudit.lint.engine import lint_paths

# vimarshsub/simple_rlhf's reinforce_trainer.py, reduced: REINFORCE with one prompt encoded at a time, each response's
# log-probs summed into one value, the sequence-level k1 detached in the whole-sequence return (row 6: right).
REINFORCE = """\
import torch
import torch.nn.functional as F


def train(model, reference_model, tokenizer, prompts, compute_reward, optimizer, kl_coef):
    {lists}
    for prompt in prompts:
        prompt_tokens = tokenizer(prompt, return_tensors="pt")
        outputs = model.generate(input_ids=prompt_tokens.input_ids, do_sample=True)
        response_text = tokenizer.decode(outputs[0])
        reward = compute_reward(response_text)
        full_text = prompt + response_text
        full_tokens = tokenizer(full_text, return_tensors="pt")
        logits = model(input_ids=full_tokens.input_ids).logits
        with torch.no_grad():
            ref_logits = reference_model(input_ids=full_tokens.input_ids).logits
        n = prompt_tokens.input_ids.shape[1]
        ids = full_tokens.input_ids[:, n:]
        token_log_probs = F.log_softmax(logits[:, n - 1:-1], dim=-1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
        token_ref_log_probs = F.log_softmax(ref_logits[:, n - 1:-1], dim=-1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
        batch_log_probs.append(token_log_probs.{reduce}())
        batch_ref_log_probs.append(token_ref_log_probs.{reduce}())
        batch_rewards.append(reward)
    batch_log_probs = torch.stack(batch_log_probs)
    batch_ref_log_probs = torch.stack(batch_ref_log_probs)
    kl_div = batch_log_probs - batch_ref_log_probs
    advantages = torch.tensor(batch_rewards) - kl_coef * kl_div.detach()
    policy_loss = -(batch_log_probs * advantages).mean()
    optimizer.zero_grad()
    policy_loss.backward()
    optimizer.step()
"""

ONE_LINE = "batch_log_probs, batch_ref_log_probs, batch_rewards = [], [], []"
LINE_EACH = "batch_log_probs = []\n    batch_ref_log_probs = list()\n    batch_rewards = []"


def _found(tmp_path, source):
    (tmp_path / "train.py").write_text(source)
    result = lint_paths([str(tmp_path)], jobs=1)
    assert result.errors == []
    return sorted({(finding.code, finding.line) for finding in result.findings})


@pytest.mark.parametrize("lists", [ONE_LINE, LINE_EACH])
def test_sequence_sums_collected_one_response_at_a_time_are_a_whole_sequence_return(tmp_path, lists):
    # sum_t logp_t of each response, stacked: the detached k1 of whole sequences times the sequence's score (row 6)
    assert _found(tmp_path, REINFORCE.format(lists=lists, reduce="sum")) == []


def test_sequence_means_collected_one_response_at_a_time_weigh_by_length(tmp_path):
    # the same with each response's mean log-prob: the KL part is beta (1/L^2) D s(y), lengths vary (row 21)
    assert _found(tmp_path, REINFORCE.format(lists=LINE_EACH, reduce="mean")) == [("KL007", 29)]


# zekai00/EviTool-VL's train_browser_rl_onpolicy_grpo.py, reduced: each completion scored alone (the processor is
# handed a list of its one text), its mean log-prob set against the reference's and the rollout's values cached one
# per completion, the groups drawn once and trained for several epochs.
GROUP_STEP = """\
import torch
import torch.nn.functional as F


def completion_logprob(model, processor, prompt, completion):
    full_text = prompt + completion
    prompt_inputs = processor(text=[prompt], return_tensors="pt")
    full_inputs = processor(text=[full_text], return_tensors="pt")
    labels = full_inputs.input_ids.clone()
    labels[:, :prompt_inputs.input_ids.shape[1]] = -100
    logits = model(**full_inputs).logits
    shift_labels = labels[:, 1:]
    mask = shift_labels != -100
    safe_labels = shift_labels.masked_fill(~mask, 0)
    token_logps = F.log_softmax(logits[:, :-1, :], dim=-1).gather(-1, safe_labels.unsqueeze(-1)).squeeze(-1)
    total = (token_logps * mask).sum()
    return {completion_value}


def cached(group, key):
    return torch.tensor([float(sample[key]) for sample in group["samples"]])


def group_loss(model, processor, group, beta):
    rewards = torch.tensor([sample["reward"] for sample in group["samples"]])
    advantages = (rewards - rewards.mean()) / rewards.std().clamp_min(1e-8)
    logps = []
    for sample in group["samples"]:
        logps.append(completion_logprob(model, processor, group["prompt"], sample["completion"]))
    logp_tensor = torch.stack(logps)
    old_logps = cached(group, "old_logprob")
    ref_logps = cached(group, "ref_logprob")
    ratio = torch.exp(logp_tensor - old_logps)
    policy_loss = -torch.minimum(ratio * advantages, ratio.clamp(0.8, 1.2) * advantages).mean()
    approx_kl = 0.5 * ((logp_tensor - ref_logps) ** 2).mean()
    return policy_loss + beta * approx_kl


def train(model, processor, groups, optimizer, epochs, beta):
    for _ in range(epochs):
        for group in groups:
            loss = group_loss(model, processor, group, beta)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
"""


@pytest.mark.parametrize("completion_value, expected", [
    # 0.5 (D / L)^2 of each completion: a sequence-level k2 on stale samples (row 22), weighted by 1/L^2 (row 21)
    ("total / mask.sum()", [("KL007", 36), ("KL008", 36)]),
    # 0.5 D^2: the sequence-level k2 with no length weight, still on stale samples
    ("total", [("KL008", 36)]),
])
def test_a_completions_log_prob_against_values_cached_one_per_completion(tmp_path, completion_value, expected):
    # not per-token k2 (KL003): the reference's cached values are one per completion, as the policy's are
    assert _found(tmp_path, GROUP_STEP.format(completion_value=completion_value)) == expected


# judgeyjj/RLHF's src/algorithms/ppo.py, reduced: a GAE whose running sum is stored in the same statement that
# carries it (`advantages[t] = last_gae = ...`), over per-token rewards that hold the KL penalty.
GAE = """\
import torch


def compute_advantages(values, rewards, gamma=0.99, lam=0.95):
    advantages = torch.zeros_like(rewards)
    last_gae = 0.0
    for t in reversed(range(len(rewards))):
        next_value = values[t + 1] if t + 1 < len(values) else 0.0
        delta = rewards[t] + gamma * next_value - values[t]
        {carry}
    return advantages


def step(policy, ref, batch, values, optimizer, beta):
    logprobs = policy(batch)
    with torch.no_grad():
        ref_logprobs = ref(batch)
    old_logprobs = logprobs.detach()
    log_ratio = (logprobs - ref_logprobs).detach()
    rewards = batch["scores"] - beta * {penalty}
    advantages = compute_advantages(values, rewards)
    ratio = torch.exp(logprobs - old_logprobs)
    loss = -(ratio * advantages).sum() / 100
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""

CHAINED = "advantages[t] = last_gae = delta + gamma * lam * last_gae"
SPELT_OUT = "last_gae = delta + gamma * lam * last_gae\n        advantages[t] = last_gae"


@pytest.mark.parametrize("carry", [CHAINED, SPELT_OUT])
@pytest.mark.parametrize("penalty, expected", [
    # a detached k1 summed into each earlier token's advantage: the reward-to-go, right (row 5), not KL003
    ("log_ratio", []),
    # k3 values in that reward-to-go: grad REV - PFWD (row 7), reported where the reward is made
    ("(torch.exp(-log_ratio) - 1 + log_ratio)", ["KL004"]),
])
def test_a_gae_carried_in_a_chained_assignment_is_a_reward_to_go(tmp_path, carry, penalty, expected):
    source = GAE.format(carry=carry, penalty=penalty)
    reward_line = next(number for number, line in enumerate(source.splitlines(), 1) if "rewards = batch" in line)
    assert _found(tmp_path, source) == [(code, reward_line) for code in expected]


# CRhapsody/RL-posttrain-tutorial's src-2/algorithms/grpo.py, reduced: the step recomputes the policy's log-probs
# for its PPO ratio, but forms the KL of the rollout's stored log-probs.
STORED_KL = """\
import torch


class GRPO:
    def compute_loss(self, batch, old_log_probs):
        new_log_probs = self.policy.forward(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
        adv = batch.advantages[:, 1:]
        response_mask = batch.labels_mask[:, 1:].float()
        ratio = torch.exp(new_log_probs - old_log_probs)
        policy_loss = -torch.min(ratio * adv, torch.clamp(ratio, 0.8, 1.2) * adv)
        policy_loss = (policy_loss * response_mask).sum() / response_mask.sum()
        kl = {policy_side} - batch.ref_log_probs
        kl_loss = (kl * response_mask).sum() / response_mask.sum()
        total_loss = policy_loss + self.kl_coef * kl_loss
        return total_loss

    def update(self, batch, optimizer):
        with torch.no_grad():
            old = self.policy.forward(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
        loss = self.compute_loss(batch, old)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
"""


@pytest.mark.parametrize("policy_side, expected", [
    # the rollout's log-probs beside the live ones: a KL with no gradient at all (row 1c)
    ("batch.log_probs", [("KL001", 13)]),
    ("old_log_probs", [("KL001", 13)]),
    # the live log-probs: k1 differentiated as a loss (row 1), on samples the ratio says are older (row 22)
    ("new_log_probs", [("KL001", 13), ("KL008", 13)]),
])
def test_a_kl_of_the_stored_log_probs_beside_the_live_ones_has_no_gradient(tmp_path, policy_side, expected):
    assert _found(tmp_path, STORED_KL.format(policy_side=policy_side)) == expected


def test_a_kl_of_stored_log_probs_alone_in_the_loss_is_not_judged(tmp_path):
    # no live log-probs in the step: the batch's log-probs may hold a gradient the analysis does not see
    source = STORED_KL.replace("ratio = torch.exp(new_log_probs - old_log_probs)", "ratio = batch.weights")
    assert _found(tmp_path, source.format(policy_side="batch.log_probs")) == []


# yuanyunchen/SLM-Math's models/train_rl_base.py, reduced: a helper scores each response under no_grad and returns
# the stacked mean log-probs (to the policy's through a wrapper, which reads them as the rollout's); the policy's and
# the reference's are subtracted and the KL added to a REINFORCE loss spelt as a reward-weighted cross-entropy (a
# loss module the analysis does not follow).
NO_GRAD_HELPER = """\
import torch
import torch.nn.functional as F


class Trainer:
    def log_probs(self, inputs, model):
        {guard}
            outputs = model(**inputs)
            logits = outputs.logits
        values = []
        for i in range(inputs["input_ids"].shape[0]):
            response_logits = logits[i, :-1, :]
            log_probs = F.log_softmax(response_logits, dim=-1)
            selected = log_probs.gather(dim=-1, index=inputs["input_ids"][i, 1:].unsqueeze(-1)).squeeze(-1)
            mean_log_prob = selected.mean()
            values.append(mean_log_prob)
        return torch.stack(values)

    def policy_log_probs(self, inputs):
        return self.log_probs(inputs, self.model)

    def kl_penalty(self, inputs):
        policy_log_probs = self.policy_log_probs(inputs)
        ref_log_probs = self.log_probs(inputs, self.ref_model)
        kl = policy_log_probs - ref_log_probs
        return kl.mean()

    def train_step(self, inputs, rewards):
        kl_penalty = self.kl_penalty(inputs)
        outputs = self.model(**inputs, labels=inputs["labels"])
        loss_fct = torch.nn.CrossEntropyLoss(reduction="none")
        per_token = loss_fct(outputs.logits.transpose(1, 2), inputs["labels"])
        loss = (per_token.mean(dim=1) * rewards).mean() + self.beta * kl_penalty
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
"""


def test_a_kl_of_log_probs_a_helper_took_under_no_grad_has_no_gradient(tmp_path):
    # the policy's log-probs of the helper hold no gradient: the KL added to the loss is a constant (row 1c)
    found = _found(tmp_path, NO_GRAD_HELPER.format(guard="with torch.no_grad():"))
    assert [code for code, _ in found] == ["KL001"]
    reported = NO_GRAD_HELPER.format(guard="with torch.no_grad():").splitlines()[found[0][1] - 1]
    assert "kl_penalty" in reported


# NeuralPensieve/llm-textgame-rl's trainer/ppo_updater.py with models/llm_policy.py, reduced: the policy class's KL
# helper, which the updater calls on the object it holds.
POLICY_MODULE = """\
import torch


class LLMPolicy:
    def compute_kl_divergence(self, current_logprobs, reference_logprobs):
        kl_div = ({weight} * (current_logprobs - reference_logprobs)).sum()
        return kl_div / len(current_logprobs)
"""

UPDATER_MODULE = """\
import torch

from models.llm_policy import LLMPolicy


class PPOUpdater:
    def __init__(self, policy: LLMPolicy, kl_coef):
        self.policy = policy
        self.kl_coef = kl_coef

    def update(self, batch, optimizer):
        current_logprobs = self.policy.evaluate_tokens(batch["states"], batch["tokens"])
        with torch.no_grad():
            reference_logprobs = self.policy.reference_logprobs(batch["states"], batch["tokens"])
        kl_div = self.policy.compute_kl_divergence(current_logprobs, reference_logprobs)
        loss = -(current_logprobs * batch["advantages"]).mean() + self.kl_coef * kl_div
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
"""


def test_a_kl_helper_of_the_policy_class_called_on_the_object_held(tmp_path):
    # the plain log-ratio of the helper, differentiated: k1 as a loss (row 1), found through the call on the held
    # object. (pi(y) * delta(y), the helper as the repository writes it, is row 5c, but the lint does not report it:
    # log-probs read by their names may be the vocabulary's, where the same product is the exact KL's summand.)
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "__init__.py").write_text("")
    (tmp_path / "models" / "llm_policy.py").write_text(POLICY_MODULE.format(weight="1.0"))
    (tmp_path / "updater.py").write_text(UPDATER_MODULE)
    result = lint_paths([str(tmp_path)], jobs=1)
    assert result.errors == []
    assert sorted({(finding.code, finding.path.rsplit("/", 1)[-1], finding.line) for finding in result.findings}) \
        == [("KL001", "updater.py", 16)]


# sanketsans/rlvr's rl/trainer.py, reduced (fresh22): a GRPO loss helper in its own module, called in a loop of
# `cfg.grpo_epochs` passes over one rollout; the trainer's dataclass defaults the count to 1, the run's YAML sets 4.
GRPO_HELPER = """\
import torch


def compute_policy_loss(logp, old_logp, ref_logp, advantages, mask, kl_coef):
    ratio = torch.exp(logp - old_logp)
    pg = -torch.min(ratio * advantages, ratio.clamp(0.8, 1.2) * advantages)
    delta = ref_logp - logp
    kl = torch.exp(delta) - delta - 1
    return ((pg + kl_coef * kl) * mask).sum() / mask.numel()
"""

GRPO_TRAINER = """\
from dataclasses import dataclass

import torch

from grpo import compute_policy_loss


@dataclass
class TrainerConfig:
    grpo_epochs: int = 1
    kl_coef: float = 0.04


class GRPOTrainer:
    def train(self, cfg: TrainerConfig):
        for step in range(100):
            batch = self.rollout()
            with torch.no_grad():
                old_logp = self.policy.logprobs(batch)
                ref_logp = self.reference.logprobs(batch)
            for epoch_idx in range(cfg.grpo_epochs):
                logp = self.policy.logprobs(batch)
                loss = compute_policy_loss(logp, old_logp, ref_logp, batch.advantages, batch.mask, cfg.kl_coef)
                self.optimizer.zero_grad()
                loss.backward()
                self.optimizer.step()
"""


@pytest.mark.parametrize("epochs, expected", [
    # four passes over each rollout: every pass after the first takes the k3 loss on older samples (row 22)
    ("4", ["KL002", "KL008"]),
    # the YAML agrees with the default: one pass, on-policy k3 as a loss (row 3)
    ("1", ["KL002"]),
])
def test_a_loop_count_the_dataclass_defaults_to_one_and_the_yaml_sets(tmp_path, epochs, expected):
    (tmp_path / "grpo.py").write_text(GRPO_HELPER)
    (tmp_path / "trainer.py").write_text(GRPO_TRAINER)
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "run.yaml").write_text(f"model: qwen\ntrainer:\n  grpo_epochs: {epochs}\n  kl_coef: 0.04\n")
    result = lint_paths([str(tmp_path)], jobs=1)
    assert result.errors == []
    assert sorted({finding.code for finding in result.findings if finding.path.endswith("grpo.py")}) == expected
