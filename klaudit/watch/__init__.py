"""Audit the KL gradient inside a real training run: `watch` a KL function, or `patch` a framework.

    from klaudit.watch import watch
    kl_loss = watch(kl_loss, placement="loss", every=100)     # or @watch(...) on its def

    import klaudit.watch
    klaudit.watch.patch("verl")                               # verl's own KL functions, in place

or, for a launcher you cannot edit, KLAUDIT_WATCH=verl,openrlhf in the environment (see
klaudit.watch.autostart). Each audited call names the configuration the term's gradient really
follows, with the words and fixes of `klaudit lint` and `klaudit check-grad`. The names load lazily:
torch is imported when a function is watched, not when a framework is only patched ahead of its import.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "watch": "klaudit.watch.hook", "patch": "klaudit.watch.patches", "unpatch": "klaudit.watch.patches",
    "FRAMEWORKS": "klaudit.watch.patches", "Reporter": "klaudit.watch.report",
    "KLGradientError": "klaudit.watch.report", "KLGradientWarning": "klaudit.watch.report",
    "Verdict": "klaudit.watch.verdict", "NotAuditable": "klaudit.watch.verdict",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'klaudit.watch' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
