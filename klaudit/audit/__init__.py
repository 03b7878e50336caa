"""Runtime audit of KL gradients (needs torch; imported only when used).

    report = klaudit.audit.check(my_kl_loss)            # or placement="loss" / "reward" / "both"
    assert report.unbiased, report.to_text()

`check` binds the callable's parameters by name (override with bind={"param": "role"}), audits
every string-switch value, and returns the same `Report` the `klaudit check-grad` command prints.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Mapping
from enum import Enum

__all__ = ["PLACEMENTS", "TORCH_MISSING", "Role", "check", "torch_importable"]

TORCH_MISSING = ("check-grad runs your KL code under torch, which cannot be imported here: "
                 "pip install 'klaudit[audit]' (on a machine without a GPU, first "
                 "pip install torch --index-url https://download.pytorch.org/whl/cpu; "
                 "with CUDA the default torch wheel is the one)")


def torch_importable() -> bool:
    """Whether `import torch` can find torch, asked without importing it (a second or two saved)."""
    try:
        return importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):  # ValueError: sys.modules["torch"] is None, i.e. blocked
        return False

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
    TOKENS = "tokens"  # [B, T] int64 sampled token ids of the response; logprobs are gathered at them
    ZEROS = "zeros"  # [B, T] zeros: the task reward or advantage, zeroed so only the KL term remains
    COEF = "coef"  # a coefficient, set to 1.0
    SWITCH = "switch"  # a string switch or a bool flag, audited once per value
    DEFAULT = "default"  # keep the parameter's default
    NONE = "none"  # pass None


# What each `placement` choice audits: the result as a differentiated loss, as a detached reward with
# reward-to-go, both rows, or one combined row (the same values as a loss and, detached, as reward-to-go
# or future-only returns); "auto" lets the function's name, result and uses decide.
PLACEMENTS = {"auto": None, "loss": ("loss",), "reward": ("reward",), "both": ("loss", "reward"),
              "loss+reward": ("loss+reward",), "loss+future": ("loss+future",)}


def check(fn: Callable, placement: str = "auto", *, bind: Mapping[str, str] | None = None, device: str = "cpu"):
    """Audit `fn` in this process; returns a klaudit.audit.report.Report (see `.unbiased`, `.to_text()`).

    placement: "auto" (a loss function or scalar result as a loss, any other result both ways),
    "loss", "reward", "both", "loss+reward" or "loss+future" (see PLACEMENTS). Bad input (unbindable parameters, a failing or shapeless result)
    is recorded in `report.errors`, so `report.unbiased` is then False. `device` ("cpu", "cuda", ...): where
    the audit's policies live, and so every tensor `fn` receives.
    """
    from klaudit.audit import bind as binding
    from klaudit.audit.measure import ModeNotImplemented, TermError, audit
    from klaudit.audit.report import Report

    if placement not in PLACEMENTS:
        raise ValueError(f"placement must be one of {', '.join(PLACEMENTS)}, got {placement!r}")
    name = getattr(fn, "__qualname__", getattr(fn, "__name__", repr(fn)))
    try:
        overrides = binding.parse_overrides([f"{key}={value}" for key, value in (bind or {}).items()])
        bound = binding.bind(fn, overrides, switch_values=binding.switch_literals(fn))
        rows, notes = audit(fn, bound, name=name, placements=PLACEMENTS[placement], device=device)
    except (binding.BindError, TermError, ModeNotImplemented) as error:
        return Report([], [f"{name}: {error}" if isinstance(error, binding.BindError) else str(error)])
    return Report(rows, [], notes)
