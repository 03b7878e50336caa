"""The confined child process (no torch needed): its process group dies with it, its output is kept
bounded, and its memory cap turns an unbounded allocation into MemoryError."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from klaudit.audit.confine import MIB, OUTPUT_KEPT, Outcome, memory_limit_bytes, run_confined

FORK_AND_FLOOD = """
import os, sys, time
if os.fork() == 0:
    time.sleep(600)
    os._exit(0)
sys.stdout.write("x" * 10_000_000 + "end of output")
"""


def test_a_process_left_in_the_group_is_killed_and_reported_and_output_is_bounded():
    outcome = run_confined([sys.executable, "-c", FORK_AND_FLOOD], timeout=60)
    assert outcome.returncode == 0 and outcome.leftover
    assert len(outcome.output) == OUTPUT_KEPT and outcome.output.endswith("end of output")


def test_a_clean_exit_leaves_nothing_and_a_timeout_is_no_returncode():
    assert run_confined([sys.executable, "-c", "print('done')"], timeout=60) == Outcome(0, False, "done\n")
    start = time.monotonic()
    outcome = run_confined([sys.executable, "-c", "import time; time.sleep(600)"], timeout=0.5)
    assert outcome.returncode is None and not outcome.leftover and time.monotonic() - start < 10


@pytest.mark.skipif(sys.platform == "win32", reason="no rlimits")
def test_the_memory_cap_turns_an_unbounded_allocation_into_memory_error():
    program = (f"import sys; sys.path.insert(0, {str(Path(__file__).parents[2])!r})\n"
               "from klaudit.audit.confine import limit_memory, memory_note\n"
               f"limit_memory({256 * MIB})\n"
               "try:\n    keep = [bytearray(10**7) for _ in range(1000)]\n"
               "except MemoryError:\n    print('MemoryError' + memory_note())\n")
    outcome = run_confined([sys.executable, "-c", program], timeout=60)
    assert outcome.output.strip() == ("MemoryError (check-grad lets the audit use 256 MiB: raise it with "
                                      "--memory-limit)"), outcome.output


def test_memory_limit_in_mib_zero_for_none_and_half_the_memory_by_default():
    assert memory_limit_bytes(512) == 512 * MIB and memory_limit_bytes(0) is None
    if hasattr(os, "sysconf"):
        assert memory_limit_bytes(None) == os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2


LEAVES_THE_SESSION = """
import os, sys, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        sys.stdout.write(str(os.getpid()) + "\\n")
        sys.stdout.flush()
        time.sleep(600)
    os._exit(0)
os.wait()
time.sleep(0.5)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="only Linux has a child subreaper")
def test_a_process_that_starts_a_session_of_its_own_is_killed_too():
    """A daemon's double fork with setsid leaves the child's process group; the supervisor inherits it
    as a subreaper and kills it, and the run is not held up by the pipe it kept open."""
    start = time.monotonic()
    outcome = run_confined([sys.executable, "-c", LEAVES_THE_SESSION], timeout=60)
    assert outcome.returncode == 0 and outcome.leftover and time.monotonic() - start < 20
    pid = int(outcome.output.split()[0])
    deadline = time.monotonic() + 5
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid)


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, killed and waiting for init to reap it, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
