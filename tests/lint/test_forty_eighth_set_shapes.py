"""Shapes of code met in the forty-eighth blind set that the lint misread: a PPO ratio taken to the reference,
weighted by advantages the analysis cannot explain, beside a k1 term under a coefficient read from a config."""

from __future__ import annotations

import pytest

from klaudit.lint.engine import lint_paths

# notnick2/minialign-rlhf-pipeline's training/grpo_trainer.py, reduced: the surrogate's ratio is exp(logp - ref)
# (misnamed, against the reference) and only multiplies the advantages; the one KL term is k1 of the sequence.
LOSS = """\
import torch


def grpo_loss(logprobs, advantages, ref_logprobs, beta=0.1, epsilon=0.2):
    ratio = torch.exp(logprobs - ref_logprobs)
    clipped_ratio = torch.clamp(ratio, 1.0 - epsilon, 1.0 + epsilon)
    policy_loss = -torch.min(ratio * advantages, clipped_ratio * advantages).mean()
    kl_penalty = beta * (logprobs - ref_logprobs).mean()
    return policy_loss + kl_penalty


def train(policy, ref_model, prompts, optimizer, cfg, score):
    beta = {beta}
    rewards = torch.tensor([[score(p) for _ in range(4)] for p in prompts])
    advantages = {advantages}
    logprobs = policy(prompts).log_softmax(-1).sum(-1)
    with torch.no_grad():
        ref_logprobs = ref_model(prompts).log_softmax(-1).sum(-1)
    advantages_flat = advantages.view(-1)
    loss = grpo_loss(logprobs, advantages_flat, ref_logprobs, beta)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""


def _codes(root):
    result = lint_paths([str(root)], jobs=1)
    assert result.errors == []
    return sorted(finding.code for finding in result.findings)


@pytest.mark.parametrize("beta", ['cfg.get("beta", 0.1)', "cfg.beta", "0.1"])
@pytest.mark.parametrize("advantages", ["(rewards - rewards.mean(1, keepdim=True)) / rewards.std(1, keepdim=True)",
                                        "torch.randn(4)"])
def test_a_ratio_to_the_reference_times_advantages_is_no_kl_term(tmp_path, beta, advantages):
    """ratio * A is the policy-gradient part, whatever the coefficient of the k1 beside it: no reversed k3
    (exp(d) - 1 - d) is assembled from -ratio * A + beta * d, only the k1 loss (row 1, KL001)."""
    (tmp_path / "grpo.py").write_text(LOSS.format(beta=beta, advantages=advantages))
    assert _codes(tmp_path) == ["KL001"]


def test_the_reversed_k3_it_could_be_mistaken_for_is_still_found(tmp_path):
    """The same loss with the ratio minus one minus the log-ratio, no advantage in it, is k3 reversed (KL009)."""
    source = LOSS.format(beta='cfg.get("beta", 0.1)', advantages="torch.randn(4)").replace(
        "    kl_penalty = beta * (logprobs - ref_logprobs).mean()\n",
        "    kl_penalty = beta * (ratio - 1 - (logprobs - ref_logprobs)).mean()\n")
    (tmp_path / "grpo.py").write_text(source)
    assert "KL009" in _codes(tmp_path)


# VectorInstitute/vec-playbook's grpo_backend.py, reduced: the reference's and the behaviour policy's probabilities of
# the sampled tokens come in as probabilities (`taken_prob_ref`), their logs are taken in the loss, and the policy's
# log-probs come from next-token logits (`logits_next`).
TAKEN_PROBABILITIES = """\
import torch
from torch.nn.functional import log_softmax


def compute_grpo_loss(*, logits_next, target_token_ids, valid_token_mask, {old}, {ref}, advantage_per_token,
                      kl_coefficient, eps=1e-12):
    log_prob_all = log_softmax(logits_next, dim=-1)
    log_prob_taken_current = torch.gather(log_prob_all, dim=-1, index=target_token_ids.unsqueeze(-1)).squeeze(-1)
    log_prob_taken_old = torch.log({old}.clamp(min=eps))
    log_prob_taken_ref = torch.log({ref}.clamp(min=eps))
    ratio_current_over_old = torch.exp(log_prob_taken_current - log_prob_taken_old)
    log_ratio_ref_over_current = log_prob_taken_ref - log_prob_taken_current
    kl_scalar_taken = torch.exp(log_ratio_ref_over_current) - log_ratio_ref_over_current - 1.0
    token_objective = ratio_current_over_old * advantage_per_token - kl_coefficient * kl_scalar_taken
    token_objective = token_objective * valid_token_mask.float()
    per_rollout_mean = token_objective.sum(dim=1) / torch.clamp(valid_token_mask.sum(dim=1), min=1)
    return -per_rollout_mean.mean()
"""


@pytest.mark.parametrize("old, ref", [("taken_prob_old", "taken_prob_ref"), ("old_token_probs", "ref_token_probs"),
                                      ("action_prob_old", "action_prob_ref")])
def test_the_probabilities_of_the_sampled_tokens_are_read_by_their_names(tmp_path, old, ref):
    """log(ref's probability of the taken token) is its log-prob: k3 = ref/pi - log(ref/pi) - 1 as a loss (row 3,
    KL002), each rollout's own token mean (row 21, KL007), beside a ratio to the behaviour policy (KL008)."""
    (tmp_path / "grpo_backend.py").write_text(TAKEN_PROBABILITIES.format(old=old, ref=ref))
    assert _codes(tmp_path) == ["KL002", "KL007", "KL008"]


def test_vocabulary_probabilities_are_no_sampled_token_probability(tmp_path):
    """`ref_probs` names no sampled token: nothing is assumed of it, so no KL term is made up from its log."""
    source = TAKEN_PROBABILITIES.format(old="old_probs", ref="ref_probs")
    (tmp_path / "grpo_backend.py").write_text(source)
    assert _codes(tmp_path) == []


# notnick2/minialign-rlhf-pipeline's training/ppo_trainer.py, reduced: the first TRL PPOTrainer's configuration, its
# values read from a YAML file with the code's defaults, the file nesting its keys where the reads do not look.
LEGACY_PPO = """\
import yaml
from trl import PPOConfig, PPOTrainer


def train_ppo(config_path, model, ref_model, tokenizer):
    cfg = yaml.safe_load(open(config_path))
    batch_size = cfg.get("batch_size", 8)
    mini_batch_size = cfg.get("mini_batch_size", {mini})
    ppo_epochs = cfg.get("ppo_epochs", {epochs})
    kl_coef = cfg.get("kl_coef", 0.2)
    config = PPOConfig(model_name="m", batch_size=batch_size, mini_batch_size=mini_batch_size,
                       ppo_epochs=ppo_epochs, kl_penalty="kl", init_kl_coef=kl_coef, adap_kl_ctrl=True)
    return PPOTrainer(config=config, model=model, ref_model=ref_model, tokenizer=tokenizer)
"""


@pytest.mark.parametrize("epochs, mini, yaml, expected", [
    (4, 4, "training:\n  ppo_epochs: 4\n  mini_batch_size: 1\n", ["KL008"]),  # at least 4 steps per batch
    (4, 4, None, ["KL008"]),  # 4 x 8 / 4 = 8 steps per batch
    (1, 4, None, ["KL008"]),  # 1 x 8 / 4 = 2
    (1, 8, None, []),  # one step per batch of 8: k1 in the reward on fresh samples (row 6)
    (4, 4, "ppo_epochs: 1\n", []),  # the YAML may set another value: undecided, so no verdict
])
def test_a_legacy_ppo_configuration_is_judged_at_the_defaults_its_reads_give(tmp_path, epochs, mini, yaml, expected):
    """TRL's first PPOTrainer trains the k1 reward of a batch over ppo_epochs x batch / mini-batch optimizer steps:
    from the second on, on an older policy's samples (row 23, KL008), at the defaults the configuration reads give."""
    (tmp_path / "ppo_trainer.py").write_text(LEGACY_PPO.format(epochs=epochs, mini=mini))
    if yaml is not None:
        (tmp_path / "ppo_config.yaml").write_text(yaml)
    assert _codes(tmp_path) == expected
