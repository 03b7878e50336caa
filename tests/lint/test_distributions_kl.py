"""torch.distributions.kl_divergence(p, q) of the policy's and the reference's next-token distributions is the
exact per-step KL over the vocabulary, KL(p || q): with the policy's first the reverse KL_t (as a loss, row 2's
KL003), with the reference's first the forward KL (row 3b's KL002), kl-math.md section 8. The two sides are told
apart by their names, as log-probs are; a lagging copy's distribution is neither."""

from __future__ import annotations

import pytest
from snippets import module_codes

from klaudit.lint.roles import distribution_side

TRAINER = """\
import torch
from torch.distributions import kl_divergence


def update(batch, actor, prior, objective, optimizer, kl_coef):
    with torch.no_grad():
        prior_dist = prior.get_dist(batch)
    kl = kl_divergence({first}, {second})
    kl = (kl * batch["mask"]).sum(-1).mean()
    loss = objective(batch, batch["advantages"]) + kl_coef * kl
    loss.backward()
    optimizer.step()
"""


@pytest.mark.parametrize(("first", "second", "expected"), [
    ("actor.get_dist(batch)", "prior_dist", [(10, "KL003")]),
    ("prior_dist", "actor.get_dist(batch)", [(10, "KL002")]),
])
def test_the_argument_order_gives_the_direction(tmp_path, first, second, expected):
    assert module_codes(TRAINER.format(first=first, second=second), tmp_path) == expected


def test_a_kl_to_the_lagging_policy_or_between_unnamed_objects_is_none_of_ours(tmp_path):
    assert module_codes(TRAINER.format(first="actor.get_dist(batch)", second="old_dist"), tmp_path) == []
    assert module_codes(TRAINER.format(first="p", second="q"), tmp_path) == []


def test_computed_under_no_grad_it_has_no_gradient(tmp_path):
    source = TRAINER.replace("    kl = kl_divergence", "    with torch.no_grad():\n        kl = kl_divergence")
    codes = module_codes(source.format(first="actor.get_dist(batch)", second="prior_dist"), tmp_path)
    assert [code for _, code in codes] == ["KL001"]


def test_distribution_sides_by_name():
    assert distribution_side("prior_dist") == distribution_side("ref_distribution") == "reference"
    assert distribution_side("actor_training.get_dist") == distribution_side("agent_dist") == "policy"
    assert distribution_side("old_dist") is None and distribution_side("prior") is None
    assert distribution_side("distance") is None
