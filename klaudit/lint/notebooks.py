"""Jupyter notebooks: their code cells as one Python source, linted like a `.py` file.

The code cells are joined in order, each starting on a new line, so a finding's line is its line in
that joined code (what `location.row` of the JSON output and SARIF's `startLine` give); its message
begins with the cell and the line within the cell (`cell 3, line 2: ...`): the cell's position in the
notebook, markdown cells counted, and the line in that cell, both from 1. IPython's own syntax is not Python: a line magic
(`%time`, or `cd ..` and `pip install x` written without the %), a help request (`ds.shuffle?`, `??np.load`), a shell line
(`!pip install`, `files = !ls`) and a cell magic's whole cell (`%%bash`)
become `pass` at their indentation in the joined code (a line a magic or shell line carries on to
with a trailing backslash, an empty line), so every other line keeps its number; the
shell lines and `%%bash`/`%%sh` cells are kept apart, at the same line numbers, for the launch
commands they may hold (`!trl grpo --beta 0.04`). A notebook whose kernel is not Python has no
Python (a bash kernel's cells are all shell). A notebook that is not valid JSON, or not a notebook,
is one KL000 finding, and so is one whose code cells do not parse. A cell whose first line is indented
loses that indentation, as IPython runs it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from typing import Any

from klaudit.config import SYNTAX_ERROR_CODE
from klaudit.lint.findings import Finding
from klaudit.lint.parsing import file_finding

NOTEBOOK_SUFFIX = ".ipynb"
_MAGIC = re.compile(r"^(?P<indent>[ \t]*)(?:%|!|\w+\s*=\s*[!%])")
_SHELL = re.compile(r"^[ \t]*(?:\w+\s*=\s*)?!(?P<command>.*)$")
# IPython's help on an object, `name?` / `name??` after it or `?name` before it (wildcards allowed: `np.*load*?`)
_HELP = re.compile(r"^(?P<indent>[ \t]*)(?:\?{1,2}[\w.*]+|[\w.*]+\?{1,2})[ \t]*$")
_SHELL_CELLS = ("%%bash", "%%sh", "%%script bash", "%%script sh")
# IPython runs a line magic without its % (automagic) and a few shell commands without ! (aliases):
# `cd ..`, `pip install trl`. Such a line is set aside where it is not Python by itself.
_AUTOMAGIC = re.compile(r"^(?P<indent>[ \t]*)(?:cd|pip|conda|mamba|env|pwd|ls|mkdir|rmdir|rm|cp|mv|cat|"
                        r"load_ext|reload_ext|autoreload|matplotlib|run|time|timeit|pushd|popd|bookmark)\b")


# A line that starts like Python with one of those names (`env = Env(` opening a call on several lines,
# `time.sleep(1)`, `run(cfg)`): an assignment, a call, an attribute or an index, never a magic.
_PYTHON_START = re.compile(r"^[ \t]*\w+(?:\.\w|[ \t]*(?:[-+*/%&|^@]?=(?!=)|\*\*=|//=|[(\[,:]))")


def _automagic(line: str) -> re.Match[str] | None:
    found = _AUTOMAGIC.match(line)
    if found is None or _PYTHON_START.match(line):
        return None
    try:
        compile(line.strip(), "<cell>", "exec")
    except SyntaxError:
        return found
    return None  # Python too (`time = 3`, `ls -la` is a subtraction): read as Python


def _without_leading_indent(lines: list[str]) -> list[str]:
    """The cell as IPython runs it: when its first line that is not blank is indented, that indentation
    is taken off every line that starts with it (a cell pasted with its indent still runs)."""
    first = next((line for line in lines if line.strip()), "")
    indent = first[:len(first) - len(first.lstrip(" \t"))]
    if not indent:
        return lines
    return [line[len(indent):] if line.startswith(indent) else line for line in lines]


@dataclass(frozen=True)
class Notebook:
    """A notebook's code: the joined Python, its shell commands, and where each cell starts."""

    code: str
    shell: str  # the shell lines at their line numbers in `code`, every other line empty
    text: str  # the code cells as written, magics included, joined like `code` (for showing a line)
    starts: tuple[tuple[int, int], ...]  # (cell number, first line in `code`), in order

    def cell_of(self, line: int) -> tuple[int, int]:
        """(cell number, line within the cell) of a line of the joined code."""
        cell, first = next(((c, f) for c, f in reversed(self.starts) if f <= line), (0, 1))
        return cell, line - first + 1


def _cell_source(cell: dict[str, Any]) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else str(source)


def read_notebook(path: str, data: bytes) -> Notebook | Finding:
    """The code of the notebook `data` (the bytes of `path`), or a KL000 finding saying why it has none."""
    try:
        document = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as error:
        return file_finding(path, SYNTAX_ERROR_CODE, f"not a readable notebook: {error}", 1, 1)
    cells = document.get("cells") if isinstance(document, dict) else None
    if not isinstance(cells, list):
        return file_finding(path, SYNTAX_ERROR_CODE, "not a notebook: no list of cells", 1, 1)
    metadata = document.get("metadata")
    kernel = metadata.get("kernelspec") if isinstance(metadata, dict) else None
    language = kernel.get("language", "python") if isinstance(kernel, dict) else "python"
    python = not isinstance(language, str) or language.lower() == "python"  # an R or bash kernel: no Python
    code: list[str] = []
    shell: list[str] = []
    text: list[str] = []
    starts: list[tuple[int, int]] = []
    for number, cell in enumerate(cells, start=1):
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        written = _cell_source(cell).splitlines() or [""]
        starts.append((number, len(code) + 1))
        text.extend(written)
        lines = _without_leading_indent(written)
        # IPython drops a cell's leading blank lines before it looks for a cell magic (`\n%%chatglm` is one)
        first = next((index for index, line in enumerate(lines) if line.strip()), 0)
        whole_shell = lines[first].strip() in _SHELL_CELLS
        whole_magic = lines[first].lstrip().startswith("%%")
        continued = None  # while a magic or shell line goes on over a trailing backslash: whether it is shell
        for index, line in enumerate(lines):
            if not python:
                code.append("")
                shell.append(line if language.lower() in ("bash", "sh", "shell") else "")
                continue
            if continued is not None:  # `!python -m verl.trainer.main_ppo \` and its option lines
                code.append("")
                shell.append(line if continued else "")
                continued = continued if line.rstrip().endswith("\\") else None
                continue
            magic = _MAGIC.match(line) or _automagic(line) or _HELP.match(line)
            command = _SHELL.match(line)
            if whole_magic:
                code.append("pass" if index == first else "")
                shell.append(line if whole_shell and index > first else "")
            elif magic is not None:
                code.append(f"{magic.group('indent')}pass")
                shell.append(" " * command.start("command") + command.group("command") if command else "")
                continued = command is not None if line.rstrip().endswith("\\") else None
            else:
                code.append(line)
                shell.append("")
    return Notebook("\n".join(code) + "\n", "\n".join(shell) + "\n", "\n".join(text) + "\n", tuple(starts))


NO_NOTEBOOK_FIX = "fixes are not applied inside notebooks: apply the suggested change in the cell by hand"


def in_cells(findings: tuple[Finding, ...], notebook: Notebook) -> tuple[Finding, ...]:
    """`findings` on the joined code, each message led by its cell and line within the cell. Their
    automatic fixes are dropped: an edit of the joined code would land inside the notebook's JSON."""
    located = []
    for finding in findings:
        cell, line = notebook.cell_of(finding.line)
        located.append(replace(finding, message=f"cell {cell}, line {line}: {finding.message}", autofix=None,
                               no_autofix=NO_NOTEBOOK_FIX if finding.autofix is not None else finding.no_autofix))
    return tuple(located)
