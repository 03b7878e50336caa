"""Discovery: which functions of a file check-grad audits, and what the others lack (static, no import)."""

from __future__ import annotations

import textwrap

import pytest

from klaudit.audit.discover import DiscoveryError, discover_kl_functions


def _discover(tmp_path, text: str):
    source = tmp_path / "trainer.py"
    source.write_text(textwrap.dedent(text))
    return discover_kl_functions(str(source))


def test_helpers_losses_and_signatures(tmp_path):
    found = _discover(tmp_path, """
    import torch

    def approx_kl(log_probs, ref_log_probs, kl_estimator="k1"):
        log_ratio = log_probs - ref_log_probs
        if kl_estimator == "k3":
            return log_ratio.neg().exp() - 1 + log_ratio
        return log_ratio

    def kl_loss(logprobs, ref_logprobs, mask, beta):
        return beta * ((logprobs - ref_logprobs) * mask).sum(-1).mean()

    def compiled_kl(logprobs, ref_logprobs):
        return _C.kl(logprobs, ref_logprobs)

    def entropy(logits):
        return -(logits.softmax(-1) * logits.log_softmax(-1)).sum(-1)
    """)
    # approx_kl and kl_loss: the lint sees a KL term; compiled_kl: the signature names both log-probs
    assert found.auditable == ["approx_kl", "kl_loss", "compiled_kl"] and found.skipped == []


def test_a_switch_compared_with_literals_binds(tmp_path):
    found = _discover(tmp_path, """
    def kl_penalty(logprob, ref_logprob, kl_penalty):
        if kl_penalty in ("kl", "k1"):
            return logprob - ref_logprob
        raise NotImplementedError(kl_penalty)
    """)
    assert found.auditable == ["kl_penalty"]


def test_what_a_function_lacks(tmp_path):
    found = _discover(tmp_path, """
    def train_step(policy, ref_policy, optimizer, batch, scheduler):
        logprobs = policy(batch["input_ids"])
        kl = logprobs - batch["ref_logprobs"]
        (0.1 * kl.mean()).backward()

    def kl_with_unknown(logprobs, ref_logprobs, temperature_schedule):
        return (logprobs - ref_logprobs) / temperature_schedule
    """)
    assert found.auditable == []
    train_step, unknown = found.skipped
    assert "::train_step computes a KL term but cannot be called alone" in train_step
    assert "no parameter takes the policy log-probs or logits" in train_step
    assert "policy, ref_policy, optimizer, batch and 1 more do not bind by name" in train_step
    assert "temperature_schedule does not bind by name" in unknown
    assert unknown.endswith("name it with ::kl_with_unknown and say what its parameters are with --bind PARAM=ROLE")


def test_a_rollout_kl_of_the_sampling_policys_log_probs_can_be_called_alone(tmp_path):
    """The sampling policy's log-probs stand for the policy's in a KL computed at the rollout (bind.py)."""
    found = _discover(tmp_path, """
    def rollout_kl(old_log_probs, ref_log_probs):
        return old_log_probs - ref_log_probs
    """)
    assert found.auditable == ["rollout_kl"] and found.skipped == []


def test_methods_and_instance_state(tmp_path):
    found = _discover(tmp_path, """
    class Trainer:
        loss_type = "token"

        def compute_rewards(self, scores, logprobs, ref_logprobs, masks):
            kl = (logprobs - ref_logprobs) * masks
            return scores - self.kl_ctl.value * kl, kl

        def kl_loss(self, logprobs, ref_logprobs, mask):
            per_token = self._kl(logprobs, ref_logprobs) * mask
            return per_token.sum() / mask.sum() if self.loss_type == "token" else per_token.mean()

        def _kl(self, logprobs, ref_logprobs):
            return (logprobs - ref_logprobs) * self.temperature

        @staticmethod
        def static_kl(logprobs, ref_logprobs):
            return logprobs - ref_logprobs
    """)
    # compute_rewards reads only a KL coefficient; kl_loss reads a class attribute and, through _kl,
    # instance state that a bare instance lacks
    assert found.auditable == ["Trainer.compute_rewards", "Trainer.static_kl"]
    (kl_loss, kl) = found.skipped
    assert "Trainer.kl_loss" in kl_loss and "it reads instance state self.temperature" in kl_loss
    assert kl_loss.endswith("audit the KL helper it calls instead")
    assert "Trainer._kl" in kl


def test_bad_files(tmp_path):
    source = tmp_path / "broken.py"
    source.write_text("def f(:\n")
    with pytest.raises(DiscoveryError, match=r"broken.py:1: syntax error"):
        discover_kl_functions(str(source))
    with pytest.raises(DiscoveryError, match="cannot read"):
        discover_kl_functions(str(tmp_path / "missing.py"))
