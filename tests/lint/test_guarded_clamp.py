"""A clamp that a skip test keeps inside its bounds changes no value: KL010 is for a clamp that cuts."""

from __future__ import annotations

import pytest
from snippets import module_codes

GUARDED_CLAMP = """\
import torch


def update(policy, ref_logps, batches, optimizer, beta):
    for batch in batches:
        logp = policy.sequence_logps(batch)
        log_ratio = logp - ref_logps[batch.index]
        {guard}
        kl_penalty = log_ratio.clamp(-5.0, 5.0)
        loss = -(batch.advantage * logp) + beta * kl_penalty
        loss.backward()
        optimizer.step()
"""


@pytest.mark.parametrize("guard, clamped", [
    ("if abs(log_ratio.detach().item()) > 5.0:\n            continue", False),  # every value reaching it is inside
    ("if abs(log_ratio.detach().item()) > 8.0:\n            continue", True),  # a wider skip: the clamp still cuts
    ("if abs(logp.detach().item()) > 5.0:\n            continue", True),  # another tensor's test
    ("pass", True),  # no guard
])
def test_a_clamp_inside_a_skip_test_never_cuts(tmp_path, guard, clamped):
    """minstar/BIOAgents (seventy-first set) skips a sample whose log-ratio passes 5 on the line before clamping it to
    [-5, 5]: the clamp changes no value, so no KL010 (the k1 loss itself is still KL001)."""
    codes = {code for _, code in module_codes(GUARDED_CLAMP.format(guard=guard), tmp_path)}
    assert "KL001" in codes
    assert ("KL010" in codes) is clamped
