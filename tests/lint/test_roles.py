"""Roles of expressions: names, producing calls, estimator spellings, detaching, accumulation.

Each expected estimator is the one the expression equals by algebra (kl-math.md section 2), e.g.
expm1(ref - logp) - (ref - logp) = exp(-d) - 1 + d = k3; nothing here is compared with a stored
output of the analysis itself.
"""

from __future__ import annotations

import textwrap

import libcst as cst
import pytest

from klaudit.catalog import Aggregation, Estimator, Position, Returns
from klaudit.lint import algebra as alg
from klaudit.lint.facts import param_facts
from klaudit.lint.flow import FunctionRun
from klaudit.lint.modules import Analyzer
from klaudit.lint.project import Project
from klaudit.lint.roles import bare_parameter_role, is_reference_model, might_contain_kl, sink_of_name, tensor_role
from klaudit.lint.syntax import params as parameters_of


def facts_of(body: str, name: str, params: str = "logp, ref_logp, old_logp, mask, logits, ref_logits", tmp_path=None):
    """The facts variable `name` holds at the end of a function with `body`."""
    source = f"import torch\nimport torch.nn.functional as F\n\ndef f({params}):\n" + textwrap.indent(
        textwrap.dedent(body), "    ")
    module = cst.parse_module(source)
    analyzer = Analyzer(Project([]))
    mod = analyzer.module("snippet.py", module)
    func = mod.functions["f"]
    env = {p.name.value: param_facts(p) for p in parameters_of(func)}
    run = FunctionRun(analyzer, mod, func, None, env, record=True)
    run.run()
    return run.env[name]


def estimators(facts, sink: str = "loss") -> set:
    return {t.estimator for f in facts if f.poly is not None for t in alg.terms_of(f.poly, sink)}


@pytest.mark.parametrize("text, expected", [
    ("kl = logp - ref_logp", True),
    ("loss = (logps - ref).sum()", True),
    ("kld = torch.exp(d) - d - 1", True),
    ("per_token_kl = f(x)", True),
    ("loss = compute_approx_kl(a, b)", True),
    ("teacher_logits = teacher(inputs).logits", True),
    ("lp = log_probs_ref.sum(-1)", True),
    # log-probs alone cannot hold a KL finding: without a KL name or a reference there is no KL term
    ("per_token_logps = selective_log_softmax(logits, ids)", False),
    ("x = model(inputs).log_softmax(-1)", False),
    ('"""Converges quickly, weakly or in bulk."""', False),
    ("def add(a, b):\n    return a + b\n", False),
    ("import os\nprint(os.getcwd())\n", False),
])
def test_prefilter_sees_the_vocabulary_of_kl_code(text, expected):
    assert might_contain_kl(text) is expected


@pytest.mark.parametrize("name, role", [
    ("log_probs", alg.POLICY), ("per_token_logps", alg.POLICY), ("action_log_probs", alg.POLICY),
    ("token_log_probs", alg.POLICY), ("response_logprobs", alg.POLICY),
    ("new_logprobs", alg.POLICY), ("curr_logprobs", alg.POLICY), ("logprob", alg.POLICY),
    ("ref_log_prob", alg.REF), ("ref_per_token_logps", alg.REF), ("base_action_log_probs", alg.REF),
    ("log_probs_base", alg.REF), ("reference_policy_logprobs", alg.REF), ("teacher_log_probs", alg.REF),
    ("old_log_probs", alg.OLD), ("rollout_log_probs", alg.OLD), ("prev_logprobs", alg.OLD),
    ("generation_logprobs", alg.OLD), ("vllm_logprobs", alg.OLD),
    ("log_ref_probs", alg.REF), ("log_cur_probs", alg.POLICY), ("log_gen_probs", alg.OLD), ("log_probs", alg.POLICY),
    ("log_all_probs", None),
    ("logits", alg.LOGITS), ("ref_logits", alg.REF_LOGITS), ("t_logits", alg.REF_LOGITS),
    ("advantages", None), ("kl_coef", None), ("response_mask", None),
])
def test_one_table_of_names(name, role):
    assert tensor_role(name) == role


@pytest.mark.parametrize("name, sink", [
    ("loss", "loss"), ("kl_loss", "loss"), ("per_token_loss", "loss"), ("token_level_rewards", "reward"),
    ("non_score_reward", "reward"), ("rlhf_reward", "reward"), ("advantages", "advantage"),
    ("kl_loss_coef", None), ("kl", None), ("loss_agg_mode", None), ("rewards_with_kl_penalty", "reward"),
])
def test_sink_names(name, sink):
    assert sink_of_name(name) == sink


@pytest.mark.parametrize("body", [
    "kl = torch.exp(ref_logp - logp) - (ref_logp - logp) - 1",
    "kl = torch.expm1(ref_logp - logp) - (ref_logp - logp)",
    "log_ratio = ref_logp - logp\nratio = torch.exp(log_ratio)\nkl = ratio - 1 - log_ratio",
    "log_ratio = logp - ref_logp\nlog_ratio = -log_ratio\nkl = log_ratio.exp() - 1 - log_ratio",
    "x = logp - ref_logp\nkl = torch.expm1(-x) + x",
    "ratio = torch.exp(ref_logp - logp)\nkl = ratio - torch.log(ratio) - 1",
])
def test_k3_in_every_spelling(body):
    assert estimators(facts_of(body, "kl")) == {Estimator.K3}


@pytest.mark.parametrize("body, expected", [
    ("kl = logp - ref_logp", Estimator.K1),
    ("kl = -(ref_logp - logp)", Estimator.K1),
    ("kl = 0.5 * (logp - ref_logp) ** 2", Estimator.K2),
    ("kl = (logp - ref_logp).square() / 2", Estimator.K2),
    ("kl = torch.square(ref_logp - logp)", Estimator.K2),
    ("kl = (logp - ref_logp).pow(2)", Estimator.K2),
    ("kl = (logp - ref_logp).abs()", Estimator.ABS),
    ("k2 = 0.5 * (logp - ref_logp).square()\nkl = k2 - k2.detach() + (logp - ref_logp).detach()", Estimator.K1_ST),
])
def test_other_estimators(body, expected):
    assert estimators(facts_of(body, "kl")) == {expected}


def test_exact_kl_over_the_vocabulary_and_its_direction():
    body = """
    lp = F.log_softmax(logits, dim=-1)
    lq = F.log_softmax(ref_logits, dim=-1)
    kl = (lp.exp() * (lp - lq)).sum(-1)
    rev = F.kl_div(lq, lp, log_target=True, reduction="none").sum(-1)
    fwd = F.kl_div(lp, lq, log_target=True, reduction="none").sum(-1)
    """
    assert estimators(facts_of(body, "kl")) == {Estimator.FULL}
    assert estimators(facts_of(body, "rev")) == {Estimator.FULL}
    assert estimators(facts_of(body, "fwd")) == {Estimator.FULL_FORWARD}  # KL(ref || pi)


def test_top_k_log_probs_are_a_slice_of_the_vocabulary():
    """`student_topk_logprobs` [.., k]: p * (log p - log q) summed over the k is the (truncated) exact KL_t, as
    over the whole vocabulary; a bare `topk_logprobs` names no side and stays unknown."""
    params = "student_topk_logprobs, teacher_topk_logprobs, topk_logprobs, ref_logp"
    body = """
    p = student_topk_logprobs.exp()
    kl = (p * (student_topk_logprobs - teacher_topk_logprobs)).sum(-1)
    unknown = (topk_logprobs.exp() * (topk_logprobs - ref_logp)).sum(-1)
    """
    assert estimators(facts_of(body, "kl", params)) == {Estimator.FULL}
    assert estimators(facts_of(body, "unknown", params)) <= {None}


def test_the_sign_of_the_log_ratio_is_kept():
    (term,) = alg.terms_of(facts_of("kl = ref_logp - logp", "kl")[0].poly, "loss")
    assert (term.estimator, term.sign) == (Estimator.K1, -1)


def test_detached_no_grad_and_containers_carry_no_gradient():
    body = """
    a = (logp - ref_logp).detach()
    with torch.no_grad():
        b = logp - ref_logp
    c = logp - ref_logp
    """
    assert not facts_of(body, "a")[0].poly.has_grad()
    assert not facts_of(body, "b")[0].poly.has_grad()
    assert facts_of(body, "c")[0].poly.has_grad()
    from_container = facts_of('lp = data.batch["old_log_probs"]\nk = lp - ref_logp', "k", params="data, ref_logp")
    assert not from_container[0].poly.has_grad()


def test_old_log_probs_make_an_importance_ratio_not_a_kl():
    facts = facts_of("ratio = torch.exp(logp - old_logp)", "ratio")
    assert not any(f.is_kl() for f in facts)


def test_reward_to_go_future_only_and_whole_sequence_returns():
    body = """
    d = (logp - ref_logp).detach() * mask
    rtg = d.flip(-1).cumsum(-1).flip(-1)
    future = rtg - d
    seq = d.sum(-1)
    a = logp * rtg
    b = logp * future
    """
    (rtg_term,) = alg.terms_of(facts_of(body, "a")[0].poly, "loss")
    assert (rtg_term.place, rtg_term.estimator, rtg_term.returns) == ("reward", Estimator.K1, Returns.TO_GO)
    (future_term,) = alg.terms_of(facts_of(body, "b")[0].poly, "loss")
    assert future_term.returns is Returns.FUTURE
    (seq_term,) = alg.terms_of(facts_of(body, "seq")[0].poly, "reward")
    assert seq_term.returns is Returns.SEQUENCE


def test_reversed_loop_accumulates_the_reward():
    body = """
    rewards = -(logp - ref_logp).detach()
    running = 0
    for t in reversed(range(rewards.size(1))):
        running = rewards[:, t] + running
    """
    (term,) = alg.terms_of(facts_of(body, "running")[0].poly, "reward")
    assert term.returns is Returns.TO_GO


def test_positions_and_aggregations():
    body = """
    d = logp - ref_logp
    last = d[:, -1]
    gathered = d.gather(1, lengths - 1)
    seq_mean = (d * mask).sum(-1) / mask.sum(-1)
    batch_mean = (d * mask).sum() / mask.sum()
    seq_k3 = torch.exp(-(d * mask).sum(-1)) - 1 + (d * mask).sum(-1)
    """
    params = "logp, ref_logp, mask, lengths"
    assert facts_of(body, "last", params)[0].position is Position.LAST
    assert facts_of(body, "gathered", params)[0].position is Position.LAST
    assert facts_of(body, "seq_mean", params)[0].aggregation is Aggregation.SEQ_MEAN
    assert facts_of(body, "batch_mean", params)[0].aggregation is Aggregation.BATCH_MEAN
    assert facts_of(body, "seq_k3", params)[0].position is Position.SEQUENCE


def test_switch_branches_stay_apart_and_are_labelled():
    body = """
    if kl_type == "k1":
        kl = logp - ref_logp
    elif kl_type in ("k3", "low_var_kl"):
        kl = torch.exp(ref_logp - logp) - (ref_logp - logp) - 1
    """
    facts = facts_of(body, "kl", params="logp, ref_logp, kl_type: str")
    labelled = {f.labels: estimators((f,)) for f in facts if f.is_kl()}
    assert labelled == {
        (("kl_type", ("k1",)),): {Estimator.K1},
        (("kl_type", ("k3", "low_var_kl")),): {Estimator.K3},
    }


# ---- roles from more names, and from how values are made -------------------------------------

@pytest.mark.parametrize("name, role", [
    ("new_logprobs_BT", alg.POLICY), ("logprobs_bt", alg.POLICY), ("old_logprob_BT", alg.OLD),
    ("ref_logprobs_BT", alg.REF), ("logits_BTV", alg.LOGITS), ("mask_BT", None),
    ("model_logprobs_model_data", alg.POLICY), ("ref_logprobs_model_data", alg.REF),
    ("model_logprobs_ref_data", alg.POLICY), ("model_logprobs_ref_data_sum", alg.POLICY), ("ref_logprobs_model_data_sum", alg.REF),
    ("sampled_logprobs", alg.OLD), ("sft_logprobs", alg.REF), ("base_logprobs", alg.REF),
    ("init_logprobs", alg.REF), ("teacher_logprobs", alg.REF), ("sft_logits", alg.REF_LOGITS),
    ("logp_t", None), ("logp_s", None),
    # `_t` after a name with its side word: the tensor concatenated from per-turn lists (JosephLi2023/CS224R)
    ("new_lp_t", alg.POLICY), ("old_lp_t", alg.OLD), ("ref_lp_t", alg.REF), ("teacher_t", None),
    # `lp` with a side word before or after it: the common abbreviation (Agentic-RAG-R1's curr_lp, old_lp, ref_lp)
    ("curr_lp", alg.POLICY), ("lp_new", alg.POLICY), ("old_lp", alg.OLD), ("b_old_lp", alg.OLD),
    ("prox_lp", alg.OLD), ("ref_lp", alg.REF), ("shift_ref_lp", alg.REF), ("teacher_lps", alg.REF),
    ("lp", None), ("target_lp", None), ("old_help", None), ("gen_alpha", None),
    # and a stage after the side word (rlhf_eval_lab's lp_new_pre / lp_ref_pre, before the update)
    ("lp_new_pre", alg.POLICY), ("lp_ref_pre", alg.REF), ("lp_old_pre", alg.OLD), ("lp_newest", None),
    # logits with the model or a part after the word (nugie-jax's logits_policy, zu-zi's logits_a / logits_r,
    # ShashankChandgude's logits_p / logits_q, a micro-batched forward's logits_chunk)
    ("logits_policy", alg.LOGITS), ("logits_a", alg.LOGITS), ("logits_p", alg.LOGITS), ("logits_chunk", alg.LOGITS),
    ("logits_r", alg.REF_LOGITS), ("logits_q", alg.REF_LOGITS), ("logits_ref", alg.REF_LOGITS),
    ("logits_processor", None), ("logits_to_keep", None), ("logits_soft_cap", None),
    # an optional value named so (legacy TRL's logits_or_none / ref_logits_or_none, returned when asked for)
    ("ref_logits_or_none", alg.REF_LOGITS), ("logits_or_none", alg.LOGITS), ("mask_or_none", None),
])
def test_shape_suffixes_and_more_model_names(name, role):
    assert tensor_role(name) == role


@pytest.mark.parametrize("others, role_of_new, role_of_old", [
    (["mask", "importance_ratio"], alg.POLICY, alg.OLD),
    (["mask", "compute_logprob_diff"], alg.POLICY, alg.OLD),
    (["items", "merge"], None, None),
])
def test_new_and_old_are_log_probs_only_among_log_prob_names(others, role_of_new, role_of_old):
    assert bare_parameter_role("new", ["old"] + others) == role_of_new
    assert bare_parameter_role("old", ["new"] + others) == role_of_old


@pytest.mark.parametrize("path, reference", [
    ("self.ref_model()", True), ("ref_outputs", True), ("self.teacher_model()", True), ("sft_policy()", True),
    ("self.model()", False), ("outputs", False), ("model.base_model()", False), ("self.refine()", False),
])
def test_reference_models_by_name(path, reference):
    assert is_reference_model(path) == reference


def test_log_softmax_of_a_reference_models_logits_is_the_reference():
    """k3 = exp(q - p) - 1 - (q - p) with q gathered from ref_model(...).logits whatever q is named."""
    body = """
    lp = torch.log_softmax(self.model(ids).logits, -1).gather(-1, labels)
    lq = torch.log_softmax(self.ref_model(ids).logits, -1).gather(-1, labels)
    kl = (lq - lp).exp() - 1 - (lq - lp)
    """
    assert estimators(facts_of(body, "kl", params="self, ids, labels")) == {Estimator.K3}


@pytest.mark.parametrize("body, name, expected", [
    ("per_token_kl = logp - data['anchor']", "per_token_kl", {Estimator.K1}),  # log pi - log ref
    ("kl = data['anchor'] - logp\nkl = kl.exp() - 1 - kl", "kl", {Estimator.K3}),  # log ref - log pi, then k3
    ("shift = logp - data['anchor']", "shift", set()),  # no KL name: no reference is assumed
    ("kl_coef = logp - data['anchor']", "kl_coef", set()),  # a coefficient's name is no KL
    ("approx_kl = logp - old_logp", "approx_kl", set()),  # both sides known: an importance log-ratio
])
def test_the_unexplained_side_of_a_kl_named_difference_with_the_policy_is_the_reference(body, name, expected):
    assert estimators(facts_of(body, name)) == expected


def test_a_float_literal_is_a_number():
    def poly(body):
        (fact,) = facts_of(body, "kl")
        return fact.poly

    doubled = poly("kl = 2 * (logp - ref_logp)")
    assert poly("kl = 2.0 * (logp - ref_logp)") == doubled != poly("kl = logp - ref_logp")


@pytest.mark.parametrize("body", [
    "d = logp - ref_logp\nkl = sum(x for x in [d * d])",  # a generator yields its element's facts: k2 (up to scale)
    "d = logp - ref_logp\nkl = sum({x for x in [d * d]})",  # and so does a set comprehension
])
def test_generator_and_set_comprehensions_hold_their_elements(body):
    assert estimators(facts_of(body, "kl")) == {Estimator.K2}
