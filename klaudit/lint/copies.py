"""Backup copies: modules of a linted folder that the project never uses and that repeat a live module beside them.

Research trees keep superseded versions of a trainer next to the one they run (`dp_actor_merged.py` beside
`dp_actor.py`, `grpo_trainer_new.py` beside `grpo_trainer.py`, `ray_trainer_bp.py`): the same class again,
in a module no file of the project imports, launches or names. Its KL code never runs, so a report there is a
false alarm. A module is taken for such a copy when

- it was found by walking a folder (a file named on the command line is always linted),
- it is no script (no `if __name__ == "__main__":`) and no package's `__init__.py`,
- its name holds the name of another module of its folder, or of the folder above, that defines a top-level
  class of the same name, and that other module is named somewhere in the project (it is the live one); a
  live name of one word and under eight letters (`trainer`, `actor`) is too common to tell a variant by,
- and its own name appears in no other file of the project: no import, no `-m` launch, no path, no string
  a registry could import it by, no word of the documentation.

Where neither module is named, neither is a copy (a library whose users import it from outside).

A whole folder of backups is one too: a folder named as one (`backup_before_wandb/`, `old/`, `deprecated_v1/`)
that repeats a module of the folder above by its file name (`trainer/backup_before_wandb/train_grpo.py` beside
`trainer/train_grpo.py`), and whose name appears in no file outside it. Its scripts are the superseded versions of
the live ones, so they are left out too. The checks read text only, like the rest of the lint.
"""

from __future__ import annotations

import os
import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping

from klaudit.lint.syntax import is_script

# the files besides code and launches a module's name is looked for in (documentation, package metadata), up to a
# size past which a file is data (a dataset's JSON), not prose
NAMING_SUFFIXES = (".md", ".rst", ".txt", ".toml", ".cfg", ".ini", ".json")
NAMING_FILE_LIMIT = 1 << 20

_CLASS = re.compile(r"^class[ \t]+(\w+)", re.MULTILINE)


def backup_copies(walked: Mapping[str, str], texts: Callable[[], Iterable[tuple[str, str]]]) -> frozenset[str]:
    """The paths among `walked` (Python files found by walking a folder: path -> source) that are backup
    copies. `texts` gives (path, text) of every file of the project the names are looked for in; it is read
    only where some module repeats a class of its folder."""
    pairs = {(copy, live) for first, second in _repeated_classes(walked)
             for copy, live in ((first, second), (second, first)) if _variant_of(stem(copy), stem(live))}
    if not pairs:
        return frozenset()
    stems = {stem(path) for pair in pairs for path in pair}
    named = named_elsewhere(stems, texts())

    def named_by_another(path: str, besides: str) -> bool:
        return bool(named.get(stem(path), set()) - {path, besides})

    return frozenset(copy for copy, live in pairs if named_by_another(live, copy) and not named_by_another(copy, copy))


# a folder's name that says it keeps superseded code: the word alone or joined to others by `_` or `-`
_BACKUP_FOLDER = re.compile(r"(?:^|[_-])(?:backups?|bak|old|archived?|deprecated|unused|trash)(?:$|[_-])",
                            re.IGNORECASE)


def backup_folders(walked: Mapping[str, str], texts: Callable[[], Iterable[tuple[str, str]]]) -> frozenset[str]:
    """The paths among `walked` inside a folder of backups: named as one, repeating a module of the folder above by
    its file name, and named by no file outside it. `texts` is read only where such a folder is found."""
    names_by_folder: dict[str, set[str]] = defaultdict(set)
    for path in walked:
        names_by_folder[os.path.dirname(path)].add(os.path.basename(path))
    folders = {folder for folder, names in names_by_folder.items()
               if _BACKUP_FOLDER.search(os.path.basename(folder))
               and (names - {"__init__.py"}) & names_by_folder.get(os.path.dirname(folder), set())}
    if not folders:
        return frozenset()
    stems = {os.path.basename(folder) for folder in folders}
    inside = {path: folder for path in walked for folder in folders if _within(path, folder)}
    named = named_elsewhere(stems, ((path, text) for path, text in texts()
                                     if not any(_within(path, folder) for folder in folders)))
    unnamed = {folder for folder in folders if not named.get(os.path.basename(folder))}
    return frozenset(path for path, folder in inside.items() if folder in unnamed)


def _within(path: str, folder: str) -> bool:
    return path.startswith(folder + os.sep)


def _variant_of(copy: str, live: str) -> bool:
    """`dp_actor_merged` of `dp_actor`, `original_grpo_ray_trainer` of `ray_trainer`, `grpo_trainer_v1` of
    `grpo_trainer`: the live name inside the copy's, a name distinctive enough to tell."""
    return copy != live and live in copy and ("_" in live or len(live) >= 8)


def stem(path: str) -> str:
    return os.path.splitext(os.path.basename(path))[0]


def _repeated_classes(walked: Mapping[str, str]) -> set[tuple[str, str]]:
    """Pairs of modules, in one folder or a folder and the one above it, that define a class of one name. A script
    (a main guard) or a notebook is run by itself, never imported by name: no module of a pair."""
    by_folder: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))  # folder -> class -> paths
    for path, source in walked.items():
        if os.path.basename(path) == "__init__.py" or path.endswith(".ipynb") or is_script(source):
            continue
        for name in set(_CLASS.findall(source)):
            by_folder[os.path.dirname(path)][name].add(path)
    pairs: set[tuple[str, str]] = set()
    for folder, classes in by_folder.items():
        above = by_folder.get(os.path.dirname(folder), {})
        for name, paths in classes.items():
            near = sorted(paths | above.get(name, set()))
            pairs.update((a, b) for i, a in enumerate(near) for b in near[i + 1:] if folder in (
                os.path.dirname(a), os.path.dirname(b)))
    return pairs


def named_elsewhere(stems: set[str], texts: Iterable[tuple[str, str]]) -> dict[str, set[str]]:
    """stem -> the files whose text names it as a whole word (an import, a path, a launch, a string)."""
    pattern = re.compile(r"(?<![\w-])(" + "|".join(map(re.escape, sorted(stems, key=len, reverse=True))) + r")(?![\w-])")
    named: dict[str, set[str]] = defaultdict(set)
    for path, text in texts:
        if any(word in text for word in stems):  # a plain search first: most files name none of them
            for word in set(pattern.findall(text)):
                named[word].add(path)
    return named
