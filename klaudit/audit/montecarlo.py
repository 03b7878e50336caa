"""The Monte-Carlo audit: a KL term's mean gradient on sampled responses against the unbiased reference.

Where responses cannot be enumerated (a real model, a real length), the expected gradient is estimated.
N responses are drawn from the policy; on each, the gradient of the user's per-sequence surrogate S_u
(klaudit.audit.measure.surrogate) and of the reference S_r = `kl_penalty(estimator="rb")` (exact KL_t as a
loss plus the later KL_u as reward-to-go, kl-math.md R-D: unbiased for grad KL(pi || ref), with the lowest
variance) are taken w.r.t. the policy's output head W [V, F], logits = features @ W^T:

    G_i = sum_t dS_i/dlogits_t (x) f_t       (per sample, V x F; f_t the features at position t).

Reported: the cosine and relative error of the mean gradients (all N samples), and a one-sided z-test of
equal means on the same samples. The first half estimates the direction of the difference,
w = mean_A(G_u - G_r); on the second half, independent of w, x_i = <G_u,i - G_r,i, w> has mean 0 when the
means are equal and > 0 otherwise, so z = mean(x) / (sd(x) / sqrt(n_B)) and p = P(Z > z). "biased" when
p < P_BIASED. Equal means is the test: a term that is unbiased only up to a factor (a constant divisor)
reads as biased here; its scale is reported. On-policy only (old log-probs are the policy's own).

Policies: `CausalLMSampler` (a causal LM from disk; its head moved by sigma * N(0, 1) to about KL_PER_TOKEN
nats per token from the model, which is the reference) and `TabularSampler` (an enumerable policy, for the tests
against the exact audit). Every tensor lives on the model's device; the loops do not read values back to
the host until a row's statistics are final.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

from klaudit.audit.batch import Batch
from klaudit.audit.bind import Binding
from klaudit.audit.exact import ExactProblem, cosine, relerr
from klaudit.audit.fingerprint import Fingerprinter, leaf_batches, logits_gradient
from klaudit.audit.measure import (
    ModeNotImplemented,
    Plan,
    Term,
    first_result_kind,
    identify_clamped,
    plan_mode,
    result_kind,
    surrogate,
    value_per_sequence,
)
from klaudit.audit.policies import TabularPolicy, real_positions
from klaudit.audit.report import ResultRow
from klaudit.catalog import Aggregation
from klaudit.describe import describe
from klaudit.estimators import kl_penalty

DEFAULT_SAMPLES = 2000  # tests/audit/test_montecarlo.py: every biased on-policy row of its toy at p < 1e-6
DEFAULT_HORIZON = 16
# The policy's distance from the reference, per response token: at AUDIT_KL = 1 nat for a whole response of
# 16 tokens the biased losses are still indistinguishable from REV in 2000 samples (kl-math.md 4.3, 12.2).
KL_PER_TOKEN = 0.5
P_BIASED = 1e-6
IDENTICAL_RTOL = 1e-9  # mean difference below this fraction of the reference's: the same gradient per sample
# Entries of one [b, T, V] float64 tensor of a batch (several live at once): 32 MiB on a CPU, 512 MiB on a GPU.
BATCH_ENTRIES = {"cpu": 2**22, "cuda": 2**26}
MAX_BATCH = 1024


@dataclass
class Draw:
    """Sampled responses with what the head gradient needs: tokens, mask [n, T], features [n, T, F] and the
    policy's and reference's logits [n, T, V] (all detached, float64)."""

    tokens: torch.Tensor
    mask: torch.Tensor
    features: torch.Tensor
    logits: torch.Tensor
    ref_logits: torch.Tensor

    def batch(self) -> Batch:
        return leaf_batches(self.tokens, self.mask, self.logits, self.ref_logits)()


class Sampler(Protocol):
    horizon: int
    vocab_size: int
    description: str

    def draw(self, count: int) -> Draw: ...


class TabularSampler:
    """Exact i.i.d. draws from an enumerable policy (its response probabilities); features are the one-hot
    prefix, so the head is the policy's table of logits."""

    def __init__(self, policy: TabularPolicy, reference: TabularPolicy, *, seed: int = 0):
        self.policy = policy
        self.exact = ExactProblem(policy, reference)
        with torch.no_grad():
            batch = self.exact.batch()
            self.probabilities = (batch.logprobs * batch.mask).sum(-1).exp()
            self.logits = policy.logits(self.exact.tokens).detach()
        self.generator = torch.Generator(device=self.probabilities.device).manual_seed(seed)
        self.horizon, self.vocab_size = policy.horizon, policy.vocab_size
        self.description = f"a tabular policy (V={policy.vocab_size}, T={policy.horizon})"

    def draw(self, count: int) -> Draw:
        rows = torch.multinomial(self.probabilities, count, replacement=True, generator=self.generator)
        tokens = self.exact.tokens[rows]
        features = torch.nn.functional.one_hot(self.policy.prefix_index(tokens), self.policy.num_prefixes)
        return Draw(tokens, self.exact.mask[rows], features.to(torch.float64), self.logits[rows],
                    self.exact.ref_logits[rows])


class CausalLMSampler:
    """Responses of a causal LM whose output head is moved: the model is the reference, the policy is the same
    body with head W + sigma * D (D ~ N(0, 1), seeded), sigma set so that a response's summed per-token KL
    is about `kl` nats (default KL_PER_TOKEN per token). Sampled token by token with the model's cache, from its BOS token."""

    def __init__(self, model, *, horizon: int = DEFAULT_HORIZON, kl: float | None = None, seed: int = 0):
        self.model = model.eval()
        head = model.get_output_embeddings()
        self.device = head.weight.device
        self.ref_head = head.weight.detach().to(torch.float64)
        self.bias = None if getattr(head, "bias", None) is None else head.bias.detach().to(torch.float64)
        self.vocab_size, features = self.ref_head.shape
        self.horizon = horizon
        generator = torch.Generator().manual_seed(seed)
        self.direction = torch.randn(self.ref_head.shape, generator=generator, dtype=torch.float64).to(self.device)
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        config = model.config
        start = getattr(config, "bos_token_id", None)
        self.start = start if isinstance(start, int) and 0 <= start < self.vocab_size else 0
        eos = getattr(config, "eos_token_id", None)
        eos = eos[0] if isinstance(eos, (list, tuple)) and eos else eos
        self.eos = eos if isinstance(eos, int) and 0 <= eos < self.vocab_size else None
        parameters = inspect.signature(model.forward).parameters
        self._cache_name = "cache" if "cache" in parameters else "past_key_values"  # transformers renamed it
        self.head = self.ref_head
        kl = KL_PER_TOKEN * horizon if kl is None else kl
        self.sigma = self._calibrated(kl)
        self.head = self.ref_head + self.sigma * self.direction
        self.description = (f"{type(model).__name__} (V={self.vocab_size}, F={features}), head moved by "
                            f"{self.sigma:.3g} * N(0, 1) to about {kl:g} nats over T={horizon} tokens")

    def _logits(self, features: torch.Tensor, head: torch.Tensor) -> torch.Tensor:
        logits = features @ head.T
        return logits if self.bias is None else logits + self.bias

    @torch.no_grad()
    def _sample(self, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """tokens [n, T] drawn from the current head, and the features [n, T, F] each was drawn from."""
        inputs = torch.full((count, 1), self.start, dtype=torch.long, device=self.device)
        cache, tokens, features = None, [], []
        for _ in range(self.horizon):
            out = self.model(input_ids=inputs, use_cache=True, output_hidden_states=True, **{self._cache_name: cache})
            cache = out.past_key_values
            hidden = out.hidden_states[-1][:, -1].to(torch.float64)
            probabilities = torch.softmax(self._logits(hidden, self.head), -1)
            inputs = torch.multinomial(probabilities, 1, generator=self.generator)
            tokens.append(inputs)
            features.append(hidden)
        return torch.cat(tokens, 1), torch.stack(features, 1)

    def _calibrated(self, kl: float) -> float:
        """sigma with sum_t KL_t(pi_sigma || ref) about `kl` on responses of the reference (bisection, setup only)."""
        _, features = self._sample(16)
        ref = torch.log_softmax(self._logits(features, self.ref_head), -1)

        def sequence_kl(sigma: float) -> float:
            policy = torch.log_softmax(self._logits(features, self.ref_head + sigma * self.direction), -1)
            return ((policy.exp() * (policy - ref)).sum(-1).sum(-1).mean()).item()

        low, high = 0.0, 1e-4
        while sequence_kl(high) < kl and high < 1e4:
            low, high = high, 2 * high
        for _ in range(40):
            middle = 0.5 * (low + high)
            low, high = (middle, high) if sequence_kl(middle) < kl else (low, middle)
        return high

    def draw(self, count: int) -> Draw:
        tokens, features = self._sample(count)
        mask = real_positions(tokens, self.eos).to(torch.float64)
        return Draw(tokens, mask, features, self._logits(features, self.head), self._logits(features, self.ref_head))


def reference_objective(batch: Batch) -> torch.Tensor:
    """The sum over the batch of the Rao-Blackwellized surrogate (kl-math.md R-D), unbiased for grad KL."""
    return kl_penalty(batch.logprobs, batch.ref_logprobs, batch.mask, estimator="rb", logits=batch.logits,
                      ref_logits=batch.ref_logits).loss.sum()


def reference_value(batch: Batch) -> torch.Tensor:
    return kl_penalty(batch.logprobs, batch.ref_logprobs, batch.mask, estimator="rb", logits=batch.logits,
                      ref_logits=batch.ref_logits).value


@dataclass
class Curves:
    """Per position t, each sample's head gradient at t projected on the reference's mean direction (for --plot)."""

    user: list[torch.Tensor] = field(default_factory=list)
    reference: list[torch.Tensor] = field(default_factory=list)
    mask: list[torch.Tensor] = field(default_factory=list)


@dataclass
class _Accumulator:
    """One row's sums over the samples drawn so far (device tensors; read once at the end)."""

    plan: Plan
    placement: str
    per_sequence: Callable[[Batch], torch.Tensor]
    values: Callable[[Batch], torch.Tensor]
    total: torch.Tensor
    first_half: torch.Tensor
    value_sum: torch.Tensor
    projections: list[torch.Tensor] = field(default_factory=list)
    direction: torch.Tensor | None = None
    identical: bool = False
    curves: Curves = field(default_factory=Curves)
    same_as: _Accumulator | None = None  # an earlier row with the same values and gradients: its sums serve


def _share_twins(accumulators: list[_Accumulator], first: Draw) -> None:
    """Mark each row whose surrogate has exactly the values and per-sample gradients of an earlier row on the
    first draw (verl's "kl" and "k1", "k2" and "mse+" ...): it is the same function, measured once."""
    seen: list[tuple[_Accumulator, torch.Tensor, torch.Tensor]] = []
    for row in accumulators:
        gradient = logits_gradient(_summed(row), first.batch)
        with torch.no_grad():
            values = row.per_sequence(first.batch()).detach()
        twin = next((earlier for earlier, g, v in seen if torch.equal(g, gradient) and torch.equal(v, values)), None)
        if twin is None:
            seen.append((row, gradient, values))
        else:
            row.same_as = twin


def _summed(row: _Accumulator) -> Callable[[Batch], torch.Tensor]:
    """The row's surrogate summed over a batch: the objective whose logits gradient is each sample's."""
    return lambda batch: row.per_sequence(batch).sum()


def _head_gradient(logits_gradient_: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
    """sum over samples and positions of dS/dlogits (x) features: [V, F]."""
    return torch.einsum("btv,btf->vf", logits_gradient_, features)


def batch_size_for(sampler: Sampler, device: torch.device) -> int:
    """Responses per batch: as many as keep a [b, T, V] tensor within the device's BATCH_ENTRIES."""
    entries = BATCH_ENTRIES.get(device.type, BATCH_ENTRIES["cpu"])
    return max(1, min(MAX_BATCH, entries // (sampler.horizon * sampler.vocab_size)))


def audit(fn: Callable, binding: Binding, *, name: str, sampler: Sampler, samples: int = DEFAULT_SAMPLES,
          placements: Sequence[str] | None = None, batch_size: int | None = None,
          progress: Callable[[str], None] = lambda message: None) -> tuple[list[ResultRow], list[str], dict]:
    """Rows for every (mode, placement) of `fn` from `samples` responses of `sampler` (see the module docstring),
    notes, and the per-position curves of each row, by (mode, placement), for the picture."""
    from klaudit.lint.roles import is_reward_function

    if samples < 4:
        raise ValueError(f"the Monte-Carlo audit needs at least 4 samples, got {samples}")
    notes: list[str] = []
    if binding.off_policy:
        binding = dataclasses.replace(binding, current_old=True)
        notes.append(f"{', '.join(binding.old)} of {name}: the policy's own log-probs (the Monte-Carlo audit is "
                     f"on-policy)")
    reward_function = is_reward_function(getattr(fn, "__name__", ""))
    first = sampler.draw(min(batch_size or 8, samples))
    size = batch_size or batch_size_for(sampler, first.logits.device)
    plans: list[Plan] = []
    for mode in binding.modes():
        term = Term(fn, binding, mode, name, negated=reward_function)
        try:
            if plans:
                kind = result_kind(term, first.batch())
            else:
                term, kind, note = first_result_kind(term, first.batch())
                notes += [note] if note else []
                binding = term.binding
        except ModeNotImplemented as skipped:
            notes.append(f"skipped: {skipped}")
            continue
        plans.append(plan_mode(term, kind, placements, reward_function, first.batch, notes))
    reference = first.features.new_zeros(sampler.vocab_size, first.features.shape[-1])
    accumulators = [_Accumulator(plan, placement, surrogate(plan.term, plan.kind, placement, plan.scalar_weight),
                                 value_per_sequence(plan.term, plan.kind, plan.scalar_weight), reference.clone(),
                                 reference.clone(), reference.new_zeros(()))
                    for plan in plans for placement in plan.placements]
    _share_twins(accumulators, first)
    measured = [row for row in accumulators if row.same_as is None]
    reference_total, reference_first, reference_values = reference.clone(), reference.clone(), reference.new_zeros(())
    half = samples // 2
    drawn, draw = 0, first  # type: tuple[int, Draw | None]
    while drawn < samples:
        count = min(size, (half if drawn < half else samples) - drawn)
        if draw is None or draw.tokens.shape[0] != count:
            draw = sampler.draw(count)
        progress(f"{name}: {drawn + count}/{samples} samples")
        in_first_half = drawn < half
        reference_gradient = logits_gradient(reference_objective, draw.batch)
        reference_head = _head_gradient(reference_gradient, draw.features)
        reference_total += reference_head
        if in_first_half:
            reference_first += reference_head
        with torch.no_grad():
            reference_values += reference_value(draw.batch()).sum()
        for row in measured:
            user_gradient = logits_gradient(_summed(row), draw.batch)
            user_head = _head_gradient(user_gradient, draw.features)
            row.total += user_head
            with torch.no_grad():
                row.value_sum += row.values(draw.batch()).sum()
            if in_first_half:
                row.first_half += user_head - reference_head
                continue
            if row.direction is None:
                row.identical = bool(row.first_half.norm() <= IDENTICAL_RTOL * reference_first.norm())
                row.direction = row.first_half / half
            difference = user_gradient - reference_gradient
            row.projections.append((difference * (draw.features @ row.direction.T)).sum((1, 2)))
            along = draw.features @ (reference_first / reference_first.norm().clamp_min(1e-300)).T
            row.curves.user.append((user_gradient * along).sum(-1))
            row.curves.reference.append((reference_gradient * along).sum(-1))
            row.curves.mask.append(draw.mask)
        drawn += count
        draw = None
    fingerprinter = Fingerprinter(first.batch)
    rows, curves = [], {}
    for row in accumulators:
        if row.same_as is not None:
            row = dataclasses.replace(row.same_as, plan=row.plan, placement=row.placement,
                                      per_sequence=row.per_sequence, same_as=None)
        rows.append(_row(row, name, samples, reference_total / samples, reference_values.item() / samples,
                         fingerprinter, sampler.description))
        curves[(tuple(row.plan.term.mode.items()), row.placement)] = row.curves
    return rows, notes, curves


def _row(row: _Accumulator, name: str, samples: int, reference_mean: torch.Tensor, reference_value_mean: float,
         fingerprinter: Fingerprinter, description: str) -> ResultRow:
    """The report row of one accumulator: the test, the mean gradients' agreement and the fingerprint."""
    user_mean = row.total / samples
    projections = torch.cat(row.projections)
    spread = projections.std().item()
    if row.identical or spread == 0.0:
        z, p = 0.0, 1.0
    else:
        z = projections.mean().item() / (spread / math.sqrt(projections.numel()))
        p = 0.5 * math.erfc(z / math.sqrt(2.0))
    biased = p < P_BIASED
    aggregation = Aggregation.BATCH_MEAN if row.plan.scalar_weight == "batch-token-mean" else Aggregation.SUM
    match, _ = identify_clamped(_summed(row), fingerprinter, rtol=row.plan.term.rtol,
                                aggregation=aggregation)
    squared = torch.dot(reference_mean.flatten(), reference_mean.flatten()).item()
    scale = torch.dot(user_mean.flatten(), reference_mean.flatten()).item() / squared if squared else math.nan
    cos = cosine(user_mean, reference_mean)
    return ResultRow(
        target=name, mode=dict(row.plan.term.mode), placement=row.placement,
        configuration=match.description if match is not None else "unrecognised (no catalog configuration matches "
                                                                   "per sample)",
        objective="MC", unbiased=not biased, cos_rev=None if math.isnan(cos) else cos,
        rel_err_rev=relerr(user_mean, reference_mean), value_bias=row.value_sum.item() / samples - reference_value_mean,
        rule=(match.row.rule if match is not None and biased else None),
        fix=(match.row.fix if match is not None and biased else ""),
        same_gradient_as=[describe(twin) for twin in match.twins] if match is not None else [],
        monte_carlo={"samples": samples, "z": z, "p": p, "scale": scale, "identical": row.identical,
                     "policy": description},
    )
