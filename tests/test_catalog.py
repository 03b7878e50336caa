"""The catalog proves itself: every row's stated objective holds under exact enumeration.

Each row is built into its surrogate by the one builder (klaudit.audit.surrogates) and its exact
expected gradient is compared, in float64, with the reference gradients of the exact engine, on
several seeds, with and without EOS, at KL(pi || ref) of about 1 nat (near the reference the
biased loss-side rows look correct, kl-math.md §12).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from klaudit import catalog  # noqa: E402
from klaudit.audit.exact import ExactProblem, positive_multiple, relerr  # noqa: E402
from klaudit.audit.policies import TabularPolicy, perturbed, place_at_kl  # noqa: E402
from klaudit.audit.surrogates import build_surrogate, estimator_values  # noqa: E402
from klaudit.catalog import Aggregation, Estimator, Objective, Sampling, Target  # noqa: E402
from klaudit.config import FILE_CODES  # noqa: E402
from klaudit.rules import RULES  # noqa: E402

EXACT = 1e-9  # float64 enumeration: identities hold to rounding (~1e-15); 1e-9 leaves room.
DISTINCT = 1e-3  # an "other" gradient must differ from every target by far more than rounding.
STALENESS = 0.2  # pi_old = pi + 0.2 N(0, 1) on the logits: token ratios roughly in [0.6, 1.6].

TOYS = [  # (seed, eos, KL_seq)
    (0, True, 1.0),
    (1, True, 0.5),
    (2, True, 2.0),
    (3, False, 1.0),
]


def _problem(seed: int, eos: bool, kl: float) -> ExactProblem:
    torch.manual_seed(seed)
    reference = TabularPolicy.random(4, 4, eos=eos, seed=seed)
    policy = place_at_kl(reference, kl, seed=100 + seed)
    old_policy = perturbed(policy, STALENESS, seed=200 + seed)
    return ExactProblem(policy, reference, old_policy=old_policy)


@pytest.fixture(scope="module", params=TOYS, ids=lambda toy: f"seed{toy[0]}-{'eos' if toy[1] else 'fixed'}-kl{toy[2]}")
def toy(request):
    problem = _problem(*request.param)
    return request.param, problem, problem.targets()


def _expected_gradient(problem: ExactProblem, config: catalog.Config) -> torch.Tensor:
    return problem.expected_gradient(
        build_surrogate(config),
        aggregation=config.aggregation,
        off_policy=config.sampling is not Sampling.ON_POLICY,
    )


def _clamp_is_hit(problem: ExactProblem) -> bool:
    """Whether some enumerated token has k3 > 10, where low_var_kl's clamp changes the gradient."""
    batch = problem.batch()
    k3 = estimator_values(Estimator.K3, (batch.logprobs - batch.ref_logprobs).detach(), batch)
    return bool(((k3 > 10) & (batch.mask > 0)).any())


ROWS = [row for row in catalog.CATALOG]


@pytest.mark.parametrize("row", ROWS, ids=lambda row: f"#{row.number} {row.label}")
def test_row_objective_holds_exactly(row, toy):
    (seed, eos, kl), problem, targets = toy
    if row.needs_eos and not eos:
        pytest.skip("the verdict of this row needs lengths that vary")
    gradient = _expected_gradient(problem, row.config)
    rev_norm = torch.linalg.vector_norm(targets[Target.REV])

    if row.objective is Objective.ZERO:
        assert torch.linalg.vector_norm(gradient) < EXACT * rev_norm
        return
    if row.identity:
        combination = sum(weight * targets[target] for target, weight in row.identity.items())
        if row.config.aggregation is Aggregation.SUM:
            assert relerr(gradient, combination) < EXACT
        else:
            assert positive_multiple(gradient, combination) is not None
        return
    # No closed form: the gradient must differ from every target and from grad E[1/L].
    uses_low_var_kl = Estimator.LOW_VAR_KL in (row.config.loss, row.config.reward)
    if uses_low_var_kl and not _clamp_is_hit(problem):
        pytest.skip("no enumerated token reaches low_var_kl's clamp on this toy")
    for target, reference_gradient in targets.items():
        if torch.linalg.vector_norm(reference_gradient) > EXACT * rev_norm:
            assert relerr(gradient, reference_gradient) > DISTINCT, f"matches {target.value}"
            assert positive_multiple(gradient, reference_gradient) is None, f"proportional to {target.value}"


def test_the_mean_log_ratio_cuts_the_k3_return_by_the_length(toy):
    """Row 13b, exactly: k3_t * exp(mean_u (logp_u - sg logp_u)) has value k3_t and gradient grad k3_t + k3_t *
    s(y) / L, so its expected gradient is PFWD plus E[(1/L) K3(y) s(y)], the R-C return cut by 1/L (written
    here by hand, as a score-function surrogate of the enumerated sequences)."""
    (seed, eos, kl), problem, targets = toy
    [row] = [row for row in catalog.CATALOG if row.number == "13b"]

    def length_scaled_return(batch):
        log_ratio = (batch.logprobs - batch.ref_logprobs) * batch.mask
        k3 = ((torch.expm1(-log_ratio) + log_ratio) * batch.mask).sum(-1).detach()
        return (batch.logprobs * batch.mask).sum(-1) * k3 / batch.mask.sum(-1)

    expected = targets[Target.PFWD] + problem.expected_gradient(length_scaled_return)
    assert relerr(_expected_gradient(problem, row.config), expected) < EXACT


def test_the_log_prob_times_an_undetached_k1_adds_an_entropy_gradient(toy):
    """Row 13d, exactly: logp_t * delta_t differentiates to delta_t * s_t + logp_t * s_t. The first is the k1 reward
    on its own token (PART); the second, logp_t * s_t = grad(logp_t^2 / 2) with the sample held, has the expectation
    -grad H_t at each prefix (sum_v pi log pi grad log pi = grad sum_v pi log pi), written here from the logits."""
    (seed, eos, kl), problem, targets = toy
    [row] = [row for row in catalog.CATALOG if row.number == "13d"]

    def step_entropies(batch):
        log_probs = torch.log_softmax(batch.logits, dim=-1)
        return -((log_probs.exp() * log_probs).sum(-1) * batch.mask).sum(-1)

    minus_entropy_gradient = -problem.expected_gradient(step_entropies)
    assert relerr(problem.expected_gradient(lambda batch: 0.5 * (batch.logprobs.square() * batch.mask).sum(-1)),
                  minus_entropy_gradient) < EXACT
    assert relerr(_expected_gradient(problem, row.config), targets[Target.PART] + minus_entropy_gradient) < EXACT


def test_the_sequence_log_prob_times_an_undetached_k1_adds_the_response_entropy_gradient(toy):
    """Row 13e, exactly: S * D (S = sum_t logp_t, D = sum_t delta_t) differentiates to D * grad S + S * grad S. The
    first is k1 with the whole-sequence return (REV); the second has the expectation sum_y pi(y) log pi(y) grad log
    pi(y) = grad sum_y pi(y) log pi(y), minus the gradient of the response's entropy, here by autograd through the
    enumerated sum (prefixes not held: not row 13d's per-step entropies)."""
    (seed, eos, kl), problem, targets = toy
    [row] = [row for row in catalog.CATALOG if row.number == "13e"]
    batch = problem.batch()
    sequence_logprob = (batch.logprobs * batch.mask).sum(-1)
    minus_entropy_gradient = problem._flat_gradient((sequence_logprob.exp() * sequence_logprob).sum())
    assert relerr(_expected_gradient(problem, row.config), targets[Target.REV] + minus_entropy_gradient) < EXACT
    assert relerr(minus_entropy_gradient, targets[Target.REV]) > 0.05  # the extra term is no rescaled REV


def test_the_probability_weighted_k1_follows_a_half_collision_weighted_divergence(toy):
    """Row 5c, exactly: pi(y) * delta(y) differentiated with the sample held has, at each prefix, the expectation
    sum_v pi(v) (delta(v) + 1) grad pi(v), the gradient of sum_v pi(v)^2 (delta(v) + 1/2) / 2 (prefix held), written
    here from the logits; no KL target is that."""
    (seed, eos, kl), problem, targets = toy
    [row] = [row for row in catalog.CATALOG if row.number == "5c"]

    def step_divergences(batch):
        log_probs = torch.log_softmax(batch.logits, dim=-1)
        delta = log_probs - torch.log_softmax(batch.ref_logits, dim=-1)
        return ((0.5 * log_probs.exp().square() * (delta + 0.5)).sum(-1) * batch.mask).sum(-1)

    assert relerr(_expected_gradient(problem, row.config), problem.expected_gradient(step_divergences)) < EXACT


def test_low_var_kl_rows_are_checked_where_the_clamp_bites():
    """At least one toy reaches the clamp, so the low_var_kl rows are not vacuous."""
    assert any(_clamp_is_hit(_problem(*toy)) for toy in TOYS)


@pytest.mark.parametrize("row", ROWS, ids=lambda row: f"#{row.number} {row.label}")
def test_row_is_consistent(row):
    assert row.config is not None
    assert catalog.classify(row.config) is row
    assert row.rule is None or row.rule in RULES
    assert row.unbiased == (row.rule is None)
    if row.rule is None:
        assert row.objective is Objective.REV and set(row.identity) == {Target.REV}
        assert row.identity[Target.REV] > 0
    else:
        assert row.fix.startswith(("loss", "rewards", "aggregate", "sum", "subtract", "keep", "drop"))
        assert "klaudit.estimators." in row.fix
    assert row.explanation and not row.explanation[0].isupper() and not row.explanation.endswith(".")


def test_every_verdict_rule_has_a_catalog_row():
    """KL000 and KL099 are about the file, the informational KL1xx about the analysis: no row."""
    codes = {row.rule for row in catalog.CATALOG if row.rule}
    assert codes == {code for code in RULES if code.startswith("KL0")} - set(FILE_CODES)


C = catalog.Config
E = Estimator


@pytest.mark.parametrize(
    "config, rule",
    [
        (C(loss=E.K3, aggregation=Aggregation.SEQ_MEAN), "KL002"),  # the estimator is the first problem
        (C(loss=E.K2, reward=E.K1, returns=catalog.Returns.FUTURE, aggregation=Aggregation.SEQ_MEAN), "KL007"),
        (C(reward=E.K1, aggregation=Aggregation.SEQ_MEAN, sampling=Sampling.OFF_POLICY), "KL008"),
        (C(reward=E.K3, sign=-1), "KL011"),
        (C(loss=E.FULL, position=catalog.Position.LAST), "KL005"),
        (C(loss=E.K2, reward=E.K1, returns=catalog.Returns.FUTURE, aggregation=Aggregation.CONSTANT), None),
        (C(loss=E.K3, reward=E.K3, sampling=Sampling.TOKEN_IS), "KL008"),
        (C(loss=E.ABS, reward=E.K1), "KL006"),
        (C(loss=E.K3, reward=E.K1, returns=catalog.Returns.SEQUENCE), "KL006"),
        (C(loss=E.ABS, reward=E.K3, returns=catalog.Returns.FUTURE), "KL009"),
    ],
)
def test_classify_judges_unlisted_configurations(config, rule):
    assert catalog.classify(config).rule == rule


@pytest.mark.parametrize(
    "config, unbiased",
    [
        (C(loss=E.K2, reward=E.K1, returns=catalog.Returns.FUTURE, aggregation=Aggregation.CONSTANT), True),
        (C(loss=E.K2, reward=E.K1, returns=catalog.Returns.FUTURE, aggregation=Aggregation.SEQ_MEAN), False),
        (C(reward=E.K1, aggregation=Aggregation.SEQ_MEAN, sampling=Sampling.OFF_POLICY), False),
        (C(loss=E.K3, reward=E.K3, sampling=Sampling.TOKEN_IS), False),
        (C(loss=E.ABS, reward=E.K1), False),
        (C(loss=E.K3, reward=E.K1, returns=catalog.Returns.SEQUENCE), False),
        (C(loss=E.ABS, reward=E.K3, returns=catalog.Returns.FUTURE), False),
    ],
)
def test_classify_fallbacks_agree_with_enumeration(config, unbiased):
    """The verdict for a configuration outside the table is checked against exact gradients too."""
    problem = _problem(0, True, 1.0)
    targets = problem.targets()
    gradient = _expected_gradient(problem, config)
    assert (positive_multiple(gradient, targets[Target.REV]) is not None) == unbiased
    assert catalog.classify(config).unbiased == unbiased


def test_a_loss_on_top_of_the_k1_reward_counts_its_local_gradient_twice():
    """k3 loss + k1 whole-sequence return = REV + PFWD, the identity behind the generic KL006 verdict."""
    problem = _problem(0, True, 1.0)
    targets = problem.targets()
    gradient = _expected_gradient(problem, C(loss=E.K3, reward=E.K1, returns=catalog.Returns.SEQUENCE))
    assert relerr(gradient, targets[Target.REV] + targets[Target.PFWD]) < EXACT


@pytest.mark.parametrize("aggregation", [Aggregation.SUM, Aggregation.SEQ_MEAN])
@pytest.mark.parametrize("sampling", [Sampling.ON_POLICY, Sampling.OFF_POLICY])
def test_the_sign_of_a_k1_loss_cannot_turn_it_away_from_the_reference(aggregation, sampling):
    """A k1 loss's gradient is grad log pi: enumerated with two references it is the same, so a flipped
    sign pushes neither towards nor away from the reference and KL011 is not its defect (its own are)."""
    flipped = C(loss=E.K1, aggregation=aggregation, sampling=sampling, sign=-1)
    first = _problem(0, True, 1.0)
    other_reference = TabularPolicy.random(4, 4, eos=True, seed=7)
    second = ExactProblem(first.policy, other_reference, old_policy=first.old_policy)
    assert relerr(_expected_gradient(first, flipped), _expected_gradient(second, flipped)) < EXACT
    assert catalog.defects(flipped) == catalog.defects(C(loss=E.K1, aggregation=aggregation, sampling=sampling))
    assert catalog.classify(flipped) == catalog.classify(C(loss=E.K1, aggregation=aggregation, sampling=sampling))
    # a term whose gradient involves the reference keeps its sign defect
    k3 = C(loss=E.K3, aggregation=aggregation, sampling=sampling, sign=-1)
    assert relerr(_expected_gradient(first, k3), _expected_gradient(second, k3)) > 0.1
    assert catalog.defects(k3)[0].rule == "KL011"


TRANSFORMER_ROWS = [
    row for row in catalog.CATALOG
    if row.config.sampling is Sampling.ON_POLICY and row.config.aggregation is Aggregation.SUM
]


@pytest.fixture(scope="module")
def transformer_toy():
    """The same identities through a real model's code path: a tiny causal transformer, every response
    enumerated. Seed 2 puts a token beyond low_var_kl's clamp, so the clamped rows are not vacuous."""
    from klaudit.audit.policies import TinyCausalLM

    reference = TinyCausalLM(vocab_size=4, horizon=3, eos=True, seed=0)
    policy = place_at_kl(reference, 1.0, seed=2)
    problem = ExactProblem(policy, reference)
    assert _clamp_is_hit(problem)
    return problem, problem.targets()


@pytest.mark.parametrize("row", TRANSFORMER_ROWS, ids=lambda row: f"#{row.number} {row.label}")
def test_row_objective_holds_on_the_tiny_transformer(row, transformer_toy):
    problem, targets = transformer_toy
    gradient = _expected_gradient(problem, row.config)
    rev_norm = torch.linalg.vector_norm(targets[Target.REV])
    if row.objective is Objective.ZERO:
        assert torch.linalg.vector_norm(gradient) < EXACT * rev_norm
    elif row.identity:
        combination = sum(weight * targets[target] for target, weight in row.identity.items())
        assert relerr(gradient, combination) < EXACT
    else:
        assert relerr(gradient, targets[Target.REV]) > DISTINCT


def test_catalog_is_plain_python():
    """The linter reads the catalog, so importing it must not import torch."""
    import subprocess
    import sys

    code = "import sys, klaudit.catalog; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


@pytest.mark.parametrize("row", catalog.CATALOG, ids=lambda r: f"{r.number}:{r.label}")
def test_defects_of_a_row_include_its_own_rule(row):
    codes = [r.rule for r in catalog.defects(row.config)]
    assert len(codes) == len(set(codes))
    assert (row.rule in codes) if row.rule is not None else codes == []


# (configuration, clamped, every defect in order, its aspects fixed one at a time)
INDEPENDENT = [
    (C(loss=E.K3, aggregation=Aggregation.SEQ_MEAN), False, ("KL002", "KL007"),
     [C(loss=E.K3), C(reward=E.K1, aggregation=Aggregation.SEQ_MEAN)]),
    (C(loss=E.K3, sign=-1), False, ("KL011", "KL002"), [C(loss=E.K3), C(reward=E.K1, sign=-1)]),
    (C(reward=E.K1, aggregation=Aggregation.SEQ_MEAN, sampling=Sampling.OFF_POLICY), False, ("KL008", "KL007"),
     [C(reward=E.K1, sampling=Sampling.OFF_POLICY), C(reward=E.K1, aggregation=Aggregation.SEQ_MEAN)]),
    (C(loss=E.K2, sampling=Sampling.OFF_POLICY), False, ("KL003", "KL008"),
     [C(loss=E.K2), C(reward=E.K1, sampling=Sampling.OFF_POLICY)]),
]


@pytest.mark.parametrize("config, clamped, codes, one_fixed", INDEPENDENT)
def test_defects_reports_every_independent_defect(config, clamped, codes, one_fixed):
    """Each defect is independent: fixing any one aspect leaves a biased gradient (by enumeration)."""
    assert tuple(r.rule for r in catalog.defects(config, clamped)) == codes
    problem = _problem(0, True, 1.0)
    rev = problem.targets()[Target.REV]
    for partly in one_fixed:
        assert positive_multiple(_expected_gradient(problem, partly), rev) is None
        assert catalog.defects(partly)


@pytest.mark.parametrize(
    "config, clamped, codes",
    [
        (C(reward=E.K1), False, ()),
        (C(reward=E.K1), True, ("KL010",)),  # the clamp is the only defect: it is the one reported
        (C(loss=E.LOW_VAR_KL), True, ("KL002",)),  # the placement row already names the clamps
        # a clamp beside a wrong placement is a second defect: fixing either aspect leaves the other
        (C(reward=E.K1, returns=catalog.Returns.LOCAL), True, ("KL003", "KL010")),
        (C(loss=E.K2), True, ("KL003", "KL010")),
        (C(loss=E.K2, reward=E.K1, returns=catalog.Returns.FUTURE, aggregation=Aggregation.CONSTANT), False, ()),
        (C(reward=E.K2, returns=catalog.Returns.SEQUENCE), False, ("KL004",)),
    ],
)
def test_defects_of_single_aspects(config, clamped, codes):
    assert tuple(r.rule for r in catalog.defects(config, clamped)) == codes


@pytest.mark.parametrize("config, reported", [
    (catalog.Config(loss=Estimator.K3_ST), False),  # the clamp acts on the detached value, not on k2's gradient
    (catalog.Config(loss=Estimator.K1_ST), False),
    (catalog.Config(reward=Estimator.K3_ST), True),  # as a reward the value is the signal
    (catalog.Config(reward=Estimator.K1), True),
    (catalog.Config(loss=Estimator.K2), True),
])
def test_a_clamp_is_a_defect_where_it_reaches_the_gradient(config, reported):
    rules = {row.rule for row in catalog.defects(config, clamped=True)}
    assert ("KL010" in rules) is reported
    assert catalog.clamp_matters(config, True) is reported and not catalog.clamp_matters(config, False)
