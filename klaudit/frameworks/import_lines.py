"""What a module's import lines bind, read from its text alone (the framework readers parse no Python)."""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator

_FROM_IMPORT = re.compile(r"^[ \t]*from[ \t]+(\.*[\w.]*)[ \t]+import[ \t]+(\([^)]*\)|[^\n]*)", re.MULTILINE)
_COMMENT = re.compile(r"#[^\n]*")
# `import tunix.rl.grpo.grpo_learner as grpo_learner`, `import trl, torch`
IMPORT = re.compile(r"^[ \t]*import[ \t]+([\w. \t,]+)", re.MULTILINE)


def from_imports(source: str) -> Iterator[tuple[str, list[str]]]:
    """(module, the words of one imported name) for each name of each `from module import ...`:
    `["GRPOConfig"]`, or `["GRPOConfig", "as", "TRLGRPOConfig"]`. Comments are no names (`import (  # type:
    ignore[import-untyped]` before the names, as tunix's untyped modules are imported)."""
    for _, module, words in from_imports_at(source):
        yield module, words


def from_imports_at(source: str) -> Iterator[tuple[int, str, list[str]]]:
    """`from_imports`, each with the offset of its `from` line in `source`."""
    for match in _FROM_IMPORT.finditer(source):
        module, imported = match.groups()
        for alias in _COMMENT.sub("", imported).strip().strip("()").replace("\\\n", " ").split(","):
            yield match.start(), module, alias.split()


def imported_names(source: str) -> dict[str, tuple[str, str]]:
    """{the name a module binds: (the top-level package it comes from, the name there)} of each
    `from package... import name [as alias]`; relative imports are left out."""
    return {(words[2] if len(words) == 3 and words[1] == "as" else words[0]): (module.split(".")[0], words[0])
            for module, words in from_imports(source) if words and not module.startswith(".")}


def source_modules(source: str, name: str) -> set[str]:
    """The modules an absolute `from module import name` (not under another name) binds `name` from."""
    return {module for module, words in from_imports(source) if words == [name] and not module.startswith(".")}


def names_module_of(file: str, module: str) -> bool:
    """Whether the file at `file` can be the module `module` or lie in that package (`pkg/configs.py` for
    `pkg.configs`; `trl/trainer/grpo_config.py` for `trl`, which re-exports it), as the folders of its path spell it."""
    parts = file.replace("\\", "/").removesuffix(".py").split("/")
    wanted = module.split(".")
    return any(parts[start:start + len(wanted)] == wanted for start in range(len(parts) - len(wanted) + 1))


def imports_package(source: str, package: str) -> bool:
    """Whether a module's text imports from the top-level `package` (`from verl.utils import x`, `import trl`,
    `import openrlhf.models as m`): a module built on that framework."""
    return _package_import(package).search(source) is not None


@functools.cache
def _package_import(package: str) -> re.Pattern[str]:
    return re.compile(rf"^[ \t]*(?:from[ \t]+{re.escape(package)}[. \t]|import[ \t]+{re.escape(package)}\b)",
                      re.MULTILINE)
