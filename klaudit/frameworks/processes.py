"""Which of the project's files a launch runs in several processes (or in a number the launch does not state).

TRL's GRPOConfig divides `generation_batch_size` by the processes as well as by the per-device batch: a count the
lint cannot read. It assumes one process, as `python train.py` runs, unless a command of the project runs the
file with a distributed launcher (`torchrun`, `deepspeed`, `accelerate launch`, `python -m torch.distributed.run`,
`mpirun`) that does not pin one process. A command is read in a shell script or in a Python module's text (the
launch a docstring documents), over its backslash-continued lines; a file it names is the script it runs or a
configuration it passes (`--config configs/grpo.yaml`), found beside the text or in a folder above it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from klaudit.frameworks.settings import command_span, project_path

_LAUNCHER = re.compile(r"\b(?:torchrun|deepspeed|accelerate\s+launch|torch\.distributed\.(?:launch|run)|mpirun)\b")
_ONE_PROCESS = re.compile(r"(?:--(?:nproc[_-]per[_-]node|num[_-]processes|num[_-]gpus)|\s-np?)[= ]+1\b")
_NAMED = re.compile(r"(?<![\w/.$-])((?:[\w.-]+/)*[\w.-]+\.(?:py|ya?ml))\b")


def parallel_launched(texts: Mapping[str, str]) -> frozenset[str]:
    """The resolved paths of the files that a command in `texts` (path -> text) runs, or configures, with a
    distributed launcher not pinned to one process."""
    found: set[str] = set()
    for path, text in texts.items():
        if not _LAUNCHER.search(text):
            continue
        lines = text.splitlines()
        for index, line in enumerate(lines):
            if not _LAUNCHER.search(line):
                continue
            first, last = command_span(lines, index)
            command = " ".join(lines[first:last + 1])
            if _ONE_PROCESS.search(command):
                continue
            for match in _NAMED.finditer(command):
                file = project_path(path, match.group(1))
                if file is not None:
                    found.add(str(file.resolve()))
    return frozenset(found)


def runs_in_one_process(path: str, parallel: frozenset[str]) -> bool:
    """Whether the file at `path` is run (or configures a run) in one process, as far as the project's launches say."""
    return str(Path(path).resolve()) not in parallel
