"""Exact expected gradients by enumerating every response (docs/kl-math.md App. A).

For a policy small enough to enumerate (see klaudit.audit.policies), the expected gradient of
any KL implementation is a finite sum: a loss callable maps a `Batch` of all N responses to a
per-sequence surrogate S(y; theta), and

    E[grad] = grad_theta sum_y sg(P(y)) h(L_y) S(y; theta),

with P = pi (on-policy) or pi_old (off-policy) and h the aggregation weight (section 5).

Public API:
    enumerate_sequences(vocab_size, horizon, eos_id) -> (tokens [N, T], mask [N, T], lengths [N])
    ExactProblem(policy, reference, old_policy=None)   (on the device of the policy's parameters)
        .to(device)                    the same problem with copies of its policies on another device
        .batch()                       fresh Batch of all N responses (new autograd graph)
        .expected_gradient(loss_fn, *, aggregation=Aggregation.SUM, batch_size=None,
                           off_policy=False)   -> flat float64 gradient over policy.parameters()
        .expected_value(value_fn, *, off_policy=False) -> sum_y P(y) value(y)
        .targets()                     {Target: flat gradient}: REV FWD PART PFWD FUT LEN PTV PCHI
        .kl_seq(), .forward_kl(), .expected_length()
        .match(g, *, proportional=False) -> Objective (a Target's name, ZERO or OTHER)
    match_objective(g, targets, *, rtol, zero_rtol, proportional) -> the same, for given targets
        .length_weights(probs, aggregation, batch_size) -> [N] h(L_y) (kl-math.md section 5)
    relerr(g, x), cosine(g, x), positive_multiple(g, x)
    sequence_kl(policy, reference) -> KL(pi || ref) as a float

The reference and the old policy are read once, at construction; the policy is read afresh on
every call, so an ExactProblem follows the policy's parameters as they are trained.
"""

from __future__ import annotations

import copy
import functools
import itertools
import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import torch

from klaudit.audit.batch import Batch
from klaudit.catalog import Aggregation, Objective, Target

if TYPE_CHECKING:  # policies uses the exact engine to place a policy at a given KL
    from klaudit.audit.policies import Policy

LossFn = Callable[[Batch], torch.Tensor]

# match(): g is a target when relerr < MATCH_RTOL, and zero when ||g|| < ZERO_RTOL * ||REV||.
MATCH_RTOL = 1e-6
ZERO_RTOL = 1e-9
# The order in which match_objective() tries the targets (PTV and PCHI are no Objective: only 2 PTV and PCHI / 2 occur).
MATCH_ORDER = (Target.REV, Target.FWD, Target.PART, Target.PFWD, Target.FUT, Target.LEN)


def enumerate_sequences(
    vocab_size: int, horizon: int, eos_id: int | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every response of a policy shape: tokens [N, T] (EOS-padded after EOS), mask [N, T], lengths [N].

    A response stops at its first EOS (included in its length) or at T tokens. Rows are ordered by
    length (at length T, EOS-terminated first), then lexicographically. Computed once per shape;
    callers get copies.
    """
    tokens, mask, lengths = _enumerated(vocab_size, horizon, eos_id)
    return tokens.clone(), mask.clone(), lengths.clone()


@functools.lru_cache(maxsize=32)
def _enumerated(vocab_size: int, horizon: int, eos_id: int | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The uncached body of enumerate_sequences."""
    if eos_id is not None and not 0 <= eos_id < vocab_size:
        raise ValueError(f"eos_id {eos_id} is not a token of a vocabulary of size {vocab_size}")
    plain = [v for v in range(vocab_size) if v != eos_id]
    rows: list[list[int]] = []
    if eos_id is not None:
        for length in range(1, horizon + 1):
            for body in itertools.product(plain, repeat=length - 1):
                rows.append(list(body) + [eos_id] * (horizon - length + 1))
    rows.extend(list(body) for body in itertools.product(plain, repeat=horizon))
    tokens = torch.tensor(rows, dtype=torch.long)
    if eos_id is None:
        lengths = torch.full((len(rows),), horizon, dtype=torch.long)
    else:
        is_eos = tokens == eos_id
        lengths = torch.where(is_eos.any(-1), is_eos.long().argmax(-1) + 1, torch.tensor(horizon))
    mask = (torch.arange(horizon) < lengths.unsqueeze(-1)).to(torch.float64)
    return tokens, mask, lengths


def relerr(g: torch.Tensor, x: torch.Tensor) -> float:
    """||g - x|| / ||x||; 0 when both are zero, inf when only x is."""
    scale = torch.linalg.vector_norm(x).item()
    gap = torch.linalg.vector_norm(g - x).item()
    if scale == 0.0:
        return 0.0 if gap == 0.0 else math.inf
    return gap / scale


def cosine(g: torch.Tensor, x: torch.Tensor) -> float:
    """<g, x> / (||g|| ||x||); NaN (undefined, the design tables' '-') when either is zero."""
    norms = torch.linalg.vector_norm(g).item() * torch.linalg.vector_norm(x).item()
    if norms == 0.0:
        return math.nan
    return (torch.dot(g.flatten(), x.flatten()).item()) / norms


def positive_multiple(g: torch.Tensor, x: torch.Tensor, rtol: float = MATCH_RTOL) -> float | None:
    """c > 0 with g = c x up to relerr rtol (c = <g, x> / <x, x>), else None."""
    squared = torch.dot(x.flatten(), x.flatten()).item()
    if squared == 0.0:
        return None
    factor = torch.dot(g.flatten(), x.flatten()).item() / squared
    if factor <= 0.0 or relerr(g, factor * x) >= rtol:
        return None
    return factor


def match_objective(
    g: torch.Tensor,
    targets: Mapping[Target, torch.Tensor],
    *,
    rtol: float = MATCH_RTOL,
    zero_rtol: float = ZERO_RTOL,
    proportional: bool = False,
) -> Objective:
    """Which single target g equals (relerr < rtol), ZERO (||g|| <= zero_rtol ||REV||), or OTHER.

    Targets are tried in the order REV, FWD, PART, PFWD, FUT, LEN; with proportional=True a positive
    multiple of a target counts. Callers whose arithmetic is partly float32 widen both tolerances.
    """
    if torch.linalg.vector_norm(g).item() <= zero_rtol * torch.linalg.vector_norm(targets[Target.REV]).item():
        return Objective.ZERO
    for target in MATCH_ORDER:
        expected = targets[target]
        if relerr(g, expected) < rtol or (proportional and positive_multiple(g, expected, rtol) is not None):
            return Objective(target.value)
    return Objective.OTHER


def sequence_kl(policy: Policy, reference: Policy) -> float:
    """KL(pi || ref) = sum_y pi(y) log(pi(y) / ref(y)) over every response, as a float."""
    return ExactProblem(policy, reference).kl_seq()


def _per_sequence(values: torch.Tensor, num_sequences: int, horizon: int, what: str) -> torch.Tensor:
    """A callable's [N] or [N, T] result as [N] (token-sum), or ValueError saying what is wrong."""
    if not isinstance(values, torch.Tensor):
        raise ValueError(f"{what} must return a torch.Tensor, got {type(values).__name__}")
    if tuple(values.shape) not in ((num_sequences,), (num_sequences, horizon)):
        raise ValueError(
            f"{what} must return one value per sequence [{num_sequences}] or per token "
            f"[{num_sequences}, {horizon}], got shape {list(values.shape)}"
        )
    if not values.is_floating_point():
        raise ValueError(f"{what} must return floating-point values, got {values.dtype}")
    bad = ~torch.isfinite(values.detach())
    if bad.any():
        first = bad.nonzero()[0].tolist()
        raise ValueError(f"{what} returned {int(bad.sum())} NaN/inf entries (the first at index {first})")
    return values if values.dim() == 1 else values.sum(-1)


def _sum_of_lengths_distribution(length_probs: torch.Tensor, count: int) -> torch.Tensor:
    """P(S = s) for s = 0..count*T, S the summed length of `count` i.i.d. responses (length_probs[l] = P(L = l))."""
    horizon = length_probs.shape[0] - 1
    distribution = torch.zeros(count * horizon + 1, dtype=length_probs.dtype, device=length_probs.device)
    distribution[0] = 1.0
    for _ in range(count):
        convolved = torch.zeros_like(distribution)
        for length in range(1, horizon + 1):
            convolved[length:] += length_probs[length] * distribution[: distribution.shape[0] - length]
        distribution = convolved
    return distribution


class ExactProblem:
    """All responses of `policy`, with the reference (and optional behaviour policy) fixed."""

    def __init__(self, policy: Policy, reference: Policy, old_policy: Policy | None = None):
        for name, other in (("reference", reference), ("old_policy", old_policy)):
            if other is None:
                continue
            shape = (policy.vocab_size, policy.horizon, policy.eos_id)
            other_shape = (other.vocab_size, other.horizon, other.eos_id)
            if shape != other_shape:
                raise ValueError(
                    f"{name} has (vocab_size, horizon, eos_id) = {other_shape}, the policy {shape}"
                )
        self.policy = policy
        self.reference = reference
        self.old_policy = old_policy
        self.device = next(iter(policy.parameters())).device
        tokens, mask, lengths = enumerate_sequences(policy.vocab_size, policy.horizon, policy.eos_id)
        self.tokens = tokens.to(self.device)
        self.mask = mask.to(self.device)
        self.lengths = lengths.to(self.device)
        self.num_sequences, self.horizon = self.tokens.shape
        self._parameters = list(policy.parameters())
        with torch.no_grad():
            self.ref_logits = reference.logits(self.tokens).to(torch.float64)
            self.ref_logprobs = self._token_logprobs(self.ref_logits)
            self.ref_seq_logprob = (self.ref_logprobs * self.mask).sum(-1)
            self.old_logprobs = None
            if old_policy is not None:
                self.old_logprobs = self._token_logprobs(old_policy.logits(self.tokens).to(torch.float64))
                self.old_seq_logprob = (self.old_logprobs * self.mask).sum(-1)

    def to(self, device: str | torch.device) -> ExactProblem:
        """The same problem with copies of its policies on `device`."""
        def moved(policy: Policy) -> Policy:
            return copy.deepcopy(policy).to(device)

        policy, reference = moved(self.policy), moved(self.reference)
        return ExactProblem(policy, reference, None if self.old_policy is None else moved(self.old_policy))

    # ----- building blocks -----

    def _token_logprobs(self, logits: torch.Tensor) -> torch.Tensor:
        """[N, T] log-probability of each enumerated token under the given logits."""
        return torch.log_softmax(logits, dim=-1).gather(-1, self.tokens.unsqueeze(-1)).squeeze(-1)

    def batch(self) -> Batch:
        """All N responses as a Batch, from the policy's current parameters (fresh autograd graph)."""
        logits = self.policy.logits(self.tokens)
        return Batch(
            logprobs=self._token_logprobs(logits),
            ref_logprobs=self.ref_logprobs.clone(),
            mask=self.mask.clone(),
            logits=logits,
            ref_logits=self.ref_logits.clone(),
            old_logprobs=None if self.old_logprobs is None else self.old_logprobs.clone(),
            tokens=self.tokens.clone(),
        )

    def _sampling_logprob(self, batch: Batch, off_policy: bool) -> torch.Tensor:
        """[N] detached log P(y): pi (on-policy) or pi_old (off-policy)."""
        if off_policy:
            if self.old_logprobs is None:
                raise ValueError("off_policy=True needs an ExactProblem built with old_policy")
            return self.old_seq_logprob
        return (batch.logprobs.detach() * self.mask).sum(-1)

    def _flat_gradient(self, objective: torch.Tensor, retain_graph: bool = False) -> torch.Tensor:
        """grad of a scalar w.r.t. all policy parameters, flattened (zeros where it does not depend)."""
        if not objective.requires_grad:
            return torch.cat([torch.zeros_like(p, dtype=torch.float64).flatten() for p in self._parameters])
        grads = torch.autograd.grad(objective, self._parameters, allow_unused=True, retain_graph=retain_graph)
        return torch.cat([
            (torch.zeros_like(p) if grad is None else grad).to(torch.float64).flatten()
            for p, grad in zip(self._parameters, grads)
        ])

    def length_weights(
        self, probs: torch.Tensor, aggregation: Aggregation, batch_size: int | None = None
    ) -> torch.Tensor:
        """[N] h(L_y) for sampling probabilities `probs` [N] (kl-math.md section 5)."""
        lengths = self.lengths.to(torch.float64)
        if aggregation is not Aggregation.BATCH_MEAN and batch_size is not None:
            raise ValueError(f"batch_size only applies to Aggregation.BATCH_MEAN, not {aggregation}")
        if aggregation is Aggregation.SUM:
            return torch.ones_like(lengths)
        if aggregation is Aggregation.CONSTANT:
            return torch.full_like(lengths, 1.0 / self.horizon)
        if aggregation is Aggregation.SEQ_MEAN:
            return 1.0 / lengths
        if aggregation is Aggregation.BATCH_MEAN:
            if batch_size is None:
                return torch.full_like(lengths, 1.0 / (probs * lengths).sum().item())
            if not isinstance(batch_size, int) or batch_size < 1:
                raise ValueError(f"batch_size must be a positive integer or None, got {batch_size!r}")
            length_probs = torch.zeros(self.horizon + 1, dtype=torch.float64, device=self.device)
            length_probs.index_add_(0, self.lengths, probs)
            others = _sum_of_lengths_distribution(length_probs, batch_size - 1)
            totals = torch.arange(others.shape[0], dtype=torch.float64, device=self.device)
            return batch_size * (others / (lengths.unsqueeze(-1) + totals)).sum(-1)
        raise ValueError(f"unknown aggregation {aggregation!r}")

    # ----- expectations -----

    def expected_gradient(
        self,
        loss_fn: LossFn,
        *,
        aggregation: Aggregation = Aggregation.SUM,
        batch_size: int | None = None,
        off_policy: bool = False,
    ) -> torch.Tensor:
        """grad_theta sum_y sg(P(y)) h(L_y) S(y; theta), S = loss_fn(batch) ([N], or [N, T] summed over t)."""
        batch = self.batch()
        surrogate = _per_sequence(loss_fn(batch), self.num_sequences, self.horizon, "loss_fn")
        probs = self._sampling_logprob(batch, off_policy).exp()
        weights = probs * self.length_weights(probs, aggregation, batch_size)
        return self._flat_gradient((weights * surrogate).sum())

    def expected_value(self, value_fn: LossFn, *, off_policy: bool = False) -> float:
        """sum_y P(y) value(y) for value_fn(batch) per sequence [N] or per token [N, T] (summed over t)."""
        with torch.no_grad():
            batch = self.batch()
            values = _per_sequence(value_fn(batch), self.num_sequences, self.horizon, "value_fn")
            probs = self._sampling_logprob(batch, off_policy).exp()
            return (probs * values).sum().item()

    # ----- reference quantities of the current policy -----

    def _sequence_logprobs(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(log pi(y) [N] differentiable, logits [N, T, V]) from the current parameters."""
        logits = self.policy.logits(self.tokens)
        return (self._token_logprobs(logits) * self.mask).sum(-1), logits

    def kl_seq(self) -> float:
        """KL(pi || ref) = sum_y pi(y) log(pi(y) / ref(y))."""
        with torch.no_grad():
            seq_logprob, _ = self._sequence_logprobs()
            return (seq_logprob.exp() * (seq_logprob - self.ref_seq_logprob)).sum().item()

    def forward_kl(self) -> float:
        """KL(ref || pi) = sum_y ref(y) log(ref(y) / pi(y))."""
        with torch.no_grad():
            seq_logprob, _ = self._sequence_logprobs()
            return (self.ref_seq_logprob.exp() * (self.ref_seq_logprob - seq_logprob)).sum().item()

    def expected_length(self) -> float:
        """E_pi[L]."""
        with torch.no_grad():
            seq_logprob, _ = self._sequence_logprobs()
            return (seq_logprob.exp() * self.lengths.to(torch.float64)).sum().item()

    def targets(self) -> dict[Target, torch.Tensor]:
        """The reference gradients of kl-math.md section 1, each by autograd through an enumerated sum.

        REV  grad sum_y pi log(pi / ref)            FWD  grad sum_y ref log(ref / pi)
        PART grad sum_y sg(pi) sum_t KL_t(h_t)      PFWD grad sum_y sg(pi) sum_t FKL_t(h_t)
        FUT  REV - PART                             LEN  grad sum_y pi / L
        PTV  grad sum_y sg(pi) sum_t TV_t(h_t), TV_t = 0.5 sum_v |pi(v|h) - ref(v|h)|
        PCHI grad sum_y sg(pi) sum_t CHI_t(h_t), CHI_t = sum_v pi(v|h)^2 / ref(v|h) - 1
        """
        seq_logprob, logits = self._sequence_logprobs()
        probs = seq_logprob.exp()
        ref_probs = self.ref_seq_logprob.exp()
        frozen = probs.detach().unsqueeze(-1) * self.mask  # sg(pi(y)) at each real position
        step_logprobs = torch.log_softmax(logits, dim=-1)
        ref_step_logprobs = torch.log_softmax(self.ref_logits, dim=-1)
        step_kl = (step_logprobs.exp() * (step_logprobs - ref_step_logprobs)).sum(-1)
        step_forward_kl = (ref_step_logprobs.exp() * (ref_step_logprobs - step_logprobs)).sum(-1)
        step_tv = 0.5 * (step_logprobs.exp() - ref_step_logprobs.exp()).abs().sum(-1)
        step_chi = (2 * step_logprobs - ref_step_logprobs).exp().sum(-1) - 1
        objectives = {
            Target.REV: (probs * (seq_logprob - self.ref_seq_logprob)).sum(),
            Target.FWD: (ref_probs * (self.ref_seq_logprob - seq_logprob)).sum(),
            Target.PART: (frozen * step_kl).sum(),
            Target.PFWD: (frozen * step_forward_kl).sum(),
            Target.LEN: (probs / self.lengths.to(torch.float64)).sum(),
            Target.PTV: (frozen * step_tv).sum(),
            Target.PCHI: (frozen * step_chi).sum(),
        }
        gradients = {
            target: self._flat_gradient(objective, retain_graph=True) for target, objective in objectives.items()
        }
        gradients[Target.FUT] = gradients[Target.REV] - gradients[Target.PART]
        return gradients

    def match(
        self,
        g: torch.Tensor,
        *,
        proportional: bool = False,
        targets: Mapping[Target, torch.Tensor] | None = None,
    ) -> Objective:
        """`match_objective` against this problem's targets (pass `targets` to avoid recomputing them)."""
        return match_objective(g, self.targets() if targets is None else targets, proportional=proportional)
