"""Shapes of KL code met in the ninety-third fresh set.

facebookresearch/advgame (its game-GRPO unit over fairseq2) builds each token's objective in one method,
`per_token_loss = per_token_scaled_advantage - beta * kl`, returns its sum, and the calling method minimises its
negative, `grpo_loss = -_grpo_objective + ...`. The loss-named value was taken as the loss itself, with the KL added
as a bonus (KL011); the caller carries it on into its own loss, where the KL is a penalty: k3 differentiated as a
loss, row 3 (KL002) alone.

hongruhou89/ProRL adds a k1 loss over its item tokens to one at the first EOS token, `kl_loss = (item_kl_loss +
eos_kl_loss) / total_count`: the sum was read as a KL at the last token only (KL005); it covers every token, k1
differentiated as a loss (KL001).
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


ITEMS_AND_EOS = """\
import torch


def step(policy, ref, batch, beta, optimizer):
    logp = policy(batch.input_ids).logits.log_softmax(-1).gather(-1, batch.actions).squeeze(-1)
    with torch.no_grad():
        ref_logp = ref(batch.input_ids).logits.log_softmax(-1).gather(-1, batch.actions).squeeze(-1)
    pg_loss = -(logp * batch.advantages).mean()
    item_kl = (beta * (logp - ref_logp) * batch.mask).sum()
    eos_kl = beta * (logp[:, -1] - ref_logp[:, -1]).sum()
    loss = pg_loss + {kl}
    loss.backward()
    optimizer.step()
"""


@pytest.mark.parametrize("kl, codes", [
    ("item_kl + eos_kl", [(11, "KL001")]),  # every token's k1 and the last one's again: a k1 loss over all
    ("eos_kl", [(9, "KL100"), (11, "KL005")]),  # the last token's alone (the other term unused)
])
def test_a_kl_over_every_token_plus_one_at_the_last_covers_every_token(tmp_path, kl, codes):
    assert module_codes(ITEMS_AND_EOS.format(kl=kl), tmp_path) == codes
