"""Executable catalog rows: the per-sequence surrogate loss a `Config` describes.

One builder for every row. For a configuration with a loss estimator k^L and a reward
estimator k^R, the surrogate of sequence y is

    S(y) = sign * [ sum_t w_t k^L_t  +  sum_t c_t * logp_t * sg(G_t) ]

where k^L_t is differentiated (pathwise part), G_t is the return of the detached rewards
k^R_u (u >= t, u > t, all u, all u over the length L, or u = t), and w_t, c_t are the sampling weights: 1 on-policy
or uncorrected off-policy, sg(pi_t / pi_old_t) for token importance ratios, and the prefix
products w_{1:t} = prod_{i<=t} pi_i / pi_old_i for per-decision importance sampling (w_{<t}
for the exact per-step KL, which depends on the prefix only). Aggregation is not applied
here: the exact engine weighs each sequence by h(L), and check-grad's fingerprint uses S
per sample. Every tensor is masked, so padding never contributes.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from klaudit.audit.batch import Batch
from klaudit.catalog import Config, Estimator, Position, Returns, Sampling

Surrogate = Callable[[Batch], torch.Tensor]

_LOW_VAR_LOG_RATIO_CLAMP = 20.0  # verl clamps log(ref / pi) to [-20, 20] ...
_LOW_VAR_VALUE_CLAMP = 10.0  # ... and the k3 value to [-10, 10]
_OVER_VOCABULARY = (Estimator.FULL, Estimator.FULL_FORWARD)  # a function of the prefix h_t alone, not of y_t


def estimator_values(estimator: Estimator, log_ratio: torch.Tensor, batch: Batch) -> torch.Tensor:
    """Per-token (or per-sequence) values of `estimator` at delta = log pi - log ref, differentiable.

    k1 = delta, k2 = delta^2 / 2, k3 = e^-delta - 1 + delta, k3-reversed = e^delta - 1 - delta, abs = |delta|,
    logp*k1 = logp * delta (an undetached k1 times the log-prob it multiplies), p*k1 = pi(y) * delta (the summand
    of KL_t at the sampled token); straight-through k1+/k3+
    carry the value of k1/k3 and the gradient of k2; ratio*k3 = exp(logp - sg(logp)) * k3; full is
    KL_t(h_t) = sum_v pi(v|h) log(pi(v|h) / ref(v|h)) from the logits (or the batch's token_kl), full-fwd
    FKL_t(h_t) = sum_v ref(v|h) log(ref(v|h) / pi(v|h)) (or the batch's token_fkl).
    """
    if estimator is Estimator.K1:
        return log_ratio
    if estimator is Estimator.K2:
        return 0.5 * log_ratio.square()
    if estimator is Estimator.K3:
        return torch.expm1(-log_ratio) + log_ratio
    if estimator is Estimator.K3_REVERSED:
        return torch.expm1(log_ratio) - log_ratio
    if estimator is Estimator.LOW_VAR_KL:
        clamped = (-log_ratio).clamp(-_LOW_VAR_LOG_RATIO_CLAMP, _LOW_VAR_LOG_RATIO_CLAMP)
        return (torch.expm1(clamped) - clamped).clamp(-_LOW_VAR_VALUE_CLAMP, _LOW_VAR_VALUE_CLAMP)
    if estimator is Estimator.ABS:
        return log_ratio.abs()
    if estimator in (Estimator.K1_ST, Estimator.K3_ST):
        k2 = 0.5 * log_ratio.square()
        value = estimator_values(Estimator.K1 if estimator is Estimator.K1_ST else Estimator.K3, log_ratio, batch)
        return k2 - k2.detach() + value.detach()
    if estimator is Estimator.RATIO_K3:
        score_weight = torch.exp(batch.logprobs - batch.logprobs.detach())
        return score_weight * estimator_values(Estimator.K3, log_ratio, batch)
    if estimator is Estimator.LOGP_K1:
        return batch.logprobs * log_ratio
    if estimator is Estimator.PROB_K1:
        return batch.logprobs.exp() * log_ratio
    if estimator is Estimator.FULL and batch.token_kl is not None:
        return batch.token_kl
    if estimator is Estimator.FULL_FORWARD and batch.token_fkl is not None:
        return batch.token_fkl
    if estimator in _OVER_VOCABULARY:
        if batch.logits is None or batch.ref_logits is None:
            raise ValueError("the exact per-step KL needs the policy and reference logits")
        policy_logp = torch.log_softmax(batch.logits, dim=-1)
        ref_logp = torch.log_softmax(batch.ref_logits, dim=-1)
        if estimator is Estimator.FULL_FORWARD:
            return (ref_logp.exp() * (ref_logp - policy_logp)).sum(-1)
        return (policy_logp.exp() * (policy_logp - ref_logp)).sum(-1)
    raise ValueError(f"unknown estimator {estimator!r}")


def _reverse_cumsum(values: torch.Tensor) -> torch.Tensor:
    """rtg(x)_t = sum_{u >= t} x_u along the last axis."""
    return values.flip(-1).cumsum(-1).flip(-1)


def _returns(rewards: torch.Tensor, returns: Returns, mask: torch.Tensor) -> torch.Tensor:
    """The coefficient of logp_t built from detached per-token rewards (`mask`: the response's tokens)."""
    if returns is Returns.TO_GO:
        return _reverse_cumsum(rewards)
    if returns is Returns.FUTURE:
        return _reverse_cumsum(rewards) - rewards
    if returns is Returns.SEQUENCE:
        return rewards.sum(-1, keepdim=True).expand_as(rewards)
    if returns is Returns.SEQUENCE_MEAN:
        return (rewards.sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1.0)).expand_as(rewards)
    if returns is Returns.LOCAL:
        return rewards
    raise ValueError(f"unknown returns mode {returns!r}")


def _last_token_mask(mask: torch.Tensor) -> torch.Tensor:
    """1 at each row's final real token (rows are right-padded)."""
    following = torch.cat([mask[:, 1:], torch.zeros_like(mask[:, :1])], dim=-1)
    return mask * (1 - following)


def _importance_weights(batch: Batch, sampling: Sampling) -> tuple[torch.Tensor, torch.Tensor]:
    """Detached weights (through token t, before token t) that move samples of pi_old to pi."""
    ones = torch.ones_like(batch.mask)
    if sampling in (Sampling.ON_POLICY, Sampling.OFF_POLICY):
        return ones, ones
    if batch.old_logprobs is None:
        raise ValueError(f"sampling {sampling.value!r} needs old_logprobs in the batch")
    log_token_ratio = ((batch.logprobs - batch.old_logprobs) * batch.mask).detach()
    if sampling is Sampling.TOKEN_IS:
        token_ratio = log_token_ratio.exp()
        return token_ratio, token_ratio
    through = log_token_ratio.cumsum(-1)
    return through.exp(), (through - log_token_ratio).exp()


def build_surrogate(config: Config) -> Surrogate:
    """The per-sequence surrogate S [N] of `config`, as a function of a `Batch`."""

    def surrogate(batch: Batch) -> torch.Tensor:
        mask = batch.mask
        log_ratio = (batch.logprobs - batch.ref_logprobs) * mask
        if config.position in (Position.SEQUENCE, Position.SEQUENCE_MEAN):
            if config.loss is None or config.reward is not None or config.sampling is not Sampling.ON_POLICY:
                raise ValueError("sequence-level estimators are audited as on-policy losses only")
            summed = log_ratio.sum(-1)
            if config.position is Position.SEQUENCE_MEAN:
                summed = summed / mask.sum(-1).clamp(min=1.0)
            if config.loss is Estimator.LOGP_K1:  # the response's log-prob times its k1
                return config.sign * (batch.logprobs * mask).sum(-1) * summed
            return config.sign * estimator_values(config.loss, summed, batch)
        positions = _last_token_mask(mask) if config.position is Position.LAST else mask
        weight_through, weight_before = _importance_weights(batch, config.sampling)

        def weight_for(estimator: Estimator) -> torch.Tensor:
            return weight_before if estimator in _OVER_VOCABULARY else weight_through

        total = torch.zeros_like(mask[:, 0])
        if config.loss is not None:
            loss_values = estimator_values(config.loss, log_ratio, batch) * positions
            total = total + (weight_for(config.loss) * loss_values).sum(-1)
        if config.reward is not None:
            rewards = (estimator_values(config.reward, log_ratio, batch) * positions).detach()
            if config.sampling is Sampling.PER_DECISION_IS:
                rewards = weight_for(config.reward) * rewards
            if config.returns is Returns.NOWHERE:  # added to the loss as it is: its value, and no gradient
                total = total + rewards.sum(-1)
            else:
                coefficient = _returns(rewards, config.returns, mask)
                score_weight = weight_through if config.sampling is Sampling.TOKEN_IS else 1.0
                total = total + (score_weight * batch.logprobs * mask * coefficient).sum(-1)
        return config.sign * total

    return surrogate
