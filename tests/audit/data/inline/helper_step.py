"""A training step whose KL goes through a helper of the same file, its parameters named for the old policy:
the step passes the reference's log-probs, so the term is k2 of the policy against the reference."""

import torch

SCALE = 0.5


def log_ratio(logprobs_new, logprobs_old):
    return logprobs_new - logprobs_old


def halved_square(values):
    return SCALE * values**2  # reads a module constant: not carried into a slice


def train(model, ref_model, optimizer, batches, beta=0.1):
    for input_ids, advantages in batches:
        logprobs_new = torch.log_softmax(model(input_ids).logits, -1).gather(-1, input_ids[..., None]).squeeze(-1)
        with torch.no_grad():
            ref_logits = ref_model(input_ids).logits
            logprobs_ref = torch.log_softmax(ref_logits, -1).gather(-1, input_ids[..., None]).squeeze(-1)
        kl = log_ratio(logprobs_new, logprobs_ref)
        policy_loss = -(advantages[:, None] * logprobs_new).sum(-1).mean()
        kl_loss = 0.5 * (kl**2).sum(-1).mean()
        logged = halved_square(kl).sum(-1).mean().item()  # noqa: F841 - logged, never differentiated
        loss = policy_loss + beta * kl_loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
