"""Shapes of KL code met in the hundred-and-second fresh set.

Mantissagithub/alphazero_llm_trainer encodes one trajectory's text at a time inside a loop (`inputs =
tokenizer(text, return_tensors="pt")`, a batch of one) and takes `F.kl_div(..., reduction="batchmean")` of its
[1, L, V] log-probs: divided by the batch dimension, 1, that is the sequence's token sum, not its token mean. The
batch of one was read only where the whole function encodes one text, so a loop that does gave a false KL007.

SuryanshSS1011/basic-rl-feedback-workflow's helper returns a dummy pair on a failure path and the policy's and the
reference's log-probs otherwise; the PPO update adds each sample's loss to `batch_loss` in a loop. Joining the
branches paired one sample's policy log-probs with another's reference log-probs in `batch_loss + sample_loss`, a
"log-ratio" of two losses, and the one KL term was reported a second time there.

xcrhzbk/any_po's loss helpers take `ref_log_probs` and call `backward()` themselves; its trainer, in another module,
hands them `ref_log_probs = old_log_probs`, the rollout policy's log-probs taken before the PPO epochs (a splatted
dict of keyword arguments beside): a trust region to the policy that drew the samples, outside the table of a KL
to a reference. Each helper was judged by its parameters' names alone, as a reversed k3 (and k1, k2) to the
reference.
"""

from __future__ import annotations

import pytest
from snippets import module_codes

LOOP_OVER_TEXTS = """\
import torch
import torch.nn.functional as F


def train_step(model, ref_model, tokenizer, optimizer, trajectories, advantages, kl_weight):
    total_loss = 0.0
    for traj, advantage in zip(trajectories, advantages):
        inputs = tokenizer(traj["text"], return_tensors="pt")
        logits = model(**inputs).logits[:, :-1, :]
        log_probs = F.log_softmax(logits, dim=-1)
        ids = inputs["input_ids"][:, 1:]
        pg_loss = -(log_probs.gather(-1, ids.unsqueeze(-1)).squeeze(-1).mean() * advantage)
        with torch.no_grad():
            ref_log_probs = F.log_softmax(ref_model(**inputs).logits[:, :-1, :], dim=-1)
        kl = F.kl_div(ref_log_probs, log_probs, reduction="{reduction}", log_target=True)
        total_loss = total_loss + pg_loss + kl_weight * kl
    total_loss.backward()
    optimizer.step()
"""


@pytest.mark.parametrize("reduction, codes", [
    ("batchmean", [(16, "KL003")]),  # the exact KL as a loss (row 2), each text's [1, L, V] divided by 1: a token sum
    ("mean", [(16, "KL003"), (16, "KL007")]),  # divided by L * V: each text's token mean, 1/L (row 21)
])
def test_batchmean_of_a_text_a_loop_encodes_is_a_token_sum(tmp_path, reduction, codes):
    assert module_codes(LOOP_OVER_TEXTS.format(reduction=reduction), tmp_path) == codes


ACCUMULATED_SAMPLE_LOSSES = """\
import torch
import torch.nn.functional as F


class PolicyModel:
    def __init__(self, model, ref_model, tokenizer):
        self.model, self.ref_model, self.tokenizer = model, ref_model, tokenizer

    def compute_log_probs(self, prompt, completion):
        inputs = self.tokenizer(prompt + completion, return_tensors="pt")
        prompt_len = self.tokenizer(prompt, return_tensors="pt")["input_ids"].shape[1]
        if prompt_len >= inputs["input_ids"].shape[1]:
            dummy = torch.tensor([[-10.0]], requires_grad=True)
            dummy_ref = torch.tensor([[-10.0]])
            return dummy, dummy_ref
        ids = inputs["input_ids"][:, prompt_len:]
        logits = self.model(**inputs).logits[:, prompt_len - 1:-1, :]
        policy = F.log_softmax(logits, dim=-1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
        with torch.no_grad():
            ref_logits = self.ref_model(**inputs).logits[:, prompt_len - 1:-1, :]
            ref = F.log_softmax(ref_logits, dim=-1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
        return policy, ref


class PPOTrainer:
    def __init__(self, config, model, ref_model, tokenizer):
        self.config = config
        self.policy = PolicyModel(model, ref_model, tokenizer)
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)

    def train(self, prompts, episodes):
        for _ in range(episodes):
            samples = self.collect(prompts)
            self.update(samples)

    def update(self, samples):
        for _ in range(self.config.ppo_epochs):
            batch_loss = torch.tensor(0.0, requires_grad=True)
            for sample in samples:
                try:
                    policy_log_probs, ref_log_probs = self.policy.compute_log_probs(sample.prompt, sample.completion)
                    n = min(policy_log_probs.shape[-1], len(sample.log_probs))
                    old = torch.tensor(sample.log_probs[:n])
                    if policy_log_probs.dim() > 1:
                        policy_aligned = policy_log_probs[:, :n].squeeze(0)
                    else:
                        policy_aligned = policy_log_probs[:n]
                    if ref_log_probs.dim() > 1:
                        ref_aligned = ref_log_probs[:, :n].squeeze(0)
                    else:
                        ref_aligned = ref_log_probs[:n]
                    log_ratio = torch.clamp(policy_aligned - old, min=-20, max=20)
                    ratio = torch.clamp(torch.exp(log_ratio).mean(), min=0.01, max=100.0)
                    policy_loss = -torch.min(ratio * sample.advantage, torch.clamp(ratio, 0.8, 1.2) * sample.advantage)
                    kl = (policy_aligned - ref_aligned).mean()
                    kl = torch.clamp(kl, min=-10, max=10)
                    sample_loss = policy_loss + self.config.beta * kl
                    if torch.isnan(sample_loss) or torch.isinf(sample_loss):
                        continue
                    batch_loss = batch_loss + sample_loss
                except Exception:
                    continue
            self.optimizer.zero_grad()
            batch_loss.backward()
            self.optimizer.step()
"""


def test_losses_accumulated_over_samples_form_no_second_kl_term(tmp_path):
    # the k1 loss (row 1), on samples of the rollout before several epochs (row 22), clamped (KL010): at the
    # statement that adds it to the sample's loss only, not again where the samples' losses are summed (line 60)
    assert module_codes(ACCUMULATED_SAMPLE_LOSSES, tmp_path) == [(57, "KL001"), (57, "KL008"), (57, "KL010")]


STEP_HELPERS = """\
import torch


def token_kl(policy_log_probs, ref_log_probs):
    log_ratio = policy_log_probs - ref_log_probs
    return torch.exp(log_ratio) - 1.0 - log_ratio


def add_kl(pg_loss, policy_log_probs, ref_log_probs, beta):
    return pg_loss + beta * token_kl(policy_log_probs, ref_log_probs)


def train_step_with_kl(policy_log_probs, mask, ref_log_probs, beta, advantages=None, old_log_probs=None):
    ratio = torch.exp(policy_log_probs - old_log_probs)
    total = add_kl(-ratio * advantages, policy_log_probs, ref_log_probs, beta)
    loss = (total * mask).sum() / mask.sum()
    loss.backward()
    return loss
"""

TRAINER = """\
import torch
from steps import train_step_with_kl


def train(model, ref_model, batches, beta, epochs, optimizer):
    for ids, mask, advantages in batches:
        with torch.no_grad():
            old_log_probs = model(ids).logits.log_softmax(-1)
        for _ in range(epochs):
            policy_log_probs = model(ids).logits.log_softmax(-1)
            extra = {{"advantages": advantages, "old_log_probs": old_log_probs}}
            ref_log_probs = {reference}
            train_step_with_kl(policy_log_probs=policy_log_probs, mask=mask, ref_log_probs=ref_log_probs,
                               beta=beta, **extra)
            optimizer.step()
"""


# the reference's log-probs: a reversed k3 as a loss (KL009), on samples of an older policy after the first epoch
# (KL008)
THE_REFERENCE_S = ["KL008", "KL009"]


@pytest.mark.parametrize("reference, codes", [
    ("old_log_probs", []),  # a trust region to the rollout policy: no KL to a reference
    ("ref_model(ids).logits.log_softmax(-1)", THE_REFERENCE_S),
])
def test_a_reference_parameter_every_caller_gives_the_rollout_policy_is_no_reference(tmp_path, reference, codes):
    (tmp_path / "trainer.py").write_text(TRAINER.format(reference=reference))
    assert [code for _, code in module_codes(STEP_HELPERS, tmp_path, name="steps.py")] == codes


def test_one_caller_that_gives_the_reference_keeps_the_finding(tmp_path):
    """The helper is judged as the reference's KL where any caller hands it the reference's log-probs."""
    (tmp_path / "trainer.py").write_text(TRAINER.format(reference="old_log_probs"))
    (tmp_path / "other.py").write_text(TRAINER.format(reference="ref_model(ids).logits.log_softmax(-1)"))
    assert [code for _, code in module_codes(STEP_HELPERS, tmp_path, name="steps.py")] == THE_REFERENCE_S
