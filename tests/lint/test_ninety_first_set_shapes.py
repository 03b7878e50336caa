"""Shapes of KL code met in the ninety-first fresh set (openfeedback/superhf): the exact per-step KL over the
vocabulary through `torch.nn.KLDivLoss(reduction="batchmean", log_target=True)`, taken one sequence at a time.

Verdicts (kl-math.md section 8): KLDivLoss(log pi, log ref) is KL(ref || pi) at each position, the forward KL
differentiated as a loss (row 3b, KL002). Its `batchmean` of one sequence's [L, V] log-probabilities divides the sum
by the rows, that sequence's L: each sequence's token mean, weighted 1/L (row 21, KL007); of the whole batch's
[B, T, V] it divides by B, each sequence's token sum (no KL007).
"""

from __future__ import annotations

import pytest
from snippets import module_codes

PER_SEQUENCE_KL_DIV = """\
    import torch


    class Trainer:
        def __init__(self, model, kl_coefficient):
            self.language_model, self.kl_coefficient = model, kl_coefficient
            self.kl_loss = torch.nn.KLDivLoss(reduction="{reduction}", log_target=True)

        def sample(self, prompts):
            return self.language_model.generate(**prompts, do_sample=True)  # the completions it trains on

        def step(self, minibatch):
            "Fine-tune on the completions the reward model ranked best (SuperHF filtered fine-tuning)."
            outputs = self.language_model(**minibatch)
            loss = outputs.loss
            logp_online_model = torch.log_softmax(outputs.logits, dim=2)
            with self.language_model.disable_adapter(), torch.no_grad():
                logp_original_model = torch.log_softmax(self.language_model(**minibatch).logits, dim=2)
            {reduce}
            self.accelerator.backward(loss)
    """
ONE_SEQUENCE_AT_A_TIME = """for i in range(logp_online_model.shape[0]):
                mask = minibatch["labels"][i] != -100
                kl = self.kl_loss(logp_online_model[i, mask, :], logp_original_model[i, mask, :])
                loss = loss + self.kl_coefficient * kl"""
THE_WHOLE_BATCH = "loss = loss + self.kl_coefficient * self.kl_loss(logp_online_model, logp_original_model)"


@pytest.mark.parametrize("reduction, reduce, codes", [
    ("batchmean", ONE_SEQUENCE_AT_A_TIME, [(22, "KL002"), (22, "KL007")]),
    ("mean", ONE_SEQUENCE_AT_A_TIME, [(22, "KL002"), (22, "KL007")]),  # / (L V): still 1/L
    ("sum", ONE_SEQUENCE_AT_A_TIME, [(22, "KL002")]),
    ("batchmean", THE_WHOLE_BATCH, [(19, "KL002")]),
])
def test_a_kl_div_loss_of_one_sequence_is_its_token_mean(tmp_path, reduction, reduce, codes):
    assert module_codes(PER_SEQUENCE_KL_DIV.format(reduction=reduction, reduce=reduce), tmp_path) == codes
