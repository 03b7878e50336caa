"""kl_penalty against exact enumeration: its expected gradient is grad KL(pi || ref) (REV) and
its expected value is KL_seq, on- and off-policy, for k1, k3 and RB, in float64.

Every response of a small policy is enumerated (klaudit.audit.exact), so expectations are exact
sums; REV comes from autograd of sum_y pi(y) log(pi(y) / ref(y)). The last tests show that the
same check rejects close but wrong formulas.
"""

from __future__ import annotations

import functools

import pytest

torch = pytest.importorskip("torch")

from klaudit.audit.exact import ExactProblem, relerr  # noqa: E402
from klaudit.audit.policies import TabularPolicy, TinyCausalLM, perturbed, place_at_kl  # noqa: E402
from klaudit.catalog import Target  # noqa: E402
from klaudit.estimators import exact_token_kl, kl_penalty  # noqa: E402

EXACT = 1e-9  # relerr of an exact identity in float64
WRONG = 1e-3  # a wrong formula misses REV by more than this

# seed -> (KL_seq of the policy from the reference in nats, staleness of pi_old)
PLACEMENTS = {0: (0.4, 0.1), 1: (1.0, 0.2), 2: (1.8, 0.3)}


@functools.cache
def _tabular(seed: int, eos: bool):
    """(problem with pi_old, its targets): V = 4 incl. EOS (121 responses) or V = 3 fixed length 4 (81)."""
    target_kl, staleness = PLACEMENTS[seed]
    reference = TabularPolicy.random(4 if eos else 3, 4, eos=eos, seed=seed)
    policy = place_at_kl(reference, target_kl, seed=seed + 10)
    old_policy = perturbed(policy, staleness, seed=seed + 20)
    problem = ExactProblem(policy, reference, old_policy=old_policy)
    return problem, problem.targets()


@functools.cache
def _transformer():
    reference = TinyCausalLM(4, 4, seed=0)
    policy = place_at_kl(reference, 0.8, seed=3, rtol=1e-3)
    problem = ExactProblem(policy, reference, old_policy=perturbed(policy, 0.05, seed=4))
    return problem, problem.targets()


def _penalty(estimator: str, off_policy: bool):
    """The batch -> KLTerm callable of kl_penalty, given pi_old's log-probs when off-policy."""

    def term(batch):
        return kl_penalty(
            batch.logprobs,
            batch.ref_logprobs,
            batch.mask,
            estimator=estimator,
            logits=batch.logits,
            ref_logits=batch.ref_logits,
            old_logprobs=batch.old_logprobs if off_policy else None,
        )

    return term


def _assert_unbiased(problem, targets, estimator, off_policy):
    term = _penalty(estimator, off_policy)
    gradient = problem.expected_gradient(lambda batch: term(batch).loss, off_policy=off_policy)
    assert relerr(gradient, targets[Target.REV]) < EXACT
    expected_value = problem.expected_value(lambda batch: term(batch).value, off_policy=off_policy)
    assert expected_value == pytest.approx(problem.kl_seq(), rel=EXACT)


@pytest.mark.parametrize("off_policy", [False, True], ids=["on-policy", "off-policy"])
@pytest.mark.parametrize("estimator", ["k1", "k3", "rb"])
@pytest.mark.parametrize("eos", [True, False], ids=["eos", "fixed-length"])
@pytest.mark.parametrize("seed", sorted(PLACEMENTS))
def test_expected_gradient_is_rev_and_expected_value_is_kl_seq(seed, eos, estimator, off_policy):
    problem, targets = _tabular(seed, eos)
    assert problem.kl_seq() == pytest.approx(PLACEMENTS[seed][0], rel=1e-3)
    _assert_unbiased(problem, targets, estimator, off_policy)


@pytest.mark.parametrize("off_policy", [False, True], ids=["on-policy", "off-policy"])
@pytest.mark.parametrize("estimator", ["k1", "k3", "rb"])
def test_expected_gradient_is_rev_on_the_tiny_transformer(estimator, off_policy):
    problem, targets = _transformer()
    _assert_unbiased(problem, targets, estimator, off_policy)


# ----- the check has power: close but wrong formulas fail it -----


def _rtg(per_token):
    """sum_{u >= t} of a per-token tensor."""
    return per_token.flip(-1).cumsum(-1).flip(-1)


def _masked(batch):
    """(log pi masked, with grad; d = k1 masked, detached)."""
    return batch.logprobs * batch.mask, ((batch.logprobs - batch.ref_logprobs) * batch.mask).detach()


def _k1_same_token_reward(batch):
    """k1 reward without reward-to-go: logp_t * sg(d_t) (= k2 as loss, the partial gradient)."""
    policy_logprobs, log_ratio = _masked(batch)
    return (policy_logprobs * log_ratio).sum(-1)


def _k3_reward_alone(batch):
    """k3 in the reward with reward-to-go but without its loss part (gives REV - PFWD)."""
    policy_logprobs, log_ratio = _masked(batch)
    k3 = (torch.expm1(-log_ratio) + log_ratio) * batch.mask
    return (policy_logprobs * _rtg(k3)).sum(-1)


def _rb_without_future(batch):
    """The exact per-step KL as a loss alone (the sequential pitfall, PART)."""
    return (exact_token_kl(batch.logits, batch.ref_logits) * batch.mask).sum(-1)


def _rb_off_policy_with_token_ratios(batch):
    """Off-policy RB weighted by the token ratio pi_t / old_t alone instead of the prefix product
    (kl-math.md §7, row 23: the prefix distribution stays that of pi_old)."""
    policy_logprobs, _ = _masked(batch)
    weights = torch.exp(((batch.logprobs - batch.old_logprobs) * batch.mask).detach())
    kl = exact_token_kl(batch.logits, batch.ref_logits) * batch.mask
    weighted = weights * kl.detach()
    return (weights * kl + policy_logprobs * (_rtg(weighted) - weighted)).sum(-1)


@pytest.mark.parametrize(
    "wrong_loss, lands_on",
    [
        (_k1_same_token_reward, lambda targets: targets[Target.PART]),
        (_k3_reward_alone, lambda targets: targets[Target.REV] - targets[Target.PFWD]),
        (_rb_without_future, lambda targets: targets[Target.PART]),
    ],
    ids=["k1-reward-same-token", "k3-reward-alone", "rb-without-future"],
)
@pytest.mark.parametrize("seed", sorted(PLACEMENTS))
def test_wrong_formulas_miss_rev(seed, wrong_loss, lands_on):
    problem, targets = _tabular(seed, True)
    gradient = problem.expected_gradient(wrong_loss)
    assert relerr(gradient, targets[Target.REV]) > WRONG
    assert relerr(gradient, lands_on(targets)) < EXACT  # exactly where kl-math.md §3-4 says


@pytest.mark.parametrize("estimator", ["k1", "k3", "rb"])
@pytest.mark.parametrize("seed", sorted(PLACEMENTS))
def test_on_policy_forms_on_stale_samples_miss_rev(seed, estimator):
    # the importance weights are what makes the off-policy forms exact
    problem, targets = _tabular(seed, True)
    gradient = problem.expected_gradient(lambda batch: _penalty(estimator, False)(batch).loss, off_policy=True)
    assert relerr(gradient, targets[Target.REV]) > WRONG


@pytest.mark.parametrize("seed", sorted(PLACEMENTS))
def test_rb_needs_prefix_products_off_policy(seed):
    problem, targets = _tabular(seed, True)
    gradient = problem.expected_gradient(_rb_off_policy_with_token_ratios, off_policy=True)
    assert relerr(gradient, targets[Target.REV]) > WRONG


# ----- the opt-in baseline -----


def _with_baseline(estimator: str, off_policy: bool, make_baseline):
    def loss(batch):
        return kl_penalty(
            batch.logprobs, batch.ref_logprobs, batch.mask, estimator=estimator, logits=batch.logits,
            ref_logits=batch.ref_logits, old_logprobs=batch.old_logprobs if off_policy else None,
            baseline=make_baseline(batch),
        ).loss

    return loss


def _prefix_baseline(batch):
    """b_t = 0.5 + 0.8 sum_{u<t} d_u: a function of the prefix h_t only (a valid baseline)."""
    _, log_ratio = _masked(batch)
    return 0.5 + 0.8 * torch.nn.functional.pad(log_ratio[:, :-1], (1, 0)).cumsum(-1)


def _token_baseline(batch):
    """b_t = d_t depends on y_t itself: not a baseline, it removes part of the signal."""
    _, log_ratio = _masked(batch)
    return log_ratio


@pytest.mark.parametrize("off_policy", [False, True], ids=["on-policy", "off-policy"])
@pytest.mark.parametrize("estimator", ["k1", "k3", "rb"])
@pytest.mark.parametrize("seed", sorted(PLACEMENTS))
def test_a_prefix_baseline_keeps_rev_and_a_token_dependent_one_does_not(seed, estimator, off_policy):
    problem, targets = _tabular(seed, True)
    valid = problem.expected_gradient(_with_baseline(estimator, off_policy, _prefix_baseline), off_policy=off_policy)
    assert relerr(valid, targets[Target.REV]) < EXACT
    invalid = problem.expected_gradient(_with_baseline(estimator, off_policy, _token_baseline), off_policy=off_policy)
    assert relerr(invalid, targets[Target.REV]) > WRONG
