"""Runtime audit of KL gradients (needs torch; imported only when used).

    report = klaudit.audit.check(my_kl_loss)            # or placement="loss" / "reward" / "both"
    assert report.unbiased, report.to_text()

`check` binds the callable's parameters by name (override with bind={"param": "role"}), audits
every string-switch value, and returns the same `Report` the `klaudit check-grad` command prints.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Mapping

from klaudit.audit.roles import PLACEMENTS, Role

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

def check(fn: Callable, placement: str = "auto", *, bind: Mapping[str, str] | None = None, device: str = "cpu"):
    """Audit `fn` in this process; returns a klaudit.audit.report.Report (see `.unbiased`, `.to_text()`).

    placement: "auto" (a loss function or scalar result as a loss, any other result both ways),
    "loss", "reward", "both", "loss+reward", "loss+future" or "advantage" (see PLACEMENTS). Bad input (unbindable parameters, a failing or shapeless result)
    is recorded in `report.errors`, so `report.unbiased` is then False. `device` ("cpu", "cuda", ...): where
    the audit's policies live, and so every tensor `fn` receives.
    """
    from klaudit.audit import bind as binding
    from klaudit.audit.measure import ModeNotImplemented, TermError, audit
    from klaudit.audit.report import Report

    if placement not in PLACEMENTS:
        raise ValueError(f"placement must be one of {', '.join(PLACEMENTS)}, got {placement!r}")
    name = binding.callable_name(fn)
    try:
        overrides = binding.parse_overrides([f"{key}={value}" for key, value in (bind or {}).items()])
        bound = binding.bind_with_switches(fn, overrides)
        rows, notes = audit(fn, bound, name=name, placements=PLACEMENTS[placement], device=device)
    except (binding.BindError, TermError, ModeNotImplemented) as error:
        return Report([], [f"{name}: {error}" if isinstance(error, binding.BindError) else str(error)])
    return Report(rows, [], notes)
