"""Hydra's defaults list in a user's YAML config: `defaults: [my_base, _self_]` composes the config
files it names with the file's own keys, in that order (`_self_` last when not listed, as in Hydra
1.1+). A name that is a YAML file beside the config is read; the framework's own configs
(`ppo_trainer`) and config groups (`actor@actor_rollout_ref.actor: dp_actor`) carry the framework's
defaults, which the framework module supplies. A key that comes from an included file is reported at
the entry of the defaults list that brings it in, the line of this file a user edits.
"""

from __future__ import annotations

from pathlib import Path

from klaudit.frameworks.settings import Setting, yaml_loader, yaml_settings

_MAX_DEPTH = 8  # includes deeper than this (or cyclic) are not followed
_SELF = "_self_"


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
        if isinstance(key, yaml.ScalarNode) and key.value == "defaults" and isinstance(value, yaml.SequenceNode):
            return [(str(item.value), Setting(None, item.start_mark.line + 1, item.start_mark.column + 1,
                                              item.end_mark.column + 1))
                    for item in value.value if isinstance(item, yaml.ScalarNode)]
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
            composed.update(own)
            continue
        included = Path(path).parent / f"{name}.yaml"
        if not included.is_file():
            continue
        try:
            inner = composed_settings(str(included), included.read_text(encoding="utf-8", errors="replace"), depth + 1)
        except OSError:
            continue
        composed.update({key: Setting(setting.value, entry.line, entry.column, entry.end_column)
                         for key, setting in inner.items()})
    return composed
