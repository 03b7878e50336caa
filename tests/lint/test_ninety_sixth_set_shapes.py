"""Shapes of KL code met in the ninety-sixth fresh set.

SaintSauce/xxs takes a sequence's log-prob from a model's built-in cross-entropy: `-out.loss * valid_len`, the
mean NLL of the response tokens times their count, `valid_len = (labels != -100).sum(dim=1)`. A token count
times a value the analysis does not explain was read as a count still (`len(tokens) * G`), so the helper's
log-probs were a length and its PPO loss's `beta * (ref_logp - old_logp).mean()` (both detached: a constant,
KL001) was silent.
"""

from __future__ import annotations

import pytest
from snippets import module_codes

TRAINER = """\
import torch


class Trainer:
    def _log_prob(self, model, seqs):
        labels = seqs.clone()
        out = model(seqs, labels=labels)
        valid_len = (labels != -100).sum(dim=1)
        logp = {product}
        return logp

    def train(self):
        for update in range(100):
            with torch.no_grad():
                seqs = self.policy.generate(self.prompts, do_sample=True)
                old_logp = self._log_prob(self.policy, seqs)
                ref_logp = self._log_prob(self.reference, seqs)
            kl_loss = self.beta * (old_logp - ref_logp).mean()
            for _ in range(4):
                new_logp = self._log_prob(self.policy, seqs)
                ratio = (new_logp - old_logp).exp()
                loss = -(ratio * self.advantages).mean() + kl_loss
                loss.backward()
                self.optimizer.step()
"""


@pytest.mark.parametrize("product, codes", [
    ("-out.loss * valid_len", [(18, "KL001")]),  # a mean NLL times the count: the sequence's log-prob
    ("valid_len * -out.loss", [(18, "KL001")]),
    ("valid_len * self.group_size", []),  # a count times a setting: still a count, no log-prob
])
def test_a_mean_loss_times_its_token_count_is_a_sum_not_a_count(tmp_path, product, codes):
    assert module_codes(TRAINER.format(product=product), tmp_path) == codes

