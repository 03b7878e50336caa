"""A loss helper read through its callers: where the module's own functions call it and no other module does, what
they hand it is all it is ever given, so the helper's reading of its parameters from their names alone is no use of
its own. taziksh/catan-llm (fresh86) names its arguments `policy_lp` and `ref_lp`, which alone read as per-token
log-probs (a k3 averaged over each response's tokens: rows 3 and 21, KL002 and KL007); its one caller hands it each
response's summed log-probs, so the k3 is the sequence-level one (row 18, KL002) and no token mean is taken."""

from __future__ import annotations

from snippets import module_codes

HELPER = """\
import torch


def grpo_loss(advantage, policy_lp, ref_lp, beta_kl):
    log_ratio = ref_lp - policy_lp
    kl = torch.exp(log_ratio) - log_ratio - 1
    return (-(advantage * policy_lp) + beta_kl * kl).mean(), kl
"""

CALLER = """\


def sequence_logprobs(model, sequences, mask):
    logits = model(sequences).logits[:, :-1]
    picked = torch.log_softmax(logits, -1).gather(-1, sequences[:, 1:].unsqueeze(-1)).squeeze(-1)
    return (picked * mask).sum(dim=-1)


def train(policy, ref, trajectories, beta_kl, optimizer):
    for trajectory in trajectories:
        sequences, mask, advantage = trajectory.sequences, trajectory.mask, trajectory.advantage
        policy_lp = sequence_logprobs(policy, sequences, mask)
        with torch.no_grad():
            ref_lp = sequence_logprobs(ref, sequences, mask)
        loss, kl = grpo_loss(advantage, policy_lp, ref_lp, beta_kl)
        loss.backward()
    optimizer.step()
"""

KL_LINE = 7  # `return (... + beta_kl * kl).mean(), kl`


def test_callers_here_that_hand_it_sequence_sums_decide_its_reading(tmp_path):
    """Before, the helper's own reading (each trajectory's tensors one sequence, `.mean()` its token mean) gave a
    second KL002 and a KL007 beside the caller's sequence-level KL002."""
    assert module_codes(HELPER + CALLER, tmp_path) == [(KL_LINE, "KL002")]


def test_a_helper_another_module_also_calls_keeps_its_own_reading(tmp_path):
    """What the other module hands it is not seen here: the reading of its parameters stays."""
    other = "from snippet import grpo_loss\n\n\ndef elsewhere(a, p, r, b):\n    return grpo_loss(a, p, r, b)[0]\n"
    assert (KL_LINE, "KL007") in module_codes(HELPER + CALLER, tmp_path, trainer=other)
