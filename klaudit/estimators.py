"""Correct KL-regularisation terms for RL fine-tuning of language models (docs/kl-math.md §8).

The target is the gradient of the sequence-level reverse KL, KL(pi || ref) = E_pi[sum_t delta_t]
with delta_t = log pi(y_t | h_t) - log ref(y_t | h_t). `kl_penalty` returns a per-sequence
surrogate whose gradient is an unbiased estimate of it (replacements R-A, R-C, R-D and R-F);
`kl_reward` is the detached k1 cost for trainers that put the KL into the reward; `token_kl` and
`exact_token_kl` are per-token values, the latter exact over the vocabulary and memory-bounded
(a fused Triton kernel on CUDA tensors, chunked torch code elsewhere).

Conventions shared by every function:
* Per-token tensors are [B, T] (B sequences, T positions); `mask` is 1 on response tokens and 0
  elsewhere (bool, integer or floating; holes are allowed, right padding is not required).
  Scores and KL terms of masked positions never enter a result.
* Reference and behaviour log-probabilities are constants: they are detached.
* Results are float32 for float16/bfloat16 inputs and keep the dtype of float32/float64 inputs.
* Wrong shapes, non-floating dtypes and mixed devices raise ValueError naming the argument.
* Values are checked too (NaN or inf anywhere in an input, padding included: fill it with 0;
  mask values other than 0/1), raising ValueError, when `check_values` is True, and by default
  (None) on CPU tensors only: on a GPU each check would wait for the device (a host-device
  synchronisation), so there a bad value propagates into the result as NaN, as in torch itself.
  Nothing else in these functions synchronises with the device.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

TOKEN_ESTIMATORS = ("k1", "k2", "k3")
PENALTY_ESTIMATORS = ("k1", "k3", "rb")
BACKENDS = ("auto", "torch", "triton")

# Bytes of one scratch buffer of the chunked vocabulary computation when chunk_size is None.
# benchmarks/bench_exact_token_kl.py: 1 MiB chunks are fastest on an idle CPU, but every chunk
# costs ~10 thread-pool synchronisations, and on a loaded machine 1 MiB chunks were 8x slower
# than 16-64 MiB ones; 16 MiB keeps the chunk-sized temporaries well below 0.1 GB.
DEFAULT_CHUNK_BYTES = 16 * 2**20


class KLTerm(NamedTuple):
    """A per-sequence KL term: `value` [B] is a detached unbiased estimate of KL_seq for logging;
    `loss` [B] evaluates to the same numbers and its gradient is an unbiased estimate of
    grad KL(pi || ref). Use it as `loss = pg_loss + beta * kl.loss.mean()`."""

    value: torch.Tensor
    loss: torch.Tensor


# ---------------------------------------------------------------------------------------------
# Validation


def _shape(tensor: torch.Tensor) -> tuple:
    return tuple(tensor.shape)


def _require_floating(name: str, tensor) -> None:
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
    if not tensor.is_floating_point():
        raise ValueError(f"{name} must have a floating dtype, got {tensor.dtype}")


def _checks_values(check_values: bool | None, tensor: torch.Tensor) -> bool:
    """Whether to check values: as asked, or by default only where it costs no device synchronisation."""
    return tensor.device.type == "cpu" if check_values is None else bool(check_values)


def _require_finite(name: str, tensor: torch.Tensor) -> None:
    if not bool(torch.isfinite(tensor).all()):
        raise ValueError(f"{name} contains NaN or inf")


def _require_like(name: str, tensor: torch.Tensor, like_name: str, like: torch.Tensor) -> None:
    if tensor.shape != like.shape:
        raise ValueError(
            f"{name} has shape {_shape(tensor)} but {like_name} has shape {_shape(like)}"
        )
    if tensor.device != like.device:
        raise ValueError(f"{name} is on {tensor.device} but {like_name} is on {like.device}")


def _require_choice(name: str, value, choices: tuple) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}, got {value!r}")


def _accumulation_dtype(*tensors: torch.Tensor) -> torch.dtype:
    """float32 for half-precision inputs, otherwise the widest input dtype."""
    dtype = torch.float32
    for tensor in tensors:
        dtype = torch.promote_types(dtype, tensor.dtype)
    return dtype


def _checked_log_probs(logprobs, check_values: bool | None, **constants) -> dict:
    """Validate [B, T] log-probabilities and return them in the accumulation dtype, the
    constants detached (None entries are skipped)."""
    _require_floating("logprobs", logprobs)
    if logprobs.dim() != 2:
        raise ValueError(f"logprobs must be [B, T], got shape {_shape(logprobs)}")
    checks = _checks_values(check_values, logprobs)
    if checks:
        _require_finite("logprobs", logprobs)
    given = {name: tensor for name, tensor in constants.items() if tensor is not None}
    for name, tensor in given.items():
        _require_floating(name, tensor)
        _require_like(name, tensor, "logprobs", logprobs)
        if checks:
            _require_finite(name, tensor)
    dtype = _accumulation_dtype(logprobs, *given.values())
    checked = {name: tensor.detach().to(dtype) for name, tensor in given.items()}
    checked["logprobs"] = logprobs.to(dtype)
    return checked


def _checked_mask(mask, logprobs: torch.Tensor, dtype: torch.dtype, check_values: bool | None) -> torch.Tensor:
    """Validate a 0/1 mask shaped like logprobs and return it as `dtype`."""
    if not isinstance(mask, torch.Tensor):
        raise ValueError(f"mask must be a torch.Tensor, got {type(mask).__name__}")
    _require_like("mask", mask, "logprobs", logprobs)
    if _checks_values(check_values, mask) and not bool(((mask == 0) | (mask == 1)).all()):
        raise ValueError("mask must contain only 0 and 1")
    return mask.to(dtype)


# ---------------------------------------------------------------------------------------------
# Per-token values


def token_kl(logprobs, ref_logprobs, estimator: str = "k1", *, check_values: bool | None = None) -> torch.Tensor:
    """Per-token KL estimate [B, T] for logging, with delta = logprobs - ref_logprobs:
    k1 = delta, k2 = delta^2 / 2, k3 = exp(-delta) - 1 + delta (via expm1, accurate near 0).

    k1 and k3 are unbiased for KL_t given the prefix; k2 is biased upwards. Differentiable
    w.r.t. logprobs, but differentiating it is not a KL gradient: use `kl_penalty` for that.
    """
    _require_choice("estimator", estimator, TOKEN_ESTIMATORS)
    tensors = _checked_log_probs(logprobs, check_values, ref_logprobs=ref_logprobs)
    delta = tensors["logprobs"] - tensors["ref_logprobs"]
    if estimator == "k1":
        return delta
    if estimator == "k2":
        return 0.5 * delta.square()
    return torch.expm1(-delta) + delta


def kl_reward(logprobs, ref_logprobs, mask, *, check_values: bool | None = None) -> torch.Tensor:
    """Detached per-token k1 cost d_t = (logprobs - ref_logprobs) * mask, [B, T].

    Subtract beta * d_t from the token rewards. The resulting gradient is unbiased for
    grad KL(pi || ref) only if each token's score is weighted by the reward-to-go sum_{u>=t} d_u
    (GAE with gamma = lambda = 1 and an exact or no critic) or by the whole-sequence return
    sum_u d_u; a same-token-only use, a discount, or a per-sequence 1/L weight biases it.
    """
    tensors = _checked_log_probs(logprobs, check_values, ref_logprobs=ref_logprobs)
    weights = _checked_mask(mask, logprobs, tensors["logprobs"].dtype, check_values)
    return (tensors["logprobs"].detach() - tensors["ref_logprobs"]) * weights


# ---------------------------------------------------------------------------------------------
# Exact per-step KL over the vocabulary: chunked torch code, or the fused kernel


def _row_blocks(logits: torch.Tensor, ref_logits: torch.Tensor) -> list:
    """Pairs of 2-D views [n_i, V] covering the rows of both [..., V] inputs in order, without
    copying: one pair if the leading dims merge, else split along the first dim and recurse."""
    try:
        vocab_size = logits.shape[-1]
        return [(logits.view(-1, vocab_size), ref_logits.view(-1, vocab_size))]
    except RuntimeError:  # e.g. logits[:, :-1] cannot be flattened without a copy
        return [
            pair
            for policy_part, ref_part in zip(logits.unbind(0), ref_logits.unbind(0))
            for pair in _row_blocks(policy_part, ref_part)
        ]


def _row_chunks(logits: torch.Tensor, ref_logits: torch.Tensor, chunk_rows: int):
    """Yield (row offset, policy rows, reference rows) chunks of at most chunk_rows rows."""
    offset = 0
    for policy_block, ref_block in _row_blocks(logits, ref_logits):
        for start in range(0, policy_block.shape[0], chunk_rows):
            policy_rows = policy_block[start : start + chunk_rows]
            yield offset, policy_rows, ref_block[start : start + chunk_rows]
            offset += policy_rows.shape[0]


def _scratch(chunk_rows: int, logits, ref_logits, dtype: torch.dtype) -> dict:
    """Reusable [chunk_rows, V] buffers for the chunk loop (two, plus a copy of each input that
    is narrower than `dtype`): allocating per chunk makes the allocator return and re-fault the
    pages on every chunk, which costs more than the arithmetic."""
    shape = (min(chunk_rows, logits.numel() // logits.shape[-1]), logits.shape[-1])
    names = ["first", "second"]
    names += [name for name, x in (("logits", logits), ("ref_logits", ref_logits)) if x.dtype != dtype]
    return {name: torch.empty(shape, dtype=dtype, device=logits.device) for name in names}


def _chunk_inputs(policy_rows, ref_rows, scratch: dict, dtype: torch.dtype):
    """The chunk's rows in `dtype`: the inputs themselves, or copies in the scratch buffers."""
    count = policy_rows.shape[0]
    chunk = {"logits": policy_rows, "ref_logits": ref_rows}
    return [
        rows if rows.dtype == dtype else scratch[name][:count].copy_(rows)
        for name, rows in chunk.items()
    ]


def _logsumexp_into(rows: torch.Tensor, exps: torch.Tensor, maxima: torch.Tensor, log_sums: torch.Tensor) -> torch.Tensor:
    """log sum_v exp(rows) = maxima + log_sums per row, kept apart: at logits of size 1e4 their float32
    sum would lose 1e-3. Leaves exp(rows - max) in `exps` and returns the row sums."""
    torch.amax(rows, -1, out=maxima)
    torch.sub(rows, maxima.unsqueeze(-1), out=exps).exp_()
    sums = exps.sum(-1)
    torch.log(sums, out=log_sums)
    return sums


def _log_normalised(rows: torch.Tensor, maxima: torch.Tensor, log_sums: torch.Tensor, out=None) -> torch.Tensor:
    """rows - log sum_v exp(rows), from the row maxima and log-sums: (rows - max) - log_sum."""
    return torch.sub(rows, maxima.unsqueeze(-1), out=out).sub_(log_sums.unsqueeze(-1))


def _rows_to_redo(careful: torch.Tensor) -> torch.Tensor:
    """Indices of the rows marked `careful` (bool): every row off the CPU, where finding them would
    wait for the device."""
    if careful.device.type != "cpu":
        return torch.arange(careful.shape[0], device=careful.device)
    return careful.nonzero().squeeze(-1)


def _careful_kl(log_p: torch.Tensor, log_q: torch.Tensor, x: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """sum_v p (log p - log q) per row, with 0 for entries where x = -inf and +inf where only r is.
    The fast formulas make 0 * inf there; these run only on the rows that need them."""
    terms = torch.where(r == -torch.inf, torch.inf, log_p.exp() * (log_p - log_q))
    kl = torch.where(x == -torch.inf, 0.0, terms).sum(-1)
    # NaN, +inf, or -inf everywhere leaves no finite log-probability in the row: no distribution
    normalised = torch.isfinite(log_p).any(-1) & torch.isfinite(log_q).any(-1)
    return torch.where(normalised, kl, torch.nan)


class _ExactTokenKL(torch.autograd.Function):
    """KL_t = sum_v p (log p - log q) per row; d KL_t / d logits = p (log p - log q - KL_t),
    d KL_t / d ref_logits = q - p (computed only when ref_logits requires a gradient).

    Saves the inputs by reference plus per-row statistics (the maxima and log-sums of both rows' exp,
    KL_t, and which rows needed the careful formulas of -inf entries) and recomputes chunk by chunk in
    backward, so no full [rows, V] temporary ever exists.
    """

    @staticmethod
    def forward(ctx, logits, ref_logits, chunk_rows: int, dtype: torch.dtype):
        rows = logits.numel() // logits.shape[-1]
        stats = torch.empty(5, rows, dtype=dtype, device=logits.device)
        x_max, x_log_sum, r_max, r_log_sum, kl = stats
        careful = torch.zeros(rows, dtype=torch.bool, device=logits.device)
        scratch = _scratch(chunk_rows, logits, ref_logits, dtype)
        for offset, policy_rows, ref_rows in _row_chunks(logits, ref_logits, chunk_rows):
            here = slice(offset, offset + policy_rows.shape[0])
            probs, log_ratio = scratch["first"][: policy_rows.shape[0]], scratch["second"][: policy_rows.shape[0]]
            x, r = _chunk_inputs(policy_rows, ref_rows, scratch, dtype)
            sums = _logsumexp_into(x, probs, x_max[here], x_log_sum[here])
            probs /= sums.unsqueeze(-1)
            _logsumexp_into(r, log_ratio, r_max[here], r_log_sum[here])
            torch.sub(x, r, out=log_ratio)
            log_ratio -= ((x_max[here] - r_max[here]) + (x_log_sum[here] - r_log_sum[here])).unsqueeze(-1)
            torch.linalg.vecdot(probs, log_ratio, out=kl[here])
            careful[here] = ~torch.isfinite(kl[here])
            redo = _rows_to_redo(careful[here])
            if redo.numel():
                log_p = _log_normalised(x[redo], x_max[here][redo], x_log_sum[here][redo])
                log_q = _log_normalised(r[redo], r_max[here][redo], r_log_sum[here][redo])
                kl[here][redo] = _careful_kl(log_p, log_q, x[redo], r[redo])
        ctx.chunk_rows = chunk_rows
        ctx.save_for_backward(logits, ref_logits, stats, careful)
        return kl.view(logits.shape[:-1])

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_kl):
        logits, ref_logits, stats, careful = ctx.saved_tensors
        x_max, x_log_sum, r_max, r_log_sum, kl = stats
        want_logits, want_ref = ctx.needs_input_grad[:2]
        dtype = kl.dtype
        shift = (x_max - r_max) + (x_log_sum - r_log_sum) + kl  # log p - log q - KL_t = x - r - shift
        # no gradient exists where KL_t = +inf: NaN there
        grad_kl = torch.where(torch.isinf(kl), torch.nan, grad_kl.reshape(-1).to(dtype))
        grads = [torch.empty(x.shape, dtype=x.dtype, device=x.device) if wanted else None
                 for x, wanted in ((logits, want_logits), (ref_logits, want_ref))]
        grad_rows = [None if grad is None else grad.view(-1, logits.shape[-1]) for grad in grads]
        scratch = _scratch(ctx.chunk_rows, logits, ref_logits, dtype)
        for offset, policy_rows, ref_rows in _row_chunks(logits, ref_logits, ctx.chunk_rows):
            here = slice(offset, offset + policy_rows.shape[0])
            x, r = _chunk_inputs(policy_rows, ref_rows, scratch, dtype)
            scaled_probs = scratch["first"][: policy_rows.shape[0]]
            _log_normalised(x, x_max[here], x_log_sum[here], out=scaled_probs).exp_()
            scaled_probs *= grad_kl[here].unsqueeze(-1)  # grad_kl * p
            if want_ref:  # grad_kl * (q - p), copied out before the logits' gradient reuses the buffer
                out = scratch["second"][: policy_rows.shape[0]]
                _log_normalised(r, r_max[here], r_log_sum[here], out=out).exp_()
                out *= grad_kl[here].unsqueeze(-1)
                out -= scaled_probs
                grad_rows[1][here].copy_(out)
            if want_logits:
                in_place = grads[0].dtype == dtype
                out = grad_rows[0][here] if in_place else scratch["second"][: policy_rows.shape[0]]
                torch.sub(x, r, out=out)
                out -= shift[here].unsqueeze(-1)
                out *= scaled_probs
                redo = _rows_to_redo(careful[here])
                if redo.numel():  # entries with x = -inf: p = 0 times an infinite log-ratio
                    out[redo] = torch.where(x[redo] == -torch.inf, 0.0, out[redo])
                if not in_place:
                    grad_rows[0][here].copy_(out)
        return grads[0], grads[1], None, None


def _uses_kernel(logits: torch.Tensor, ref_logits: torch.Tensor, backend: str) -> bool:
    """Whether exact_token_kl runs the fused Triton kernel: "auto" on CUDA tensors it takes, when
    Triton imports; "triton" always (ValueError when it cannot: CPU tensors need Triton's interpreter)."""
    _require_choice("backend", backend, BACKENDS)
    if backend == "torch" or (backend == "auto" and logits.device.type != "cuda"):
        return False
    from klaudit.kernels import triton_available

    if not triton_available():
        if backend == "auto":
            return False
        raise ValueError("backend 'triton' needs Triton: pip install 'klaudit[triton]'")
    from klaudit.kernels import token_kl

    if backend == "auto":
        return token_kl.supports(logits, ref_logits)
    if not token_kl.supports(logits, ref_logits):
        raise ValueError(f"backend 'triton' takes float32, bfloat16 or float16 logits whose vocabulary axis is "
                         f"contiguous, got {logits.dtype} and {ref_logits.dtype}")
    if logits.device.type == "cpu" and not token_kl.interpreting():
        raise ValueError("backend 'triton' on CPU tensors runs in Triton's interpreter: set TRITON_INTERPRET=1 "
                         "before triton is imported")
    return True


def exact_token_kl(logits, ref_logits, *, chunk_size: int | None = None, backend: str = "auto",
                   check_values: bool | None = None) -> torch.Tensor:
    """Exact per-step KL_t(h_t) = sum_v pi(v|h_t) log(pi(v|h_t) / ref(v|h_t)), shape [B, T].

    logits, ref_logits: [B, T, V] (any leading shape works) unnormalised scores of the policy and
    the reference. Differentiable w.r.t. `logits`, with gradient p (log p - log q - KL_t) per row,
    and w.r.t. `ref_logits` when it requires a gradient (distillation), with gradient q - p.
    Accumulates in float32 or wider; float32 for float16/bfloat16 inputs. Keeps only O(B*T) extra
    state between forward and backward (once differentiable).

    -inf masks vocabulary entries (top-k, top-p): an entry the policy rules out adds nothing, one
    only the reference rules out makes KL_t = +inf (and that row's gradient NaN: there is none).
    NaN or +inf in an input, or a row that is -inf everywhere, gives NaN; with `check_values` (by
    default on CPU tensors, where it is free) it raises ValueError instead, detected from the result.

    backend: "auto" runs the fused Triton kernel (klaudit.kernels.token_kl: one pass over each row
    forward, one backward) on CUDA tensors of float32/bfloat16/float16 when Triton is installed, and
    the chunked torch code otherwise; "torch" and "triton" force one ("triton" on CPU tensors needs
    Triton's interpreter). The torch code works on chunks of `chunk_size` rows of the flattened B*T
    axis (None: about DEFAULT_CHUNK_BYTES per scratch buffer), in forward and backward.
    """
    _require_floating("logits", logits)
    _require_floating("ref_logits", ref_logits)
    if logits.dim() < 1 or logits.shape[-1] == 0:
        raise ValueError(f"logits must be [B, T, V] with V > 0, got shape {_shape(logits)}")
    _require_like("ref_logits", ref_logits, "logits", logits)
    dtype = _accumulation_dtype(logits, ref_logits)
    vocab_size = logits.shape[-1]
    if chunk_size is None:
        chunk_size = max(1, DEFAULT_CHUNK_BYTES // (vocab_size * dtype.itemsize))
    elif isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int or None, got {chunk_size!r}")
    if _uses_kernel(logits, ref_logits, backend):
        from klaudit.kernels.token_kl import FusedTokenKL

        kl = FusedTokenKL.apply(logits, ref_logits)
    else:
        kl = _ExactTokenKL.apply(logits, ref_logits, chunk_size, dtype)
    if _checks_values(check_values, logits) and bool(torch.isnan(kl).any()):
        raise ValueError("logits or ref_logits contain NaN or +inf, or a row that is -inf everywhere (-inf may "
                         "mask vocabulary entries, not a whole row)")
    return kl


# ---------------------------------------------------------------------------------------------
# The unbiased per-sequence penalty


def _reward_to_go(per_token: torch.Tensor) -> torch.Tensor:
    """rtg(x)_t = sum_{u >= t} x_u along the last axis."""
    return per_token.flip(-1).cumsum(-1).flip(-1)


def kl_penalty(
    logprobs,
    ref_logprobs,
    mask,
    *,
    estimator: str = "k1",
    logits=None,
    ref_logits=None,
    old_logprobs=None,
    baseline=None,
    check_values: bool | None = None,
) -> KLTerm:
    """Per-sequence KL term whose `loss` gradient is unbiased for grad KL(pi || ref) [B].

    Master identity (kl-math §3.1): for per-token k_t with E_pi[sum_t k_t] = KL_seq,
        grad KL_seq = E[sum_t grad k_t] + E[sum_t s_t sum_{u>=t} k_u],   s_t = grad log pi(y_t|h_t),
    so a loss term plus a detached reward-to-go term on log pi is exact (m = mask):
      "k1" (R-A): k_t = d_t = (logp - ref)_t m_t; E[grad k_t] = E[s_t] = 0, so
                   loss = sum_t logp_t sg(sum_{u>=t} d_u).
      "k3" (R-C): k_t = exp(-delta_t) - 1 + delta_t;  loss = sum_t k_t + logp_t sg(sum_{u>=t} k_u).
      "rb" (R-D): k_t = KL_t(h_t) exact over the vocabulary (needs logits, ref_logits); its score
                   term at u = t vanishes given h_t, so loss = sum_t KL_t + logp_t sg(sum_{u>t} KL_u).
    Off-policy (`old_logprobs` given, samples from pi_old, R-F): E_pi[f(y_<=t)] =
    E_old[w_{1:t} f] with w_{1:t} = prod_{i<=t} pi_i / old_i (detached). A term that depends on
    y_<=u takes w_{1:u}, one that depends on the prefix h_u only takes w_{<u}:
      k1: logp_t sg(sum_{u>=t} w_{1:u} d_u);  k3: sg(w_{1:t}) k_t + logp_t sg(sum_{u>=t} w_{1:u} k_u);
      rb: sg(w_{<t}) KL_t + logp_t sg(sum_{u>t} w_{<u} KL_u).
    `value` = sum_t (weight * k_t), unbiased for KL_seq; `loss` has the same forward value, so
    logging the total loss stays meaningful. Each loss[i] depends on sequence i alone.
    (For rb, w_{1:u} would be unbiased too, as E_old[pi_u / old_u | h_u] = 1; w_{<u} is its
    conditional expectation given h_u, so it drops that ratio's noise.) The products of ratios
    are not clipped: clipping would bias the result again (§7).
    `baseline` (opt-in, [B, T], detached): b_t subtracted from token t's return to reduce
    variance. It must be a function of the prefix h_t only (not of y_t or later tokens), e.g. a
    critic's V(h_t); for "rb" the matching one is E[sum_{u>t} KL_u | h_t]. Unbiased because
    E_pi[s_t | h_t] = 0; off-policy it is multiplied by w_{1:t}, as E_old[w_{1:t} s_t | h_t] = 0.
    No baseline is shared across sequences by default, which would couple them.
    On a GPU nothing here waits for the device (no .item(), no branch on a value; values are checked
    only with check_values=True, see the module docstring), and "rb" runs the fused kernel.
    """
    _require_choice("estimator", estimator, PENALTY_ESTIMATORS)
    tensors = _checked_log_probs(
        logprobs, check_values, ref_logprobs=ref_logprobs, old_logprobs=old_logprobs, baseline=baseline
    )
    policy_logprobs = tensors["logprobs"]
    weights_of_mask = _checked_mask(mask, logprobs, policy_logprobs.dtype, check_values)
    log_ratio = (policy_logprobs - tensors["ref_logprobs"]) * weights_of_mask

    if estimator == "rb":
        if logits is None or ref_logits is None:
            raise ValueError('estimator "rb" needs logits and ref_logits ([B, T, V])')
        _require_floating("logits", logits)
        if logits.dim() != 3 or logits.shape[:2] != logprobs.shape:
            raise ValueError(
                f"logits has shape {_shape(logits)} but logprobs has shape {_shape(logprobs)}; "
                "expected [B, T, V]"
            )
        if logits.device != logprobs.device:
            raise ValueError(f"logits is on {logits.device} but logprobs is on {logprobs.device}")
        if not isinstance(ref_logits, torch.Tensor):
            raise ValueError(f"ref_logits must be a torch.Tensor, got {type(ref_logits).__name__}")
        exact = exact_token_kl(logits, ref_logits.detach(), check_values=check_values).to(policy_logprobs.dtype)
        local = exact * weights_of_mask  # differentiable KL_t, depends on the prefix only
        depends_on_token = False
    elif estimator == "k3":
        local = (torch.expm1(-log_ratio) + log_ratio) * weights_of_mask
        depends_on_token = True
    else:
        local = None  # grad of k1 is the score, zero in expectation
        depends_on_token = True
    estimate = (local if local is not None else log_ratio).detach()

    if old_logprobs is None:
        through_token = before_token = torch.ones_like(estimate)
    else:
        log_ratio_old = (policy_logprobs.detach() - tensors["old_logprobs"]) * weights_of_mask
        log_through_token = log_ratio_old.cumsum(-1)
        through_token = log_through_token.exp()  # w_{1:t}
        before_token = (log_through_token - log_ratio_old).exp()  # w_{<t}
    weight = through_token if depends_on_token else before_token

    weighted = weight * estimate
    returns = _reward_to_go(weighted)
    if not depends_on_token:
        returns = returns - weighted  # future only: sum over u > t
    if baseline is not None:
        returns = returns - through_token * tensors["baseline"]
    surrogate = (policy_logprobs * weights_of_mask * returns).sum(-1)
    if local is not None:
        surrogate = surrogate + (weight * local).sum(-1)
    value = weighted.sum(-1)
    return KLTerm(value=value, loss=surrogate - surrogate.detach() + value)
