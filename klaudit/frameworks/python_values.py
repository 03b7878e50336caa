"""Values read from Python's own tree of a module (`ast`): literals as klaudit.frameworks.calls reports them, the
module's constants (`BETA = 0.04`, and those it imports from a module of the project: `from config import
PPO_EPOCHS`), the literal entries of its dict constants (`GRPO["beta"]` of `GRPO = {"beta": 0.04}`), and integer
arithmetic on them (`PPO_BATCH_SIZE // PPO_MINI_BATCH`). klaudit.frameworks.cst_configs
reads the same from LibCST's tree where Python cannot parse a module, through these functions where it can."""

from __future__ import annotations

import ast
import io
import operator
import re
import tokenize
from collections import Counter
from collections.abc import Callable, Collection
from dataclasses import replace
from functools import partial
from pathlib import Path

from klaudit.frameworks.options import ENVIRONMENT_READS, Default, Options, environment_default, module_constants
from klaudit.lint.syntax import python_ast
from klaudit.text import read_text

_NEWLINE = re.compile(r"\r\n?|\n")  # line ends as Python's tokenizer and LibCST count them


_INTEGER_OPERATIONS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
                       ast.FloorDiv: operator.floordiv}


def integer_arithmetic_of_text(written: str, named: Callable[[str], Default | None]) -> Default | None:
    """`integer_arithmetic` of the expression text `written` (a keyword's value as LibCST's tree gives it)."""
    source = f"({written})"
    try:
        node = python_ast(source).body[0]
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    value = node.value if isinstance(node, ast.Expr) else None
    if not isinstance(value, ast.BinOp):
        return None
    return integer_arithmetic(value, named, partial(text_as_written, encoded_lines(source)))


def integer_arithmetic(node: ast.BinOp, named: Callable[[str], Default | None],
                        text: Callable[[ast.expr], str]) -> Default | None:
    """The value of integer arithmetic on literals and names whose values `named` gives (`PPO_BATCH_SIZE //
    PPO_MINI_BATCH` of two module constants), with where those come from; None for anything else."""
    origins: list[str] = []

    def value(part: ast.expr) -> int | None:
        if isinstance(part, ast.BinOp):
            operation = _INTEGER_OPERATIONS.get(type(part.op))
            left, right = value(part.left), value(part.right)
            if operation is None or left is None or right is None or (operation is operator.floordiv and right == 0):
                return None
            return int(operation(left, right))
        found = named(part.id) if isinstance(part, ast.Name) else None
        if found is not None:
            origins.append(found.origin)
        written = found.value if found is not None else python_literal(part, text)
        return int(written) if written is not None and re.fullmatch(r"-?\d+", written) else None

    result = value(node)
    if result is None:
        return None
    return Default(str(result), text(node) + (f" with {', '.join(origins)}" if origins else ""))


def encoded_lines(source: str) -> list[bytes]:
    """The lines of `source` in UTF-8, in which Python's tree gives its columns."""
    return [line.encode("utf-8") for line in _NEWLINE.split(source)]


def text_as_written(lines: list[bytes], node: ast.expr) -> str:
    """The text of `node` as written, from the module's `encoded_lines`."""
    first, last = node.lineno - 1, (node.end_lineno or node.lineno) - 1
    if first == last:
        return lines[first][node.col_offset:node.end_col_offset].decode("utf-8", errors="replace")
    parts = [lines[first][node.col_offset:], *lines[first + 1:last], lines[last][:node.end_col_offset]]
    return "\n".join(part.decode("utf-8", errors="replace") for part in parts)


def binds(node: ast.AST) -> str | None:
    """The name `node` binds: an assignment, loop, `with ... as`, walrus or `del` target, an `import ... as`
    or `except ... as` name (cst_configs._Assigned of LibCST's tree); None for anything else."""
    if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
        return node.id
    if isinstance(node, ast.alias):
        return node.asname or node.name.split(".")[0]
    return node.name if isinstance(node, ast.ExceptHandler) else None


_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)


def module_constants_of(tree: ast.Module, text: Callable[[ast.expr], str], options: Options, path: str,
                      seen: frozenset[str] = frozenset()) -> dict[str, Default]:
    """options.module_constants of the module at `path`: every binding outside functions and classes (the scopes of
    their own), with the literal of each `NAME = literal`, and of each name imported from a module of the project
    that binds it so (`from config import PPO_EPOCHS` beside a config.py of constants, or `config.PPO_EPOCHS` of
    `import config`; `seen`: the modules already on that chain of imports)."""
    assignments: list[tuple[str, str | None, int, str]] = []
    imported: dict[str, Default] = {}
    modules: dict[str, Default] = {}  # `config.BETA` of `import config`: the project module's constant
    entries: dict[str, dict[str, Default]] = {}  # `GRPO.beta` of `GRPO = {"beta": 0.04}`, by the dict's name
    readers = environment_readers(tree)

    def walk(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, _SCOPES):
                if not isinstance(child, ast.Lambda):
                    assignments.append((child.name, None, child.lineno, ""))
                continue
            if isinstance(child, ast.Import):  # `import config`, then `config.BETA`: the module's constants, dotted
                for alias in child.names:
                    if alias.asname is not None or "." not in alias.name:
                        given = imported_constants(alias.name, 0, path, options, seen)
                        modules.update({f"{alias.asname or alias.name}.{name}": found for name, found in given.items()})
            if isinstance(child, ast.ImportFrom):
                given = imported_constants(child.module, child.level, path, options, seen) \
                    if child.module is not None and all(alias.name != "*" for alias in child.names) else {}
                for alias in child.names:
                    name, found = alias.asname or alias.name, given.get(alias.name)
                    if found is not None:
                        imported[name] = found
                    entries[name] = {name + key[len(alias.name):]: value for key, value in given.items()
                                     if key.startswith(alias.name + ".")}
                    assignments.append((name, found.value if found is not None else None, child.lineno, ""))
                continue
            if isinstance(child, ast.stmt):
                target, value = assigned(child)
                if isinstance(target, ast.Name):
                    if value is not None:  # `BETA: float` alone binds nothing
                        variable, default = _environment_default(value, text, readers) \
                            or ("", python_literal(value, text))
                        assignments.append((target.id, default, child.lineno, variable))
                        entries[target.id] = dict_entries(target.id, value, text)
                        walk(value)
                    continue
            bound = binds(child)
            if bound:
                assignments.append((bound, None, getattr(child, "lineno", 0), ""))
            walk(child)

    walk(tree)
    rebound = {name for node in ast.walk(tree) if isinstance(node, ast.Global) for name in node.names}
    constants = module_constants(assignments, rebound, options.environment)
    bound = Counter(name for name, *_ in assignments)
    changed = rebound | _changed_in_place(tree)
    kept = {key: value for name, found in entries.items() if bound[name] == 1 and name not in changed
            for key, value in found.items()}
    return {**modules, **kept, **{name: imported.get(name, value) for name, value in constants.items()}}


def dict_entries(name: str, value: ast.expr, text: Callable[[ast.expr], str]) -> dict[str, Default]:
    """The literal entries of a dict literal bound to `name`, dotted as resolve reads a configuration's keys: `GRPO.beta`
    and `GRPO.lora.r` of `GRPO = {"beta": 0.04, "lora": {"r": 8}}`; none where a `**` spread may set any key."""
    if not isinstance(value, ast.Dict) or any(key is None for key in value.keys):
        return {}
    found = _alike_in_every_entry(name, value, text)
    for key, item in zip(value.keys, value.values):
        if not (isinstance(key, ast.Constant) and isinstance(key.value, str) and key.value.isidentifier()):
            continue
        dotted = f"{name}.{key.value}"
        found = {entry: default for entry, default in found.items()  # a repeated key: the last one counts
                 if entry != dotted and not entry.startswith(dotted + ".")}
        literal = python_literal(item, text)
        if literal is not None:
            found[dotted] = Default(literal, f"{name}[{key.value!r}] = {text(item)} at line {item.lineno}")
        else:
            found.update(dict_entries(dotted, item, text))
    return found


def _alike_in_every_entry(name: str, value: ast.Dict, text: Callable[[ast.expr], str]) -> dict[str, Default]:
    """`STAGES.*.beta` of a dict of dict literals that all give `beta` the same literal (`STAGES = {1: {"beta": 0.001,
    ...}, 2: {"beta": 0.001, ...}}`): what `STAGES[stage]["beta"]` reads whichever entry a run picks."""
    if len(value.values) < 2 or not all(isinstance(item, ast.Dict) for item in value.values):
        return {}
    first, *others = [dict_entries(f"{name}.*", item, text) for item in value.values]
    return {entry: replace(default, origin=default.origin.replace(".*[", "[...][") + ", alike in every entry")
            for entry, default in first.items()
            if all(entry in other and other[entry].value == default.value for other in others)}


_MUTATORS = frozenset({"update", "setdefault", "pop", "popitem", "clear", "__setitem__", "__delitem__"})


def _changed_in_place(tree: ast.Module) -> set[str]:
    """The names of the module whose mapping some statement changes in place (`GRPO["beta"] = 0.1`,
    `GRPO.update(...)`, `del GRPO["beta"]`), anywhere in the module: their literal entries are no constants."""
    changed = set()
    for node in ast.walk(tree):
        base = node.value if isinstance(node, ast.Subscript) and not isinstance(node.ctx, ast.Load) else \
            node.func.value if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
            and node.func.attr in _MUTATORS else None
        while isinstance(base, ast.Subscript):  # `GRPO["lora"]["r"] = 16`
            base = base.value
        if isinstance(base, ast.Name):
            changed.add(base.id)
    return changed


_IMPORT_ROOTS = 3  # how many folders above a script an absolute import of a project module is looked up in


def imported_constants(module: str, level: int, path: str, options: Options,
                       seen: frozenset[str] = frozenset()) -> dict[str, Default]:
    """The constants (`module_constants_of`) of the project's module that an import from `module` at relative `level`
    (`from config import ...` beside the module at `path`, or `from .config import ...`) reads, by name, each with
    the file and line that binds it; {} for a module outside the project, one not found, or one already on the
    chain `seen`."""
    target = project_module(module, level, path)
    source = read_text(target) if target is not None and str(target) not in seen else None
    if target is None or source is None:
        return {}
    try:
        tree = python_ast(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return {}
    constants = module_constants_of(tree, partial(text_as_written, encoded_lines(source)), options, str(target),
                                  seen | {str(Path(path).resolve()), str(target)})
    return {name: replace(value, origin=value.origin.replace(" at line ", f" at {target.name}:"))
            for name, value in constants.items()}


def project_module(module: str, level: int, path: str) -> Path | None:
    """The file of the project's module that an import from `module` at relative `level` reads, beside the module at
    `path` (`from config import ...`, `from .config import ...`); None where it is not found there."""
    if not path:
        return None
    folder = Path(path).resolve().parent
    for _ in range(max(level - 1, 0)):
        folder = folder.parent
    parts = module.split(".")
    # a script's neighbour, else (an absolute import run from a folder above) the nearest folder above that has it
    above = (folder, *folder.parents[:_IMPORT_ROOTS]) if level == 0 else (folder,)
    return next((place.joinpath(*parts).with_suffix(".py") for place in above
                 if place.joinpath(*parts).with_suffix(".py").is_file()), None)


def imported_dict_keys(tree: ast.Module, name: str, path: str) -> list[str] | None:
    """The keys of the dict literal a project module binds to `name` at its top level, where the module at `path`
    (`tree`) imports it (`from config import TRAINING_CONFIG`, then `GRPOConfig(**TRAINING_CONFIG)`): string keys
    only, no `**` spread, bound once and changed in place by neither module; None otherwise."""
    source_module = next((node for node in tree.body if isinstance(node, ast.ImportFrom) and node.module
                          and any((alias.asname or alias.name) == name and alias.name == name for alias in node.names)),
                         None)
    if source_module is None or name in _changed_in_place(tree) or _bindings(tree, name) != 1:
        return None
    target = project_module(source_module.module or "", source_module.level, path)
    text = read_text(target) if target is not None else None
    try:
        other = python_ast(text) if text is not None else None
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    if other is None or name in _changed_in_place(other) or _bindings(other, name) != 1:
        return None
    values = [value for target, value in map(assigned, other.body) if isinstance(target, ast.Name) and target.id == name]
    value = values[0] if len(values) == 1 else None
    if not isinstance(value, ast.Dict):
        return None
    keys = [key.value for key in value.keys if isinstance(key, ast.Constant) and isinstance(key.value, str)]
    return keys if len(keys) == len(value.keys) else None


def _bindings(tree: ast.Module, name: str) -> int:
    """How many times the module binds `name`, anywhere (its functions' own bindings of it included)."""
    return sum(binds(node) == name for node in ast.walk(tree))


def _environment_default(node: ast.expr, text: Callable[[ast.expr], str],
                         readers: Collection[str] = ()) -> tuple[str, str] | None:
    """options.environment_default of a value: `os.environ.get("BETA", 0.04)`, bare or converted by `float(...)`."""
    return environment_default(nested_calls(node, text, readers))


def nested_calls(node: ast.expr, text: Callable[[ast.expr], str],
                 readers: Collection[str] = ()) -> list[tuple[str, list[str | None]]]:
    """The calls a value nests, from the outside in (at most two), as options.environment_default takes them; a call
    of one of the module's `environment_readers` as the `os.getenv` it makes."""
    calls: list[tuple[str, list[str | None]]] = []
    current: ast.expr | None = node
    while isinstance(current, ast.Call) and not current.keywords and len(calls) < 2:
        called = dotted_chain(current.func)
        calls.append(("os.getenv" if called in readers else called,
                      [python_literal(argument, text) for argument in current.args]))
        current = current.args[0] if len(current.args) == 1 else None
    return calls


def environment_readers(tree: ast.Module) -> frozenset[str]:
    """The module's functions that read an environment variable with a fallback, `def env_float(name, default):`
    whose body reads `os.getenv(name)` (or `os.environ.get(name)`, `os.environ[name]`) and may return `default`: a
    call `env_float("GRPO_BETA", 0.05)` reads as `os.getenv("GRPO_BETA", 0.05)` does."""
    found = set()
    for function in tree.body:
        if not isinstance(function, ast.FunctionDef) or len(function.args.args) < 2:
            continue
        variable, fallback = (argument.arg for argument in function.args.args[:2])
        reads = any(isinstance(node, ast.Call) and dotted_chain(node.func) in ENVIRONMENT_READS and node.args
                    and isinstance(node.args[0], ast.Name) and node.args[0].id == variable
                    or isinstance(node, ast.Subscript) and dotted_chain(node.value) in ("os.environ", "environ")
                    and isinstance(node.slice, ast.Name) and node.slice.id == variable for node in ast.walk(function))
        falls_back = any(isinstance(node, ast.Return) and node.value is not None and any(
            isinstance(part, ast.Name) and part.id == fallback for part in ast.walk(node.value)) for node in ast.walk(function))
        if reads and falls_back:
            found.add(function.name)
    return frozenset(found)


def assigned(statement: ast.stmt) -> tuple[ast.expr | None, ast.expr | None]:
    """(target, value) of `name: T = value` or of a one-target `name = value`; (None, None) otherwise."""
    if isinstance(statement, ast.AnnAssign):
        return statement.target, statement.value
    if isinstance(statement, ast.Assign) and len(statement.targets) == 1:
        return statement.targets[0], statement.value
    return None, None


def dotted_chain(node: ast.expr) -> str:
    """`self.args.beta` of that chain of names (cst_configs._chain of LibCST's tree); "" for anything else."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = dotted_chain(node.value)
        return f"{base}.{node.attr}" if base else ""
    return ""


def python_literal(node: ast.expr, text: Callable[[ast.expr], str]) -> str | None:
    """`cst_configs._literal` of the LibCST node for the same text: a string of one literal (implicitly joined
    strings and f-strings are computed), a number as written without underscores, True/False/None,
    or a negated literal."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = python_literal(node.operand, text)
        return None if inner is None else "-" + inner
    if not isinstance(node, ast.Constant) or node.value is Ellipsis or isinstance(node.value, complex):
        return None
    written = text(node)
    if isinstance(node.value, (str, bytes)):
        strings = [t for t in tokenize.generate_tokens(io.StringIO(f"({written})").readline) if t.type == tokenize.STRING]
        return str(node.value) if len(strings) == 1 else None
    if isinstance(node.value, bool) or node.value is None:
        return str(node.value)
    return written.replace("_", "")
