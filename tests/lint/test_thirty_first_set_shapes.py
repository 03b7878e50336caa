"""Shapes of KL code met in the thirty-first fresh set's review.

Verdicts (kl-math.md section 8): k3 differentiated as a loss follows the per-token forward KL (row 3, KL002); each
turn's mean over its own tokens (`model(ids).logits[0]` is the one sequence of a batch of one) weights the turn by
1/L (row 21, KL007).
"""

from __future__ import annotations

import pytest
from snippets import module_codes

# a multi-turn trainer's helper: the log-probs of one response's tokens, picked out of the [C, V] log-softmax
# by numpy-style indexing (a row per position, the sampled token's id in each), as `gather` would
PER_TURN = """\
import torch
import torch.nn.functional as F


def get_log_probs(model, prompt_ids, comp_ids):
    ids = torch.cat([prompt_ids, comp_ids.unsqueeze(0)], dim=1)
    logits = model(input_ids=ids).logits[0]
    log_probs = F.log_softmax(logits[prompt_ids.shape[1] - 1:-1], dim=-1)
    return log_probs[{rows}, {picked}]


def run_grpo(policy, ref_model, optimizer, turns, advantages, kl_coeff):
    optimizer.zero_grad()
    losses, kl_terms = [], []
    for g, (p_ids, c_ids) in enumerate(turns):
        lp = get_log_probs(policy, p_ids, c_ids)
        ratio = torch.exp(lp.mean() - lp.detach().mean())
        losses.append(-ratio * advantages[g])
        with torch.no_grad():
            ref_lp = get_log_probs(ref_model, p_ids, c_ids)
        kl_terms.append((torch.exp(ref_lp - lp) - (ref_lp - lp) - 1).mean())
    loss = torch.stack(losses).mean() + kl_coeff * torch.stack(kl_terms).mean()
    loss.backward()
    optimizer.step()
"""


@pytest.mark.parametrize("rows, picked", [("torch.arange(len(comp_ids))", "comp_ids"),
                                          ("range(comp_ids.numel())", "comp_ids"),
                                          ("torch.arange(comp_ids.shape[0])", "sampled_tokens")])
def test_log_probs_indexed_by_the_sampled_ids_are_the_tokens_log_probs(tmp_path, rows, picked):
    assert [code for _, code in module_codes(PER_TURN.format(rows=rows, picked=picked), tmp_path)] == ["KL002", "KL007"]


def test_an_index_that_names_no_token_ids_picks_no_tokens(tmp_path):
    """`log_probs[rows, last]`: positions of a [B, T, V] tensor, still over the vocabulary, so no per-token
    log-prob, and no k3 of the sampled tokens to report."""
    source = PER_TURN.format(rows="torch.arange(len(comp_ids))", picked="last")
    assert module_codes(source, tmp_path) == []


def test_whether_a_list_holds_anything_is_no_setting(tmp_path):
    """`torch.stack(kl_terms).mean() if kl_terms else 0.0`: the test is whether any KL term was kept, not a switch
    of the user's, so the finding names no `kl_terms=True` configuration."""
    import libcst as cst

    from klaudit.lint.checks import check_module
    from klaudit.lint.project import Project

    source = PER_TURN.format(rows="torch.arange(len(comp_ids))", picked="comp_ids").replace(
        "kl_coeff * torch.stack(kl_terms).mean()", "kl_coeff * (torch.stack(kl_terms).mean() if kl_terms else 0.0)")
    (tmp_path / "snippet.py").write_text(source)
    findings = check_module(str(tmp_path / "snippet.py"), cst.parse_module(source), Project([tmp_path]), source)
    assert [finding.code for finding in findings] == ["KL002", "KL007"]
    assert not any("kl_terms" in finding.message for finding in findings)
