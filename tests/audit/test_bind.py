"""Binding: parameter names (the lint's naming table), annotations, defaults, overrides, switch literals."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from klaudit.audit.bind import BindError, Role, bind, parse_overrides, role_from_name, switch_literals

DATA = Path(__file__).parent / "data"


def _fixture_module(name: str):
    spec = importlib.util.spec_from_file_location(f"checkgrad_data_{name}", DATA / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


verl_style = _fixture_module("verl_style")
openrlhf_style = _fixture_module("openrlhf_style")


def test_names_from_the_lint_table():
    assert role_from_name("log_probs") is Role.LOGPROBS
    assert role_from_name("per_token_logps") is Role.LOGPROBS
    assert role_from_name("ref_per_token_logps") is Role.REF_LOGPROBS
    assert role_from_name("log_probs_base") is Role.REF_LOGPROBS
    assert role_from_name("old_log_probs") is Role.OLD_LOGPROBS
    assert role_from_name("action_mask") is Role.MASK
    assert role_from_name("logits") is Role.LOGITS
    assert role_from_name("ref_logits") is Role.REF_LOGITS
    assert role_from_name("advantages") is Role.ZEROS and role_from_name("token_level_rewards") is Role.ZEROS
    assert role_from_name("frobnicate") is None


def test_annotations_and_defaults():
    def term(logprobs, ref_logprobs, mask, beta: float, clip=0.2, use_x=False, extra=None, kind: str = "k3"):
        return logprobs

    binding = bind(term, switch_values={"kind": ["k1"]})
    assert binding.roles == {"logprobs": Role.LOGPROBS, "ref_logprobs": Role.REF_LOGPROBS, "mask": Role.MASK,
                             "beta": Role.COEF, "clip": Role.COEF, "use_x": Role.DEFAULT, "extra": Role.DEFAULT,
                             "kind": Role.SWITCH}
    assert binding.switches == {"kind": ("k3", "k1")}  # the default first, then the literals
    assert binding.modes() == [{"kind": "k3"}, {"kind": "k1"}]


def test_override_wins_and_unknown_parameters_are_named():
    def term(a, b):
        return a

    binding = bind(term, parse_overrides(["a=logprobs", "b=ref_logprobs"]))
    assert binding.roles == {"a": Role.LOGPROBS, "b": Role.REF_LOGPROBS}
    with pytest.raises(BindError, match="names no parameter of .*: c"):
        bind(term, parse_overrides(["a=logprobs", "c=mask"]))


def test_unbindable_parameter_lists_it_and_the_syntax():
    def term(logprobs, ref_logprobs, frobnicate, widget):
        return logprobs

    with pytest.raises(BindError) as error:
        bind(term)
    assert "frobnicate, widget" in str(error.value) and "--bind PARAM=ROLE" in str(error.value)


def test_a_term_without_policy_input_is_an_error():
    def term(ref_logprobs, mask):
        return ref_logprobs

    with pytest.raises(BindError, match="policy log-probs"):
        bind(term)


@pytest.mark.parametrize("spec", ["logprobs", "=logprobs", "x=", "x=tensor"])
def test_malformed_overrides(spec):
    with pytest.raises(BindError, match="--bind"):
        parse_overrides([spec])


def test_switch_literals_follow_calls_and_suffixes():
    values = switch_literals(verl_style.kl_penalty)["kl_penalty"]
    base = ["kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3", "full"]
    assert set(values) == set(base) | {value + "+" for value in base}


def test_switch_literals_of_if_chains_and_default():
    assert switch_literals(openrlhf_style.compute_approx_kl) == {"kl_estimator": ["k1", "k2", "k3"]}
    binding = bind(openrlhf_style.compute_approx_kl, switch_values=switch_literals(openrlhf_style.compute_approx_kl))
    assert [mode["kl_estimator"] for mode in binding.modes()] == ["k1", "k2", "k3"]


def test_match_statement_and_dict_dispatch():
    def by_match(logprobs, ref_logprobs, kind):
        match kind:
            case "a":
                return logprobs
            case "b" | "c":
                return ref_logprobs
        return logprobs

    def by_dict(logprobs, ref_logprobs, kind):
        return {"x": logprobs, "y": ref_logprobs}[kind]

    assert switch_literals(by_match) == {"kind": ["a", "b", "c"]}
    assert switch_literals(by_dict) == {"kind": ["x", "y"]}


def test_a_switch_without_literals_or_default_cannot_be_bound():
    def term(logprobs, ref_logprobs, kind: str):
        return logprobs

    with pytest.raises(BindError, match="kind"):
        bind(term, switch_values=switch_literals(term))


def test_aliases_and_unannotated_switches():
    """verl 0.9 strips the '+' into a new local before dispatching; the switch has no annotation."""

    def forward(logprobs, ref_logprobs, which):
        if which in ("k1", "kl"):
            return logprobs - ref_logprobs
        raise NotImplementedError

    def penalty(logprobs, ref_logprobs, kind):
        base = kind[:-1] if kind.endswith("+") else kind
        return forward(logprobs, ref_logprobs, base)

    values = switch_literals(penalty)
    assert values == {"kind": ["k1", "kl", "k1+", "kl+"]}
    assert bind(penalty, switch_values=values).roles["kind"] is Role.SWITCH


def test_bool_flags_tested_by_an_if_are_switches():
    def term(log_probs, log_probs_base, use_k3=False, use_abs: bool = False, keep=True):
        if use_k3:
            return log_probs
        elif not use_abs:
            return log_probs_base
        return log_probs if keep is None else log_probs_base

    values = switch_literals(term)
    assert values == {"use_k3": [False, True], "use_abs": [False, True]}
    binding = bind(term, switch_values=values)
    assert binding.roles["keep"] is Role.DEFAULT and len(binding.modes()) == 4
