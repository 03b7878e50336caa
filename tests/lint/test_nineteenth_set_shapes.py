"""Shapes of KL code met in the nineteenth review (the eighteenth fresh set).

Verdicts (kl-math.md section 8): k3 differentiated as a loss is row 3 (KL002); on samples of an older policy
(a PPO ratio to the behaviour policy's log-probs in the same step) with no weight on the KL term, row 22
(KL008).
"""

from __future__ import annotations

from snippets import module_codes

# RL2's actor loss: the policy's log-probs reach the loss as an entry of the minibatch dict, which the actor's
# forward pass filled; the loss itself detaches that entry for the ratio's default, so the entry holds a gradient.
MINIBATCH_LOSS = """\
import torch


def k3(logps, ref_logps):
    log_ratio = logps - ref_logps
    return log_ratio + torch.exp(-log_ratio) - 1


def actor_ppo_loss(config, minibatch):
    ratio = torch.exp(minibatch["logps"] - minibatch.get("old_logps", minibatch["logps"].detach()))
    losses = -minibatch["advantages"] * ratio
    losses = losses + config.kl_coef * k3(minibatch["logps"], minibatch["ref_logps"])
    return losses
"""


def test_a_dict_entry_the_loss_detaches_holds_the_policy_s_gradient(tmp_path):
    assert module_codes(MINIBATCH_LOSS, tmp_path) == [(12, "KL002"), (12, "KL008")]


def test_a_dict_entry_never_detached_stays_rollout_data(tmp_path):
    """Without the `.detach()` nothing says the entry is the policy being trained: the rollout's log-probs."""
    source = MINIBATCH_LOSS.replace('minibatch.get("old_logps", minibatch["logps"].detach())', 'minibatch["old_logps"]')
    assert module_codes(source, tmp_path) == []
