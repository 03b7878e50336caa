"""The tensors a KL term sees: one batch of sampled responses, right-padded.

Every audit path (exact enumeration, fingerprint, check-grad) hands user code and catalog
surrogates the same `Batch`, so a loss callable is written once against these names.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Batch:
    """Per-token tensors of N responses of at most T tokens (V = vocabulary size).

    logprobs:     [N, T] log pi(y_t | h_t), differentiable w.r.t. the policy parameters.
    ref_logprobs: [N, T] log mu(y_t | h_t) of the reference, no gradient.
    mask:         [N, T] 1.0 on response tokens (EOS included), 0.0 on padding; rows are
                  right-padded, so token t of row n is real iff t < length[n].
    logits:       [N, T, V] policy logits at each position (differentiable), when available.
    ref_logits:   [N, T, V] reference logits, when available.
    old_logprobs: [N, T] log pi_old(y_t | h_t) of the behaviour policy, for off-policy audits.
    tokens:       [N, T] long, the sampled response token ids y_t (no prompt), arbitrary at padding;
                  logprobs[n, t] = log_softmax(logits)[n, t, tokens[n, t]] on real tokens.
    token_kl:     [N, T] the exact per-step KL_t(h_t) of logits against ref_logits, when given in
                  their place (catalog surrogates only: klaudit.audit.fingerprint differentiates
                  them with respect to it); user code never sees it.
    token_fkl:    [N, T] the exact per-step forward KL(ref_t || pi_t)(h_t), likewise.
    """

    logprobs: torch.Tensor
    ref_logprobs: torch.Tensor
    mask: torch.Tensor
    logits: torch.Tensor | None = None
    ref_logits: torch.Tensor | None = None
    old_logprobs: torch.Tensor | None = None
    tokens: torch.Tensor | None = None
    token_kl: torch.Tensor | None = None
    token_fkl: torch.Tensor | None = None

    @property
    def lengths(self) -> torch.Tensor:
        """[N] number of response tokens per row."""
        return self.mask.sum(-1)


def required(tensor: torch.Tensor | None, name: str) -> torch.Tensor:
    """A batch field this audit path needs (`name`, for the error), which optional fields may lack."""
    if tensor is None:
        raise ValueError(f"the batch has no {name}, which this audit reads")
    return tensor
