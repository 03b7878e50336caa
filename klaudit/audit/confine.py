"""The audit's child process, confined: the user's code cannot outlive it, flood the parent or starve the machine.

Parent side (`run_confined`): the child starts a session of its own, so its process group holds what
the user's code forks or spawns (a process that starts yet another session escapes it); when the
child ends, runs past its wall-clock limit or the parent is interrupted, the whole group is killed.
Its stdout and stderr are drained while it runs into a buffer that keeps only their last
OUTPUT_KEPT bytes; the result comes back in a file of its own, which no print can corrupt.
Child side (`limit_memory`): a cap on the data segment (heap and anonymous mappings: RLIMIT_DATA),
so that an unbounded allocation fails with MemoryError instead of calling in the kernel's OOM killer.
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass

if sys.platform != "win32":
    import resource

OUTPUT_KEPT = 64 * 1024
MIB = 2 ** 20


@dataclass(frozen=True)
class Outcome:
    """How the child ended. returncode: None when the wall-clock limit stopped it (negative: the
    signal that killed it). leftover: processes of its group were still running after it had
    ended (they were killed). output: the end of its stdout and stderr."""

    returncode: int | None
    leftover: bool
    output: str


class _Tail:
    """Reads a pipe to its end in a thread of its own, keeping only its last OUTPUT_KEPT bytes."""

    def __init__(self, pipe: io.BufferedReader) -> None:
        self._pipe = pipe
        self._kept = bytearray()
        self._thread = threading.Thread(target=self._drain, daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        while chunk := self._pipe.read1(OUTPUT_KEPT):
            self._kept += chunk
            if len(self._kept) > 2 * OUTPUT_KEPT:
                del self._kept[:-OUTPUT_KEPT]

    def text(self, wait: float) -> str:
        """What was kept, once the pipe is closed or `wait` seconds have passed (a process that left
        the group may hold the pipe open)."""
        self._thread.join(wait)
        return bytes(self._kept[-OUTPUT_KEPT:]).decode("utf-8", errors="replace")


def run_confined(command: Sequence[str], timeout: float) -> Outcome:
    """Run `command` in a new session for at most `timeout` seconds; kill its process group after it."""
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, start_new_session=True)
    assert isinstance(process.stdout, io.BufferedReader)
    tail = _Tail(process.stdout)
    returncode: int | None = None
    try:
        returncode = process.wait(timeout)
    except subprocess.TimeoutExpired:
        pass
    finally:  # also on KeyboardInterrupt: the child's session does not get the terminal's Ctrl-C
        leftover = _kill_group(process) and returncode is not None
    output = tail.text(wait=5.0)
    process.stdout.close()
    return Outcome(returncode, leftover, output)


def _kill_group(process: subprocess.Popen) -> bool:
    """SIGKILL every process of the group `process` leads, and reap it; whether the group had any
    process left (Windows has no process groups: the process alone is killed)."""
    if sys.platform == "win32":
        process.kill()
        process.wait()
        return False
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        return False
    finally:
        process.wait()
    return True


def memory_limit_bytes(mib: int | None) -> int | None:
    """The child's memory cap: `mib` MiB; None (the default): half the physical memory where it is
    known; 0: none."""
    if mib is not None:
        return mib * MIB or None
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2
    except (ValueError, OSError, AttributeError):
        return None


def limit_memory(limit: int | None) -> None:
    """In the child: cap the data segment at `limit` bytes (None: no cap), where the platform can."""
    if limit is None or sys.platform == "win32":
        return
    _, hard = resource.getrlimit(resource.RLIMIT_DATA)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    try:
        resource.setrlimit(resource.RLIMIT_DATA, (limit, hard))
    except (ValueError, OSError):
        pass


def memory_note() -> str:
    """What to say of an allocation that failed: the cap, when this process has one."""
    if sys.platform == "win32":
        return ""
    soft, _ = resource.getrlimit(resource.RLIMIT_DATA)
    if soft == resource.RLIM_INFINITY:
        return ""
    return f" (check-grad lets the audit use {soft // MIB} MiB: raise it with --memory-limit)"
