"""A KL value per sample, gathered in a list and averaged by NumPy, is still that KL: added to the loss as a number
it has no gradient (KL001).

Kritarth123-prince/distilgpt2-rlhf-reward-hacking (seventy-third set) computes each response's k1 under
`torch.no_grad()` as a float, appends it to `kl_vals`, and trains `pg_loss + kl_coef * torch.tensor(np.mean(kl_vals))`:
the KL term regularises nothing. `np.mean` of the list was not read as a mean over its entries.
"""

from __future__ import annotations

import pytest
from snippets import module_codes

TRAINER = """\
import numpy as np
import torch


def seq_logprob(model, ids):
    return model(ids).logits.log_softmax(-1).gather(-1, ids.unsqueeze(-1)).squeeze(-1).sum()


@torch.no_grad()
def estimate_kl(policy, ref, ids):
    return float((seq_logprob(policy, ids) - seq_logprob(ref, ids)) / ids.shape[0])


def train(policy, ref_model, batches, optimizer, kl_coef):
    for batch in batches:
        pg_losses, kl_vals = [], []
        for ids, adv in batch:
            log_p = seq_logprob(policy, ids)
            pg_losses.append(-log_p * adv)
            kl_vals.append(estimate_kl(policy, ref_model, ids))
        pg_loss = torch.stack(pg_losses).mean()
        total_loss = {total}
        total_loss.backward()
        optimizer.step()
        print(np.mean(kl_vals))
"""


@pytest.mark.parametrize("total, reported", [
    ("pg_loss + kl_coef * torch.tensor(np.mean(kl_vals))", True),
    ("pg_loss + kl_coef * np.mean(kl_vals)", True),
    ("pg_loss + kl_coef * torch.tensor(kl_vals).mean()", True),
    ("pg_loss", False),  # the mean only printed
])
def test_a_numpy_mean_of_a_list_of_kl_values_added_to_the_loss_has_no_gradient(tmp_path, total, reported):
    codes = [code for _, code in module_codes(TRAINER.format(total=total), tmp_path)]
    assert ("KL001" in codes) is reported
