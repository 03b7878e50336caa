"""Imports a module that does not exist."""

import klaudit_no_such_module  # noqa: F401


def kl_loss(logprobs, ref_logprobs):
    return (logprobs - ref_logprobs).sum()
