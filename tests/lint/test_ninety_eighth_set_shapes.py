"""Shapes of KL code met in the ninety-eighth fresh set.

facebookresearch/igpo trains a diffusion language model: `input_ids = torch.cat([prompt_ids, completion_ids], dim=1)`
joins a batch's prompts and completions along the token axis, then `input_ids.unsqueeze(0)` puts the mask-schedule
axis in front. `ids.unsqueeze(0)` was read as a batch of one sequence, so the batch's token mean of the k3 loss was
taken for one sequence's own (row 21, KL007). Ids joined along a later axis are a batch already.

strangeloopcanon/principle-induction trains with MLX: the exact per-step KL over the vocabulary from a log-softmax
written out, `logits - mx.log(mx.exp(logits).sum(axis=-1, keepdims=True))`, differentiated inside the loss closure
given to `nn.value_and_grad` (row 2, KL003; each response's token mean, row 21, KL007). The written-out log-sum-exp
was not read as one, so the KL was not seen. Its group weights, `mx.array(q, dtype=mx.float32).reshape(-1)`, were read
as `mx.reshape(-1)`: a method of what an array library returns was taken for the library's function, whose first
argument (here the shape, -1) is the array, and the negative weight turned the KL into a bonus (KL011).
"""

from __future__ import annotations

import pytest
from snippets import module_codes

DIFFUSION = """\
import torch


class Trainer:
    def compute_loss(self, model, inputs):
        prompt_ids, completion_ids = inputs["prompt_ids"], inputs["completion_ids"]
        mask = inputs["completion_mask"]
        input_ids = torch.cat([prompt_ids, completion_ids], {axis})
        input_ids = input_ids.unsqueeze(0)
        logits = model(input_ids).logits.squeeze(0)
        logps = torch.log_softmax(logits, -1).gather(-1, completion_ids[..., None]).squeeze(-1)
        ref = inputs["ref_per_token_logps"]
        kl = torch.exp(ref - logps) - (ref - logps) - 1
        per_token_loss = -logps * inputs["advantages"].unsqueeze(1) + 0.04 * kl
        return (per_token_loss * mask).sum() / mask.sum()
"""


@pytest.mark.parametrize("axis, codes", [
    ("dim=1", [(14, "KL002")]),  # a batch joined along its tokens: the batch's token mean, no 1/L weights
    ("1", [(14, "KL002")]),
    ("dim=0", [(14, "KL002"), (14, "KL007")]),  # one sequence's pieces end to end, then a batch of that one
])
def test_ids_joined_along_the_token_axis_are_a_batch_before_unsqueeze(tmp_path, axis, codes):
    assert module_codes(DIFFUSION.format(axis=axis), tmp_path) == codes


MLX = """\
import numpy as np


def group_weights(rewards, eta=1.0):
    r = np.asarray(rewards, dtype=np.float32)
    w = np.exp(eta * (r - r.max()))
    return w / (w.sum() + 1e-8)


def token_kl(model, ref_model, tokens, labels):
    import mlx.core as mx
    logits, ref_logits = model(tokens)[:, :-1, :], ref_model(tokens)[:, :-1, :]
    logp = {log_softmax}
    logq = {ref_log_softmax}
    mask = (labels[:, 1:] != -100).astype(mx.float32)
    kl = (mx.exp(logp) * (logp - logq)).sum(axis=-1)
    return (kl * mask).sum(axis=1) / mask.sum(axis=1)


def seq_logprob(model, tokens, labels):
    import mlx.core as mx
    logits = model(tokens)[:, :-1, :]
    logp = {log_softmax}
    chosen = mx.take_along_axis(logp, mx.maximum(labels[:, 1:], 0)[..., None], axis=-1)[..., 0]
    return (chosen * (labels[:, 1:] != -100)).sum(axis=1)


def step(model, ref_model, tokens, labels, rewards, optimizer, beta=0.05):
    import mlx.core as mx
    import mlx.nn as nn
    q = mx.array(group_weights(rewards), dtype=mx.float32){reshape}

    def loss_fn():
        nll = -seq_logprob(model, tokens, labels)
        kl = token_kl(model, ref_model, tokens, labels)
        return (nll * q).sum() + beta * (kl * q).sum()

    loss, grads = nn.value_and_grad(model, loss_fn)()
    optimizer.update(model, grads)
"""


@pytest.mark.parametrize("log_softmax", [
    "logits - mx.log(mx.exp(logits).sum(axis=-1, keepdims=True))",
    "logits - mx.log(mx.sum(mx.exp(logits), axis=-1, keepdims=True))",
    "logits - mx.log(mx.exp(logits).sum(-1, keepdims=True))",
    "logits - mx.logsumexp(logits, axis=-1, keepdims=True)",
])
@pytest.mark.parametrize("reshape", ["", ".reshape(-1)", ".squeeze(-1)"])
def test_an_exact_kl_loss_of_a_written_out_log_softmax_under_mlx(tmp_path, log_softmax, reshape):
    source = MLX.format(log_softmax=log_softmax, ref_log_softmax=log_softmax.replace("logits", "ref_logits"),
                        reshape=reshape)
    assert module_codes(source, tmp_path) == [(36, "KL003"), (36, "KL007")]


def test_exponentials_summed_over_another_axis_are_no_normaliser(tmp_path):
    """Summed over the positions (axis 1), or without keeping the axis the logits are divided along, the log of the
    exponentials normalises nothing over the vocabulary: no log-probs over it, no verdict (a term left undetermined,
    the informational KL100, at most, as for `torch.logsumexp(logits, -1)` without keepdim)."""
    for spelled in ("logits - mx.log(mx.exp(logits).sum(axis=1, keepdims=True))",
                    "logits - mx.log(mx.exp(logits).sum(axis=-1))"):
        source = MLX.format(log_softmax=spelled, ref_log_softmax=spelled.replace("logits", "ref_logits"), reshape="")
        assert [code for _, code in module_codes(source, tmp_path) if code != "KL100"] == []
