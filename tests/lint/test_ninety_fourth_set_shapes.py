"""Shapes of KL code met in the ninety-fourth fresh set (baton2809/tinkoff, a hand-rolled REINFORCE).

The policy's log-probability of its sample is read from the logits Hugging Face's `generate` returns
(`return_dict_in_generate=True, output_scores=True`): generate runs under no_grad, so those log-probs carry no
gradient. The k1 penalty `log pi - log ref` folded into the reward is right as a value (row 6), but the policy
gradient it should weight is never formed: the script guards its loss with `if log_prob.requires_grad:`, which is
then never true, and nothing is trained. Read as live log-probs, the same code gave a KL003 and a KL010.
"""

from __future__ import annotations

import pytest
from snippets import module_codes

SAMPLED = """\
    import torch


    class Trainer:
        def generate_text(self, inputs):
            outputs = self.policy_model.generate(**inputs, do_sample=True, {keywords})
            tokens = outputs.sequences[:, inputs["input_ids"].shape[-1]:]
            picked = []
            for i, step_logits in enumerate(outputs.{field}):
                step_logps = torch.log_softmax(step_logits, dim=-1)
                picked.append(torch.gather(step_logps, 1, tokens[:, i].unsqueeze(-1)).squeeze(-1))
            return outputs.sequences, torch.stack(picked).sum()

        def step(self, inputs, optimizer):
            ids, lp = self.generate_text(inputs)
            with torch.no_grad():
                ref_lp = torch.log_softmax(self.ref_model(ids).logits, -1).gather(-1, ids.unsqueeze(-1)).sum()
            loss = lp - ref_lp
            if lp.requires_grad:
                loss.backward()
                optimizer.step()
"""


@pytest.mark.parametrize("keywords, field, codes", [
    ("return_dict_in_generate=True, output_scores=True", "scores", []),  # generate's logits: no gradient
    ("return_dict_in_generate=True, output_logits=True", "logits", []),
    # a project's own sampler that keeps the gradient (no Hugging Face keyword): k1 differentiated as a loss
    ("keep_grad=True", "scores", [(18, "KL001")]),
])
def test_log_probs_read_from_generates_logits_train_nothing(tmp_path, keywords, field, codes):
    assert module_codes(SAMPLED.format(keywords=keywords, field=field), tmp_path) == codes
