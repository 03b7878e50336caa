"""Name a KL term's configuration from one batch: its per-sample gradient against the catalog's.

The gradient of any KL term with respect to the batch's logits, g[n, t, v], holds everything it
does to every sample (the log-probs are log_softmax(logits)[y]). Each catalog row is turned into
its surrogate by `build_surrogate` and weighted per sequence by its aggregation (1, or 1/L_n for a
per-sequence token-mean); when the user's g equals c * g_row for some c > 0 on every real position
of every sample (relative error below the tolerance), the term *is* that configuration on this
batch, with no sampling noise. Rows that agree per sample (k2 loss, k1+/k3+, same-token k1 reward
...) form one class; the first in catalog order names it. A sum and a constant or batch-wide divisor
differ only by scale on one batch, so `aggregation` says which of those the caller knows applies.

A catalog surrogate reads the logits only through the sampled token's log-probability and the
exact per-step KL, so in each row (n, t) its gradient is a (e_y - p) + b p (log p - log q - KL_t):
two numbers per row instead of V (`RowBasis`). The catalog is held in that form; the log-probs a
term sees are a leaf of their own, so a term of the log-probs alone has the gradient s (e_y - p),
also two numbers per row (`SpanGradient`), and is compared with every row exactly without a
vocabulary-sized tensor. A term that reads the logits is screened through inner products with
the two directions, and only the rows that pass are rebuilt over the vocabulary and compared entry
by entry. On a real vocabulary (V ~ 150k) this is what keeps the fingerprint to seconds.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from klaudit.audit.batch import Batch, required
from klaudit.audit.surrogates import build_surrogate
from klaudit.catalog import CATALOG, Aggregation, Config, Objective, Position, Row, Sampling, classify, without_gradient
from klaudit.describe import describe

MATCH_RTOL_FLOAT64 = 1e-6
MATCH_RTOL_FLOAT32 = 1e-4  # a term computed in float32 (e.g. `.float()` inside it) carries ~1e-7 rounding


@dataclass(frozen=True)
class Match:
    """The catalog configuration a term's per-sample gradient equals, up to the factor `scale` > 0."""

    config: Config
    row: Row
    scale: float
    relative_error: float
    twins: tuple[Config, ...] = ()  # the other configurations with this same per-sample gradient

    @property
    def objective(self) -> Objective:
        """The objective the exact audit must find for this configuration (kl-math.md sections 5 and 8).

        A row's objective holds for its own aggregation; a token-sum row weighted by 1/L follows no
        target, except k1 (and the summed log-ratio) whose score-only gradient becomes grad E[1/L].
        An on-policy row that gives the verdict of a configuration sampled off-policy (its estimator
        is the first thing wrong) does not give its objective: stale samples follow none (row 22).
        """
        if self.config.sampling is not Sampling.ON_POLICY and self.row.config != self.config:
            return Objective.OTHER
        if self.config.aggregation is not Aggregation.SEQ_MEAN or self.row.config == self.config:
            return self.row.objective
        zero_under_sum = classify(dataclasses.replace(self.config, aggregation=Aggregation.SUM)).objective
        if zero_under_sum is Objective.ZERO:
            return Objective.LEN
        return Objective.OTHER

    @property
    def description(self) -> str:
        """The configuration in the words the lint uses for it (klaudit.describe)."""
        return describe(self.config)


def _token_logprobs(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[token] per position."""
    return torch.log_softmax(logits, dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def leaf_batches(tokens: torch.Tensor, mask: torch.Tensor, logits: torch.Tensor, ref_logits: torch.Tensor,
                 old_logprobs: torch.Tensor | None = None) -> Callable[[], Batch]:
    """A factory of Batches whose `logits` and `logprobs` are fresh, independent leaves with gradient at each
    call (`split_leaves`); the log-probs, theirs and the reference's, are computed once. The leaves share
    memory with the given tensors (a real vocabulary's logits are 40 MB): autograd refuses an in-place change
    of a leaf that needs a gradient, so a callable cannot alter them unnoticed."""
    logits, ref_logits = logits.detach(), ref_logits.detach()
    logprobs = _token_logprobs(logits, tokens)
    ref_logprobs = _token_logprobs(ref_logits, tokens)
    mask = mask.detach().to(logits.dtype)
    old_logprobs = None if old_logprobs is None else old_logprobs.detach()

    def fresh() -> Batch:
        batch = Batch(logprobs=logprobs, ref_logprobs=ref_logprobs.clone(), mask=mask.clone(), logits=logits,
                      ref_logits=ref_logits, old_logprobs=old_logprobs, tokens=tokens)
        return split_leaves(batch)[0]

    return fresh


def split_leaves(batch: Batch) -> tuple[Batch, torch.Tensor, torch.Tensor]:
    """The batch with its log-probs and its logits as two independent leaves with gradient, and the leaves.

    The log-probs are log_softmax(logits)[y], so by the chain rule a term's gradient with respect to the
    logits is a (e_y - p) + D, a = d term / d logprobs and D = d term / d logits along the term's own
    reading of them: `gradient_parts` takes both without building a log_softmax graph over the vocabulary.
    The batch holds a copy of the log-probs leaf (one an in-place change of the callable may alter)."""
    logprobs = batch.logprobs.detach().requires_grad_(True)
    logits = required(batch.logits, "logits").detach().requires_grad_(True)
    return dataclasses.replace(batch, logprobs=logprobs.clone(), logits=logits), logprobs, logits


FAR_LOG_RATIO = 25.0  # |log pi - log ref| of the far batch: beyond the clamps trainers put on KL terms


def far_batch(batch_factory: Callable[[], Batch]) -> Callable[[], Batch]:
    """The batch with the sampled tokens moved far from the reference: on alternate positions of each response
    the policy's logit of the sampled token, else the reference's, is lowered by FAR_LOG_RATIO, so that the
    log-ratios reach about -25 and +25 nats; padding keeps its values (a term that sums every position, mask or
    not, `(logp - ref).sum(-1)`, adds nothing there on the fingerprint batch either). A term that equals a
    configuration on the fingerprint batch and not here changes only where the policy strays far: it is clamped
    (KL010)."""
    batch = batch_factory()
    logits = required(batch.logits, "logits").detach().clone()
    ref_logits = required(batch.ref_logits, "ref_logits").detach().clone()
    token_ids = required(batch.tokens, "tokens")
    tokens = token_ids.unsqueeze(-1)
    count, horizon = token_ids.shape
    positions = torch.arange(horizon, device=tokens.device)
    alternate = (positions.unsqueeze(0) + torch.arange(count, device=tokens.device).unsqueeze(1)) % 2 == 0
    response = batch.mask.bool()
    lowered = torch.where((alternate & response).unsqueeze(-1), logits.gather(-1, tokens) - FAR_LOG_RATIO,
                          logits.gather(-1, tokens))
    logits.scatter_(-1, tokens, lowered)
    ref_lowered = torch.where((~alternate & response).unsqueeze(-1), ref_logits.gather(-1, tokens) - FAR_LOG_RATIO,
                              ref_logits.gather(-1, tokens))
    ref_logits.scatter_(-1, tokens, ref_lowered)
    return leaf_batches(token_ids, batch.mask, logits, ref_logits, batch.old_logprobs)


NEAR_SHRINK = 0.05  # the near batch's log-ratios, relative to the fingerprint batch's


def near_batch(batch_factory: Callable[[], Batch]) -> Callable[[], Batch]:
    """The batch with the policy's logits moved towards the reference's, its log-ratios NEAR_SHRINK
    times as large: below the clamps trainers use, a clamped estimator shows its unclamped form."""
    batch = batch_factory()
    ref_logits = required(batch.ref_logits, "ref_logits").detach()
    logits = ref_logits + NEAR_SHRINK * (required(batch.logits, "logits").detach() - ref_logits)
    return leaf_batches(required(batch.tokens, "tokens"), batch.mask, logits, ref_logits)


def _weighted(config: Config) -> Callable[[Batch], torch.Tensor]:
    """The configuration's surrogate summed over the batch, per sequence by 1/L under a seq-token-mean."""
    surrogate = build_surrogate(config)
    per_length = config.aggregation is Aggregation.SEQ_MEAN

    def weighted(batch: Batch) -> torch.Tensor:
        values = surrogate(batch)
        return (values / batch.lengths).sum() if per_length else values.sum()

    return weighted


def gradient_parts(objective: Callable[[Batch], torch.Tensor],
                   batch_factory: Callable[[], Batch]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """d objective / d logits as (a [N, T], D [N, T, V] or None), float64 and zero at padding: the gradient
    is a (e_y - p) + D, a through the log-probs and D through the logits read directly (None when the term
    does not read them): a term of the log-probs alone costs nothing per vocabulary entry."""
    batch, logprobs, logits = split_leaves(batch_factory())
    mask = batch.mask.to(torch.float64)
    value = objective(batch)
    if not value.requires_grad:
        return torch.zeros_like(mask), None
    on_logprobs, on_logits = torch.autograd.grad(value, [logprobs, logits], allow_unused=True)
    score = torch.zeros_like(mask) if on_logprobs is None else on_logprobs.to(torch.float64) * mask
    direct = None if on_logits is None else on_logits.to(torch.float64) * mask.unsqueeze(-1)
    return score, direct


def with_score(direct: torch.Tensor | None, score: torch.Tensor, probs: torch.Tensor,
               tokens: torch.Tensor) -> torch.Tensor:
    """D + a (e_y - p) [N, T, V] float64, with D None read as zero: the full logits gradient of
    `gradient_parts` given p = softmax(logits) and the sampled tokens y [N, T]."""
    gradient = torch.zeros_like(probs) if direct is None else direct.clone()
    gradient.addcmul_(probs, score.unsqueeze(-1), value=-1)
    return gradient.scatter_add_(-1, tokens.unsqueeze(-1), score.unsqueeze(-1))


def logits_gradient(objective: Callable[[Batch], torch.Tensor], batch_factory: Callable[[], Batch]) -> torch.Tensor:
    """d objective(batch) / d logits [N, T, V] in float64, zero at padding positions."""
    score, direct = gradient_parts(objective, batch_factory)
    batch = batch_factory()
    probs = torch.softmax(required(batch.logits, "logits").detach().to(torch.float64), -1)
    return with_score(direct, score, probs, required(batch.tokens, "tokens"))


class RowBasis:
    """The three directions of a catalog surrogate's gradient in each row (n, t) of a batch's logits.

    With p = softmax(logits), q = softmax(ref_logits) and y the sampled token, a surrogate S that reads
    the logits only through log p_y, KL_t = sum_v p log(p / q) and FKL_t = sum_v q log(q / p) has, in row
    (n, t), the gradient
        a (e_y - p) + b p (log p - log q - KL_t) + c (p - q),   a, b, c = dS / d log p_y, d KL_t, d FKL_t.
    Coefficients are held as [3, N, T] (a, b, c), the per-row Gram matrix of the directions as [N, T, 3, 3].
    """

    def __init__(self, batch_factory: Callable[[], Batch]):
        batch = batch_factory()
        with torch.no_grad():
            log_p = torch.log_softmax(required(batch.logits, "logits").detach().to(torch.float64), -1)
            log_q = torch.log_softmax(required(batch.ref_logits, "ref_logits").to(torch.float64), -1)
            self.probs = log_p.exp()
            ref_probs = log_q.exp()
            log_ratio = log_p - log_q
            kl = (self.probs * log_ratio).sum(-1)  # as estimator_values computes Estimator.FULL
            forward_kl = -(ref_probs * log_ratio).sum(-1)  # ... and Estimator.FULL_FORWARD
            self.directions = (self.probs * (log_ratio - kl.unsqueeze(-1)), self.probs - ref_probs)
            self.tokens = required(batch.tokens, "tokens").unsqueeze(-1)
            self.mask = batch.mask.to(torch.float64)
            self.gram = self._gram()
        self.reduced = Batch(logprobs=batch.logprobs.detach(), ref_logprobs=batch.ref_logprobs, mask=batch.mask,
                             old_logprobs=batch.old_logprobs, tokens=batch.tokens,
                             token_kl=kl.to(batch.logprobs.dtype), token_fkl=forward_kl.to(batch.logprobs.dtype))

    def _gram(self) -> torch.Tensor:
        """<u_i, u_j> [N, T, 3, 3] of u_0 = e_y - p and the two materialised directions."""
        at_token = self.probs.gather(-1, self.tokens).squeeze(-1)
        along_token = [direction.gather(-1, self.tokens).squeeze(-1) - (self.probs * direction).sum(-1)
                        for direction in self.directions]
        first = [1 - 2 * at_token + self.probs.square().sum(-1), *along_token]
        rows = [first] + [[along_token[i]] + [torch.linalg.vecdot(self.directions[i], other)
                                              for other in self.directions] for i in range(len(self.directions))]
        return torch.stack([torch.stack(row, -1) for row in rows], -2)

    def coefficients(self, objective: Callable[[Batch], torch.Tensor]) -> torch.Tensor:
        """(a, b, c) [3, N, T] float64 of a catalog objective, zero at padding (an objective that reads the
        logits otherwise than through log p_y, KL_t and FKL_t must not be given)."""
        leaves = [tensor.clone().requires_grad_(True) for tensor in (self.reduced.logprobs, required(
            self.reduced.token_kl, "token_kl"), required(self.reduced.token_fkl, "token_fkl"))]
        value = objective(dataclasses.replace(self.reduced, logprobs=leaves[0], token_kl=leaves[1],
                                              token_fkl=leaves[2]))
        if not value.requires_grad:
            return torch.zeros((3, *self.mask.shape), dtype=torch.float64, device=self.mask.device)
        grads = torch.autograd.grad(value, leaves, allow_unused=True)
        return torch.stack([torch.zeros_like(self.mask) if grad is None else grad.to(torch.float64) * self.mask
                            for grad in grads])

    def squared_norm(self, coefficients: torch.Tensor) -> torch.Tensor:
        """|a (e_y - p) + b d + c f|^2 summed over the rows, for (a, b, c) [3, N, T]."""
        return torch.einsum("int,ntij,jnt->", coefficients, self.gram, coefficients)

    def projections(self, gradient: torch.Tensor) -> torch.Tensor:
        """<g, e_y - p>, <g, d>, <g, f> [3, N, T] of a gradient g [N, T, V]."""
        along_token = gradient.gather(-1, self.tokens).squeeze(-1) - torch.linalg.vecdot(gradient, self.probs)
        return torch.stack([along_token, *(torch.linalg.vecdot(gradient, direction) for direction in self.directions)])

    def residual_norm(self, gradient: torch.Tensor, scale: float, coefficients: torch.Tensor) -> float:
        """|g - scale (a (e_y - p) + b d + c f)| for a gradient g [N, T, V], computed entry by entry."""
        a, *others = coefficients
        residual = gradient.clone()
        for direction, coefficient in zip(self.directions, others):
            residual.addcmul_(direction, coefficient.unsqueeze(-1), value=-scale)
        residual.addcmul_(self.probs, a.unsqueeze(-1), value=scale)
        residual.scatter_add_(-1, self.tokens, -scale * a.unsqueeze(-1))
        return torch.linalg.vector_norm(residual).item()


class SpanGradient:
    """A term's logits gradient that lies in the span of RowBasis's directions: s (e_y - p) in each row, the
    gradient of a term that reads the logits only through the sampled token's log-prob. Its projections and
    residuals are exact functions of the [N, T] coefficients and the basis's Gram matrix, so nothing is
    computed per vocabulary entry: |g - c (a (e_y - p) + b d + c' f)|^2 = sum over rows of the Gram form of
    (s - c a, -c b, -c c'), which, unlike |g|^2 - <g, h>^2 / |h|^2, does not cancel as the residual goes to zero."""

    def __init__(self, basis: RowBasis, score: torch.Tensor):
        self.basis, self.score = basis, score
        self.coefficients = torch.stack([score, torch.zeros_like(score), torch.zeros_like(score)])

    def nonzero(self) -> bool:
        return bool(self.score.any())

    def squared_norm(self) -> float:
        return self.basis.squared_norm(self.coefficients).item()

    def projections(self) -> torch.Tensor:
        return torch.einsum("nti,nt->int", self.basis.gram[..., 0, :], self.score)

    def residual_norm(self, scale: float, coefficients: torch.Tensor) -> float:
        return math.sqrt(max(self.basis.squared_norm(self.coefficients - scale * coefficients).item(), 0.0))


class FullGradient:
    """A term's logits gradient [N, T, V] held entry by entry (a term that reads the logits themselves)."""

    def __init__(self, basis: RowBasis, gradient: torch.Tensor):
        self.basis, self.gradient = basis, gradient

    def nonzero(self) -> bool:
        return bool(self.gradient.any())

    def squared_norm(self) -> float:
        return torch.linalg.vector_norm(self.gradient).item() ** 2

    def projections(self) -> torch.Tensor:
        return self.basis.projections(self.gradient)

    def residual_norm(self, scale: float, coefficients: torch.Tensor) -> float:
        return self.basis.residual_norm(self.gradient, scale, coefficients)


# A configuration is compared exactly with a term's gradient u (entry by entry, or by its coefficients for a
# SpanGradient) only when its relative error estimated from inner products, |u|^2 - <u, g>^2 / |g|^2 in float64 (a
# cancellation that leaves about 1e-7 of the relative error, for the 5M-entry sums of a real vocabulary), is below
# SCREEN_FACTOR * rtol + SCREEN_SLACK: a configuration the exact comparison would accept is never screened out.
SCREEN_FACTOR = 2.0
SCREEN_SLACK = 1e-6


def _screened(user_squared: float, user_dot: float, squared: float, rtol: float) -> bool:
    """Whether the exact comparison could accept the configuration: a positive multiple whose estimated
    relative error is under the screen."""
    if squared <= 0.0 or user_dot <= 0.0:
        return False
    scale = user_dot / squared
    residual = max(user_squared - user_dot * scale, 0.0)
    return math.sqrt(residual / (scale * scale * squared)) < SCREEN_FACTOR * rtol + SCREEN_SLACK


def candidate_configs(off_policy: bool) -> list[Config]:
    """Catalog configurations a term on this batch can be, each also with per-sequence 1/L weights."""
    configs: list[Config] = []
    for row in CATALOG:
        config = row.config
        if config is None or config.aggregation not in (Aggregation.SUM, Aggregation.SEQ_MEAN):
            continue  # divide-by-constant and batch token-mean are a sum up to scale on one batch
        if without_gradient(config):
            continue  # no per-sample gradient: a term without one is told by autograd, not by the fingerprint
        if off_policy:
            if config.position in (Position.SEQUENCE, Position.SEQUENCE_MEAN):
                continue
            if config.sampling is Sampling.ON_POLICY:
                config = dataclasses.replace(config, sampling=Sampling.OFF_POLICY)
        elif config.sampling is not Sampling.ON_POLICY:
            continue
        for aggregation in (Aggregation.SUM, Aggregation.SEQ_MEAN):
            candidate = dataclasses.replace(config, aggregation=aggregation)
            if candidate not in configs:
                configs.append(candidate)
    return configs


class Fingerprinter:
    """The catalog's per-sample gradients on one batch, computed once (as RowBasis coefficients) and matched
    against many terms."""

    def __init__(self, batch_factory: Callable[[], Batch], *, off_policy: bool = False):
        self.batch_factory = batch_factory
        self.off_policy = off_policy
        self.basis = RowBasis(batch_factory)
        self._near: Fingerprinter | None = None
        self._far: Fingerprinter | None = None
        self._configs = candidate_configs(off_policy)
        self._coefficients = torch.stack(self._per_config())  # [configs, 3, N, T]
        self._squared = [self.basis.squared_norm(coefficients).item() for coefficients in self._coefficients]
        # configurations with the very same coefficients share one comparison (index of the first); grouped by
        # one sort of the rows, so that a GPU is asked once rather than once per pair
        _, groups = torch.unique(self._coefficients.flatten(1), dim=0, return_inverse=True)
        first: dict[int, int] = {}
        self._same_as = [first.setdefault(group, index) for index, group in enumerate(groups.tolist())]

    def _per_config(self) -> list[torch.Tensor]:
        """RowBasis coefficients [3, N, T] of each candidate configuration. A seq-token-mean one is its
        token-sum twin's divided by each sequence's length (the surrogates do not read the aggregation, and 1/L
        is a constant factor per sequence), so only the token-sum ones are differentiated."""
        lengths = self.basis.mask.sum(-1, keepdim=True)
        computed: dict[Config, torch.Tensor] = {}
        coefficients = []
        for config in self._configs:
            summed = dataclasses.replace(config, aggregation=Aggregation.SUM)
            if config.aggregation is Aggregation.SEQ_MEAN and summed in computed:
                coefficients.append(computed[summed] / lengths)
            else:
                computed[config] = self.basis.coefficients(_weighted(config))
                coefficients.append(computed[config])
        return coefficients

    def near(self) -> Fingerprinter:
        """The fingerprinter of `near_batch` (on-policy only: old log-probs cannot be moved along)."""
        if self._near is None:
            self._near = Fingerprinter(near_batch(self.batch_factory), off_policy=self.off_policy)
        return self._near

    def far(self) -> Fingerprinter:
        """The fingerprinter of `far_batch`."""
        if self._far is None:
            self._far = Fingerprinter(far_batch(self.batch_factory), off_policy=self.off_policy)
        return self._far

    def user_gradient(self, objective: Callable[[Batch], torch.Tensor]) -> SpanGradient | FullGradient:
        """The term's logits gradient on this batch, in the row basis when the term reads only log-probs."""
        score, direct = gradient_parts(objective, self.batch_factory)
        if direct is None:
            return SpanGradient(self.basis, score)
        return FullGradient(self.basis, with_score(direct, score, self.basis.probs, self.basis.tokens.squeeze(-1)))

    def _fits(self, objective: Callable[[Batch], torch.Tensor], rtol: float, indices: list[int]) -> dict:
        """{index: (scale, relative error)} of the configurations at `indices` whose gradient the term's is a
        positive multiple of, to `rtol`: screened through inner products, then compared exactly (by the
        coefficients of the row basis, or entry by entry)."""
        user = self.user_gradient(objective)
        if not user.nonzero():
            return {}
        chosen = torch.tensor(indices, device=self._coefficients.device)
        user_dots = (self._coefficients[chosen] * user.projections()).sum((1, 2, 3)).tolist()
        user_squared = user.squared_norm()
        fits: dict[int, tuple[float, float]] = {}
        compared: dict[int, tuple[float, float] | None] = {}
        for index, user_dot in zip(indices, user_dots):
            squared = self._squared[index]
            if not _screened(user_squared, user_dot, squared, rtol):
                continue
            first = self._same_as[index]
            if first not in compared:
                scale = user_dot / squared
                error = user.residual_norm(scale, self._coefficients[index]) / (
                    scale * math.sqrt(squared))
                compared[first] = (scale, error) if error < rtol else None
            fit = compared[first]
            if fit is not None:
                fits[index] = fit
        return fits

    def identify(self, objective: Callable[[Batch], torch.Tensor], *, rtol: float = MATCH_RTOL_FLOAT64,
                 aggregation: Aggregation = Aggregation.SUM, placement: str = "") -> Match | None:
        """The first catalog configuration whose per-sample gradient is a positive multiple of the term's,
        with the others that have that gradient too (which one the code spells, the gradient cannot tell):
        for a detached placement ("reward", "advantage"), a configuration with the values in the reward alone
        first, as the code puts them there (k1 on its own token's score, not the k2 loss of the same gradient).

        `aggregation` names the unit-weight class (SUM unless the caller knows the term divides by a
        constant or by the batch's token count).
        """
        matches = []
        for index, (scale, error) in sorted(self._fits(objective, rtol, list(range(len(self._configs)))).items()):
            config = self._configs[index]
            if config.aggregation is Aggregation.SUM:
                config = dataclasses.replace(config, aggregation=aggregation)
            matches.append(Match(config, classify(config), scale, error))
        if not matches:
            return None
        if placement in ("reward", "advantage"):
            matches.sort(key=lambda match: match.config.loss is not None)  # stable: the catalog's order otherwise
        return dataclasses.replace(matches[0], twins=tuple(match.config for match in matches[1:]))

    def holds(self, objective: Callable[[Batch], torch.Tensor], config: Config, *, rtol: float) -> bool:
        """Whether the term has the configuration's per-sample gradient (up to a positive factor) here."""
        return bool(self._fits(objective, rtol, [self._configs.index(config)]))


def holds_far_from_reference(objective: Callable[[Batch], torch.Tensor], match: Match, fingerprinter: Fingerprinter,
                             *, rtol: float = MATCH_RTOL_FLOAT64) -> bool:
    """Whether the term still has the matched configuration's per-sample gradient on `far_batch`."""
    config = match.config
    if config.aggregation is not Aggregation.SEQ_MEAN:
        config = dataclasses.replace(config, aggregation=Aggregation.SUM)
    return fingerprinter.far().holds(objective, config, rtol=rtol)


def sample_rows(probabilities: torch.Tensor, size: int, seed: int) -> torch.Tensor:
    """`size` row indices drawn i.i.d. from `probabilities` [N] (seeded)."""
    generator = torch.Generator().manual_seed(seed)
    return torch.multinomial(probabilities.detach().to(torch.float64).cpu(), size, replacement=True,
                             generator=generator)


def cached_forward(model: Any, input_ids: torch.Tensor, cache: Any, **options: Any) -> tuple[Any, Any]:
    """The output of a transformers model on `input_ids` after the prefix held in `cache` (None: no prefix),
    and the cache that continues it (None when the model keeps none). transformers renamed the argument and
    the output field `past_key_values` to `cache`; the model's signature says which it takes."""
    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    output = model(input_ids=input_ids, use_cache=True, **{name: cache}, **options)
    return output, getattr(output, name, None)


def batch_from_model(model_dir: str, *, size: int = 4, horizon: int = 8, device: str = "cpu",
                     seed: int = 0) -> Callable[[], Batch]:
    """A fingerprint batch from a causal LM on local disk: sampled responses, its logits, a reference.

    The reference logits are the model's plus seeded N(0, 1) noise: the fingerprint is an identity
    per sample, true for any reference, so no second model is needed.
    """
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True).to(device)
    model.eval()
    generator = torch.Generator(device="cpu").manual_seed(seed)
    vocabulary = model.get_input_embeddings().num_embeddings
    start = model.config.bos_token_id
    start = start if isinstance(start, int) and 0 <= start < vocabulary else 0
    tokens = torch.full((size, 1), start, dtype=torch.long, device=device)
    with torch.no_grad():
        output, cache = cached_forward(model, tokens, None)
        for step in range(horizon):
            logits = output.logits[:, -1, :].to(torch.float64).cpu()
            next_tokens = torch.multinomial(torch.softmax(logits, -1), 1, generator=generator).to(device)
            tokens = torch.cat([tokens, next_tokens], dim=1)
            if step + 1 < horizon:  # the next token's logits from the cached prefix (from the whole prefix if none)
                output, cache = (cached_forward(model, next_tokens, cache) if cache is not None
                                 else cached_forward(model, tokens, None))
        logits = model(input_ids=tokens[:, :-1]).logits.to(torch.float64)
    response = tokens[:, 1:]
    noise = torch.randn(logits.shape, generator=generator, dtype=torch.float64).to(device)
    ref_logits = logits + noise
    lengths = torch.randint(horizon // 2, horizon + 1, (size,), generator=generator).to(device)
    mask = (torch.arange(horizon, device=device).unsqueeze(0) < lengths.unsqueeze(-1)).to(torch.float64)
    return leaf_batches(response, mask, logits, ref_logits)
