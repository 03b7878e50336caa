"""Where a watch's verdicts go: a Python warning and a log line, an exception, or a JSON-lines file.

Each configuration is reported once per reporter (a function in one placement reads the same at every
audited call). A failure of the audit itself is one warning, once, whatever the mode: the training
must never stop because klaudit could not read a call.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import warnings
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the reporter itself needs no torch: a framework is patched before it imports torch
    from klaudit.watch.verdict import Verdict

MODES = ("warn", "raise", "log")
DEFAULT_LOG_FILE = "klaudit-watch.jsonl"
logger = logging.getLogger("klaudit.watch")


class KLGradientWarning(UserWarning):
    """A watched KL term's gradient is not the gradient of KL(pi || ref)."""


class KLGradientError(RuntimeError):
    """Raised by a watch in mode="raise" when the watched KL term's gradient is biased."""


class Reporter:
    """Reports each configuration once: `warn` (a KLGradientWarning and a log line), `raise`
    (KLGradientError for a biased term; an unbiased one is logged), or `log` (one JSON line per
    configuration to `log_file`; with `warn` and `raise`, a `log_file` given is written too)."""

    def __init__(self, mode: str = "warn", log_file: str | os.PathLike | None = None):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
        self.mode = mode
        self.log_file = os.fspath(log_file) if log_file is not None else (DEFAULT_LOG_FILE if mode == "log" else None)
        self._seen: set[tuple] = set()
        self._failed = False
        self._lock = threading.Lock()

    def report(self, verdict: Verdict, *, call: int, site: str | None = None) -> None:
        """Report `verdict` unless its configuration was reported already; KLGradientError in mode "raise"."""
        key = (site, verdict.where, verdict.placement, verdict.configuration)
        with self._lock:
            if key in self._seen:
                return
            self._seen.add(key)
        text = "klaudit.watch: " + "\n".join(verdict.lines()) + (f" [{site}]" if site else "")
        if self.log_file is not None:
            self._append(self.log_file, {**verdict.as_record(), "site": site, "call": call, "pid": os.getpid(), "time": time.time()})
        if verdict.unbiased:
            logger.info(text)
            return
        logger.warning(text)
        if self.mode == "raise" and verdict.unbiased is False:
            raise KLGradientError(text)
        if self.mode == "warn":
            warnings.warn(text, KLGradientWarning, stacklevel=4)

    def failed(self, what: str, error: BaseException) -> None:
        """One warning, the first time the audit itself fails; the training goes on."""
        with self._lock:
            if self._failed:
                return
            self._failed = True
        detail = str(error) if isinstance(error, ValueError) else f"{type(error).__name__}: {error}"  # ours say what
        message = f"klaudit.watch could not audit {what}: {detail} (the training is not affected)"
        logger.warning(message)
        warnings.warn(message, RuntimeWarning, stacklevel=4)

    @staticmethod
    def _append(path: str, record: dict) -> None:
        line = json.dumps(record) + "\n"
        with open(path, "a", encoding="utf-8") as stream:  # one write per line: ranks may share the file
            stream.write(line)
