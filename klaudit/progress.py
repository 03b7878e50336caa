"""A one-line status on stderr for runs that take a while: `klaudit lint` over many files and
`klaudit check-grad`. Shown only when asked (the callers ask on a terminal, for the formats people
read) and only once the run has taken more than a second; the line is erased when the run ends."""

from __future__ import annotations

import sys
import threading
import time

SHOW_AFTER = 1.0  # seconds: a quick run prints nothing


class Progress:
    """`message` says what is being done; with `total`, `done` counts towards it."""

    def __init__(self, enabled: bool, message: str = "", total: int | None = None) -> None:
        self.enabled = enabled
        self.message = message
        self.total = total
        self.done = 0
        self.started = time.monotonic()
        self._shown = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True) if enabled else None
        if self._thread:
            self._thread.start()

    def advance(self, count: int = 1) -> None:
        self.done += count

    def line(self) -> str:
        elapsed = time.monotonic() - self.started
        counted = f" {self.done}/{self.total}" if self.total is not None else ""
        return f"{self.message}{counted} ({elapsed:.0f} s)"

    def _run(self) -> None:
        while not self._stop.wait(0.25):
            if time.monotonic() - self.started > SHOW_AFTER:
                sys.stderr.write(f"\r\033[K{self.line()}")
                sys.stderr.flush()
                self._shown = True

    def close(self) -> None:
        if self._thread:
            self._stop.set()
            self._thread.join()
            if self._shown:
                sys.stderr.write("\r\033[K")
                sys.stderr.flush()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
