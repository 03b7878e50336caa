"""Shapes of KL code met in the twelfth review (the held-out set's misses, the tenth fresh set).

Verdicts (kl-math.md section 8): k3 differentiated as a loss follows the forward KL (row 3, KL002); a
per-sequence token-mean of it gives 1/L weights (row 21, KL007).
"""

from __future__ import annotations

from snippets import module_codes

# ColossalChat's GRPO consumer: one algorithm moves the k3 into the advantages and zeroes the loss
# term, the others keep it in the loss. The entry `inputs["advantages"]` is set on one path only.
ONE_PATH_ENTRY = """\
import torch


def step(policy, inputs, adv, beta):
    log_probs = policy(inputs["input_ids"])
    log_ratio = inputs["ref_log_probs"] - log_probs
    per_token_kl = torch.exp(log_ratio) - log_ratio - 1
    if adv == "REINFORCE_PPB":
        inputs["advantages"] = inputs["advantages"] - beta * per_token_kl
        per_token_kl = 0.0
    loss = -inputs["advantages"] * log_probs + beta * per_token_kl
    loss = ((loss * inputs["mask"]).sum() / inputs["mask"].sum())
    loss.backward()
"""


def test_an_entry_set_on_one_path_keeps_its_unknown_value_on_the_other(tmp_path):
    """Where `adv != "REINFORCE_PPB"`, `inputs["advantages"]` holds what it held before (a value the
    analysis cannot explain), not the k3-laden advantages of the other path: the k3 loss of that path
    is still judged (row 3, KL002)."""
    assert module_codes(ONE_PATH_ENTRY, tmp_path) == [(11, "KL002")]


def test_a_name_first_set_on_one_path_gains_no_unknown_value(tmp_path):
    """A plain name set only in a branch did not exist on the other path: its value is that branch's,
    and the k3 loss it feeds is judged as it is (row 3)."""
    source = """\
    import torch


    def step(policy, inputs, use_kl, beta):
        log_probs = policy(inputs["input_ids"])
        log_ratio = inputs["ref_log_probs"] - log_probs
        if use_kl:
            kl_term = torch.exp(log_ratio) - log_ratio - 1
        loss = (-inputs["advantages"] * log_probs + beta * kl_term).sum() / inputs["mask"].sum()
        loss.backward()
    """
    assert module_codes(source, tmp_path) == [(9, "KL002")]
