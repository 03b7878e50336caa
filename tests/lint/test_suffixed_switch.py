"""A switch whose value is tested with endswith and then cut (verl 0.9's `kl_penalty`): `kind[:-1]` compared
with "k3" under `kind.endswith("+")` is the value "k3+", and `not kind.endswith("+")` is a set of values
labels can hold (the negation of a pattern), so each branch is judged at exactly the values that take it."""

from __future__ import annotations

import textwrap

import pytest

from klaudit.lint.engine import lint_paths
from klaudit.lint.facts import compatible, merge_labels, negated, takes
from klaudit.lint.query import site_verdicts

# The shape of verl 0.9.1's core_algos: the '+' is stripped before the dispatch, the plain value returns
# early, the others take k2's gradient with the plain estimator's value; "full" (and "full+") raise.
CORE_ALGOS = '''
import torch


def kl_penalty(logprob, ref_logprob, kl_penalty):
    base_kl_penalty = kl_penalty[:-1] if kl_penalty.endswith("+") else kl_penalty
    forward_score = kl_penalty_forward(logprob, ref_logprob, base_kl_penalty)
    if not kl_penalty.endswith("+") or kl_penalty in ("mse", "k2"):
        return forward_score
    backward_score = 0.5 * (logprob - ref_logprob).square()
    return backward_score - backward_score.detach() + forward_score.detach()


def kl_penalty_forward(logprob, ref_logprob, kl_penalty):
    if kl_penalty in ("kl", "k1"):
        return logprob - ref_logprob
    if kl_penalty == "abs":
        return (logprob - ref_logprob).abs()
    if kl_penalty in ("mse", "k2"):
        return 0.5 * (logprob - ref_logprob).square()
    if kl_penalty in ("low_var_kl", "k3"):
        kl = ref_logprob - logprob
        kl = torch.clamp(kl, min=-20, max=20)
        ratio = torch.exp(kl)
        kld = (ratio - kl - 1).contiguous()
        return torch.clamp(kld, min=-10, max=10)
    if kl_penalty == "full":
        raise NotImplementedError
    raise NotImplementedError
'''

LOSSES = '''
from core_algos import kl_penalty


def kl_loss(log_prob, ref_log_prob, response_mask, config):
    kld = kl_penalty(log_prob, ref_log_prob, kl_penalty=config.kl_loss_type)
    return (kld * response_mask).sum(-1).mean()


def apply_kl_penalty(token_level_scores, old_log_probs, ref_log_prob, beta, config):
    kld = kl_penalty(old_log_probs, ref_log_prob, kl_penalty=config.kl_penalty)
    token_level_rewards = token_level_scores - beta * kld
    return token_level_rewards
'''

# verl 0.9.1's verdicts, branch by branch: the plain values as before, every accepted '+' value as a loss
# with k2's gradient (KL003, row 2) and, in the reward, as the value it keeps (rows 6-9).
LOSS_RULES = {("kl", "k1"): ("KL001",), ("abs",): ("KL009",), ("mse", "k2"): ("KL003",),
              ("low_var_kl", "k3"): ("KL002",), ("kl+", "k1+"): ("KL003",), ("abs+",): ("KL003",),
              ("mse+", "k2+"): ("KL003",), ("low_var_kl+", "k3+"): ("KL003",)}
REWARD_RULES = {("kl", "k1"): (), ("abs",): ("KL004",), ("mse", "k2"): ("KL004",), ("low_var_kl", "k3"): ("KL004",),
                ("kl+", "k1+"): (), ("abs+",): ("KL004",), ("mse+", "k2+"): ("KL004",),
                ("low_var_kl+", "k3+"): ("KL004",)}


@pytest.fixture
def losses(tmp_path):
    (tmp_path / "core_algos.py").write_text(textwrap.dedent(CORE_ALGOS))
    path = tmp_path / "losses.py"
    path.write_text(textwrap.dedent(LOSSES))
    return str(path)


def test_each_branch_is_judged_at_the_values_that_take_it(losses):
    found: dict[str, dict] = {"loss": {}, "reward": {}}
    for site in site_verdicts(losses):
        (name, values), = site.labels
        found[site.placement][values] = site.rules
        assert name == ("kl_loss_type" if site.placement == "loss" else "kl_penalty")
    assert found == {"loss": LOSS_RULES, "reward": REWARD_RULES}  # "full" and "full+" raise: never named


def test_the_findings_name_the_suffixed_values(losses):
    """A finding names the values of its branch (one finding per verdict and estimator: where several branches
    give it, only the values they share are named)."""
    messages = [f.message for f in lint_paths([losses]).findings if f.line == 7]
    assert any(f.code == "KL003" and '[kl_loss_type="low_var_kl+"|"k3+"]' in f.message
               for f in lint_paths([losses]).findings)
    assert any('[kl_loss_type="low_var_kl"|"k3"]' in message for message in messages)
    assert not any("full" in message for message in messages)


def test_an_if_else_on_the_suffix(tmp_path):
    """`if kind.endswith("+")` with an else: the else runs at the values without the suffix."""
    path = tmp_path / "trainer.py"
    path.write_text(textwrap.dedent('''
        def penalty(log_probs, ref_log_probs, kind):
            plain = kind[:-1] if kind.endswith("+") else kind
            if plain == "k1":
                value = log_probs - ref_log_probs
            else:
                raise ValueError(kind)
            if kind.endswith("+"):
                k2 = 0.5 * (log_probs - ref_log_probs) ** 2
                return k2 - k2.detach() + value.detach()
            else:
                return value


        def kl_loss(log_probs, ref_log_probs, mask, config):
            return (penalty(log_probs, ref_log_probs, config.kl_type) * mask).sum()
    '''))
    assert {site.labels: site.rules for site in site_verdicts(str(path))} == {
        (("kl_type", ("k1",)),): ("KL001",), (("kl_type", ("k1+",)),): ("KL003",)}


def test_value_sets_narrow_and_exclude_each_other():
    """Literals, patterns, negated patterns and excluded literals."""
    assert takes("k3+", ("*+",)) and not takes("k3", ("*+",))
    assert takes("k3", ("!*+",)) and not takes("k3+", ("!*+",))
    assert negated(("*+",)) == ("!*+",) and negated(("!*+",)) == ("*+",) and negated((True,)) == (False,)
    assert negated(("k1", "kl")) == ("!=k1", "!=kl") and negated(("!=k1", "!=kl")) == ("k1", "kl")
    assert negated((0, 1)) is None  # the other numbers are not a set labels can hold
    assert takes("k3", ("!=k1", "!=kl")) and not takes("kl", ("!=k1", "!=kl"))
    assert merge_labels((("kind", ("k1", "k3")),), (("kind", ("!=k1",)),)) == (("kind", ("k3",)),)
    assert not compatible((("kind", ("k1",)),), (("kind", ("!=k1",)),))
    assert compatible((("kind", ("k1", "k3")),), (("kind", ("!=k1",)),))
    assert compatible((("kind", ("!=k1",)),), (("kind", ("!=k3",)),))
    assert merge_labels((("kind", ("k3", "k3+")),), (("kind", ("*+",)),)) == (("kind", ("k3+",)),)
    assert merge_labels((("kind", ("k3", "k3+")),), (("kind", ("!*+",)),)) == (("kind", ("k3",)),)
    assert merge_labels((("kind", ("k1", "kl")),), (("kind", ("k1",)),)) == (("kind", ("k1",)),)
    assert not compatible((("kind", ("*+",)),), (("kind", ("!*+",)),))
    assert not compatible((("kind", ("k3+",)),), (("kind", ("!*+",)),))
    assert compatible((("kind", ("k1", "kl")),), (("kind", ("k1",)),))
    assert not compatible((("flag", (True,)),), (("flag", (False,)),))


def test_a_function_a_registry_runs_under_some_names_takes_only_those(tmp_path, losses):
    """verl 0.9.1's distillation loss is registered under the plain names only (its config rejects any other
    loss_mode at start-up): the '+' branches of the helper it calls are never named there."""
    distillation = tmp_path / "distillation.py"
    distillation.write_text(textwrap.dedent('''
        from core_algos import kl_penalty


        def register_loss(settings):
            return lambda function: function


        @register_loss(dict(names=["kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3"], use_estimator=True))
        def distillation_loss(student_log_probs, teacher_log_probs, response_mask, loss_config):
            losses = kl_penalty(student_log_probs, teacher_log_probs, kl_penalty=loss_config.loss_mode)
            return (losses * response_mask).sum(-1).mean()
    '''))
    found = {site.labels[0][1]: site.rules for site in site_verdicts(str(distillation))}
    assert found == {values: rules for values, rules in LOSS_RULES.items() if not values[0].endswith("+")}
