"""Hydra's defaults list in a user's YAML config: `defaults: [my_base, _self_]` composes the config
files it names with the file's own keys, in that order (`_self_` last when not listed, as in Hydra
1.1+). A name that is a YAML file beside the config is read; the framework's own configs
(`ppo_trainer`) and config groups (`actor@actor_rollout_ref.actor: dp_actor`) carry the framework's
defaults, which the framework module supplies. A key that comes from an included file is reported at
the entry of the defaults list that brings it in, the line of this file a user edits.

NeMo-RL's configs inherit the same way with a file name or relative path, alone or listed
(`defaults: "grpo_math_1B.yaml"`), and a section that sets `_override_: true` replaces the inherited
section instead of merging into it.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from klaudit.frameworks.settings import Setting, command_span, yaml_loader, yaml_settings
from klaudit.text import file_text

_MAX_DEPTH = 8  # includes deeper than this (or cyclic) are not followed
_SELF = "_self_"
_OVERRIDE = "_override_"  # NeMo-RL: `section: {_override_: true, ...}` replaces the inherited section


def _defaults_entries(text: str) -> list[tuple[str, Setting]]:
    """The plain names of the top-level `defaults:` list, with the position of each entry."""
    import yaml  # imported by the first YAML file read (klaudit.frameworks.settings.yaml_loader)

    try:
        document = yaml.compose(text, Loader=yaml_loader())
    except (yaml.YAMLError, RecursionError):
        return []
    if not isinstance(document, yaml.MappingNode):
        return []
    for key, value in document.value:
        if isinstance(key, yaml.ScalarNode) and key.value == "defaults":
            items = value.value if isinstance(value, yaml.SequenceNode) else [value]
            return [(str(item.value), Setting(None, item.start_mark.line + 1, item.start_mark.column + 1,
                                              item.end_mark.column + 1))
                    for item in items if isinstance(item, yaml.ScalarNode) and item.value]
    return []


def composed_settings(path: str, text: str, depth: int = 0) -> dict[str, Setting]:
    """The settings of the YAML file `path` (text `text`) composed with the files its defaults list names."""
    own = yaml_settings(text)
    entries = _defaults_entries(text) if "defaults:" in text else []
    if not entries or depth >= _MAX_DEPTH:
        return own
    if not any(name == _SELF for name, _ in entries):
        entries.append((_SELF, Setting(None, 0, 0, 0)))
    composed: dict[str, Setting] = {}
    for name, entry in entries:
        if name == _SELF:
            replaced = [key[:-len(_OVERRIDE)] for key, setting in own.items()
                        if key.endswith(_OVERRIDE) and (setting.value or "").lower() == "true"]
            composed = {key: setting for key, setting in composed.items()
                        if not any(key.startswith(section) for section in replaced)}
            composed.update(own)
            continue
        included = Path(path).parent / (name if name.endswith((".yaml", ".yml")) else f"{name}.yaml")
        try:
            inner = _included_settings(str(included), included.stat().st_mtime_ns, depth + 1)
        except OSError:
            continue
        composed.update({key: Setting(setting.value, entry.line, entry.column, entry.end_column)
                         for key, setting in inner.items()})
    return composed


@functools.lru_cache(maxsize=256)  # a base config is included by every recipe of a folder (NeMo-RL's: hundreds)
def _included_settings(path: str, modified: int, depth: int) -> Mapping[str, Setting]:
    """The composed settings of an included file (`modified`, its mtime, keeps a changed file from the cache)."""
    return composed_settings(path, file_text(path), depth)


# `--config-name NAME` (and `--config-path DIR`) on a Hydra command line: the config the run composes.
# A directory spelled from the working directory (`"$PWD/configs"`, `$(pwd)/conf`) is read relative to
# the folders searched, as a plain relative one is.
CONFIG_NAME = re.compile(r"--config-name(?:=|[ \t]+)[\"']?(?P<name>[\w./-]+)")
_CONFIG_PATH = re.compile(r"--config-(?:path|dir)(?:=|[ \t]+)[\"']?(?:\$(?:\{?PWD\}?|\(pwd\))/)?(?P<dir>[\w./-]+)")
_CONFIG_DIRS = ("config", "configs", "conf", ".")  # where a launched script's Hydra configs usually live
_UP = 3  # directories above the script searched for them (scripts/ is often one level below the repository)
_UNSET = Setting(None, 0, 0, 0)  # a key a config does not set


def launched_settings(path: str, text: str) -> dict[str, Setting]:
    """The settings of the user's Hydra configs that the commands of the launch script `path` name with
    `--config-name` (found beside the script or above it, in `--config-path` or a usual config folder),
    each placed at the `--config-name` option that brings it in (a span without the value: no flag
    fix edits it). Where the commands compose configs that disagree on a key, its value is unknown."""
    launches: list[dict[str, Setting]] = []
    lines = text.splitlines()
    for number, line in enumerate(lines, start=1):
        named = CONFIG_NAME.search(line)
        if named is None or line.lstrip().startswith("#"):
            continue
        first, last = command_span(lines, number - 1)
        given = _CONFIG_PATH.search("\n".join(lines[first:last + 1]))
        found = _config_file(Path(path).parent, named.group("name"), given.group("dir") if given else None)
        if found is None:
            continue
        try:
            composed = composed_settings(str(found), file_text(found))
        except OSError:
            continue
        column = named.start() + 1
        launches.append({key: Setting(setting.value, number, column, column + len("--config-name"))
                         for key, setting in composed.items()})
    merged: dict[str, Setting] = {}
    for launch in launches:
        for key, setting in launch.items():
            merged.setdefault(key, setting)
    # a key the commands' configs set to different values, or that one of them leaves to the framework's
    # default, is unknown here
    return {key: setting if all(launch.get(key, _UNSET).value == setting.value for launch in launches)
            else replace(setting, value=None) for key, setting in merged.items()}


def _config_file(start: Path, name: str, config_path: str | None) -> Path | None:
    file_name = name if name.endswith((".yaml", ".yml")) else f"{name}.yaml"
    folders = ((config_path,) if config_path and not Path(config_path).is_absolute() else ()) + _CONFIG_DIRS
    for base in (start, *list(start.parents)[:_UP]):
        for folder in folders:
            candidate = base / folder / file_name
            if candidate.is_file():
                return candidate
    return None
