"""The Monte-Carlo audit: a KL term's mean gradient on sampled responses against the unbiased reference.

Where responses cannot be enumerated (a real model, a real length), the expected gradient is estimated.
Responses are drawn; on each, the gradient of the user's per-sequence surrogate S_u (klaudit.audit.measure.
surrogate) and of the reference S_r = `kl_penalty(estimator="rb")` (exact KL_t as a loss plus the later KL_u as
reward-to-go, kl-math.md R-D: unbiased for grad KL(pi || ref)) are taken w.r.t. the policy's output head W [V, F],
logits = features @ W^T, and the test is on their paired difference, sample by sample:

    D_i = sum_t (dS_u,i/dlogits_t - dS_r,i/dlogits_t) (x) f_t          (V x F; f_t the features at position t).

* Draws come from the proposal (1 - MIX) pi + MIX ref, token by token, and every per-sample quantity is weighted
  by w_i = pi(y_i) / proposal(y_i) <= (1 - MIX)^-T, so E[w D] = E_pi[D]. Without it, k3's ratio ref/pi makes a
  term's mean hang on tokens pi almost never draws (an unbiased k3 loss + k3 reward then looks biased in 2000
  samples); under the proposal w * ref/pi <= 1 / MIX.
* Control variates (klaudit.audit.variates: zero mean under pi, so any fixed combination keeps the mean) are
  fitted by least squares on a pilot and subtracted: D'_i = w_i (D_i - sum_j beta_j V_ij).
* Split sample: the first half A (the pilot included) estimates the direction u = mean_A D'; on the second half B,
  independent of u, x_i = <D'_i, u> has mean <E D, u>, zero when the means are equal. One-sided test:
  z = mean_B(x) / (sd_B(x) / sqrt(n_B)); p = P(N(0, 1) > z) plus the first Edgeworth term of a studentized mean
  when the sample skewness g makes the normal tail too small, max(0, -g) (2 z^2 + 1) phi(z) / (6 sqrt(n_B)).
  "biased" when p < P_BIASED. The terms are bounded on the proposal (w and w * ref/pi are) and n_B >= 500 by
  default; the normal tail is then accurate for the k1 and exact-KL forms (z's sd 0.9 to 1.1 over 200 seeds
  of the tabular toy) but not yet for k3's ratio terms (k3 loss + k3 reward: sd 1.3, 3 of 200 below
  P_BIASED): tests/audit/test_montecarlo.py and the README give the figures.
* Sample size: with `samples=None` the pilot estimates, per row, the noise of x and |REV|, and N is the smallest
  that gives a bias of TARGET_RELATIVE_BIAS |REV| an expected z of Z_BIASED + Z_POWER (90% power), from
  MIN_SAMPLES to the device's MAX_SAMPLES. Each row reports the bias it could have detected: a bias mu gives E x ~ |mu|^2
  (u is mu plus noise), so |mu| / |REV| = sqrt((Z_BIASED + Z_POWER) sd(x) / sqrt(n_B)) / |REV|.

Equal means is the test: a term that is unbiased only up to a factor (a constant divisor) reads as biased here;
its scale is reported. On-policy only (old log-probs are the policy's own). cos REV and the relative error
compare the weighted mean head gradients over all N samples (the user's with its control variates removed).

Policies: `CausalLMSampler` (a causal LM from disk; its head moved by sigma * N(0, 1) to about KL_PER_TOKEN nats
per token from the model, which is the reference) and `TabularSampler` (an enumerable policy, for the tests
against the exact audit). Both are a linear head on features, so per-sample head gradients are
features^T dS/dlogits: one matrix product per batch, no per-sample backward pass.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import statistics
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

from klaudit.audit.batch import Batch
from klaudit.audit.bind import Binding
from klaudit.audit.exact import ExactProblem
from klaudit.audit.fingerprint import (
    Fingerprinter,
    cached_forward,
    far_batch,
    gradient_parts,
    leaf_batches,
    logits_gradient,
)
from klaudit.audit.measure import (
    ModeNotImplemented,
    Plan,
    Term,
    expand_entries,
    first_result_kind,
    identify_clamped,
    plan_mode,
    result_kind,
    surrogate,
    value_per_sequence,
)
from klaudit.audit.policies import TabularPolicy, real_positions
from klaudit.audit.report import ResultRow
from klaudit.audit.variates import VariateBasis, knots_from, solve_ridge
from klaudit.catalog import Aggregation
from klaudit.describe import describe
from klaudit.estimators import kl_penalty

DEFAULT_HORIZON = 16
KL_PER_TOKEN = 0.5  # the CausalLMSampler's policy, per response token from the model
MIX = 0.2  # the proposal's share of the reference, per token
P_BIASED = 1e-6
Z_BIASED = statistics.NormalDist().inv_cdf(1 - P_BIASED)  # 4.753
Z_POWER = statistics.NormalDist().inv_cdf(0.9)  # 1.282: the detectable bias is detected 9 times in 10
TARGET_RELATIVE_BIAS = 0.05  # the automatic sample size detects a bias of 5% of |REV|
PILOT = 256
MIN_SAMPLES = 1000  # n_B >= 500: the normal tail of the test's mean holds to its Edgeworth order
MAX_SAMPLES = {"cpu": 4000, "cuda": 16000}  # the automatic sample size's cap (a CPU: about a minute at V = 1k)
FINGERPRINT_ROWS = 8
TWIN_PROBE_ROWS = 64  # pilot responses on which rows are compared for identical per-sample gradients
IDENTICAL_RTOL = 1e-9  # a difference below this fraction of the reference's gradient: the same gradient per sample
# Entries of one [b, T, V] float64 tensor of a batch (a dozen live at once): 16 MiB on a CPU (below glibc's
# largest mmap threshold, so the allocator reuses them instead of faulting fresh pages in); on a GPU 512 MiB,
# or up to 2 GiB where a quarter of its free memory holds a dozen (a real vocabulary then still gets a pilot
# of a hundred responses: V = 151,936 and T = 16 fit 27 responses in 512 MiB, 110 in 2 GiB).
BATCH_ENTRIES = {"cpu": 2**21, "cuda": 2**26}
MAX_GPU_BATCH_ENTRIES = 2**28
LIVE_BATCH_TENSORS = 12
DRAW_CHUNK = 1024  # responses sampled per forward pass of a model
MAX_BATCH = 1024


@dataclass
class Draw:
    """Sampled responses: tokens, mask [n, T], features [n, T, F] (float64) and the importance weights [n] that
    move the proposal's samples to the policy."""

    tokens: torch.Tensor
    mask: torch.Tensor
    features: torch.Tensor
    weights: torch.Tensor

    def rows(self, start: int, stop: int) -> Draw:
        return Draw(*(getattr(self, name)[start:stop] for name in ("tokens", "mask", "features", "weights")))

    def __len__(self) -> int:
        return self.tokens.shape[0]


class Sampler(Protocol):
    horizon: int
    vocab_size: int
    description: str

    def draw(self, count: int) -> Draw: ...

    def logits(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...


def proposal_log_weights(logits: torch.Tensor, ref_logits: torch.Tensor, tokens: torch.Tensor,
                         mask: torch.Tensor, mix: float = MIX) -> torch.Tensor:
    """log pi(y) / proposal(y) [n], proposal = (1 - mix) pi + mix ref at every real position."""
    log_p = torch.log_softmax(logits, -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    log_q = torch.log_softmax(ref_logits, -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    return (_log_weight(log_p, log_q, mix) * mask).sum(-1)


def _log_weight(log_p: torch.Tensor, log_q: torch.Tensor, mix: float) -> torch.Tensor:
    """log pi(y) - log((1 - mix) pi(y) + mix ref(y)) of each draw, from log pi(y) and log ref(y)."""
    if mix <= 0:
        return torch.zeros_like(log_p)
    return log_p - torch.logaddexp(log_p + math.log1p(-mix), log_q + math.log(mix))


class TabularSampler:
    """Exact i.i.d. draws of the proposal over every response of an enumerable policy; features are the one-hot
    prefix, so the head is the policy's table of logits."""

    def __init__(self, policy: TabularPolicy, reference: TabularPolicy, *, seed: int = 0, mix: float = MIX):
        self.policy, self.mix = policy, mix
        self.exact = ExactProblem(policy, reference)
        self.table = policy.prefix_logits.detach().to(torch.float64)
        self.ref_table = reference.prefix_logits.detach().to(torch.float64)
        with torch.no_grad():
            batch = self.exact.batch()
            pi, ref = batch.logprobs.exp(), batch.ref_logprobs.exp()
            proposal = ((1 - mix) * pi + mix * ref).log()
            self.probabilities = (proposal * batch.mask).sum(-1).exp()
        self.generator = torch.Generator(device=self.probabilities.device).manual_seed(seed)
        self.horizon, self.vocab_size = policy.horizon, policy.vocab_size
        self.description = f"a tabular policy (V={policy.vocab_size}, T={policy.horizon})"

    def logits(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return features @ self.table, features @ self.ref_table

    def draw(self, count: int) -> Draw:
        rows = torch.multinomial(self.probabilities, count, replacement=True, generator=self.generator)
        tokens, mask = self.exact.tokens[rows], self.exact.mask[rows]
        features = torch.nn.functional.one_hot(self.policy.prefix_index(tokens), self.policy.num_prefixes)
        features = features.to(torch.float64)
        logits, ref_logits = self.logits(features)
        return Draw(tokens, mask, features, proposal_log_weights(logits, ref_logits, tokens, mask, self.mix).exp())


class CausalLMSampler:
    """Responses of a causal LM whose output head is moved: the model is the reference, the policy is the same
    body with head W + sigma * D (D ~ N(0, 1), seeded), sigma set so that a response's summed per-token KL
    is about `kl` nats (default KL_PER_TOKEN per token). Sampled token by token from the proposal (1 - mix) pi +
    mix ref with the model's cache, from its BOS token."""

    def __init__(self, model, *, horizon: int = DEFAULT_HORIZON, kl: float | None = None, seed: int = 0,
                 mix: float = MIX):
        self.model = model.eval()
        self.mix = mix
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
        # the body alone gives the last hidden state (after the final norm) without the model's own vocabulary head
        self.body = model.base_model if model.base_model is not model else None
        self.head = self.ref_head
        kl = KL_PER_TOKEN * horizon if kl is None else kl
        self.sigma = self._calibrated(kl)
        self.head = self.ref_head + self.sigma * self.direction
        self.description = (f"{type(model).__name__} (V={self.vocab_size}, F={features}), head moved by "
                            f"{self.sigma:.3g} * N(0, 1) to about {kl:g} nats over T={horizon} tokens")

    def _linear(self, features: torch.Tensor, head: torch.Tensor) -> torch.Tensor:
        logits = features @ head.T
        return logits if self.bias is None else logits + self.bias

    def logits(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self._linear(features, self.head), self._linear(features, self.ref_head)

    @torch.no_grad()
    def _sample(self, count: int, mix: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """tokens [n, T] drawn from (1 - mix) pi + mix ref, the features [n, T, F] each was drawn from, and each
        draw's log pi(y_t) / proposal(y_t) [n, T] (as proposal_log_weights, read at the drawn token only)."""
        inputs = torch.full((count, 1), self.start, dtype=torch.long, device=self.device)
        cache, tokens, features, log_weights = None, [], [], []
        for _ in range(self.horizon):
            if self.body is not None:
                out, cache = cached_forward(self.body, inputs, cache)
                hidden = out.last_hidden_state[:, -1].to(torch.float64)
            else:
                out, cache = cached_forward(self.model, inputs, cache, output_hidden_states=True)
                hidden = out.hidden_states[-1][:, -1].to(torch.float64)
            logits = self._linear(hidden, self.head)
            probabilities = torch.softmax(logits, -1)
            if mix > 0:
                ref_logits = self._linear(hidden, self.ref_head)
                probabilities = (1 - mix) * probabilities + mix * torch.softmax(ref_logits, -1)
            inputs = torch.multinomial(probabilities, 1, generator=self.generator)
            log_p = logits.gather(-1, inputs) - torch.logsumexp(logits, -1, keepdim=True)
            log_q = ref_logits.gather(-1, inputs) - torch.logsumexp(ref_logits, -1, keepdim=True) if mix > 0 else log_p
            log_weights.append(_log_weight(log_p, log_q, mix))
            tokens.append(inputs)
            features.append(hidden)
        return torch.cat(tokens, 1), torch.stack(features, 1), torch.cat(log_weights, 1)

    def _calibrated(self, kl: float) -> float:
        """sigma with sum_t KL_t(pi_sigma || ref) about `kl` on responses of the reference (bisection, setup only)."""
        _, features, _ = self._sample(16, 0.0)
        ref = torch.log_softmax(self._linear(features, self.ref_head), -1)

        def sequence_kl(sigma: float) -> float:
            policy = torch.log_softmax(self._linear(features, self.ref_head + sigma * self.direction), -1)
            return ((policy.exp() * (policy - ref)).sum(-1).sum(-1).mean()).item()

        low, high = 0.0, 1e-4
        while sequence_kl(high) < kl and high < 1e4:
            low, high = high, 2 * high
        for _ in range(40):
            middle = 0.5 * (low + high)
            low, high = (middle, high) if sequence_kl(middle) < kl else (low, middle)
        return high

    def draw(self, count: int) -> Draw:
        parts = []
        for start in range(0, count, DRAW_CHUNK):
            tokens, features, log_weights = self._sample(min(DRAW_CHUNK, count - start), self.mix)
            mask = real_positions(tokens, self.eos).to(torch.float64)
            parts.append(Draw(tokens, mask, features, (log_weights * mask).sum(-1).exp()))
        return Draw(*(torch.cat([getattr(part, name) for part in parts]) for name in
                      ("tokens", "mask", "features", "weights")))


def reference_objective(batch: Batch) -> torch.Tensor:
    """The sum over the batch of the Rao-Blackwellized surrogate (kl-math.md R-D), unbiased for grad KL."""
    return kl_penalty(batch.logprobs, batch.ref_logprobs, batch.mask, estimator="rb", logits=batch.logits,
                      ref_logits=batch.ref_logits).loss.sum()


def reference_score_coefficient(kl: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """R-D's logits gradient is c_t (e_y - p) + m_t dKL_t/dlogits with c_t = m_t sum_{u>t} m_u KL_u: c [n, T]."""
    per_token = kl * mask
    return mask * (per_token.flip(-1).cumsum(-1).flip(-1) - per_token)


@dataclass
class Curves:
    """Per position t, each sample's head gradient at t projected on the reference's mean direction, and the
    samples' importance weights (for --plot)."""

    user: list[torch.Tensor] = field(default_factory=list)
    reference: list[torch.Tensor] = field(default_factory=list)
    mask: list[torch.Tensor] = field(default_factory=list)
    weights: list[torch.Tensor] = field(default_factory=list)


class _Local:
    """One batch of responses with what every row needs: the policy's local quantities and control variates
    (VariateBasis), the batch tensors user code sees, and the reference's logits gradient."""

    def __init__(self, draw: Draw, sampler: Sampler, knots: torch.Tensor):
        self.draw = draw
        logits, ref_logits = sampler.logits(draw.features)
        self.logits, self.ref_logits = logits, ref_logits
        self.basis = VariateBasis(logits, ref_logits, draw.tokens, draw.mask, knots)
        basis = self.basis
        self.logprobs = basis.log_p.gather(-1, basis.tokens).squeeze(-1)
        self.ref_logprobs = self.logprobs - basis.log_ratio
        self.mask = draw.mask.to(torch.float64)
        self.weights = draw.weights.to(torch.float64)
        self.weighted_features = draw.features * self.weights[:, None, None]
        # the regression's weight of position (n, t): the head gradient's scale there
        self.fit_weights = self.weights.square().unsqueeze(-1) * self.mask * draw.features.square().sum(-1)
        self.ref_score = reference_score_coefficient(basis.kl, self.mask)
        self.reference = basis.score_minus(self.ref_score, None).addcmul_(basis.kl_direction, self.mask.unsqueeze(-1))
        self.reference_value = (basis.kl * self.mask).sum(-1)

    def batch(self) -> Batch:
        return Batch(logprobs=self.logprobs, ref_logprobs=self.ref_logprobs.clone(), mask=self.mask.clone(),
                     logits=self.logits, ref_logits=self.ref_logits, tokens=self.draw.tokens)

    def gradient(self, objective: Callable[[Batch], torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """d objective / d logits as (a [n, T], G [n, T, V] or None): a (e_y - p) through the log-probs plus G
        through the logits themselves (None when the term does not read them), by
        klaudit.audit.fingerprint.gradient_parts: no [n, T, V] graph is built for a term of the log-probs only."""
        return gradient_parts(objective, self.batch)

    def head(self, vectors: torch.Tensor, rows: slice = slice(None)) -> torch.Tensor:
        """sum over samples and positions of w_n vectors[n, t] (x) f[n, t]: [V, F] (vectors of the given rows)."""
        return vectors.flatten(0, 1).T @ self.weighted_features[rows].flatten(0, 1)

    def along(self, vectors: torch.Tensor, direction: torch.Tensor, rows: slice = slice(None)) -> torch.Tensor:
        """w_n <sum_t vectors[n, t] (x) f[n, t], direction> per sample [n] (vectors of the given rows)."""
        return self.weights[rows] * (vectors * (self.draw.features[rows] @ direction.T)).sum((1, 2))


@dataclass
class _Row:
    """One row's state: the plan, the control-variate fit, and sums over the samples (device tensors)."""

    plan: Plan
    placement: str
    per_sequence: Callable[[Batch], torch.Tensor]
    values: Callable[[Batch], torch.Tensor]
    normal_vector: torch.Tensor | None = None
    beta: torch.Tensor | None = None
    identical: bool = False
    direction_sum: torch.Tensor = field(default_factory=lambda: torch.zeros(()))  # sum over A of w D'
    total: torch.Tensor = field(default_factory=lambda: torch.zeros(()))  # sum over all samples of w D'
    value_sum: torch.Tensor = field(default_factory=lambda: torch.zeros(()))
    projections: list[torch.Tensor] = field(default_factory=list)
    curves: Curves = field(default_factory=Curves)
    same_as: _Row | None = None  # an earlier row with the same values and gradients: its sums serve

    def summed(self) -> Callable[[Batch], torch.Tensor]:
        """The row's surrogate summed over a batch: the objective whose logits gradient is each sample's."""
        return lambda batch: self.per_sequence(batch).sum()


def _share_twins(rows: list[_Row], probes: Sequence[Callable[[], Batch]]) -> None:
    """Mark each row whose surrogate has exactly the per-sample gradients of an earlier row on every probe batch
    (verl's "kl" and "k1", "k2" and "k1+" ...): its gradient is measured once (its values, cheap, are its own).
    The probes are the pilot and the fingerprint's far batch, whose log-ratios of +-25 nats reach any clamp:
    low_var_kl and k3 agree wherever the clamp does not act."""
    seen: list[tuple[_Row, list[torch.Tensor]]] = []
    for row in rows:
        signature = [logits_gradient(row.summed(), probe) for probe in probes]
        twin = next((earlier for earlier, other in seen
                     if all(torch.equal(g, h) for g, h in zip(signature, other))), None)
        if twin is None:
            seen.append((row, signature))
        else:
            row.same_as = twin


def _slices(sampler: Sampler, count: int, size: int) -> Iterator[Draw]:
    """`count` responses of the sampler in batches of at most `size`, drawn DRAW_CHUNK (or `size`) at a time."""
    while count > 0:
        chunk = sampler.draw(min(count, max(size, DRAW_CHUNK)))
        for start in range(0, len(chunk), size):
            yield chunk.rows(start, start + size)
        count -= len(chunk)


def batch_size_for(sampler: Sampler, device: torch.device) -> int:
    """Responses per batch: as many as keep a [b, T, V] tensor within the device's BATCH_ENTRIES (on a GPU with
    the memory for it, up to MAX_GPU_BATCH_ENTRIES)."""
    entries = BATCH_ENTRIES.get(device.type, BATCH_ENTRIES["cpu"])
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        entries = max(entries, min(MAX_GPU_BATCH_ENTRIES, free // (4 * LIVE_BATCH_TENSORS * 8)))
    return max(1, min(MAX_BATCH, entries // (sampler.horizon * sampler.vocab_size)))


class _Difference:
    """A row's per-sample difference from the reference on one batch: D = a (e_y - p) - m dKL/dlogits + G."""

    def __init__(self, local: _Local, row: _Row):
        self.local = local
        self.user_score, self.direct = local.gradient(row.summed())
        self.score = self.user_score - local.ref_score
        basis = local.basis
        self.projections = basis.score_projections(self.score) - local.mask.unsqueeze(-1) * basis.kl_projections
        if self.direct is not None:
            self.projections = self.projections + basis.projections_of(self.direct)

    def vectors(self, beta: torch.Tensor | None) -> torch.Tensor:
        """D [n, T, V], minus the control variates' combination beta when given."""
        local = self.local
        out = local.basis.score_minus(self.score, beta).addcmul_(local.basis.kl_direction, local.mask.unsqueeze(-1),
                                                                 value=-1)
        return out if self.direct is None else out.add_(self.direct)

    def is_zero(self) -> bool:
        scale = self.local.reference.abs().max()
        return bool(self.vectors(None).abs().max() <= IDENTICAL_RTOL * scale)


def _edgeworth_p(z: float, skewness: float, count: int) -> float:
    """P(N(0,1) > z), raised by the first Edgeworth term of a studentized mean when the skewness calls for it."""
    tail = 0.5 * math.erfc(z / math.sqrt(2.0))
    density = math.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)
    return min(1.0, tail + max(0.0, -skewness) * (2 * z * z + 1) * density / (6 * math.sqrt(count)))


def audit(fn: Callable, binding: Binding, *, name: str, sampler: Sampler, samples: int | None = None,
          placements: Sequence[str] | None = None, batch_size: int | None = None, curves: bool = False,
          progress: Callable[[str], None] = lambda message: None) -> tuple[list[ResultRow], list[str], dict]:
    """Rows for every (mode, placement) of `fn` from responses of `sampler` (see the module docstring): `samples`
    of them, or with None as many as the pilot says detect TARGET_RELATIVE_BIAS; notes; and with `curves` the
    per-position curves of each row, by (mode, placement), for the picture."""
    from klaudit.lint.roles import is_reward_function

    if samples is not None and samples < 4:
        raise ValueError(f"the Monte-Carlo audit needs at least 4 samples, got {samples}")
    notes: list[str] = []
    if binding.off_policy:
        binding = dataclasses.replace(binding, current_old=True)
        notes.append(f"{', '.join(binding.old)} of {name}: the policy's own log-probs (the Monte-Carlo audit is "
                     f"on-policy)")
    reward_function = is_reward_function(getattr(fn, "__name__", ""))
    device = sampler.draw(1).features.device
    size = batch_size or batch_size_for(sampler, device)
    pilot_size = min(PILOT, size, (samples or 2 * PILOT) // 2)
    pilot_draw = sampler.draw(pilot_size)
    knots = knots_from(_sampled_log_ratios(pilot_draw, sampler))
    pilot = _Local(pilot_draw, sampler, knots)
    fingerprint_rows = pilot_draw.rows(0, min(FINGERPRINT_ROWS, pilot_size))
    first = leaf_batches(fingerprint_rows.tokens, fingerprint_rows.mask, *sampler.logits(fingerprint_rows.features))
    plans: list[Plan] = []
    for mode in binding.modes():
        for entry in expand_entries(Term(fn, binding, mode, name, negated=reward_function), first()):
            term = entry.rebound(binding)  # with the binding the first call settled
            try:
                if plans:
                    kind = result_kind(term, first())
                else:
                    term, kind, note = first_result_kind(term, first())
                    notes += [note] if note else []
                    binding = term.binding
            except ModeNotImplemented as skipped:
                notes.append(f"skipped: {skipped}")
                continue
            plans.append(plan_mode(term, kind, placements, reward_function, first, notes))
    rows = [_Row(plan, placement, surrogate(plan.term, plan.kind, placement, plan.scalar_weight),
                 value_per_sequence(plan.term, plan.kind, plan.scalar_weight))
            for plan in plans for placement in plan.placements]
    probe = pilot_draw.rows(0, TWIN_PROBE_ROWS)
    _share_twins(rows, [leaf_batches(probe.tokens, probe.mask, *sampler.logits(probe.features)), far_batch(first)])
    measured = [row for row in rows if row.same_as is None]

    progress(f"{name}: fitting control variates on a pilot of {pilot_size} samples")
    normal_matrix = pilot.basis.normal_matrix(pilot.fit_weights)
    differences = {}
    for row in measured:
        difference = _Difference(pilot, row)
        row.identical = difference.is_zero()
        row.beta = (None if row.identical else
                    solve_ridge(normal_matrix, pilot.basis.normal_vector(difference.projections, pilot.fit_weights)))
        differences[id(row)] = difference
    half = pilot_size // 2
    reference_halves = (pilot.head(pilot.reference[:half], slice(None, half)),
                        pilot.head(pilot.reference[half:], slice(half, None)))
    rev_squared = _cross_product(reference_halves, (half, pilot_size - half))
    if samples is None:
        cap = MAX_SAMPLES.get(device.type, MAX_SAMPLES["cpu"])
        samples = min(cap, _automatic_samples(measured, differences, pilot, half, rev_squared))
        notes.append(f"{name}: {samples} samples, chosen on a pilot of {pilot_size} to detect a bias of "
                     f"{TARGET_RELATIVE_BIAS:.0%} of |REV| at p < {P_BIASED:g} with 90% power "
                     f"({MIN_SAMPLES} to {cap} on {device.type})")
    samples = max(samples, pilot_size)
    first_half = max(pilot_size, samples // 2)

    reference_sums = [torch.zeros_like(reference_halves[0]), torch.zeros_like(reference_halves[0])]
    reference_value = torch.zeros((), dtype=torch.float64, device=device)
    for row in rows:
        row.value_sum = torch.zeros((), dtype=torch.float64, device=device)
        row.total, row.direction_sum = torch.zeros_like(reference_sums[0]), torch.zeros_like(reference_sums[0])
    phases = ((True, itertools.chain([pilot_draw], _slices(sampler, first_half - pilot_size, size))),
              (False, _slices(sampler, samples - first_half, size)))
    drawn = 0
    for in_first_half, draws in phases:
        for draw in draws:
            local = pilot if draw is pilot_draw else _Local(draw, sampler, knots)
            drawn += len(draw)
            progress(f"{name}: {drawn}/{samples} samples")
            reference_sums[0 if in_first_half else 1] += local.head(local.reference)
            reference_value += (local.weights * local.reference_value).sum()
            with torch.no_grad():
                for row in rows:
                    row.value_sum += (local.weights * row.values(local.batch())).sum()
            if curves and not in_first_half:
                unit = reference_sums[0] / reference_sums[0].norm().clamp_min(1e-300)
                along_reference = local.draw.features @ unit.T
            for row in measured:
                difference = differences.pop(id(row)) if local is pilot else _Difference(local, row)
                vectors = difference.vectors(row.beta)
                contribution = local.head(vectors)
                row.total += contribution
                if in_first_half:
                    row.direction_sum += contribution
                    continue
                row.projections.append(local.along(vectors, row.direction_sum / first_half))
                if curves:
                    _add_curves(row.curves, local, difference, along_reference)

    fingerprinter = Fingerprinter(first)
    halves = (first_half, samples - first_half)
    reference_means = (reference_sums[0] / halves[0], reference_sums[1] / max(halves[1], 1))
    results, row_curves = [], {}
    for row in rows:
        if row.same_as is not None:  # the twin's gradient statistics, with the row's own values
            row = dataclasses.replace(row.same_as, plan=row.plan, placement=row.placement, per_sequence=row.per_sequence,
                                      values=row.values, value_sum=row.value_sum, same_as=None)
        results.append(_result(row, name, halves, reference_means, reference_value.item() / samples, fingerprinter,
                               sampler.description))
        row_curves[(tuple(row.plan.term.mode.items()), row.placement)] = row.curves
    return results, notes, row_curves


def _sampled_log_ratios(draw: Draw, sampler: Sampler) -> torch.Tensor:
    """log pi(y_t) - log ref(y_t) at the real positions of a draw (for the hats' knots)."""
    logits, ref_logits = sampler.logits(draw.features)
    tokens = draw.tokens.unsqueeze(-1)
    ratio = (torch.log_softmax(logits, -1).gather(-1, tokens) - torch.log_softmax(ref_logits, -1).gather(-1, tokens))
    return ratio.squeeze(-1)[draw.mask > 0]


def _cross_product(sums: Sequence[torch.Tensor], counts: Sequence[int]) -> float:
    """<mean_1, mean_2> of two independent halves: unbiased for |E|^2 (|mean|^2 would add the noise)."""
    if min(counts) <= 0:
        return 0.0
    return _dot(sums[0], sums[1]) / (counts[0] * counts[1])


def _dot(a: torch.Tensor, b: torch.Tensor) -> float:
    return torch.dot(a.flatten(), b.flatten()).item()


def _agreement(user: Sequence[torch.Tensor], reference: Sequence[torch.Tensor]) -> tuple[float | None, float, float]:
    """cos(E u, E r), |E u - E r| / |E r| and <E u, E r> / |E r|^2 from the means of two independent halves:
    each squared norm or inner product is a cross product of the halves, unbiased (the product of one half's
    mean with itself adds tr(Sigma) / n, which in a head of V x F entries swamps the means)."""
    rr = _dot(reference[0], reference[1])
    uu = _dot(user[0], user[1])
    ur = 0.5 * (_dot(user[0], reference[1]) + _dot(user[1], reference[0]))
    gap = _dot(user[0] - reference[0], user[1] - reference[1])
    if rr <= 0:
        return None, math.inf, math.nan
    cos = ur / math.sqrt(uu * rr) if uu > 0 else None
    return (None if cos is None else max(-1.0, min(1.0, cos))), math.sqrt(max(gap, 0.0) / rr), ur / rr


def _automatic_samples(rows: list[_Row], differences: dict, pilot: _Local, half: int, rev_squared: float) -> int:
    """The smallest N whose split test gives a bias of TARGET_RELATIVE_BIAS |REV| the expected z
    Z_BIASED + Z_POWER in every row: with n_A = n_B = N / 2 and u = mu + noise, E z = n_B^1/2 |mu|^2 /
    (tr(Sigma^2) / n_A)^1/2, so N = 2 (Z_BIASED + Z_POWER) tr(Sigma^2)^1/2 / |mu|^2. tr(Sigma^2) is measured on
    the pilot: the variance of x on its second half along its first half's mean, times that half's size. A row
    whose pilot z along that mean already exceeds Z_BIASED needs no more than the samples that take that z to
    Z_BIASED + Z_POWER (z grows as the square root of the samples)."""
    size = len(pilot.draw)
    if half < 2 or size - half < 2 or rev_squared <= 0:
        return max(MAX_SAMPLES.values())
    needed = MIN_SAMPLES
    target = (TARGET_RELATIVE_BIAS ** 2) * rev_squared
    for row in rows:
        if row.identical:
            continue
        vectors = differences[id(row)].vectors(row.beta)
        direction = pilot.head(vectors[:half], slice(None, half)) / half
        along = pilot.along(vectors[half:], direction, slice(half, None))
        noise = along.var().item() * half  # tr(Sigma^2)
        count = 2 * (Z_BIASED + Z_POWER) * math.sqrt(noise) / target
        z = along.mean().item() / math.sqrt(along.var().item() / along.numel()) if noise > 0 else 0.0
        if z > Z_BIASED:  # the pilot already shows a bias: enough samples for its z to reach Z_BIASED + Z_POWER
            count = min(count, 2 * half * ((Z_BIASED + Z_POWER) / z) ** 2)
        needed = max(needed, math.ceil(count))
    return needed


def _add_curves(curves: Curves, local: _Local, difference: _Difference, along: torch.Tensor) -> None:
    """Each sample's user and reference logits gradient at each position, projected on `along` [n, T, V]."""
    basis = local.basis
    on_score = along.gather(-1, basis.tokens).squeeze(-1) - torch.linalg.vecdot(along, basis.p)
    user = difference.user_score * on_score
    if difference.direct is not None:
        user = user + (difference.direct * along).sum(-1)
    curves.user.append(user)
    curves.reference.append((local.reference * along).sum(-1))
    curves.mask.append(local.mask)
    curves.weights.append(local.weights)


def _result(row: _Row, name: str, halves: tuple[int, int], reference_means: tuple[torch.Tensor, torch.Tensor],
            reference_value: float, fingerprinter: Fingerprinter, description: str) -> ResultRow:
    """The report row: the test, the detectable bias, the mean gradients' agreement and the fingerprint."""
    samples = sum(halves)
    differences = (row.direction_sum / halves[0], (row.total - row.direction_sum) / max(halves[1], 1))
    cos, relative_error, scale = _agreement([r + d for r, d in zip(reference_means, differences)], reference_means)
    rev_squared = _dot(*reference_means)
    projections = torch.cat(row.projections) if row.projections else torch.zeros(0)
    count = projections.numel()
    spread = projections.std().item() if count > 1 else 0.0
    if row.identical or spread == 0.0 or count < 2:
        z, p, skewness, detectable = 0.0, 1.0, 0.0, 0.0
    else:
        centred = projections - projections.mean()
        skewness = (centred.pow(3).mean() / centred.pow(2).mean().pow(1.5)).item()
        z = projections.mean().item() / (spread / math.sqrt(count))
        p = _edgeworth_p(z, skewness, count)
        rev = math.sqrt(rev_squared) if rev_squared > 0 else 0.0
        detectable = math.sqrt((Z_BIASED + Z_POWER) * spread / math.sqrt(count)) / rev if rev > 0 else math.inf
    biased = p < P_BIASED
    aggregation = Aggregation.BATCH_MEAN if row.plan.scalar_weight == "batch-token-mean" else Aggregation.SUM
    match, _ = identify_clamped(row.summed(), fingerprinter, rtol=row.plan.term.rtol, aggregation=aggregation,
                                placement=row.placement)
    return ResultRow(
        target=name, mode=dict(row.plan.term.mode), placement=row.placement,
        configuration=match.description if match is not None else "unrecognised (no catalog configuration matches "
                                                                   "per sample)",
        objective="MC", unbiased=not biased, cos_rev=cos, rel_err_rev=relative_error,
        value_bias=row.value_sum.item() / samples - reference_value,
        rule=(match.row.rule if match is not None and biased else None),
        fix=(match.row.fix if match is not None and biased else ""),
        same_gradient_as=[describe(twin) for twin in match.twins] if match is not None else [],
        monte_carlo={"samples": samples, "z": z, "p": p, "detectable": detectable, "skewness": skewness,
                     "scale": scale, "identical": row.identical, "policy": description},
    )
