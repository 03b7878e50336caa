"""Run records: the copies of a configuration that a launch script writes beside a run's outputs.

`cp "$ROOT/configs/grpo.yaml" "$VERSION_DIR/config/grpo_base.yaml"` keeps, with a run's logs and checkpoints, the
configuration it was started with. The copy is what one run used, not a file any launch reads: its flags are
judged where the launch reads them (the source of the copy, with the launch's overrides), and the copy is no
configuration of its own. Hydra's own records (`.hydra/config.yaml`) are never walked into (klaudit.config).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Mapping
from pathlib import Path

_COPY_LINE = re.compile(r"^[ \t]*(?:cp|rsync)[ \t][^\n]*$", re.MULTILINE)
_YAML = (".yaml", ".yml")
# the literal end of a destination, after its last variable or command substitution: `/config/grpo_base.yaml`
_LITERAL_TAIL = re.compile(r"(?:.*(?:\$\{[^}]*\}|\$\w+|\)))?(?P<tail>[^$]*)$")


def copied_configs(scripts: Mapping[str, str], configs: Iterable[str]) -> frozenset[str]:
    """The resolved paths of the YAML files of `configs` that a shell script of `scripts` writes with `cp` (its
    last operand, whose literal end names at least the file's folder), and that no script names otherwise (a
    template copied to the file a launch then reads is that launch's configuration)."""
    tails = [tail for text in scripts.values() for tail in _destinations(text)]
    if not tails:
        return frozenset()
    other_lines = "\n".join(_COPY_LINE.sub("", text) for text in scripts.values())
    found = set()
    for config in configs:
        if not config.endswith(_YAML):
            continue
        resolved = Path(config).resolve().as_posix()
        if any(resolved.endswith(tail) for tail in tails) and Path(config).stem not in other_lines:
            found.add(resolved)
    return frozenset(found)


def _destinations(text: str) -> list[str]:
    """The literal ends (`/config/grpo_base.yaml`) of the YAML destinations of a script's copy commands."""
    found = []
    for line in _COPY_LINE.findall(text):
        try:
            words = [word for word in shlex.split(line, comments=True) if not word.startswith("-")]
        except ValueError:
            continue  # an unbalanced quote: no command shlex can read
        if len(words) < 3 or not words[-1].endswith(_YAML):
            continue
        match = _LITERAL_TAIL.match(words[-1])
        tail = "/" + match.group("tail").lstrip("/") if match else ""
        if tail.count("/") >= 2:  # a folder and the file, at least
            found.append(tail)
    return found
