"""Shapes of KL code met in the thirty-fourth fresh set's review.

Verdicts (kl-math.md section 8): the log-ratio to the reference differentiated as a loss has an expected gradient
of zero (row 1, KL001), whatever constant divides it.
"""

from __future__ import annotations

import pytest
from snippets import module_codes

# a diffusion-LM GRPO step (tinyzero_diffusion): the KL loss is first written as a sum over each sequence, then,
# before anything reads it, replaced by the token mean that the loss takes
REPLACED = """\
import torch


def training_step(self, new_log_probs, ref_log_probs, pg_loss):
    kld = new_log_probs - ref_log_probs
    kl_loss = self.beta * kld.sum(dim=1).mean()
{between}    kl_loss = self.beta * kld.mean()
    loss = pg_loss + kl_loss
    loss.backward()
"""


@pytest.mark.parametrize("between, expected", [
    ("", [(7, "KL001")]),  # the first value is a dead store: only the one the loss takes is reported
    ("    # TinyZero takes a masked mean of kld\n", [(8, "KL001")]),
    ("    self.log('kl', kl_loss)\n", [(8, "KL001")]),  # read by a log alone: still no loss
])
def test_a_loss_replaced_before_anything_reads_it_is_no_loss(tmp_path, between, expected):
    assert module_codes(REPLACED.format(between=between), tmp_path) == expected


def test_a_loss_replaced_only_in_a_branch_still_reaches_the_loss(tmp_path):
    source = REPLACED.format(between="    if self.token_mean:\n    ")
    assert module_codes(source, tmp_path) == [(6, "KL001"), (8, "KL001")]


# a LightningModule whose training_step draws its own samples and compares the policy with the log-probs taken at
# sampling (a PPO ratio, 1 at the only step): Lightning steps the optimizer once after each call
LIGHTNING = """\
import torch
import lightning as L


class GRPOModule(L.LightningModule):
    def training_step(self, batch, batch_idx):
        with torch.no_grad():
            samples = self.model.sample(batch["prompts"])
            old_log_probs = self.model.log_probs(samples)
            ref_log_probs = self.ref_model.log_probs(samples)
        new_log_probs = self.model.log_probs(samples)
        ratio = torch.exp(new_log_probs - old_log_probs)
        pg_loss = -(ratio * batch["advantages"]).mean()
        kl_loss = self.beta * (new_log_probs - ref_log_probs).mean()
        return pg_loss + kl_loss
{more}"""


@pytest.mark.parametrize("more, expected", [
    ("\n    def configure_optimizers(self):\n        return torch.optim.AdamW(self.parameters())\n",
     [(14, "KL001")]),  # on-policy: k1 as a loss alone
    ("", [(14, "KL001"), (14, "KL008")]),  # no Lightning step seen: the ratio says older samples
    ("\n    def configure_optimizers(self):\n        self.automatic_optimization = False\n"
     "        return torch.optim.AdamW(self.parameters())\n", [(14, "KL001"), (14, "KL008")]),
])
def test_lightning_steps_once_after_a_training_step_that_draws_its_samples(tmp_path, more, expected):
    assert module_codes(LIGHTNING.format(more=more), tmp_path) == expected
