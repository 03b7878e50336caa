"""The exact engine reproduces kl-math.md Appendix A: identities asserted in float64 by enumeration.

Surrogates are written out here (not taken from klaudit.audit.surrogates), so the engine is checked
against the math, and the reference gradients are checked against finite differences and
closed forms for the tabular policy.
"""

from __future__ import annotations

import itertools
import math

import pytest

torch = pytest.importorskip("torch")

from klaudit.audit.exact import (  # noqa: E402
    ExactProblem,
    cosine,
    enumerate_sequences,
    positive_multiple,
    relerr,
)
from klaudit.audit.policies import TabularPolicy, TinyCausalLM, perturbed, place_at_kl  # noqa: E402
from klaudit.catalog import Aggregation, Objective, Target  # noqa: E402

EXACT = 1e-9
TOYS = [  # (reference seed, eos, KL_seq)
    (0, True, 1.0),
    (1, True, 0.5),
    (2, True, 2.0),
    (0, False, 1.0),
    (1, False, 2.0),
    (2, False, 0.5),
]


def _toy_id(toy) -> str:
    seed, eos, kl = toy
    return f"seed{seed}-{'eos' if eos else 'fixed'}-kl{kl}"


@pytest.fixture(scope="module", params=TOYS, ids=_toy_id)
def toy(request):
    seed, eos, kl = request.param
    reference = TabularPolicy.random(4 if eos else 3, 4, eos=eos, seed=seed)
    policy = place_at_kl(reference, kl, seed=100 + seed)
    old_policy = perturbed(policy, 0.3, seed=200 + seed)
    problem = ExactProblem(policy, reference, old_policy=old_policy)
    return request.param, problem, problem.targets()


# ----- surrogates, written from kl-math.md section 8 -----


def rtg(x):
    return x.flip(-1).cumsum(-1).flip(-1)


def delta(b):
    return (b.logprobs - b.ref_logprobs) * b.mask


def step_kl(b):
    """KL_t(h_t) over the vocabulary, differentiable, 0 at padding."""
    logp, logq = torch.log_softmax(b.logits, -1), torch.log_softmax(b.ref_logits, -1)
    return (logp.exp() * (logp - logq)).sum(-1) * b.mask


def loss_k1(b):
    return delta(b)


def loss_k2(b):
    return 0.5 * delta(b) ** 2


def loss_k3(b):
    return (torch.exp(-delta(b)) - 1 + delta(b)) * b.mask


def loss_full(b):
    return step_kl(b)


def loss_abs(b):
    return delta(b).abs()


def reward_k1_to_go(b):
    return b.logprobs * rtg(delta(b).detach()) * b.mask


def reward_k1_sequence(b):
    return b.logprobs * b.mask * delta(b).detach().sum(-1, keepdim=True)


def reward_full_to_go(b):
    return b.logprobs * rtg(step_kl(b).detach()) * b.mask


def loss_k3_reversed(b):
    return (torch.expm1(delta(b)) - delta(b)) * b.mask


def sequence_k2(b):
    return 0.5 * delta(b).sum(-1) ** 2


def sequence_k3(b):
    log_ratio = delta(b).sum(-1)
    return torch.exp(-log_ratio) - 1 + log_ratio


def per_decision_is_k1(b):
    weights = torch.exp(((b.logprobs - b.old_logprobs) * b.mask).detach().cumsum(-1))  # w_{1:t}
    return b.logprobs * rtg(weights * delta(b).detach()) * b.mask


def sequence_is_k1(b):
    weight = torch.exp(((b.logprobs - b.old_logprobs) * b.mask).detach().sum(-1, keepdim=True))
    return weight * reward_k1_to_go(b)


IDENTITIES = [  # (name, loss_fn, {target: coefficient}); an empty mapping means zero
    ("loss k1 -> 0", loss_k1, {}),
    ("loss k2 -> PART", loss_k2, {Target.PART: 1}),
    ("loss k3 -> PFWD", loss_k3, {Target.PFWD: 1}),
    ("loss full -> PART", loss_full, {Target.PART: 1}),
    ("loss abs -> 2 PTV", loss_abs, {Target.PTV: 2}),
    ("loss k3 with pi/ref -> PCHI / 2", loss_k3_reversed, {Target.PCHI: 0.5}),
    ("reward k1 to-go -> REV", reward_k1_to_go, {Target.REV: 1}),
    ("reward k1 sequence -> REV", reward_k1_sequence, {Target.REV: 1}),
    ("reward full to-go -> FUT", reward_full_to_go, {Target.FUT: 1}),
    ("seq 0.5 D^2 -> REV", sequence_k2, {Target.REV: 1}),
    ("seq k3 -> FWD", sequence_k3, {Target.FWD: 1}),
    ("loss k3 + reward k1 -> REV + PFWD", lambda b: loss_k3(b) + reward_k1_to_go(b),
     {Target.REV: 1, Target.PFWD: 1}),
]


def _norm(x) -> float:
    return torch.linalg.vector_norm(x).item()


def _assert_equals_combination(gradient, combination, targets):
    if not combination:
        assert _norm(gradient) < EXACT * _norm(targets[Target.REV])
    else:
        expected = sum(coefficient * targets[target] for target, coefficient in combination.items())
        assert relerr(gradient, expected) < EXACT


@pytest.mark.parametrize("name, loss_fn, combination", IDENTITIES, ids=[i[0] for i in IDENTITIES])
def test_appendix_a_identity(toy, name, loss_fn, combination):
    _, problem, targets = toy
    _assert_equals_combination(problem.expected_gradient(loss_fn), combination, targets)


def test_targets_are_far_apart_so_the_identities_discriminate(toy):
    """At KL 0.5..2 nats no two targets coincide: an identity above cannot hold by accident."""
    (_, eos, _), _, targets = toy
    distinct = [Target.REV, Target.FWD, Target.PART, Target.PFWD, Target.FUT, Target.PTV, Target.PCHI]
    distinct += [Target.LEN] if eos else []
    for a, b in itertools.combinations(distinct, 2):
        assert relerr(targets[a], targets[b]) > 1e-2, (a, b)
    assert _norm(targets[Target.REV]) > 1e-2


# ----- aggregation -----


def test_seq_mean_k1_loss_is_the_gradient_of_expected_inverse_length(toy):
    (_, eos, _), problem, targets = toy
    gradient = problem.expected_gradient(loss_k1, aggregation=Aggregation.SEQ_MEAN)
    if eos:
        assert relerr(gradient, targets[Target.LEN]) < EXACT
        assert _norm(gradient) > 1e-3 * _norm(targets[Target.REV])
    else:  # fixed length: E[1/L] is constant
        assert _norm(targets[Target.LEN]) < EXACT * _norm(targets[Target.REV])
        assert _norm(gradient) < EXACT * _norm(targets[Target.REV])


def _brute_force_batch_mean(problem: ExactProblem, loss_fn, batch_size: int) -> torch.Tensor:
    """grad of E over all N^B ordered i.i.d. batches of (sum_i sum_t l_it) / (sum_i L_i)."""
    batch = problem.batch()
    surrogate = loss_fn(batch).sum(-1)
    probs = (batch.logprobs.detach() * batch.mask).sum(-1).exp()
    lengths = batch.mask.sum(-1)
    n = problem.num_sequences
    weight = torch.ones([n] * batch_size, dtype=torch.float64)
    total_length = torch.zeros([n] * batch_size, dtype=torch.float64)
    total_loss = torch.zeros([n] * batch_size, dtype=torch.float64)
    for axis in range(batch_size):
        shape = [1] * batch_size
        shape[axis] = n
        weight = weight * probs.view(shape)
        total_length = total_length + lengths.view(shape)
        total_loss = total_loss + surrogate.view(shape)
    objective = (weight * total_loss / total_length).sum()
    grads = torch.autograd.grad(objective, list(problem.policy.parameters()))
    return torch.cat([g.flatten() for g in grads])


@pytest.mark.parametrize("loss_fn", [reward_k1_to_go, loss_k1, loss_k3], ids=["reward-k1", "loss-k1", "loss-k3"])
def test_batch_mean_of_two_equals_brute_force_over_all_pairs(toy, loss_fn):
    """Absolute error on the scale of REV: with a fixed length the k1 loss is zero up to rounding."""
    _, problem, targets = toy
    gradient = problem.expected_gradient(loss_fn, aggregation=Aggregation.BATCH_MEAN, batch_size=2)
    brute_force = _brute_force_batch_mean(problem, loss_fn, 2)
    assert _norm(gradient - brute_force) < EXACT * max(_norm(brute_force), _norm(targets[Target.REV]))


def test_batch_mean_of_three_equals_brute_force_on_a_small_toy():
    reference = TabularPolicy.random(3, 3, seed=4)  # 15 sequences, 3375 ordered triples
    problem = ExactProblem(place_at_kl(reference, 1.0, seed=5), reference)
    gradient = problem.expected_gradient(reward_k1_to_go, aggregation=Aggregation.BATCH_MEAN, batch_size=3)
    assert relerr(gradient, _brute_force_batch_mean(problem, reward_k1_to_go, 3)) < EXACT


def test_batch_mean_limits_and_constant_scaling(toy):
    _, problem, targets = toy
    token_sum = problem.expected_gradient(reward_k1_to_go)
    single = problem.expected_gradient(reward_k1_to_go, aggregation=Aggregation.BATCH_MEAN, batch_size=1)
    assert relerr(single, problem.expected_gradient(reward_k1_to_go, aggregation=Aggregation.SEQ_MEAN)) < EXACT
    infinite = problem.expected_gradient(reward_k1_to_go, aggregation=Aggregation.BATCH_MEAN)
    assert relerr(infinite, token_sum / problem.expected_length()) < EXACT
    constant = problem.expected_gradient(reward_k1_to_go, aggregation=Aggregation.CONSTANT)
    assert relerr(constant, token_sum / 4) < EXACT
    assert positive_multiple(constant, targets[Target.REV]) == pytest.approx(0.25, rel=1e-9)


def test_length_distribution_sums_over_two_draws_by_hand():
    """h_2(l) = 2 sum_m P(L = m) / (l + m), here for lengths 1 and 2 with P = (0.25, 0.75)."""
    reference = TabularPolicy.random(2, 2, seed=0)  # sequences: [EOS], [0, EOS], [0, 0]
    problem = ExactProblem(reference, reference)
    assert problem.lengths.tolist() == [1, 2, 2]
    probs = torch.tensor([0.25, 0.5, 0.25], dtype=torch.float64)
    weights = problem.length_weights(probs, Aggregation.BATCH_MEAN, batch_size=2)
    h1 = 2 * (0.25 / 2 + 0.75 / 3)
    h2 = 2 * (0.25 / 3 + 0.75 / 4)
    assert torch.allclose(weights, torch.tensor([h1, h2, h2], dtype=torch.float64), rtol=1e-14, atol=0)


# ----- off-policy -----


@pytest.mark.parametrize("loss_fn", [per_decision_is_k1, sequence_is_k1], ids=["per-decision-IS", "sequence-IS"])
def test_off_policy_importance_weighted_k1_is_rev(toy, loss_fn):
    _, problem, targets = toy
    assert relerr(problem.expected_gradient(loss_fn, off_policy=True), targets[Target.REV]) < EXACT


def test_off_policy_k1_reward_without_correction_is_not_rev(toy):
    _, problem, targets = toy
    gradient = problem.expected_gradient(reward_k1_to_go, off_policy=True)
    assert relerr(gradient, targets[Target.REV]) > 1e-2
    assert problem.match(gradient, targets=targets) is Objective.OTHER


def test_off_policy_batch_carries_the_old_log_probs(toy):
    _, problem, _ = toy
    batch = problem.batch()
    assert torch.allclose(
        (batch.old_logprobs * batch.mask).sum(-1).exp().sum(), torch.tensor(1.0, dtype=torch.float64), atol=1e-12
    )
    assert problem.expected_value(lambda b: torch.ones(b.mask.shape[0], dtype=torch.float64), off_policy=True) == (
        pytest.approx(1.0, abs=1e-12)
    )
    assert not torch.allclose(batch.old_logprobs * batch.mask, batch.logprobs.detach() * batch.mask)


# ----- the reference gradients themselves -----


def _finite_difference(problem: ExactProblem, value, coordinates, step=1e-5) -> torch.Tensor:
    """Central differences of value() in the given flat coordinates of the (single) policy parameter."""
    (parameter,) = list(problem.policy.parameters())
    flat = parameter.data.view(-1)
    slopes = []
    for index in coordinates:
        original = flat[index].item()
        flat[index] = original + step
        up = value()
        flat[index] = original - step
        down = value()
        flat[index] = original
        slopes.append((up - down) / (2 * step))
    return torch.tensor(slopes, dtype=torch.float64)


def test_rev_fwd_and_len_match_finite_differences(toy):
    (_, eos, _), problem, targets = toy
    coordinates = [0, 5, 17, 39, 80, 150] if eos else [0, 5, 17, 39, 80, 119]
    checks = [
        (Target.REV, problem.kl_seq),
        (Target.FWD, problem.forward_kl),
        (Target.LEN, lambda: problem.expected_value(lambda b: 1.0 / b.mask.sum(-1))),
    ]
    for target, value in checks:
        slopes = _finite_difference(problem, value, coordinates)
        exact = targets[target][coordinates]
        assert torch.allclose(slopes, exact, rtol=1e-6, atol=1e-8), target


def _reach_probabilities(policy: TabularPolicy) -> torch.Tensor:
    """P(prefix h is reached) for every row of the table, as the product of next-token probabilities."""
    probs = torch.softmax(policy.prefix_logits.detach(), -1)
    reach = torch.zeros(policy.num_prefixes, dtype=torch.float64)
    plain = range(policy.num_plain)
    for length in range(policy.horizon):
        for prefix in itertools.product(plain, repeat=length):
            p = 1.0
            for t in range(length):
                row = int(policy.prefix_index(torch.tensor([list(prefix) + [0] * (policy.horizon - length)]))[0, t])
                p *= probs[row, prefix[t]].item()
            row = int(policy.prefix_index(torch.tensor([list(prefix) + [0] * (policy.horizon - length)]))[0, length])
            reach[row] = p
    return reach


def test_local_targets_match_closed_forms_on_the_table(toy):
    """Per prefix row z: grad_z KL(p||q) = p (log p/q - KL), grad_z FKL = p - q, grad_z TV = p (s - <s, p>) / 2,
    grad_z CHI = 2 p (p/q - sum_v p^2/q)."""
    _, problem, targets = toy
    policy = problem.policy
    p = torch.softmax(policy.prefix_logits.detach(), -1)
    rows = policy.prefix_index(problem.tokens)
    q = torch.zeros_like(p)
    real = problem.mask.bool()
    q[rows[real]] = torch.softmax(problem.ref_logits, -1)[real]
    reach = _reach_probabilities(policy).unsqueeze(-1)
    log_ratio = p.log() - q.log()
    kl = (p * log_ratio).sum(-1, keepdim=True)
    sign = torch.sign(p - q)
    closed = {
        Target.PART: reach * p * (log_ratio - kl),
        Target.PFWD: reach * (p - q),
        Target.PTV: reach * 0.5 * p * (sign - (sign * p).sum(-1, keepdim=True)),
        Target.PCHI: reach * 2 * p * (p / q - (p * p / q).sum(-1, keepdim=True)),
    }
    for target, expected in closed.items():
        assert relerr(targets[target], expected.flatten()) < EXACT, target


def test_fut_is_rev_minus_part(toy):
    _, _, targets = toy
    assert torch.equal(targets[Target.FUT], targets[Target.REV] - targets[Target.PART])


def test_expected_values_of_unbiased_estimators_equal_kl_seq(toy):
    _, problem, _ = toy
    kl = problem.kl_seq()
    for value_fn in (loss_k1, loss_k3, step_kl):
        assert problem.expected_value(value_fn) == pytest.approx(kl, rel=EXACT)
    assert problem.expected_value(lambda b: b.mask.sum(-1)) == pytest.approx(problem.expected_length(), rel=EXACT)


def test_one_step_kls_by_hand():
    """T = 1: KL(p||q) and KL(q||p) of two softmaxes, computed directly."""
    reference = TabularPolicy.random(3, 1, eos=False, seed=7)
    policy = perturbed(reference, 1.0, seed=8)
    problem = ExactProblem(policy, reference)
    p = torch.softmax(policy.prefix_logits.detach()[0], -1)
    q = torch.softmax(reference.prefix_logits.detach()[0], -1)
    assert problem.kl_seq() == pytest.approx((p * (p / q).log()).sum().item(), rel=1e-12)
    assert problem.forward_kl() == pytest.approx((q * (q / p).log()).sum().item(), rel=1e-12)


# ----- enumeration -----


@pytest.mark.parametrize(
    "vocab_size, horizon, eos_id, count", [(4, 4, 3, 121), (3, 4, None, 81), (3, 3, 2, 15), (2, 1, 1, 2)]
)
def test_enumeration_lists_every_response_once(vocab_size, horizon, eos_id, count):
    tokens, mask, lengths = enumerate_sequences(vocab_size, horizon, eos_id)
    assert tokens.shape == (count, horizon) and mask.dtype == torch.float64
    responses = {tuple(row[:length].tolist()) for row, length in zip(tokens, lengths)}
    assert len(responses) == count
    for response in responses:
        if eos_id is None:
            assert len(response) == horizon
        else:  # EOS ends a response and occurs nowhere else; without EOS the length is T
            assert eos_id not in response[:-1]
            assert response[-1] == eos_id or len(response) == horizon
    assert torch.equal(mask.sum(-1).long(), lengths)
    assert torch.equal(mask, (torch.arange(horizon) < lengths.unsqueeze(-1)).double())


def test_enumeration_is_a_fresh_copy():
    tokens, _, _ = enumerate_sequences(4, 2, 3)
    tokens.zero_()
    assert enumerate_sequences(4, 2, 3)[0].any()


@pytest.mark.parametrize("eos", [True, False])
def test_probabilities_sum_to_one(eos):
    reference = TabularPolicy.random(4, 4, eos=eos, seed=0)
    problem = ExactProblem(perturbed(reference, 1.0, seed=1), reference)
    batch = problem.batch()
    total = (batch.logprobs.detach() * batch.mask).sum(-1).exp().sum().item()
    assert total == pytest.approx(1.0, abs=1e-12)


# ----- comparison helpers and match -----


def test_relerr_and_cosine_by_hand():
    x = torch.tensor([3.0, 4.0], dtype=torch.float64)
    assert relerr(torch.tensor([3.0, 5.0], dtype=torch.float64), x) == pytest.approx(0.2)
    assert cosine(torch.tensor([4.0, -3.0], dtype=torch.float64), x) == pytest.approx(0.0)
    assert cosine(-2 * x, x) == pytest.approx(-1.0)
    zero = torch.zeros(2, dtype=torch.float64)
    assert relerr(zero, zero) == 0.0
    assert relerr(x, zero) == math.inf
    assert relerr(zero, x) == 1.0
    assert math.isnan(cosine(zero, x)) and math.isnan(cosine(x, zero))


def test_positive_multiple_by_hand():
    x = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
    assert positive_multiple(0.25 * x, x) == pytest.approx(0.25)
    assert positive_multiple(-0.25 * x, x) is None
    assert positive_multiple(x + torch.tensor([0.0, 0.0, 1e-3], dtype=torch.float64), x) is None
    assert positive_multiple(x, torch.zeros(3, dtype=torch.float64)) is None


def test_match_names_the_target(toy):
    (_, eos, _), problem, targets = toy
    assert problem.match(targets[Target.REV], targets=targets) is Objective.REV
    assert problem.match(problem.expected_gradient(loss_k2), targets=targets) is Objective.PART
    assert problem.match(problem.expected_gradient(loss_k1), targets=targets) is Objective.ZERO
    assert problem.match(problem.expected_gradient(sequence_k3), targets=targets) is Objective.FWD
    assert problem.match(problem.expected_gradient(loss_abs), targets=targets) is Objective.OTHER
    scaled = problem.expected_gradient(loss_k3, aggregation=Aggregation.CONSTANT)
    assert problem.match(scaled, targets=targets) is Objective.OTHER
    assert problem.match(scaled, proportional=True, targets=targets) is Objective.PFWD
    if eos:
        length = problem.expected_gradient(loss_k1, aggregation=Aggregation.SEQ_MEAN)
        assert problem.match(length) is Objective.LEN  # computes the targets itself


# ----- user mistakes -----


@pytest.mark.parametrize(
    "loss_fn, message",
    [
        (lambda b: loss_k2(b).sum(), "per sequence"),
        (lambda b: loss_k2(b)[:, :2], "per sequence"),
        (lambda b: loss_k2(b).tolist(), "torch.Tensor"),
        (lambda b: loss_k2(b) * float("nan"), "NaN/inf"),
        (lambda b: loss_k2(b) + torch.where(b.mask > 0, 0.0, float("inf")), "NaN/inf"),
        (lambda b: b.mask.long(), "floating-point"),
    ],
    ids=["scalar", "short", "list", "nan", "inf", "integer"],
)
def test_a_malformed_loss_gives_a_clear_error(loss_fn, message):
    reference = TabularPolicy.random(4, 3, seed=0)
    problem = ExactProblem(perturbed(reference, 1.0, seed=1), reference)
    with pytest.raises(ValueError, match=message):
        problem.expected_gradient(loss_fn)
    with pytest.raises(ValueError, match=message):
        problem.expected_value(loss_fn)


def test_misuse_of_options_gives_a_clear_error():
    reference = TabularPolicy.random(4, 3, seed=0)
    problem = ExactProblem(perturbed(reference, 1.0, seed=1), reference)
    with pytest.raises(ValueError, match="old_policy"):
        problem.expected_gradient(loss_k2, off_policy=True)
    with pytest.raises(ValueError, match="batch_size only applies"):
        problem.expected_gradient(loss_k2, batch_size=4)
    with pytest.raises(ValueError, match="positive integer"):
        problem.expected_gradient(loss_k2, aggregation=Aggregation.BATCH_MEAN, batch_size=0)
    with pytest.raises(ValueError, match="vocab_size, horizon, eos_id"):
        ExactProblem(reference, TabularPolicy.random(4, 3, eos=False, seed=0))


def test_a_detached_loss_has_zero_gradient():
    """A KL computed under no_grad (open-instruct #530) contributes nothing: the engine says 0, not an error."""
    reference = TabularPolicy.random(4, 3, seed=0)
    problem = ExactProblem(perturbed(reference, 1.0, seed=1), reference)
    gradient = problem.expected_gradient(lambda b: loss_k2(b).detach())
    assert gradient.shape == (reference.prefix_logits.numel(),) and not gradient.any()


# ----- the tiny transformer -----


@pytest.fixture(scope="module")
def lm_problem():
    reference = TinyCausalLM(4, 4, seed=0)
    policy = place_at_kl(reference, 1.0, seed=2, rtol=1e-3)
    problem = ExactProblem(policy, reference)
    return problem, problem.targets()


def test_tiny_lm_enumeration_probabilities_sum_to_one(lm_problem):
    problem, _ = lm_problem
    batch = problem.batch()
    assert (batch.logprobs.detach() * batch.mask).sum(-1).exp().sum().item() == pytest.approx(1.0, abs=1e-12)
    assert problem.kl_seq() == pytest.approx(1.0, rel=1e-3)


@pytest.mark.parametrize(
    "loss_fn, target",
    [(loss_k2, Target.PART), (reward_k1_to_go, Target.REV), (loss_k3, Target.PFWD), (sequence_k3, Target.FWD)],
    ids=["k2-loss", "k1-reward", "k3-loss", "seq-k3"],
)
def test_tiny_lm_identities(lm_problem, loss_fn, target):
    problem, targets = lm_problem
    assert relerr(problem.expected_gradient(loss_fn), targets[target]) < EXACT
    assert relerr(targets[Target.PART], targets[Target.REV]) > 1e-2
