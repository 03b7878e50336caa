"""Fused exact per-token KL over the vocabulary, forward and backward, in Triton (needs `triton`).

For one row of policy logits x and reference logits r (length V), with p = softmax(x), q = softmax(r):

    KL = sum_v p_v (log p_v - log q_v) = sum_v p_v (x_v - r_v) - lse(x) + lse(r)
    d KL / d x_v = p_v (log p_v - log q_v - KL),      d KL / d r_v = q_v - p_v.

Forward reads each row once, a block of columns at a time: the block's maximum (one reduction across the
program) moves the row's running maximum, the lanes' sums of exp(x), exp(r) and exp(x) (x - r - c) are
rescaled by one exponential each, and each element costs one exponential per input (c, the first entry's
x - r, keeps the sum small when p is close to q). On an H200 this runs at the memory floor in float32 and at
1.5 times it in bfloat16, where the earlier form with a running maximum per lane (a comparison and a select
per element more) took 2 times (benchmarks/tune_token_kl.py).
It writes the KL and six float32 statistics per row. Backward reads the row once more and writes
the gradient of each input asked for. Inputs are float32, bfloat16 or float16 (any mix), read in
their own dtype and accumulated in float32; gradients come back in the input's dtype.

-inf marks a vocabulary entry out of a distribution's support (top-k or top-p masking): it adds
nothing where the policy has it; a policy entry the reference rules out makes KL = +inf, and that
row's gradient NaN (undefined). NaN or +inf anywhere in a row gives a NaN KL.

Triton decides when it is imported whether kernels are compiled (CUDA tensors) or run by its
interpreter (`TRITON_INTERPRET=1` set before the import; CPU tensors, slow: for tests).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# per row: max(x), log sum exp(x - max(x)), the same of r, c, and lse(x) - lse(r) - c + KL (the backward's
# offset); each log-sum-exp kept in two parts, as their float32 sum would lose 1e-3 at logits of 1e4
STATISTICS = 6


@dataclass(frozen=True)
class Launch:
    """How a kernel is launched on a GPU: lanes per block (a power of 2), warps per program, and the
    software-pipeline stages of its loop over the row. Under the interpreter only `block` matters."""

    block: int
    warps: int = 8
    stages: int = 3


# Per element size of the policy logits (4: float32, 2: bfloat16 and float16): the fastest of
# benchmarks/tune_token_kl.py's candidates on an H200 (torch 2.11, Triton 3.6) at 8192 rows of V = 152,064 and
# 32,000, in both dtypes; the next ones were within 2 to 8% (forward) and 1% (backward).
FORWARD = {4: Launch(1024, 4), 2: Launch(1024, 4)}
BACKWARD = {4: Launch(8192, 16), 2: Launch(8192, 16)}


def interpreting() -> bool:
    """Whether this process runs Triton kernels in its interpreter (TRITON_INTERPRET=1 at import)."""
    return bool(triton.knobs.runtime.interpret)


@triton.jit
def _forward_kernel(x_ptr, r_ptr, kl_ptr, stats_ptr, rows, inner, x_outer, x_inner, r_outer, r_inner, vocab,
                    BLOCK: tl.constexpr):
    """One program per row: KL into kl_ptr[row], the statistics into stats_ptr[k * rows + row]."""
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + (row // inner) * x_outer + (row % inner) * x_inner
    r_row = r_ptr + (row // inner) * r_outer + (row % inner) * r_inner
    shift = tl.load(x_row).to(tl.float32) - tl.load(r_row).to(tl.float32)
    shift = tl.where(tl.abs(shift) < float("inf"), shift, 0.0)
    lanes = tl.arange(0, BLOCK)
    x_max = float("-inf")  # the row's maximum so far
    r_max = float("-inf")
    x_sum = tl.zeros((BLOCK,), tl.float32)  # sum exp(x - x_top) per lane, x_top: x_max, or 0 while it is -inf
    r_sum = tl.zeros((BLOCK,), tl.float32)
    weighted = tl.zeros((BLOCK,), tl.float32)  # sum exp(x - x_top) (x - r - c) per lane
    for start in range(0, vocab, BLOCK):
        columns = start + lanes
        inside = columns < vocab
        x = tl.load(x_row + columns, mask=inside, other=float("-inf")).to(tl.float32)
        r = tl.load(r_row + columns, mask=inside, other=float("-inf")).to(tl.float32)
        x_new = tl.maximum(x_max, tl.max(x, 0))
        x_top = tl.where(x_new == float("-inf"), 0.0, x_new)
        # a rescaling below 1e-30 changes the sums by under 1e-30 * V of themselves; kept above 0, it keeps a
        # lane's +inf (a policy entry the reference rules out) from becoming NaN
        x_scale = tl.maximum(tl.exp(x_max - x_top), 1e-30)
        x_exp = tl.exp(x - x_top)
        difference = tl.where(x == float("-inf"), 0.0, x - r - shift)
        weighted = weighted * x_scale + tl.where(difference == float("inf"), difference, x_exp * difference)
        x_sum = x_sum * x_scale + x_exp
        x_max = x_new
        r_new = tl.maximum(r_max, tl.max(r, 0))
        r_top = tl.where(r_new == float("-inf"), 0.0, r_new)
        r_sum = r_sum * tl.exp(r_max - r_top) + tl.exp(r - r_top)
        r_max = r_new
    x_max = tl.where(x_max == float("-inf"), 0.0, x_max)  # what the sums are relative to
    r_max = tl.where(r_max == float("-inf"), 0.0, r_max)
    x_total = tl.sum(x_sum, 0)
    r_total = tl.sum(r_sum, 0)
    normalisers = (x_max - r_max - shift) + (tl.log(x_total) - tl.log(r_total))  # lse(x) - lse(r) - c
    kl = tl.sum(weighted, 0) / x_total - normalisers
    tl.store(kl_ptr + row, kl)
    tl.store(stats_ptr + row, x_max)
    tl.store(stats_ptr + rows + row, tl.log(x_total))
    tl.store(stats_ptr + 2 * rows + row, r_max)
    tl.store(stats_ptr + 3 * rows + row, tl.log(r_total))
    tl.store(stats_ptr + 4 * rows + row, shift)
    tl.store(stats_ptr + 5 * rows + row, normalisers + kl)


@triton.jit
def _backward_kernel(x_ptr, r_ptr, stats_ptr, grad_kl_ptr, x_grad_ptr, r_grad_ptr, rows, inner, x_outer, x_inner,
                     r_outer, r_inner, vocab, WANT_X: tl.constexpr, WANT_R: tl.constexpr, BLOCK: tl.constexpr):
    """One program per row: grad_kl[row] times d KL / d x and / or d KL / d r into contiguous [rows, V]."""
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + (row // inner) * x_outer + (row % inner) * x_inner
    r_row = r_ptr + (row // inner) * r_outer + (row % inner) * r_inner
    x_max = tl.load(stats_ptr + row)
    x_log_sum = tl.load(stats_ptr + rows + row)
    r_max = tl.load(stats_ptr + 2 * rows + row)
    r_log_sum = tl.load(stats_ptr + 3 * rows + row)
    shift = tl.load(stats_ptr + 4 * rows + row)
    offset = tl.load(stats_ptr + 5 * rows + row)
    scale = tl.load(grad_kl_ptr + row)
    scale = tl.where(offset == float("inf"), float("nan"), scale)  # KL = +inf: no gradient exists
    lanes = tl.arange(0, BLOCK)
    for start in range(0, vocab, BLOCK):
        columns = start + lanes
        inside = columns < vocab
        x = tl.load(x_row + columns, mask=inside, other=float("-inf")).to(tl.float32)
        r = tl.load(r_row + columns, mask=inside, other=float("-inf")).to(tl.float32)
        p = tl.exp((x - x_max) - x_log_sum)
        if WANT_X:
            x_grad = tl.where(x == float("-inf"), 0.0, scale * p * ((x - r - shift) - offset))
            tl.store(x_grad_ptr + row * vocab + columns, x_grad.to(x_grad_ptr.dtype.element_ty), mask=inside)
        if WANT_R:
            r_grad = scale * (tl.exp((r - r_max) - r_log_sum) - p)
            tl.store(r_grad_ptr + row * vocab + columns, r_grad.to(r_grad_ptr.dtype.element_ty), mask=inside)


def rows_view(tensor: torch.Tensor) -> torch.Tensor | None:
    """`tensor` [..., V] as a view [A, B, V] whose rows the kernels can address (contiguous along V), or
    None when no such view exists (then the caller uses the chunked torch code)."""
    if tensor.dim() == 0 or (tensor.shape[-1] > 1 and tensor.stride(-1) != 1):
        return None
    if tensor.dim() < 3:
        return tensor.reshape((1,) * (3 - tensor.dim()) + tuple(tensor.shape))  # adds unit dims: a view
    try:
        return tensor.view(-1, *tensor.shape[-2:])
    except RuntimeError:  # leading dims that cannot merge without a copy
        return None


def supports(logits: torch.Tensor, ref_logits: torch.Tensor) -> bool:
    """Whether the fused kernels take these inputs (dtypes and layout; same shape and device assumed)."""
    return (logits.dtype in SUPPORTED_DTYPES and ref_logits.dtype in SUPPORTED_DTYPES
            and logits.numel() > 0 and rows_view(logits) is not None and rows_view(ref_logits) is not None)


def _layout(logits: torch.Tensor, ref_logits: torch.Tensor) -> tuple:
    """(rows, inner, x_outer, x_inner, r_outer, r_inner, V) of the kernels' row addressing."""
    x, r = rows_view(logits), rows_view(ref_logits)
    if x is None or r is None:
        raise ValueError("the fused kernels need inputs whose rows they can address: check supports() first")
    rows = x.shape[0] * x.shape[1]
    return rows, x.shape[1], x.stride(0), x.stride(1), r.stride(0), r.stride(1), x.shape[2]


def _chosen(table: dict[int, Launch], launch: Launch | None, logits: torch.Tensor) -> Launch:
    return launch if launch is not None else table[logits.element_size()]


def _launch_options(tensor: torch.Tensor, launch: Launch) -> dict:
    return {} if tensor.device.type == "cpu" else {"num_warps": launch.warps, "num_stages": launch.stages}


def _device_guard(tensor: torch.Tensor) -> contextlib.AbstractContextManager:
    """Launch on the tensor's own GPU (nothing to do for CPU tensors under the interpreter)."""
    return torch.cuda.device(tensor.device) if tensor.device.type == "cuda" else contextlib.nullcontext()


def forward(logits: torch.Tensor, ref_logits: torch.Tensor, *, launch: Launch | None = None
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """(KL [rows] float32, statistics [STATISTICS, rows] float32) of inputs [..., V] that `supports` accepts;
    `launch` None takes FORWARD's entry for the logits' dtype."""
    launch = _chosen(FORWARD, launch, logits)
    layout = _layout(logits, ref_logits)
    rows, vocab = layout[0], layout[-1]
    kl = torch.empty(rows, dtype=torch.float32, device=logits.device)
    stats = torch.empty(STATISTICS, rows, dtype=torch.float32, device=logits.device)
    block = min(launch.block, triton.next_power_of_2(vocab))
    with _device_guard(logits):
        _forward_kernel[(rows,)](rows_view(logits), rows_view(ref_logits), kl, stats, *layout, BLOCK=block,
                                 **_launch_options(logits, launch))
    return kl, stats


def backward(logits: torch.Tensor, ref_logits: torch.Tensor, stats: torch.Tensor, grad_kl: torch.Tensor, *,
             want_logits: bool, want_ref: bool, launch: Launch | None = None
             ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """grad_kl [rows] times the gradient of each row's KL w.r.t. logits and / or ref_logits (None where
    not wanted), each contiguous, shaped and typed like its input; `launch` None takes BACKWARD's entry."""
    launch = _chosen(BACKWARD, launch, logits)
    layout = _layout(logits, ref_logits)
    vocab = layout[-1]
    logits_grad = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device) if want_logits else None
    ref_grad = torch.empty(ref_logits.shape, dtype=ref_logits.dtype, device=logits.device) if want_ref else None
    grad_kl = grad_kl.reshape(-1).to(torch.float32).contiguous()
    block = min(launch.block, triton.next_power_of_2(vocab))
    placeholder = stats  # a pointer the kernel never touches when that gradient is not wanted
    with _device_guard(logits):
        _backward_kernel[(layout[0],)](
            rows_view(logits), rows_view(ref_logits), stats, grad_kl,
            placeholder if logits_grad is None else logits_grad, placeholder if ref_grad is None else ref_grad,
            *layout, WANT_X=want_logits, WANT_R=want_ref, BLOCK=block, **_launch_options(logits, launch))
    return logits_grad, ref_grad


class FusedTokenKL(torch.autograd.Function):
    """Exact per-row KL of logits [..., V] against ref_logits [..., V], float32 [...]; saves the inputs by
    reference and six float32 statistics per row, and recomputes in backward (once differentiable)."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, ref_logits: torch.Tensor, forward_launch: Launch | None = None,
                backward_launch: Launch | None = None):
        kl, stats = forward(logits, ref_logits, launch=forward_launch)
        ctx.save_for_backward(logits, ref_logits, stats)
        ctx.backward_launch = backward_launch
        return kl.view(logits.shape[:-1])

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_kl: torch.Tensor):
        logits, ref_logits, stats = ctx.saved_tensors
        want_logits, want_ref = ctx.needs_input_grad[:2]
        logits_grad, ref_grad = backward(logits, ref_logits, stats, grad_kl, want_logits=want_logits,
                                         want_ref=want_ref, launch=ctx.backward_launch)
        return logits_grad, ref_grad, None, None
