"""The master identity of docs/kl-math.md §3.1, by exact enumeration, for every estimator:

    grad E_pi[sum_t k_t] = E_pi[sum_t grad k_t] + E_pi[sum_t s_t sum_{u>=t} k_u],

the left side by autograd through sum_y pi(y) sum_t k_t(y), the right side as the expected
gradients of the catalog's "k as a loss" and "k in the reward, reward-to-go" surrogates. Neither
part alone is the left side, except that the loss part of k1 is zero (§3.2).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from klaudit.audit.exact import ExactProblem, relerr  # noqa: E402
from klaudit.audit.policies import TabularPolicy, place_at_kl  # noqa: E402
from klaudit.audit.surrogates import build_surrogate, estimator_values  # noqa: E402
from klaudit.catalog import Config, Estimator, Returns, Target  # noqa: E402

EXACT = 1e-9


@pytest.fixture(scope="module", params=[(0, True), (1, False)], ids=["eos", "fixed-length"])
def problem(request):
    seed, eos = request.param
    reference = TabularPolicy.random(4, 3, eos=eos, seed=seed)
    return ExactProblem(place_at_kl(reference, 1.0, seed=10 + seed), reference)


def _gradient_of_expected_sum(problem: ExactProblem, estimator: Estimator) -> torch.Tensor:
    """grad_theta sum_y pi(y) sum_t k_t(y), with pi(y) and k_t both differentiable."""
    batch = problem.batch()
    log_ratio = (batch.logprobs - batch.ref_logprobs) * batch.mask
    values = (estimator_values(estimator, log_ratio, batch) * batch.mask).sum(-1)
    probabilities = (batch.logprobs * batch.mask).sum(-1).exp()
    parameters = list(problem.policy.parameters())
    gradients = torch.autograd.grad((probabilities * values).sum(), parameters)
    return torch.cat([gradient.flatten() for gradient in gradients]).to(torch.float64)


@pytest.mark.parametrize("estimator", list(Estimator), ids=lambda e: e.value)
def test_loss_part_plus_reward_to_go_part_is_the_gradient_of_the_expected_sum(problem, estimator):
    loss_part = problem.expected_gradient(build_surrogate(Config(loss=estimator)))
    reward_part = problem.expected_gradient(build_surrogate(Config(reward=estimator)))
    assert relerr(loss_part + reward_part, _gradient_of_expected_sum(problem, estimator)) < EXACT


@pytest.mark.parametrize("estimator", [Estimator.K1, Estimator.K3, Estimator.FULL], ids=lambda e: e.value)
def test_for_unbiased_values_the_two_parts_are_rev(problem, estimator):
    """E[sum_t k_t] = KL_seq for k1, k3 and the exact KL, so the left side is REV."""
    assert relerr(_gradient_of_expected_sum(problem, estimator), problem.targets()[Target.REV]) < EXACT


@pytest.mark.parametrize("estimator", list(Estimator), ids=lambda e: e.value)
def test_only_k1_can_drop_its_loss_part(problem, estimator):
    total = _gradient_of_expected_sum(problem, estimator)
    loss_part = problem.expected_gradient(build_surrogate(Config(loss=estimator)))
    reward_part = problem.expected_gradient(build_surrogate(Config(reward=estimator)))
    loss_is_zero = torch.linalg.vector_norm(loss_part) < EXACT * torch.linalg.vector_norm(total)
    assert loss_is_zero == (estimator is Estimator.K1)
    assert relerr(reward_part, total) > 1e-3 or loss_is_zero


@pytest.mark.parametrize("estimator", list(Estimator), ids=lambda e: e.value)
def test_the_whole_sequence_return_has_the_reward_to_go_expectation(problem, estimator):
    """E[s_t k_u] = 0 for u < t: the earlier tokens' k in a score's coefficient only adds noise (§4.1)."""
    to_go = problem.expected_gradient(build_surrogate(Config(reward=estimator)))
    whole = problem.expected_gradient(build_surrogate(Config(reward=estimator, returns=Returns.SEQUENCE)))
    assert relerr(whole, to_go) < EXACT
