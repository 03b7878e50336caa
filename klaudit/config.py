"""`[tool.klaudit]` settings: which rules are enabled for which file, and which paths are skipped.

Rule selection follows ruff. Settings come in layers (pyproject.toml, then the command line); a
layer that sets `select` starts from nothing, otherwise it edits the layer below. Inside a layer
the selectors are applied from least to most specific (`ALL` < `KL` < `KL0` < `KL002`), and an
`ignore` beats a `select` of the same specificity. KL000 (the file could not be checked) is
reported unless some `ignore` names it: narrowing `select` never hides a broken file; so is KL099
(part of the file was not analysed), which is informational and never changes the exit status.
"""

from __future__ import annotations

import difflib
import fnmatch
import functools
import os
import re
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from klaudit.frameworks.versions import VersionError, check_pins
from klaudit.lint.budget import DEFAULT_SECONDS, DEFAULT_UNITS
from klaudit.rules import RULES

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

SYNTAX_ERROR_CODE = "KL000"
INCOMPLETE_CODE = "KL099"  # informational: reported, but never changes the exit status
FILE_CODES = (SYNTAX_ERROR_CODE, INCOMPLETE_CODE)  # about the file, not a KL configuration
UNDETERMINED_CODE = "KL100"  # informational, off by default: a KL term whose gradient use is unknown
UNUSED_SUPPRESSION_CODE = "KL101"  # informational, off by default: a suppression comment that suppresses nothing
INFORMATIONAL_CODES = (INCOMPLETE_CODE, UNDETERMINED_CODE, UNUSED_SUPPRESSION_CODE)  # never fail a run
ALL = "ALL"
# The verdicts (KL0xx); the informational KL1xx codes are on with `--select KL1` or `ALL`.
DEFAULT_SELECT: tuple[str, ...] = ("KL0",)

# Directory and file names never walked into, as ruff's defaults (`.ipynb_checkpoints` among them: Jupyter's
# autosaved copies, never the file that runs), and `.hydra` (the record of a finished run that Hydra writes
# beside its outputs: the configuration it ran, not one anybody launches), and `unsloth_compiled_cache` (the copies
# of TRL's trainers Unsloth generates beside the script that ran it: framework code, whose run the project's own
# GRPOConfig configures and is judged at); `exclude` replaces this list and `extend-exclude` adds to it. A directory
# holding pyvenv.cfg is always skipped.
DEFAULT_EXCLUDE: tuple[str, ...] = (
    ".bzr", ".direnv", ".eggs", ".git", ".git-rewrite", ".hg", ".hydra", ".ipynb_checkpoints", ".mypy_cache",
    ".nox", ".pants.d", ".pyenv", ".pytest_cache", ".pytype", ".ruff_cache", ".svn", ".tox", ".venv", ".vscode",
    "__pycache__", "__pypackages__", "_build", "buck-out", "build", "dist", "node_modules", "site-packages",
    "unsloth_compiled_cache", "venv",
)

_LIST_KEYS = ("select", "extend-select", "ignore", "exclude", "extend-exclude")
_LIMIT_KEYS = ("analysis-budget", "analysis-timeout")  # per file: work units, seconds (0: no limit)
KNOWN_KEYS = _LIST_KEYS + ("per-file-ignores", "switches") + _LIMIT_KEYS + ("frameworks",)
SwitchValue = str | bool | int


class ConfigError(Exception):
    """A user mistake in the configuration or in a rule selector; the CLI exits with 2."""


def known_codes_text() -> str:
    """The valid rule codes, for error messages."""
    return ", ".join(RULES)


def check_selector(selector: str, where: str) -> str:
    """Return `selector` upper-cased if it is ALL, a rule code or a prefix of one; else raise."""
    normalized = selector.strip().upper()
    if normalized == ALL or (normalized and any(code.startswith(normalized) for code in RULES)):
        return normalized
    raise ConfigError(
        f"unknown rule selector {selector!r} in {where}; "
        f"use ALL, a code or a code prefix: {known_codes_text()}"
    )


def _specificity(selector: str) -> int:
    return 0 if selector == ALL else len(selector)


def _matches(selector: str, code: str) -> bool:
    return selector == ALL or code.startswith(selector)


@dataclass(frozen=True)
class RuleSelection:
    """One layer of rule selection; `select=None` keeps what the layer below enabled."""

    select: tuple[str, ...] | None = None
    extend_select: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()

    def apply(self, enabled: frozenset[str]) -> frozenset[str]:
        """The set of codes enabled after this layer, given the set enabled below it."""
        codes = set() if self.select is not None else set(enabled)
        steps = [(s, True) for s in (self.select or ()) + self.extend_select]
        steps += [(s, False) for s in self.ignore]
        # Least specific first; at equal specificity the ignore comes last and wins.
        for selector, is_select in sorted(steps, key=lambda step: (_specificity(step[0]), not step[1])):
            matched = {code for code in RULES if _matches(selector, code)}
            codes = codes | matched if is_select else codes - matched
        return frozenset(codes)


def _glob_matches(pattern: str, relative_path: str) -> bool:
    """Match a glob against a posix path relative to the project root, gitignore style.

    A pattern without "/" matches any single path component (a file or directory name); one
    with "/" matches the whole relative path, where a leading "**/" may also match nothing.
    """
    return _globs_matcher((pattern,))(relative_path)


@functools.lru_cache(maxsize=64)
def _globs_matcher(patterns: tuple[str, ...]) -> Callable[[str], bool]:
    """Whether a relative path matches any of `patterns` (as _glob_matches reads each), with the
    patterns compiled into two expressions once: the walk asks for every file and directory."""
    components, paths = [], []
    for pattern in (p.rstrip("/") for p in patterns):
        if "/" not in pattern:
            components.append(fnmatch.translate(pattern))
        else:
            paths.append(fnmatch.translate(pattern))
            if pattern.startswith("**/"):
                paths.append(fnmatch.translate(pattern[3:]))
    component = re.compile("|".join(components)) if components else None
    whole = re.compile("|".join(paths)) if paths else None

    def matches(relative_path: str) -> bool:
        return (component is not None and any(component.match(part) for part in relative_path.split("/"))) or (
            whole is not None and whole.match(relative_path) is not None)
    return matches


@dataclass(frozen=True)
class Settings:
    """Resolved settings; `root` is the directory relative globs are matched against."""

    selections: tuple[RuleSelection, ...] = (RuleSelection(select=DEFAULT_SELECT),)
    exclude: tuple[str, ...] = DEFAULT_EXCLUDE
    extend_exclude: tuple[str, ...] = ()
    per_file_ignores: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    root: Path = field(default_factory=Path.cwd)
    analysis_budget: int | None = DEFAULT_UNITS  # work units per file; None: no limit
    analysis_timeout: float | None = DEFAULT_SECONDS  # seconds per file; None: no limit
    # switch name -> the values the user runs: only code paths those values select are judged
    switches: Mapping[str, tuple[SwitchValue, ...]] = field(default_factory=dict)
    frameworks: Mapping[str, str] = field(default_factory=dict)  # framework -> release pinned ("trl": "1.16")

    def __post_init__(self) -> None:
        enabled: frozenset[str] = frozenset()
        for layer in self.selections:
            enabled = layer.apply(enabled)
        for code in FILE_CODES:
            if not any(_matches(s, code) for layer in self.selections for s in layer.ignore):
                enabled |= {code}
        object.__setattr__(self, "_enabled", enabled)

    @property
    def enabled_codes(self) -> frozenset[str]:
        """Codes reported anywhere, before per-file ignores."""
        return self._enabled  # type: ignore[attr-defined]

    @functools.cached_property
    def _resolved_root(self) -> Path:
        """`root` with its links followed, looked up once: `relative` is asked of every path walked."""
        return self.root.resolve()

    def relative(self, path: str) -> str:
        """`path` as a posix path relative to the root (absolute if it lies outside)."""
        absolute = Path(os.path.abspath(path))
        try:
            return absolute.relative_to(self._resolved_root).as_posix()
        except ValueError:
            return absolute.as_posix()

    def is_excluded(self, path: str) -> bool:
        """True if `path` (a file or directory found while walking) matches an exclusion."""
        relative = self.relative(path)
        return _globs_matcher(self.exclude + self.extend_exclude)(relative)

    def ignored_in_file(self, path: str) -> frozenset[str]:
        """Codes switched off for `path` by per-file-ignores."""
        relative = self.relative(path)
        ignored: set[str] = set()
        for pattern, selectors in self.per_file_ignores.items():
            if _glob_matches(pattern, relative):
                ignored.update(code for code in RULES for s in selectors if _matches(s, code))
        return frozenset(ignored)

    def with_overrides(
        self,
        *,
        select: Sequence[str] | None = None,
        extend_select: Sequence[str] = (),
        ignore: Sequence[str] = (),
        exclude: Sequence[str] | None = None,
        extend_exclude: Sequence[str] = (),
        analysis_budget: int | None = None,
        analysis_timeout: float | None = None,
        switches: Mapping[str, tuple[SwitchValue, ...]] | None = None,
    ) -> Settings:
        """A copy with the command line's layer on top (flags override the file)."""
        where = "the command line"
        layer = RuleSelection(
            select=None if select is None else tuple(check_selector(s, where) for s in select),
            extend_select=tuple(check_selector(s, where) for s in extend_select),
            ignore=tuple(check_selector(s, where) for s in ignore),
        )
        return replace(
            self,
            selections=self.selections + (layer,),
            exclude=self.exclude if exclude is None else tuple(exclude),
            extend_exclude=self.extend_exclude + tuple(extend_exclude),
            analysis_budget=self.analysis_budget if analysis_budget is None else analysis_budget or None,
            analysis_timeout=self.analysis_timeout if analysis_timeout is None else analysis_timeout or None,
            switches={**self.switches, **(switches or {})},
        )


def _string_list(table: Mapping[str, object], key: str, where: str) -> tuple[str, ...] | None:
    if key not in table:
        return None
    value = table[key]
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ConfigError(f"{where}: `{key}` must be a list of strings, got {value!r}")
    return tuple(value)


def _limit(table: Mapping[str, object], key: str, where: str, default, kind: type):
    """A per-file limit: a non-negative number, 0 meaning none."""
    if key not in table:
        return default
    value = table[key]
    if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else int) or value < 0:
        raise ConfigError(f"{where}: `{key}` must be a non-negative {'number' if kind is float else 'integer'} "
                          f"(0: no limit), got {value!r}")
    return kind(value) or None


def _switches(table: Mapping[str, object], where: str) -> dict[str, tuple[SwitchValue, ...]]:
    """`switches = {kl_loss_type = "k1", use_kl_loss = true, kl_penalty = ["kl", "k1"]}`."""
    pins = table.get("switches", {})
    if not isinstance(pins, dict):
        raise ConfigError(f"{where}: `switches` must be a table of switch name = value (or list of values)")
    out: dict[str, tuple[SwitchValue, ...]] = {}
    for name, value in pins.items():
        values = value if isinstance(value, list) else [value]
        if not values or not all(isinstance(v, (str, bool, int)) for v in values):
            raise ConfigError(f"{where}: switches entry {name!r} must be a string, boolean or integer, "
                              f"or a non-empty list of them, got {value!r}")
        out[name] = tuple(values)
    return out


def parse_switch(text: str) -> tuple[str, SwitchValue]:
    """`NAME=VALUE` from the command line: true/false are booleans, digits an integer, else a string."""
    name, sep, raw = text.partition("=")
    if not sep or not name.strip() or not raw.strip():
        raise ConfigError(f"--switch {text!r}: expected NAME=VALUE, e.g. --switch kl_loss_type=k1")
    value = raw.strip().strip("'\"")
    if value.lower() in ("true", "false"):
        return name.strip(), value.lower() == "true"
    if value.lstrip("-").isdigit():
        return name.strip(), int(value)
    return name.strip(), value


def settings_from_table(table: Mapping[str, object], source: Path) -> Settings:
    """Validate a `[tool.klaudit]` table read from `source` and turn it into Settings."""
    where = f"{source} [tool.klaudit]"
    for key in table:
        if key not in KNOWN_KEYS:
            close = difflib.get_close_matches(key, KNOWN_KEYS, n=1)
            hint = f" (did you mean `{close[0]}`?)" if close else ""
            raise ConfigError(f"{where}: unknown key `{key}`{hint}; known keys: {', '.join(KNOWN_KEYS)}")
    lists = {key: _string_list(table, key, where) for key in _LIST_KEYS}

    def selectors(key: str) -> tuple[str, ...]:
        return tuple(check_selector(s, f"{where} `{key}`") for s in lists[key] or ())

    per_file = table.get("per-file-ignores", {})
    if not isinstance(per_file, dict):
        raise ConfigError(f"{where}: `per-file-ignores` must be a table of glob = [codes]")
    per_file_ignores = {}
    for pattern, codes in per_file.items():
        if not isinstance(codes, list) or not all(isinstance(code, str) for code in codes):
            raise ConfigError(f"{where}: per-file-ignores entry {pattern!r} must be a list of codes")
        per_file_ignores[pattern] = tuple(
            check_selector(code, f"{where} per-file-ignores {pattern!r}") for code in codes
        )

    try:
        frameworks = check_pins(table.get("frameworks", {}), where)
    except VersionError as error:
        raise ConfigError(str(error)) from None

    select = selectors("select") if lists["select"] is not None else (ALL,)
    return Settings(
        selections=(RuleSelection(select=select, extend_select=selectors("extend-select"),
                                  ignore=selectors("ignore")),),
        exclude=lists["exclude"] if lists["exclude"] is not None else DEFAULT_EXCLUDE,
        extend_exclude=lists["extend-exclude"] or (),
        per_file_ignores=per_file_ignores,
        root=source.parent.resolve(),
        analysis_budget=_limit(table, "analysis-budget", where, DEFAULT_UNITS, int),
        analysis_timeout=_limit(table, "analysis-timeout", where, DEFAULT_SECONDS, float),
        switches=_switches(table, where),
        frameworks=frameworks,
    )


def _read_tool_table(pyproject: Path) -> Mapping[str, object] | None:
    """The `[tool.klaudit]` table of a TOML file, or None if it has none."""
    try:
        with open(pyproject, "rb") as handle:
            document = tomllib.load(handle)
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{pyproject}: invalid TOML: {error}") from None
    except OSError as error:
        raise ConfigError(f"cannot read {pyproject}: {error.strerror}") from None
    table = document.get("tool", {}).get("klaudit") if isinstance(document.get("tool"), dict) else None
    if table is not None and not isinstance(table, dict):
        raise ConfigError(f"{pyproject}: `tool.klaudit` must be a table")
    return table


def _may_configure_klaudit(pyproject: Path) -> bool:
    """Whether the file spells `klaudit` at all: one that does not cannot hold a `[tool.klaudit]` table, so
    it is not parsed, and a project's own broken TOML (or one klaudit cannot read) stops nothing."""
    try:
        return b"klaudit" in pyproject.read_bytes()
    except OSError:
        return False


def find_pyproject(start: Path) -> tuple[Path, Mapping[str, object]] | None:
    """The nearest pyproject.toml with a `[tool.klaudit]` table, from `start` upwards."""
    try:
        directory = start.resolve()
    except (OSError, RuntimeError):  # a symbolic link that loops: the lint reports it by name
        directory = start.absolute()
    if not directory.is_dir():
        directory = directory.parent
    for candidate_dir in (directory, *directory.parents):
        candidate = candidate_dir / "pyproject.toml"
        table = _read_tool_table(candidate) if _may_configure_klaudit(candidate) else None
        if table is not None:
            return candidate, table
    return None


def load_settings(paths: Iterable[str], config_file: str | None = None) -> Settings:
    """Settings from `config_file`, else from the nearest pyproject.toml above the first path."""
    if config_file is not None:
        source = Path(config_file)
        table = _read_tool_table(source)
        if table is None:
            raise ConfigError(f"{source}: no [tool.klaudit] table")
        return settings_from_table(table, source)
    found = find_pyproject(Path(next(iter(paths), ".")))
    return Settings() if found is None else settings_from_table(found[1], found[0])
