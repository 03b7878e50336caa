"""The configuration keys a Hydra trainer module reads, as attributes, on every run before it trains.

verl's `main_ppo` reads `config.trainer.nnodes`, `config.actor_rollout_ref.model.path` and more on its way to
`trainer.fit()`. OmegaConf (2.1 on, which Hydra 1.1 on requires) raises ConfigAttributeError for an attribute a
DictConfig lacks, so where a fork's module reads a key only its own YAML has (RL-Factory's
`config.actor_rollout_ref.env`, s3's `config.output_context_dir`), every launch of a config without it stops before
the first step.

Counted: the statements that run whatever the config says, in order: the top level (and `with` blocks) of the
`@hydra.main` function's body and of the module's functions and methods it hands the config to (`run_ppo(config)`,
`main_task.remote(config)`, `runner.run.remote(config)`), up to the first call of a `fit`. Not counted: a read in a
branch, loop, `try`, lambda or the right side of `and`/`or`; a method called on the config (`config.trainer.get(...)`
reads `trainer` only); anything after the config is rebound or written (`config.x = ...`, `open_dict`,
`OmegaConf.update`).
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from pathlib import Path

from klaudit.frameworks.python_values import dotted_chain
from klaudit.text import file_text

Read = tuple[str, int]  # a dotted key below the config's root, and the line that reads it
_OPENS = frozenset({"open_dict", "read_write"})
_MERGES = frozenset({"OmegaConf.update", "OmegaConf.merge", "OmegaConf.unsafe_merge", "OmegaConf.set_struct"})
_UNCONDITIONAL = (ast.Expr, ast.Assign, ast.AnnAssign, ast.AugAssign, ast.Return, ast.Assert)


@functools.lru_cache(maxsize=32)  # asked for each launch of a project's trainer module
def reads_before_training(main: Path) -> tuple[Read, ...]:
    """The keys the `@hydra.main` function of the module file `main`, and the functions it hands the config to, read
    on every run before a `fit` call; () where the module has no such function or is not Python this reads."""
    try:
        tree = ast.parse(file_text(main))
    except (OSError, SyntaxError, ValueError, RecursionError):
        return ()
    entry = next((node for node in tree.body if isinstance(node, ast.FunctionDef) and _hydra_main(node)), None)
    if entry is None or not entry.args.args:
        return ()
    reads: list[Read] = []
    _Walk(tree, reads).function(entry, entry.args.args[0].arg)
    return tuple(reads)


def _hydra_main(func: ast.FunctionDef) -> bool:
    return any(isinstance(decorator, ast.Call) and dotted_chain(decorator.func) in ("hydra.main", "main")
               for decorator in func.decorator_list)


class _Walk:
    """One walk of a module from its entry function, in the order its statements run."""

    def __init__(self, tree: ast.Module, reads: list[Read]) -> None:
        self.reads = reads
        self.functions: dict[str, list[tuple[ast.FunctionDef, bool]]] = {}  # name -> (def, is a method)
        for node in tree.body:
            if isinstance(node, ast.FunctionDef):
                self.functions.setdefault(node.name, []).append((node, False))
            elif isinstance(node, ast.ClassDef):
                for method in node.body:
                    if isinstance(method, ast.FunctionDef):
                        self.functions.setdefault(method.name, []).append((method, True))
        self.seen: set[int] = set()

    def function(self, func: ast.FunctionDef, config: str) -> bool | None:
        """Record the reads of `func`, whose parameter `config` holds the config; `block`'s outcome."""
        if id(func) in self.seen:
            return None
        self.seen.add(id(func))
        return self.block(func.body, config)

    def block(self, body: list[ast.stmt], config: str) -> bool | None:
        """True: training started; False: the config was rebound or written (stop); None: go on."""
        for stmt in body:
            if isinstance(stmt, (ast.With, ast.AsyncWith)):
                if any(_writes(item.context_expr) for item in stmt.items):
                    return False
                outcome = self.block(stmt.body, config)
                if outcome is not None:
                    return outcome
                continue
            if not isinstance(stmt, _UNCONDITIONAL):
                if _calls_fit(stmt):
                    return True
                continue
            if _rebinds(stmt, config) or any(_writes(node) for node in ast.walk(stmt)):
                return False
            parents = {id(child): parent for parent in ast.walk(stmt) for child in ast.iter_child_nodes(parent)}
            for node in _unconditional_nodes(stmt):
                if isinstance(node, ast.Attribute) and _root(node) == config:
                    key = _key(node, parents.get(id(node)))
                    if key:
                        self.reads.append((key, node.lineno))
            for callee, parameter in self._handed(stmt, config):
                outcome = self.function(callee, parameter)
                if outcome is not None:
                    return outcome
            if _calls_fit(stmt):
                return True
        return None

    def _handed(self, stmt: ast.stmt, config: str) -> Iterator[tuple[ast.FunctionDef, str]]:
        """The module's functions a call in `stmt` hands the config to, with the parameter that takes it."""
        for node in _unconditional_nodes(stmt):
            if not isinstance(node, ast.Call):
                continue
            position = next((index for index, arg in enumerate(node.args)
                             if isinstance(arg, ast.Name) and arg.id == config), None)
            keyword = next((kw.arg for kw in node.keywords if isinstance(kw.value, ast.Name) and kw.value.id == config),
                           None)
            if position is None and keyword is None:
                continue
            for callee, method in self.functions.get(_called_name(node.func), []):
                names = [arg.arg for arg in callee.args.args][1 if method else 0:]
                if keyword is not None and keyword in names:
                    yield callee, keyword
                elif position is not None and position < len(names):
                    yield callee, names[position]


def _called_name(func: ast.expr) -> str:
    """`run_ppo` of `run_ppo(...)`, `main_task` of `main_task.remote(...)`, `run` of `runner.run.remote(...)`."""
    if isinstance(func, ast.Attribute) and func.attr == "remote":
        func = func.value
    if isinstance(func, ast.Attribute):
        return func.attr
    return func.id if isinstance(func, ast.Name) else ""


def _unconditional_nodes(stmt: ast.stmt) -> Iterator[ast.AST]:
    """The nodes of a simple statement that run whenever it does: not a lambda's body, not the branches of a
    conditional expression, not the operands after the first of `and`/`or`."""
    stack: list[ast.AST] = [stmt]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, ast.Lambda):
            continue
        if isinstance(node, ast.IfExp):
            stack.append(node.test)
        elif isinstance(node, ast.BoolOp):
            stack.append(node.values[0])
        else:
            stack.extend(ast.iter_child_nodes(node))


def _root(node: ast.expr) -> str:
    """`config` of `config.trainer.nnodes`; "" for a chain not rooted at a name."""
    return dotted_chain(node).split(".")[0]


def _key(node: ast.Attribute, parent: ast.AST | None) -> str:
    """The dotted key an attribute chain reads, only for the outermost attribute of a chain (`parent` is the node
    holding it): `a.b` of `config.a.b.get(...)`, whose last attribute is a method called on the value."""
    if isinstance(parent, ast.Attribute) or isinstance(node.ctx, (ast.Store, ast.Del)):
        return ""
    names = dotted_chain(node).split(".")[1:]
    if isinstance(parent, ast.Call) and parent.func is node:
        names = names[:-1]
    return ".".join(names)


def _rebinds(stmt: ast.stmt, config: str) -> bool:
    """Whether `stmt` assigns the config's name, or a key of it (`config.trainer.x = ...`)."""
    targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target] if isinstance(
        stmt, (ast.AnnAssign, ast.AugAssign)) else []
    for target in targets:
        for node in ast.walk(target):
            if isinstance(node, ast.Name) and node.id == config and isinstance(node.ctx, ast.Store):
                return True
            if isinstance(node, (ast.Attribute, ast.Subscript)) and isinstance(node.ctx, ast.Store) \
                    and _root(node if isinstance(node, ast.Attribute) else node.value) == config:
                return True
    return False


def _writes(node: ast.AST) -> bool:
    """A call that opens the config for writing or merges into it (`open_dict(config)`, `OmegaConf.update(...)`)."""
    if not isinstance(node, ast.Call):
        return False
    called = dotted_chain(node.func)
    return called.rsplit(".", 1)[-1] in _OPENS or called in _MERGES


def _calls_fit(stmt: ast.stmt) -> bool:
    return any(isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "fit"
               for node in ast.walk(stmt))
