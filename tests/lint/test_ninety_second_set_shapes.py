"""Shapes of KL code met in the ninety-second fresh set (tianyitan040116/motion-agent-grpo): each sample's log-probs
picked from its log-softmax by an index of its token ids taken from a list of every sample's (`mvids =
motion_vocab_ids_list[idx].to(device)`, then `log_probs_all[torch.arange(m_len), mvids]`).

Verdict (kl-math.md section 8): the k3 of those log-probs against the reference's, differentiated as a loss, is
row 3 (KL002). Before, the index's name (`mvids`, an element of `..._ids_list`) hid the gather, and the trainer
went unreported.
"""

from __future__ import annotations

import pytest
from snippets import module_codes

PER_SAMPLE_PICK = """\
    import torch


    class Trainer:
        def log_probs(self, captions, motions, use_ref_model=False):
            motion_vocab_ids_list = [m + self.offset for m in motions]
            out = []
            for idx, caption in enumerate(captions):
                log_probs_all = torch.log_softmax(self.model(caption).logits, -1)
                {pick}
                out.append(log_probs_all[torch.arange(len(mvids)), mvids])
            return out

        def loss(self, captions, motions, advantages, ref_log_probs_list):
            new_log_probs_list = self.log_probs(captions, motions)
            total = 0.0
            for i in range(len(captions)):
                ref_lp, new_lp = ref_log_probs_list[i], new_log_probs_list[i]
                sft_kl = torch.exp(ref_lp - new_lp) - (ref_lp - new_lp) - 1.0
                total = total - (new_lp * advantages[i]).mean() + self.beta * sft_kl.mean()
            total.backward()
            self.optimizer.step()
    """


@pytest.mark.parametrize("pick, codes", [
    ("mvids = motion_vocab_ids_list[idx].to(self.device)", [(21, "KL002")]),
    ("mvids = motion_vocab_ids_list[idx]", [(21, "KL002")]),
    ("mvids = self.positions[idx]", []),  # not token ids: no gather, no KL estimate
])
def test_an_element_of_a_list_of_token_ids_picks_the_sampled_tokens(tmp_path, pick, codes):
    assert module_codes(PER_SAMPLE_PICK.format(pick=pick), tmp_path) == codes
