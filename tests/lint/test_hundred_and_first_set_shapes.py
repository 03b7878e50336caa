"""Shapes of KL code met in the hundred-and-first fresh set.

Dutch-voyage/Logic-RL-trl edits the GRPO trainer of its TRL copy and leaves `assert False` after the loss, before
`return loss`: every call of `compute_loss` stops there, so the k3 loss it computes never reaches a step, and the
KL007 and KL009 it gave were false alarms. A `raise` at the top level of the body stops it as surely; one inside a
branch does not, nor one after a branch that returns.
"""

from __future__ import annotations

import pytest
from snippets import module_codes

COMPUTE_LOSS = """\
import torch


class Trainer:
    def compute_loss(self, model, inputs):
        logps = model(inputs["ids"]).logits.log_softmax(-1).gather(-1, inputs["ids"][..., None]).squeeze(-1)
        ref = inputs["ref_logps"]
        per_token_kl = torch.exp(ref - logps) - (ref - logps) - 1
        per_token_loss = -(torch.exp(logps - logps.detach()) * inputs["advantages"] - self.beta * per_token_kl)
        loss = (per_token_loss * inputs["mask"]).sum() / inputs["mask"].sum()
        {stop}
        return loss
"""


@pytest.mark.parametrize("stop, codes", [
    ("pass", [(9, "KL002")]),  # k3 as a loss, row 3
    ("assert False", []),
    ("assert 0, 'debugging'", []),
    ("raise RuntimeError('not finished')", []),
    ("if self.debug:\n            raise RuntimeError('debugging')", [(9, "KL002")]),  # only where it is asked for
    ("assert loss is not None", [(9, "KL002")]),
    ("if self.fast:\n            return loss * 1.0\n        raise RuntimeError('unreachable')", [(9, "KL002")]),
])
def test_a_loss_function_that_always_stops_before_returning_trains_nothing(tmp_path, stop, codes):
    assert module_codes(COMPUTE_LOSS.format(stop=stop), tmp_path) == codes
