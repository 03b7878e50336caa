"""Modules of a package Python cannot import: an `__init__.py` of the package, or of one around it, that Python
rejects (the KL000 the lint reports there), or that imports a module of its own folder the project does not have,
stops every `import package.module` before the module runs.

jzhws/VisualQualityAssessment-RL-Trainer's `src/open_r1/trainer/__init__.py` imports `.grpo_trainer_refine-iqa`
(a hyphen is no name): every trainer of that package, and every script importing it, fails at import, so their KL
code never trains; so do xavierliu34/GUI-AiF's, whose `__init__.py` imports `.Dbeta`, of which the repository holds
only a compiled copy under `__pycache__` (Python 3 imports no such copy without its source). Such a module is not
analysed, only its syntax checked. A script (`if __name__ == "__main__":`) can still be run by its path, which
imports no package around it, and is analysed as usual; so is a file named on the command line.
"""

from __future__ import annotations

import ast
import os
import re
from collections.abc import Callable, Mapping

from klaudit.lint.syntax import is_script, python_ast


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


# modules a build writes into a package (setuptools-scm's `_version.py`, protoc's `*_pb2.py`): absent from a
# checkout, present once installed
_GENERATED = re.compile(r"^_|version|_pb2(?:_grpc)?$", re.IGNORECASE)


def imports_a_missing_module(init: str, source: str) -> bool:
    """Whether the package `__init__.py` at `init` imports, unconditionally, a module of its own folder
    (`from .name import ...`) of which the folder holds no source, package or extension under any suffix;
    modules a build generates are left out."""
    try:
        module = python_ast(source)
    except (SyntaxError, ValueError):
        return False
    folder = os.path.dirname(init)
    try:
        present = {entry.split(".", 1)[0] for entry in os.listdir(folder) if entry != "__pycache__"}
    except OSError:
        return False
    for statement in module.body:  # module level only: an import under `try:` or `if` may be meant to fail
        if isinstance(statement, ast.ImportFrom) and statement.level == 1 and statement.module:
            name = statement.module.split(".", 1)[0]
            if name not in present and not _GENERATED.search(name):
                return True
    return False
