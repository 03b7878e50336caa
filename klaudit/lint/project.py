"""Modules of the linted tree, found by import name and parsed on demand (never imported or run)."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path

import libcst as cst

from klaudit.lint.roles import might_contain_kl
from klaudit.lint.sources import read_source  # decoded as the engine decodes the files it lints


class Project:
    """Resolves `import` / `from ... import` of modules that live under the linted roots.

    Modules whose text has no KL vocabulary resolve to nothing (they are not parsed), except
    for a loss helper looked up in them by name (`get_loss_agg_func`, `masked_loss`): an
    aggregation has no KL words of its own, yet the KL flows through it.
    A dotted module name maps to `<root>/<a>/<b>.py` or `<root>/<a>/<b>/__init__.py` for some
    root or some ancestor of a root (so that `import pkg.mod` works when `pkg/` itself is
    linted). Parsed modules are cached; a file that does not parse resolves to nothing.
    """

    def __init__(self, roots: Sequence[str | Path]) -> None:
        bases: list[Path] = []
        for root in roots:
            path = Path(root).resolve()
            directory = path if path.is_dir() else path.parent
            for base in (directory, *directory.parents[:3]):
                if base not in bases:
                    bases.append(base)
        self.bases = bases
        self.roots = [Path(root).resolve() for root in roots]
        self._modules: dict[str, cst.Module | None] = {}  # resolved path -> its tree, None where it does not parse
        self._sources: dict[int, str] = {}  # id(parsed tree) -> the text it was parsed from (tree.code, without regenerating it)
        self._texts: dict[str, str | None] = {}  # resolved path -> its text when it has KL vocabulary, else None
        self._defines: dict[tuple[str, str], bool] = {}  # (resolved path, name) -> whether its text may define the name
        self._package_parents: dict[str, list[Path]] | None = None

    def module_path(self, dotted: str, importer: str | None = None, level: int = 0) -> Path | None:
        """The file of module `dotted` (relative to `importer` when `level` > 0), if it is in the tree."""
        parts = [p for p in dotted.split(".") if p]
        if not level and parts[:1] == [OPAQUE_PACKAGE]:
            return None
        if level:
            if importer is None:
                return None
            base = Path(importer).resolve().parent
            for _ in range(level - 1):
                base = base.parent
            return _find(base, parts)
        for base in self.bases + self.package_parents().get(parts[0], []):
            found = _find(base, parts)
            if found is not None:
                return found
        return None

    def package_parents(self) -> dict[str, list[Path]]:
        """Top-level package name -> the directories that hold it, anywhere under the roots
        (a wheel unpacked as name.data/purelib/pkg, a src/ layout)."""
        if self._package_parents is None:
            found: dict[str, list[Path]] = {}
            for root in self.roots:
                if not root.is_dir():
                    continue
                for directory, subdirs, files in os.walk(root):
                    subdirs[:] = [d for d in subdirs if not d.startswith(".") and d not in _SKIPPED]
                    if "__init__.py" in files:
                        parent = Path(directory).parent
                        if not (parent / "__init__.py").is_file():
                            found.setdefault(Path(directory).name, []).append(parent)
            self._package_parents = found
        return self._package_parents

    def _text(self, key: str) -> str | None:
        """The text of the module file `key` (a resolved path) if it has KL or log-prob vocabulary, or is
        a package's __init__ (which may re-export a loss helper: `from .loss import agg`): another
        module cannot contribute a KL fact, and is never parsed."""
        if key not in self._texts:
            try:
                text = read_source(key)
            except OSError:
                text = None
            self._texts[key] = text if isinstance(text, str) and (might_contain_kl(text) or Path(key).name == "__init__.py") else None
        return self._texts[key]

    def _admit(self, key: str) -> str | None:
        """The text of `key` though it has no KL vocabulary, kept from now on (so it parses): it
        was asked for a loss helper."""
        try:
            text = read_source(key)
        except OSError:
            return None
        self._texts[key] = text if isinstance(text, str) else None
        return self._texts[key]

    def may_define(self, path: Path, name: str) -> bool:
        """Whether the module at `path` may define a function or class `name` (its text has `def name`
        or `class name`), so that resolving a call into it is worth parsing it; a module parsed
        already is looked up in its tree instead."""
        key = str(Path(path).resolve())
        if key in self._modules:
            return True
        if (key, name) not in self._defines:
            text = self._text(key)
            if text is None and _LOSS_HELPER.search(name):
                text = self._admit(key)
            written = rf"(?:def|class)(?:\s|\\)+{re.escape(name)}(?!\w)"
            if Path(key).name == "__init__.py":  # or re-exported from a module of the package
                written = rf"{written}|\b{re.escape(name)}\b"
            self._defines[key, name] = text is not None and re.search(written, text) is not None
        return self._defines[key, name]

    def parse(self, path: Path) -> cst.Module | None:
        key = str(Path(path).resolve())
        if key not in self._modules:
            text = self._text(key)
            tree = None
            try:
                tree = cst.parse_module(text) if text is not None else None
            except (cst.ParserSyntaxError, cst.CSTValidationError, RecursionError):
                pass
            self._modules[key] = tree
            if tree is not None and text is not None:
                self._sources[id(tree)] = text
        return self._modules[key]

    def parsed(self, path: str, source: str) -> cst.Module | None:
        """The tree already parsed from `source` for the file `path` (it was followed as an import
        of a file analysed before it), if any."""
        tree = self._modules.get(str(Path(path).resolve()))
        return tree if tree is not None and self._sources.get(id(tree)) == source else None

    def remember(self, path: str, module: cst.Module, source: str) -> cst.Module:
        """The tree to analyse `path` with: the one already parsed for it (when another module
        imported it), else `module`, which the engine parsed from `source`. One tree per file,
        so that the nodes the analysis reports are nodes of the tree the report locates them in."""
        key = str(Path(path).resolve())
        tree = self._modules.get(key)
        if tree is None:
            tree = self._modules[key] = module
            self._sources[id(module)] = source
        return tree

    def source(self, tree: cst.Module) -> str:
        """The text `tree` was parsed from (libcst round-trips it exactly)."""
        text = self._sources.get(id(tree))
        return text if text is not None else tree.code


# a function named as a loss helper (`get_loss_agg_func`, `agg_loss`): followed into any module
_LOSS_HELPER = re.compile(r"loss", re.IGNORECASE)

# klaudit's own estimators are the correct configurations, proven by exact enumeration: a call of
# them is a correct KL term, not code to re-derive (their prefix-weighted surrogates are beyond the lint)
OPAQUE_PACKAGE = "klaudit"

_SKIPPED = {"__pycache__", "node_modules", "build", "dist", "venv", ".venv", "site-packages"}


def _find(base: Path, parts: list[str]) -> Path | None:
    if not parts:
        init = base / "__init__.py"
        return init if init.is_file() else None
    candidate = base.joinpath(*parts)
    as_file = candidate.with_suffix(".py")
    if as_file.is_file():
        return as_file
    init = candidate / "__init__.py"
    return init if init.is_file() else None
