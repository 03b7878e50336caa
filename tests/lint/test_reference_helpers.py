"""The policy's log-prob helper run on the reference model returns the reference's log-probs.

upul/grpo-from-scratch (twenty-first set) computes its reference as the policy with the LoRA adapter disabled,
`rlogp = ref_logps(policy, ...)`, a helper that calls the policy's `per_token_logps`; hand-written trainers
write `ref_lp = logps(ref_model, seq)` or `rl, _ = logps(ref, seq)`. The helper's body sees only `model(...)`:
its result is the reference's where the helper is named for the reference's log-probs or is given the reference
model (and none of the policy's log-probs). With that, the k3 added to the loss is KL002 (kl-math.md section 8,
row 3), not an expression of the policy alone.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from snippets import module_codes

HELPER = """\
    import torch


    def logps(model, seq):
        logits = model(seq).logits
        return torch.log_softmax(logits, -1).gather(-1, seq.unsqueeze(-1)).squeeze(-1)


    def ref_logps(policy, seq):
        with torch.no_grad(), policy.disable_adapter():
            return logps(policy, seq)


"""

TRAIN = """\
    def train(policy, {reference}, opt, seq, adv, beta):
        with torch.no_grad():
            r = {call}
        new = logps(policy, seq)
        kl = torch.exp(r - new) - (r - new) - 1
        loss = -(adv * new).mean() + beta * kl.mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
"""


def codes(tmp_path: Path, source: str) -> list[str]:
    return sorted({code for _, code in module_codes(source, tmp_path, "train.py")})


@pytest.mark.parametrize("reference, call", [
    ("ref_model", "logps(ref_model, seq)"),
    ("ref", "logps(ref, seq)"),
    ("trainer", "logps(trainer.ref_model, seq)"),
    ("unused", "ref_logps(policy, seq)"),
])
def test_the_policys_helper_on_the_reference_gives_the_reference_log_probs(tmp_path, reference, call):
    assert codes(tmp_path, HELPER + TRAIN.format(reference=reference, call=call)) == ["KL002"]


def test_a_helper_given_the_policys_log_probs_is_not_read_as_the_reference(tmp_path):
    """`pick(new, ref)` returns the policy's log-probs it was given: the k1 made of them is a loss (row 1)."""
    source = HELPER + """\
    def pick(logp, ref):
        return logp


    def train(policy, ref, seq):
        new = logps(policy, seq)
        kl = pick(new, ref) - ref
        loss = kl.mean()
        loss.backward()
"""
    assert codes(tmp_path, source) == ["KL001"]


def test_the_policy_helper_on_the_policy_stays_the_policy(tmp_path):
    assert codes(tmp_path, HELPER + TRAIN.format(reference="ref_model", call="logps(policy, seq)")) == []
