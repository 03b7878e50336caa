"""klaudit.estimators on small tensors: hand-derived values, the exact per-token KL and its gradient
against the direct float64 formula, chunking, low precision, and input validation."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from klaudit.estimators import exact_token_kl, kl_penalty, kl_reward, token_kl  # noqa: E402

LN2 = math.log(2.0)


def _naive_token_kl(logits: torch.Tensor, ref_logits: torch.Tensor) -> torch.Tensor:
    """sum_v p (log p - log q), straight from the definition (float64 in the tests)."""
    policy_logprobs = torch.log_softmax(logits, -1)
    ref_logprobs = torch.log_softmax(ref_logits, -1)
    return (policy_logprobs.exp() * (policy_logprobs - ref_logprobs)).sum(-1)


def _random_logits(*shape, seed=0, dtype=torch.float64, scale=2.0):
    generator = torch.Generator().manual_seed(seed)
    return scale * torch.randn(shape, generator=generator, dtype=dtype)


# ----- token_kl and kl_reward: hand-derived values -----

# pi = (1/2, 1/4), ref = (1/4, 1/2) on the two tokens: delta = (ln 2, -ln 2)
HALVES = torch.tensor([[math.log(0.5), math.log(0.25)]], dtype=torch.float64)
QUARTERS = torch.tensor([[math.log(0.25), math.log(0.5)]], dtype=torch.float64)


@pytest.mark.parametrize(
    "estimator, expected",
    [
        ("k1", [LN2, -LN2]),
        ("k2", [LN2**2 / 2, LN2**2 / 2]),
        ("k3", [0.5 - 1 + LN2, 2 - 1 - LN2]),  # exp(-delta) - 1 + delta
    ],
)
def test_token_kl_matches_hand_values(estimator, expected):
    values = token_kl(HALVES, QUARTERS, estimator=estimator)
    torch.testing.assert_close(values, torch.tensor([expected], dtype=torch.float64), rtol=0, atol=1e-15)


def test_token_k3_keeps_absolute_accuracy_relative_to_delta_for_tiny_log_ratios():
    # exp(-delta) - 1 + delta evaluated naively loses everything below ~1e-16 (the rounding of
    # exp near 1); with expm1 the error is a few ulps of delta, far below k3 ~ delta^2 / 2.
    delta = torch.tensor([[1e-9, -1e-7, 1e-5]], dtype=torch.float64)
    series = delta**2 / 2 - delta**3 / 6 + delta**4 / 24  # next term delta^5 / 120 < 1e-27
    values = token_kl(delta, torch.zeros_like(delta), estimator="k3")
    tolerance = 4 * torch.finfo(torch.float64).eps * delta.abs()
    assert ((values - series).abs() <= tolerance).all()
    naive = torch.exp(-delta) - 1 + delta
    assert not ((naive - series).abs() <= tolerance).all()  # the check has power


def test_token_kl_of_half_precision_is_float32():
    values = token_kl(HALVES.to(torch.bfloat16), QUARTERS.to(torch.bfloat16), estimator="k3")
    assert values.dtype == torch.float32


def test_kl_reward_is_the_masked_detached_log_ratio():
    logprobs = torch.tensor([[-1.0, -2.0, -0.5], [-0.25, -3.0, -1.5]], requires_grad=True)
    ref_logprobs = torch.tensor([[-1.5, -1.0, -0.5], [-1.0, -2.0, -4.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 1]])  # a hole in the second row
    reward = kl_reward(logprobs, ref_logprobs, mask)
    assert not reward.requires_grad
    assert torch.equal(reward, torch.tensor([[0.5, -1.0, 0.0], [0.75, 0.0, 2.5]]))


# ----- exact_token_kl -----


def test_exact_token_kl_matches_a_hand_value():
    # p = (1/2, 1/2), q = (1/4, 3/4): KL = 1/2 ln 2 + 1/2 ln(2/3) = 1/2 ln(4/3)
    logits = torch.zeros(1, 1, 2, dtype=torch.float64)
    ref_logits = torch.tensor([[[0.0, math.log(3.0)]]], dtype=torch.float64)
    assert exact_token_kl(logits, ref_logits).item() == pytest.approx(0.5 * math.log(4 / 3), abs=1e-15)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_exact_token_kl_value_and_gradient_match_the_naive_formula(seed):
    logits = _random_logits(3, 5, 11, seed=seed).requires_grad_()
    ref_logits = _random_logits(3, 5, 11, seed=seed + 100)
    grad_of_kl = _random_logits(3, 5, seed=seed + 200)

    kl = exact_token_kl(logits, ref_logits)
    naive = _naive_token_kl(logits, ref_logits)
    torch.testing.assert_close(kl, naive, rtol=0, atol=1e-12)

    (grad,) = torch.autograd.grad(kl, logits, grad_of_kl)
    (naive_grad,) = torch.autograd.grad(naive, logits, grad_of_kl)
    torch.testing.assert_close(grad, naive_grad, rtol=0, atol=1e-12)

    policy_logprobs = torch.log_softmax(logits.detach(), -1)
    log_ratio = policy_logprobs - torch.log_softmax(ref_logits, -1)
    closed_form = policy_logprobs.exp() * (log_ratio - naive.detach().unsqueeze(-1))
    torch.testing.assert_close(grad, closed_form * grad_of_kl.unsqueeze(-1), rtol=0, atol=1e-12)


@pytest.mark.parametrize("chunk_size", [1, 2, 4, 7, 15, 16, 1000])
def test_exact_token_kl_chunks_agree_with_one_chunk(chunk_size):
    # B*T = 15 rows: chunk sizes that divide it, that do not, and larger than it
    logits = _random_logits(3, 5, 9, seed=4).requires_grad_()
    ref_logits = _random_logits(3, 5, 9, seed=5)
    grad_of_kl = _random_logits(3, 5, seed=6)
    whole = exact_token_kl(logits, ref_logits, chunk_size=15)
    (whole_grad,) = torch.autograd.grad(whole, logits, grad_of_kl)
    chunked = exact_token_kl(logits, ref_logits, chunk_size=chunk_size)
    (chunked_grad,) = torch.autograd.grad(chunked, logits, grad_of_kl)
    torch.testing.assert_close(chunked, whole, rtol=0, atol=1e-14)
    torch.testing.assert_close(chunked_grad, whole_grad, rtol=0, atol=1e-14)


def test_exact_token_kl_on_shifted_slices_that_cannot_be_flattened():
    # logits[:, :-1] (the usual next-token shift) has leading dims that do not merge into one
    full = _random_logits(3, 6, 8, seed=7).requires_grad_()
    ref_full = _random_logits(3, 6, 8, seed=8)
    kl = exact_token_kl(full[:, :-1], ref_full[:, 1:], chunk_size=4)
    naive = _naive_token_kl(full[:, :-1], ref_full[:, 1:])
    torch.testing.assert_close(kl, naive, rtol=0, atol=1e-12)
    (grad,) = torch.autograd.grad(kl.sum(), full)
    (naive_grad,) = torch.autograd.grad(naive.sum(), full)
    torch.testing.assert_close(grad, naive_grad, rtol=0, atol=1e-12)


def test_exact_token_kl_keeps_inputs_by_reference_and_only_per_row_state():
    logits = _random_logits(2, 3, 50, seed=9).requires_grad_()
    ref_logits = _random_logits(2, 3, 50, seed=10)
    kl = exact_token_kl(logits, ref_logits, chunk_size=2)
    saved = kl.grad_fn.saved_tensors
    by_reference = [tensor for tensor in saved if tensor.shape == logits.shape]
    assert {tensor.data_ptr() for tensor in by_reference} == {logits.data_ptr(), ref_logits.data_ptr()}
    assert all(tensor.shape[-1] == 6 and tensor.numel() <= 5 * 6 for tensor in saved if tensor.shape != logits.shape)


def test_exact_token_kl_gives_the_reference_its_gradient_only_when_asked():
    logits = _random_logits(2, 2, 5, seed=11).requires_grad_()
    ref_logits = _random_logits(2, 2, 5, seed=12).requires_grad_()
    grad_of_kl = _random_logits(2, 2, seed=13)
    exact_token_kl(logits, ref_logits).backward(grad_of_kl)
    naive_logits, naive_ref = logits.detach().clone().requires_grad_(), ref_logits.detach().clone().requires_grad_()
    _naive_token_kl(naive_logits, naive_ref).backward(grad_of_kl)
    torch.testing.assert_close(logits.grad, naive_logits.grad, rtol=0, atol=1e-12)
    torch.testing.assert_close(ref_logits.grad, naive_ref.grad, rtol=0, atol=1e-12)  # q - p per row
    logits.grad = ref_logits.grad = None
    exact_token_kl(logits, ref_logits.detach()).sum().backward()
    assert logits.grad is not None and ref_logits.grad is None


def test_kl_penalty_rb_gives_no_gradient_to_the_reference_logits():
    logprobs, ref_logprobs, _, mask = _small_batch(7)
    logits = _random_logits(3, 4, 5, seed=24).requires_grad_()
    ref_logits = _random_logits(3, 4, 5, seed=25).requires_grad_()
    kl_penalty(logprobs, ref_logprobs, mask, estimator="rb", logits=logits, ref_logits=ref_logits).loss.sum().backward()
    assert logits.grad is not None and ref_logits.grad is None


def test_exact_token_kl_accumulates_bfloat16_in_float32():
    # a large vocabulary, where bf16 accumulation would lose about 2-3 digits
    logits = _random_logits(2, 3, 4096, seed=13, dtype=torch.float32).to(torch.bfloat16).requires_grad_()
    ref_logits = _random_logits(2, 3, 4096, seed=14, dtype=torch.float32).to(torch.bfloat16)
    kl = exact_token_kl(logits, ref_logits)
    assert kl.dtype == torch.float32
    reference = _naive_token_kl(logits.detach().double(), ref_logits.double())
    # float32 accumulation of V = 4096 terms of size <= ~1: error well below 1e-5
    torch.testing.assert_close(kl.double(), reference, rtol=0, atol=1e-5)
    (grad,) = torch.autograd.grad(kl.sum(), logits)
    assert grad.dtype == torch.bfloat16
    policy_logprobs = torch.log_softmax(logits.detach().double(), -1)
    log_ratio = policy_logprobs - torch.log_softmax(ref_logits.double(), -1)
    closed_form = policy_logprobs.exp() * (log_ratio - reference.unsqueeze(-1))
    # the gradient itself is rounded to bf16 (8 bits of mantissa): relative 2^-8 per entry
    torch.testing.assert_close(grad.double(), closed_form, rtol=2**-8, atol=1e-7)


@pytest.mark.parametrize("policy_dtype, ref_dtype", [(torch.float32, torch.bfloat16), (torch.float16, torch.float32)])
def test_exact_token_kl_of_mixed_precision_inputs(policy_dtype, ref_dtype):
    logits = _random_logits(2, 3, 40, seed=22, dtype=torch.float32).to(policy_dtype).requires_grad_()
    ref_logits = _random_logits(2, 3, 40, seed=23, dtype=torch.float32).to(ref_dtype)
    kl = exact_token_kl(logits, ref_logits, chunk_size=4)
    assert kl.dtype == torch.float32
    reference = _naive_token_kl(logits.detach().double(), ref_logits.double())
    torch.testing.assert_close(kl.double(), reference, rtol=0, atol=1e-5)
    (grad,) = torch.autograd.grad(kl.sum(), logits)
    assert grad.dtype == policy_dtype


def test_exact_token_kl_of_float32_stays_float32():
    logits = _random_logits(1, 2, 6, seed=15, dtype=torch.float32)
    assert exact_token_kl(logits, logits.clone()).dtype == torch.float32
    torch.testing.assert_close(exact_token_kl(logits, logits.clone()), torch.zeros(1, 2), rtol=0, atol=1e-6)


# ----- kl_penalty on a hand-sized batch (the expected gradients are in test_estimators_exact.py) -----


def _small_batch(seed=0):
    generator = torch.Generator().manual_seed(seed)
    logprobs = -torch.rand(3, 4, generator=generator, dtype=torch.float64) * 2
    ref_logprobs = -torch.rand(3, 4, generator=generator, dtype=torch.float64) * 2
    old_logprobs = -torch.rand(3, 4, generator=generator, dtype=torch.float64) * 2
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 1, 0]], dtype=torch.float64)
    return logprobs.requires_grad_(), ref_logprobs, old_logprobs, mask


def test_kl_penalty_k1_value_and_per_token_gradient_are_the_reward_to_go():
    logprobs, ref_logprobs, _, mask = _small_batch()
    term = kl_penalty(logprobs, ref_logprobs, mask)
    d = (logprobs.detach() - ref_logprobs) * mask
    torch.testing.assert_close(term.value, d.sum(-1), rtol=0, atol=1e-15)
    torch.testing.assert_close(term.loss.detach(), term.value, rtol=0, atol=1e-15)
    (grad,) = torch.autograd.grad(term.loss.sum(), logprobs)
    # d loss / d logp_t = sum_{u >= t} d_u on real tokens, 0 on masked ones (written out by hand)
    expected = torch.stack(
        [
            torch.stack([d[0, 0:].sum(), d[0, 1:].sum(), d[0, 2:].sum(), d[0, 3]]),
            torch.stack([d[1, 0:].sum(), d[1, 1], torch.tensor(0.0).double(), torch.tensor(0.0).double()]),
            torch.stack([d[2, 0] + d[2, 2], torch.tensor(0.0).double(), d[2, 2], torch.tensor(0.0).double()]),
        ]
    )
    torch.testing.assert_close(grad, expected, rtol=0, atol=1e-15)


def test_kl_penalty_k3_per_token_gradient():
    logprobs, ref_logprobs, _, mask = _small_batch(1)
    term = kl_penalty(logprobs, ref_logprobs, mask, estimator="k3")
    delta = logprobs.detach() - ref_logprobs
    k3 = (torch.exp(-delta) - 1 + delta) * mask
    torch.testing.assert_close(term.value, k3.sum(-1), rtol=0, atol=1e-15)
    (grad,) = torch.autograd.grad(term.loss.sum(), logprobs)
    # pathwise (1 - exp(-delta_t)) plus the score's reward-to-go of k3, on real tokens
    rtg = k3.flip(-1).cumsum(-1).flip(-1)
    torch.testing.assert_close(grad, ((1 - torch.exp(-delta)) + rtg) * mask, rtol=0, atol=1e-14)


def test_kl_penalty_off_policy_weights_are_prefix_products():
    logprobs, ref_logprobs, old_logprobs, mask = _small_batch(2)
    term = kl_penalty(logprobs, ref_logprobs, mask, old_logprobs=old_logprobs)
    rho = (logprobs.detach() - old_logprobs) * mask
    weights = torch.exp(rho.cumsum(-1))  # w_{1:t}
    d = (logprobs.detach() - ref_logprobs) * mask
    torch.testing.assert_close(term.value, (weights * d).sum(-1), rtol=0, atol=1e-14)
    (grad,) = torch.autograd.grad(term.loss.sum(), logprobs)
    torch.testing.assert_close(grad, (weights * d).flip(-1).cumsum(-1).flip(-1) * mask, rtol=0, atol=1e-14)


def test_kl_penalty_baseline_is_subtracted_from_each_real_tokens_return():
    logprobs, ref_logprobs, old_logprobs, mask = _small_batch(7)
    baseline = torch.arange(12, dtype=torch.float64).reshape(3, 4) / 10
    for old, weights in [(None, torch.ones(3, 4, dtype=torch.float64)),
                         (old_logprobs, torch.exp(((logprobs.detach() - old_logprobs) * mask).cumsum(-1)))]:
        plain = kl_penalty(logprobs, ref_logprobs, mask, old_logprobs=old)
        shifted = kl_penalty(logprobs, ref_logprobs, mask, old_logprobs=old, baseline=baseline)
        torch.testing.assert_close(shifted.loss.detach(), plain.loss.detach(), rtol=0, atol=0)
        (plain_grad,) = torch.autograd.grad(plain.loss.sum(), logprobs)
        (shifted_grad,) = torch.autograd.grad(shifted.loss.sum(), logprobs)
        # off-policy the baseline carries w_{1:t}, so that E_old[w_{1:t} s_t b_t] = 0
        torch.testing.assert_close(shifted_grad, plain_grad - weights * baseline * mask, rtol=0, atol=1e-14)


@pytest.mark.parametrize("estimator", ["k1", "k3", "rb"])
def test_kl_penalty_with_old_equal_to_current_is_the_on_policy_term(estimator):
    logprobs, ref_logprobs, _, mask = _small_batch(3)
    logits = _random_logits(3, 4, 5, seed=16).requires_grad_()
    ref_logits = _random_logits(3, 4, 5, seed=17)
    extra = {"logits": logits, "ref_logits": ref_logits} if estimator == "rb" else {}
    on = kl_penalty(logprobs, ref_logprobs, mask, estimator=estimator, **extra)
    off = kl_penalty(logprobs, ref_logprobs, mask, estimator=estimator, old_logprobs=logprobs.detach(), **extra)
    torch.testing.assert_close(off.value, on.value, rtol=0, atol=1e-15)
    inputs = [logprobs, logits] if estimator == "rb" else [logprobs]
    for got, want in zip(torch.autograd.grad(off.loss.sum(), inputs), torch.autograd.grad(on.loss.sum(), inputs)):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-15)


@pytest.mark.parametrize("estimator", ["k1", "k3", "rb"])
def test_kl_penalty_does_not_couple_sequences(estimator):
    logprobs, ref_logprobs, old_logprobs, mask = _small_batch(4)
    logits = _random_logits(3, 4, 5, seed=18).requires_grad_()
    extra = {"logits": logits, "ref_logits": _random_logits(3, 4, 5, seed=19)} if estimator == "rb" else {}
    term = kl_penalty(logprobs, ref_logprobs, mask, estimator=estimator, old_logprobs=old_logprobs, **extra)
    inputs = [logprobs, logits] if estimator == "rb" else [logprobs]
    for grad in torch.autograd.grad(term.loss[1], inputs):
        assert grad[1].abs().sum() > 0
        assert grad[0].abs().sum() == 0 and grad[2].abs().sum() == 0


def test_kl_penalty_rb_value_is_the_masked_sum_of_exact_kls():
    logprobs, ref_logprobs, _, mask = _small_batch(5)
    logits = _random_logits(3, 4, 5, seed=20)
    ref_logits = _random_logits(3, 4, 5, seed=21)
    term = kl_penalty(logprobs, ref_logprobs, mask, estimator="rb", logits=logits, ref_logits=ref_logits)
    expected = (_naive_token_kl(logits, ref_logits) * mask).sum(-1)
    torch.testing.assert_close(term.value, expected, rtol=0, atol=1e-12)


def test_kl_penalty_of_bfloat16_log_probs_is_float32():
    logprobs, ref_logprobs, _, mask = _small_batch(6)
    term = kl_penalty(logprobs.detach().to(torch.bfloat16), ref_logprobs.to(torch.bfloat16), mask, estimator="k3")
    assert term.value.dtype == term.loss.dtype == torch.float32


# ----- validation -----

LOGP = torch.zeros(4, 8)
MASK = torch.ones(4, 8)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: token_kl(LOGP, torch.zeros(4, 7)), "ref_logprobs has shape (4, 7) but logprobs has shape (4, 8)"),
        (lambda: token_kl(LOGP, LOGP, estimator="k4"), "estimator must be one of 'k1', 'k2', 'k3', got 'k4'"),
        (lambda: token_kl(LOGP.long(), LOGP), "logprobs must have a floating dtype, got torch.int64"),
        (lambda: token_kl([0.0], LOGP), "logprobs must be a torch.Tensor, got list"),
        (lambda: token_kl(torch.zeros(8), torch.zeros(8)), "logprobs must be [B, T], got shape (8,)"),
        (lambda: kl_reward(LOGP, LOGP, torch.ones(4, 9)), "mask has shape (4, 9) but logprobs has shape (4, 8)"),
        (lambda: kl_reward(LOGP, LOGP, 2 * MASK), "mask must contain only 0 and 1"),
        (lambda: kl_reward(LOGP, LOGP, MASK.tolist()), "mask must be a torch.Tensor, got list"),
        (
            lambda: kl_penalty(LOGP, LOGP.clone().index_fill_(1, torch.tensor([3]), math.nan), MASK),
            "ref_logprobs contains NaN or inf",
        ),
        (lambda: kl_penalty(LOGP.clone().fill_(-math.inf), LOGP, MASK), "logprobs contains NaN or inf"),
        (
            lambda: kl_penalty(LOGP, LOGP, MASK, old_logprobs=torch.zeros(4, 8, dtype=torch.int32)),
            "old_logprobs must have a floating dtype, got torch.int32",
        ),
        (
            lambda: kl_penalty(LOGP, LOGP, MASK, baseline=torch.zeros(4)),
            "baseline has shape (4,) but logprobs has shape (4, 8)",
        ),
        (lambda: kl_penalty(LOGP, LOGP, MASK, estimator="k2"), "estimator must be one of 'k1', 'k3', 'rb', got 'k2'"),
        (lambda: kl_penalty(LOGP, LOGP, MASK, estimator="rb"), 'estimator "rb" needs logits and ref_logits'),
        (
            lambda: kl_penalty(LOGP, LOGP, MASK, estimator="rb", logits=torch.zeros(4, 7, 3), ref_logits=torch.zeros(4, 7, 3)),
            "logits has shape (4, 7, 3) but logprobs has shape (4, 8); expected [B, T, V]",
        ),
        (
            lambda: exact_token_kl(torch.zeros(4, 8, 3), torch.zeros(4, 8, 5)),
            "ref_logits has shape (4, 8, 5) but logits has shape (4, 8, 3)",
        ),
        (lambda: exact_token_kl(torch.zeros(2, 3), torch.zeros(2, 3), chunk_size=0), "chunk_size must be a positive int or None, got 0"),
        (
            lambda: exact_token_kl(torch.tensor([[0.0, math.inf]]), torch.zeros(1, 2)),
            "logits or ref_logits contain NaN or +inf, or a row that is -inf everywhere",
        ),
        (
            lambda: exact_token_kl(torch.zeros(1, 2), torch.tensor([[math.nan, 0.0]])),
            "logits or ref_logits contain NaN or +inf, or a row that is -inf everywhere",
        ),
        (
            lambda: exact_token_kl(torch.zeros(2, 2), torch.tensor([[0.0, 0.0], [-math.inf, -math.inf]])),
            "logits or ref_logits contain NaN or +inf, or a row that is -inf everywhere",
        ),
        (lambda: exact_token_kl(torch.zeros(1, 2), torch.zeros(1, 2), backend="cuda"),
         "backend must be one of 'auto', 'torch', 'triton', got 'cuda'"),
    ],
)
def test_user_mistakes_raise_a_clear_value_error(call, message):
    with pytest.raises(ValueError) as raised:
        call()
    assert message in str(raised.value)


# ----- GPU-shaped use: half-precision inputs, and value checks that would wait for the device -----


@pytest.mark.parametrize("estimator", ["k1", "k3", "rb"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_kl_penalty_of_half_precision_inputs_matches_float64(estimator, dtype):
    """Half-precision log-probs and logits (as a trainer hands them over) against the same numbers upcast
    to float64: the computation runs in float32 on values of size <= ~10 over T = 6 tokens, so value and
    loss agree to ~1e-5 relative (a rounding to the inputs' 8 or 11 bits inside would show as 4e-3 or
    5e-4); each gradient comes back in its input's dtype, with that rounding alone."""
    generator = torch.Generator().manual_seed(30)
    logits = (2 * torch.randn(3, 6, 50, generator=generator)).to(dtype)
    ref_logits = (2 * torch.randn(3, 6, 50, generator=generator)).to(dtype)
    logprobs, ref_logprobs = (-3 * torch.rand(2, 3, 6, generator=generator)).to(dtype)
    mask = torch.tensor([[1] * 6, [1] * 4 + [0] * 2, [1, 1, 0, 1, 1, 0]], dtype=torch.bool)

    def term(cast):
        leaves = [cast(logprobs).requires_grad_(), cast(logits).requires_grad_()]
        result = kl_penalty(leaves[0], cast(ref_logprobs), mask, estimator=estimator, logits=leaves[1],
                            ref_logits=cast(ref_logits))
        grads = torch.autograd.grad(result.loss.sum(), leaves, allow_unused=True)
        return result.value, result.loss, *(torch.zeros_like(leaf) if grad is None else grad
                                            for leaf, grad in zip(leaves, grads))

    half, exact = term(lambda x: x.clone()), term(lambda x: x.double())
    assert half[0].dtype == half[1].dtype == torch.float32 and half[2].dtype == half[3].dtype == dtype
    for mine, reference in zip(half[:2], exact[:2]):
        torch.testing.assert_close(mine.double(), reference, rtol=1e-5, atol=1e-5)
    rounding = 2**-8 if dtype == torch.bfloat16 else 2**-11
    for mine, reference in zip(half[2:], exact[2:]):
        torch.testing.assert_close(mine.double(), reference, rtol=rounding, atol=1e-6)


def test_value_checks_can_be_turned_off_and_then_nan_propagates():
    """check_values=False is the default on a GPU: no check waits for the device, bad values give NaN."""
    logprobs = LOGP.clone().index_fill_(1, torch.tensor([2]), math.nan)
    term = kl_penalty(logprobs, LOGP, MASK, check_values=False)
    assert torch.isnan(term.value).all()
    assert kl_reward(LOGP, LOGP, 2 * MASK, check_values=False).shape == LOGP.shape
    kl = exact_token_kl(torch.tensor([[0.0, math.nan]]), torch.zeros(1, 2), check_values=False)
    assert torch.isnan(kl).all()
    with pytest.raises(ValueError, match="logprobs contains NaN or inf"):
        kl_penalty(logprobs, LOGP, MASK, check_values=True)
