"""Name a KL term's configuration from one batch: its per-sample gradient against the catalog's.

The logits of the batch are a leaf tensor and the log-probs are computed from them, so the
gradient of any KL term with respect to the logits, g[n, t, v], holds everything it does to
every sample. Each catalog row is turned into its surrogate by `build_surrogate` and weighted
per sequence by its aggregation (1, or 1/L_n for a per-sequence token-mean); when the user's
g equals c * g_row for some c > 0 on every real position of every sample (relative error below
the tolerance), the term *is* that configuration on this batch, with no sampling noise. Rows
that agree per sample (k2 loss, k1+/k3+, same-token k1 reward ...) form one class; the first
in catalog order names it. A sum and a constant or batch-wide divisor differ only by scale on
one batch, so `aggregation` says which of those the caller knows applies.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import torch

from klaudit.audit.batch import Batch
from klaudit.audit.exact import relerr
from klaudit.audit.surrogates import build_surrogate
from klaudit.catalog import CATALOG, Aggregation, Config, Objective, Position, Row, Sampling, classify
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


def leaf_batch(tokens: torch.Tensor, mask: torch.Tensor, logits: torch.Tensor, ref_logits: torch.Tensor,
               old_logprobs: torch.Tensor | None = None) -> Batch:
    """A Batch whose `logits` is a fresh leaf with gradient and whose log-probs are computed from it."""
    leaf = logits.detach().clone().requires_grad_(True)

    def token_logprobs(values: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(values, dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)

    return Batch(
        logprobs=token_logprobs(leaf),
        ref_logprobs=token_logprobs(ref_logits.detach()),
        mask=mask.detach().to(leaf.dtype),
        logits=leaf,
        ref_logits=ref_logits.detach(),
        old_logprobs=None if old_logprobs is None else old_logprobs.detach(),
        tokens=tokens,
    )


FAR_LOG_RATIO = 25.0  # |log pi - log ref| of the far batch: beyond the clamps trainers put on KL terms


def far_batch(batch_factory: Callable[[], Batch]) -> Callable[[], Batch]:
    """The batch with the sampled tokens moved far from the reference: on alternate positions the
    policy's logit of the sampled token, else the reference's, is lowered by FAR_LOG_RATIO, so that the
    log-ratios reach about -25 and +25 nats. A term that equals a configuration on the fingerprint batch
    and not here changes only where the policy strays far: it is clamped (KL010)."""
    batch = batch_factory()
    logits, ref_logits = batch.logits.detach().clone(), batch.ref_logits.detach().clone()
    tokens = batch.tokens.unsqueeze(-1)
    alternate = (torch.arange(tokens.shape[1]).unsqueeze(0) + torch.arange(tokens.shape[0]).unsqueeze(1)) % 2 == 0
    lowered = torch.where(alternate.unsqueeze(-1), logits.gather(-1, tokens) - FAR_LOG_RATIO,
                          logits.gather(-1, tokens))
    logits.scatter_(-1, tokens, lowered)
    ref_lowered = torch.where(alternate.unsqueeze(-1), ref_logits.gather(-1, tokens),
                              ref_logits.gather(-1, tokens) - FAR_LOG_RATIO)
    ref_logits.scatter_(-1, tokens, ref_lowered)
    return lambda: leaf_batch(batch.tokens, batch.mask, logits, ref_logits, batch.old_logprobs)


NEAR_SHRINK = 0.05  # the near batch's log-ratios, relative to the fingerprint batch's


def near_batch(batch_factory: Callable[[], Batch]) -> Callable[[], Batch]:
    """The batch with the policy's logits moved towards the reference's, its log-ratios NEAR_SHRINK
    times as large: below the clamps trainers use, a clamped estimator shows its unclamped form."""
    batch = batch_factory()
    ref_logits = batch.ref_logits.detach()
    logits = ref_logits + NEAR_SHRINK * (batch.logits.detach() - ref_logits)
    return lambda: leaf_batch(batch.tokens, batch.mask, logits, ref_logits)


def _positive_multiple(user: torch.Tensor, reference: torch.Tensor) -> tuple[float, float] | None:
    """(c, relative error) of the least-squares c with user ~ c * reference, when c > 0."""
    squared = torch.dot(reference, reference).item()
    if squared == 0.0:
        return None
    scale = torch.dot(user, reference).item() / squared
    return None if scale <= 0.0 else (scale, relerr(user, scale * reference))


def _weighted(config: Config) -> Callable[[Batch], torch.Tensor]:
    """The configuration's surrogate summed over the batch, per sequence by 1/L under a seq-token-mean."""
    surrogate = build_surrogate(config)
    per_length = config.aggregation is Aggregation.SEQ_MEAN

    def weighted(batch: Batch) -> torch.Tensor:
        values = surrogate(batch)
        return (values / batch.lengths).sum() if per_length else values.sum()

    return weighted


def logits_gradient(objective: Callable[[Batch], torch.Tensor], batch_factory: Callable[[], Batch]) -> torch.Tensor:
    """d objective(batch) / d logits [N, T, V] in float64, zero at padding positions."""
    batch = batch_factory()
    value = objective(batch)
    if not value.requires_grad:
        return torch.zeros_like(batch.logits, dtype=torch.float64)
    (gradient,) = torch.autograd.grad(value, batch.logits, allow_unused=True)
    if gradient is None:
        return torch.zeros_like(batch.logits, dtype=torch.float64)
    return gradient.to(torch.float64) * batch.mask.to(torch.float64).unsqueeze(-1)


def candidate_configs(off_policy: bool) -> list[Config]:
    """Catalog configurations a term on this batch can be, each also with per-sequence 1/L weights."""
    configs: list[Config] = []
    for row in CATALOG:
        config = row.config
        if config is None or config.aggregation not in (Aggregation.SUM, Aggregation.SEQ_MEAN):
            continue  # divide-by-constant and batch token-mean are a sum up to scale on one batch
        if off_policy:
            if config.position is Position.SEQUENCE:
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
    """The catalog's per-sample gradients on one batch, computed once and matched against many terms."""

    def __init__(self, batch_factory: Callable[[], Batch], *, off_policy: bool = False):
        self.batch_factory = batch_factory
        self.off_policy = off_policy
        self._gradients: list[tuple[Config, torch.Tensor]] = []
        self._near: Fingerprinter | None = None
        for config in candidate_configs(off_policy):
            self._gradients.append((config, logits_gradient(_weighted(config), batch_factory)))

    def near(self) -> Fingerprinter:
        """The fingerprinter of `near_batch` (on-policy only: old log-probs cannot be moved along)."""
        if self._near is None:
            self._near = Fingerprinter(near_batch(self.batch_factory), off_policy=self.off_policy)
        return self._near

    def identify(self, objective: Callable[[Batch], torch.Tensor], *, rtol: float = MATCH_RTOL_FLOAT64,
                 aggregation: Aggregation = Aggregation.SUM) -> Match | None:
        """The first catalog configuration whose per-sample gradient is a positive multiple of the term's,
        with the others that have that gradient too (which one the code spells, the gradient cannot tell).

        `aggregation` names the unit-weight class (SUM unless the caller knows the term divides by a
        constant or by the batch's token count).
        """
        user = logits_gradient(objective, self.batch_factory)
        if not bool(user.any()):
            return None
        flat = user.flatten()
        matches = []
        for config, gradient in self._gradients:
            fit = _positive_multiple(flat, gradient.flatten())
            if fit is not None and fit[1] < rtol:
                scale, error = fit
                if config.aggregation is Aggregation.SUM:
                    config = dataclasses.replace(config, aggregation=aggregation)
                matches.append(Match(config, classify(config), scale, error))
        if not matches:
            return None
        return dataclasses.replace(matches[0], twins=tuple(match.config for match in matches[1:]))


def holds_far_from_reference(objective: Callable[[Batch], torch.Tensor], match: Match,
                             batch_factory: Callable[[], Batch], *, rtol: float = MATCH_RTOL_FLOAT64) -> bool:
    """Whether the term still has the matched configuration's per-sample gradient on `far_batch`."""
    far = far_batch(batch_factory)
    config = match.config
    if config.aggregation is not Aggregation.SEQ_MEAN:
        config = dataclasses.replace(config, aggregation=Aggregation.SUM)
    fit = _positive_multiple(logits_gradient(objective, far).flatten(), logits_gradient(_weighted(config), far).flatten())
    return fit is not None and fit[1] < rtol


def sample_rows(probabilities: torch.Tensor, size: int, seed: int) -> torch.Tensor:
    """`size` row indices drawn i.i.d. from `probabilities` [N] (seeded)."""
    generator = torch.Generator().manual_seed(seed)
    return torch.multinomial(probabilities.detach().to(torch.float64).cpu(), size, replacement=True,
                             generator=generator)


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
        for _ in range(horizon):
            logits = model(input_ids=tokens).logits[:, -1, :].to(torch.float64).cpu()
            next_tokens = torch.multinomial(torch.softmax(logits, -1), 1, generator=generator).to(device)
            tokens = torch.cat([tokens, next_tokens], dim=1)
        logits = model(input_ids=tokens[:, :-1]).logits.to(torch.float64)
    response = tokens[:, 1:]
    noise = torch.randn(logits.shape, generator=generator, dtype=torch.float64).to(device)
    ref_logits = logits + noise
    lengths = torch.randint(horizon // 2, horizon + 1, (size,), generator=generator)
    mask = (torch.arange(horizon).unsqueeze(0) < lengths.unsqueeze(-1)).to(torch.float64).to(device)
    return lambda: leaf_batch(response, mask, logits, ref_logits)
