"""The keys a Hydra config composes, and the overrides of a command line that Hydra refuses.

Hydra composes a primary config with the configs its `defaults:` list names (`group@package: option`
for a config of a group folder, a plain name for a config of the same folder, `_self_` for the file's
own keys) and puts the result in struct mode: an override `a.b=v` of a key the result lacks stops the
run before it starts ("Could not override 'a.b'"), where `+a.b=v` adds the key and `++a.b=v` adds or
sets it. So a launch that overrides a key its framework copy's config lacks (an upstream example kept
in a fork that renamed or removed the key) trains nothing.

A config is looked up in the primary config's folder, then in the `file://` folders of its `hydra.searchpath`
(a relative one below the folder the run starts in, as verl's multi-turn examples' `file://verl/trainer/config`).
Where in doubt the keys are over-approximated (an `override group: option` entry adds its option's keys
to those of the option it replaces): a key may be taken for present, never for absent. A defaults list
this reading does not follow (a missing file, an interpolation it cannot resolve, a command line that
adds a config group) gives no answer. On the 171 verl configs of the ecosystem corpus that Hydra 1.3
composes, the keys read here hold every key Hydra's composition has.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from pathlib import Path

from klaudit.frameworks.config_reads import reads_before_training
from klaudit.frameworks.settings import SHELL_WORD, shell_assignment, yaml_loader
from klaudit.text import file_text

_MAX_DEPTH = 8  # includes deeper than this (or cyclic) give no answer; so do variables nested deeper
_SELF = "_self_"
# `python -m module ... key=value`: a dotted key, optionally with Hydra's `+`, `++` or `~` prefix
_OVERRIDE = re.compile(r"^(?P<prefix>\+\+|\+|~)?(?P<key>[A-Za-z_][\w-]*(?:\.[A-Za-z_][\w-]*)+)=")
# `+key=value` or `++key=value`: a key the command line adds, dotted or not
_ADDED = re.compile(r"^\+{1,2}(?P<key>[A-Za-z_][\w-]*(?:\.[A-Za-z_][\w-]*)*)=")
# `$NAME`, `${NAME}` or `$(pwd)` in a shell word
_SHELL_REFERENCE = re.compile(r"\$\(pwd\)|\$\{(?P<braced>[A-Za-z_]\w*)\}|\$(?P<name>[A-Za-z_]\w*)")
# `@hydra.main(config_path="config", config_name="ppo_trainer", ...)`
_MAIN = re.compile(r"@hydra\.main\((?P<arguments>[^)]*)\)")


class _Unreadable(Exception):
    """A defaults list this reading does not follow."""


def launched_config(main: Path) -> tuple[Path, str] | None:
    """(config folder, config name) of the `@hydra.main` decorator in the module file `main`."""
    try:
        text = file_text(main)
    except OSError:
        return None
    found = _MAIN.search(text)
    if found is None:
        return None
    arguments = dict(re.findall(r"(config_path|config_name)\s*=\s*[\"']([^\"']+)[\"']", found.group("arguments")))
    if set(arguments) != {"config_path", "config_name"}:
        return None
    return (main.parent / arguments["config_path"]).resolve(), arguments["config_name"]


@functools.lru_cache(maxsize=32)  # asked for each launch of a project: its scripts share the copy's config
def composed_keys(folder: Path, name: str, chosen: tuple[tuple[str, str], ...] = (),
                  cwd: Path | None = None) -> frozenset[str] | None:
    """Every dotted key of the config `name` of the config folder `folder` composed with its defaults lists,
    each section's also with a trailing dot, each null value's also with a trailing `?`; `chosen`: the options a
    command line picks for groups of the primary config's defaults list (`model_engine=megatron`); `cwd`: the
    folder the run starts in, which a relative `hydra.searchpath` entry of the primary config
    (`file://verl/trainer/config`) is below. None where a defaults list is not followed."""
    try:
        return frozenset(_Composition(folder, dict(chosen), cwd).keys(name.removesuffix(".yaml"), "", 0))
    except _Unreadable:
        return None


class _Composition:
    """The keys of one composition: the config folder, and the option chosen for each group of the primary
    config's defaults list (which `${group}` in a defaults entry stands for)."""

    def __init__(self, folder: Path, chosen: dict[str, str], cwd: Path | None = None) -> None:
        self.chosen, self.cwd = chosen, cwd
        self.folders = [folder]  # the config folder, then those of the primary config's `hydra.searchpath`

    def file(self, config: str) -> Path:
        """The file of `config` in the first folder of the search path that has it."""
        found = next((path for folder in self.folders if (path := folder / f"{config}.yaml").is_file()), None)
        if found is None:
            raise _Unreadable(config)
        return found

    def search(self, document: dict) -> None:
        """Add the `file://` folders of the primary config's `hydra.searchpath` (relative ones below `cwd`)."""
        hydra = document.get("hydra")
        entries = hydra.get("searchpath") if isinstance(hydra, dict) else None
        for entry in entries if isinstance(entries, list) else []:
            if not str(entry).startswith("file://"):
                continue  # `pkg://`: a package's configs, not read here (a config only there is not found)
            where = Path(str(entry).removeprefix("file://"))
            if where.is_absolute() or self.cwd is not None:
                self.folders.append(where if where.is_absolute() or self.cwd is None else self.cwd / where)

    def keys(self, config: str, package: str, depth: int) -> set[str]:
        """The keys of the config at `config` (a path under the folder without `.yaml`) placed at `package`."""
        import yaml  # an optional dependency, as for every YAML file read

        if depth > _MAX_DEPTH:
            raise _Unreadable(config)
        try:
            document = yaml.load(file_text(self.file(config)), Loader=yaml_loader())
        except (OSError, yaml.YAMLError, RecursionError) as error:
            raise _Unreadable(config) from error
        if document is None:
            document = {}
        if not isinstance(document, dict) or not isinstance(document.get("defaults") or [], list):
            raise _Unreadable(config)
        entries = document.get("defaults") or []
        if depth == 0:  # the primary config's choices, unless the command line picks others; its search path
            self.search(document)
            self.chosen = {**dict(choice for entry in entries if (choice := _choice(entry))), **self.chosen}
        keys = set(_paths(document, package))
        group = config.rsplit("/", 1)[0] if "/" in config else ""
        for entry in entries:
            keys |= self.entry_keys(group, entry, package, depth)
        keys.discard(_join(package, "defaults"))
        if package:
            keys |= {package, package + "."}  # a config placed at a package makes it a section
        return keys

    def entry_keys(self, group: str, entry: object, package: str, depth: int) -> set[str]:
        """The keys one entry of a defaults list brings in, from a config of the folder `group`."""
        if isinstance(entry, str):
            if entry == _SELF:
                return set()
            name, _, placed = entry.partition("@")  # `reward_manager@reward_manager`: a config placed at a package
            return self.keys(_relative(group, self.resolved(name)), _join(package, _placed(placed)), depth + 1)
        if not isinstance(entry, dict) or len(entry) != 1:
            raise _Unreadable(str(entry))
        (spelled, options), = entry.items()
        words = str(spelled).split()
        if not words or words[0] not in ("optional", "override") and len(words) > 1:
            raise _Unreadable(str(spelled))
        selected, _, placed = words[-1].partition("@")
        if depth == 0 and selected in self.chosen:
            options = self.chosen[selected]
        if options is None:
            return set()  # `group: null` selects nothing
        target = _relative(group, self.resolved(selected))
        where = _placed(placed) if placed else target.replace("/", ".")
        keys: set[str] = set()
        for option in options if isinstance(options, list) else [options]:
            path = f"{target}/{self.resolved(str(option))}"
            if words[0] == "optional" and not any((folder / f"{path}.yaml").is_file() for folder in self.folders):
                continue
            keys |= self.keys(path, _join(package, where), depth + 1)
        return keys

    def resolved(self, spelled: str) -> str:
        """`${model_engine}_actor` with the option chosen for the group `model_engine`."""
        def choice(found: re.Match) -> str:
            if found.group(1) not in self.chosen:
                raise _Unreadable(spelled)
            return str(self.chosen[found.group(1)])

        return _INTERPOLATION.sub(choice, spelled)


_INTERPOLATION = re.compile(r"\$\{([\w./-]+)\}")


def _choice(entry: object) -> tuple[str, str] | None:
    """(group, option) of a defaults entry `group: option` (not `group@package: option`, no list of options)."""
    if not isinstance(entry, dict) or len(entry) != 1:
        return None
    (spelled, option), = entry.items()
    words = str(spelled).split()
    if not words or "@" in words[-1] or isinstance(option, (list, dict)) or option is None:
        return None
    return words[-1], str(option)


def _placed(package: str) -> str:
    """A package as a defaults entry spells it, relative to the including config's (`_global_`: the root)."""
    return "" if package.startswith("_global_") else package


def _relative(group: str, name: str) -> str:
    """The path of `name` under the config folder as a config of the folder `group` names it."""
    if name.startswith("/"):
        return name.strip("/")
    parts = [part for part in group.split("/") if part]
    for part in name.split("/"):
        if part == "..":
            if not parts:
                raise _Unreadable(name)
            parts.pop()
        elif part not in ("", "."):
            parts.append(part)
    return "/".join(parts)


def _paths(node: dict, prefix: str) -> Iterable[str]:
    """The dotted key of every entry of `node`, of every section also with a trailing dot, and of every value
    left null also with a trailing `?` (a `+` may append there)."""
    for key, value in node.items():
        path = _join(prefix, str(key))
        yield path
        if isinstance(value, dict):
            yield path + "."
            yield from _paths(value, path)
        elif value is None:
            yield path + _NULL


_NULL = "?"  # the mark of a key whose value the config leaves null


def _join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix and key else prefix or key


def refused_launch(command: str, main: Path, script: str = "", cwd: Path | None = None) -> str | None:
    """The first override Hydra refuses in `command`, the words of a command line after the module it runs,
    whose `@hydra.main` is in the file `main`: None when Hydra takes them all or the config composed is not
    known here (a `--config-path` outside the module's folder, an override that adds a config group)."""
    launched = _launch_keys(command, main, script, cwd)
    return None if launched is None else refused_override(*launched)


def missing_read(command: str, main: Path, script: str = "", cwd: Path | None = None) -> str | None:
    """The first key the module `main` reads on every run before it trains (klaudit.frameworks.config_reads) that
    neither the config the launch `command` composes has nor the command adds (`+output_context_dir=...`): OmegaConf
    raises on it, so the run stops there. None where all are present or the composed config is not known here."""
    launched = _launch_keys(command, main, script, cwd)
    if launched is None:
        return None
    words, keys = launched
    added = [found.group("key") for word in words if (found := _ADDED.match(word)) is not None]
    for key, _ in reads_before_training(main):
        if key in keys or key + "." in keys or any(key == given or given.startswith(key + ".") or key.startswith(given + ".")
                                                   for given in added):
            continue
        section = key.rsplit(".", 1)[0] if "." in key else ""
        while section and section + "." not in keys and section not in keys:
            section = section.rsplit(".", 1)[0] if "." in section else ""
        if not section or section + "." in keys:  # the nearest key above it is a section, not a value
            return key
    return None


def _launch_keys(command: str, main: Path, script: str, cwd: Path | None) -> tuple[list[str], frozenset[str]] | None:
    """The words of the launch `command` and the keys of the config it composes for the module `main`, run in the
    folder `cwd` (where known) by the shell script `script`, whose variables may name the `--config-path`."""
    launched = launched_config(main)
    if launched is None:
        return None
    folder, name = launched
    words = _with_variables(SHELL_WORD.findall(command), script)
    chosen: dict[str, str] = {}
    for index, word in enumerate(words):
        option, _, value = word.partition("=")
        value = value.strip("\"'")
        if option in ("--config-path", "-cp", "--config-name", "-cn"):
            value = value or (words[index + 1].strip("\"'") if index + 1 < len(words) else "")
            if option in ("--config-name", "-cn"):
                name = value
            elif value.startswith("$") and cwd is not None and (expanded := expanded_folder(script, value, cwd)):
                folder = expanded
            elif value.startswith(("/", "$", "~")) or not value:
                return None  # a folder this reading does not place
            else:
                folder = (main.parent / value).resolve()
        elif "=" in word and "." not in option and not option.startswith("-"):
            if option.startswith("+") and not (folder / option.lstrip("+")).is_dir() and "@" not in option and value:
                continue  # `+generator_llm=x` of no config group: a key added, as `+a.b=x` adds one
            if option.startswith(("+", "~")) or "/" in option or "@" in option or not value:
                return None  # a config group added or removed: its keys are not known here
            chosen[option] = value
    if not name or "$" in name:
        return None
    keys = composed_keys(folder, name, tuple(sorted(chosen.items())), cwd)
    return None if keys is None else (words, keys)


def _with_variables(written: Iterable[str], script: str) -> list[str]:
    """The words of a command line, unquoted, a word that is one variable of the script holding overrides
    (`${BASE_CONFIG}`, assigned `"algorithm.adv_estimator=grpo actor_rollout_ref.actor.use_kl_loss=True ..."`)
    replaced by the words of its value."""
    words: list[str] = []
    for word in written:
        word = word.strip("\"'")
        named = _SHELL_REFERENCE.fullmatch(word)
        variable = named and (named.group("braced") or named.group("name"))
        value = shell_assignment(script, variable) if variable and script else None
        if value is not None and "=" in value:
            words.extend(inner.strip("\"'") for inner in SHELL_WORD.findall(value))
        else:
            words.append(word)
    return words


def expanded_folder(script: str, raw: str, cwd: Path) -> Path | None:
    """The folder a `--config-path` value written with the launch script's variables names: each `$NAME` or
    `${NAME}` replaced by the script's last assignment of it, `$(pwd)` and `$PWD` by `cwd`, the folder the launch
    runs in (`python -m verl...` imports the project's copy from there): verl's own multi-turn examples write
    `PROJECT_DIR="$(pwd)"` and `--config-path="$PROJECT_DIR/examples/sglang_multiturn/config"`. None where a
    name is not assigned a value of this kind or the result is not an existing folder."""
    value = raw.strip("\"'")
    for _ in range(_MAX_DEPTH):
        found = _SHELL_REFERENCE.search(value)
        if found is None:
            break
        name = found.group("name") or found.group("braced") or ""
        replacement = str(cwd) if found.group(0) == "$(pwd)" or name == "PWD" else shell_assignment(script, name)
        if replacement is None:
            return None
        value = value[:found.start()] + replacement + value[found.end():]
    folder = Path(value)
    return folder.resolve() if "$" not in value and folder.is_absolute() and folder.is_dir() else None


def refused_override(words: Iterable[str], keys: frozenset[str]) -> str | None:
    """The first override among the command line's `words` that Hydra refuses against the composed `keys`:
    a key without `+` or `++` that the config lacks, under a section it has, or one `+` appends where the config
    already has it ("Could not append to config. An item is already at ...")."""
    for word in words:
        found = _OVERRIDE.match(word.strip("\"'"))
        if found is None or found.group("prefix") in ("++", "~") or found.group("key").startswith("hydra."):
            continue
        key = found.group("key")
        if found.group("prefix") == "+":
            if key in keys and key + "." not in keys and key + _NULL not in keys:
                return key  # a value already there: Hydra appends only where there is none (or merges a section)
            continue
        if key in keys:
            continue
        section = key.rsplit(".", 1)[0]
        while section not in keys and "." in section:
            section = section.rsplit(".", 1)[0]
        if section + "." in keys:  # the nearest key above it is a section, not a value
            return key
    return None
