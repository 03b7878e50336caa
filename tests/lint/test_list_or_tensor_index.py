"""A value that is a literal list on one path and a tensor (or a list of them) on another, then indexed.

Shape of allenai/open-instruct's grpo_fast.py (development corpus): `ref_logprobs_BT: list[torch.Tensor] = []`, then
`if self.args.load_ref_policy: ref_logprobs_BT = compute_logprobs(self.ref_policy, ...)`, and in the training loop
`compute_grpo_loss(..., ref_logprobs=ref_logprobs_BT[i] if self.args.load_ref_policy else None)`. The index read only
the empty list's items and dropped the reference's log-probs, so the KL term the helper forms (k3 of the clamped
log-ratio, row 4: KL002) was lost; every alternative is indexed now.
"""

from __future__ import annotations

import pytest
from snippets import module_codes

STEP = """\
import torch


def compute_logprobs(model, batches):
    out = []
    for ids in batches:
        logits = model(ids).logits
        out.append(torch.log_softmax(logits, -1).gather(-1, ids[..., None]).squeeze(-1))
    return out


def kl_term(new_logprobs, ref_logprobs):
    if ref_logprobs is None:
        return torch.zeros_like(new_logprobs)
    log_ratio = new_logprobs - ref_logprobs
    return torch.exp(-log_ratio) - 1 + log_ratio


class Trainer:
    def step(self, batches):
        ref_logprobs_BT: list[torch.Tensor] = {initial}
        if self.args.load_ref_policy:
            ref_logprobs_BT = compute_logprobs(self.ref_policy, batches)
        for i, ids in enumerate(batches):
            logits = self.model(ids).logits
            new_logprobs = torch.log_softmax(logits, -1).gather(-1, ids[..., None]).squeeze(-1)
            kl = kl_term(new_logprobs, {argument})
            loss = self.args.beta * (kl * ids.mask).sum() / ids.mask.sum()
            loss.backward()
            self.optimizer.step()
"""


@pytest.mark.parametrize("initial, argument", [
    ("[]", "ref_logprobs_BT[i] if self.args.load_ref_policy else None"),
    ("[]", "ref_logprobs_BT[i]"),
    ("[None] * len(batches)", "ref_logprobs_BT[i]"),
])
def test_an_index_reads_the_tensor_alternative_beside_a_literal_list(tmp_path, initial, argument):
    assert {code for _, code in module_codes(STEP.format(initial=initial, argument=argument), tmp_path)} == {"KL002"}
