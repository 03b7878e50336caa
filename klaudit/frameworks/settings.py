"""Reading the flags a user sets, with the line and column of each: launch scripts and YAML files.

A setting is a dotted key (`actor_rollout_ref.actor.kl_loss_type`) with its literal value. A value
that is not a literal (`$KL_TYPE`, `${oc.env:...}`) is kept as None: the key is set, to something
the reader cannot know, so no verdict rests on the framework's default for it.
"""

from __future__ import annotations

import ast
import functools
import operator
import re
import shlex
from collections import deque
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from klaudit.catalog import Config


@dataclass(frozen=True)
class Setting:
    value: str | None  # None: set, but not to a literal (a variable the reader cannot resolve)
    line: int
    column: int  # where the key starts
    end_column: int  # just after the value
    origin: str = ""  # where a computed value's default comes from (klaudit.frameworks.options), if it does
    # whether that is a value given to the run (a launch's flag, the project's YAML), not a default a launch may replace
    run_given: bool = False
    # given through a mapping filtered to the keys the running release takes (`{k: v ... if k in accepted}`):
    # kept where that release takes it, so it bounds no release
    if_taken: bool = False
    # the literals of the branches of a conditional it is set to (`1e-5 if peft_config else 0.001`), value None
    branches: tuple[str, ...] = ()


@dataclass(frozen=True)
class ConfigCall:
    """One call of a configuration class: its name, where it is, and its keywords."""

    name: str
    where: Setting  # the called name's position (value unused)
    settings: Mapping[str, Setting]
    written: frozenset[str] = frozenset()  # the keywords the call itself writes (not those of a mapping it unpacks)


@dataclass(frozen=True)
class Sourced:
    """A file a shell script reads in (`source common.sh`, `. ./env.sh`): where the command is, the file as a
    report names it, and its text."""

    line: int
    column: int  # where `source` (or `.`) starts
    end_column: int  # just after it: a span without a value, which no flag fix edits
    name: str  # relative to the script's folder
    path: str
    text: str


# `with pytest.raises(ValueError):`, `with self.assertRaisesRegex(...)`: a test that a configuration is refused; a
# configuration built there never reaches a trainer
RAISE_EXPECTATIONS = frozenset({"raises", "assertRaises", "assertRaisesRegex", "assertRaisesRegexp"})


def skips_always(decorator: str) -> bool:
    """`@unittest.skip(...)`, `@pytest.mark.skip`, `@skip(...)` (the dotted name of a decorator, called or not): a
    test that never runs, so a configuration it builds trains nothing. skipIf / skipUnless / skipif are
    conditions the lint cannot settle: not these."""
    return decorator in ("skip", "unittest.skip", "pytest.mark.skip", "mark.skip")


@dataclass(frozen=True)
class ConfigClass:
    """A class deriving from a configuration class: its bases and the defaults its fields give."""

    name: str
    bases: tuple[str, ...]
    fields: Mapping[str, Setting]  # the keys given a default in the class body
    path: str
    # the keys its own `__init__` takes with a default and hands on (Unsloth's generated UnslothGRPOConfig): defaults
    # of a run that leaves them, not a setting of the class's own to judge where it is written
    passed: Mapping[str, Setting] = field(default_factory=dict)


@dataclass(frozen=True)
class Judged:
    """A configuration some flags select, where to report it, and the flags that decide it."""

    config: Config
    anchor: Setting  # the flag a user changes, unless `anchors` names another for a rule
    flags: str
    anchors: Mapping[str, Setting] = field(default_factory=dict)  # rule code -> its flag
    # rule code -> its help where another flag than the framework's usual one causes it (no flag fix then)
    helps: Mapping[str, str] = field(default_factory=dict)

    def where(self, rule: str) -> Setting:
        return self.anchors.get(rule, self.anchor)


def shown(key: str, value: str, setting: Setting | None) -> str:
    """`key=value` as a flag finding names a deciding key, with how it got its value: ` (default)` when left
    out, the name or option it was set to (`Setting.origin`) when that gave it."""
    how = " (default)" if setting is None else f" ({setting.origin})" if setting.origin else ""
    return f"{key}={value}{how}"


def steps_per_rollout(settings: Mapping[str, Setting], sizes: Mapping[str, str], repeats: float = 1.0) -> float:
    """The optimizer steps one rollout feeds: epochs x rollout batch / update batch, at least one per epoch;
    `sizes` maps those three keys, in that order, to the defaults of the keys left out, and `repeats` is how
    many more samples than the rollout batch counts the update batch splits. 1 when a value set is computed
    (a variable the script does not assign): it decides nothing."""
    epochs, rollout, update = (number(settings[key].value or "") if key in settings else number(default)
                               for key, default in sizes.items())
    if epochs is None or rollout is None or not update:
        return 1.0
    return epochs * max(rollout * repeats / update, 1.0)


def more_responses_per_micro_batch(option: str) -> str:
    """KL007's help where a token mean over a micro-batch of one response is per sequence (row 21)."""
    return f"several responses per micro-batch ({option}; a token mean over B responses is still biased, by about 1/B)"


def listed(settings: Mapping[str, Setting], defaults: Mapping[str, str]) -> str:
    """`, ppo_epochs=1 (default), train_batch_size=512`: keys by their last name, as set or defaulted."""
    return "".join(", " + shown(key.rsplit(".", 1)[-1], str(settings[key].value) if key in settings else default,
                                settings.get(key)) for key, default in defaults.items())


@functools.cache
def truthy(value: str) -> bool | None:
    """A YAML, Hydra or command-line boolean; None for anything else."""
    lowered = value.lower()
    return True if lowered in ("true", "1", "yes") else False if lowered in ("false", "0", "no") else None


def number(text: str) -> float | None:
    """A flag's numeric value; None for anything else."""
    try:
        return float(text)
    except ValueError:
        return None


def generation_spans_steps(steps: str | None, accumulation: str | None) -> bool:
    """Whether one generation, made every `steps` micro-steps (TRL's and ms-swift's steps_per_generation), serves
    micro-steps of more than one optimizer step of `accumulation` micro-steps (gradient_accumulation_steps): the
    later steps train on an older policy's samples. Unset or not a number, it decides nothing (False)."""
    every, window = number(steps or ""), number(accumulation or "")
    return every is not None and window is not None and every > 0 and window % every != 0


def yaml_loader() -> type:
    """libyaml's loader where PyYAML was built with it (several times faster), else the pure-Python
    one; PyYAML is imported here, by the first YAML file read, not by every lint run."""
    import yaml

    return getattr(yaml, "CSafeLoader", yaml.SafeLoader)

# `key=value` as a Hydra override in a shell command (`+key=value` and `++key=value` add keys); the value may be a
# reference escaped for an `eval` of the command (`key=\$NAME`)
_OVERRIDE = re.compile(r"(?<![\w.$-])\+{0,2}(?P<key>[A-Za-z_][\w]*(?:\.[A-Za-z_][\w]*)+)=(?P<value>\"[^\"\n]*\"|'[^'\n]*'|\$\{\w+\}"
                       r"|\\\$(?:\{\w+\}|\w+)|[^\s\\;|&)\"']+)")


# `name=value` shell variable assignments, whose `$name` / `${name}` an override may use (also a Dockerfile's
# `ENV name=value` and `ARG name=value`)
_VARIABLE = re.compile(r"^\s*(?:export\s+|ENV\s+|ARG\s+)?(?P<name>[A-Za-z_]\w*)=(?P<value>\$\(\((?:[^()\n]|\([^()\n]*\))*\)\)"
                       r"|\$\[[^\]\n]*\]|\"[^\"\n]*\"|'[^'\n]*'|[^\s;|&#]*)")
_REFERENCE = re.compile(r"^\$(?:\{(?P<braced>[A-Za-z_]\w*)\}|(?P<plain>[A-Za-z_]\w*))$")
# `ADV=${ADV:-gae}`: the environment's value, else the literal after `:-` (or `-`), the script's default; so is
# `ALGO=${1:-grpo}`, the script's first argument, else grpo: what it runs with when launched without arguments
_DEFAULTED = re.compile(r"^(?P<quote>\"?)\$\{(?P<name>[A-Za-z_]\w*|[1-9]):?[-=](?P<default>[^}$`\"'\s]+)\}(?P=quote)$")
# `PPO_MINI=${PPO_MINI:-$TRAIN_BATCH}`: a default that is another variable, assigned earlier in the script
_DEFAULTED_TO_VARIABLE = re.compile(r"^(?P<quote>\"?)\$\{(?P<name>[A-Za-z_]\w*|[1-9]):?[-=]\$(?:\{(?P<braced>[A-Za-z_]\w*)\}"
                                    r"|(?P<plain>[A-Za-z_]\w*))\}(?P=quote)$")
# `: "${KL_TYPE:=low_var_kl}"`: the no-op command `:` whose words assign each name its default unless the environment
# (or an earlier line) set it; one or more `${name:=default}` (or `${name=default}`) words after the colon
_COLON_DEFAULTS = re.compile(r"^\s*:(?:\s+\"?\$\{[A-Za-z_]\w*:?=[^}]*\}\"?)+\s*$")
_COLON_DEFAULT = re.compile(r"\$\{(?P<name>[A-Za-z_]\w*):?=(?P<default>[^}]*)\}")


# `$(( a * 2 ))`: shell integer arithmetic over literals and variables assigned earlier; also bash's older
# spelling of it, `$[ a * 2 ]` (Search-R1's launches and their forks: `train_batch_size=$[$n_gpus_per_node * 64]`)
_ARITHMETIC = re.compile(r"^\"?\$(?:\(\((?P<expression>[^()]*(?:\([^()]*\)[^()]*)*)\)\)|\[(?P<bracketed>[^\]]*)\])\"?$")
_NAME = re.compile(r"\$\{?([A-Za-z_]\w*)\}?|\b([A-Za-z_]\w*)\b")
_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
              ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod}


def _arithmetic(expression: str, variables: Mapping[str, Setting]) -> str | None:
    """The value of a shell arithmetic expression over non-negative integers, or None when a name in it
    is not a variable assigned an integer, or it uses an operator other than + - * / %."""
    def substituted(match: re.Match[str]) -> str:
        known = variables.get(match.group(1) or match.group(2))
        value = known.value if known is not None else None
        return value if value is not None and value.isdigit() else "?"

    python = _NAME.sub(substituted, expression).replace("/", "//").strip()
    try:
        tree = ast.parse(python, mode="eval").body
    except SyntaxError:
        return None

    def evaluate(node: ast.expr) -> int | None:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            left, right = evaluate(node.left), evaluate(node.right)
            if left is None or right is None or (right == 0 and type(node.op) in (ast.FloorDiv, ast.Mod)):
                return None
            return _OPERATORS[type(node.op)](left, right)
        return None

    result = evaluate(tree)
    return None if result is None else str(result)


def _literal(value: str) -> str | None:
    if "$" in value:
        return None
    try:
        parts = shlex.split(value)
    except ValueError:
        return None
    return parts[0] if len(parts) == 1 else None


def _code_of(line: str) -> str:
    """A shell line without its comment (a `#` that starts a word)."""
    if line.lstrip().startswith("#"):
        return ""
    comment = re.search(r"(?:^|\s)#", line)
    return line if comment is None else line[:comment.start()]


def _shell_lines(text: str, sourced: Mapping[int, Sourced] | None = None,
                 variables: Mapping[str, Setting] | None = None,
                 named: set[str] | None = None) -> Iterator[tuple[int, str, dict[str, Setting]]]:
    """(line number, code without comments, the shell variables assigned a literal so far) per line.

    `name=value` assignments (also `export`) are remembered with the position of the assignment,
    the line a user edits, so that a flag set to `$name` or `${name}` resolves to it; `name=${name:-v}`
    is read as its default v, what the script runs with unless the environment sets the name (`v` may be
    `$other`, a variable assigned before), so is `: "${name:=v}"` unless a line before assigned the name, and `name=$((a * 2))` as the value of the
    arithmetic when every name in it is known. A file the script sources (`sourced`, by line) assigns its
    names at the `source` line, each pointing there. `variables` and `named` (every name assigned, a literal
    or not; updated in place) are those of the lines before `text`, when it is itself sourced."""
    variables = dict(variables or {})
    named = set(variables) if named is None else named
    lines = text.splitlines()
    loops = _loops(lines)
    in_loops = {number for body in loops.values() for number in body}
    for number, line in enumerate(lines, start=1):
        code = _code_of(line)
        if _COLON_DEFAULTS.match(code):
            for default in _COLON_DEFAULT.finditer(code):
                name, value = default.group("name"), _literal(default.group("default"))
                if name not in named and value is not None:
                    variables[name] = Setting(value, number, default.start("name") + 1, default.end("default") + 1)
                named.add(name)
        assigned = _VARIABLE.match(code)
        if assigned is not None:
            named.add(assigned.group("name"))
            raw = assigned.group("value")
            defaulted, computed, to_variable = _DEFAULTED.match(raw), _ARITHMETIC.match(raw), _DEFAULTED_TO_VARIABLE.match(raw)
            value = (defaulted.group("default") if defaulted is not None
                     else _arithmetic(computed.group("expression") or computed.group("bracketed"), variables)
                     if computed is not None
                     else _default_variable(to_variable, variables) if to_variable is not None
                     else _literal(raw))
            if number in in_loops and _reads_itself(assigned):
                value = None  # counted up in a loop: the loop's end gives it its value (`_after_loop`)
            if value is not None:
                variables[assigned.group("name")] = Setting(value, number, assigned.start("name") + 1,
                                                            assigned.end() + 1)
        if number in loops:
            variables = _after_loop(lines, loops[number], variables)
        included = (sourced or {}).get(number)
        if included is not None:
            read = deque(_shell_lines(included.text, variables=variables, named=named), maxlen=1)
            after = read[0][2] if read else variables
            variables.update({name: _at_source(included, setting) for name, setting in after.items()
                              if variables.get(name) != setting})
        yield number, code, variables


# a loop's first line and its last (`while ...; do`, `for x in a b; do` ... `done`), a loop on shell arithmetic
# (`while [[ $(( (BATCH * N) % GPUS )) != 0 ]]; do`, `while (( BATCH < 8 )); do`), and an assignment of arithmetic
_LOOP = re.compile(r"^\s*(?:while|until|for)\b.*(?:;\s*do|\bdo)\s*$")
_DONE = re.compile(r"^\s*done\b")
_ARITHMETIC_WHILE = re.compile(r"^\s*while\s+(?:\[\[?\s*\$\(\((?P<tested>.+)\)\)\s*(?:!=|-ne)\s*0\s*\]\]?"
                               r"|\(\((?P<bare>.+)\)\))\s*;\s*do\s*$")
_MAX_ITERATIONS = 1024


def _loops(lines: list[str]) -> dict[int, range]:
    """{the line (1-based) of each outermost loop's `done`: the lines of its body}."""
    loops, depth, start = {}, 0, 0
    for number, line in enumerate(lines, start=1):
        code = _code_of(line)
        if _LOOP.match(code):
            depth, start = depth + 1, start if depth else number
        elif _DONE.match(code) and depth:
            depth -= 1
            if not depth:
                loops[number] = range(start + 1, number)
    return loops


def _reads_itself(assigned: re.Match[str]) -> bool:
    """`N=$((N + 1))`, `X="$X more"`: an assignment whose value reads the name it assigns."""
    name = re.escape(assigned.group("name"))
    return re.search(rf"\$\{{?{name}\b|\(\([^)]*\b{name}\b|\$\[[^\]]*\b{name}\b", assigned.group("value")) is not None


def _after_loop(lines: list[str], body: range, variables: Mapping[str, Setting]) -> dict[str, Setting]:
    """The shell variables after a loop (its `body`, the lines between its first line and its `done`): a `while`
    on arithmetic whose body only assigns arithmetic is run here (run_sw.sh raises TRAIN_BATCH_SIZE until the
    rollout splits evenly over the GPUs), for at most _MAX_ITERATIONS turns; else each name the body counts up
    (`_reads_itself`) is unknown after it, since the turns it takes are."""
    header = _ARITHMETIC_WHILE.match(_code_of(lines[body.start - 2]))
    codes = [code for number in body if (code := _code_of(lines[number - 1]).strip())]
    steps = [(found.group("name"), computed.group("expression") or computed.group("bracketed"))
             for code in codes if (found := _VARIABLE.match(code)) is not None and found.end() == len(code)
             and (computed := _ARITHMETIC.match(found.group("value"))) is not None]
    state = dict(variables)
    if header is not None and steps and len(steps) == len(codes):
        for _ in range(_MAX_ITERATIONS):
            tested = _arithmetic(header.group("tested") or header.group("bare"), state)
            if tested is None or tested == "0":
                break
            for name, expression in steps:
                value = _arithmetic(expression, state)
                state[name] = replace(state[name], value=value) if name in state else Setting(value, 0, 0, 0)
        else:
            tested = None
        if tested == "0":
            return state
    counted = {found.group("name") for code in codes if (found := _VARIABLE.match(code)) is not None
               and _reads_itself(found)}
    return {name: setting for name, setting in variables.items() if name not in counted}


def _default_variable(defaulted: re.Match[str], variables: Mapping[str, Setting]) -> str | None:
    """The value of the variable a `${name:-$other}` default names, where the script assigned it a literal before."""
    known = variables.get(defaulted.group("braced") or defaulted.group("plain"))
    return known.value if known is not None else None


def _at_source(included: Sourced, setting: Setting) -> Setting:
    """A setting read in a sourced file, placed at the script's `source` line, saying where in the file it is."""
    return Setting(setting.value, included.line, included.column, included.end_column,
                   setting.origin or f"{included.name}:{setting.line}")


def _value(raw: str, variables: Mapping[str, Setting], line: int, column: int, end_column: int) -> Setting:
    """The setting of a flag whose value is written `raw`: a literal, a variable assigned a literal
    earlier (the setting then points at the assignment), the default of `${name:-default}` where the
    script assigns no literal to `name` (what it runs with unless the environment sets the name), or
    unknown (None)."""
    unquoted = raw[1:-1] if len(raw) > 1 and raw[0] == raw[-1] == '"' else raw  # "$name" expands too
    reference = _REFERENCE.match(unquoted)
    if reference is not None:
        known = variables.get(reference.group("braced") or reference.group("plain"))
        if known is not None:
            return known
    defaulted = _DEFAULTED.match(raw)
    if defaulted is not None:
        return variables.get(defaulted.group("name")) or Setting(defaulted.group("default"), line, column, end_column)
    return Setting(_literal(raw), line, column, end_column)


def shell_assignment(text: str, name: str) -> str | None:
    """The value the shell script `text` last assigns `name` (`name=value`, `export name="value"`), unquoted and as
    written, its own variables unexpanded (`$(pwd)` stays); None where it assigns none. A quoted value may run over
    several lines (`ARGS="` and a word a line, each line ending in a backslash, up to the closing quote): its
    lines joined, without the backslashes."""
    found = None
    lines = text.splitlines()
    for number, line in enumerate(lines):
        assigned = _VARIABLE.match(_code_of(line))
        if assigned is not None and assigned.group("name") == name:
            value = assigned.group("value")
            if value[:1] in ("\"", "'") and (len(value) == 1 or value[-1] != value[0]):
                found = _quoted_lines(line[assigned.start("value") + 1:], lines[number + 1:], value[0])
            else:
                found = value[1:-1] if len(value) > 1 and value[0] == value[-1] and value[0] in "\"'" else value
    return found


# `python3 -m $PROGRAM_ENTRY \`: the module a launch runs, named by a variable, the rest of the line a continuation
_MODULE_VARIABLE = re.compile(r"(?<=-m[ \t])[ \t]*\$(?:\{(?P<braced>[A-Za-z_]\w*)\}|(?P<plain>[A-Za-z_]\w*))"
                              r"(?=[ \t]*\\?$)", re.MULTILINE)


def with_entry_modules(text: str) -> str:
    """A shell script `text` with the module a launch runs written out where a variable names it and the script
    assigns that variable a literal module (MIT-MI/MEM1: `export PROGRAM_ENTRY=verl.trainer.main_ppo` ... `python3
    -m $PROGRAM_ENTRY`, continued on the next line), so that the launch is read as one. Only a line that holds
    nothing after the module but its continuation changes: every position the rest of the script's settings are read
    at stays."""
    def module(found: re.Match[str]) -> str:
        value = shell_assignment(text, found.group("braced") or found.group("plain"))
        return f" {value}" if value is not None and re.fullmatch(r"[A-Za-z_]\w*(?:\.\w+)+", value) else found.group()
    return _MODULE_VARIABLE.sub(module, text) if "$" in text else text


def _quoted_lines(first: str, rest: list[str], quote: str) -> str | None:
    """The text of a quoted shell value that opens on a line whose remainder is `first` and closes on one of the
    lines `rest`, continuation backslashes dropped; None where it never closes."""
    held = [first]
    for line in rest:
        end = line.find(quote)
        if end >= 0:
            held.append(line[:end])
            return " ".join(part.rstrip().removesuffix("\\").strip() for part in held).strip()
        held.append(line)
    return None


def shell_value(text: str, raw: str) -> str | None:
    """The literal `raw` stands for in a shell script or Dockerfile `text`: itself, or the value its
    variable (`$name`, `${name}`) is assigned there (of `name=${name:-v}`, the default v); None if unknown."""
    variables: Mapping[str, Setting] = {}
    for _, _, assigned in _shell_lines(text):
        variables = assigned  # the assignments of the whole text, once every line is read
    return _value(raw, variables, 0, 0, 0).value


def computed_file_folder(text: str, raw: str) -> str | None:
    """The folder of a file a shell script `text` names by `raw` where only the file's own name is computed
    (`--config $CONFIG_FILE` after `CONFIG_FILE=recipes/$TASK.yaml`: recipes): the folder as the last assignment
    of the variable writes it; None where `raw` is no variable, or the folder is computed too."""
    reference = _REFERENCE.match(raw.strip('"'))
    if reference is None:
        return None
    name = reference.group("braced") or reference.group("plain")
    written = [assigned.group("value").strip("\"'") for line in text.splitlines()
               if (assigned := _VARIABLE.match(_code_of(line))) is not None and assigned.group("name") == name]
    if not written:
        return None
    folder = str(Path(written[-1]).parent)
    return None if "$" in folder or folder == "." else folder


def command_span(lines: list[str], index: int) -> tuple[int, int]:
    """(first, last) indices of the shell command that line `index` belongs to: the lines joined by
    trailing backslashes, or the elements of the bash array the line is in (`cmd=(`, one word a line, `)`),
    which the script then runs (`"${cmd[@]}"`)."""
    first = index
    while first > 0 and lines[first - 1].rstrip().endswith("\\"):
        first -= 1
    last = index
    while last + 1 < len(lines) and lines[last].rstrip().endswith("\\"):
        last += 1
    opening = first - 1
    while opening >= 0 and not _ARRAY_OPENS.match(lines[opening]) and _ARRAY_ELEMENT.match(lines[opening]) \
            and not _ARRAY_CLOSES.match(lines[opening]):
        opening -= 1  # up over the indented elements before the line, to the line that opens the array, if any
    if opening >= 0 and _ARRAY_OPENS.match(lines[opening]) and _ARRAY_ELEMENT.match(lines[first]):
        closing = next((i for i in range(last, len(lines)) if _ARRAY_CLOSES.match(lines[i])), None)
        if closing is not None and all(_ARRAY_ELEMENT.match(line) for line in lines[last + 1:closing]):
            return opening, closing
    return first, last


_ARRAY_OPENS = re.compile(r"\s*(?:local\s+|declare\s+-a\s+)?(?P<name>\w+)\+?=\(\s*(?:#.*)?$")  # `cmd=(` alone on its line
_ARRAY_CLOSES = re.compile(r"\s*\)\s*(?:#.*)?$")  # `)` alone on its line
_ARRAY_ELEMENT = re.compile(r"(?:\s+\S.*|\s*|\s*#.*)$")  # an indented word (or a blank or comment line) of the array


def _assigns(code: str) -> bool:
    """Whether a shell line assigns a variable (`name=value`, `: "${name:=value}"`)."""
    return bool(_VARIABLE.match(code) or _COLON_DEFAULTS.match(code))


def only_command(text: str, offset: int) -> str:
    """`text` with the lines of the command at character `offset`, the shell variable assignments and the
    elements of the bash arrays the command expands (`swift rlhf "${COMMON_ARGS[@]}"` after `COMMON_ARGS=(`, a
    word a line, `)`, and its `COMMON_ARGS+=(` additions) kept, every other line blank (positions stay): the flags
    of one launch of a script that runs several."""
    lines = text.splitlines()
    first, last = command_span(lines, text.count("\n", 0, offset))
    arrays = _array_lines(lines, set(_EXPANSION.findall("\n".join(lines[first:last + 1]))))
    return "\n".join(line if first <= index <= last or index in arrays or _assigns(_code_of(line)) else ""
                     for index, line in enumerate(lines)) + "\n"


def _array_lines(lines: list[str], names: Collection[str]) -> set[int]:
    """The indices of the lines of every assignment (`NAME=(` or `NAME+=(`, a word a line, `)`) of the bash arrays
    `names`."""
    inside: set[int] = set()
    for index, line in enumerate(lines):
        opened = _ARRAY_OPENS.match(line) if names else None
        if opened is not None and opened.group("name") in names:
            closing = next((i for i in range(index + 1, len(lines)) if _ARRAY_CLOSES.match(lines[i])), index)
            inside.update(range(index, closing + 1))
    return inside


def shell_overrides(text: str, sourced: Mapping[int, Sourced] | None = None) -> dict[str, Setting]:
    """Dotted `key=value` overrides anywhere in a script; the last one of a key wins, as in Hydra.
    A value that is a shell variable assigned a literal earlier (`kl_loss_type=k3` ... `...=${kl_loss_type}`)
    takes that literal, and the setting points at the assignment, the line a user edits. A file the script
    sources (`sourced`, by line) gives the overrides of its bash arrays the script expands (`"${ARGS[@]}"`),
    at the `source` line."""
    found: dict[str, Setting] = {}
    expanded = set(_EXPANSION.findall(text))
    before: Mapping[str, Setting] = {}
    lines = list(_shell_lines(text, sourced))
    last = lines[-1][2] if lines else {}
    for number, code, variables in lines:
        included = (sourced or {}).get(number)
        if included is not None:
            found.update({key: _at_source(included, setting)
                          for key, setting in _array_overrides(included.text, expanded, before).items()})
        found.update(_line_overrides(number, code, variables, last))
        before = dict(variables)
    return found


_EXPANSION = re.compile(r"\$\{(\w+)\[[@*]\]\}")  # `${ARGS[@]}`: the words of a bash array


def _array_overrides(text: str, arrays: Collection[str], variables: Mapping[str, Setting]) -> dict[str, Setting]:
    """The overrides of a sourced `text` that lie in the bash arrays named `arrays` (`ARGS=(`, a word a line,
    `)`), read with the variables of the lines before the `source` line."""
    lines = text.splitlines()
    inside: set[int] = set()  # line numbers within the arrays
    for index, line in enumerate(lines):
        opened = _ARRAY_OPENS.match(line)
        if opened is not None and opened.group("name") in arrays:
            closing = next((i for i in range(index + 1, len(lines)) if _ARRAY_CLOSES.match(lines[i])), index)
            inside.update(range(index + 2, closing + 1))
    found: dict[str, Setting] = {}
    for number, code, known in _shell_lines(text, variables=variables):
        if number in inside:
            found.update(_line_overrides(number, code, known))
    return found


def _line_overrides(number: int, code: str, variables: Mapping[str, Setting],
                    last: Mapping[str, Setting] | None = None) -> dict[str, Setting]:
    """The `key=value` overrides of one shell line, each value read with the variables assigned before it; a
    reference escaped for an `eval` of the command (`key=\\$NAME` in the words of an array the script later runs as
    `eval "${CMD[@]}"`), with those of the whole script (`last`), which the eval sees."""
    found = {}
    for match in _OVERRIDE.finditer(code):
        raw = match.group("value")
        escaped = raw.startswith("\\$")
        found[match.group("key")] = _value(raw[1:] if escaped else raw, last if escaped and last is not None else variables,
                                           number, match.start("key") + 1, match.end() + 1)
    return found


# A verl trainer module run from Python, an element of an argument list: `"-m", "verl.trainer.main_ppo"`
_PYTHON_LAUNCH = re.compile(r"[\"'](verl(?:\.\w+)+)[\"']")
# a Hydra override as a string element: `"algorithm.use_kl_in_reward=False"`, or an f-string whose value is computed
# (`f"data.train_batch_size={args.train_batch_size}"`, value unknown; a placeholder may quote, `{cfg['use_kl']}`)
_QUOTED_OVERRIDE = re.compile(r"(?P<f>\bf)?(?P<quote>[\"'])\+{0,2}(?P<key>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)="
                              r"(?P<value>(?:[^\"'\n{]|\{[^}\n]*\})*)(?P=quote)")
# a value that is one placeholder alone: `{args.lr}`, `{cfg['use_kl']}`
_ONE_PLACEHOLDER = re.compile(r"\{(?P<expression>[^{}]+)\}")


def listed_overrides(text: str, placeholder: Callable[[Setting, str], Setting] = lambda setting, expression: setting
                     ) -> list[dict[str, Setting]]:
    """The Hydra overrides of each verl launch a Python module builds as an argument list (`cmd = [sys.executable,
    "-m", "verl.trainer.main_ppo", "algorithm.adv_estimator=grpo", ...]`, then run by subprocess): the string
    elements from the module's name to the list's end (a line that closes it), one dict a launch. A literal value is
    kept; any other is unknown, and one that is a placeholder alone (`{cfg['use_kl']}`) is as `placeholder` makes
    that unknown setting, given the placeholder's expression."""
    lines, launches, index = text.splitlines(), [], 0
    while index < len(lines):
        if lines[index].lstrip().startswith("#") or not _PYTHON_LAUNCH.search(lines[index]):
            index += 1
            continue
        found: dict[str, Setting] = {}
        end = index
        while end < len(lines) and not (end > index and lines[end].strip()[:1] in ("]", ")")):
            code = lines[end] if not lines[end].lstrip().startswith("#") else ""
            for match in _QUOTED_OVERRIDE.finditer(code):
                value = match.group("value")
                computed = match.group("f") is not None and "{" in value
                setting = Setting(None if computed else _literal(value), end + 1, match.start("key") + 1,
                                  match.end("value") + 1)
                alone = _ONE_PLACEHOLDER.fullmatch(value) if computed else None
                found[match.group("key")] = placeholder(setting, alone.group("expression")) if alone else setting
            end += 1
        launches.append(found)
        index = end + 1
    return launches


# a shell command line's words: quoted parts kept together
SHELL_WORD = re.compile(r"(?:\"[^\"]*\"|'[^']*'|[^\s\"'])+")
# a command kept in a string variable, flag by flag: `CMD+=" --beta 0.04"`, `ARGS="--beta 0.04 --lr 1e-6"`
_APPENDED = re.compile(r"""^\s*\w+\+?=(["'])(?P<words>[^"'$`]*)\1\s*$""")
_BOOLEAN_WORDS = ("true", "false", "True", "False", "1", "0")


def cli_flags(text: str, names: Mapping[str, str], switches: Collection[str] = ()) -> dict[str, Setting]:
    """The `--name value`, `--name=value` and bare `--switch` options of `names` (a flag's spelling
    -> its key) anywhere in a script, bash arrays of arguments and strings a command is built in included
    (`CMD+=" --beta 0.04"`); the last one wins, as in
    argparse. A switch given alone is "True"; `--no_switch` (HfArgumentParser's form) is "False"."""
    found: dict[str, Setting] = {}
    for number, code, variables in _shell_lines(text):
        appended = _APPENDED.match(code)  # CMD+=" --beta 0.04": the flags a command string is built from
        words = list(SHELL_WORD.finditer(code, *appended.span("words")) if appended else SHELL_WORD.finditer(code))
        for index, word in enumerate(words):
            flag, equals, raw = word.group().partition("=")
            if not flag.startswith("--"):
                continue
            spelled, negated = flag[2:], False
            if spelled not in names and spelled.startswith("no_") and spelled[3:] in names:
                spelled, negated = spelled[3:], True
            key = names.get(spelled)
            if key is None:
                continue
            start, end = word.start() + 1, word.end() + 1
            if negated:
                found[key] = Setting("False", number, start, end)
                continue
            following = words[index + 1] if index + 1 < len(words) else None
            if not equals and following is not None and _takes(following.group(), key in switches):
                raw, end = following.group(), following.end() + 1
            elif not equals:
                found[key] = Setting("True" if key in switches else None, number, start, end)
                continue
            if raw.endswith("\\") and not code[end - 1:].strip():
                raw = raw[:-1]  # `--init_kl_coef ${init_kl_coef}\`: the line continues, the backslash is no part of it
            found[key] = _value(raw, variables, number, start, end)
    return found


def _takes(word: str, switch: bool) -> bool:
    """Whether the word after a flag is its value: a boolean for a switch, else any non-option."""
    if switch:
        return word in _BOOLEAN_WORDS
    return not word.startswith("-") or re.match(r"-\.?\d", word) is not None


def yaml_settings(text: str) -> dict[str, Setting]:
    """Every scalar of a YAML file under its dotted key path; {} for a file YAML cannot read (or
    nests past the YAML parser's recursion)."""
    import yaml

    found: dict[str, Setting] = {}
    try:
        documents = list(yaml.compose_all(text, Loader=yaml_loader()))
    except (yaml.YAMLError, RecursionError):
        return found
    for document in documents:
        # (dotted key path, a node below it or a (key, value) pair of a mapping)
        stack: list[tuple[str, yaml.Node | tuple[yaml.ScalarNode, yaml.Node]]] = [("", document)]
        while stack:
            prefix, node = stack.pop()
            if isinstance(node, yaml.MappingNode):
                for key, value in node.value:
                    if isinstance(key, yaml.ScalarNode):
                        stack.append((f"{prefix}.{key.value}" if prefix else str(key.value), (key, value)))
            elif isinstance(node, tuple):
                key, value = node
                if isinstance(value, yaml.ScalarNode):
                    literal = None if "${" in str(value.value) else str(value.value)
                    found[prefix] = Setting(literal, key.start_mark.line + 1, key.start_mark.column + 1,
                                            value.end_mark.column + 1)
                else:
                    stack.append((prefix, value))
    return found


# a Python script a shell command runs, by a path relative to where it runs (`python rl/grpo.py`, `torchrun train.py`)
# or below a variable naming the project's folder (`torchrun ${PR1_PATH}/src/open_r1/grpo_vllm.py`)
PYTHON_SCRIPT = re.compile(r"(?<![\w/.$-])(?:\$\{?[A-Za-z_]\w*\}?/)?((?:[\w.-]+/)*[\w-]+\.py)\b")


# a module a shell command runs by its dotted name (`python -m src.rl.train`, `torchrun --nproc_per_node=4 -m rl.grpo`)
PYTHON_MODULE = re.compile(r"(?<![\w.-])-m[ \t]+([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)(?![\w.-])")


def launched_scripts(launcher: str, text: str) -> Iterator[tuple[int, Path]]:
    """(offset of the command, the file) for each Python script of the project the shell script `text` at
    `launcher` runs: by its path (PYTHON_SCRIPT), or by its module's dotted name (`-m pkg.train` as pkg/train.py or
    pkg/train/__main__.py, also below the src/ folder of a src layout), from the launcher's folder or one above
    it, or from a folder the script changes to (`cd src/r1-v`), or below a variable naming a folder of the
    project (`_below_variable`). A module found nowhere in the project (`-m torch.distributed.run`, `-m pip`) is
    none of its scripts."""
    entered = [f"{folder}/" for folder in _ENTERED.findall(text)] if "cd" in text else []
    for match in PYTHON_SCRIPT.finditer(text) if ".py" in text else ():
        found = (project_path(launcher, f"{folder}{match.group(1)}") for folder in ("", *entered))
        if (script := next((path for path in found if path is not None), None)
                or _below_variable(launcher, text, match)) is not None:
            yield match.start(), script
    for match in PYTHON_MODULE.finditer(text) if "-m" in text else ():
        relative = match.group(1).replace(".", "/")
        found = (project_path(launcher, f"{folder}{relative}{tail}") for folder in ("", "src/", *entered)
                 for tail in (".py", "/__main__.py"))
        if (script := next((path for path in found if path is not None), None)) is not None:
            yield match.start(), script


# a folder of the project a shell script changes to, written as a relative literal (`cd src/r1-v`, `&& cd verl`)
_ENTERED = re.compile(r"(?:^|[;&|(])[ \t]*cd[ \t]+[\"']?((?:[\w-][\w.-]*)(?:/[\w-][\w.-]*)*)/?[\"']?[ \t]*(?=$|[;&|)#])",
                      re.MULTILINE)


def _below_variable(launcher: str, text: str, match: re.Match) -> Path | None:
    """The script of a PYTHON_SCRIPT `match` written below a variable the launcher assigns a path ending in folders
    of the project (`$code_dir/openrlhf/cli/train.py` after `code_dir=$work_dir/OpenRLHF`, or after
    `code_dir=/path/to/Project/OpenRLHF`): the script below the longest tail of that path's written folders, after
    its last variable, that holds it; None where no variable is written or no tail does."""
    written = re.search(r"\$\{?(\w+)\}?/$", text[match.start():match.start(1)])
    value = shell_assignment(text, written.group(1)) if written is not None else None
    if not value:
        return None
    parts = value.strip("/").split("/")
    folders = parts[next((index + 1 for index in range(len(parts) - 1, -1, -1) if "$" in parts[index]), 0):]
    if any(part in ("", ".", "..") or not re.fullmatch(r"[\w.-]+", part) for part in folders):
        return None
    tails = ("/".join([*folders[start:], match.group(1)]) for start in range(len(folders)))
    return next((script for tail in tails if (script := project_path(launcher, tail)) is not None), None)


def project_path(launcher: str, relative: str, folder: bool = False) -> Path | None:
    """The file (or `folder`) `relative` names, beside `launcher` or in one of the folders above it up to the
    repository's root (scripts are run from the root or from their own folder); None if not found."""
    here = Path(launcher).resolve().parent
    for base in (here, *here.parents):
        candidate = base / relative
        if candidate.is_dir() if folder else candidate.is_file():
            return candidate
        if (base / ".git").exists():
            return None
    return None
