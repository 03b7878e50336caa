"""Framework configuration objects built in Python (`GRPOConfig(beta=0.04, ...)`, or a class deriving
from it with `beta: float = 0.04`): their keywords and field defaults as settings, with the position of
each, read from the module's syntax tree (the code is never run).

They are read from Python's own tree (`ast`, already parsed for the syntax check): LibCST's
positions would regenerate the whole module's code, which costs more than parsing it (half the lint
of TRL's grpo_trainer.py). LibCST's tree is read only where Python cannot read the text (newer syntax)."""

from __future__ import annotations

import ast
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING

from klaudit.frameworks.kwargs_dicts import Entry, last_name, unpacked
from klaudit.frameworks.options import (
    OPTION_DECLARATIONS,
    Default,
    Options,
    bindings,
    click_parameter,
    configuration_read,
    defaulted,
    local_read,
    resolve,
    visible,
)
from klaudit.frameworks.python_values import (
    assigned,
    binds,
    dotted_chain,
    encoded_lines,
    environment_readers,
    imported_dict_keys,
    integer_arithmetic,
    module_constants_of,
    nested_calls,
    python_literal,
    text_as_written,
)
from klaudit.frameworks.settings import RAISE_EXPECTATIONS, ConfigCall, ConfigClass, Setting, skips_always
from klaudit.lint.syntax import python_ast

if TYPE_CHECKING:
    import libcst as cst


def read_configs(source: str, class_names: Iterable[str], keys: Iterable[str], path: str = "",
                 module: cst.Module | None = None,
                 options: Options | None = None) -> tuple[list[ConfigCall], list[ConfigClass]]:
    """The calls of the classes named in `class_names` and the classes deriving from them (or
    redefining them) in `source` (`module`: its LibCST tree, if already parsed). After `**kwargs` every
    key of `keys` not given by name is unknown (a Setting with value None). A keyword set to a parameter
    of the enclosing function or to an option of the project's (`options`) has its default
    (klaudit.frameworks.options)."""
    names, keys, options = frozenset(class_names), tuple(keys), options or Options()
    found = _python_configs(source, names, keys, path, options)
    if found is not None:
        return found
    from klaudit.frameworks.cst_configs import libcst_configs  # rarely needed: LibCST's positions cost an import

    return libcst_configs(source, names, keys, path, module, options)


def _python_configs(source: str, names: Collection[str], keys: tuple[str, ...], path: str,
                    options: Options | None = None) -> tuple[list[ConfigCall], list[ConfigClass]] | None:
    """What `cst_configs.libcst_configs` finds, read from Python's tree of `source`; None when Python cannot read it.
    Python counts columns in UTF-8 bytes and normalises identifiers (NFKC), LibCST counts characters
    and keeps the text: both are converted to LibCST's terms."""
    try:
        tree = python_ast(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    lines = encoded_lines(source)
    text = partial(text_as_written, lines)
    readers = environment_readers(tree)

    def column(line: int, offset: int) -> int:  # 1-based, in characters
        return len(lines[line - 1][:offset].decode("utf-8", errors="replace")) + 1

    def setting(node: ast.expr | ast.stmt | ast.keyword | ast.arg, value: str | None, name_length: int) -> Setting:
        start = column(node.lineno, node.col_offset)
        end = (column(node.lineno, node.end_col_offset or 0) if node.end_lineno == node.lineno
               else start + name_length)
        return Setting(value, node.lineno, start, end)

    def value_setting(span: ast.AST, key: str, written: ast.expr | None, parameters: Mapping[str, Default],
                      aliases: Mapping[str, tuple[str, bool]]) -> Setting:
        """The setting of `key` given the value `written` (None: unknown) at `span`."""
        value = None if written is None else python_literal(written, text)
        default = None
        if value is None and isinstance(written, (ast.Name, ast.Attribute, ast.Subscript)):
            default = resolve(_configuration_key(written, aliases, parameters), parameters, options or Options(), path)
        elif value is None and isinstance(written, ast.Call):  # `PPOConfig(ppo_epochs=cfg.get("ppo_epochs", 4))`
            nested = nested_calls(written, text, readers)
            read = configuration_read(key, nested, written.lineno)
            if read is not None and read.holder in aliases:  # `t = self.cfg.training`, then `t.get("beta", 0.04)`
                read = replace(read, holder=aliases[read.holder][0])
            default = (options or Options()).read(read, path) if read is not None else \
                (options or Options()).environment_read(nested, written.lineno)
        elif value is None and isinstance(written, ast.BinOp):  # `num_mini_batches=PPO_BATCH_SIZE // PPO_MINI_BATCH`
            default = integer_arithmetic(written, lambda name: resolve(name, parameters, options or Options(), path),
                                          text)
        found = setting(span, value if default is None else default.value, len(key))  # type: ignore[arg-type]
        branches = [python_literal(branch, text) for branch in (written.body, written.orelse)] \
            if isinstance(written, ast.IfExp) else []
        if branches and all(branch is not None for branch in branches):  # `beta=1e-5 if peft_config else 0.001`
            found = replace(found, branches=tuple(branch for branch in branches if branch is not None))
        return defaulted(found, default)

    def scope_of(call: ast.Call) -> ast.AST:
        """The innermost function holding `call`, else the module."""
        holding = [node for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                   and node.lineno <= call.lineno <= (node.end_lineno or node.lineno)]
        return max(holding, key=lambda node: node.lineno, default=tree)

    functions: list[tuple[int, int, dict[str, Default | None]]] | None = None  # read at the first keyword set to a name
    constants: dict[str, Default] = {}
    calls, definitions = [], []  # definitions: ((line, column), class)
    helpers = {statement.name: statement for statement in tree.body if isinstance(statement, ast.FunctionDef)}
    refused = _expected_to_raise(tree) + _skipped_tests(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = _called_name(node.func, names, text)
            if name is None or any(first <= node.lineno <= last for first, last in refused):
                continue
            splats = [keyword.value for keyword in node.keywords if keyword.arg is None]
            built = _splatted(splats, partial(_unpacked, tree, path, scope_of(node), call=node, config=name,
                                              functions=helpers))
            named = [(keyword, keyword.arg, _left_alone(keyword.value, scope_of(node)))
                     for keyword in node.keywords if keyword.arg is not None]
            given = [*((entry.span, entry.key, entry.value) for entry in built or ()), *named]
            parameters: Mapping[str, Default] = {}
            aliases: Mapping[str, tuple[str, bool]] = {}
            if any(isinstance(value, (ast.Name, ast.Attribute, ast.Subscript, ast.Call, ast.BinOp)) for _, _, value in given):
                if functions is None:
                    functions = _function_parameters(tree, text, options or Options())
                    constants = module_constants_of(tree, text, options or Options(), path)
                parameters = _enclosing(constants, functions, node.lineno)
                aliases = _aliases(scope_of(node))
            settings = {key: value_setting(span, key, value, parameters, aliases) for span, key, value in given}
            settings.update({entry.key: replace(settings[entry.key], if_taken=True) for entry in built or ()
                             if entry.if_taken and entry.key not in {key for _, key, _ in named}})
            where = setting(node.func, None, len(name))
            if splats and built is None:  # any key not named may come from the mapping
                unknown = Setting(None, where.line, where.column, where.column)
                settings = {**{key: unknown for key in keys}, **settings}
            calls.append(ConfigCall(name, where, settings, frozenset(key for _, key, _ in named)))
        elif isinstance(node, ast.ClassDef):
            bases = tuple(last_name(base) for base in node.bases)
            if node.name not in names and not set(bases) & set(names):
                continue
            fields: dict[str, Setting] = {}
            for statement in node.body:
                target, value = assigned(statement)
                if isinstance(target, ast.Name) and target.id in keys and value is not None:
                    fields[target.id] = setting(statement, _python_default(value, text), len(target.id))
            passed = {parameter.arg: setting(parameter, _python_default(value, text), len(parameter.arg))
                      for parameter, value in _init_defaults(node) if parameter.arg in keys}
            definitions.append(((node.lineno, node.col_offset), ConfigClass(node.name, bases, fields, path, passed)))
    # in the order of the source, as LibCST visits them
    return (sorted(calls, key=lambda call: (call.where.line, call.where.column)),
            [definition for _, definition in sorted(definitions, key=lambda pair: pair[0])])


def _unpacked(tree: ast.Module, path: str, scope: ast.AST, mapping: ast.expr, call: ast.Call, config: str,
              functions: Mapping[str, ast.FunctionDef]) -> list[Entry] | None:
    """kwargs_dicts.unpacked, and a dict literal another module of the project binds and this one imports
    (`from config import TRAINING_CONFIG`, then `GRPOConfig(**TRAINING_CONFIG)`): each of its keys read as
    `TRAINING_CONFIG["key"]`, the module's imported constant (a literal, else unknown), at the unpacking."""
    found = unpacked(scope, mapping, call, config, functions, tree)
    if found is not None or not isinstance(mapping, ast.Name):
        return found
    keys = imported_dict_keys(tree, mapping.id, path)
    if keys is None:
        return None
    return [Entry(key, ast.copy_location(ast.Subscript(ast.Name(mapping.id, ast.Load()), ast.Constant(key), ast.Load()),
                                          mapping), mapping) for key in keys]


def _splatted(splats: list[ast.expr], unpacked: Callable[[ast.expr], list[Entry] | None]) -> list[Entry] | None:
    """The entries `GRPOConfig(**shared, **extra)` takes from the mappings it unpacks (`unpacked` gives one's);
    a key two of them may set is unknown; None when any of them is not known."""
    entries: dict[str, Entry] = {}
    for splat in splats:
        given = unpacked(splat)
        if given is None:
            return None
        for entry in given:
            entries[entry.key] = Entry(entry.key, None, entry.span) if entry.key in entries else entry
    return list(entries.values())


def _expected_to_raise(tree: ast.Module) -> list[tuple[int, int]]:
    """(first line, last line) of the body of each `with pytest.raises(...)` or `with self.assertRaises(...)`."""
    return [(node.body[0].lineno, node.end_lineno or node.lineno) for node in ast.walk(tree)
            if isinstance(node, (ast.With, ast.AsyncWith)) and any(
                isinstance(item.context_expr, ast.Call) and last_name(item.context_expr.func) in RAISE_EXPECTATIONS
                for item in node.items)]


def _skipped_tests(tree: ast.Module) -> list[tuple[int, int]]:
    """(first line, last line) of each function decorated to be skipped always (settings.skips_always)."""
    return [(node.lineno, node.end_lineno or node.lineno) for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(
                skips_always(dotted_chain(decorator.func if isinstance(decorator, ast.Call) else decorator))
                for decorator in node.decorator_list)]


def _function_parameters(tree: ast.Module, text: Callable[[ast.expr], str],
                         options: Options) -> list[tuple[int, int, dict[str, Default | None]]]:
    """(first line, last line, the names it binds) of each function: a parameter's literal default, None
    for a name its body assigns or a parameter without one (options.bindings)."""
    found, readers = [], environment_readers(tree)
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        arguments = node.args
        every = (*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs,
                 *(a for a in (arguments.vararg, arguments.kwarg) if a is not None))
        defaults = {**dict.fromkeys(argument.arg for argument in every),
                    **{argument.arg: _parameter_default(default, text) for argument, default in _defaulted(node)}}
        defaults.update((name, value) for name, value in _click_defaults(node, text).items()
                        if name in defaults and defaults[name] is None)
        bound = Counter(name for statement in node.body for inner in ast.walk(statement) if (name := binds(inner)))
        found.append((node.lineno, node.end_lineno or node.lineno, bindings(defaults, bound, _reads(node, bound, text, options, readers))))
    return found


def _reads(function: ast.FunctionDef | ast.AsyncFunctionDef, bound: Counter[str], text: Callable[[ast.expr], str],
           options: Options, readers: frozenset[str]) -> dict[str, Default]:
    """options.local_read of each name the function binds once, to `cfg.get("key", literal)` or an environment read."""
    reads = {}
    for statement in function.body:
        for inner in ast.walk(statement):
            if not isinstance(inner, ast.stmt):
                continue
            target, value = assigned(inner)
            if isinstance(target, ast.Name) and bound[target.id] == 1 and value is not None:
                read = local_read(target.id, nested_calls(value, text, readers), inner.lineno, options)
                if read is not None:
                    reads[target.id] = read
    return reads


def _enclosing(constants: Mapping[str, Default], functions: list[tuple[int, int, dict[str, Default | None]]],
               line: int) -> dict[str, Default]:
    """The values a call at `line` sees: the parameter defaults of the functions whose lines hold it, the
    inner ones' names hiding the outer ones', over the module's `constants`."""
    holding = sorted((function for function in functions if function[0] <= line <= function[1]),
                     key=lambda function: function[0])
    return visible([constants, *(function[2] for function in holding)])


def _configuration_path(node: ast.expr, aliases: Mapping[str, tuple[str, bool]]) -> tuple[str, bool]:
    """(`cfg.grpo.kl_coef`, whether a string key is part of it) of `cfg["grpo"]["kl_coef"]`, of `cfg.grpo.kl_coef`,
    of `cfg.get("grpo", {})["kl_coef"]`, or of `g["kl_coef"]` where the scope binds `g = cfg["grpo"]` once (`aliases`): a chain of names, attributes and
    string keys, dotted as klaudit.frameworks.options.resolve reads it, any other key as `*` (`STAGES.*.beta` of
    `STAGES[stage]["beta"]`); ("", False) for anything else."""
    if isinstance(node, ast.Name):
        return aliases.get(node.id, (node.id, False))
    if isinstance(node, ast.Attribute):
        key, keyed = node.attr, False
    elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str) \
            and node.slice.value.isidentifier():
        key, keyed = node.slice.value, True
    elif (section := _section_read(node)) is not None:
        key, keyed, node = section[0], True, section[1]
    elif isinstance(node, ast.Subscript) and isinstance(node.slice, (ast.Name, ast.Attribute, ast.Constant)):
        key, keyed = "*", True  # `STAGES[stage]`: any entry, read where every entry agrees (python_values.dict_entries)
    else:
        return "", False
    base, keyed_below = _configuration_path(node.value, aliases)
    return (f"{base}.{key}", keyed or keyed_below) if base else ("", False)


def _section_read(node: ast.expr) -> tuple[str, ast.Attribute] | None:
    """(`training`, the `cfg.get` attribute) of `cfg.get("training", {})`, a section read as `cfg["training"]` is,
    where its default is an empty mapping or none."""
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute) or node.func.attr != "get" \
            or node.keywords or not 1 <= len(node.args) <= 2:
        return None
    key, *default = node.args
    empty = not default or isinstance(default[0], ast.Dict) and not default[0].keys \
        or isinstance(default[0], ast.Constant) and default[0].value is None
    if not (isinstance(key, ast.Constant) and isinstance(key.value, str) and key.value.isidentifier() and empty):
        return None
    return key.value, node.func


def _configuration_key(node: ast.expr, aliases: Mapping[str, tuple[str, bool]], names: Mapping[str, Default]) -> str:
    """The path `resolve` looks a keyword's value up by: a chain with a string key only where it is nested below
    its root's first key (`cfg["grpo"]["kl_coef"]`, a YAML section's key), since `d["beta"]` of any dict is no
    option of the project's, or where it names an entry of a dict literal the module binds (`GRPO["beta"]`, in
    `names`)."""
    path, keyed = _configuration_path(node, aliases)
    return "" if keyed and path.removeprefix("self.").count(".") < 2 and path not in names else path


def _aliases(scope: ast.AST) -> dict[str, tuple[str, bool]]:
    """The names `scope` binds once, each to a section of a configuration (`g = cfg["grpo"]`, `t = cfg.training`,
    or `beta = beta or GRPO["beta"]` of a parameter that defaults to None: `_left_alone`), with its path (`_configuration_path`),
    in the order they are bound."""
    statements = sorted((node for node in ast.walk(scope) if isinstance(node, (ast.Assign, ast.AnnAssign))),
                        key=lambda node: (node.lineno, node.col_offset))
    bound = Counter(name for node in ast.walk(scope) if (name := binds(node)))
    found: dict[str, tuple[str, bool]] = {}
    for statement in statements:
        target, value = assigned(statement)
        value = _left_alone(value, scope) if value is not None else None
        if isinstance(target, ast.Name) and bound[target.id] == 1 and value is not None \
                and "." in (section := _configuration_path(value, found))[0]:
            found[target.id] = section
    return found


def _left_alone(value: ast.expr, scope: ast.AST) -> ast.expr:
    """What `value` reads where the parameter of `scope` it falls back from defaults to None and is left so:
    `beta or GRPO["beta"]`, `beta if beta is not None else cfg.beta` and `cfg.beta if beta is None else beta` read
    the fallback; any other value, itself."""
    if isinstance(value, ast.BoolOp) and isinstance(value.op, ast.Or) and len(value.values) == 2 \
            and isinstance(value.values[0], ast.Name) and _none_by_default(scope, value.values[0].id):
        return value.values[1]
    if isinstance(value, ast.IfExp) and isinstance(test := value.test, ast.Compare) and len(test.ops) == 1 \
            and isinstance(test.left, ast.Name) and _none_by_default(scope, test.left.id) \
            and isinstance(test.comparators[0], ast.Constant) and test.comparators[0].value is None:
        fallback = {ast.IsNot: value.orelse, ast.Is: value.body}.get(type(test.ops[0]))
        tested = {ast.IsNot: value.body, ast.Is: value.orelse}.get(type(test.ops[0]))
        if fallback is not None and isinstance(tested, ast.Name) and tested.id == test.left.id:
            return fallback
    return value


def _none_by_default(scope: ast.AST, name: str) -> bool:
    """Whether `name` is a parameter of the function `scope` whose default is None."""
    return isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(
        argument.arg == name and isinstance(default, ast.Constant) and default.value is None
        for argument, default in _defaulted(scope))


def _defaulted(function: ast.FunctionDef | ast.AsyncFunctionDef) -> list[tuple[ast.arg, ast.expr]]:
    """(parameter, its default) of each parameter of `function` that has one, positional and keyword-only."""
    arguments = function.args
    positional = [*arguments.posonlyargs, *arguments.args]
    return [(argument, default) for argument, default in
            (*zip(positional[len(positional) - len(arguments.defaults):], arguments.defaults),
             *zip(arguments.kwonlyargs, arguments.kw_defaults)) if default is not None]


def _python_default(node: ast.expr, text: Callable[[ast.expr], str]) -> str | None:
    """`cst_configs._field_default` of the same text: `0.04` or `field(default=0.04, ...)`; None when computed."""
    if isinstance(node, ast.Call) and last_name(node.func) == "field":
        default = next((keyword.value for keyword in node.keywords if keyword.arg == "default"), None)
        return None if default is None else python_literal(default, text)
    return python_literal(node, text)


def _parameter_default(node: ast.expr, text: Callable[[ast.expr], str]) -> str | None:
    """`cst_configs._parameter_default` of the same text: `0.04`, or the default a typer option declares in its place
    (`beta: float = typer.Option(0.04, help=...)`); None when computed or required (`typer.Option(...)`)."""
    if isinstance(node, ast.Call) and last_name(node.func) in OPTION_DECLARATIONS:
        default = node.args[0] if node.args else next(
            (keyword.value for keyword in node.keywords if keyword.arg == "default"), None)
        return None if default is None else python_literal(default, text)
    return python_literal(node, text)


def _click_defaults(function: ast.FunctionDef | ast.AsyncFunctionDef, text: Callable[[ast.expr], str]) -> dict[str, str | None]:
    """{parameter: its literal default, or None} of the options a function's click decorators declare
    (`@click.option("-k", "--kl-coef", default=0.04)` gives kl_coef 0.04: options.click_parameter)."""
    found: dict[str, str | None] = {}
    for decorator in function.decorator_list:
        if not isinstance(decorator, ast.Call) or last_name(decorator.func) != "option":
            continue
        name = click_parameter([argument.value for argument in decorator.args
                                if isinstance(argument, ast.Constant) and isinstance(argument.value, str)])
        default = next((keyword.value for keyword in decorator.keywords if keyword.arg == "default"), None)
        if name is not None:
            found[name] = None if default is None else python_literal(default, text)
    return found


def _called_name(func: ast.expr, names: Collection[str], text: Callable[[ast.expr], str]) -> str | None:
    """The name of `names` a call's target ends in (`GRPOConfig` of `trl.GRPOConfig`), as written."""
    name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
    if name is None or name not in names:
        return None
    return name if text(func).endswith(name) else None  # an identifier Python normalised: not this name



def _init_defaults(node: ast.ClassDef) -> list[tuple[ast.arg, ast.expr]]:
    """The keyword parameters of a configuration class's own `__init__` with their defaults (Unsloth's generated
    UnslothGRPOConfig takes every field so, `beta = 0.04`, and hands it to GRPOConfig's)."""
    init = next((item for item in node.body if isinstance(item, ast.FunctionDef) and item.name == "__init__"), None)
    if init is None:
        return []
    positional = init.args.posonlyargs + init.args.args
    pairs = list(zip(positional[len(positional) - len(init.args.defaults):], init.args.defaults))
    pairs += [(arg, default) for arg, default in zip(init.args.kwonlyargs, init.args.kw_defaults) if default is not None]
    return pairs
