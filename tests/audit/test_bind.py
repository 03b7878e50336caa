"""Binding: parameter names (the lint's naming table), annotations, defaults, overrides, switch literals."""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from klaudit.audit.bind import BindError, Role, bind, parse_overrides, role_from_name, switch_literals  # noqa: E402

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
    assert role_from_name("loss_weights") is Role.MASK  # xtuner: the mask over a token count
    assert role_from_name("weights") is None and role_from_name("loss_weights_scale") is None
    assert role_from_name("logits") is Role.LOGITS
    assert role_from_name("ref_logits") is Role.REF_LOGITS
    assert role_from_name("advantages") is Role.ZEROS and role_from_name("token_level_rewards") is Role.ZEROS
    assert role_from_name("frobnicate") is None


def test_bare_names_bind_among_log_prob_names():
    """`masked_kl(current, ref, mask)`: a bare `current` is the policy's log-probs where the function's names
    speak of KL or log-probs, and nothing elsewhere (a bare `ref` is the reference's anywhere)."""
    def masked_kl(current, ref, mask):
        return current

    assert bind(masked_kl).roles == {"current": Role.LOGPROBS, "ref": Role.REF_LOGPROBS, "mask": Role.MASK}
    assert role_from_name("current") is None and role_from_name("current", ["items", "merge"]) is None
    assert role_from_name("old", ["new", "ratio"]) is Role.OLD_LOGPROBS


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
    """verl's kl_penalty: every value its code accepts, the '+' ones too; "full" and "full+" raise, and are not
    audited (the lint labels no KL term with them)."""
    values = switch_literals(verl_style.kl_penalty)["kl_penalty"]
    base = ["kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3"]
    assert set(values) == set(base) | {value + "+" for value in base}
    assert values.index("k1") < values.index("k1+") < values.index("abs")  # in the order the code names them


def test_switch_literals_of_if_chains_and_default():
    assert switch_literals(openrlhf_style.compute_approx_kl) == {"kl_estimator": ["k1", "k2", "k3"]}
    binding = bind(openrlhf_style.compute_approx_kl, switch_values=switch_literals(openrlhf_style.compute_approx_kl))
    assert [mode["kl_estimator"] for mode in binding.modes()] == ["k1", "k2", "k3"]


# Each form of switch the lint reads, as check-grad audits it (klaudit.lint.query.switch_values_at).


def test_a_match_statement():
    def by_match(logprobs, ref_logprobs, kind):
        match kind:
            case "a":
                return logprobs - ref_logprobs
            case "b" | "c":
                return 0.5 * (logprobs - ref_logprobs) ** 2
        raise ValueError(kind)

    assert switch_literals(by_match) == {"kind": ["a", "b", "c"]}


def test_dict_dispatch():
    def by_dict(logprobs, ref_logprobs, kind):
        return {"x": logprobs - ref_logprobs, "y": (logprobs - ref_logprobs).abs()}[kind]

    assert switch_literals(by_dict) == {"kind": ["x", "y"]}


def test_integer_indexing():
    """open-instruct's stacked estimators, picked by an integer."""

    def by_index(logprobs, ref_logprobs, kl_estimator):
        delta = logprobs - ref_logprobs
        return torch.stack([delta, delta ** 2 / 2, torch.expm1(-delta) + delta])[kl_estimator]

    values = switch_literals(by_index)
    assert values == {"kl_estimator": [0, 1, 2]}
    assert [mode["kl_estimator"] for mode in bind(by_index, switch_values=values).modes()] == [0, 1, 2]


def test_a_numeric_comparison_gets_each_number_and_one_that_is_none_of_them():
    """TRL's self-distillation divergence: alpha == 0 forward, alpha == 1 reverse, a mixture otherwise."""

    def divergence(logprobs, ref_logprobs, alpha: float):
        if alpha == 0.0:
            return torch.expm1(ref_logprobs - logprobs) + logprobs - ref_logprobs
        elif alpha == 1.0:
            return logprobs - ref_logprobs
        return alpha * (logprobs - ref_logprobs) ** 2

    values = switch_literals(divergence)
    assert values == {"alpha": [0.0, 1.0, 0.5]}
    assert bind(divergence, switch_values=values).roles["alpha"] is Role.SWITCH


def _forward(logprobs, ref_logprobs, which):
    if which in ("k1", "kl"):
        return logprobs - ref_logprobs
    raise NotImplementedError


def _penalty(logprobs, ref_logprobs, kind):
    base = kind[:-1] if kind.endswith("+") else kind
    return _forward(logprobs, ref_logprobs, base)


def test_a_string_compared_after_its_suffix_is_cut():
    """verl 0.9 strips the '+' into a new local before dispatching in a function of the module; the switch has
    no annotation."""
    values = switch_literals(_penalty)
    assert sorted(values["kind"]) == ["k1", "k1+", "kl", "kl+"]
    assert bind(_penalty, switch_values=values).roles["kind"] is Role.SWITCH


def test_bool_flags_tested_by_an_if_are_switches():
    def term(log_probs, log_probs_base, use_k3=False, use_abs: bool = True, keep=True):
        delta = log_probs - log_probs_base
        if use_k3:
            return torch.expm1(-delta) + delta
        elif not use_abs:
            return delta
        return delta.abs() if keep is None else delta

    values = switch_literals(term)
    assert values == {"use_k3": [False, True], "use_abs": [True, False]}  # the default first
    binding = bind(term, switch_values=values)
    assert binding.roles["keep"] is Role.DEFAULT and len(binding.modes()) == 4


# ----- what lets check-grad call trainer code alone: coefficients, bare instances, token ids,
# ----- per-sequence scores and reward functions

ROOT = Path(__file__).parents[2]


@pytest.mark.parametrize("name", ["beta", "kl_coef", "kl_coeff", "init_kl_coef", "kl_ctl", "kl_weight",
                                  "kl_loss_coef", "_kl_beta"])
def test_kl_coefficient_names_bind_as_coefficients(name):
    assert role_from_name(name) is Role.COEF


@pytest.mark.parametrize("name", ["alpha", "vf_coef", "entropy_coef", "weight", "kl"])
def test_other_names_are_not_kl_coefficients(name):
    """`alpha` is a JSD mixing weight (TRL), `vf_coef` weighs the value loss: neither is beta."""
    assert role_from_name(name) is not Role.COEF


def test_a_coefficient_without_default_binds_by_name():
    def term(logps, ref_logps, beta):
        return logps

    assert bind(term).roles["beta"] is Role.COEF


def test_scores_are_zeroed_but_are_no_lint_sink():
    from klaudit.lint.roles import sink_of_name

    assert role_from_name("scores") is Role.ZEROS and role_from_name("score") is Role.ZEROS
    assert sink_of_name("scores") is None and sink_of_name("score") is None


@pytest.mark.parametrize("name", ["input_ids", "response_ids", "responses", "token_ids", "tokens", "completion_ids"])
def test_token_id_names(name):
    assert role_from_name(name) is Role.TOKENS


class _Trainer:
    def __init__(self, config):
        self.config = config
        self.kl_ctl = config.kl_ctl

    def penalty(self, logprobs, ref_logprobs):
        return self.kl_ctl.value * (logprobs - ref_logprobs)

    def scaled(self, logprobs, ref_logprobs):
        return self.beta * self.config.scale * (logprobs - ref_logprobs)


def test_bare_instance_reads_coefficients_as_one_and_records_them():
    from klaudit.audit.bind import bare_instance, defaulted_attributes

    method = bare_instance(_Trainer).penalty
    assert isinstance(method.__self__, _Trainer)
    assert method(3.0, 1.0) == 2.0 and defaulted_attributes(method) == ["kl_ctl"]
    assert defaulted_attributes(lambda x: x) == []


def test_bare_instance_names_a_missing_attribute_and_why():
    from klaudit.audit.bind import bare_instance

    with pytest.raises(AttributeError) as error:
        bare_instance(_Trainer).scaled(3.0, 1.0)
    message = str(error.value)
    assert "self.config is not set" in message and "__init__ did not run" in message and "_Trainer" in message


def test_bare_torch_module_does_not_recurse():
    """nn.Module's own __getattr__ reads self._parameters, which a bare instance lacks."""
    from klaudit.audit.bind import bare_instance

    class Actor(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.head = torch.nn.Linear(2, 2)

        def kl(self, logprobs, ref_logprobs):
            return self.kl_coef * (logprobs - ref_logprobs)

        def forward_kl(self, logprobs, ref_logprobs):
            return self.head(logprobs - ref_logprobs)

    actor = bare_instance(Actor)
    assert actor.kl(torch.tensor(2.0), torch.tensor(1.0)).item() == 1.0
    with pytest.raises(AttributeError, match="self.head is not set"):
        actor.forward_kl(torch.ones(2), torch.zeros(2))
    with pytest.raises(AttributeError):
        _ = actor._parameters


def test_a_method_that_needs_init_state_is_one_error_line(tmp_path):
    from klaudit.audit.runner import Target, audit_target

    source = tmp_path / "trainer.py"
    source.write_text("class Trainer:\n    def kl_loss(self, logprobs, ref_logprobs):\n"
                      "        return self.config.beta * (logprobs - ref_logprobs).sum()\n")
    report = audit_target(Target(path=str(source), qualname="Trainer.kl_loss"))
    (error,) = report.errors
    assert report.exit_code == 2 and "\n" not in error
    assert "raised AttributeError: self.config is not set" in error and "__init__ did not run" in error


def test_a_torch_module_method_is_named_without_its_instance_repr(tmp_path):
    """A bound method's repr shows its instance, and nn.Module's repr reads `_modules`, which a bare instance lacks:
    the audit names the method by its qualified name and runs (exact per-token reverse KL as a loss: row 2)."""
    from klaudit.audit.runner import Target, audit_target

    source = tmp_path / "losses.py"
    source.write_text("import torch\n\n\nclass ReverseKL(torch.nn.Module):\n"
                      "    def forward(self, logits, teacher_logits, mask):\n"
                      "        p = torch.log_softmax(logits, -1)\n"
                      "        kl = (p.exp() * (p - torch.log_softmax(teacher_logits, -1))).sum(-1)\n"
                      "        return (kl * mask).sum() / mask.sum()\n")
    report = audit_target(Target(path=str(source), qualname="ReverseKL.forward"))
    assert not report.errors
    assert [(row.objective, row.rule) for row in report.results] == [("PART", "KL003")]


def test_exact_batch_carries_the_sampled_tokens():
    """logprobs[n, t] = log_softmax(logits)[n, t, tokens[n, t]] on every real token."""
    from klaudit.audit.exact import ExactProblem
    from klaudit.audit.policies import TabularPolicy

    problem = ExactProblem(TabularPolicy.random(4, 4, eos=True, seed=0), TabularPolicy.random(4, 4, eos=True, seed=1))
    batch = problem.batch()
    assert batch.tokens.dtype == torch.int64 and batch.tokens.shape == batch.mask.shape
    real = batch.mask.bool()
    for logits, logprobs in ((batch.logits, batch.logprobs), (batch.ref_logits, batch.ref_logprobs)):
        gathered = torch.log_softmax(logits, -1).gather(-1, batch.tokens.unsqueeze(-1)).squeeze(-1)
        assert torch.equal(gathered[real], logprobs[real])


def test_tokens_reach_the_callable_and_follow_a_row():
    from klaudit.audit.measure import _row_of, fingerprint_batch, standard_problems

    batch = fingerprint_batch(standard_problems(count=1, transformer=False)[0], 4, seed=0)()

    def term(logits, input_ids, mask):
        return logits[..., 0] * mask

    args, kwargs = bind(term).arguments_for(batch, {})
    assert kwargs["input_ids"] is batch.tokens
    assert torch.equal(_row_of(batch, 2).tokens, batch.tokens[2:3])


def test_token_ids_from_a_prompt_and_response_slice():
    """Only the response is given, so `input_ids[:, -T:]` is the response; a k1 reward from the
    gathered log-probs is unbiased (kl-math.md section 8 row 6)."""
    import klaudit.audit

    def token_kl(logits, ref_logits, input_ids, response_mask):
        ids = input_ids[:, -response_mask.size(1):, None]
        logp = torch.log_softmax(logits, -1).gather(-1, ids).squeeze(-1)
        ref = torch.log_softmax(ref_logits, -1).gather(-1, ids).squeeze(-1)
        return (logp - ref) * response_mask

    (row,) = klaudit.audit.check(token_kl, placement="reward").results
    assert (row.objective, row.rule, row.unbiased) == ("REV", None, True)


def test_causal_lm_inputs_one_position_longer_than_the_response():
    """`logits[:, :-1]` scored against `input_ids[..., 1:]` (the causal-LM shift): each receives one more position,
    which the code's own cut removes. The sequence log-ratio as a loss has zero expected gradient (kl-math.md
    section 8, row 1)."""
    import klaudit.audit

    def sequence_kl(logits, ref_logits, input_ids, mask):
        labels = input_ids[..., 1:].unsqueeze(-1)
        logp = (torch.log_softmax(logits[:, :-1], -1).gather(-1, labels).squeeze(-1) * mask).sum(1)
        ref = (torch.log_softmax(ref_logits[..., :-1, :], -1).gather(-1, labels).squeeze(-1) * mask).sum(1)
        return (logp - ref).mean()

    assert bind(sequence_kl).longer == {"logits": ("last", 1), "ref_logits": ("last", -2), "input_ids": ("first", -1)}
    (row,) = klaudit.audit.check(sequence_kl, placement="loss").results
    assert (row.objective, row.rule) == ("ZERO", "KL001")


def test_a_cut_after_an_ellipsis_lengthens_only_the_positions_axis():
    """`x[..., 1:]` cuts the last axis: the positions of ids [B, T], but the vocabulary of logits [B, T, V]."""
    from klaudit.audit.measure import fingerprint_batch, standard_problems

    batch = fingerprint_batch(standard_problems(count=1, transformer=False)[0], 4, seed=0)()

    def term(logits, input_ids, mask):
        return torch.log_softmax(logits[..., 1:], -1).max(-1).values * mask + 0 * input_ids[..., 1:]

    _, kwargs = bind(term).arguments_for(batch, {})
    assert kwargs["logits"].shape == batch.logits.shape
    assert kwargs["input_ids"].shape == (batch.tokens.shape[0], batch.tokens.shape[1] + 1)
    assert torch.equal(kwargs["input_ids"][:, 1:], batch.tokens)


def test_a_parameter_also_read_whole_keeps_the_response_length():
    def token_kl(logits, ref_logits, mask):
        kept = logits[:, :-1] if logits.size(1) > mask.size(1) else logits
        return (torch.log_softmax(kept, -1) - torch.log_softmax(ref_logits, -1)).sum(-1) * mask

    assert bind(token_kl).longer == {}


def test_a_parameter_the_code_fills_in_itself_keeps_its_default():
    """`if student_logprobs is None: student_logprobs = log_softmax(logits)` (DistiLLM-style losses): the optional
    parameter is the code's own value, not a second input. The exact per-token reverse KL over the vocabulary,
    averaged over the batch's tokens, as a loss follows the local half (PART, KL003, kl-math.md section 8 row 2)."""
    import klaudit.audit

    def reverse_kl(logits, teacher_logits, mask, student_logprobs=None, teacher_logprobs=None):
        if student_logprobs is None:
            student_logprobs = torch.log_softmax(logits, -1)
        if teacher_logprobs is None:
            teacher_logprobs = torch.log_softmax(teacher_logits, -1)
        per_token = (student_logprobs.exp() * (student_logprobs - teacher_logprobs)).sum(-1).view(-1)
        return (per_token * mask.view(-1)).sum() / mask.sum()

    roles = bind(reverse_kl).roles
    assert roles["student_logprobs"] is roles["teacher_logprobs"] is Role.DEFAULT
    (row,) = klaudit.audit.check(reverse_kl, placement="loss").results
    assert (row.objective, row.rule) == ("PART", "KL003")


def test_a_per_token_result_flattened_in_row_order_is_read_per_token():
    """`.view(-1)` of a per-token [B, T] term: the same rows as the term itself (row 6 as a reward, row 1 as a loss)."""
    import klaudit.audit

    def flat(logprobs, ref_logprobs, mask):
        return ((logprobs - ref_logprobs) * mask).view(-1)

    def shaped(logprobs, ref_logprobs, mask):
        return (logprobs - ref_logprobs) * mask

    verdicts = [[(row.placement, row.objective, row.rule) for row in klaudit.audit.check(fn, placement="both").results]
                for fn in (flat, shaped)]
    assert verdicts[0] == verdicts[1] and {objective for _, objective, _ in verdicts[0]} == {"REV", "ZERO"}


def test_code_that_takes_the_batch_as_one_token_vector_is_fed_flattened_inputs():
    """mini-verl's `verl_k1_estimator` raises ValueError unless its log-probs are one vector: the inputs are retried
    flattened to [B*T] and the per-token result read back per row. k3 as a loss follows the forward KL (PFWD,
    KL002, kl-math.md section 8 row 3), the verdict of the same code on [B, T]."""
    import klaudit.audit

    def k3_tokens(policy_logps, ref_logps):
        if policy_logps.dim() != 1 or ref_logps.shape != policy_logps.shape:
            raise ValueError("policy_logps must be a one-dimensional token vector")
        gap = ref_logps - policy_logps
        return torch.exp(gap) - gap - 1

    def k3_rows(policy_logps, ref_logps):
        gap = ref_logps - policy_logps
        return torch.exp(gap) - gap - 1

    report = klaudit.audit.check(k3_tokens, placement="loss")
    assert not report.errors and [(row.objective, row.rule) for row in report.results] == [("PFWD", "KL002")]
    assert [row.cos_rev for row in report.results] == [row.cos_rev for row in klaudit.audit.check(
        k3_rows, placement="loss").results]
    assert any("one token vector [B*T] ([B, T] raised ValueError)" in note for note in report.notes)
    binding = dataclasses.replace(bind(k3_tokens), flat_tokens=True)
    assert binding.arguments_for(_tiny_batch(), {})[1]["policy_logps"].shape == (6,)


def test_each_tokens_own_value_as_its_advantage_gives_the_local_gradient():
    """The `advantage` placement: a detached k1 that multiplies only its own token's score (slime's on-policy
    distillation advantages) follows the per-token local gradient, as k2 as a loss does (PART, KL003,
    kl-math.md section 8); the same values as a reward-to-go are the reverse KL (REV, row 6)."""
    import klaudit.audit

    def token_k1(logprobs, ref_logprobs):
        return logprobs - ref_logprobs

    reports = {placement: klaudit.audit.check(token_k1, placement) for placement in ("advantage", "reward")}
    rows = {placement: [(row.objective, row.rule) for row in report.results] for placement, report in reports.items()}
    assert rows == {"advantage": [("PART", "KL003")], "reward": [("REV", None)]}
    # named as the code places it, the k2 loss of the same per-sample gradient listed as its twin
    (row,) = reports["advantage"].results
    assert row.configuration.startswith("k1 in the reward (same-token)")
    assert "k2 differentiated as a loss, token-sum, on-policy" in row.same_gradient_as


def test_a_list_of_one_tensor_per_sequence_is_read_as_the_batch():
    """slime keeps per-sample lists: `[lp - ref for lp, ref in zip(logprobs, ref_logprobs)]` is the [B, T] values, not
    its first sequence (a tuple's first item stays the term: `(loss, metrics)`)."""
    import klaudit.audit

    def per_sample(logprobs, ref_logprobs):
        return [policy - reference for policy, reference in zip(logprobs, ref_logprobs)]

    def with_metrics(logprobs, ref_logprobs):
        return logprobs - ref_logprobs, {"kl": 0.0}

    for fn in (per_sample, with_metrics):
        report = klaudit.audit.check(fn, placement="reward")
        assert not report.errors and [(row.objective, row.rule) for row in report.results] == [("REV", None)]


def test_a_shape_the_code_fails_to_unpack_is_not_retried_flattened():
    """TRL's ULDLoss._compute_jsd_loss_for_matched_tokens unpacks `rows, width = student_logits.shape` of matched
    probabilities: a [B, T, V] input fails there, and flattened to [B*T, V] it would run on logits read as
    probabilities. Only a refusal the code raises itself is retried; this failure is reported."""
    import klaudit.audit

    def matched_rows(logits, ref_logits):
        rows, width = logits.shape
        return (logits.softmax(-1) * (logits.log_softmax(-1) - ref_logits.log_softmax(-1))).sum(-1)

    report = klaudit.audit.check(matched_rows, placement="loss")
    assert report.results == [] and "too many values to unpack" in report.errors[0]


def test_a_type_check_of_the_mask_is_retried_with_a_boolean_mask():
    """meta-rlvr's `grpo_policy_loss` raises TypeError on a float mask; a boolean one works: k1 as a loss,
    token-mean, has zero expected gradient (ZERO, KL001, row 1)."""
    import klaudit.audit

    def k1_loss(logprobs, ref_logprobs, completion_mask):
        if completion_mask.dtype != torch.bool:
            raise TypeError("completion_mask must be torch.bool")
        return (logprobs - ref_logprobs)[completion_mask].mean()

    report = klaudit.audit.check(k1_loss, placement="loss")
    assert not report.errors and [(row.objective, row.rule) for row in report.results] == [("ZERO", "KL001")]


def test_per_sequence_scores_are_retried_as_b_zeros():
    """A score added at the last token fails on zeros [B, T]; zeros [B] work, and a note says so."""
    import klaudit.audit

    def kl_with_score(logprobs, ref_logprobs, mask, scores):
        kl = (logprobs - ref_logprobs) * mask
        last = mask.sum(-1).long() - 1
        kl[torch.arange(kl.size(0)), last] -= scores
        return kl

    report = klaudit.audit.check(kl_with_score, placement="reward")
    assert not report.errors and [row.objective for row in report.results] == ["REV"]
    assert any("scores of" in note and "per-sequence zeros [B]" in note for note in report.notes)
    binding = bind(kl_with_score)
    assert binding.arguments_for(_tiny_batch(), {})[1]["scores"].shape == (3, 2)
    assert dataclasses.replace(binding, sequence_zeros=True).arguments_for(_tiny_batch(), {})[1]["scores"].shape == (3,)


def test_a_failure_that_zeros_b_do_not_cure_reports_the_first_call():
    import klaudit.audit

    def broken(logprobs, ref_logprobs, advantages):
        if advantages.dim() == 1:
            raise IndexError("fails on per-sequence advantages too")
        raise RuntimeError("fails on per-token advantages")

    (error,) = klaudit.audit.check(broken).errors
    assert "broken raised RuntimeError: fails on per-token advantages" in error


def test_a_reward_function_is_audited_negated_as_a_reward():
    """compute_rewards returns score - beta * k1: the negation, k1 in the reward, is row 6 (REV). The
    same function adding the KL as a bonus is the wrong sign (-REV, rule KL011)."""
    import klaudit.audit

    def compute_rewards(logprobs, ref_logprobs, mask):
        return -(logprobs - ref_logprobs).detach() * mask

    def compute_token_level_rewards(logprobs, ref_logprobs, mask):
        return (logprobs - ref_logprobs).detach() * mask

    report = klaudit.audit.check(compute_rewards)
    (row,) = report.results
    assert (row.placement, row.objective, row.rule, row.unbiased) == ("reward", "REV", None, True)
    assert "result negated: a reward" in row.aggregation and any("negation" in note for note in report.notes)
    (bonus,) = klaudit.audit.check(compute_token_level_rewards).results
    assert (bonus.placement, bonus.objective, bonus.rule, bonus.unbiased) == ("reward", "OTHER", "KL011", False)


def test_old_logprobs_the_result_ignores_make_the_audit_on_policy():
    """With the advantages zeroed, a PPO-clip loss reads old log-probs only in the policy term, so the KL
    part is audited on-policy (pi_old = pi): k1 in the reward is row 6 (REV). A term whose KL itself
    reads them stays off-policy: k1 reward-to-go with per-decision weights is row 25 (REV)."""
    import klaudit.audit
    from klaudit.estimators import kl_penalty

    def ppo_kl_reward(logprobs, old_logprobs, ref_logprobs, advantages, mask):
        ratio = torch.exp(logprobs - old_logprobs)
        return (-ratio * advantages + (logprobs - ref_logprobs).detach()) * mask

    report = klaudit.audit.check(ppo_kl_reward, placement="reward")
    assert [(row.objective, row.unbiased) for row in report.results] == [("REV", True)]
    assert any("old_logprobs of" in note and "audited on-policy" in note for note in report.notes)

    def weighted_kl_loss(logprobs, old_logprobs, ref_logprobs, mask):
        return kl_penalty(logprobs, ref_logprobs, mask, old_logprobs=old_logprobs).loss.mean()

    report = klaudit.audit.check(weighted_kl_loss)
    assert [(row.objective, row.unbiased) for row in report.results] == [("REV", True)]
    assert "per-decision" in report.results[0].configuration
    assert not any("on-policy" in note for note in report.notes)


def test_a_rollout_kl_of_the_sampling_policys_log_probs_is_audited_as_the_policys():
    """A KL reward computed at the rollout takes the sampling policy's log-probs (`old_log_probs`) and the
    reference's, and no others: those are the policy's own there, so it binds with them as the policy's,
    detached (on-policy), and is audited as a reward. k1 reward-to-go is row 6 (REV, unbiased); k3 in the
    reward is row 7 (OTHER, KL004). A callable that also takes the policy's log-probs keeps its old ones old."""
    import klaudit.audit

    def rollout_k1(old_log_probs, ref_log_probs):
        return old_log_probs - ref_log_probs

    def rollout_k3(old_log_probs, ref_log_probs):
        log_ratio = ref_log_probs - old_log_probs
        return log_ratio.exp() - 1 - log_ratio

    binding = bind(rollout_k1)
    assert binding.current_old and not binding.off_policy
    assert not bind(lambda log_probs, old_log_probs, ref_log_probs: None).current_old
    rows = {fn.__name__: [(row.placement, row.objective, row.rule) for row in klaudit.audit.check(fn).results]
            for fn in (rollout_k1, rollout_k3)}
    assert rows == {"rollout_k1": [("reward", "REV", None)], "rollout_k3": [("reward", "OTHER", "KL004")]}
    report = klaudit.audit.check(rollout_k1)
    assert any("old_log_probs of" in note and "sampling policy" in note for note in report.notes)


def test_an_importance_ratio_input_is_bound_as_the_ratio_to_the_sampling_policy():
    """`--bind importance_ratio=ratio` hands a KL helper exp(logp - old) (slime's compute_approx_kl(...,
    importance_ratio=...), DeepSeek-V3.2's unbiased KL): on-policy, exp(logp - sg logp), whose value is 1 and
    whose gradient is the score. k3 times it as a loss is row 3c (PART, KL003); left at its default None the same
    helper is k3 as a loss, row 3 (PFWD, KL002)."""
    import klaudit.audit

    def approx_kl(log_probs, ref_log_probs, importance_ratio=None):
        log_ratio = ref_log_probs - log_probs
        kl = log_ratio.exp() - 1 - log_ratio
        return kl if importance_ratio is None else importance_ratio * kl

    weighted = klaudit.audit.check(approx_kl, "loss", bind={"importance_ratio": "ratio"})
    plain = klaudit.audit.check(approx_kl, "loss")
    assert [(row.objective, row.rule) for row in weighted.results] == [("PART", "KL003")]
    assert [(row.objective, row.rule) for row in plain.results] == [("PFWD", "KL002")]


def test_score_weighted_k1_and_k2_are_recognised_per_sample():
    """k1 and k2 multiplied by exp(logp - sg(logp)) (NeMo-RL from 0.7; slime's compute_approx_kl with an
    importance ratio, on-policy) are catalog rows: ratio*k1 is row 2 (PART, KL003), ratio*k2 row 13c (OTHER,
    KL009); check-grad names them instead of reporting an unrecognised per-sample gradient."""
    import klaudit.audit

    def k1_scored(log_probs, ref_log_probs):
        return (log_probs - ref_log_probs) * torch.exp(log_probs - log_probs.detach())

    def k2_scored(log_probs, ref_log_probs):
        return 0.5 * (log_probs - ref_log_probs) ** 2 * torch.exp(log_probs - log_probs.detach())

    rows = {fn.__name__: [(row.objective, row.rule, "same-token" in row.configuration)
                          for row in klaudit.audit.check(fn, "loss").results] for fn in (k1_scored, k2_scored)}
    assert rows == {"k1_scored": [("PART", "KL003", True)], "k2_scored": [("OTHER", "KL009", True)]}


def _tiny_batch():
    from klaudit.audit.batch import Batch

    logprobs = torch.log(torch.full((3, 2), 0.5, dtype=torch.float64))
    return Batch(logprobs, logprobs, torch.ones(3, 2, dtype=torch.float64), tokens=torch.zeros(3, 2, dtype=torch.long))


# The lint-fixture functions that needed these binding rules, and the notes that say which rule acted
# (their objectives against kl-math.md section 8: tests/audit/test_check_grad_fixtures.py).
FIXTURE_NOTES = {
    ("bad/ppo_gae_trainer.py", "PPOTrainer.compute_rewards"): ("self.kl_ctl", "set to 1.0", "scores of", "negation"),
    ("fixed/ppo_gae_trainer.py", "PPOTrainer.compute_rewards"): ("self.kl_ctl", "set to 1.0", "negation"),
    ("fixed/exact_kl_reward.py", "RolloutWorker.actor_kl_loss"): ("self.kl_coef", "set to 1.0"),
    ("bad/grpo_pkg/loss.py", "grpo_loss"): ("advantages of", "per-sequence zeros [B]", "audited on-policy"),
    ("fixed/grpo_pkg/loss.py", "grpo_loss"): ("advantages of", "per-sequence zeros [B]", "audited on-policy"),
}


@pytest.mark.parametrize("file, qualname", sorted(FIXTURE_NOTES))
def test_lint_fixture_functions_say_how_they_were_called(file, qualname):
    """In one process: the bad and the fixed grpo_pkg share a package name, and each is audited."""
    from klaudit.audit.runner import Target, audit_target

    report = audit_target(Target(path=str(ROOT / "fixtures" / file), qualname=qualname))
    assert report.results and not report.errors, report.errors
    notes = " | ".join(report.notes)
    for phrase in FIXTURE_NOTES[file, qualname]:
        assert phrase in notes, (phrase, notes)


@pytest.mark.parametrize("name", ["entropy_weight", "entropy_coef", "ent_coef", "entropy_coeff", "entropy_bonus",
                                  "entropy_bonus_coef"])
def test_an_entropy_bonus_coefficient_is_switched_off(name):
    assert role_from_name(name) is Role.OFF


@pytest.mark.parametrize("name", ["entropy", "entropy_loss", "kl_coef", "parent_weight"])
def test_other_names_are_no_entropy_coefficients(name):
    assert role_from_name(name) is not Role.OFF


def test_an_entropy_bonus_beside_the_kl_term_is_left_out_of_the_audit():
    """Megatron-LM's calculate_grpo_loss adds an entropy bonus with a float weight of its own beside the k3
    term: with that weight at 0 the audit measures the k3 loss alone, whose exact expected gradient is the
    per-token forward KL's (PFWD, kl-math.md section 8 row 3); at 1 it measured a mixture."""
    import klaudit.audit

    def grpo_loss(current_logprobs, ref_logprobs, advantages, kl_beta: float, entropy_weight: float):
        ref_diff = ref_logprobs - current_logprobs
        kl_term = ref_diff.exp() - ref_diff - 1
        entropy_term = -current_logprobs.exp() * current_logprobs
        policy = torch.exp(current_logprobs - current_logprobs.detach()) * advantages
        return -policy + kl_beta * kl_term - entropy_weight * entropy_term

    report = klaudit.audit.check(grpo_loss, placement="loss")
    assert not report.errors and [row.objective for row in report.results] == ["PFWD"]
    assert bind(grpo_loss).arguments_for(_tiny_batch(), {})[1]["entropy_weight"] == 0.0
