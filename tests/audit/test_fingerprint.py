"""Fingerprint: a term's per-sample gradient names its catalog configuration on one batch."""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")

from klaudit.audit.fingerprint import Fingerprinter, candidate_configs  # noqa: E402
from klaudit.audit.measure import fingerprint_batch, standard_problems  # noqa: E402
from klaudit.audit.surrogates import build_surrogate  # noqa: E402
from klaudit.catalog import CATALOG, Aggregation, Config, Estimator, Objective, Returns, Sampling  # noqa: E402


@pytest.fixture(scope="module")
def on_policy():
    problem = standard_problems(count=1, transformer=False)[0]
    return Fingerprinter(fingerprint_batch(problem, 16, seed=0))


@pytest.fixture(scope="module")
def off_policy():
    problem = standard_problems(off_policy=True, count=1, transformer=False)[0]
    return Fingerprinter(fingerprint_batch(problem, 16, seed=0), off_policy=True)


def _summed(config: Config, factor: float = 1.0):
    surrogate = build_surrogate(config)
    return lambda batch: factor * surrogate(batch).sum()


ON_POLICY_ROWS = [row for row in CATALOG if row.config is not None and row.config.sampling is Sampling.ON_POLICY
                  and row.config.aggregation in (Aggregation.SUM, Aggregation.SEQ_MEAN)]


@pytest.mark.parametrize("row", [r for r in ON_POLICY_ROWS if r.config.aggregation is Aggregation.SUM],
                         ids=lambda row: row.label)
def test_every_row_is_named_by_its_own_class(on_policy, row):
    """A catalog surrogate is identified as itself or as a row with the same per-sample gradient,
    which has the same objective and the same verdict."""
    match = on_policy.identify(_summed(row.config))
    assert match is not None
    assert match.scale == pytest.approx(1.0, rel=1e-9)
    assert match.row.objective is row.objective
    assert match.row.unbiased is row.unbiased
    assert (match.row.rule is None) is (row.rule is None)


def test_classes_are_named_by_the_first_row(on_policy):
    """k1+, k3+, ratio*k3 and a same-token k1 reward have k2's per-sample gradient (kl-math.md 3.2)."""
    for estimator in (Estimator.K1_ST, Estimator.K3_ST, Estimator.RATIO_K3):
        assert on_policy.identify(_summed(Config(loss=estimator))).row.label == "k2 as loss"
    local = Config(reward=Estimator.K1, returns=Returns.LOCAL)
    assert on_policy.identify(_summed(local)).row.label == "k2 as loss"
    k2_future = Config(loss=Estimator.K2, reward=Estimator.K1, returns=Returns.FUTURE)
    assert on_policy.identify(_summed(k2_future)).row.label == "k1 in reward, reward-to-go"


def test_clamped_k3_is_told_from_k3(on_policy):
    """The batch holds the most extreme log-ratios, so verl's clamps act and the rows differ."""
    assert on_policy.identify(_summed(Config(loss=Estimator.K3))).row.label == "k3 as loss"
    assert on_policy.identify(_summed(Config(loss=Estimator.LOW_VAR_KL))).row.label == "low_var_kl (clamped k3) as loss"


def test_scale_is_recovered_and_only_positive(on_policy):
    match = on_policy.identify(_summed(Config(loss=Estimator.K3), factor=0.04))
    assert match.row.label == "k3 as loss" and match.scale == pytest.approx(0.04, rel=1e-9)
    bonus = on_policy.identify(_summed(Config(reward=Estimator.K1), factor=-1.0))
    assert bonus.row.rule == "KL011"


def test_length_weights_are_seen(on_policy):
    config = Config(reward=Estimator.K1)
    surrogate = build_surrogate(config)
    match = on_policy.identify(lambda batch: (surrogate(batch) / batch.lengths).mean())
    assert match.config.aggregation is Aggregation.SEQ_MEAN
    assert match.row.rule == "KL007" and match.objective is Objective.OTHER
    k1_loss = build_surrogate(Config(loss=Estimator.K1))
    match = on_policy.identify(lambda batch: (k1_loss(batch) / batch.lengths).sum())
    assert match.objective is Objective.LEN  # kl-math.md 5: k1 loss with 1/L is grad E[1/L]
    k3_loss = build_surrogate(Config(loss=Estimator.K3))
    match = on_policy.identify(lambda batch: (k3_loss(batch) / batch.lengths).sum())
    assert match.row.rule == "KL002" and match.objective is Objective.OTHER


def test_batch_aggregation_is_passed_through(on_policy):
    match = on_policy.identify(_summed(Config(reward=Estimator.K1)), aggregation=Aggregation.BATCH_MEAN)
    assert match.config.aggregation is Aggregation.BATCH_MEAN and match.row.unbiased


def test_unknown_terms_match_nothing(on_policy):
    def cubic(batch):
        return (((batch.logprobs - batch.ref_logprobs) * batch.mask) ** 3).sum()

    assert on_policy.identify(cubic) is None
    assert on_policy.identify(lambda batch: batch.ref_logprobs.sum() * 0.0) is None


def test_off_policy_rows(off_policy):
    """Token importance ratios and per-decision weights are told apart; an uncorrected term is KL008."""
    for config in (Config(loss=Estimator.K3, sampling=Sampling.TOKEN_IS),
                   Config(reward=Estimator.K1, sampling=Sampling.PER_DECISION_IS)):
        assert off_policy.identify(_summed(config)).config == config
    uncorrected = off_policy.identify(_summed(Config(reward=Estimator.K1)))
    assert uncorrected.config.sampling is Sampling.OFF_POLICY and uncorrected.row.rule == "KL008"


def test_candidates_cover_each_row_once():
    configs = candidate_configs(off_policy=False)
    assert len(configs) == len(set(configs))
    assert all(config.sampling is Sampling.ON_POLICY for config in configs)
    assert {dataclasses.replace(c, aggregation=Aggregation.SUM) for c in configs} >= {
        r.config for r in ON_POLICY_ROWS if r.config.aggregation is Aggregation.SUM}


def test_an_on_policy_verdict_does_not_give_an_off_policy_objective(off_policy):
    """Off-policy k2 as a loss is judged by its estimator (KL003, row 3), but with samples from pi_old
    its exact expected gradient is no target at all (row 22): the match must say OTHER, not PART."""
    from klaudit.audit.exact import match_objective

    config = Config(loss=Estimator.K2)
    match = off_policy.identify(_summed(config))
    assert match.config.sampling is Sampling.OFF_POLICY and match.row.rule == "KL003"
    assert match.objective is Objective.OTHER
    problem = standard_problems(off_policy=True, count=1, transformer=False)[0]
    gradient = problem.exact.expected_gradient(build_surrogate(config), aggregation=Aggregation.SUM,
                                               off_policy=True)
    assert match_objective(gradient, problem.targets, proportional=True) is Objective.OTHER
