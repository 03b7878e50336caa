"""A KL term computed inline in a training step, cut out as a function check-grad can audit alone.

The lint finds the statement that forms the estimator and the loss or reward it reaches
(`klaudit.lint.query.inline_sites`). `slice_site` keeps, from the step's own code, the statements from
the log-probs to the KL variable's last assignment before that sink: the estimator, the later
assignments of the KL variable (an importance weight), and, going back, every assignment they read
that is computed from values of the step alone. A name whose value comes from outside (a model call,
a method of `self`, the step's own arguments such as `inputs[...]`) becomes a parameter, which must
bind by its name (`per_token_logps`, `ref_per_token_logps`, `mask` ...). `self.a.b` read as a value is
a KL coefficient (1.0) or a switch: a parameter `b` audited at each string it is compared with, or
both ways for a flag. The step's file is never imported: the function's source, with the module's
import statements it needs, is audited as a file of its own, and the report names the original lines.
"""

from __future__ import annotations

import ast
import builtins
import copy
import re
from dataclasses import dataclass
from pathlib import Path

from klaudit.audit.bind import role_from_name
from klaudit.lint.query import package_of, returned_sign
from klaudit.lint.roles import is_coefficient_name, names_settings, sink_of_name

_Function = ast.FunctionDef | ast.AsyncFunctionDef


@dataclass(frozen=True)
class InlineSlice:
    """The source of a standalone function `name` computing the KL term of `qualname` in `path`, from
    line `first` to line `last`, the placement its sink gives it and the line `origin` of its estimator."""

    path: str
    qualname: str
    first: int
    last: int
    name: str
    source: str
    placement: str
    origin: int = 0

    def __str__(self) -> str:
        return f"{self.path}:{self.first}-{self.last} (inline KL of {self.qualname})"


class SliceError(ValueError):
    """Why an inline KL term cannot be cut out; one line."""


def inline_slices(path: str) -> tuple[list[InlineSlice], list[str]]:
    """The inline KL terms of `path` as functions, and one line for each that cannot be cut out."""
    from klaudit.lint.query import inline_sites

    return slices_of(path, inline_sites(path))


def slices_of(path: str, sites) -> tuple[list[InlineSlice], list[str]]:
    """The given inline sites of `path` (klaudit.lint.query.InlineSite) as functions: one per estimator
    statement, ending before its first sink; and one line for each that cannot be cut out."""
    grouped: dict[tuple[str, int], tuple[int, int, set]] = {}
    for site in sites:
        key = (site.qualname, site.origin_line)
        entry = min(line for line in (site.entry_line, site.sink_line) if line)
        first_sink, first_entry, placements = grouped.get(key, (site.sink_line, entry, set()))
        grouped[key] = (min(first_sink, site.sink_line), min(first_entry, entry), placements | {site.placement})
    if not grouped:
        return [], []
    tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    slices, failures = [], []
    for (qualname, origin_line), (sink_line, entry_line, placements) in grouped.items():
        placement = "loss" if any(p.startswith("loss") for p in placements) else "reward"
        try:
            slices.append(slice_site(tree, path, qualname, origin_line, sink_line, placement, entry_line))
        except SliceError as error:
            failures.append(f"{path}::{qualname}: the KL term formed at line {origin_line} cannot be cut out "
                            f"of it: {error}")
    return slices, failures


def slice_site(tree: ast.Module, path: str, qualname: str, origin_line: int, sink_line: int,
               placement: str, entry_line: int = 0) -> InlineSlice:
    """The standalone function of one inline KL term (SliceError when a value cannot be bound); `entry_line`:
    where the term enters the sink's value (the sink's line by default)."""
    function = _function(tree, qualname)
    outside = _parameters(function)
    step_switches = _switch_parameters(function)
    outside -= set(step_switches)  # a switch of the step is one of the slice (`k2_mode == "theta_over_ref"`)
    function = _StateAliases(function).visit(_KeyedInputs(outside).visit(copy.deepcopy(function)))
    statements = [s for s in _simple_statements(function.body) if not _renames_itself(s)]
    origin = next((s for s in statements if s.lineno == origin_line), None)
    if origin is None or len(_assigned(origin)) != 1:
        raise SliceError(f"line {origin_line} does not assign one variable")
    (variable,) = _assigned(origin)
    branches = _branches(function.body)
    # the KL variable's later assignments, up to where the term flows into another value on its way to the
    # sink (after that, `kl_loss = kl_loss.detach()` for the logs changes nothing the sink received)
    flows_on = next((s.lineno for s in statements if s.lineno > origin_line and s.lineno >= (entry_line or sink_line)
                     and variable in _reads(s, function) and variable not in _assigned(s)), sink_line)
    kept = [origin] + [s for s in statements if origin_line < s.lineno < min(sink_line, flows_on)
                       and variable in _assigned(s) and not _exclusive(branches, origin, s)]
    resolved: set[str] = {variable}
    defined_before = returned_at = origin_line
    sink = next((s for s in statements if s.lineno == (entry_line or sink_line)), None)
    if placement == "loss" and sink is not None and variable not in _reads(sink, function):
        # a loss reads the term under another name (an index into a stack of estimators): carried there; a
        # reward's value is the estimate itself, whatever the code does with it next
        variable, forward = _carried(statements, variable, origin_line, sink, function)
        kept += forward
        resolved |= {name for s in forward for name in _assigned(s)}
        defined_before = sink_line
        returned_at = max((s.lineno for s in forward), default=origin_line)  # estimators carried into one value
        # (a stack indexed by a switch) are one function, named after the statement that picks the value
    imported = _imported_names(tree)
    helpers = _module_functions(tree, imported)
    imported |= set(helpers)  # read by the slice as an import is: defined in its header
    switches: dict[str, str | bool | None] = {}
    cut: set[str] = set()
    while True:
        traced, read_by = _traced(kept, resolved | cut, statements, defined_before, function, outside, imported)
        parameters = _free_names(sorted(traced, key=lambda s: s.lineno), function, imported)
        unbound = [name for name in parameters if role_from_name(name) is None and name not in step_switches]
        # a value from outside the step under a name that does not bind (`teacher = self.server(...)`), read
        # into one that does (`teacher_logps = teacher["logprobs"]`): as the lint reads it, the value the named
        # variable holds is an input, whose role its name gives; the slice takes that variable as a parameter
        if not unbound:
            break
        named = [holder for holder in _holders(unbound[0], read_by) if role_from_name(holder) is not None]
        if named:
            cut.add(named[0])
            continue
        # a guard of the term's statements on a value of the step (`if len(batch.states) == 0: ... else:`) says
        # whether the term is formed, not how: the slice takes the side that forms it
        guards = _guards_reading(unbound[0], traced, function)
        if not guards:
            break
        for guard, side in guards.items():
            guard.test = ast.copy_location(ast.Constant(side == "body"), guard.test)
    if unbound:
        raise SliceError(f"{unbound[0]!r} comes from outside the step's arithmetic and does not bind by its name")
    kept = traced
    body = [_SelfReads(switches).visit(statement) for statement in copy.deepcopy(_pruned(function.body,
                                                                                          {id(s) for s in kept}))]
    named_sink = sink_of_name(variable)
    if placement == "reward" and named_sink in ("loss", "advantage"):
        # the score-function product is inside the cut (`per_token_loss = sg(kl) * logp`), or the term is the
        # advantages themselves (`advantages = teacher - student`): each token's own value is its advantage
        placement = named_sink
    name = f"{function.name}__inline_kl_{returned_at}"
    switches.update((name, step_switches[name]) for name in parameters if name in step_switches)
    arguments = [name for name in parameters if name not in switches] + [
        f"{switch}={default!r}" for switch, default in switches.items()]
    called = _called_helpers(_names_read(body), helpers)
    header = _imports_for(tree, _names_read([*body, *called]), imported, _package(path))
    header += "".join(ast.unparse(helper) + "\n\n\n" for helper in called)
    text = _function_text(name, arguments, body, ast.Name(variable, ast.Load()))
    if placement in ("reward", "advantage") and returned_sign(header + text, name, path) < 0:
        # the term is the negated estimate (`teacher - policy`), maximised as an advantage: check-grad audits a
        # reward placement as a penalty, so the cut-out function returns the estimate itself
        text = _function_text(name, arguments, body, _negated(variable))
    lines = [s.lineno for s in kept] + [getattr(s, "end_lineno", s.lineno) for s in kept]
    return InlineSlice(path, qualname, min(lines), max(lines), name, header + text, placement, origin_line)


def _traced(kept: list[ast.stmt], resolved: set[str], statements: list[ast.stmt], defined_before: int,
            function: _Function, outside: set[str], imported: set[str]) -> tuple[list[ast.stmt], dict[str, str]]:
    """`kept` with, going back, the assignments before line `defined_before` of every name they read that are
    arithmetic on values of the step (names in `resolved` are not followed); and for each name followed or
    read, the name whose definition read it."""
    kept = list(kept)
    pending = [(name, "") for statement in kept for name in _reads(statement, function)]
    read_by: dict[str, str] = {}
    seen = set(resolved)
    while pending:
        name, reader = pending.pop()
        if name in seen or name in imported or hasattr(builtins, name):
            continue
        seen.add(name)
        read_by[name] = reader
        definitions = [s for s in statements if name in _assigned(s) and s.lineno < defined_before]
        if definitions and all(_computable(s, outside) for s in definitions) and name not in outside:
            kept += definitions
            pending += [(read, name) for s in definitions for read in _reads(s, function)]
    return kept, read_by


def _branches(body: list, path: tuple = ()) -> dict[int, tuple]:
    """id(statement) -> the (id(if or match), side) of every `if` branch and `match` case that holds it."""
    out: dict[int, tuple] = {}
    for statement in body:
        out[id(statement)] = path
        for side, block in _blocks(statement):
            out.update(_branches(block, path + ((id(statement), side),) if _chooses(statement) else path))
    return out


def _chooses(statement: ast.stmt) -> bool:
    """Whether the blocks of `statement` are alternatives, one of which runs."""
    return isinstance(statement, (ast.If, ast.Match))


def _exclusive(branches: dict[int, tuple], a: ast.stmt, b: ast.stmt) -> bool:
    """Whether `a` and `b` lie on different sides of one `if` or `match` (never both run)."""
    sides = dict(branches.get(id(a), ()))
    return any(node in sides and sides[node] != side for node, side in branches.get(id(b), ()))


def _holders(name: str, read_by: dict[str, str]) -> list[str]:
    """The variables whose definitions read `name`, nearest first (the chain back to the kept statements)."""
    holders = []
    while read_by.get(name):
        name = read_by[name]
        holders.append(name)
    return holders


def _negated(variable: str) -> ast.expr:
    """`-variable`, item by item where it is a list (slime's per-sample advantages)."""
    value = ast.parse(f"[-item for item in {variable}] if isinstance({variable}, list) else -{variable}", mode="eval")
    return value.body


def _function_text(name: str, arguments: list[str], body: list[ast.stmt], returned: ast.expr) -> str:
    """The slice as a function returning `returned`; where the variable it reads is assigned only in some
    branches, the switch values that leave it unassigned raise NotImplementedError, which check-grad reports
    as values skipped (the term is not formed there)."""
    ending: ast.stmt = ast.Return(returned)
    variables = _names_read([returned])
    if not any(variables & _assigned(statement) for statement in body):
        ending = ast.Try([ending], [ast.ExceptHandler(ast.Name("UnboundLocalError", ast.Load()), None, [ast.Raise(
            ast.Call(ast.Name("NotImplementedError", ast.Load()), [ast.Constant(
                "the KL term is not formed at these switch values")], []), ast.Constant(None))])], [], [])
    code = ast.unparse(ast.fix_missing_locations(ast.Module(body=body + [ending], type_ignores=[])))
    return f"def {name}({', '.join(arguments)}):\n" + "".join(f"    {line}\n" for line in code.splitlines())


def _carried(statements: list[ast.stmt], variable: str, origin_line: int, sink: ast.stmt,
             function: _Function) -> tuple[str, list[ast.stmt]]:
    """Where the sink reads the term under another name (`kl = torch.stack([k1, k2, k3])[index]`): the
    variable it reads, and the statements between the estimator and the sink that carry the term there
    (each reads a variable holding it); (`variable`, []) when the sink reads no such variable."""
    holding, carrying = {variable}, []
    for statement in statements:
        if origin_line < statement.lineno < sink.lineno and _reads(statement, function) & holding:
            carrying.append(statement)
            holding |= _assigned(statement)
    read = [s for s in reversed(carrying) if _assigned(s) & _reads(sink, function)]
    if not read:
        return variable, []
    (last,) = sorted(_assigned(read[0]) & _reads(sink, function))[:1]
    return last, [s for s in carrying if s.lineno <= read[0].lineno]


def _free_names(kept: list[ast.stmt], function: _Function, imported: set[str]) -> list[str]:
    """Names the kept statements read before any of them assigns them: the function's parameters."""
    assigned: set[str] = set()
    free: dict[str, None] = {}
    for statement in kept:
        for name in sorted(_reads(statement, function)):
            if name not in assigned and name not in imported and not hasattr(builtins, name):
                free[name] = None
        assigned |= _assigned(statement)
    return list(free)


def _renames_itself(statement: ast.stmt) -> bool:
    """`x = x`, what `x = inputs["x"]` becomes once the input is a parameter, or a switch's spelling made
    canonical (`variant = variant.upper().strip()`: the slice is given the values the code compares with)."""
    return (isinstance(statement, ast.Assign) and len(statement.targets) == 1
            and isinstance(statement.targets[0], ast.Name) and _spelled(statement.value) == statement.targets[0].id)


_SPELLING = frozenset({"lower", "upper", "strip", "casefold"})  # str methods that change only a switch's spelling


def _switch_parameters(function: _Function) -> dict[str, str | bool]:
    """The step's parameters that are switches, each with the value a slice takes by default: a string or bool
    default, else the first string the step compares the parameter with (`variant == "A"`, `case "k3":`), else
    True for one annotated `bool`."""
    arguments = function.args
    positional = [*arguments.posonlyargs, *arguments.args]
    defaults = dict(zip([a.arg for a in positional[len(positional) - len(arguments.defaults):]], arguments.defaults))
    defaults.update((a.arg, d) for a, d in zip(arguments.kwonlyargs, arguments.kw_defaults) if d is not None)
    compared: dict[str, str] = {}
    for node in ast.walk(function):
        name, strings = _strings_compared(node)
        if name is not None and strings:
            compared.setdefault(name, strings[0])
    switches: dict[str, str | bool] = {}
    for argument in [*positional, *arguments.kwonlyargs]:
        default = defaults.get(argument.arg)
        annotation = ast.unparse(argument.annotation) if argument.annotation is not None else ""
        if isinstance(default, ast.Constant) and isinstance(default.value, (str, bool)):
            switches[argument.arg] = default.value
        elif argument.arg in compared:
            switches[argument.arg] = compared[argument.arg]
        elif annotation == "bool":
            switches[argument.arg] = True
    return switches


def _strings_compared(node: ast.AST) -> tuple[str | None, list[str]]:
    """(name, strings) for `name == "a"`, `name in ("a", "b")` or `match name:` with `case "a":`; else (None, [])."""
    if isinstance(node, ast.Compare):
        name = _spelled(node.left)
        literals = [element for comparator in node.comparators for element in (
            comparator.elts if isinstance(comparator, (ast.Tuple, ast.List, ast.Set)) else [comparator])]
    elif isinstance(node, ast.Match):
        name = _spelled(node.subject)
        literals = [case.pattern.value for case in node.cases if isinstance(case.pattern, ast.MatchValue)]
    else:
        return None, []
    return name, [literal.value for literal in literals
                  if isinstance(literal, ast.Constant) and isinstance(literal.value, str)]


def _spelled(node: ast.expr) -> str | None:
    """The name under a switch's spelling calls (`variant.lower()` -> variant), or None."""
    while isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _SPELLING \
            and not node.args and not node.keywords:
        node = node.func.value
    return node.id if isinstance(node, ast.Name) else None


class _StateAliases(ast.NodeTransformer):
    """`args = self.args`, then `args.kl_estimator`: an attribute of a local name bound once to instance state is
    an attribute of that state, `self.args.kl_estimator` (a switch or a KL coefficient of the slice, as `_SelfReads`
    makes every read of state), whatever else the step does with the name (`callbacks.on_step_end(args, ...)`). So is
    an attribute of a parameter named as settings and never rebound (`def loss(..., config)`: `config.kl_coef`)."""

    def __init__(self, function: _Function) -> None:
        stores: dict[str, int] = {}
        for node in ast.walk(function):
            if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
                stores[node.id] = stores.get(node.id, 0) + 1
        self.state: dict[str, ast.expr] = {
            target.id: statement.value for statement in ast.walk(function)
            if isinstance(statement, ast.Assign) and len(statement.targets) == 1
            and isinstance(target := statement.targets[0], ast.Name) and stores.get(target.id) == 1
            and _self_chain(statement.value) is not None}
        self.state.update((name, ast.Attribute(ast.Name("self", ast.Load()), name, ast.Load()))
                          for name in _parameters(function) if names_settings(name) and name not in stores)

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        if isinstance(node.value, ast.Name) and isinstance(node.value.ctx, ast.Load) and node.value.id in self.state:
            return ast.copy_location(ast.Attribute(copy.deepcopy(self.state[node.value.id]), node.attr, node.ctx), node)
        return self.generic_visit(node)


class _KeyedInputs(ast.NodeTransformer):
    """`inputs["ref_logprobs"]` and `inputs.get("ref_logprobs")`, read from an argument of the step under a
    key that binds by its name, become that name (a parameter of the slice)."""

    def __init__(self, outside: set[str]) -> None:
        self.outside = outside - {"self"}

    def _key(self, owner: ast.AST, key: ast.AST) -> str | None:
        if isinstance(owner, ast.Name) and owner.id in self.outside and isinstance(key, ast.Constant) \
                and isinstance(key.value, str) and key.value.isidentifier() and role_from_name(key.value) is not None:
            return key.value
        return None

    def visit_Subscript(self, node: ast.Subscript) -> ast.AST:
        key = self._key(node.value, node.slice)
        return ast.copy_location(ast.Name(key, ast.Load()), node) if key else self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> ast.AST:
        if isinstance(node.func, ast.Attribute) and node.func.attr == "get" and len(node.args) == 1:
            key = self._key(node.func.value, node.args[0])
            if key:
                return ast.copy_location(ast.Name(key, ast.Load()), node)
        return self.generic_visit(node)


def _function(tree: ast.Module, qualname: str) -> _Function:
    owner, _, name = qualname.rpartition(".")
    body = tree.body
    if owner:
        body = next((node.body for node in body if isinstance(node, ast.ClassDef) and node.name == owner), [])
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            return node
    raise SliceError(f"{qualname} not found")


def _simple_statements(body: list) -> list[ast.stmt]:
    """Every non-compound statement of a body, nested ones too, in source order."""
    out = []
    for statement in body:
        blocks = _blocks(statement)
        for _, block in blocks:
            out += _simple_statements(block)
        if not blocks and not isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.append(statement)
    return sorted(out, key=lambda s: s.lineno)


def _assigned(statement: ast.stmt) -> set[str]:
    targets = []
    if isinstance(statement, ast.Assign):
        targets = statement.targets
    elif isinstance(statement, (ast.AugAssign, ast.AnnAssign)):
        targets = [statement.target]
    return {node.id for target in targets for node in ast.walk(target)
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store)}


def _names_read(nodes) -> set[str]:
    """The names `nodes` read, less the variables of their comprehensions and lambdas (bound there, not read)."""
    read, bound = set(), set()
    for tree in nodes:
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                read.add(node.id)
            elif isinstance(node, ast.comprehension):
                bound |= {name.id for name in ast.walk(node.target) if isinstance(name, ast.Name)}
            elif isinstance(node, ast.Lambda):
                bound |= {argument.arg for argument in ast.walk(node.args) if isinstance(argument, ast.arg)}
    return read - bound


def _reads(statement: ast.stmt, function: _Function) -> set[str]:
    """Names a kept statement reads, with those of the `if` tests and `match` subjects that enclose it."""
    return _names_read([statement, *(_chosen_by(guard) for guard, _ in _guards(function.body, statement) or [])]) \
        - {"self"}


def _chosen_by(guard: ast.If | ast.Match) -> ast.expr:
    return guard.test if isinstance(guard, ast.If) else guard.subject


def _guards(body: list, target: ast.stmt) -> list[tuple[ast.If | ast.Match, str]] | None:
    """The `if` and `match` statements around `target` in `body`, outermost first, each with the side that holds
    it ("body", "orelse", "case<n>"); None when it is not there. Every block a statement holds is searched: loops,
    `with`, `try` and its handlers, `match` cases."""
    for statement in body:
        if statement is target:
            return []
        for side, block in _blocks(statement):
            inner = _guards(block, target)
            if inner is not None:
                return [(statement, side), *inner] if _chooses(statement) else inner
    return None


def _guards_reading(name: str, statements: list[ast.stmt], function: _Function) -> dict[ast.If, str]:
    """The `if` statements around `statements` whose test reads `name`, each with the one side that holds them;
    {} when one holds statements on both sides, or a `match` on the name holds them (no one side to take)."""
    sides: dict[ast.If | ast.Match, set[str]] = {}
    for statement in statements:
        for guard, side in _guards(function.body, statement) or []:
            if name in _names_read([_chosen_by(guard)]):
                sides.setdefault(guard, set()).add(side)
    if any(len(held) > 1 or isinstance(guard, ast.Match) for guard, held in sides.items()):
        return {}
    return {guard: held.pop() for guard, held in sides.items() if isinstance(guard, ast.If)}


def _blocks(statement: ast.stmt) -> list[tuple[str, list[ast.stmt]]]:
    """The statement lists `statement` holds, each with its field's name (not those of a nested function or
    class: another scope)."""
    if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return []
    blocks = [(name, getattr(statement, name)) for name in ("body", "orelse", "finalbody")
              if getattr(statement, name, None)]
    blocks += [("handler", handler.body) for handler in getattr(statement, "handlers", [])]
    blocks += [(f"case{index}", case.body) for index, case in enumerate(getattr(statement, "cases", []))]
    return blocks


def _computable(statement: ast.stmt, outside: set[str]) -> bool:
    """Whether an assignment is arithmetic on values of the step: no call of a `self` method, no read
    of the step's own arguments (models, batches, `inputs[...]`) but those that bind by their name (the
    log-probs, a mask, the token ids: they become parameters of the cut-out function)."""
    if not isinstance(statement, (ast.Assign, ast.AugAssign, ast.AnnAssign)) or statement.value is None:
        return False
    for node in ast.walk(statement.value):
        if isinstance(node, ast.Name) and node.id in outside - {"self"} and role_from_name(node.id) is None:
            return False
        if isinstance(node, ast.Call) and _self_chain(node.func) is not None:
            return False
    return True


def _self_chain(node: ast.AST) -> list[str] | None:
    """['args', 'beta'] for `self.args.beta`, else None."""
    names: list[str] = []
    while isinstance(node, ast.Attribute):
        names.insert(0, node.attr)
        node = node.value
    return names if isinstance(node, ast.Name) and node.id == "self" and names else None


def _pruned(body: list, kept: set[int]) -> list[ast.stmt]:
    """`body` with only the kept statements and the compound statements that hold some of them."""
    out: list[ast.stmt] = []
    for statement in body:
        if id(statement) in kept:
            out.append(statement)
        elif isinstance(statement, ast.If):
            inner, orelse = _pruned(statement.body, kept), _pruned(statement.orelse, kept)
            if inner or orelse:
                out.append(ast.If(statement.test, inner or [ast.Pass()], orelse))
        elif isinstance(statement, ast.Match):
            cases = [_pruned(case.body, kept) for case in statement.cases]
            if any(cases):
                out.append(ast.Match(statement.subject, [ast.match_case(case.pattern, case.guard, body or [ast.Pass()])
                                                         for case, body in zip(statement.cases, cases)]))
        elif isinstance(statement, (ast.With, ast.For, ast.While, ast.Try)):
            for field in ("body", "orelse", "finalbody"):
                out += _pruned(getattr(statement, field, []), kept)  # the block's statements, run once
    return out


# a special token's id in instance state (`self.tokenizer.pad_token_id`, `self.eos_id`): no switch
_TOKEN_ID = re.compile(r"(?:^|_)(?:pad|eos|bos)(?:_token)?_ids?$")


class _SelfReads(ast.NodeTransformer):
    """`self.a.b` read as a value, or a key of a dict in instance state (`self.cfg.get("b", 0.0)`, `self.cfg["b"]`):
    1.0 for a KL coefficient, else the switch parameter `b`, with its default: the first string it is compared
    with, or True for a flag."""

    def __init__(self, switches: dict) -> None:
        self.switches = switches

    def visit_Compare(self, node: ast.Compare) -> ast.AST:
        chain = _self_chain(node.left) or _state_key(node.left)
        literals = [c.value for c in node.comparators if isinstance(c, ast.Constant) and isinstance(c.value, str)]
        if chain is not None and literals and not is_coefficient_name(chain[-1]):
            self.switches.setdefault(chain[-1], literals[0])
        return self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        chain = _self_chain(node)
        return self.generic_visit(node) if chain is None else self._read(chain[-1], node)

    def visit_Call(self, node: ast.Call) -> ast.AST:
        key = _state_key(node)
        return self.generic_visit(node) if key is None else self._read(key[-1], node)

    def visit_Subscript(self, node: ast.Subscript) -> ast.AST:
        key = _state_key(node) if isinstance(node.ctx, ast.Load) else None
        return self.generic_visit(node) if key is None else self._read(key[-1], node)

    def _read(self, name: str, node: ast.AST) -> ast.AST:
        if is_coefficient_name(name):
            return ast.copy_location(ast.Constant(1.0), node)
        if _TOKEN_ID.search(name):
            raise SliceError(f"it reads a special token's id from instance state, `{name}` (a mask built from the "
                             f"ids, `completion_ids != pad_token_id`): the enumerated responses are padded with no id "
                             f"of their own, so no value of it gives the response's mask; audit a function handed the "
                             f"mask")
        self.switches.setdefault(name, True)
        return ast.copy_location(ast.Name(name, ast.Load()), node)


def _state_key(node: ast.AST) -> list[str] | None:
    """['cfg', 'kl_beta'] for `self.cfg.get("kl_beta", ...)` or `self.cfg["kl_beta"]`: a key of a dict in instance
    state, read as the chain's last attribute would be; else None."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" and node.args:
        owner, key = node.func.value, node.args[0]
    elif isinstance(node, ast.Subscript):
        owner, key = node.value, node.slice
    else:
        return None
    chain = _self_chain(owner)
    if chain is None or not (isinstance(key, ast.Constant) and isinstance(key.value, str) and key.value.isidentifier()):
        return None
    return [*chain, key.value]


def _imported_names(tree: ast.Module) -> set[str]:
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
    return names


def _module_functions(tree: ast.Module, imported: set[str]) -> dict[str, _Function]:
    """The file's top-level functions a slice may call (`compute_kl_penalty(logprobs_new, logprobs_ref)`):
    those reading no global name but imports, builtins and other such functions, and calling none of their
    parameters (a helper that runs the model it is given computes the slice's inputs, not its arithmetic)."""
    defined = {node.name: node for node in tree.body
               if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not _calls_a_parameter(node)}
    reads = {name: _globals_read(node) for name, node in defined.items()}
    usable = set(defined)
    while True:
        unusable = {name for name in usable if not reads[name] <= imported | usable}
        if not unusable:
            return {name: node for name, node in defined.items() if name in usable}
        usable -= unusable


def _globals_read(function: _Function) -> set[str]:
    """The names a function reads that it neither takes nor binds, builtins left out."""
    arguments = function.args
    taken = _parameters(function) | {a.arg for a in (arguments.vararg, arguments.kwarg) if a is not None}
    bound = {node.id for node in ast.walk(function) if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load)}
    bound |= {node.name for node in ast.walk(function) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                                            ast.ClassDef)) and node is not function}
    return {name for name in _names_read([function]) - taken - bound if not hasattr(builtins, name)}


def _parameters(function: _Function) -> set[str]:
    """The names of a function's parameters (`*args` and `**kwargs` left out)."""
    arguments = function.args
    return {a.arg for a in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]}


def _calls_a_parameter(function: _Function) -> bool:
    taken = _parameters(function)
    return any(isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in taken
               for node in ast.walk(function))


def _called_helpers(read: set[str], helpers: dict[str, _Function]) -> list[_Function]:
    """The helpers the slice reads, and those they read in turn, in the file's order."""
    needed: set[str] = set()
    pending = [name for name in read if name in helpers]
    while pending:
        name = pending.pop()
        if name not in needed:
            needed.add(name)
            pending += [inner for inner in _globals_read(helpers[name]) if inner in helpers]
    return [node for name, node in helpers.items() if name in needed]


def _package(path: str) -> list[str]:
    """The dotted package `path` is in ([] outside packages)."""
    return package_of(path)[1][:-1]


def _imports_for(tree: ast.Module, used: set[str], imported: set[str], package: list[str]) -> str:
    """The module's top-level import statements that bind names the slice reads; a relative import made
    absolute from `package` (the cut-out function imports the package as the original file does)."""
    lines = []
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.level:
            if node.level > len(package):
                continue
            base = package[:len(package) - node.level + 1] + ([node.module] if node.module else [])
            node = ast.ImportFrom(".".join(base), node.names, 0)
        if isinstance(node, ast.Import) or isinstance(node, ast.ImportFrom):
            aliases = [alias for alias in node.names if (alias.asname or alias.name).split(".")[0] in used]
            if aliases:
                node = ast.Import(aliases) if isinstance(node, ast.Import) else ast.ImportFrom(node.module, aliases, 0)
                lines.append(ast.unparse(node))
    return "".join(line + "\n" for line in lines) + ("\n\n" if lines else "")
