"""Methods that never run: a base class's method every subclass overrides, where nothing builds the base itself.

A trainer module often keeps the class it started from (`DiffuGRPOTrainer`) beside the subclass the project trains
with (`DiffuGSPOTrainer(DiffuGRPOTrainer)`, whose own `compute_loss` replaces the base's). Where every class of the
project deriving from the base defines the method again without calling the base's (`super().compute_loss(...)`),
and the base is named nowhere but as a base, in an import or at its definition (no `DiffuGRPOTrainer(...)`, no
`trainer_cls = DiffuGRPOTrainer`, no `__all__` entry), the base's method is code no run executes.

So is a private function or method (`_grpo_step`, one leading underscore) whose name no code of the project
writes but at its own `def`: a trainer keeps its first, per-prompt step beside the batched one it now calls.
Comments do not count (MonetVLM's comment names the old step); notebooks and configuration files do.

So, last, are the methods of a class whose one use is commented out, where the whole project is linted: forks of a
multimodal GRPO project keep the upstream trainers (`Qwen2VLGRPOTrainer`, `Qwen2VLGRPOVLLMTrainer`) exported from
their package beside the one their entry script now builds, the line that chose between them commented out
(`# trainer_cls = Qwen2VLGRPOTrainer if ... else Qwen2VLGRPOVLLMTrainer`). A class no code names but at its
definition, in imports or in `__all__`, that no class derives from, that carries no decorator (a registry may build
it) and that no notebook, configuration, launch script or document names, yet that a comment written as code builds,
is built by no run. So is such a trainer class (`...Trainer...`) that a package's `__init__.py` exports beside
another trainer that code outside the package builds (or derives from): the fork's entry script picks its trainer
from the package and leaves the upstream ones (Seg-R1's `SegR1Trainer(Qwen2VLGRPOVLLMTrainerModified)` beside
`Qwen2VLGRPOTrainer`, imported and never used). A class nothing names at all, or one whose package the project never
builds a trainer from, stays a library's (a user builds it), and is judged. An entry script's use of a trainer that
it picks by TRL's `use_vllm` where every launch of the script writes the flag the other way (kokolerk/TON launches
with `--use_vllm true`: klaudit.lint.flag_choices) is no use either. Only where a linted folder is the
project's root (a repository, something installed, or a tree with no project above it) is any of this known: a
trainer linted alone, or one folder of a repository, may be built elsewhere.
"""

from __future__ import annotations

import ast
import io
import os
import re
import tokenize
from pathlib import Path

import libcst as cst

from klaudit.frameworks.trainers import CLASS_HEADER
from klaudit.frameworks.versions import CHECKOUT_UPSTREAM_FOLDERS, is_project_root, project_root
from klaudit.lint import flag_choices
from klaudit.lint.project import Project, python_files
from klaudit.lint.syntax import python_ast
from klaudit.lint.update_loops import named_beyond_declarations, nearby_modules


def overridden_everywhere(name: str, cls: str, path: str, project: Project) -> bool:
    """Whether method `name` of class `cls` (in the module at `path`) never runs: see the module's docstring."""
    modules = [project.key(path), *nearby_modules(Path(project.key(path)), project, siblings=True)]
    texts = {module: text for module in modules if (text := project.raw_text(module)) is not None and cls in text}
    subclasses = [(module, sub) for module, text in texts.items() for sub in _subclasses(text, cls)]
    if not subclasses or any(named_beyond_declarations(text, cls) for text in texts.values()) or cls in _configured_names(project):
        return False
    return all(_replaces(module, sub, name, cls, project) for module, sub in subclasses)


def _subclasses(text: str, cls: str) -> list[str]:
    """The classes `text` defines that derive from `cls` (`class Sub(Base)`, `class Sub(pkg.Base, Mixin)`)."""
    return [sub for sub, bases in CLASS_HEADER.findall(text)
            if cls in {base.strip().rsplit(".", 1)[-1] for base in bases.split(",")}]


_CONFIG_FILES = (".yaml", ".yml", ".json", ".toml", ".cfg", ".ini")
_CONFIG_BYTES = 1 << 20  # larger files of these kinds are data (a dataset in JSON), not configuration
_WORD = re.compile(r"[A-Za-z_]\w*")


def _configured_names(project: Project) -> frozenset[str]:
    """The words of the configuration files under the linted roots (a worker class named by its dotted path in a
    YAML file: `worker_cls: roll.pipeline.rlvr.actor_worker.ActorWorker`), read once per project."""
    def read() -> frozenset[str]:
        return frozenset(word for path in _files(project, _CONFIG_FILES) for word in _WORD.findall(project.raw_text(path) or ""))

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


def never_built(cls: str, path: str, project: Project) -> bool:
    """Whether class `cls` of the module at `path` is built by no run of the project, its use commented out or its
    package's other exports the ones the project builds: see the module's docstring."""
    if not _whole_project_holds(Path(project.key(path)), project):
        return False
    def decided() -> bool:
        naming = {module: text for module in python_files(project) if cls in (text := project.raw_text(module) or "")}
        if _built_anywhere(cls, naming, project):
            return _built_only_upstream(cls, path, naming, project)
        return any(_built_in_a_comment(text, cls) for text in naming.values()) \
            or any(_built_by_code(sibling, package, project) for sibling, package in _exported_beside(cls, naming))

    return project.remembered(("never built", cls), decided)


def _whole_project_holds(module: Path, project: Project) -> bool:
    """Whether a linted folder holding `module` is the project's root, or has no project's root above it."""
    return any(root.is_dir() and module.is_relative_to(root)
               and (is_project_root(root) or project_root(root.parent) is None) for root in project.roots)


# the files besides code and notebooks that may name a class to build: configurations, launches, documentation
_NAMING_FILES = _CONFIG_FILES + (".sh", ".bash", ".slurm", ".md", ".rst", ".txt")


def _built_anywhere(cls: str, naming: dict[str, str], project: Project, left_out: Path | None = None) -> bool:
    """Whether a Python text of the project that names `cls` (`naming`: module -> text) uses it (also under a name it
    imports it as), but for an entry script that picks it by a flag every launch of it writes the other way
    (klaudit.lint.flag_choices), derives from it or decorates it, or a notebook, configuration, launch script or
    document names it; with `left_out`, a carried checkout, not one in that checkout's upstream folders."""
    word = re.compile(rf"(?<!\w){re.escape(cls)}(?!\w)")
    return any(_built_in(text, cls) and not _picked_by_no_launch(cls, module, text, project) or _decorated(text, cls)
               for module, text in naming.items() if not _upstream_of(module, left_out)) \
        or any(word.search(project.raw_text(path) or "") for path in _files(project, _NAMING_FILES + (".ipynb",))
               if not _upstream_of(path, left_out))


def _built_only_upstream(cls: str, path: str, naming: dict[str, str], project: Project) -> bool:
    """Whether `cls` belongs to a checkout of another project carried in the linted one (a folder with its own
    packaging below a linted root: NVlabs/GDPO's `trl-GDPO/trl-0.18.0-gdpo/`, a copy of TRL's repository) and only
    that checkout's own tests, examples and documentation build it (TRL's GKDTrainer): upstream's uses, no run."""
    checkout = _carried_checkout(Path(project.key(path)), project)
    return checkout is not None and not _built_anywhere(cls, naming, project, left_out=checkout)


def _carried_checkout(module: Path, project: Project) -> Path | None:
    """The nearest project root above `module` that lies below a linted root, not that root itself, where that root
    is a repository of its own (a packaging or version-control marker, or a README at its top) and not a folder that
    merely holds several projects side by side."""
    checkout = project_root(module.parent)
    return checkout if checkout is not None and any(
        checkout != root and checkout.is_relative_to(root) and _a_repository(root) for root in project.roots) else None


def _a_repository(folder: Path) -> bool:
    """Whether `folder` is a project of its own: a project root, or a README at its top (an archive of a repository
    has no .git)."""
    return is_project_root(folder) or any(folder.glob("README*"))


def _upstream_of(path: str, checkout: Path | None) -> bool:
    """Whether `path` lies in one of the upstream folders of the carried `checkout`."""
    if checkout is None or not Path(path).is_relative_to(checkout):
        return False
    parts = Path(path).relative_to(checkout).parts
    return len(parts) > 1 and parts[0] in CHECKOUT_UPSTREAM_FOLDERS


def _picked_by_no_launch(cls: str, module: str, text: str, project: Project) -> bool:
    """klaudit.lint.flag_choices.picks_only_unlaunched of the entry script `module` and the project's launches."""
    if flag_choices.FLAG not in text:
        return False
    launchers = {path: project.raw_text(path) or "" for path in _files(project, _LAUNCHERS)}
    code = (project.raw_text(path) or "" for path in python_files(project))
    return flag_choices.picks_only_unlaunched(cls, module, text, launchers, code)


_LAUNCHERS = (".sh", ".bash", ".slurm")


def _exported_beside(cls: str, naming: dict[str, str]) -> set[tuple[str, str]]:
    """(trainer, package folder) of each other trainer class (`...Trainer...`) that a package's `__init__.py` among
    `naming` (module: text) imports along with the trainer `cls`: `from .grpo_trainer import Qwen2VLGRPOTrainer`
    beside `from .vllm import VLLMTrainer`."""
    siblings: set[tuple[str, str]] = set()
    for module, text in naming.items() if _TRAINER in cls else ():
        if os.path.basename(module) != "__init__.py":
            continue
        try:
            tree = python_ast(text)
        except (SyntaxError, ValueError, RecursionError):
            continue
        imported = {alias.asname or alias.name for node in tree.body if isinstance(node, ast.ImportFrom)
                    for alias in node.names}
        if cls in imported:
            siblings |= {(name, os.path.dirname(module)) for name in imported - {cls} if _TRAINER in name}
    return siblings


_TRAINER = "Trainer"  # the word of a trainer class's name (`Qwen2VLGRPOTrainer`, `SegR1Trainer`)


def _built_in(text: str, cls: str) -> bool:
    """Whether the Python `text` uses class `cls`, also under a name it imports it as (`from .trainer import
    VideoTrainer as GRPOTrainer`), or derives a class from it."""
    aliases = re.findall(rf"(?<!\w){re.escape(cls)}\s+as\s+(\w+)", text)
    return named_beyond_declarations(text, cls) or bool(_subclasses(text, cls)) \
        or any(named_beyond_declarations(text, alias) for alias in aliases)


def _built_by_code(cls: str, package: str, project: Project) -> bool:
    """Whether Python code of the project outside the folder `package` uses class `cls` (also under a name it imports
    it as) or derives a class from it: the entry that builds a trainer the package exports."""
    def decided() -> bool:
        return any(_built_in(text, cls) for module in python_files(project)
                   if cls in (text := project.raw_text(module) or "") and os.path.dirname(module) != package)

    return project.remembered(("built by code", cls, package), decided)


def _built_in_a_comment(text: str, cls: str) -> bool:
    """Whether a comment of `text` is a line of code that uses class `cls` (`# trainer = GRPOTrainer(` or
    `# trainer_cls = GRPOTrainer if vllm else VLLMTrainer`), not prose about it, an import or an export."""
    for line in text.splitlines():
        comment = line.lstrip()
        if not comment.startswith("#") or cls not in comment:
            continue
        code = comment.lstrip("#").strip()
        if re.search(rf"(?<!\w){re.escape(cls)}\s*\(", code) or _parses(code):
            if named_beyond_declarations(code, cls):
                return True
    return False


def _parses(code: str) -> bool:
    try:
        python_ast(code)  # quietly: a comment's invalid escape is not klaudit's to warn about
    except (SyntaxError, ValueError, RecursionError):
        return False
    return True


def _decorated(text: str, cls: str) -> bool:
    """Whether `text` defines class `cls` under a decorator (`@register("grpo")` above `class GRPOTrainer`)."""
    return re.search(rf"^[ \t]*@[^\n]*\n(?:[ \t]*(?:@|#)[^\n]*\n)*[ \t]*class[ \t]+{re.escape(cls)}\b", text,
                     re.MULTILINE) is not None


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
    return _files(project, (".ipynb",))


def _files(project: Project, suffixes: tuple[str, ...]) -> list[str]:
    """The files under the linted roots whose names end with one of `suffixes`, hidden folders left out, listed once
    per project; none but a notebook larger than `_CONFIG_BYTES` (a dataset in JSON, a log: not text that names code)."""
    def listed() -> list[str]:
        found: list[str] = []
        for root in project.roots:
            for folder, subfolders, files in os.walk(root) if root.is_dir() else ():
                subfolders[:] = [sub for sub in subfolders if not sub.startswith(".")]
                for file in files:
                    path = os.path.join(folder, file)
                    if file.endswith(suffixes) and (file.endswith(".ipynb") or os.path.getsize(path) <= _CONFIG_BYTES):
                        found.append(path)
        return found

    return project.remembered(("files", suffixes), listed)
