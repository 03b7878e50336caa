"""Methods that never run: a base class's method every subclass overrides, where nothing builds the base itself.

A trainer module often keeps the class it started from (`DiffuGRPOTrainer`) beside the subclass the project trains
with (`DiffuGSPOTrainer(DiffuGRPOTrainer)`, whose own `compute_loss` replaces the base's). Where every class of the
project deriving from the base defines the method again without calling the base's (`super().compute_loss(...)`),
and the base is named nowhere but as a base, in an import or at its definition (no `DiffuGRPOTrainer(...)`, no
`trainer_cls = DiffuGRPOTrainer`, no `__all__` entry), the base's method is code no run executes.

So is a private function or method (`_grpo_step`, one leading underscore) whose name no code of the project
writes but at its own `def`: a trainer keeps its first, per-prompt step beside the batched one it now calls.
Comments do not count (MonetVLM's comment names the old step); notebooks and configuration files do.
"""

from __future__ import annotations

import io
import os
import re
import tokenize
from pathlib import Path

import libcst as cst

from klaudit.frameworks.trainers import CLASS_HEADER
from klaudit.lint.project import Project, python_files
from klaudit.lint.update_loops import named_beyond_declarations, nearby_modules


def overridden_everywhere(name: str, cls: str, path: str, project: Project) -> bool:
    """Whether method `name` of class `cls` (in the module at `path`) never runs: see the module's docstring."""
    modules = [project.key(path), *nearby_modules(Path(project.key(path)), project, siblings=True)]
    texts = {module: text for module in modules if (text := project.raw_text(module)) is not None and cls in text}
    subclasses = [(module, sub) for module, text in texts.items() for sub, bases in CLASS_HEADER.findall(text)
                  if cls in {base.strip().rsplit(".", 1)[-1] for base in bases.split(",")}]
    if not subclasses or any(named_beyond_declarations(text, cls) for text in texts.values()) or cls in _configured_names(project):
        return False
    return all(_replaces(module, sub, name, cls, project) for module, sub in subclasses)


_CONFIG_FILES = (".yaml", ".yml", ".json", ".toml", ".cfg", ".ini")
_CONFIG_BYTES = 1 << 20  # larger files of these kinds are data (a dataset in JSON), not configuration
_WORD = re.compile(r"[A-Za-z_]\w*")


def _configured_names(project: Project) -> frozenset[str]:
    """The words of the configuration files under the linted roots (a worker class named by its dotted path in a
    YAML file: `worker_cls: roll.pipeline.rlvr.actor_worker.ActorWorker`), read once per project."""
    def read() -> frozenset[str]:
        words: set[str] = set()
        for root in project.roots:
            for folder, subfolders, files in os.walk(root):
                subfolders[:] = [sub for sub in subfolders if not sub.startswith(".")]
                for file in files:
                    path = os.path.join(folder, file)
                    if file.endswith(_CONFIG_FILES) and os.path.getsize(path) <= _CONFIG_BYTES:
                        words.update(_WORD.findall(project.raw_text(path) or ""))
        return frozenset(words)

    return project.remembered(("configured names",), read)


def _replaces(module: str, sub: str, name: str, cls: str, project: Project) -> bool:
    """Whether class `sub` of `module` defines method `name` without calling the base's (`super().name(`,
    `cls.name(self, ...)`)."""
    tree = project.parse(Path(module))
    classdef = next((stmt for stmt in tree.body if isinstance(stmt, cst.ClassDef) and stmt.name.value == sub),
                    None) if tree is not None else None
    method = next((item for item in classdef.body.body if isinstance(item, cst.FunctionDef)
                   and item.name.value == name), None) if classdef is not None else None
    if method is None:
        return False
    code = cst.Module(body=[]).code_for_node(method)
    return re.search(rf"(?:super\([^)]*\)|\b{re.escape(cls)})\.{re.escape(name)}\s*\(", code) is None


def never_named(name: str, project: Project) -> bool:
    """Whether `name`, private (`_step`, not `__call__`), is written nowhere in the project's code but at its
    definitions: see the module's docstring."""
    if not name.startswith("_") or name.startswith("__"):
        return False
    return project.remembered(("named private", name), lambda: not _named_anywhere(name, project))


def _named_anywhere(name: str, project: Project) -> bool:
    word = re.compile(rf"\b{re.escape(name)}\b")
    definition = re.compile(rf"\bdef\s+{re.escape(name)}\b")
    if name in _configured_names(project):
        return True
    for path in python_files(project):
        text = project.raw_text(path)
        if text is None or name not in text:
            continue
        code = _without_comments(text)
        if len(word.findall(code)) > len(definition.findall(code)):
            return True
    return any(name in (project.raw_text(path) or "") for path in _notebooks(project))


def used_elsewhere(name: str, path: str, project: Project) -> bool:
    """Whether a file of the project other than the one at `path` (a Python file or a notebook) writes `name` and
    does not define a function of that name itself (a copy of its own, as a notebook beside the script keeps)."""
    word = re.compile(rf"\b{re.escape(name)}\b")
    definition = re.compile(rf"\bdef\s+{re.escape(name)}\b")
    here = os.path.realpath(path)
    return any(word.search(text) and not definition.search(text)
               for other in (*python_files(project), *_notebooks(project)) if os.path.realpath(other) != here
               and name in (text := project.raw_text(other) or ""))


def _without_comments(text: str) -> str:
    """`text` with its comments blanked (the text as it is where Python's tokenizer cannot read it)."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError):
        return text
    lines = text.splitlines(keepends=True)
    for token in tokens:
        if token.type == tokenize.COMMENT:
            row, start = token.start
            line = lines[row - 1]
            lines[row - 1] = line[:start] + " " * (token.end[1] - start) + line[token.end[1]:]
    return "".join(lines)


def _notebooks(project: Project) -> list[str]:
    """The notebooks under the linted roots, listed once per project."""
    def listed() -> list[str]:
        found: list[str] = []
        for root in project.roots:
            for folder, subfolders, files in os.walk(root) if root.is_dir() else ():
                subfolders[:] = [sub for sub in subfolders if not sub.startswith(".")]
                found += [os.path.join(folder, file) for file in files if file.endswith(".ipynb")]
        return found

    return project.remembered(("notebooks",), listed)
