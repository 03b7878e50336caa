"""Shapes of KL code met in the twenty-ninth fresh set's review.

Verdicts (kl-math.md section 8): exp(logp - ref) - 1 - (logp - ref) as a loss is k3 with the ratio the wrong way
round (row 5b, KL009); trained for several optimizer steps on one rollout with no importance weight on the KL term
it is row 22 (KL008).
"""

from __future__ import annotations

from snippets import module_codes

# ainaomotayo/nanochat-jax's GRPO (Flax NNX): train_step generates, takes the old and the reference log-probs, then
# calls a jitted static method whose loss closure calls the static GRPO loss and whose single optimizer.update is
# the one step on those samples
NNX_CLOSURE = """\
import jax
import jax.numpy as jnp
from flax import nnx


class GRPOTrainer:
    @staticmethod
    def _grpo_loss(policy_log_probs, old_log_probs, ref_log_probs, advantages, mask, kl_beta):
        ratio = jnp.exp(policy_log_probs - old_log_probs)
        policy_loss = -(jnp.minimum(ratio * advantages, jnp.clip(ratio, 0.8, 1.2) * advantages) * mask).sum()
        log_ratio_kl = policy_log_probs - ref_log_probs
        kl = ((jnp.exp(log_ratio_kl) - 1.0 - log_ratio_kl) * mask).sum()
        total_loss = (policy_loss + kl_beta * kl) / mask.sum()
        return total_loss

    def train_step(self, prompts):
        input_ids, mask, advantages = self.engine.generate(prompts)
        old_log_probs = jax.lax.stop_gradient(self._compute_log_probs(self.policy_model, input_ids))
        ref_log_probs = jax.lax.stop_gradient(self._compute_log_probs(self.ref_model, input_ids))
        return self._update_step(self.policy_model, self.optimizer, input_ids, old_log_probs, ref_log_probs,
                                 advantages, mask, self.kl_beta)

    @staticmethod
    def _compute_log_probs(model, input_ids):
        logits = model(input_ids)
        log_probs_all = jax.nn.log_softmax(logits[:, :-1, :], axis=-1)
        return jnp.take_along_axis(log_probs_all, input_ids[:, 1:, None], axis=-1)[:, :, 0]

    @staticmethod
    @nnx.jit
    def _update_step(model, optimizer, input_ids, old_log_probs, ref_log_probs, advantages, mask, kl_beta):
        def loss_fn(model):
            logits = model(input_ids)
            log_probs_all = jax.nn.log_softmax(logits[:, :-1, :], axis=-1)
            policy_log_probs = jnp.take_along_axis(log_probs_all, input_ids[:, 1:, None], axis=-1)[:, :, 0]
            return GRPOTrainer._grpo_loss(policy_log_probs, old_log_probs, ref_log_probs, advantages, mask, kl_beta)

        loss, grads = nnx.value_and_grad(loss_fn)(model)
        optimizer.update(model, grads)
        return loss
"""


def test_a_loss_called_from_the_closure_of_the_one_update_per_rollout_is_on_policy(tmp_path):
    """The loss's single caller is a closure of `_update_step`, whose one update follows the draw in `train_step`:
    the ratio to the old log-probs is 1 at the step. Before, the closure's call was not seen (nor a static method
    called on its class), and the ratio read as older samples: KL008 beside the right KL009."""
    assert module_codes(NNX_CLOSURE, tmp_path) == [(13, "KL009")]


def test_the_same_loss_under_several_updates_per_rollout_is_off_policy(tmp_path):
    several = NNX_CLOSURE.replace("""        loss, grads = nnx.value_and_grad(loss_fn)(model)
        optimizer.update(model, grads)""", """        for _ in range(4):
            loss, grads = nnx.value_and_grad(loss_fn)(model)
            optimizer.update(model, grads)""")
    assert module_codes(several, tmp_path) == [(13, "KL008"), (13, "KL009")]


# ShashankChandgude's PPO preference trainer: one helper decorated @torch.no_grad() computes each response's exact
# per-step KL to the reference; the rollout puts it in the return, and the update calls it again on the mini-batch
# (picked by index_select) and adds it to the loss, where it carries no gradient (row 1c, KL001)
NO_GRAD_HELPER = """\
import torch


class Trainer:
    @torch.no_grad()
    def _resp_token_kl_mean(self, ids):
        logp = torch.log_softmax(self.model(ids).logits, dim=-1)
        logq = torch.log_softmax(self.ref_model(ids).logits, dim=-1)
        kl_tok = (logp.exp() * (logp - logq)).sum(dim=-1)
        return kl_tok.mean(dim=-1)

    def rollout(self, ids, scores):
        kls = self._resp_token_kl_mean(ids)
        rewards = scores - self.beta * kls
        return rewards

    def update(self, ids, old_logprobs, advantages, index):
        mb_ids = ids.index_select(0, index)
        mb_old = old_logprobs.index_select(0, index)
        new_lps = self.model(mb_ids).logits.log_softmax(-1).gather(-1, mb_ids[..., None]).squeeze(-1).mean(-1)
        kl_current = self._resp_token_kl_mean(mb_ids).mean()
        ratios = torch.exp(new_lps - mb_old)
        policy_loss = -(ratios * advantages.index_select(0, index)).mean()
        policy_loss = policy_loss + self.beta * kl_current
        self.opt.zero_grad()
        policy_loss.backward()
        self.opt.step()
"""


def test_a_kl_helper_decorated_no_grad_adds_nothing_to_the_loss(tmp_path):
    """Before: the helper's result was made without a gradient, never cut, so no row 1c; the same helper's use in
    the rollout's reward was taken for the training use of which the loss's was a logged copy; and index_select
    lost the old log-probs, so the ratio hid the KL term in an unknown form. Now the loss's KL is row 1c. (The
    helper's `kl_tok.mean(dim=-1)` over the batch's positions divides every response by the same width: no KL007.)"""
    assert module_codes(NO_GRAD_HELPER, tmp_path) == [(14, "KL004"), (24, "KL001")]


# wisnunugroho21/nugie-jax-nemotron-3-nano's GRPO loss (JAX): the model's logits named with the model after the
# word, then the sampled tokens' log-probs taken along the vocabulary axis; k3 to the reference as a loss (row 3)
LOGITS_NAMED_AFTER = """\
import jax
import jax.numpy as jnp


def grpo_loss(model, token_ids, masks, advantages, ref_log_probs, old_log_probs, kl_coeff=0.04):
    logits_policy = model(token_ids[:, :-1])
    log_pi_policy = jax.nn.log_softmax(logits_policy, axis=-1)
    log_p_policy = jnp.take_along_axis(log_pi_policy, token_ids[:, 1:, None], axis=-1)[:, :, 0]
    ratio = jnp.exp(log_p_policy - old_log_probs)
    pg_loss = -jnp.minimum(ratio * advantages[:, None], jnp.clip(ratio, 0.8, 1.2) * advantages[:, None])
    delta = ref_log_probs - log_p_policy
    kl_pen = jnp.exp(delta) - delta - 1.0
    total_loss = pg_loss + kl_coeff * kl_pen
    return (total_loss * masks[:, 1:]).sum() / masks[:, 1:].sum()
"""


def test_logits_named_with_the_model_after_the_word_are_the_policys(tmp_path):
    """Before, `logits_policy` named nothing the lint knew, so the model's output was unknown: silent. The ratio to
    the old log-probs in a loss no code of the module calls is read as older samples (row 22, KL008), which the
    project's four updates per rollout make right."""
    assert module_codes(LOGITS_NAMED_AFTER, tmp_path) == [(13, "KL002"), (13, "KL008")]



# a hand-written decoding loop draws each token with torch.multinomial over the policy's probabilities; the caller
# trains once on what it returns
DECODED_BY_HAND = """\
import torch
import torch.nn.functional as F


def decode_group(policy, prompt, n):
    tokens, lps = prompt, []
    for _ in range(n):
        with torch.no_grad():
            logits = policy(tokens)[:, -1, :]
        probs = F.softmax(logits, dim=-1)
        token = torch.multinomial(probs, 1)
        lps.append(F.log_softmax(logits, dim=-1).gather(1, token))
        tokens = torch.cat([tokens, token], dim=1)
    return tokens, torch.cat(lps, dim=1)


def train(policy, ref_model, optimizer, prompts, advantage, beta):
    for prompt in prompts:
        tokens, old_logprobs = decode_group(policy, prompt, 16)
        logprobs = F.log_softmax(policy(tokens).logits, -1).gather(-1, tokens[..., None]).squeeze(-1)
        with torch.no_grad():
            ref_logprobs = F.log_softmax(ref_model(tokens).logits, -1).gather(-1, tokens[..., None]).squeeze(-1)
        ratio = torch.exp(logprobs - old_logprobs)
        log_ratio = ref_logprobs - logprobs
        loss = (-ratio * advantage + beta * (torch.exp(log_ratio) - log_ratio - 1)).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
"""


def test_tokens_drawn_by_multinomial_in_a_called_function_are_fresh_samples(tmp_path):
    """One step per call of the decoding loop: the ratio to the old log-probs is 1 at the step (row 3 only).
    Before, torch.multinomial drew nothing, so the ratio read as older samples: KL008 beside KL002."""
    assert module_codes(DECODED_BY_HAND, tmp_path) == [(25, "KL002")]


# torchtune's chunked GRPO loss: a method returns each chunk's per-token loss unreduced; `forward`, which calls it,
# sums each sequence's tokens over the chunks and divides by that sequence's token count (row 21 beside row 3)
REDUCED_BY_THE_CALLER = """\
import torch


class GRPOWithChunkedOutputLoss(torch.nn.Module):
    def compute_per_token_quantities(self, pi_logits_chunk, targets_chunk, ref_logprobs_chunk, advantages):
        pi_logprobs_chunk = torch.log_softmax(pi_logits_chunk, -1).gather(-1, targets_chunk[..., None]).squeeze(-1)
        per_token_kl = torch.exp(ref_logprobs_chunk - pi_logprobs_chunk) - (ref_logprobs_chunk - pi_logprobs_chunk) - 1
        per_token_policy_loss = torch.exp(pi_logprobs_chunk - pi_logprobs_chunk.detach()) * advantages[:, None]
        per_token_loss = -(per_token_policy_loss - self.kl_coeff * per_token_kl)
        return per_token_loss, per_token_kl

    def forward(self, pi_logits, targets, ref_logprobs, advantages, padding_masks):
        num_chunks = len(pi_logits)
        targets_chunks = targets.chunk(num_chunks, dim=1)
        ref_logprobs_chunks = ref_logprobs.chunk(num_chunks, dim=1)
        masks_chunks = padding_masks.chunk(num_chunks, dim=1)
        total_loss_sum = torch.zeros(advantages.numel())
        total_token_count = torch.zeros(advantages.numel())
        for chunk_idx in range(num_chunks):
            per_token_loss_chunk, _ = self.compute_per_token_quantities(
                pi_logits[chunk_idx], targets_chunks[chunk_idx], ref_logprobs_chunks[chunk_idx], advantages)
            total_loss_sum += (per_token_loss_chunk * masks_chunks[chunk_idx]).sum(dim=1)
            total_token_count += masks_chunks[chunk_idx].sum(dim=1)
        loss = (total_loss_sum / total_token_count).mean()
        return loss
"""


def test_a_per_token_loss_returned_unreduced_takes_its_callers_reduction(tmp_path):
    """The helper returns the per-token loss unreduced; the reduction that decides its weights is its caller's, a
    per-sequence token mean. Before, the helper's return was taken for the reduction (a token sum): KL002 alone,
    once the chunk's logits were read as the policy's."""
    assert module_codes(REDUCED_BY_THE_CALLER, tmp_path) == [(9, "KL002"), (9, "KL007")]
