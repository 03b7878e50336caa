"""The files a launch script reads in with `source` (or `.`): a shared `common.sh` that sets the variables
and the bash arrays of overrides every launcher of a project passes.

Only files named by a path the text settles are followed: a literal path, beside the script or above it, or
one under the script's own folder as bash computes it (`$(dirname "${BASH_SOURCE[0]}")/common.sh`, or a
variable assigned that folder first). A sourced file's own `source` lines are not followed.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from klaudit.frameworks.settings import SHELL_WORD, Sourced, project_path
from klaudit.text import read_text

_SOURCE = re.compile(rf"^(?P<indent>[ \t]*)(?P<command>source|\.)[ \t]+(?P<file>{SHELL_WORD.pattern})[ \t]*(?:#.*)?$",
                     re.MULTILINE)
# the script's own folder as a launcher computes it (quotes removed): `$(dirname ${BASH_SOURCE[0]})`,
# `$(cd $(dirname $0) && pwd)`, `${BASH_SOURCE%/*}`
_SCRIPT = r"\$(?:\{BASH_SOURCE(?:\[0\])?\}|BASH_SOURCE|\{0\}|0)"
_DIRNAME = rf"\$\(dirname\s+(?:{_SCRIPT}|\$\((?:realpath|readlink\s+-f)\s+{_SCRIPT}\))\)"
_OWN_FOLDER = re.compile(rf"{_DIRNAME}|\$\(cd\s+{_DIRNAME}\s*(?:&&|;)\s*pwd(?:\s+-P)?\)|\$\{{BASH_SOURCE(?:\[0\])?%/\*\}}")
_FOLDER_VARIABLE = re.compile(r"^\s*(?:export\s+|readonly\s+|local\s+)?(?P<name>[A-Za-z_]\w*)=(?P<value>[^#\n]+?)\s*$",
                              re.MULTILINE)
_HERE = "\0"  # stands for the script's folder in a path being resolved


def sourced_files(path: str, text: str) -> dict[int, Sourced]:
    """The files the shell script `path` (whose text is `text`) sources, by the line of the `source` command."""
    if "source" not in text and ". " not in text:
        return {}
    folders = {match.group("name") for match in _FOLDER_VARIABLE.finditer(text)
               if _OWN_FOLDER.fullmatch(match.group("value").replace('"', "").replace("'", ""))}
    found: dict[int, Sourced] = {}
    for match in _SOURCE.finditer(text):
        file = _resolved(path, match.group("file"), folders)
        content = read_text(file) if file is not None else None
        if file is None or content is None:
            continue
        line = text.count("\n", 0, match.start()) + 1
        column = len(match.group("indent")) + 1
        name = os.path.relpath(file, Path(path).resolve().parent)
        found[line] = Sourced(line, column, column + len(match.group("command")), name, str(file), content)
    return found


def _resolved(path: str, written: str, folders: set[str]) -> Path | None:
    """The project file a `source` argument names, or None where the text does not settle it."""
    word = _OWN_FOLDER.sub(_HERE, written.replace('"', "").replace("'", ""))
    for name in folders:
        word = re.sub(rf"\$(?:\{{{name}\}}|{name}\b)", _HERE, word)
    if "$" in word or "`" in word or not word.strip(_HERE + "/"):
        return None
    script = Path(path).resolve()
    if word.startswith(_HERE):
        candidate = (script.parent / word.lstrip(_HERE).lstrip("/")).resolve()
        found = candidate if candidate.is_file() else None
    elif _HERE in word or word.startswith(("/", "~")):
        return None
    else:
        found = project_path(path, word)
    return found if found is not None and found.resolve() != script else None
