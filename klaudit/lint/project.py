"""Modules of the linted tree, found by import name and parsed on demand (never imported or run)."""

from __future__ import annotations

import ast
import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import libcst as cst

from klaudit.frameworks.options import Options
from klaudit.lint.roles import NAMED_AGGREGATIONS, is_return_computation, might_contain_kl, speaks_of_logprobs
from klaudit.lint.sources import read_source  # decoded as the engine decodes the files it lints
from klaudit.lint.syntax import libcst_module

T = TypeVar("T")
_CALLED = re.compile(r"(\w+)\s*\(")  # a name written before an opening parenthesis: a call, a definition, a class

class Project:
    """Resolves `import` / `from ... import` of modules that live under the linted roots.

    Modules whose text has no KL vocabulary resolve to nothing (they are not parsed), except
    for a loss helper looked up in them by name (`get_loss_agg_func`, `masked_loss`): an
    aggregation has no KL words of its own, yet the KL flows through it.
    A dotted module name maps to `<root>/<a>/<b>.py` or `<root>/<a>/<b>/__init__.py` for some
    root or some ancestor of a root (so that `import pkg.mod` works when `pkg/` itself is
    linted). Parsed modules are cached; a file that does not parse resolves to nothing.
    """

    def __init__(self, roots: Sequence[str | Path], options: Options | None = None) -> None:
        bases: list[Path] = []
        for root in roots:
            path = Path(root).resolve()
            directory = path if path.is_dir() else path.parent
            for base in (directory, *directory.parents[:3]):
                if base not in bases:
                    bases.append(base)
        self.bases = bases
        self.roots = [Path(root).resolve() for root in roots]
        # the defaults of the project's command-line options and the linted YAML files (klaudit.frameworks.options)
        self.options = options or Options()
        self.configs = self.options.configs
        self._modules: dict[str, cst.Module | None] = {}  # resolved path -> its tree, None where it does not parse
        self._sources: dict[int, str] = {}  # id(parsed tree) -> the text it was parsed from (tree.code, without regenerating it)
        self._texts: dict[str, str | None] = {}  # resolved path -> its text when it has KL vocabulary, else None
        self._defines: dict[tuple[str, str], bool] = {}  # (resolved path, name) -> whether its text may define the name
        self._package_parents: dict[str, list[Path]] | None = None
        self._paths: dict[tuple[str, str | None, int], Path | None] = {}  # module_path's answers
        self._functions: dict[str, dict[str, ast.FunctionDef]] = {}  # resolved path -> its module-level functions
        self._raw_texts: dict[str, str | None] = {}  # resolved path -> its text, for the loss helpers looked up in it
        self._keys: dict[str | Path, str] = {}  # a path as given -> the resolved path, its key in the tables above
        self._called: dict[str, frozenset[str]] = {}  # resolved path -> the names its text writes a call of
        self._derived: dict[tuple, Any] = {}  # `remembered`'s answers

    def key(self, path: str | Path) -> str:
        """The resolved path of `path` (symbolic links and `..` followed), looked up in the file system
        once per path as given: the key of a module in the project's tables."""
        if path not in self._keys:
            try:
                self._keys[path] = str(Path(path).resolve())
            except (OSError, RuntimeError):  # a loop of symbolic links: the path as given names it
                self._keys[path] = str(Path(path).absolute())
        return self._keys[path]

    def module_path(self, dotted: str, importer: str | None = None, level: int = 0) -> Path | None:
        """The file of module `dotted` (relative to `importer` when `level` > 0), if it is in the tree
        (looked up in the file system once per module and importing directory)."""
        key = (dotted, os.path.dirname(importer) if importer is not None else None, level)
        if key not in self._paths:
            self._paths[key] = self._module_path(dotted, importer, level)
        return self._paths[key]

    def _module_path(self, dotted: str, importer: str | None, level: int) -> Path | None:
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
        if importer is not None:
            # a script's own folder comes first on Python's path (`from utils import f` beside train.py);
            # a package's modules import by the package's path instead, the copy they belong to first (a
            # repository that vendors verl twice: each copy's `from verl.trainer.ppo import core_algos` is its own)
            for base in self._importers_path(Path(importer).resolve().parent):
                found = _find(base, parts)
                if found is not None:
                    return found
        for base in self.bases + self.package_parents().get(parts[0], []):
            found = _find(base, parts)
            if found is not None:
                return found
        if importer is not None:
            # a script kept in a package folder and run as `python pkg/train.py` still finds its siblings
            # (microRLHF's `from rl_utils import ...` in rlhf/, which has an __init__.py)
            found = _find(Path(importer).resolve().parent, parts)
            if found is not None:
                return found
        return installed_model(dotted)

    def _importers_path(self, folder: Path) -> list[Path]:
        """The folders an import in `folder` may be run from, nearest first: `folder` itself and each folder
        above it that is no package (an __init__.py makes one), up to the linted root that holds it."""
        root = next((root for root in self.roots if folder.is_relative_to(root)), None)
        if root is None:
            return [] if (folder / "__init__.py").is_file() else [folder]
        found = []
        for base in (folder, *folder.parents):
            if not (base / "__init__.py").is_file():
                found.append(base)
            if base == root:
                break
        return found

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

    def follows(self, path: Path, name: str | None = None) -> bool:
        """Whether the analysis follows a call of `name` (any name, where None) into the module at
        `path`: its text has KL vocabulary, or it is a package's __init__, or `name` speaks of a loss or a
        reduction (a loss helper: an aggregation has no KL words of its own, yet the KL flows through it) or
        of log-probs (`forward_logprobs`: what a KL is made of, in a trainer module with no KL words; a
        project's own `log_softmax(logits, ids)`, which gathers the sampled tokens' log-probs where torch's takes
        a dim) or of returns (`discount_cumsum`: a KL reward's reward-to-go, computed in a utilities module). The
        answer depends on the module and the name only, never on what was looked up before."""
        return self._text(self.key(path)) is not None or (name is not None and (
            names_loss_helper(name) or speaks_of_logprobs(name) or _LOG_SOFTMAX.search(name) is not None
            or is_return_computation(name)))

    def _admitted(self, key: str) -> str | None:
        """The text of the module file `key` whatever its vocabulary: a loss helper is looked up in it."""
        if key not in self._raw_texts:
            try:
                text = read_source(key)
            except OSError:
                text = None
            self._raw_texts[key] = text if isinstance(text, str) else None
        return self._raw_texts[key]

    def raw_text(self, path: str | Path) -> str | None:
        """The text of the module file at `path`, whatever its vocabulary (read once); None where it cannot be read."""
        return self._admitted(self.key(path))

    def called_names(self, path: str | Path) -> frozenset[str]:
        """The names the text of the module file at `path` writes a call of (`name(`, `.name(`; in comments and
        strings too, which only add names), read once: whether a module may call a function, without a search."""
        key = self.key(path)
        if key not in self._called:
            self._called[key] = frozenset(_CALLED.findall(self._admitted(key) or ""))
        return self._called[key]

    def remembered(self, key: tuple, compute: Callable[[], T]) -> T:
        """`compute()`, once per `key` for this project: a fact derived from its files (the modules near one),
        kept as long as the project is."""
        if key not in self._derived:
            self._derived[key] = compute()
        return self._derived[key]

    def may_define(self, path: Path, name: str, any_text: bool = False) -> bool:
        """Whether the module at `path` may define a function or class `name` (its text has `def name`
        or `class name`), so that resolving a call into it is worth parsing it; a module parsed
        already is looked up in its tree instead. `any_text`: whatever its vocabulary (a base class)."""
        key = self.key(path)
        if not any_text and not self.follows(path, name):
            return False
        if key in self._modules:
            return True
        if (key, name) not in self._defines:
            text = self._text(key) or self._admitted(key)
            written = rf"(?:def|class)(?:\s|\\)+{re.escape(name)}(?!\w)"
            if Path(key).name == "__init__.py":  # or re-exported from a module of the package
                written = rf"{written}|\b{re.escape(name)}\b"
            self._defines[key, name] = text is not None and re.search(written, text) is not None
        return self._defines[key, name]

    def module_function(self, path: Path, function: str) -> ast.FunctionDef | None:
        """The module-level function `function` of the module at `path`, read from Python's own tree (a module the
        analysis does not follow has no KL words: nothing is interpreted)."""
        key = self.key(path)
        if key not in self._functions:
            tree = ast.Module(body=[], type_ignores=[])
            try:
                text = read_source(key)
                if isinstance(text, str):
                    tree = ast.parse(text)
            except (OSError, SyntaxError, ValueError, RecursionError):
                pass
            self._functions[key] = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}
        return self._functions[key].get(function)

    def parse(self, path: Path) -> cst.Module | None:
        key = self.key(path)
        if key not in self._modules:
            text = self._text(key) or self._admitted(key)  # asked for after may_define said yes
            tree = None
            try:
                tree = libcst_module(text) if text is not None else None
            except (cst.ParserSyntaxError, cst.CSTValidationError, RecursionError):
                pass
            self._modules[key] = tree
            if tree is not None and text is not None:
                self._sources[id(tree)] = text
        return self._modules[key]

    def parsed(self, path: str, source: str) -> cst.Module | None:
        """The tree already parsed from `source` for the file `path` (it was followed as an import
        of a file analysed before it), if any."""
        tree = self._modules.get(self.key(path))
        return tree if tree is not None and self._sources.get(id(tree)) == source else None

    def remember(self, path: str, module: cst.Module, source: str) -> cst.Module:
        """The tree to analyse `path` with: the one already parsed for it (when another module
        imported it), else `module`, which the engine parsed from `source`. One tree per file,
        so that the nodes the analysis reports are nodes of the tree the report locates them in."""
        key = self.key(path)
        tree = self._modules.get(key)
        if tree is None:
            tree = self._modules[key] = module
            self._sources[id(module)] = source
        return tree

    def path_of(self, tree: cst.Module) -> str | None:
        """The file `tree` was parsed from, as a key of the project."""
        return next((key for key, parsed in self._modules.items() if parsed is tree), None)

    def source(self, tree: cst.Module) -> str:
        """The text `tree` was parsed from (libcst round-trips it exactly)."""
        text = self._sources.get(id(tree))
        return text if text is not None else tree.code


# a function named as a loss helper (`get_loss_agg_func`, `agg_loss`) or as a reduction a loss goes through
# (`sum_sum`, `token_average`; those read by name, `masked_mean`, keep that reading): followed into any module
_LOSS_HELPER = re.compile(r"loss", re.IGNORECASE)
_REDUCTION_HELPER = re.compile(r"(?<![a-z])(?:sum|mean|avg|average|agg|aggregate|reduce)(?![a-z])", re.IGNORECASE)
# a project's log-softmax helper (`log_softmax(logits, ids)`, `selective_log_softmax`): followed into any module
_LOG_SOFTMAX = re.compile(r"log_?softmax", re.IGNORECASE)


def python_files(project: Project) -> list[str]:
    """Every Python file under the project's roots (a root that is a file is itself one), hidden and build folders
    left out as `Project.package_parents` leaves them, listed once per project."""
    def listed() -> list[str]:
        found: list[str] = []
        for root in project.roots:
            if root.is_file():
                found.append(str(root))
                continue
            for directory, subdirs, files in os.walk(root):
                subdirs[:] = sorted(d for d in subdirs if not d.startswith(".") and d not in _SKIPPED)
                found += [os.path.join(directory, file) for file in sorted(files) if file.endswith(".py")]
        return found
    return project.remembered(("python files",), listed)


def names_loss_helper(name: str) -> bool:
    """A loss helper's or a reduction's name (`get_loss_agg_func`, `seq_mean_token_mean`), not one read by name."""
    return _LOSS_HELPER.search(name) is not None or (
        _REDUCTION_HELPER.search(name) is not None and name not in NAMED_AGGREGATIONS)


# klaudit's own estimators are the correct configurations, proven by exact enumeration: a call of
# them is a correct KL term, not code to re-derive (their prefix-weighted surrogates are beyond the lint)
OPAQUE_PACKAGE = "klaudit"

# klaudit's models of frameworks' KL code, for trees that import an installed framework without holding it
INSTALLED = Path(__file__).with_name("installed")


def installed_model(dotted: str) -> Path | None:
    """klaudit's model of the framework module `dotted` (`verl.trainer.ppo.core_algos`), if it has one."""
    model = INSTALLED / f"{dotted}.py"
    return model if model.is_file() else None


def is_installed_model(path: str | Path) -> bool:
    """Whether `path` is one of klaudit's models of an installed framework's module."""
    return Path(path).parent == INSTALLED


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


def integer_default(definition: ast.FunctionDef, parameters: tuple[str, ...]) -> int | None:
    """The integer default of the first of `parameters` that the function `definition` has
    (`def masked_mean(x, mask, dim=1)` -> 1), else None."""
    signature = definition.args
    positional = signature.posonlyargs + signature.args
    defaults = dict(zip([a.arg for a in positional][len(positional) - len(signature.defaults):], signature.defaults))
    defaults.update((a.arg, d) for a, d in zip(signature.kwonlyargs, signature.kw_defaults) if d is not None)
    for name in parameters:
        if name in defaults:
            try:
                value = ast.literal_eval(defaults[name])
            except ValueError:
                return None
            return value if isinstance(value, int) and not isinstance(value, bool) else None
    return None


def sums_each_row(definition: ast.FunctionDef, parameters: tuple[str, ...]) -> bool:
    """Whether the function `definition`, with none of `parameters` (no axis to choose), divides by a count summed
    along a fixed non-first axis: safe-rlhf's `masked_mean(x, mask)`, `((x * mask).sum(dim=-1) /
    mask.sum(dim=-1)).mean()`, averages each row by its own length."""
    if {a.arg for a in (*definition.args.args, *definition.args.kwonlyargs)} & set(parameters):
        return False
    return any(isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) and any(
        isinstance(part, ast.Call) and isinstance(part.func, ast.Attribute) and part.func.attr == "sum"
        and _fixed_axis(part, parameters) not in (None, 0) for part in ast.walk(node.right))
        for node in ast.walk(definition))


def _fixed_axis(call: ast.Call, names: tuple[str, ...]) -> int | None:
    """The literal integer axis of a reduction call (`x.sum(-1)`, `x.sum(dim=1)`), else None."""
    given = [keyword.value for keyword in call.keywords if keyword.arg in names] or call.args[:1]
    try:
        value = ast.literal_eval(given[0]) if given else None
    except ValueError:
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) else None
