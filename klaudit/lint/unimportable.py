"""Modules of a package Python cannot import: an `__init__.py` of the package, or of one around it, that Python
rejects (the KL000 the lint reports there), or that imports a module of its own folder the project does not have,
stops every `import package.module` before the module runs.

jzhws/VisualQualityAssessment-RL-Trainer's `src/open_r1/trainer/__init__.py` imports `.grpo_trainer_refine-iqa`
(a hyphen is no name): every trainer of that package, and every script importing it, fails at import, so their KL
code never trains; so do xavierliu34/GUI-AiF's, whose `__init__.py` imports `.Dbeta`, of which the repository holds
only a compiled copy under `__pycache__` (Python 3 imports no such copy without its source). Such a module is not
analysed, only its syntax checked. A script (`if __name__ == "__main__":`) can still be run by its path, which
imports no package around it, and is analysed as usual; so is a file named on the command line.

A module whose own relative import names a module its package lacks fails however it is reached, a script too,
unless it is copied into a framework's package first: where no other file names it (no import, launch, or
instruction to copy it), it is a stranded copy and is not analysed either. juzizi44/GRPO4CodeGen_v2's
`grpo/trl_grpo_trainer.py`, a copy of TRL's trainer, imports `..data_utils` and `.grpo_config`, which the project
does not have, and nothing names it (the project trains a subclass of the installed TRL's trainer).

A module that imports a name its project module does not have (`from reward import CoverageRewardModel` beside a
rewritten `reward.py` that no longer mentions it) fails at that import too, a script as well: Brian-Konr/d2qplus's
two PPO scripts never train. So does every module of a package whose `__init__.py` does so.
"""

from __future__ import annotations

import ast
import os
import re
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from klaudit.frameworks.versions import project_root
from klaudit.lint.copies import named_elsewhere, stem
from klaudit.lint.syntax import is_script, python_ast
from klaudit.text import read_text


def unimportable(walked: Mapping[str, str], broken: Callable[[str], bool]) -> frozenset[str]:
    """The paths among `walked` (Python files found by walking a folder: path -> source) inside a package whose
    `__init__.py`, or an enclosing package's, cannot be imported (`broken(path)`: the KL000 of that file, or
    `imports_a_missing_module`)."""
    failing: dict[str, bool] = {}  # folder -> whether importing it fails

    def fails(folder: str) -> bool:
        if folder not in failing:
            init = os.path.join(folder, "__init__.py")
            parent = os.path.dirname(folder)
            failing[folder] = os.path.isfile(init) and (broken(init) or (parent != folder and fails(parent)))
        return failing[folder]

    return frozenset(path for path, source in walked.items()
                     if os.path.basename(path) != "__init__.py" and not is_script(source)
                     and fails(os.path.dirname(path)))


def stranded_copies(walked: Mapping[str, str], texts: Callable[[], Iterable[tuple[str, str]]]) -> frozenset[str]:
    """The paths among `walked` (not `__init__.py`) whose own relative imports name a module their package lacks
    (`imports_a_missing_module`) and whose name no other file of the project holds (`texts`: (path, text) of each,
    read only where such a module is found): a framework's module copied in and left, which no import, launch or
    instruction uses. One a README tells the user to copy over the installed framework's (`cp grpo_trainer.py
    .../trl/trainer/`) is named there, and linted as the code it replaces."""
    stranded = {path for path, source in walked.items()
                if os.path.basename(path) != "__init__.py" and imports_a_missing_module(path, source, above=True)}
    if not stranded:
        return frozenset()
    named = named_elsewhere({stem(path) for path in stranded}, texts())
    return frozenset(path for path in stranded if not named.get(stem(path), set()) - {path})


# modules a build writes into a package (setuptools-scm's `_version.py`, protoc's `*_pb2.py`): absent from a
# checkout, present once installed
_GENERATED = re.compile(r"^_|version|_pb2(?:_grpc)?$", re.IGNORECASE)


def imports_a_missing_module(path: str, source: str, above: bool = False) -> bool:
    """Whether the module at `path` imports, unconditionally, a module of its own folder (`from .name import ...`),
    or with `above` also of a folder above it (`from ..name import ...`), of which that folder holds no source,
    package or extension under any suffix; modules a build generates are left out. Such an import fails however
    the module is reached (`import package.module`, `python -m`, or run by its path, which knows no package)."""
    try:
        module = python_ast(source)
    except (SyntaxError, ValueError):
        return False
    present: dict[str, set[str] | None] = {}  # folder -> the names of its entries (None where it cannot be read)
    for statement in module.body:  # module level only: an import under `try:` or `if` may be meant to fail
        if not (isinstance(statement, ast.ImportFrom) and statement.module and (
                statement.level == 1 or above and statement.level > 1)):
            continue
        folder = os.path.dirname(os.path.abspath(path))  # `./trainer.py`'s `..` is the folder above the working one
        for _ in range(statement.level - 1):
            folder = os.path.dirname(folder)
        if folder not in present:
            try:
                present[folder] = {entry.split(".", 1)[0] for entry in os.listdir(folder) if entry != "__pycache__"}
            except OSError:
                present[folder] = None
        names = present[folder]
        name = statement.module.split(".", 1)[0]
        if names is not None and name not in names and not _GENERATED.search(name):
            return True
    return False


def imports_a_missing_name(path: str, source: str, sources: Mapping[str, str] | None = None) -> bool:
    """Whether the module at `path` imports, unconditionally, a name that the module of the project it imports it
    from does not have: `from reward import CombinedReward` beside a `reward.py` (in a folder that is no package, so
    run as a script it imports its neighbour) or `from .reward import ...`, where that module's text never even
    mentions the name, imports nothing with `*`, defines no module `__getattr__`, and its package holds no submodule
    of that name. Such an import fails however the module is reached, a script too. An absolute import is left
    alone where another module of `sources` (path -> text) of that name mentions it: a path set up at run time
    (`sys.path.insert`) may reach that one first."""
    try:
        module = python_ast(source)
    except (SyntaxError, ValueError):
        return False
    here = os.path.dirname(os.path.abspath(path))
    for statement in module.body:  # module level only: an import under `try:` or `if` may be meant to fail
        if not isinstance(statement, ast.ImportFrom) or not statement.module:
            continue
        if statement.level == 0 and os.path.isfile(os.path.join(here, "__init__.py")):
            continue  # a package's module imports absolutely from the path, not from its folder
        folder = here
        for _ in range(max(statement.level - 1, 0)):
            folder = os.path.dirname(folder)
        target = os.path.join(folder, *statement.module.split("."))
        suffix = os.sep + os.path.join(*statement.module.split(".")) + ".py"
        alike = [other for other_path, other in (sources or {}).items()
                 if statement.level == 0 and os.path.abspath(other_path).endswith(suffix)]
        text = _source_of(target)
        # `from trainer.gen_worker import ...` run from the project's root; not a module of one name that no file
        # beside the script holds, the installed package of that name (`from datasets import load_dataset`, beside
        # a utils/datasets.py of the project's own)
        if text is None and alike and "." in statement.module:
            text, alike = alike[0], alike[1:]
        if text is None or re.search(r"import\s+\*|def\s+__getattr__", text):
            continue
        for alias in statement.names:
            name = alias.name
            if name == "*" or _source_exists(os.path.join(target, name)):
                continue
            if not any(_binds(other, name) for other in [text, *alike]):
                return True
    return False


# the top-level statements whose bodies hold module-level bindings (`if TYPE_CHECKING:`, `try: import x`)
_BLOCKS = (ast.If, ast.Try, ast.For, ast.While, ast.With)


def _binds(text: str, name: str) -> bool:
    """Whether a module's text binds `name` at module level (a def, class, assignment or import, also under a
    top-level `if`/`try`/`for`/`with`), or, where it does not parse, mentions it at all. A mention in a string or a
    comment (`print("[gen_worker] ...")`) binds nothing."""
    if re.search(rf"\b{re.escape(name)}\b", text) is None:
        return False
    try:
        module = python_ast(text)
    except (SyntaxError, ValueError):
        return True
    pending: list[ast.stmt] = list(module.body)
    while pending:
        statement = pending.pop()
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if statement.name == name:
                return True
            continue
        if isinstance(statement, (ast.Import, ast.ImportFrom)):
            if any((alias.asname or alias.name.split(".")[0]) == name for alias in statement.names):
                return True
            continue
        if isinstance(statement, _BLOCKS):  # a block's own statements bind, each looked at in turn
            pending.extend(child for child in ast.iter_child_nodes(statement) if isinstance(child, ast.stmt))
        elif any(isinstance(node, ast.Name) and node.id == name and isinstance(node.ctx, ast.Store)
                 for node in ast.walk(statement)):
            return True
    return False


# what a module of the path may be besides a source file: a package, bytecode or an extension
_IMPORTABLE_SUFFIXES = (".py", ".pyc", ".pyw", ".so", ".pyd")
# a configuration file named after the tool it configures (accelerate.yaml, deepspeed.json, openenv.yaml,
# logging.conf): the import reaches the installed package of that name, not the file
_CONFIGURATION_SUFFIXES = (".yaml", ".yml", ".json", ".toml", ".ini", ".cfg", ".conf")


def imports_a_data_file(path: str, source: str) -> bool:
    """Whether the module at `path`, in a folder that is no package, imports unconditionally by an absolute name a
    module its folder holds only as a data file: `from rl_judge_prompts import PROMPT` beside `rl_judge_prompts.txt`
    and no `rl_judge_prompts.py`. Run as a script (its folder first on the path), the import fails. Not a module of
    Python's own library, nor one the folder holds only as a configuration file (`from accelerate.utils import
    gather` beside accelerate.yaml): the import finds the installed package."""
    here = os.path.dirname(os.path.abspath(path))
    if os.path.isfile(os.path.join(here, "__init__.py")):
        return False
    try:
        module = python_ast(source)
        entries = os.listdir(here)
    except (SyntaxError, ValueError, OSError):
        return False
    stems: dict[str, list[str]] = {}
    for entry in entries:
        stem, dot, suffix = entry.partition(".")
        stems.setdefault(stem, []).append(dot + suffix)
    for statement in module.body:  # module level only: an import under `try:` or `if` may be meant to fail
        names = [statement.module] if isinstance(statement, ast.ImportFrom) and statement.level == 0 and statement.module \
            else [alias.name for alias in statement.names] if isinstance(statement, ast.Import) else []
        for name in names:
            top = name.split(".", 1)[0]
            found = stems.get(top, [])
            if found and top not in sys.stdlib_module_names and not any(
                    suffix == "" or suffix.endswith(_IMPORTABLE_SUFFIXES + _CONFIGURATION_SUFFIXES) for suffix in found) \
                    and not _a_module_above(here, top):
                return True
    return False


def _a_module_above(folder: str, name: str) -> bool:
    """Whether a folder above `folder` holds a module or package `name` (`grpo/` of the project's root, for
    `from grpo.kk import score` in grpo/train.py beside grpo.sh): the project's own, which a launch from that root or
    a `sys.path` entry finds; the data file beside the script is not what the import meant. Up to the project's
    root."""
    here = Path(folder)
    root = project_root(here)
    for above in list(here.parents)[:_LEVELS_UP] if root != here else []:
        if (above / name).is_dir() or (above / f"{name}.py").is_file():
            return True
        if above == root:
            break
    return False


_LEVELS_UP = 4  # how far above a script its launch may run from, where no project's root comes first


def _source_of(target: str) -> str | None:
    """The text of the module `target` names (`target.py`, or the package `target/__init__.py`), None if it has none."""
    module = read_text(Path(target + ".py"))
    return module if module is not None else read_text(Path(target, "__init__.py"))


def _source_exists(target: str) -> bool:
    return os.path.isfile(target + ".py") or os.path.isdir(target)



# a module's files besides those Python imports: a Cython source or a stub, whose extension an install builds
_BUILT_OR_IMPORTABLE = (*_IMPORTABLE_SUFFIXES, ".pyx", ".pyi")
# code that sets up the path at run time: another folder of the same package name may come first
_PATH_SETUP = re.compile(r"\bsys\.path\s*(?:\.\s*(?:insert|append|extend)\b|\[|\+?=)|\bPYTHONPATH\b")


def imports_a_missing_submodule(path: str, source: str) -> bool:
    """Whether the module at `path` imports, unconditionally and by an absolute name, a module of a package at its
    project's root that the package lacks: xclovehsy/passformer's `from src.rl.llvm_wrapper import llvm_wrapper`,
    `src/` a package of the project (it has an `__init__.py`) with no `rl` in it. Run from the root, the project's
    own `src` is the one found, and the import fails; a module that sets up the path itself may find another. The
    root is the folder above the outermost package holding the module (the folder of a module in none)."""
    root = Path(path).resolve().parent
    while (root / "__init__.py").is_file():
        root = root.parent
    if _PATH_SETUP.search(source):
        return False
    try:
        module = python_ast(source)
    except (SyntaxError, ValueError):
        return False
    names = [statement.module for statement in module.body  # module level only, as `imports_a_missing_module`
             if isinstance(statement, ast.ImportFrom) and statement.level == 0 and statement.module]
    names += [alias.name for statement in module.body if isinstance(statement, ast.Import) for alias in statement.names]
    return any(_lacks_submodule(root, name.split(".")) for name in names)


def _lacks_submodule(root: Path, parts: list[str]) -> bool:
    """Whether `parts[0]` is a package at `root` (an `__init__.py`) and one of the modules below it that `parts`
    name is missing: no package folder, source, bytecode or extension of that name, nor one a build generates."""
    folder = root / parts[0]
    if len(parts) < 2 or not (folder / "__init__.py").is_file():
        return False
    for part in parts[1:]:
        if _GENERATED.search(part) or any((folder / f"{part}{suffix}").is_file() for suffix in _BUILT_OR_IMPORTABLE):
            return False
        if not (folder / part).is_dir():
            return True
        folder = folder / part
    return False
