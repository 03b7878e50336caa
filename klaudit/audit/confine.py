"""The audit's child process, confined: the user's code cannot outlive it, flood the parent or starve the machine.

Parent side (`run_confined`): the child starts a session of its own, so its process group holds what
the user's code forks or spawns; when the child ends, runs past its wall-clock limit or the parent is
interrupted, the whole group is killed. A process that starts yet another session (`os.setsid()`, a
daemon's double fork) leaves that group; on Linux a small supervisor process therefore stands between
the parent and the child: it is a child subreaper (prctl PR_SET_CHILD_SUBREAPER), so every descendant
orphaned on the way is re-parented to it instead of to init, and once the child has ended it kills
them all, whatever session they moved to. Where prctl is missing (macOS, Windows) the group kill alone
is the confinement. Stdout and stderr are drained while the child runs into a buffer that keeps only
their last OUTPUT_KEPT bytes; the result comes back in a file of its own, which no print can corrupt.
Child side (`limit_memory`): a cap on the data segment (heap and anonymous mappings: RLIMIT_DATA),
so that an unbounded allocation fails with MemoryError instead of calling in the kernel's OOM killer.
"""

from __future__ import annotations

import ctypes
import io
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

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
        self._pipe.close()  # here, not by the caller: closing waits for a read that may never return

    def text(self, wait: float) -> str:
        """What was kept, once the pipe is closed or `wait` seconds have passed (a process that left
        the group may hold the pipe open)."""
        self._thread.join(wait)
        return bytes(self._kept[-OUTPUT_KEPT:]).decode("utf-8", errors="replace")


def run_confined(command: Sequence[str], timeout: float) -> Outcome:
    """Run `command` in a new session for at most `timeout` seconds; kill its process group after it, and
    on Linux every other process descended from it (through the supervisor, `_supervise`)."""
    if not subreaper_available():
        return _run_in_group(command, timeout)
    with tempfile.TemporaryDirectory(prefix="klaudit-confine-") as scratch:
        status = Path(scratch, "status.json")
        supervisor = [sys.executable, "-c", _SUPERVISOR_BOOT, _installed_root(), str(status), repr(timeout), *command]
        process, tail = _start(supervisor)
        try:
            # the supervisor ends the child itself at `timeout`; the margin covers killing what it left
            process.wait(timeout + SUPERVISOR_MARGIN)
        except subprocess.TimeoutExpired:
            pass
        finally:  # also on KeyboardInterrupt: the supervisor kills the child and its descendants, then exits
            _stop_supervisor(process, status)
        output = tail.text(wait=5.0)
        try:
            ended = json.loads(status.read_text())
        except (OSError, ValueError):  # the supervisor itself was killed: nothing is known of the child
            return Outcome(None, False, output)
        return Outcome(ended.get("returncode"), bool(ended.get("leftover")), output)


SUPERVISOR_MARGIN = 30.0  # seconds the supervisor may take past the child's limit to clean up
_PR_SET_CHILD_SUBREAPER = 36
_SUPERVISOR_BOOT = ("import sys; sys.path[0] = sys.argv[1]; from klaudit.audit.confine import _supervise; "
                    "_supervise(sys.argv[2], float(sys.argv[3]), sys.argv[4:])")


def subreaper_available() -> bool:
    """Whether this system has prctl(PR_SET_CHILD_SUBREAPER) (Linux 3.4 and later) and /proc."""
    return sys.platform.startswith("linux") and Path("/proc/self/stat").is_file() and _prctl() is not None


def _prctl():
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def _installed_root() -> str:
    """The directory klaudit was imported from: first on the supervisor's sys.path, so that a folder
    named `klaudit` in the working directory cannot shadow it."""
    return str(Path(__file__).resolve().parents[2])


def _start(command: Sequence[str]) -> tuple[subprocess.Popen, _Tail]:
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, start_new_session=True)
    assert isinstance(process.stdout, io.BufferedReader)
    return process, _Tail(process.stdout)


def _stop_supervisor(process: subprocess.Popen, status: Path) -> None:
    """Ask a supervisor that is still running to end the child and clean up (SIGTERM); if it does not
    within a few seconds, kill its group and the child's (whose leader's pid it wrote down)."""
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(10.0)
        return
    except subprocess.TimeoutExpired:
        pass
    for group in (process.pid, _child_pid(status)):
        if group is not None:
            try:
                os.killpg(group, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    process.wait()


def _child_pid(status: Path) -> int | None:
    try:
        return int(json.loads(Path(str(status) + ".pid").read_text()))
    except (OSError, ValueError):
        return None


class _Stop(Exception):
    """The parent asked the supervisor to stop (SIGTERM)."""


def _supervise(status: str, timeout: float, command: Sequence[str]) -> None:
    """The supervisor's body: become a child subreaper, run `command` in a session of its own for at most
    `timeout` seconds, then kill its process group and every process re-parented here, and write
    {"returncode", "leftover"} to `status` (returncode None: stopped by the time limit or the parent)."""

    def stop(signum, frame):
        raise _Stop

    signal.signal(signal.SIGTERM, stop)
    prctl = _prctl()
    if prctl is not None:
        prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    returncode: int | None = None
    leftover = False
    child = None
    try:
        child = subprocess.Popen(list(command), stdin=subprocess.DEVNULL, start_new_session=True)
        Path(status + ".pid").write_text(str(child.pid))
        returncode = child.wait(timeout)
    except (subprocess.TimeoutExpired, _Stop):
        pass
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the clean-up below must run to its end
        if child is not None and returncode is None:
            _signal_group(child.pid)
            child.wait()
        _reap()  # orphans that have ended are zombies here, not processes left running
        group_left = child is not None and _signal_group(child.pid)
        leftover = (kill_descendants() or group_left) and returncode is not None
        partial = Path(status + ".partial")
        partial.write_text(json.dumps({"returncode": returncode, "leftover": leftover}))
        partial.replace(status)


def kill_descendants(deadline: float = 10.0) -> bool:
    """SIGKILL every child of this process, reaping them, until none is left: a subreaper's children
    include the orphaned descendants of the processes it killed, which are re-parented to it in turn.
    Returns whether there was any."""
    found = False
    stop_at = time.monotonic() + deadline
    while time.monotonic() < stop_at:
        _reap()
        children = _children(os.getpid())
        if not children:
            break
        found = True
        for pid in children:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.01)
    _reap()
    return found


def _reap() -> None:
    """Collect the exit status of every child that has ended (zombies are not running processes)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _children(parent: int) -> list[int]:
    """The live (non-zombie) processes whose parent is `parent`, read from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # ended meanwhile
        if int(fields[1]) == parent and fields[0] != "Z":
            found.append(int(entry.name))
    return found


def _run_in_group(command: Sequence[str], timeout: float) -> Outcome:
    """`run_confined` without a subreaper: the process group is all that is killed."""
    process, tail = _start(command)
    returncode: int | None = None
    try:
        returncode = process.wait(timeout)
    except subprocess.TimeoutExpired:
        pass
    finally:  # also on KeyboardInterrupt: the child's session does not get the terminal's Ctrl-C
        leftover = _kill_group(process) and returncode is not None
    output = tail.text(wait=5.0)
    return Outcome(returncode, leftover, output)


def _kill_group(process: subprocess.Popen) -> bool:
    """SIGKILL every process of the group `process` leads, and reap it; whether the group had any
    process left (Windows has no process groups: the process alone is killed)."""
    if sys.platform == "win32":
        process.kill()
        process.wait()
        return False
    try:
        return _signal_group(process.pid)
    finally:
        process.wait()


def _signal_group(group: int) -> bool:
    """SIGKILL the process group `group`; whether it had any member."""
    try:
        os.killpg(group, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        return False
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
