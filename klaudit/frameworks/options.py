"""The defaults a project gives its own options, for a framework keyword set from one of them.

`GRPOConfig(beta=args.beta)` is common in training scripts, with `beta` an option of the project's
own: `parser.add_argument("--beta", type=float, default=0.04)`, or `beta: float = 0.04` in a
dataclass that a parser fills. A run that leaves the option alone trains with its default, so the
keyword is judged at that value, as a key left out is judged at the framework's default. The same
holds for a keyword set to a parameter of the enclosing function (`def train(beta=0.04)`, or typer's
`beta: float = typer.Option(0.04)`), unless
the function assigns the name itself, and for one set to a module's constant (`BETA = 0.04` bound once at
module level, as notebooks write it), unless a function binds the name.

The options are read from the text of every linted Python file, without parsing it. A configuration
built in a file that declares the option itself takes that file's default; elsewhere an option given
different defaults in different places (two scripts, two dataclasses) has none. An argparse default may
also name an entry of a dict literal the script binds once at module level (`default=DEFAULTS["beta"]`).

A shell script of the project that runs the training script with the option set (`python rl/grpo.py
--beta "$BETA"` after `BETA="${BETA:-0.04}"`) trains with that value instead: where the launches that set an
option the script declares agree on its value, the keyword is judged at it; where they sweep a coefficient over
values between 0 and 1 (a KL weight of 0.001 in one run and 0.01 in another), at the first of them, since the
rules read such a value only against 0 and 1. A trainer's coefficient copied from an option (`self.beta =
args.beta`) scales nothing where every launch sets the option to 0 and none leaves it at its default.

A key nested below a configuration object's root (`cfg.training.grpo.beta`, Hydra's and OmegaConf's
spelling) is looked up in the linted YAML files instead, as the dotted key `training.grpo.beta`: the
value they agree on, if any. A single attribute (`args.beta`) is an option's name, never a YAML key.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from klaudit.frameworks.settings import (
    Setting,
    cli_flags,
    launched_scripts,
    number,
    only_command,
    yaml_settings,
)
from klaudit.frameworks.versions import project_root
from klaudit.text import file_text, read_text

# A literal as klaudit.frameworks.calls reads it: a number, a one-line string, True/False/None.
_LITERAL = r"""(-?(?:\d[\d_]*\.?[\d_]*|\.\d[\d_]*)(?:[eE][-+]?\d+)?|"[^"\\\n]*"|'[^'\\\n]*'|True|False|None)"""
# parser.add_argument("-b", "--beta", type=float, default=0.04, help="...") on any number of lines
_ADD_ARGUMENT = re.compile(r"""\badd_argument\(\s*(?:["']-\w["']\s*,\s*)?["']--([\w-]+)["']([^()]*(?:\([^()]*\)[^()]*)*)\)""")
_DEFAULT = re.compile(rf"\bdefault\s*=\s*{_LITERAL}\s*(?:[,)]|$)")
# `default=BETA`, a name the script binds to a literal at module level (`BETA = 0.02` among its constants)
_DEFAULT_NAME = re.compile(r"\bdefault\s*=\s*([A-Za-z_]\w*)\s*(?:[,)]|$)")
# `default=DEFAULTS["beta"]`, an entry of a dict literal the script binds at module level (`DEFAULTS = {"beta": 0.05}`)
_DEFAULT_ENTRY = re.compile(r"""\bdefault\s*=\s*([A-Za-z_]\w*)\[\s*["'](\w+)["']\s*\]\s*(?:[,)]|$)""")
# a class-level annotated field: `beta: float = 0.04` or `beta: float = field(default=0.04, ...)`, the call on
# one line or several (`field(\n        default=4, metadata=...)`), or pydantic's `Field(default=0.04, ge=0.0)` and
# `Field(0.04, ...)`; not a function's parameter on a line of its
# own (`    beta: float = 0.04,` in a signature, minstar/BIOAgents), whose default the function's own scope gives
_FIELD = re.compile(rf"^[ \t]+(\w+)[ \t]*:[^=\n]+=[ \t]*(?:[Ff]ield\((?:[^)]*?\bdefault[ \t]*=)?[ \t]*{_LITERAL}[ \t]*[,)]"
                    rf"|{_LITERAL}[ \t]*[#\n])", re.MULTILINE)
# A function parameter whose default declares a command-line option (typer's `beta: float = typer.Option(0.04)`):
# the run that leaves the option alone reads the option's default, as argparse's does
OPTION_DECLARATIONS = frozenset({"Option", "Argument"})
# The flag and parameter names of a click option (`@click.option("-k", "--kl-coef", ...)`) as written
_CLICK_NAME = re.compile(r"^(?:--?([\w-]+)|(\w+))$")
# `beta=1e-3` as a keyword, `args.beta = 0.1` or `beta = schedule(step)`: a name and the first word of its value
# a script whose command line sets `key=value` overrides of a Hydra configuration, not flags
_HYDRA_ENTRY = re.compile(r"@hydra\.main\b")
_SET = re.compile(r"\b(\w+)[ \t]*=(?!=)[ \t]*([^\s,()\]}#]*)")
_YAML = (".yaml", ".yml")  # the linted configuration files a nested key is looked up in
_SHELL = (".sh", ".bash", ".slurm", ".sbatch", ".job")  # the linted launch scripts (klaudit.frameworks.SHELL_SUFFIXES)


@dataclass(frozen=True)
class Default:
    value: str  # as klaudit.frameworks.calls reads a literal: a string without its quotes
    origin: str  # where it is given, for the message
    key: str = ""  # the configuration key whose absence the value assumes (`cfg.get("ppo_epochs", 4)`), if any
    holder: str = ""  # the name of the mapping the key is read from (`grpo_cfg` of `grpo_cfg.get("beta", 0.001)`)
    launch: bool = False  # a value a launch's flag gives, not a default (the origin says which launch)
    yaml: bool = False  # a value the project's YAML files give the run (the origin says where)
    parsed: bool = False  # a launch's value of a dataclass field's flag (HfArgumentParser), not of an add_argument


@dataclass(frozen=True)
class Options:
    """The literal defaults the project's command lines and dataclasses give their options, by name
    (`--kl-coef` as `kl_coef`, the attribute an argparse namespace gives it) and file, and the YAML files
    where a key nested below a configuration object's root is looked up."""

    given: Mapping[str, Mapping[str, tuple[Default, ...]]] = field(default_factory=dict)  # name -> path -> defaults
    configs: tuple[str, ...] = ()  # the linted YAML files, read only when a nested key is looked up
    # name -> resolved path of a script -> the values the launches that set it give it
    launched: Mapping[str, Mapping[str, tuple[Default, ...]]] = field(default_factory=dict)
    # the variables the project's environment files set (`environment_files`), by name
    environment: Mapping[str, Default] = field(default_factory=dict)
    # the names some Python code of the project sets, by keyword or assignment, to anything but a literal 0
    # (`Config(beta=1e-3)` in a preset beside the field's `beta: float = 0.0`), with the resolved paths that set them
    set_in_code: Mapping[str, frozenset[str]] = field(default_factory=dict)
    # the options some launch of a script that declares or parses them leaves unset: that run takes the default
    left_at_default: frozenset[str] = frozenset()
    run: frozenset[str] = frozenset()  # the resolved paths of the project's scripts some launch script runs
    # the resolved paths of the project's modules those scripts import (`from open_r1.arguments import ...`)
    imported: frozenset[str] = frozenset()
    scripts: tuple[str, ...] = ()  # the linted launch scripts
    # the names some Python code of the project sets to anything but False, None or the same option handed on
    # (`use_kl_estimator_k3=self.args.use_kl_estimator_k3`)
    switched_in_code: frozenset[str] = frozenset()

    def off_in_every_run(self, name: str) -> bool:
        """Whether the project's own launches switch the boolean option `name` off, and nothing turns it on: some
        launch script sets it (`default_agent.use_kl_loss=False`), every launch and every linted YAML file that sets a
        key or flag of that last name says false, and no Python code, unit tests included, sets it otherwise. A branch
        taken only when it is on never runs. A library whose configs leave it off but whose tests turn it on
        (NeMo-RL's `use_kl_in_reward`) offers it to its users."""
        launched = launched_switches(self.scripts, name)
        if name in self.switched_in_code:
            return False
        if not launched:
            return self._declared_off_and_left(name)
        return all(value.lower() == "false" for value in (*configured_values(self.configs, name), *launched))

    def _declared_off_and_left(self, name: str) -> bool:
        """Whether every declaration of the option `name` leaves it False (argparse's `action="store_true"`), a
        script that declares it is one the project's launches run, and no launch, no linted YAML file and no code
        turns it on: OpenRLHF's `--use_kl_estimator_k3` in a copy whose launches never pass it."""
        declared = self.given.get(name, {})
        return bool(declared) and all(value.value == "False" for values in declared.values() for value in values) \
            and any(str(Path(path).resolve()) in self.run for path in declared) \
            and not configured_values(self.configs, name)

    def environment_read(self, calls: Sequence[tuple[str, Sequence[str | None]]], line: int) -> Default | None:
        """The value a keyword set to an environment read has (`beta=float(os.environ.get("GRPO_BETA", "0.0"))`):
        the one the project's environment files set, else the read's literal default (`environment_read`)."""
        variable = _environment_variable(calls)
        return self.environment.get(variable or "") or environment_read(calls, line)

    def configured(self, key: str) -> Default | None:
        """The value the linted YAML files give the nested key `key` (`training.grpo.beta`, the path of
        `cfg.training.grpo.beta` below its root), when they give it one value."""
        leaf = key.rsplit(".", 1)[-1]
        found = [values[key] for path in self.configs if key in (values := _yaml_values(path, leaf))]
        return found[0] if len({default.value for default in found}) == 1 else None

    def zero_in_every_run(self, key: str, path: str) -> bool:
        """Whether a hand-written trainer's read of the option `key` (`config.kl_coefficient`, or the dotted
        `training.kl_coef` of `cfg.training.kl_coef`) gives 0 in every run of the file at `path`: its default there
        (`default`) and every launch of any script that sets it say 0; or, for a key no Python option declares, every
        linted YAML file that sets it gives 0; and no Python code sets it otherwise (`set_in_code`). A KL term it scales
        is then 0, and the code that forms it trains nothing."""
        given = self._in_every_run(key, path)
        return bool(given) and all(number(value.value) == 0 for value in given)

    def zero_in_launched_runs(self, key: str, path: str) -> bool:
        """Whether the option `key` (a single attribute, `args.beta_rl`) is 0 in every run the project's launches
        show of the file at `path` (`run_values`): a trainer's coefficient copied from it (`self.beta_rl =
        args.beta_rl`) scales nothing. A library, whose launches are its users', is never read so."""
        values = self.run_values(key, path)
        return bool(values) and all(number(value) == 0 for value in values or ())

    def run_values(self, key: str, path: str) -> frozenset[str] | None:
        """The values the option `key` (a single attribute, `args.kl_approximator`) can have in a run of the file at
        `path`, where a launch script of the project runs a file that declares it (or imports it, a dataclass of
        options its parser reads): its default and what every launch
        and linted YAML file sets it to, when all are literals and no Python code sets it otherwise; None where some
        run may give it another value, or where no launch shows how the project runs (a library's option, a
        choice its README leaves to the user). A trainer's branch on a value none of them gives is never taken."""
        if "." in key or not any(str(Path(file).resolve()) in self.run | self.imported for file in self.given.get(key, {})):
            return None
        given = self._in_every_run(key, path)
        values = {value.value for value in given} | set(configured_values(self.configs, key))
        return frozenset(values) if given and UNREAD not in values else None

    def _in_every_run(self, key: str, path: str) -> list[Default]:
        """The values that runs of the file at `path` give the option `key`: the default there and every launch's
        (the YAML files' values of a key nested below a configuration's root); none where Python code of the same
        project sets it. Where the launches set it otherwise than its default and none leaves it unset (RS-GRPO's only
        launch passes `--beta "$BETA"` with `BETA=${BETA:-0.00}` over a field default of 0.04), theirs are the runs'."""
        if self._set_in_code_near(key.rsplit(".", 1)[-1], path):
            return []
        if "." not in key and (key in self.given or key in self.launched):
            found = self.default(key, path)
            launches = [value for values in self.launched.get(key, {}).values() for value in values]
            if found is None and launches and key not in self.left_at_default \
                    and all(value.value != UNREAD for value in launches):
                return launches
            return [found, *launches] if found is not None else []
        return list(self._configured_keys.get(key, ()))

    def _set_in_code_near(self, name: str, path: str) -> bool:
        """Whether Python code of the project that holds the file at `path` sets the option `name` otherwise (a project
        inside another, a folder with its own packaging file, is the other's: qwen-vl-utils' `beta = math.sqrt(...)`
        in a video-RL repository says nothing of its trainer's `beta`)."""
        home = project_root(Path(path).resolve().parent)
        return any(home is None or project_root(Path(file).parent) == home for file in self.set_in_code.get(name, ()))

    @functools.cached_property
    def _configured_keys(self) -> dict[str, tuple[Default, ...]]:
        """Every key the linted YAML files set, dotted below the root, with the value each of them gives it: read
        once, since `zero_in_every_run` asks for each attribute a trainer reads."""
        found: dict[str, list[Default]] = {}
        for config in self.configs:
            try:
                text = file_text(config)
            except OSError:
                continue
            for key, value in _values(config, text).items():
                found.setdefault(key, []).append(value)
        return {key: tuple(values) for key, values in found.items()}

    def read(self, default: Default, path: str = "") -> Default | None:
        """What a read of a configuration key with that default gets (`grpo_cfg.get("beta", 0.001)`): the default
        where the linted YAML files leave the key alone (`leave_alone`), else the one value they give it in a section
        the mapping is named for (`grpo.beta` for `grpo_cfg`), from the files named like the reading module at `path`
        where they differ (configs/grpo.yaml for grpo_trainer.py, beside a dpo.yaml with its own `training.beta`);
        where they sweep a coefficient there (0, 0.01 and 0.1 in three configs), the first value strictly between 0
        and 1 (`_swept`); None for other differing values, or where they give none there. A mapping with a generic
        name (`cfg = training_cfg or {}`, then `cfg.get("kl_coef", 0.01)`) may be any section of them: where every
        file that sets the key gives it a value strictly between 0 and 1 (0.01 and 0.02), every run has the term on,
        and the first such value stands for them."""
        if self.leave_alone(default):
            return default
        holder = default.holder.lower()
        leaves = [(key, value) for config in self.configs for key, value in _yaml_values(config, default.key).items()
                  if key.rsplit(".", 1)[-1] == default.key]
        given = [(key, value) for key, value in leaves
                 if "." in key and holder and key.rsplit(".", 2)[-2].lower() in holder]
        if not given and _GENERIC_MAPPING.match(holder):
            if not all(0 < (number(value.value) or 0) < 1 for _, value in leaves):
                return None
            given = leaves
        words = set(re.split(r"[\W_]+", Path(path).stem.lower()))
        named = [(key, value) for key, value in given if Path(value.origin.rsplit(":", 1)[0]).stem.lower() in words]
        if len({value.value for _, value in given}) > 1 and named:
            given = named
        if len({value.value for _, value in given}) != 1:
            return _swept(given)
        key, value = given[0]
        return Default(value.value, f"{key} at {value.origin}", yaml=True)

    def leave_alone(self, default: Default) -> bool:
        """Whether the linted YAML files leave the configuration key a default assumes out, or give it that same
        value (0 and 0.0 alike), wherever they nest it: a read of the key with that default (`cfg.get("ppo_epochs", 4)`)
        gets it."""
        given = number(default.value)
        return not default.key or all(value == default.value or given is not None and number(value) == given
                                      for value in configured_values(self.configs, default.key))

    def default(self, name: str, path: str) -> Default | None:
        """The default of option `name` for a configuration built in the file at `path`: the one that file
        gives (a training script parses its own options), else the only one the project gives. A project inside
        another (a folder with a setup.py or pyproject.toml: LLaMA-Factory beside ms-swift in one repository) sees
        only its own files' options. The value every launch of the file that sets the option gives it comes first."""
        launched = self.launched.get(name, {}).get(str(Path(path).resolve()), ())
        if any(value.value == UNREAD for value in launched):
            return None
        if len({value.value for value in launched}) == 1:
            return launched[0]
        if launched and all(0 < (number(value.value) or 0) < 1 for value in launched):
            return _coefficient(launched)
        found = self._declared_default(name, path)
        anywhere = {value.value for values in self.launched.get(name, {}).values() for value in values if value.parsed}
        if found is not None and anywhere - {found.value}:
            return None  # a launch of some script sets it otherwise, or to a value not read: not the default
        return found

    def _declared_default(self, name: str, path: str) -> Default | None:
        """The default of option `name` a file declares: the file of `path`'s own, else the only one the project's
        files (within `path`'s project) give."""
        by_path = self.given.get(name, {})
        here = by_path.get(path) or next((defaults for file, defaults in by_path.items()
                                          if Path(file).resolve() == Path(path).resolve()), ())
        if len({default.value for default in here}) == 1:
            return here[0]
        home = project_root(Path(path).resolve().parent)
        everywhere = [default for file, defaults in by_path.items()
                      if home is None or Path(file).resolve().is_relative_to(home) for default in defaults]
        return everywhere[0] if len({default.value for default in everywhere}) == 1 else None


def defaulted(setting: Setting, default: Default | None) -> Setting:
    """`setting`, whose value `default` gave where it does, marked with where that is."""
    if default is None:
        return setting
    return replace(setting, origin=default.origin, run_given=default.launch or default.yaml)


def placeholder_setting(setting: Setting, expression: str, options: Options, path: str) -> Setting:
    """An unknown setting whose value is one read written in an f-string's braces (`f"...use_kl_loss={cfg['use_kl']}"`
    in the file at `path`), given the value that read has: of a key of a mapping or configuration object
    (`cfg['use_kl']`, `cfg.use_kl`), the one the linted YAML files give that key; of an option (`args.lr`), its
    default or the value its launches give (`resolve`)."""
    read = _READ.fullmatch(expression.strip())
    if read is None:
        return setting
    key = read.group("key") or read.group("attribute")
    if read.group("attribute") and OPTION_HOLDER.match(read.group("holder").rpartition(".")[2]):
        option = resolve(expression.strip(), {}, options, path)
        return setting if option is None else defaulted(replace(setting, value=option.value), option)
    configured = options.configured(key)
    if configured is None:
        return setting
    return replace(setting, value=configured.value, origin=f"{key} at {configured.origin}", run_given=True)


# one read of a mapping's key or an object's attribute: `cfg['use_kl']`, `self.config.beta`, `args.lr`
_READ = re.compile(r"(?P<holder>[A-Za-z_][\w.]*?)(?:\[(?P<q>[\"'])(?P<key>\w+)(?P=q)\]|\.(?P<attribute>[A-Za-z_]\w*))")
# a configuration mapping named for no section of it (`cfg.get("kl_coef", 0.01)`): any section may be the one read
_GENERIC_MAPPING = re.compile(r"^(cfg|conf|configs?|configuration|settings|params|hparams|kwargs)$")
# what a script names its parsed command line (`args`, `opts`, `cli_args`, `FLAGS`, `hparams`): its attributes are options
OPTION_HOLDER = re.compile(r"^(\w+_)?(args|opts?|options|flags|hparams)$", re.IGNORECASE)


def _swept(given: Sequence[tuple[str, Default]]) -> Default | None:
    """The value of a coefficient the YAML files sweep over [0, 1) (a KL weight of 0 in one config, 0.01 in another)
    for the verdict: the first strictly between 0 and 1, since the rules read such a value only against 0 and 1 and
    the configs that set it train with the term. None when a value lies outside [0, 1) or none lies inside (0, 1)."""
    numbers = [number(value.value) for _, value in given]
    if not given or any(found is None or not 0 <= found < 1 for found in numbers):
        return None
    inside = [(key, value) for (key, value), found in zip(given, numbers) if found and 0 < found < 1]
    if not inside:
        return None
    key, value = min(inside, key=lambda entry: entry[1].origin)
    return Default(value.value, f"{key} at {value.origin}; the {len(given)} configs that set it give "
                                f"{min(numbers):g} to {max(numbers):g}", yaml=True)  # type: ignore[type-var]


def _coefficient(launched: Sequence[Default]) -> Default:
    """The launches' values of a coefficient they all set strictly between 0 and 1 (a KL weight swept over 0.001,
    0.005, 0.01), where they differ: the rules read such a value only against 0 and 1, and a count or a batch size
    is never such a fraction, so every launch gets the verdict of the first, named with the range."""
    first = min(launched, key=lambda value: value.origin)
    numbers = sorted(number(value.value) or 0 for value in launched)
    return replace(first, origin=f"{first.origin}; the {len(launched)} launches set {numbers[0]:g} to {numbers[-1]:g}")


def option_defaults(sources: Mapping[str, str], configs: Iterable[str] = ()) -> Options:
    """The options of the project's command lines (`add_argument`) and dataclasses (annotated fields)
    with a literal default, read from the text of `sources` (path -> text), and the YAML files `configs`."""
    given: dict[str, dict[str, list[Default]]] = {}
    declared: dict[str, set[str]] = {}  # resolved path -> the options its command line declares, with a default or not
    fields: set[str] = set()  # the dataclass fields, which an HfArgumentParser of any script may take as flags
    for path, text in sorted(sources.items()):
        found: list[tuple[str, str, int]] = []
        if "add_argument" in text:
            for match in _ADD_ARGUMENT.finditer(text):
                declared.setdefault(str(Path(path).resolve()), set()).add(match.group(1))
                literal = _argument_default(match.group(2), text)
                if literal is not None:
                    found.append((match.group(1).replace("-", "_"), literal, match.start()))
        if "dataclass" in text or "Field(" in text:
            found += [(match.group(1), match.group(2) or match.group(3), match.start(1)) for match in _FIELD.finditer(text)]
            fields.update(match.group(1) for match in _FIELD.finditer(text))
        for name, literal, offset in found:
            origin = f"{path}:{text.count(chr(10), 0, offset) + 1}"
            given.setdefault(name, {}).setdefault(path, []).append(Default(_value(literal), origin))
    configs = tuple(configs)
    run: set[str] = set()
    overridden = {str(Path(path).resolve()) for path, text in sources.items() if _HYDRA_ENTRY.search(text)}
    left: set[str] = set()
    launched = _launched([path for path in configs if path.endswith(_SHELL)], declared, fields, overridden, run, left)
    set_in_code: dict[str, set[str]] = {}
    for path, text in sources.items():
        if not _unit_tests(path, text):
            names = {match.group(1) for match in _SET.finditer(text) if _sets_otherwise(match, text)}
            resolved = str(Path(path).resolve()) if names else ""
            for name in names:
                set_in_code.setdefault(name, set()).add(resolved)
    return Options({name: {path: tuple(defaults) for path, defaults in by_path.items()} for name, by_path in given.items()},
                   tuple(sorted(path for path in configs if path.endswith(_YAML))),
                   {name: {path: tuple(values) for path, values in by_path.items()} for name, by_path in launched.items()},
                   run=frozenset(run), imported=_imported(run, sources),
                   scripts=tuple(sorted(path for path in configs if path.endswith(_SHELL))),
                   switched_in_code=frozenset(match.group(1) for text in sources.values()
                                              for match in _SET.finditer(text) if _switches_otherwise(match)),
                   set_in_code={name: frozenset(paths) for name, paths in set_in_code.items()},
                   left_at_default=frozenset(left))


def _sets_otherwise(binding: re.Match, text: str) -> bool:
    """Whether code that binds a name (`_SET`'s match in `text`) may give the option of that name another value
    than its default and the launches': anything but a literal 0 or the option copied to an instance attribute of
    its own name (`self.beta_rl = args.beta_rl` in a trainer's __init__). A keyword that hands it on
    (`kl_coef=args.kl_coef`) still counts, conservatively: the parameter it lands in is not traced."""
    name, value = binding.groups()
    copied = value.endswith(f".{name}") and text.endswith("self.", 0, binding.start())
    return number(value) != 0 and not copied


def _switches_otherwise(binding: re.Match) -> bool:
    """Whether code that binds a name (`_SET`'s match) may switch the boolean option of that name on: anything but
    False, None or the option of that name handed on (`x=args.x`)."""
    name, value = binding.groups()
    return value not in ("False", "None") and not value.endswith(f".{name}")


def _imported(run: Collection[str], sources: Mapping[str, str]) -> frozenset[str]:
    """The resolved paths of the modules of `sources` that the scripts `run` (resolved paths) import by name:
    `from open_r1.arguments import X` or `import open_r1.arguments`, and `from .arguments import X` beside it; and
    the modules a package they import re-exports (`from open_r1.trainer import GRPOConfig`, whose `__init__.py` has
    `from .grpo_config import GRPOConfig`)."""
    texts = {str(Path(path).resolve()): text for path, text in sources.items()}
    imported = _imported_by(run, texts)
    packages = [path for path in imported if path.endswith("/__init__.py") and path not in run]
    return imported | _imported_by(packages, texts)


def _imported_by(importers: Collection[str], texts: Mapping[str, str]) -> frozenset[str]:
    """The resolved paths among `texts` of the modules the files `importers` (resolved paths) import by name."""
    endings: set[str] = set()  # what the path of an imported module ends with, without `.py` or `/__init__.py`
    for script in importers:
        try:
            tree = ast.parse(texts.get(script, ""))
        except (SyntaxError, ValueError, RecursionError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                endings.update("/" + alias.name.replace(".", "/") for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                module = (node.module or "").replace(".", "/")
                base = "/" + module if node.level == 0 else str(Path(script).parents[node.level - 1] / module)
                endings.update([base, *(f"{base}/{alias.name}" for alias in node.names)])
    return frozenset(path for path in texts if path.removesuffix(".py").removesuffix("/__init__").endswith(
        tuple(endings)) and path.endswith(".py")) if endings else frozenset()


def _unit_tests(path: str, text: str) -> bool:
    """Whether the file is a pytest module (`test_*.py` or `*_test.py` defining a `test_` function): the values
    its tests give a configuration (`GRPOConfig(use_kl_loss=True, kl_loss_coef=0.1)`) are no run of the project."""
    name = Path(path).name
    return (name.startswith("test_") or name.endswith("_test.py")) and re.search(r"^\s*def test_", text, re.M) is not None


def _argument_default(arguments: str, text: str) -> str | None:
    """The literal default of an `add_argument`'s keywords: `default=0.02`, or `default=BETA` where the file
    binds BETA once, at module level, to a literal (`BETA = 0.02`) and never declares it `global`, or
    `default=DEFAULTS["beta"]` where it so binds DEFAULTS to a dict literal that gives "beta" one literal
    (`_dict_literal_entry`)."""
    literal = _DEFAULT.search(arguments)
    if literal is not None:
        return literal.group(1)
    named = _DEFAULT_NAME.search(arguments) or _DEFAULT_ENTRY.search(arguments)
    if named is None or re.search(rf"^[ \t]*global\b[^\n]*\b{named.group(1)}\b", text, re.MULTILINE):
        return None
    assigned = list(re.finditer(rf"^{named.group(1)}[ \t]*(?::[^=\n]+)?=(?!=)[ \t]*(.*)$", text, re.MULTILINE))
    if len(assigned) != 1:
        return None
    if named.re is _DEFAULT_ENTRY:
        return _dict_literal_entry(named.group(1), named.group(2), assigned[0], text)
    constant = re.fullmatch(rf"{_LITERAL}[ \t]*(?:#.*)?", assigned[0].group(1).rstrip())
    return constant.group(1) if constant is not None else None


def _dict_literal_entry(name: str, key: str, binding: re.Match, text: str) -> str | None:
    """The literal that the dict literal of the module-level `binding` of `name` (`DEFAULTS = {` up to the `}` that
    starts a line, or on one line) gives `key`: None where no entry or several give it (a nested section's key
    too), a `**` spread may, or the module changes the mapping in place (`DEFAULTS["beta"] = 0.1`,
    `DEFAULTS.update(...)`)."""
    if not binding.group(1).startswith("{") or re.search(
            rf"\b{name}[ \t]*(?:\[[^\]\n]*\][ \t]*=(?!=)|\.(?:update|setdefault|pop|clear)\()", text):
        return None
    end = text.find("}", binding.start(1)) if binding.group(1).rstrip().endswith("}") else text.find("\n}", binding.end())
    block = text[binding.start(1):end if end >= 0 else len(text)]
    entries = re.findall(rf"""["']{key}["'][ \t]*:[ \t]*{_LITERAL}[ \t]*(?=[,}}#\n])""", block)
    return entries[0] if len(entries) == 1 and "**" not in block else None


def _launched(launchers: Iterable[str], declared: Mapping[str, Collection[str]], fields: Collection[str],
              overridden: Collection[str], run: set[str], left: set[str]) -> dict[str, dict[str, list[Default]]]:
    """The values the shell scripts `launchers` give, on each command line that runs a script of the project
    (by its path or its module's name, klaudit.frameworks.settings.launched_scripts) other than a Hydra entry
    (`overridden`: resolved paths; its runs set `key=value` overrides, read elsewhere), the options that script
    declares (`declared`: its resolved path -> the flags, `kl-coef` as written) or the project's dataclasses do
    (`fields`, parsed by whichever script), by option name (`kl_coef`) and the script's resolved path. A dataclass
    field's value the lint cannot read (`--mini_batch_size=$MBSIZE` of a variable set elsewhere) is kept as UNREAD:
    the field's default is then not what the launch trains with. A script's own option set so is left out, as
    before: its default stands for the runs of a sweep (`--beta "$b"`). The scripts launched, with options or not,
    are added to `run`, and the options a launch leaves unset (by option name), to `left`."""
    found: dict[str, dict[str, list[Default]]] = {}
    for launcher in launchers:
        try:
            text = file_text(launcher)
        except OSError:
            continue
        for offset, script in launched_scripts(launcher, text):
            target = str(script.resolve())
            own = declared.get(target, ())
            flags = {*own, *fields}
            if not flags or target in overridden:
                continue
            run.add(target)
            line = text.count("\n", 0, offset) + 1
            spellings = {spelled: spelled for flag in flags for spelled in (flag, flag.replace("-", "_"))}
            given = cli_flags(only_command(text, offset), spellings)
            named = {spelled.replace("-", "_") for spelled in given}
            left.update(name for flag in own if (name := flag.replace("-", "_")) not in named)
            if not named.isdisjoint(fields):  # a launch that sets none of the fields runs a script that parses none
                left.update(name for name in fields if name not in named)
            for spelled, setting in given.items():
                parsed = spelled not in own and spelled.replace("_", "-") not in own
                if setting.value is None and not parsed:
                    left.add(spelled.replace("-", "_"))
                    continue  # a script's own option swept by a variable: its default stands for the runs
                where = "" if setting.line == line else f", set at line {setting.line}"
                value = Default(UNREAD if setting.value is None else setting.value,
                                f"--{spelled} of the launch at {launcher}:{line}{where}", launch=True, parsed=parsed)
                found.setdefault(spelled.replace("-", "_"), {}).setdefault(target, []).append(value)
    return found


def launched_switches(scripts: Iterable[str], name: str) -> list[str]:
    """The values the launch scripts `scripts` give the boolean option `name`: `key.name=False` or `name=false` (a
    Hydra or OmegaConf override), `--name false`; a bare `--name` (argparse's store_true), or a value that is no
    literal (`use_kl_loss=$USE_KL_LOSS`), is "true": it may switch the option on."""
    given = re.compile(rf"(?<![\w-])(?:[\w.]+\.)?{re.escape(name)}=[\"']?([^\s\"'\\]*)"
                       rf"|--{re.escape(name)}\b(?:[ =]+(\w+))?")
    found: list[str] = []
    for path in scripts:
        for match in given.finditer(read_text(Path(path)) or ""):
            value = match.group(1) or match.group(2) or "true"
            found.append(value if value.lower() in ("true", "false") else "true")
    return found


def configured_values(configs: Iterable[str], leaf: str) -> tuple[str, ...]:
    """The values the YAML files `configs` give a key whose last part is `leaf`, at any depth, each once."""
    return tuple(dict.fromkeys(value.value for path in configs
                               for key, value in _yaml_values(path, leaf).items() if key.rsplit(".", 1)[-1] == leaf))


def _yaml_values(path: str, leaf: str) -> dict[str, Default]:
    """{key, dotted below the root: its value} of the YAML file at `path`, if its text holds `leaf:` at all (else {})."""
    try:
        text = file_text(path)
    except OSError:
        return {}
    return _values(path, text) if f"{leaf}:" in text else {}


@functools.lru_cache(maxsize=256)  # asked for each computed keyword and configuration read of each configuration call
def _values(path: str, text: str) -> dict[str, Default]:
    return {key: Default(setting.value, f"{path}:{setting.line}")
            for key, setting in yaml_settings(text).items() if setting.value is not None}


def _value(literal: str) -> str:
    """The literal as klaudit.frameworks.calls gives it: a string's content, a number without underscores."""
    return literal[1:-1] if literal[0] in "\"'" else literal.replace("_", "")


def click_parameter(declarations: Sequence[str]) -> str | None:
    """The parameter a click option passes (`@click.option("-k", "--kl-coef", ...)` gives kl_coef): the name written
    without dashes, else the first flag with two, else the first with one, dashes made underscores."""
    names = [match for declaration in declarations if (match := _CLICK_NAME.match(declaration))]
    bare = [match.group(2) for match in names if match.group(2)]
    flags = sorted((match.group(0) for match in names if match.group(1)), key=lambda flag: not flag.startswith("--"))
    if bare:
        return bare[0]
    return flags[0].lstrip("-").replace("-", "_") if flags else None


def bindings(parameters: Mapping[str, str | None], assigned: Collection[str],
             reads: Mapping[str, Default] | None = None) -> dict[str, Default | None]:
    """The names a function binds: each parameter's literal default (None where it has none), and None for
    every name its body assigns, which hides a parameter's default and an enclosing scope's name, except the
    names `reads` gives: each bound once, to a read of a configuration key with a literal default."""
    return {**{name: None if value is None else Default(value, f"the default of parameter {name}")
               for name, value in parameters.items()}, **dict.fromkeys(assigned), **(reads or {})}


def configuration_read(name: str, calls: Sequence[tuple[str, Sequence[str | None]]], line: int) -> Default | None:
    """The default of a local `name` bound once to a read of a configuration mapping with a literal default,
    `ppo_epochs = cfg.get("ppo_epochs", 4)` (bare or converted by `int(...)`; `calls` as environment_default takes
    them): the value a run whose configuration leaves the key out reads (Options.leave_alone decides whether the
    linted YAML files do). None for any other value, an environment read among them."""
    call = _unconverted(calls)
    if call is None:
        return None
    called, arguments = call
    if not called.endswith(".get") or called in ENVIRONMENT_READS or len(arguments) != 2:
        return None
    key, default = arguments
    if key is None or default is None or not key.isidentifier():
        return None
    return Default(default, f"{name} = {called}({key!r}, {default}) at line {line}, where the configuration leaves {key} out",
                   key, holder=called.removesuffix(".get").rsplit(".", 1)[-1])


def module_constants(assignments: Iterable[tuple[str, str | None, int, str]], rebound: Collection[str],
                     environment: Mapping[str, Default] | None = None) -> dict[str, Default]:
    """The module's constants: each name bound once at module level (`assignments`: name, its literal value or
    None, line, and the environment variable the value is the default of, or "", for every module-level binding)
    to a literal, and never declared `global` in a function (`rebound`). `BETA = 0.04` then
    `GRPOConfig(beta=BETA)`, as notebooks and scripts write it; `BETA = float(os.environ.get("BETA", 0.04))`
    reads 0.04 in a run that leaves the variable unset, as a shell script's `${BETA:-0.04}` does, and the value the
    project's `environment` files give the variable where they set it."""
    seen: dict[str, list[tuple[str | None, int, str]]] = {}
    for name, value, line, variable in assignments:
        seen.setdefault(name, []).append((value, line, variable))
    environment = environment or {}
    return {name: environment.get(variable) or Default(
                value, f"{name} = {value} at line {line}" + (f" while {variable} is unset" if variable else ""))
            for name, [(value, line, variable)] in ((name, found) for name, found in seen.items() if len(found) == 1)
            if value is not None and name not in rebound}


def local_read(name: str, calls: Sequence[tuple[str, Sequence[str | None]]], line: int, options: Options) -> Default | None:
    """The value a function's local `name`, bound once to `calls` (as environment_default takes them), reads: a
    configuration read's default (`configuration_read`), or an environment read's (`Options.environment_read`)."""
    return configuration_read(name, calls, line) or options.environment_read(calls, line)


UNREAD = "\0unread"  # a launch's value the lint cannot read (`--batch_size=$BS` of a variable set elsewhere)

# `os.environ.get("BETA", 0.04)`, `os.getenv(...)` and the bare names an import gives them
ENVIRONMENT_READS = frozenset({"os.environ.get", "os.getenv", "environ.get", "getenv"})
_CONVERSIONS = frozenset({"float", "int", "str"})  # what wraps such a read without changing its default


def _environment_variable(calls: Sequence[tuple[str, Sequence[str | None]]]) -> str | None:
    """The variable a value reads from the environment (`calls` as environment_default takes them), if it does."""
    call = _unconverted(calls)
    return call[1][0] if call is not None and call[0] in ENVIRONMENT_READS and call[1] else None


# `export GRPO_BETA=0.01`, `BETA="0.04"  # comment` (a dotenv file, direnv's .envrc)
_EXPORT = re.compile(r"""^[ \t]*(?:export[ \t]+)?([A-Za-z_]\w*)=(["']?)([^"'\s#]*)\2[ \t]*(?:#[^\n]*)?$""", re.MULTILINE)
ENVIRONMENT_FILES = (".env", ".envrc")  # read from a linted folder and from the project's folder above it


def environment_files(roots: Iterable[str | Path]) -> dict[str, Default]:
    """The variables that the environment files (`ENVIRONMENT_FILES`) of the linted folders, or of the projects that
    hold them, set to one value each (a run loads them: python-dotenv, direnv)."""
    folders = [Path(root) if Path(root).is_dir() else Path(root).parent for root in roots]
    folders += [home for folder in folders if (home := project_root(folder.resolve())) is not None]
    seen: dict[str, list[Default]] = {}
    for file in dict.fromkeys(folder.resolve() / name for folder in folders for name in ENVIRONMENT_FILES):
        text = read_text(file) or ""
        for match in _EXPORT.finditer(text):
            origin = f"{file.name}:{text.count(chr(10), 0, match.start()) + 1}"
            seen.setdefault(match.group(1), []).append(Default(match.group(3), f"{match.group(1)}={match.group(3)} at {origin}"))
    return {name: values[0] for name, values in seen.items() if len({value.value for value in values}) == 1}


def environment_default(calls: Sequence[tuple[str, Sequence[str | None]]]) -> tuple[str, str] | None:
    """(variable, literal) of a value that reads the environment with a literal default, the value a run that leaves
    the variable unset reads; `calls`: the value's nested calls from the outside in, each as (the name called, the
    literals of its positional arguments, None for anything else): `[("float", [None]), ("os.environ.get",
    ["BETA", "0.04"])]` of `float(os.environ.get("BETA", 0.04))`. None for any other value."""
    call = _unconverted(calls)
    if call is None:
        return None
    name, arguments = call
    if name not in ENVIRONMENT_READS or len(arguments) != 2:
        return None
    variable, default = arguments
    return (variable, default) if variable is not None and default is not None else None


def environment_read(calls: Sequence[tuple[str, Sequence[str | None]]], line: int) -> Default | None:
    """The value a keyword set to an environment read with a literal default has in a run that leaves the variable
    unset (`beta=float(os.environ.get("GRPO_BETA", "0.04"))`), as a module constant bound to one has
    (`module_constants`); `calls` as environment_default takes them."""
    found = environment_default(calls)
    return None if found is None else Default(found[1], f"{found[1]} at line {line} while {found[0]} is unset")


def _unconverted(calls: Sequence[tuple[str, Sequence[str | None]]]) -> tuple[str, Sequence[str | None]] | None:
    """The one call a value makes, once a conversion around it (`float(...)`) is taken off; None if it makes more."""
    if len(calls) == 2 and calls[0][0] in _CONVERSIONS and len(calls[0][1]) == 1:
        calls = calls[1:]
    return calls[0] if len(calls) == 1 else None


def visible(scopes: Iterable[Mapping[str, Default | None]]) -> dict[str, Default]:
    """The values seen inside the last of nested `scopes` (outermost first: the module's constants, then each
    enclosing function's names as `bindings` gives them): a name bound by an inner scope hides the outer one's,
    and the entries read through it (`GRPO.beta` of a dict `GRPO`, `config.BETA` of a module `config`)."""
    seen: dict[str, Default | None] = {}
    for bound in scopes:
        hidden = {name for name in bound if "." not in name}
        seen = {name: value for name, value in seen.items() if name.partition(".")[0] not in hidden}
        seen.update(bound)
    return {name: value for name, value in seen.items() if value is not None}


def resolve(written: str, names: Mapping[str, Default], options: Options, path: str) -> Default | None:
    """The default a keyword set to `written` (a name, or a dotted attribute) in the file at `path` has:
    for a name, the value `names` (`visible`) gives it: the literal default of the enclosing function's
    parameter of that name (one the function never reassigns), else the module's constant (also `config.BETA` of
    an imported project module); for an attribute nested two deep below its root (`cfg.training.beta`), the
    value the project's YAML files give that key; else the default of the project's option named like the
    last attribute (`args.beta`, `self.args.beta`); None otherwise."""
    found = names.get(written)  # a name, or `config.BETA` of an imported project module
    if found is not None or written.isidentifier():
        return options.read(found) if found is not None else None
    head, _, attribute = written.rpartition(".")
    if not (head and attribute.isidentifier() and all(part.isidentifier() for part in head.split("."))):
        return None
    # below the root: `training.grpo.beta` of `cfg.training.grpo.beta` (or of `self.cfg.training.grpo.beta`)
    _, _, nested = written.removeprefix("self.").partition(".")
    if "." in nested:  # a key nested in a configuration file (Hydra, OmegaConf), not an option's name
        configured = options.configured(nested)
        if configured is not None:
            return Default(configured.value, f"{nested} at {configured.origin}", yaml=True)
    option = options.default(attribute, path)
    if option is None or option.launch:
        return option
    return Default(option.value, f"the default of {attribute} at {option.origin}")
