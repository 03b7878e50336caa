"""Shapes of KL code met in the ninety-third fresh set.

facebookresearch/advgame (its game-GRPO unit over fairseq2) builds each token's objective in one method,
`per_token_loss = per_token_scaled_advantage - beta * kl`, returns its sum, and the calling method minimises its
negative, `grpo_loss = -_grpo_objective + ...`. The loss-named value was taken as the loss itself, with the KL added
as a bonus (KL011); the caller carries it on into its own loss, where the KL is a penalty: k3 differentiated as a
loss, row 3 (KL002) alone.
"""

from __future__ import annotations

import pytest
from snippets import module_codes

OBJECTIVE = """\
import torch


class Unit:
    def compute_loss(self, model, batch, beta):
        model_logps = self._gather_lprobs(model(batch.seqs), batch.target)
        objective = self._objective(model_logps, batch.ref_logps, batch.adv, beta)
        return {sign}objective

    def _objective(self, model_logps, ref_logps, adv, beta):
        kl = (ref_logps - model_logps).exp() - (ref_logps - model_logps) - 1.0
        per_token_loss = adv * model_logps - beta * kl
        return per_token_loss.sum()

    def _gather_lprobs(self, logits, target):
        logprobs = torch.log_softmax(logits, dim=-1)
        return torch.gather(logprobs, -1, target.seqs.unsqueeze(-1)).squeeze(-1)
"""


@pytest.mark.parametrize("sign, codes", [
    ("-", [(12, "KL002")]),  # the caller minimises -objective: the KL is a penalty
    ("", [(12, "KL002"), (12, "KL011")]),  # minimised as it is, the KL term is a bonus
])
def test_a_loss_named_objective_a_caller_negates_is_judged_with_the_callers_sign(tmp_path, sign, codes):
    assert module_codes(OBJECTIVE.format(sign=sign), tmp_path) == codes


def test_a_loss_named_value_no_caller_carries_on_is_judged_where_it_is(tmp_path):
    """Nothing calls the objective: its loss-named value is the loss (a library's method), judged as written."""
    source = OBJECTIVE.format(sign="-").replace("        objective = self._objective(model_logps, batch.ref_logps, "
                                                "batch.adv, beta)\n        return -objective\n", "        return 0\n")
    source = source.replace("def _objective", "def objective")
    assert module_codes(source, tmp_path) == [(11, "KL002"), (11, "KL011")]
