"""KL functions that fail in the ways check-grad must report in one line."""

import time

import torch


def raises_kl(logprobs, ref_logprobs):
    raise RuntimeError("the reference model is not loaded")


def wrong_shape_kl(logprobs, ref_logprobs):
    return (logprobs - ref_logprobs)[:, :2]


def nan_kl(logprobs, ref_logprobs):
    return torch.log(ref_logprobs - logprobs - 100.0)


def constant_kl(logprobs, ref_logprobs):
    return torch.zeros_like(ref_logprobs) * ref_logprobs


def not_a_tensor_kl(logprobs, ref_logprobs):
    return 0.5


def unbindable_kl(logprobs, ref_logprobs, frobnicate):
    return logprobs - ref_logprobs


def slow_kl(logprobs, ref_logprobs):
    time.sleep(600)
    return logprobs - ref_logprobs
