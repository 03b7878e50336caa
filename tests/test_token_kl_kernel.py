"""exact_token_kl's two implementations, the chunked torch code and the fused Triton kernel
(klaudit.kernels.token_kl), against the KL and its gradients computed in float64 from the same logits.

The kernel runs compiled on a GPU and, without one, under Triton's interpreter on CPU tensors: this
module sets TRITON_INTERPRET=1 before Triton is imported when no GPU is present (run it alone with
TRITON_INTERPRET=1 to interpret on a GPU machine too). Shapes stay small: the interpreter runs each
program in Python. The tolerances, for inputs of scale ~3 and V <= 5000, follow from float32
accumulation (eps = 6e-8, sums over a few thousand terms of size <= ~30: about 1e-5 on the KL) and
from the rounding of the returned gradient to its input's dtype (relative 2^-8 for bfloat16, 2^-11 for
float16, plus float16's subnormal spacing 6e-8).
"""

from __future__ import annotations

import math
import os

import pytest

torch = pytest.importorskip("torch")

CUDA = torch.cuda.is_available()
if not CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # must precede the first import of triton

from klaudit.estimators import exact_token_kl, kl_penalty  # noqa: E402
from klaudit.kernels import triton_available  # noqa: E402

# the interpreter computes the NaN and infinite lanes that the kernels then discard with tl.where
pytestmark = [pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:divide by zero encountered:RuntimeWarning")]


def _kernel_device() -> tuple[str | None, str]:
    """The device the kernel runs on here, or None and why not."""
    if not triton_available():
        return None, "triton is not installed (pip install 'klaudit[triton]')"
    from klaudit.kernels import token_kl

    if token_kl.interpreting():
        return "cpu", ""
    if CUDA:
        return "cuda", ""
    return None, "triton was imported before TRITON_INTERPRET=1 could be set: run with TRITON_INTERPRET=1"


KERNEL_DEVICE, WHY_NO_KERNEL = _kernel_device()
BACKENDS = [pytest.param("torch", id="torch"),
            pytest.param("triton", id="triton", marks=pytest.mark.skipif(KERNEL_DEVICE is None, reason=WHY_NO_KERNEL))]
DEVICE = "cuda" if CUDA else "cpu"
# Triton 3.9's interpreter truncates float32 to bfloat16 (relative error up to 2^-7) where a GPU rounds to
# nearest (2^-8); the torch code rounds to nearest too.
BFLOAT16_ROUNDING = 2**-7 if KERNEL_DEVICE == "cpu" else 2**-8
TOLERANCE = {  # (rtol, atol) of the returned gradient against float64; the KL is float32 for all three
    torch.float32: (1e-4, 1e-6),
    torch.bfloat16: (BFLOAT16_ROUNDING, 1e-6),
    torch.float16: (2**-11, 1e-6),
}
KL_ATOL = 1e-5


def _device(backend: str) -> str:
    return KERNEL_DEVICE if backend == "triton" else DEVICE


def _logits(*shape, seed: int, dtype=torch.float32, scale: float = 3.0, device: str = "cpu") -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(shape, generator=generator, dtype=torch.float64)).to(dtype).to(device)


def _exact(logits: torch.Tensor, ref_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(KL, d KL / d logits, d KL / d ref_logits) per row in float64 by enumerating the vocabulary: an entry
    with logit -inf has probability 0; KL = +inf where the policy has mass the reference rules out."""
    x, r = logits.detach().double().cpu(), ref_logits.detach().double().cpu()
    log_p, log_q = torch.log_softmax(x, -1), torch.log_softmax(r, -1)
    p, q = log_p.exp(), log_q.exp()
    outside = (x > -math.inf) & (r == -math.inf)
    safe_log_ratio = torch.where(p > 0, log_p - log_q, 0.0).masked_fill(outside, 0.0)
    kl = (p * safe_log_ratio).sum(-1).masked_fill(outside.any(-1), math.inf)
    grad_logits = torch.where(p > 0, p * (safe_log_ratio - kl.unsqueeze(-1)), 0.0)
    return kl, grad_logits, q - p


def _run(logits, ref_logits, backend: str, grad_of_kl=None):
    """(KL, grad logits, grad ref_logits) from exact_token_kl with the backend; the gradients of
    sum(grad_of_kl * KL) (all ones when not given)."""
    logits = logits.detach().clone().requires_grad_()
    ref_logits = ref_logits.detach().clone().requires_grad_()
    kl = exact_token_kl(logits, ref_logits, backend=backend, check_values=False)
    kl.backward(torch.ones_like(kl) if grad_of_kl is None else grad_of_kl)
    return kl.detach(), logits.grad, ref_logits.grad


def _assert_matches_float64(logits, ref_logits, backend, grad_of_kl):
    kl, grad_logits, grad_ref = _run(logits, ref_logits, backend, grad_of_kl)
    expected_kl, expected_grad_logits, expected_grad_ref = _exact(logits, ref_logits)
    weights = grad_of_kl.detach().double().cpu().unsqueeze(-1)
    assert kl.dtype == torch.float32
    assert grad_logits.dtype == logits.dtype and grad_ref.dtype == ref_logits.dtype
    torch.testing.assert_close(kl.double().cpu(), expected_kl, rtol=KL_ATOL, atol=KL_ATOL)
    for grad, expected, dtype in ((grad_logits, expected_grad_logits, logits.dtype),
                                  (grad_ref, expected_grad_ref, ref_logits.dtype)):
        rtol, atol = TOLERANCE[dtype]
        torch.testing.assert_close(grad.double().cpu(), weights * expected, rtol=rtol, atol=atol)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_value_and_both_gradients_match_float64(backend, dtype, monkeypatch):
    """V = 1000 over blocks of 128 (the kernel's loop runs 8 times, the last block partly outside V)."""
    from klaudit.kernels import token_kl

    if triton_available():
        monkeypatch.setattr(token_kl, "FORWARD", {size: token_kl.Launch(128) for size in (2, 4)})
        monkeypatch.setattr(token_kl, "BACKWARD", {size: token_kl.Launch(256) for size in (2, 4)})
    device = _device(backend)
    logits = _logits(2, 3, 1000, seed=0, dtype=dtype, device=device)
    ref_logits = _logits(2, 3, 1000, seed=1, dtype=dtype, device=device)
    _assert_matches_float64(logits, ref_logits, backend, _logits(2, 3, seed=2, scale=1.0, device=device))


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_vocabulary_over_several_default_blocks(backend):
    device = _device(backend)
    logits = _logits(3, 5000, seed=3, dtype=torch.bfloat16, device=device)
    ref_logits = _logits(3, 5000, seed=4, device=device)  # mixed precision: bf16 policy, fp32 reference
    _assert_matches_float64(logits, ref_logits, backend, _logits(3, seed=5, scale=1.0, device=device))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_top_k_masked_vocabularies(backend, dtype):
    """-inf entries: the policy keeps the top 20 of 300 tokens and the reference the top 100 of its own
    logits, which hold the policy's (finite KL); one row where both mask the same tokens; one where the
    reference rules out a token the policy keeps (KL = +inf, gradient NaN)."""
    device = _device(backend)
    ref_logits = _logits(4, 300, seed=6, dtype=torch.float64)
    logits = ref_logits + _logits(4, 300, seed=7, dtype=torch.float64, scale=1.0)
    policy_kept = logits.topk(20, -1).indices
    ref_kept = torch.cat([policy_kept, ref_logits.topk(80, -1).indices], -1)
    logits = torch.full_like(logits, -math.inf).scatter(-1, policy_kept, logits.gather(-1, policy_kept))
    ref_logits = torch.full_like(ref_logits, -math.inf).scatter(-1, ref_kept, ref_logits.gather(-1, ref_kept))
    ref_logits[1] = torch.where(logits[1] == -math.inf, -math.inf, ref_logits[1].clamp(min=-5.0))  # same support
    ref_logits[3, policy_kept[3, 0]] = -math.inf  # the policy's top token is outside the reference's support
    logits, ref_logits = logits.to(dtype).to(device), ref_logits.to(dtype).to(device)
    kl, grad_logits, grad_ref = _run(logits, ref_logits, backend)
    expected_kl, expected_grad_logits, expected_grad_ref = _exact(logits, ref_logits)
    assert torch.isfinite(kl[:3]).all() and kl[3].item() == math.inf
    torch.testing.assert_close(kl[:3].double().cpu(), expected_kl[:3], rtol=KL_ATOL, atol=KL_ATOL)
    rtol, atol = TOLERANCE[dtype]
    torch.testing.assert_close(grad_logits[:3].double().cpu(), expected_grad_logits[:3], rtol=rtol, atol=atol)
    torch.testing.assert_close(grad_ref[:3].double().cpu(), expected_grad_ref[:3], rtol=rtol, atol=atol)
    assert (grad_logits[:3][logits[:3] == -math.inf] == 0).all()  # masked entries take no gradient
    assert torch.isnan(grad_logits[3][logits[3] > -math.inf]).all() and torch.isnan(grad_ref[3]).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_masked_first_block_then_very_negative_logits(backend):
    """Top-k masking can leave whole blocks of a row at -inf before its first finite entry; the finite ones
    here lie near -300 (log-probs can), so a running maximum left at a stand-in 0 by the masked blocks would
    underflow every exp(x - max) to 0. Both inputs, over a vocabulary of two default forward blocks and more."""
    device = _device(backend)
    logits = _logits(3, 2500, seed=20, dtype=torch.float64) - 300.0
    ref_logits = logits + _logits(3, 2500, seed=21, dtype=torch.float64, scale=1.0)
    masked = torch.arange(2500) < 1600
    logits, ref_logits = logits.masked_fill(masked, -math.inf), ref_logits.masked_fill(masked, -math.inf)
    logits, ref_logits = logits.to(torch.float32).to(device), ref_logits.to(torch.float32).to(device)
    _assert_matches_float64(logits, ref_logits, backend, _logits(3, seed=22, scale=1.0, device=device))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype, offset", [(torch.float32, 1e4), (torch.float16, -3e4), (torch.bfloat16, 1e6)])
def test_huge_and_far_apart_logits_stay_stable(backend, dtype, offset):
    """The online log-sum-exp: both inputs offset by `offset` (exp() of them overflows or underflows
    without the running maximum; the KL is shift-invariant), in rows whose entries span ~300 nats, so
    that exp() of the smaller ones underflows in float32. (Offsetting the two inputs apart would test
    the conditioning of x - r at that magnitude, not the algorithm.)"""
    device = _device(backend)
    logits = (_logits(2, 3, 700, seed=8, dtype=torch.float64, scale=40.0) + offset).to(dtype)
    ref_logits = (_logits(2, 3, 700, seed=9, dtype=torch.float64, scale=40.0) + offset).to(dtype)
    kl, grad_logits, _ = _run(logits.to(device), ref_logits.to(device), backend)
    expected_kl, expected_grad_logits, _ = _exact(logits.double() - offset, ref_logits.double() - offset)
    scale = expected_kl.abs().clamp(min=1.0)  # KLs of up to ~100 nats: relative float32 accuracy
    assert torch.isfinite(kl).all()
    torch.testing.assert_close(kl.double().cpu() / scale, expected_kl / scale, rtol=0, atol=KL_ATOL)
    rtol, atol = TOLERANCE[dtype]
    # entries p (log p - log q - KL) with |log p - log q| up to ~300: float32 rounding of ~300 eps
    torch.testing.assert_close(grad_logits.double().cpu(), expected_grad_logits, rtol=rtol, atol=atol * 30)


@pytest.mark.parametrize("backend", BACKENDS)
def test_shifted_slices_and_identical_rows(backend):
    """logits[:, :-1] cannot be flattened (strided rows); a row equal to its reference up to a constant
    has KL 0 to float32 rounding and a zero gradient."""
    device = _device(backend)
    full = _logits(2, 4, 300, seed=10, device=device)
    ref_full = _logits(2, 4, 300, seed=11, device=device)
    ref_full[0, 1] = full[0, 0] - 7.0  # row 0 of the slice pair: the same distribution
    logits, ref_logits = full[:, :-1], ref_full[:, 1:]
    _assert_matches_float64(logits, ref_logits, backend, torch.ones(2, 3, device=device))
    kl, grad_logits, _ = _run(logits, ref_logits, backend)
    assert abs(kl[0, 0].item()) < 1e-6 and grad_logits[0, 0].abs().max().item() < 1e-6


@pytest.mark.parametrize("backend", BACKENDS)
def test_masked_rows_of_kl_penalty_take_no_gradient(backend, monkeypatch):
    """kl_penalty("rb") with padding positions: their logits (finite, arbitrary) change neither the value
    nor the real positions' gradient, and receive a zero gradient themselves."""
    device = _device(backend)
    if backend == "triton":  # kl_penalty reaches the kernel through the "auto" backend
        monkeypatch.setattr("klaudit.estimators._uses_kernel", lambda *args: True)
    else:
        monkeypatch.setattr("klaudit.estimators._uses_kernel", lambda *args: False)
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0]], dtype=torch.float32, device=device)
    logits = _logits(2, 4, 64, seed=12, device=device)
    ref_logits = _logits(2, 4, 64, seed=13, device=device)
    tokens = torch.tensor([[3, 5, 0, 0], [1, 2, 3, 0]], device=device)
    values = []
    for padding_scale in (1.0, 50.0):
        moved = torch.where(mask.bool().unsqueeze(-1), logits, padding_scale * logits).requires_grad_()
        logprobs = torch.log_softmax(moved, -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
        ref_logprobs = torch.log_softmax(ref_logits, -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
        term = kl_penalty(logprobs, ref_logprobs, mask, estimator="rb", logits=moved, ref_logits=ref_logits)
        (grad,) = torch.autograd.grad(term.loss.sum(), moved)
        assert (grad[~mask.bool()] == 0).all()
        values.append((term.value, grad[mask.bool()]))
    torch.testing.assert_close(values[0][0], values[1][0], rtol=0, atol=0)
    torch.testing.assert_close(values[0][1], values[1][1], rtol=0, atol=0)
    expected, _, _ = _exact(logits, ref_logits)
    torch.testing.assert_close(values[0][0].double().cpu(), (expected * mask.double().cpu()).sum(-1), rtol=1e-5,
                               atol=KL_ATOL)


@pytest.mark.skipif(KERNEL_DEVICE is None, reason=WHY_NO_KERNEL)
def test_invalid_rows_are_nan_and_raise_when_checked():
    logits = torch.zeros(3, 40, device=KERNEL_DEVICE)
    ref_logits = torch.zeros(3, 40, device=KERNEL_DEVICE)
    logits[0, 5] = math.nan
    ref_logits[1] = -math.inf  # no distribution at all
    logits[2, 7], ref_logits[2, 7] = -math.inf, math.nan  # NaN where the policy has no mass is NaN still
    kl = exact_token_kl(logits, ref_logits, backend="triton", check_values=False)
    assert torch.isnan(kl).all()
    with pytest.raises(ValueError, match="contain NaN or \\+inf, or a row that is -inf everywhere"):
        exact_token_kl(logits, ref_logits, backend="triton", check_values=True)


def test_the_triton_backend_says_why_it_cannot_run():
    if not triton_available():
        with pytest.raises(ValueError, match="backend 'triton' needs Triton"):
            exact_token_kl(torch.zeros(1, 4), torch.zeros(1, 4), backend="triton")
        return
    with pytest.raises(ValueError, match="float32, bfloat16 or float16 logits"):
        exact_token_kl(torch.zeros(1, 4, dtype=torch.float64), torch.zeros(1, 4, dtype=torch.float64),
                       backend="triton")


@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_on_cuda_the_kernel_is_the_default_and_agrees_with_the_torch_code(dtype):
    from klaudit.kernels import token_kl

    if token_kl.interpreting():
        pytest.skip("Triton runs in its interpreter in this process")
    logits = _logits(64, 32000, seed=14, dtype=dtype, device="cuda")
    ref_logits = _logits(64, 32000, seed=15, dtype=dtype, device="cuda")
    kernel = _run(logits, ref_logits, "auto")
    chunked = _run(logits, ref_logits, "torch")
    rtol, atol = TOLERANCE[dtype]
    torch.testing.assert_close(kernel[0], chunked[0], rtol=KL_ATOL, atol=KL_ATOL)
    for mine, theirs in zip(kernel[1:], chunked[1:]):
        torch.testing.assert_close(mine.float(), theirs.float(), rtol=2 * rtol, atol=atol)
    detached = logits.detach().clone().requires_grad_()
    exact_token_kl(detached, ref_logits)  # ensure the kernel path is what "auto" takes
    assert type(exact_token_kl(detached, ref_logits).grad_fn).__name__.startswith("FusedTokenKLBackward")


@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
def test_on_cuda_the_kernel_keeps_only_per_row_state():
    rows, vocab = 256, 152064
    logits = _logits(rows, vocab, seed=16, dtype=torch.bfloat16, device="cuda").requires_grad_()
    ref_logits = _logits(rows, vocab, seed=17, dtype=torch.bfloat16, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = torch.cuda.memory_allocated()
    kl = exact_token_kl(logits, ref_logits)
    kl.sum().backward()
    torch.cuda.synchronize()
    gradient = logits.numel() * logits.element_size()
    assert torch.cuda.max_memory_allocated() - start <= gradient + 64 * rows * 4 + 2**20
