"""`KLAUDIT_WATCH=verl,openrlhf`: the frameworks patched from the environment, for a launcher you cannot edit.

`activate` reads the environment and patches (klaudit.watch.patches.patch); klaudit.watch.autostart calls it:

    KLAUDIT_WATCH        comma-separated frameworks: verl, openrlhf
    KLAUDIT_WATCH_MODE   warn (default), raise or log
    KLAUDIT_WATCH_EVERY  audit every N-th call after the first (default: the first call only)
    KLAUDIT_WATCH_LOG    the JSON-lines file (default with mode log: klaudit-watch.jsonl)

Every Python process of an environment imports klaudit.watch.autostart at start-up, Ray workers included, once
`python -m klaudit.watch install` has written the one-line `klaudit-watch.pth` into its site-packages
(the line does nothing when KLAUDIT_WATCH is unset). A bad value is one line on stderr: a process never
fails to start because of the watch.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

PTH_NAME = "klaudit-watch.pth"
PTH_LINE = ("import os, sys; exec(\"try:\\n if os.environ.get('KLAUDIT_WATCH'): import klaudit.watch.autostart\\n"
            "except Exception as error: print('klaudit.watch: not started:', error, file=sys.stderr)\")\n")


def settings(environ: Mapping[str, str]) -> tuple[list[str], dict]:
    """The frameworks and the patch options the environment asks for; ValueError for a bad value."""
    frameworks = [name.strip().lower() for name in environ.get("KLAUDIT_WATCH", "").split(",") if name.strip()]
    options: dict = {"mode": environ.get("KLAUDIT_WATCH_MODE", "warn"), "log_file": environ.get("KLAUDIT_WATCH_LOG")}
    every = environ.get("KLAUDIT_WATCH_EVERY")
    if every:
        if not every.isdigit() or int(every) < 1:
            raise ValueError(f"KLAUDIT_WATCH_EVERY must be a positive integer, got {every!r}")
        options["every"] = int(every)
    return frameworks, options


def activate(environ: Mapping[str, str] = os.environ) -> list[str]:
    """Patch what the environment names; returns the sites. ValueError for an unknown framework or option."""
    from klaudit.watch.patches import FRAMEWORKS, patch
    from klaudit.watch.report import MODES, Reporter

    frameworks, options = settings(environ)
    unknown = [name for name in frameworks if name not in FRAMEWORKS]
    if unknown:
        raise ValueError(f"KLAUDIT_WATCH names {', '.join(unknown)}; known: {', '.join(FRAMEWORKS)}")
    if options["mode"] not in MODES:
        raise ValueError(f"KLAUDIT_WATCH_MODE must be one of {', '.join(MODES)}, got {options['mode']!r}")
    reporter = Reporter(options.pop("mode"), options.pop("log_file"))
    return [site for name in frameworks for site in patch(name, reporter=reporter, **options)]

