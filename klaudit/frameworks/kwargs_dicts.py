"""The keywords a configuration call takes from a dict the code builds before it: `GRPOConfig(**kwargs)`
after `kwargs = {"beta": config.beta, ...}`, `kwargs.update({...})` and `kwargs["loss_type"] = ...`
(the twelfth fresh set's KG_GRPO builds its GRPOConfig so, to drop what an older TRL rejects).

Read from Python's tree, in the order of the source, up to the call: assignments of a dict display with
string keys (or `dict(key=value, ...)`, or a conditional expression choosing between two of them), then
updates and item stores. A key set twice (in two branches, say) is unknown, the others stay known; a dict
bound to displays more than once (`extra = {}`, then `extra = {"loss_type": ...}` in a branch) has each key
any of them sets, with an unknown value, and no other. A dict a function of the module returns (`dtype,
kwargs = precision()`, each return a display there) has the keys its returns set. An update with another
dict the scope builds (`kwargs.update(optional)`) takes that dict's entries. Anything else that could change
the dict before the call (an assignment of what is not a display, `pop`, `del`, `|=`, passing it to a
function other than a reader such as `set` or `print`) leaves it unknown. Unpacked filtered to the fields the
configuration class takes (`**{k: v for k, v in kwargs.items() if k in accepted}`), the dict keeps its
entries. The code is never run.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Entry:
    """One key of the dict: its value as written (None: set more than once), and the node that spans it
    (where a finding goes)."""

    key: str
    value: ast.expr | None
    span: ast.AST
    if_taken: bool = False  # filtered to the keys the configuration class takes: kept where the running release does


_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)
_READS = frozenset({"get", "items", "keys", "values", "copy"})  # methods that leave the dict as it is
# functions that read a dict passed to them and leave it as it is: `set(kwargs) - accepted`, `json.dumps(kwargs)`
_READERS = frozenset({"len", "set", "frozenset", "list", "tuple", "sorted", "dict", "str", "repr", "print", "dumps",
                      "pformat", "pprint"})


def built_dict(scope: ast.AST, name: str, call: ast.AST,
               functions: Mapping[str, ast.FunctionDef] | None = None) -> list[Entry] | None:
    """The entries of the dict `scope` (a function, or the module) binds to `name` when `call` runs; None
    when the dict is not known there. `functions`: the module's functions by name, whose returned dicts
    a binding `kwargs = helper()` (or `dtype, kwargs = helper()`) takes."""
    entries: dict[str, Entry] = {}
    ever: dict[str, Entry] = {}  # every key any assignment or update sets
    assigned = 0
    for node in sorted(_before(scope, call), key=_start):

        def other(dict_name: str, at: ast.AST = node) -> list[Entry] | None:
            return built_dict(scope, dict_name, at, functions) if dict_name != name else None

        found = _change(node, name, other, functions or {})
        if found is None:
            continue
        if found is _UNKNOWN:
            return None
        initial, added = found
        if initial:
            assigned += 1
            entries = {}
        for entry in added:
            twice = entry.key in entries and not initial
            entries[entry.key] = Entry(entry.key, None, entry.span) if twice else entry
            ever.setdefault(entry.key, entry)
    if assigned > 1:  # bound in branches, say: each key some binding sets may be there, with any of its values
        return [Entry(entry.key, None, entry.span) for entry in ever.values()]
    return list(entries.values()) if assigned == 1 else None


_UNKNOWN = object()


def unpacked(scope: ast.AST, mapping: ast.expr, call: ast.Call, config: str,
             functions: Mapping[str, ast.FunctionDef] | None = None, module: ast.Module | None = None
             ) -> list[Entry] | None:
    """The entries `**mapping` gives the call of the configuration class `config`: a dict the scope builds (or,
    in a function that binds no such name, one the `module` builds: module_dict), or one filtered to the keys the
    class accepts, `{k: v for k, v in kwargs.items() if k in accepted}` with `accepted` its fields
    (`dataclasses.fields(GRPOConfig)`, `inspect.signature(GRPOConfig)`), which keeps every key the release running
    it takes, also by a helper that takes only keywords and returns them so filtered (`**_cfg(beta=args.beta, ...)`:
    `_keyword_filter`); or a display written in the call (`**({"vllm_mode": m} if use_vllm else {})`); None when
    not known."""
    if isinstance(mapping, ast.Name):
        found = built_dict(scope, mapping.id, call, functions)
        if found is None and module is not None and scope is not module and not _binds(scope, mapping.id):
            return module_dict(module, mapping.id, functions)
        return found
    if isinstance(mapping, ast.Call) and (helper := _keyword_filter(mapping, scope, functions or {})) is not None:
        return helper
    if isinstance(mapping, (ast.Dict, ast.IfExp, ast.Call)):
        return _display(mapping)
    filtered = _key_filtered(mapping)
    if filtered is None or not isinstance(filtered[1], ast.Name) or not _fields_of(scope, filtered[1].id, call, config):
        return None
    built = built_dict(scope, filtered[0], call, functions)
    return None if built is None else [replace(entry, if_taken=True) for entry in built]


def _keyword_filter(call: ast.Call, scope: ast.AST, functions: Mapping[str, ast.FunctionDef]) -> list[Entry] | None:
    """The keywords of `call` (`_cfg(beta=args.beta, kl_coef=args.beta)`) where it calls a function, defined in
    `scope` or among the module's `functions`, that takes only `**kwargs` and returns them, as they are or filtered by
    key (`{k: v for k, v in kwargs.items() if k in supported}`, boradorish/text-to-json's guard against keywords an
    older TRL rejects): each keyword the call writes, which the release that runs it takes; None otherwise."""
    if not isinstance(call.func, ast.Name) or any(keyword.arg is None for keyword in call.keywords) or call.args:
        return None
    local = [node for node in ast.walk(scope) if isinstance(node, ast.FunctionDef) and node.name == call.func.id]
    function = local[0] if len(local) == 1 else functions.get(call.func.id) if not local else None
    if function is None or function.args.kwarg is None or function.args.vararg is not None \
            or function.args.posonlyargs or function.args.args or function.args.kwonlyargs:
        return None
    kwargs = function.args.kwarg.arg
    assigned = [(target.id, node.value) for node in ast.walk(function) if isinstance(node, ast.Assign)
                for target in node.targets if isinstance(target, ast.Name)]
    once = {name: value for name, value in assigned if [n for n, _ in assigned].count(name) == 1}
    returns = _returns(function)
    if not returns or not all(_filtered_by_key(once.get(value.id) if isinstance(value, ast.Name) and value.id != kwargs
                                               else value, kwargs) for value in returns):
        return None
    return [Entry(str(keyword.arg), keyword.value, keyword, if_taken=True) for keyword in call.keywords]


def _filtered_by_key(value: ast.expr | None, kwargs: str) -> bool:
    """Whether `value` is the dict `kwargs` itself, or `{k: v for k, v in kwargs.items() if k in ...}`."""
    if isinstance(value, ast.Name):
        return value.id == kwargs
    filtered = _key_filtered(value)
    return filtered is not None and filtered[0] == kwargs


def _key_filtered(value: ast.expr | None) -> tuple[str, ast.expr] | None:
    """(the dict's name, the keys it is filtered to) of `{k: v for k, v in source.items() if k in keys}`; None for
    any other expression."""
    if not isinstance(value, ast.DictComp) or len(value.generators) != 1:
        return None
    loop = value.generators[0]
    key, item = loop.target.elts if isinstance(loop.target, ast.Tuple) and len(loop.target.elts) == 2 else (None, None)
    source = loop.iter.func.value if isinstance(loop.iter, ast.Call) and isinstance(loop.iter.func, ast.Attribute) \
        and loop.iter.func.attr == "items" and not loop.iter.args else None
    test = loop.ifs[0] if len(loop.ifs) == 1 and not loop.is_async else None
    if not (isinstance(key, ast.Name) and isinstance(item, ast.Name) and isinstance(source, ast.Name)
            and _is(value.key, key.id) and _is(value.value, item.id) and isinstance(test, ast.Compare)
            and _is(test.left, key.id) and len(test.ops) == 1 and isinstance(test.ops[0], ast.In)):
        return None
    return source.id, test.comparators[0]


def module_dict(module: ast.Module, name: str, functions: Mapping[str, ast.FunctionDef] | None = None
                ) -> list[Entry] | None:
    """The entries of the dict the module's own code binds to `name` (`GRPO_CONFIG = {"beta": 0.01, ...}` at the top
    of a script), as a function reads it when it runs, after that code; None where a function or class of the
    module may change it (an item store, an update, a call it is handed to) or binds the name itself."""
    for scope in ast.walk(module):
        if isinstance(scope, _SCOPES) and any(_change(node, name, lambda other: None, functions or {}) is not None
                                              for node in ast.walk(scope)):
            return None
    return built_dict(module, name, _END_OF_MODULE, functions)


_END_OF_MODULE = ast.Pass(lineno=1 << 30, col_offset=0)  # a position after every statement


def _binds(scope: ast.AST, name: str) -> bool:
    """Whether a function binds `name` itself: a parameter, an assignment or loop target, a `global` statement."""
    return any(isinstance(node, ast.Name) and node.id == name and not isinstance(node.ctx, ast.Load)
               or isinstance(node, ast.arg) and node.arg == name
               or isinstance(node, (ast.Global, ast.Nonlocal)) and name in node.names for node in ast.walk(scope))


def _fields_of(scope: ast.AST, name: str, call: ast.AST, config: str) -> bool:
    """Whether `scope` binds `name`, once before `call`, to the names of `config`'s fields or parameters:
    an expression calling `fields(...)` or `signature(...)` of the class."""
    bindings = [node.value for node in _before(scope, call) if isinstance(node, ast.Assign)
                and any(_is(target, name) for target in node.targets)]
    if len(bindings) != 1:
        return False
    return any(isinstance(node, ast.Call) and last_name(node.func) in ("fields", "signature")
               and any(_is(inner, config) for argument in node.args for inner in ast.walk(argument))
               for node in ast.walk(bindings[0]))


def last_name(node: ast.expr) -> str:
    """`GRPOConfig` of `trl.GRPOConfig`; "" for anything else."""
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""


def _change(node: ast.AST, name: str, other: Callable[[str], list[Entry] | None],
            functions: Mapping[str, ast.FunctionDef]):
    """How `node` changes the dict `name`: None (it does not), _UNKNOWN, or (whether it is the dict's
    assignment, the entries it sets); `other` gives the entries of another dict of the scope."""
    if isinstance(node, (ast.Assign, ast.AnnAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        for target in targets:
            if isinstance(target, ast.Name) and target.id == name:
                if node.value is None or len(targets) != 1:
                    return _UNKNOWN
                entries = _display(node.value)
                if entries is None:
                    entries = _returned(node.value, None, functions)
                return _UNKNOWN if entries is None else (True, entries)
            if isinstance(target, (ast.Tuple, ast.List)) and any(_is(element, name) for element in target.elts):
                index = next(i for i, element in enumerate(target.elts) if _is(element, name))
                entries = (_returned(node.value, index, functions)
                           if node.value is not None and len(targets) == 1 else None)
                return _UNKNOWN if entries is None else (True, entries)
            if _item_of(target, name) and len(targets) == 1 and node.value is not None:
                key = target.slice  # type: ignore[attr-defined]
                if isinstance(key, ast.Constant) and isinstance(key.value, str):
                    return False, [Entry(key.value, node.value, node)]
                return _UNKNOWN
        return None
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and _is(node.func.value, name):
        if node.func.attr in _READS:
            return None
        if node.func.attr == "update" and len(node.args) <= 1:
            argument = node.args[0] if node.args else None
            given = ([] if argument is None else other(argument.id) if isinstance(argument, ast.Name)
                     else _display(argument))
            named = [Entry(k.arg, k.value, k) for k in node.keywords if k.arg is not None]
            if given is None or len(named) < len(node.keywords):
                return _UNKNOWN
            return False, [*given, *named]
        return _UNKNOWN
    if isinstance(node, (ast.AugAssign, ast.Delete)):
        targets = [node.target] if isinstance(node, ast.AugAssign) else node.targets
        return _UNKNOWN if any(_is(t, name) or _item_of(t, name) for t in targets) else None
    if isinstance(node, ast.Call) and last_name(node.func) not in _READERS:  # another function may change it
        arguments = [*node.args, *(keyword.value for keyword in node.keywords if keyword.arg is not None)]
        return _UNKNOWN if any(_is(argument, name) for argument in arguments) else None
    return None


def _display(node: ast.expr) -> list[Entry] | None:
    """The entries of `{"beta": 0.04, ...}` or `dict(beta=0.04, ...)`, or of a choice between two of them
    (`{} if args.no_vllm else {"use_vllm": True}`), where a key only one side sets, or that the sides set to
    different values, is unknown; None for anything else."""
    if isinstance(node, ast.IfExp):
        return _either(_display(node.body), _display(node.orelse))
    if isinstance(node, ast.Dict):
        keys = [key.value if isinstance(key, ast.Constant) and isinstance(key.value, str) else None for key in node.keys]
        if None in keys:
            return None  # `**other` or a computed key
        return [Entry(str(key), value, _Span(written, value))  # type: ignore[arg-type]
                for key, written, value in zip(keys, node.keys, node.values)]
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "dict" and not node.args:
        if any(keyword.arg is None for keyword in node.keywords):
            return None
        return [Entry(keyword.arg, keyword.value, keyword) for keyword in node.keywords]  # type: ignore[arg-type]
    return None


def _either(first: list[Entry] | None, second: list[Entry] | None) -> list[Entry] | None:
    """The entries of a dict that is one of two: a key keeps its value where both give it the same one."""
    if first is None or second is None:
        return None
    others = {entry.key: entry for entry in second}
    merged: dict[str, Entry] = {}
    for entry in first:
        other = others.pop(entry.key, None)
        same = other is not None and None not in (entry.value, other.value) and \
            ast.dump(entry.value) == ast.dump(other.value)  # type: ignore[arg-type]
        merged[entry.key] = entry if same else Entry(entry.key, None, entry.span)
    merged.update({key: Entry(key, None, entry.span) for key, entry in others.items()})
    return list(merged.values())


def _returned(value: ast.expr, index: int | None, functions: Mapping[str, ast.FunctionDef]) -> list[Entry] | None:
    """The entries of the dict `helper()` returns (`index`: the item of the tuple it returns), where `value`
    calls a function of the module whose every return gives a dict display there: each key any return sets,
    with its value where all returns give it the same constant; None otherwise."""
    if not (isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id in functions):
        return None
    merged: list[Entry] | None = None
    for returned in _returns(functions[value.func.id]):
        if index is not None:
            items = returned.elts if isinstance(returned, ast.Tuple) else []
            returned = items[index] if index < len(items) and not any(isinstance(i, ast.Starred) for i in items) \
                else None
        entries = None if returned is None else _display(returned)
        if entries is None:
            return None
        constants = [entry if isinstance(entry.value, ast.Constant) else Entry(entry.key, None, entry.span)
                     for entry in entries]  # a name there is the function's own, not the caller's
        merged = constants if merged is None else _either(merged, constants)
    return merged


def _returns(function: ast.FunctionDef) -> list[ast.expr | None]:
    """What each `return` of `function` (not of the functions it defines) gives, in the order of the source;
    None for a bare one."""
    found: list[ast.Return] = []
    stack: list[ast.AST] = list(function.body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Return):
            found.append(node)
        elif not isinstance(node, _SCOPES):
            stack.extend(ast.iter_child_nodes(node))
    return [node.value for node in sorted(found, key=_start)]


class _Span(ast.AST):
    """From a dict display's key to the end of its value: `"beta": config.beta`."""

    def __init__(self, key: ast.expr, value: ast.expr) -> None:
        super().__init__()
        self.lineno, self.col_offset = key.lineno, key.col_offset
        self.end_lineno, self.end_col_offset = value.end_lineno, value.end_col_offset


def _is(node: ast.AST, name: str) -> bool:
    return isinstance(node, ast.Name) and node.id == name


def _item_of(node: ast.AST, name: str) -> bool:
    return isinstance(node, ast.Subscript) and _is(node.value, name)


def _start(node: ast.AST) -> tuple[int, int]:
    """Where a node starts; (0, 0) for the nodes without a position (operators, contexts)."""
    return getattr(node, "lineno", 0), getattr(node, "col_offset", 0)


def _before(scope: ast.AST, until: ast.AST) -> Iterator[ast.AST]:
    """The nodes of `scope`'s own body (not of the functions and classes it defines) that start before
    `until`, apart from `until` and what it holds."""
    end = _start(until)
    stack = list(ast.iter_child_nodes(scope))
    while stack:
        node = stack.pop()
        if node is until or isinstance(node, _SCOPES) or _start(node) >= end:
            continue
        if hasattr(node, "lineno"):
            yield node
        stack.extend(ast.iter_child_nodes(node))
