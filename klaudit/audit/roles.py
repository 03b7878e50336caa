"""What check-grad feeds each parameter of a KL function (`Role`) and the placements it audits: torch-free, so
that `klaudit lint` and the command line read them without importing the audit."""

from __future__ import annotations

from enum import Enum


class Role(str, Enum):
    """What a parameter receives (the value is the --bind spelling).

    TOKENS are the response's token ids only (no prompt), so code that slices a prompt+response
    tensor from the right (`input_ids[:, -T:]`) reads the right tokens; padding ids are arbitrary.
    ZEROS is [B, T], or [B] when the binding says `sequence_zeros` (a per-sequence score).
    """

    LOGPROBS = "logprobs"  # [B, T] log pi(y_t | h_t), differentiable
    REF_LOGPROBS = "ref_logprobs"  # [B, T] log ref(y_t | h_t)
    OLD_LOGPROBS = "old_logprobs"  # [B, T] log pi_old(y_t | h_t); makes the audit off-policy
    MASK = "mask"  # [B, T] 1.0 on response tokens
    LOGITS = "logits"  # [B, T, V] policy logits, differentiable
    REF_LOGITS = "ref_logits"  # [B, T, V] reference logits
    VOCAB_LOGPROBS = "vocab_logprobs"  # [B, T, V] log_softmax of the policy logits, differentiable
    REF_VOCAB_LOGPROBS = "ref_vocab_logprobs"  # [B, T, V] log_softmax of the reference logits
    LOG_RATIO = "log_ratio"  # [B, T] logp - ref, differentiable
    RATIO = "ratio"  # [B, T] exp(logp - old): the importance ratio to the sampling policy (on-policy: exp(logp - sg logp))
    TOKENS = "tokens"  # [B, T] int64 sampled token ids of the response; logprobs are gathered at them
    ZEROS = "zeros"  # [B, T] zeros: the task reward or advantage, zeroed so only the KL term remains
    COEF = "coef"  # a coefficient, set to 1.0
    OFF = "off"  # the coefficient of another regulariser (an entropy bonus), set to 0.0
    SWITCH = "switch"  # a string switch or a bool flag, audited once per value
    # a config object: its attributes are the mode's switch values (config.kl_penalty), KL coefficients 1, others None
    SWITCHES = "switches"
    DEFAULT = "default"  # keep the parameter's default
    NONE = "none"  # pass None


# What each `placement` choice audits: the result as a differentiated loss, as a detached reward with
# reward-to-go, both rows, or one combined row (the same values as a loss and, detached, as reward-to-go
# or future-only returns); "auto" lets the function's name, result and uses decide.
PLACEMENTS = {"auto": None, "loss": ("loss",), "reward": ("reward",), "both": ("loss", "reward"),
              "loss+reward": ("loss+reward",), "loss+future": ("loss+future",), "advantage": ("advantage",)}
