"""A trainer module whose top-level imports do not import here; only `fused_kl` uses one of them."""

import klaudit_fixture_absent_cluster as cluster
from klaudit_fixture_absent_kernels.ops import fused_log_ratio

import fragile_dependency  # noqa: F401 - installed, but raises when imported
from fragile_dependency.adapters import LoraConfig  # noqa: F401

HAVE_KERNELS = bool(fused_log_ratio)


@cluster.remote
class Worker(cluster.Actor):
    """Decorated and derived from stubs at import; never used by the KL code."""

    def step(self):
        return cluster.get(self)


def k1_kl_reward(logprobs, ref_logprobs):
    """k1, detached for the reward: uses none of the stubbed modules."""
    return (logprobs - ref_logprobs).detach()


def fused_kl(logprobs, ref_logprobs):
    """Uses the stubbed kernel: the audit must fail and name it."""
    return fused_log_ratio(logprobs, ref_logprobs)
