"""KL code written with JAX or MLX arrays (Google's tunix, mlx-lm-lora) is read like torch's: `jnp.exp`,
`jax.lax.stop_gradient`, `jnp.take_along_axis`, `x.astype(...)`, `mx.sum(mask)` are the same operations.

Verdicts (kl-math.md section 8): k1 differentiated as a loss is row 2 (KL001, zero expected gradient),
k3 differentiated as a loss row 3 (KL002); a token-mean over the batch adds no 1/L weights (no KL007).

NumPy has no gradient: a module that computes with it and the standard library alone (rohitg00's lessons, fresh103,
whose GRPO step returns its loss to be printed) differentiates no loss; a KL it puts in a reward is still one (a
rollout buffer's, the ninety-fifth set's Q-RM).
"""

from __future__ import annotations

import pytest
from snippets import module_codes

JAX_GRPO = """\
    import jax
    import jax.numpy as jnp


    def compute_kl_divergence(per_token_logps, ref_per_token_logps, method="low_var_kl"):
        per_token_logps = per_token_logps.astype(jnp.float32)
        if method == "kl":
            kl = per_token_logps - ref_per_token_logps
        else:
            diff = ref_per_token_logps - per_token_logps
            kl = jnp.exp(diff) - diff - 1
        return kl


    def policy_loss_fn(model, train_example, kl_coef):
        logps = jax.nn.log_softmax(model(train_example.input_ids), axis=-1)
        per_token_logps = jnp.take_along_axis(logps, train_example.completion_ids[..., None], axis=-1)[..., 0]
        mask = train_example.completion_mask
        ratio = jnp.exp(per_token_logps - jax.lax.stop_gradient(per_token_logps))
        kl = compute_kl_divergence(per_token_logps, train_example.ref_per_token_logps, {method})
        per_token_loss = -ratio * train_example.advantages[:, None] + kl_coef * kl
        loss = jnp.sum(per_token_loss * mask) / jnp.sum(mask)
        return loss
    """


@pytest.mark.parametrize("method, codes", [('"kl"', [(21, "KL001")]), ('"low_var_kl"', [(21, "KL002")])])
def test_jax_arrays_are_read_like_torch_tensors(tmp_path, method, codes):
    assert module_codes(JAX_GRPO.format(method=method), tmp_path) == codes


MLX_GRPO = """\
    import mlx.core as mx


    def grpo_loss(token_log_probs, ref_token_log_probs, advantages, length_mask, beta):
        log_ratio = ref_token_log_probs - token_log_probs
        ratio = mx.exp(token_log_probs - mx.stop_gradient(token_log_probs))
        kl_div = mx.exp(log_ratio) - log_ratio - 1
        per_token_loss = -ratio * advantages.reshape(-1, 1) + beta * kl_div
        loss = (per_token_loss * length_mask).sum() / mx.maximum(length_mask.sum(), 1.0)
        return loss
    """


def test_mlx_arrays_are_read_like_torch_tensors(tmp_path):
    assert module_codes(MLX_GRPO, tmp_path) == [(8, "KL002")]


NUMPY_GRPO = """\
    {imports}


    def grpo_step(policy_logprobs, ref_logprobs, advantages, beta=0.01, clip_eps=0.2):
        ratios = np.exp(policy_logprobs - ref_logprobs)
        clipped = np.clip(ratios, 1 - clip_eps, 1 + clip_eps) * advantages
        policy_loss = -np.minimum(ratios * advantages, clipped).mean()
        kl = (policy_logprobs - ref_logprobs).mean()
        total_loss = policy_loss + beta * kl
        return {{"kl": float(kl), "total_loss": float(total_loss)}}
    """


@pytest.mark.parametrize("imports, codes", [
    ("import random\n    import numpy as np", []),  # NumPy and the standard library: no gradient anywhere
    ("import numpy as np\n    import torch", [(10, "KL001")]),  # torch tensors may be handed in: k1 as a loss (row 2)
    ("import numpy as np\n    from .model import policy", [(10, "KL001")]),  # so may the project's own modules
])
def test_numpy_and_the_standard_library_alone_differentiate_nothing(tmp_path, imports, codes):
    assert module_codes(NUMPY_GRPO.format(imports=imports), tmp_path) == codes
