"""Which files to analyse in the same worker process: a file with the files of the run that only it imports.

Each worker parses a module the analysis follows into once (klaudit.lint.project) and reuses the tree
when it analyses that module as a file of its own. A module imported by a single file of the run is
parsed for both wherever the two go to different workers (TRL's grpo_trainer.py, 3,400 lines, is
imported by gmpo_trainer.py alone); analysed together, it is parsed once. A module imported by several
files (a package's utils.py) is not bound to any one of them: binding it would bind them all into one
task and leave the other workers idle. Only a file with KL vocabulary imports anything here: the others
are analysed without being parsed (their framework configurations only, klaudit.lint.engine), so they
follow no import (TRL's trainer/__init__.py imports grpo_trainer.py too, which kept it apart from gmpo).

Imports are read from the text (a line that starts with `import` or `from ... import`) and resolved as
the analysis resolves them (klaudit.lint.project), compared by absolute path without following links.
A line taken for an import that is none (inside a string), or an import missed (behind a link, or
spread over lines), only puts files in a group that did not need it or leaves it out: where a file is
analysed never changes what is found in it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping

from klaudit.lint.project import Project
from klaudit.lint.roles import might_contain_kl

_IMPORT = re.compile(r"[ \t]*(?:from[ \t]+(\.*)([\w.]*)[ \t]+import\b|import[ \t]+([\w.]+))")


def _import_lines(source: str) -> Iterator[tuple[str, str, str]]:
    """(leading dots, module, "") of each line that starts with `from ... import`, ("", "", module) of
    each that starts with `import`. The word is found first and its line read from its start: a few
    times faster than trying the pattern at the start of every line."""
    found = source.find("import")
    while found >= 0:
        start = source.rfind("\n", 0, found) + 1
        match = _IMPORT.match(source, start)
        if match is not None:
            yield match.group(1) or "", match.group(2) or "", match.group(3) or ""
        end = source.find("\n", found)
        found = source.find("import", end) if end >= 0 else -1


def _imported(path: str, source: str, project: Project, names: set[str], by_key: Mapping[str, str]) -> set[str]:
    """The files of the run (`by_key`: absolute path -> path as given) that the text of `path` imports.
    Only a module whose last name is in `names` (those of the files of the run, or of the package of an
    __init__) is looked for in the file system."""
    found = set()
    for dots, module, plain in _import_lines(source):
        dotted = plain or module
        if dotted.rsplit(".", 1)[-1] not in names:
            continue
        target = project.module_path(dotted, path, len(dots))
        other = by_key.get(os.path.abspath(target)) if target is not None else None
        if other is not None and other != path:
            found.add(other)
    return found


def groups(sources: Mapping[str, str], project: Project, workers: int) -> list[list[str]]:
    """The paths of `sources`, each once, in groups to analyse in one worker: a file joins the group of
    the one file of `sources` that imports it, if only one does, the largest imported files first, as
    long as the group stays within a share of the whole that keeps `workers` busy (a chain of imports
    can bind most of a small tree together). The groups come largest first (by characters), and inside
    a group, its files largest first."""
    size = {path: len(source) for path, source in sources.items()}
    limit = sum(size.values()) // (2 * workers)
    names = {os.path.basename(os.path.dirname(path)) if os.path.basename(path) == "__init__.py"
             else os.path.splitext(os.path.basename(path))[0] for path in sources}
    by_key = {os.path.abspath(path): path for path in sources}
    importers: dict[str, set[str]] = {path: set() for path in sources}
    for path, source in sources.items():
        if not might_contain_kl(source):
            continue  # never parsed: it follows no import
        for imported in _imported(path, source, project, names, by_key):
            importers[imported].add(path)
    leader = {path: path for path in sources}
    total = dict(size)  # a group's characters, held by its leader

    def root(path: str) -> str:
        while leader[path] != path:
            path = leader[path]
        return path

    for imported in sorted(sources, key=lambda p: -size[p]):
        if len(importers[imported]) == 1:
            joined, host = root(imported), root(next(iter(importers[imported])))
            if joined != host and total[joined] + total[host] <= limit:
                leader[joined] = host
                total[host] += total[joined]
    members: dict[str, list[str]] = {}
    for path in sources:
        members.setdefault(root(path), []).append(path)
    found = [sorted(group, key=lambda p: -size[p]) for group in members.values()]
    return sorted(found, key=lambda group: -sum(size[p] for p in group))
