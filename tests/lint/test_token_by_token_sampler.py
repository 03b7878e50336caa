"""A sampler that draws one token at a time and logs the probability of the token it drew.

OnozukaRikkyo/deep_RL (hundred-and-seventh set) samples from `probs_1d = safe_softmax(logits)[0]`, one position's
distribution over the vocabulary, and keeps `torch.log(probs_1d[next_token_id] + EPS)` for the policy and, under
no_grad, the same for the reference; its loss adds `beta * sum(logp - logp_ref)`: k1 as a loss (row 1, KL001).
Indexing a 1-D distribution by the drawn token is a gather, as `log_probs[..., token_ids]` is; an index that is no
token id (a position, a row) picks nothing.
"""

from __future__ import annotations

import textwrap

import pytest
from snippets import module_codes

SAMPLER = textwrap.dedent("""\
    import torch
    import torch.nn.functional as F

    EPS = 1e-8


    def reinforce_step(policy, ref_policy, ids, opt, advantage):
        logp_list, logp_ref_list = [], []
        for _ in range(32):
            probs_1d = F.softmax(policy(ids).logits[:, -1, :], dim=-1)[0]
            {index} = torch.multinomial(probs_1d, 1).item()
            logp_list.append(torch.log(probs_1d[{index}] + EPS))
            with torch.no_grad():
                ref_probs = F.softmax(ref_policy(ids).logits[:, -1, :], dim=-1)[0]
                logp_ref_list.append(torch.log(ref_probs[{index}] + EPS))
        logp = torch.stack(logp_list).sum()
        kl_seq = torch.stack([lp - lpr for lp, lpr in zip(logp_list, logp_ref_list)]).sum()
        loss = -(advantage * logp) + 0.02 * kl_seq
        loss.backward()
        opt.step()
    """)


@pytest.mark.parametrize("index, codes", [
    ("next_token_id", ["KL001"]),  # the drawn token: its probability, then its log-prob
    ("position", []),  # an index that says nothing of tokens: no log-prob of a sampled token is read
])
def test_the_log_of_a_drawn_tokens_probability_is_its_log_prob(tmp_path, index, codes):
    assert sorted({code for _, code in module_codes(SAMPLER.format(index=index), tmp_path)}) == codes
