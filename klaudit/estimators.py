"""Correct KL-regularisation terms for RL fine-tuning of language models (docs/kl-math.md §8).

The target is the gradient of the sequence-level reverse KL, KL(pi || ref) = E_pi[sum_t delta_t]
with delta_t = log pi(y_t | h_t) - log ref(y_t | h_t). `kl_penalty` returns a per-sequence
surrogate whose gradient is an unbiased estimate of it (replacements R-A, R-C, R-D and R-F);
`kl_reward` is the detached k1 cost for trainers that put the KL into the reward; `token_kl` and
`exact_token_kl` are per-token values, the latter exact over the vocabulary and memory-bounded.

Conventions shared by every function:
* Per-token tensors are [B, T] (B sequences, T positions); `mask` is 1 on response tokens and 0
  elsewhere (bool, integer or floating; holes are allowed, right padding is not required).
  Scores and KL terms of masked positions never enter a result.
* Reference and behaviour log-probabilities are constants: they are detached.
* Results are float32 for float16/bfloat16 inputs and keep the dtype of float32/float64 inputs.
* Wrong shapes, non-floating dtypes, mask values other than 0/1, mixed devices and NaN or inf
  anywhere in an input (padding included: fill it with 0) raise ValueError naming the argument.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

TOKEN_ESTIMATORS = ("k1", "k2", "k3")
PENALTY_ESTIMATORS = ("k1", "k3", "rb")

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


def _checked_log_probs(logprobs, **constants) -> dict:
    """Validate [B, T] log-probabilities and return them in the accumulation dtype, the
    constants detached (None entries are skipped)."""
    _require_floating("logprobs", logprobs)
    if logprobs.dim() != 2:
        raise ValueError(f"logprobs must be [B, T], got shape {_shape(logprobs)}")
    _require_finite("logprobs", logprobs)
    given = {name: tensor for name, tensor in constants.items() if tensor is not None}
    for name, tensor in given.items():
        _require_floating(name, tensor)
        _require_like(name, tensor, "logprobs", logprobs)
        _require_finite(name, tensor)
    dtype = _accumulation_dtype(logprobs, *given.values())
    checked = {name: tensor.detach().to(dtype) for name, tensor in given.items()}
    checked["logprobs"] = logprobs.to(dtype)
    return checked


def _checked_mask(mask, logprobs: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Validate a 0/1 mask shaped like logprobs and return it as `dtype`."""
    if not isinstance(mask, torch.Tensor):
        raise ValueError(f"mask must be a torch.Tensor, got {type(mask).__name__}")
    _require_like("mask", mask, "logprobs", logprobs)
    if not bool(((mask == 0) | (mask == 1)).all()):
        raise ValueError("mask must contain only 0 and 1")
    return mask.to(dtype)


# ---------------------------------------------------------------------------------------------
# Per-token values


def token_kl(logprobs, ref_logprobs, estimator: str = "k1") -> torch.Tensor:
    """Per-token KL estimate [B, T] for logging, with delta = logprobs - ref_logprobs:
    k1 = delta, k2 = delta^2 / 2, k3 = exp(-delta) - 1 + delta (via expm1, accurate near 0).

    k1 and k3 are unbiased for KL_t given the prefix; k2 is biased upwards. Differentiable
    w.r.t. logprobs, but differentiating it is not a KL gradient: use `kl_penalty` for that.
    """
    _require_choice("estimator", estimator, TOKEN_ESTIMATORS)
    tensors = _checked_log_probs(logprobs, ref_logprobs=ref_logprobs)
    delta = tensors["logprobs"] - tensors["ref_logprobs"]
    if estimator == "k1":
        return delta
    if estimator == "k2":
        return 0.5 * delta.square()
    return torch.expm1(-delta) + delta


def kl_reward(logprobs, ref_logprobs, mask) -> torch.Tensor:
    """Detached per-token k1 cost d_t = (logprobs - ref_logprobs) * mask, [B, T].

    Subtract beta * d_t from the token rewards. The resulting gradient is unbiased for
    grad KL(pi || ref) only if each token's score is weighted by the reward-to-go sum_{u>=t} d_u
    (GAE with gamma = lambda = 1 and an exact or no critic) or by the whole-sequence return
    sum_u d_u; a same-token-only use, a discount, or a per-sequence 1/L weight biases it.
    """
    tensors = _checked_log_probs(logprobs, ref_logprobs=ref_logprobs)
    weights = _checked_mask(mask, logprobs, tensors["logprobs"].dtype)
    return (tensors["logprobs"].detach() - tensors["ref_logprobs"]) * weights


# ---------------------------------------------------------------------------------------------
# Exact per-step KL over the vocabulary, chunked


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


def _logsumexp_into(rows: torch.Tensor, exps: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """lse = log sum_v exp(rows) per row; leaves exp(rows - max) in `exps`, returns the row sums."""
    maxima = rows.amax(-1, keepdim=True)
    torch.sub(rows, maxima, out=exps).exp_()
    sums = exps.sum(-1)
    torch.add(maxima.squeeze(-1), sums.log(), out=lse)
    return sums


class _ExactTokenKL(torch.autograd.Function):
    """KL_t = sum_v p (log p - log q) per row; d KL_t / d logits = p (log p - log q - KL_t).

    Saves the inputs by reference plus two per-row statistics, the policy's log-normaliser lse_p
    and shift = lse_p - lse_q + KL_t (so log p - log q - KL_t = x - r - shift), and recomputes
    chunk by chunk in backward, so no full [rows, V] temporary ever exists.
    """

    @staticmethod
    def forward(ctx, logits, ref_logits, chunk_rows: int, dtype: torch.dtype):
        rows = logits.numel() // logits.shape[-1]
        stats = torch.empty(3, rows, dtype=dtype, device=logits.device)
        policy_lse, ref_lse, kl = stats
        scratch = _scratch(chunk_rows, logits, ref_logits, dtype)
        for offset, policy_rows, ref_rows in _row_chunks(logits, ref_logits, chunk_rows):
            end = offset + policy_rows.shape[0]
            probs, log_ratio = scratch["first"][: end - offset], scratch["second"][: end - offset]
            x, r = _chunk_inputs(policy_rows, ref_rows, scratch, dtype)
            sums = _logsumexp_into(x, probs, policy_lse[offset:end])
            probs /= sums.unsqueeze(-1)
            _logsumexp_into(r, log_ratio, ref_lse[offset:end])
            torch.sub(x, r, out=log_ratio)
            log_ratio -= (policy_lse[offset:end] - ref_lse[offset:end]).unsqueeze(-1)
            torch.linalg.vecdot(probs, log_ratio, out=kl[offset:end])
        if not bool(torch.isfinite(stats).all()):
            raise ValueError(
                "logits or ref_logits contain NaN or inf (masking vocabulary entries with -inf "
                "is not supported: use a large negative finite value)"
            )
        ctx.chunk_rows = chunk_rows
        ctx.save_for_backward(logits, ref_logits, policy_lse, policy_lse - ref_lse + kl)
        return kl.view(logits.shape[:-1])

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_kl):
        logits, ref_logits, policy_lse, shift = ctx.saved_tensors
        dtype = shift.dtype
        grad_kl = grad_kl.reshape(-1).to(dtype)
        grad = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
        grad_rows = grad.view(-1, logits.shape[-1])
        scratch = _scratch(ctx.chunk_rows, logits, ref_logits, dtype)
        in_place = grad.dtype == dtype
        for offset, policy_rows, ref_rows in _row_chunks(logits, ref_logits, ctx.chunk_rows):
            end = offset + policy_rows.shape[0]
            x, r = _chunk_inputs(policy_rows, ref_rows, scratch, dtype)
            out = grad_rows[offset:end] if in_place else scratch["second"][: end - offset]
            torch.sub(x, r, out=out)
            out -= shift[offset:end].unsqueeze(-1)
            probs = scratch["first"][: end - offset]
            torch.sub(x, policy_lse[offset:end].unsqueeze(-1), out=probs).exp_()
            probs *= grad_kl[offset:end].unsqueeze(-1)
            out *= probs
            if not in_place:
                grad_rows[offset:end].copy_(out)
        return grad, None, None, None


def exact_token_kl(logits, ref_logits, *, chunk_size: int | None = None) -> torch.Tensor:
    """Exact per-step KL_t(h_t) = sum_v pi(v|h_t) log(pi(v|h_t) / ref(v|h_t)), shape [B, T].

    logits, ref_logits: [B, T, V] (any leading shape works) unnormalised scores of the policy and
    the reference. Differentiable w.r.t. `logits` only, with gradient p (log p - log q - KL_t)
    per row. Accumulates in float32 or wider. Works on chunks of `chunk_size` rows of the
    flattened B*T axis (None: about DEFAULT_CHUNK_BYTES per scratch buffer), in forward and backward,
    keeping only O(B*T) extra state between them (once differentiable). NaN or inf in either
    input, -inf used to mask vocabulary entries included, raises ValueError (detected from the
    per-row statistics, so the check costs no extra pass over [B, T, V]).
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
    return _ExactTokenKL.apply(logits, ref_logits.detach(), chunk_size, dtype)


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
    """
    _require_choice("estimator", estimator, PENALTY_ESTIMATORS)
    tensors = _checked_log_probs(
        logprobs, ref_logprobs=ref_logprobs, old_logprobs=old_logprobs, baseline=baseline
    )
    policy_logprobs = tensors["logprobs"]
    weights_of_mask = _checked_mask(mask, logprobs, policy_logprobs.dtype)
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
        exact = exact_token_kl(logits, ref_logits).to(policy_logprobs.dtype)
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
