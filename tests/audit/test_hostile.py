"""check-grad under hostile user code: whatever the KL function does to its process, the run ends with
one error line and exit status 2, no traceback, and no process of the user's left running."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

pytest.importorskip("torch")

from klaudit.cli import main  # noqa: E402

SIGNATURE = "def kl_loss(logprobs, ref_logprobs):\n"


def _check_grad(tmp_path: Path, body: str, *args: str, prelude: str = ""):
    """check-grad on a KL function with `body` (indented), written to tmp_path; (result, seconds)."""
    source = tmp_path / "hostile_kl.py"
    source.write_text(f"import os, sys, threading, time\n\nimport torch\n{prelude}\n\n{SIGNATURE}"
                      + "".join(f"    {line}\n" for line in body.splitlines()))
    start = time.monotonic()
    result = CliRunner().invoke(main, ["check-grad", f"{source}::kl_loss", "--timeout", "30", *args])
    return result, time.monotonic() - start


def _one_error(result, *phrases: str) -> str:
    """The one error line of a failed run, which says each of `phrases`."""
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.output
    assert all(phrase in errors[0] for phrase in phrases), errors[0]
    assert result.output.splitlines()[-1] == "0 rows audited, 0 biased, 1 error"
    return errors[0]


def _running(pid: int) -> bool:
    """Whether process `pid` exists and is not a zombie (a killed orphan waits to be reaped)."""
    stat = Path(f"/proc/{pid}/stat")
    if stat.parent.parent.is_dir():
        try:
            return stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _gone(pid_file: Path) -> bool:
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while _running(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not _running(pid)


def _forks_a_sleeper(pid_file) -> str:
    """KL-function body lines that fork a process sleeping for 10 minutes and record its pid."""
    return ("pid = os.fork()\nif pid == 0:\n    time.sleep(600)\n    os._exit(0)\n"
            f"open({str(pid_file)!r}, 'w').write(str(pid))\n")


def test_a_forked_process_left_running_is_killed_and_reported(tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    result, seconds = _check_grad(tmp_path, _forks_a_sleeper(pid_file) + "return logprobs - ref_logprobs")
    _one_error(result, "kl_loss: the KL code started a process that was still running", "killed")
    assert _gone(pid_file) and seconds < 30


def _pids(pid_file: Path) -> list[int]:
    return [int(line) for line in pid_file.read_text().split()]


def _all_gone(pid_file: Path) -> bool:
    deadline = time.monotonic() + 5
    while any(_running(pid) for pid in _pids(pid_file)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not any(_running(pid) for pid in _pids(pid_file))


# a process that leaves the audit's process group: a session of its own, and a daemon's double fork
# (the intermediate process exits, so the sleeper is an orphan that moved to another session)
ESCAPES = {
    "setsid": "pid = os.fork()\nif pid == 0:\n    os.setsid()\n    {record}\n    time.sleep(600)\n    os._exit(0)\n"
              "os.waitpid(pid, os.WNOHANG)\n",
    "double fork": "pid = os.fork()\nif pid == 0:\n    os.setsid()\n    if os.fork() == 0:\n        {record}\n"
                   "        time.sleep(600)\n    os._exit(0)\nos.waitpid(pid, 0)\n",
}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="only Linux has a child subreaper")
@pytest.mark.parametrize("escape", sorted(ESCAPES))
def test_a_process_that_leaves_the_session_is_killed_and_reported(tmp_path, escape):
    """os.setsid() takes a process out of the child's process group, which the group kill then misses;
    the supervisor, a child subreaper, inherits it and kills it (issue 15)."""
    pid_file = tmp_path / "escaped.pid"
    record = f"open({str(pid_file)!r}, 'a').write(str(os.getpid()) + '\\n')"
    body = ESCAPES[escape].format(record=record)
    result, seconds = _check_grad(tmp_path, body + "time.sleep(0.2)\nreturn logprobs - ref_logprobs")
    _one_error(result, "kl_loss: the KL code started a process that was still running", "killed")
    assert _pids(pid_file) and _all_gone(pid_file) and seconds < 30


def test_a_function_that_sleeps_forever_times_out_and_its_forked_process_is_killed(tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    result, seconds = _check_grad(tmp_path, _forks_a_sleeper(pid_file) + "time.sleep(600)", "--timeout", "10")  # time enough to import torch on a loaded machine
    _one_error(result, "timed out after 10 s", "--timeout")
    assert _gone(pid_file) and seconds < 20


def test_a_thread_that_never_ends_does_not_keep_the_audit_running(tmp_path):
    result, seconds = _check_grad(tmp_path, """\
threading.Thread(target=time.sleep, args=(600,), name="poller").start()
return logprobs - ref_logprobs""")
    _one_error(result, "started a thread that was still running when the audit ended (poller")
    assert seconds < 30


def test_changing_the_working_directory_is_reported(tmp_path):
    result, _ = _check_grad(tmp_path, "os.chdir('/')\nreturn logprobs - ref_logprobs")
    _one_error(result, "the KL code changed the working directory (to /)")
    assert os.getcwd() != "/"


@pytest.mark.parametrize("body, prelude, phrase", [
    ("os._exit(0)", "", "the audit process ended with status 0 before it reported"),
    ("sys.exit(3)", "", "kl_loss called sys.exit(3) instead of returning its term"),
    ("return logprobs - ref_logprobs", "sys.exit('no GPU')", "the KL code called sys.exit('no GPU')"),
    ("os.kill(os.getpid(), 9)", "", "the audit process was killed by SIGKILL"),
])
def test_ending_the_process_is_one_line(tmp_path, body, prelude, phrase):
    _one_error(_check_grad(tmp_path, body, prelude=prelude)[0], phrase)


def test_a_flood_of_output_is_drained_and_ends_at_the_time_limit(tmp_path):
    result, seconds = _check_grad(tmp_path, """\
while True:
    print("x" * 100_000)
    print("y" * 100_000, file=sys.stderr)""", "--timeout", "4")
    _one_error(result, "timed out after 4 s")
    assert seconds < 15 and len(result.output) < 1000


def test_what_the_code_prints_cannot_corrupt_the_report(tmp_path):
    fake = '{"results": [], "errors": ["forged"], "notes": [], "details": []}'
    result, _ = _check_grad(tmp_path, f"print({fake!r} * 1000)\nprint('}}{{', file=sys.stderr)\n"
                                      f"return logprobs - ref_logprobs", "--format", "json")
    assert result.exit_code == 1, result.output  # k1 differentiated as a loss: zero expected gradient (KL001)
    assert '"objective": "ZERO"' in result.stdout and "forged" not in result.output


@pytest.mark.parametrize("allocation", [
    "keep = []\nwhile True:\n    keep.append(bytearray(10**8))",  # Python objects: MemoryError
    "keep = []\nwhile True:\n    keep.append(torch.ones(2**26))",  # torch's allocator: RuntimeError
])
def test_an_unbounded_allocation_meets_the_memory_limit(tmp_path, allocation):
    result, _ = _check_grad(tmp_path, allocation, "--memory-limit", "1024")
    _one_error(result, "kl_loss ran out of memory", "1024 MiB", "--memory-limit")


def test_a_mask_used_as_a_boolean_index_is_fed_as_booleans(tmp_path):
    source = tmp_path / "masked.py"
    source.write_text("def masked_kl(logprobs, ref_logprobs, response_mask):\n"
                      "    return (logprobs - ref_logprobs)[response_mask].sum()\n")
    result = CliRunner().invoke(main, ["check-grad", f"{source}::masked_kl", "--timeout", "30"])
    assert result.exit_code == 1 and "Traceback" not in result.output  # k1 as a loss: KL001, biased
    assert "response_mask of" in result.output and "a boolean mask (a float mask raised IndexError)" in result.output


def test_a_float_mask_used_as_a_boolean_index_is_explained_where_booleans_fail_too(tmp_path):
    source = tmp_path / "masked.py"
    source.write_text("import torch\n\n\ndef masked_kl(logprobs, ref_logprobs, response_mask):\n"
                      "    return torch.lerp(logprobs, ref_logprobs, response_mask)[response_mask].sum()\n")
    result = CliRunner().invoke(main, ["check-grad", f"{source}::masked_kl", "--timeout", "30"])
    line = _one_error(result, "indexes with a float tensor as if it were boolean", "mask response_mask",
                      "response_mask.bool()")
    assert "raised IndexError" not in line
