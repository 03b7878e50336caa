"""Which functions of a module are worth interpreting on their own: those that may meet a KL term.

A finding needs a KL term, and a KL term is made of a reference's (or teacher's) log-probs or logits,
or of a value named as a KL (klaudit.lint.roles). The engine already skips files whose text names
neither (`might_contain_kl`); this is the same test for each function of a file it analyses, with
what the interpreter can carry into a function from elsewhere added. A function is interpreted on its
own (klaudit.lint.checks) when its text names such a value or refers by name to something that may
hand it one:

* a function, method or class of its module that is itself worth interpreting (by name: every
  method of that name, in any class of the module, counts);
* a `self` attribute or class attribute, or a module-level constant, whose value names one of these
  or has KL vocabulary (the interpreter reads `self.estimator = KLEstimator()` back at
  `self.estimator(...)`, and dispatch tables from module constants);
* a field or key the module stores KL values into (klaudit.lint.modules.stored_slots);
* a name imported from a module of the linted tree that the interpreter would follow (its text has
  KL vocabulary, it is a package's `__init__`, or the name speaks of a loss: klaudit.lint.project),
  or a definition made under a module-level `if`;
* for a method of a class derived from such an imported class, `self` or `super` (inherited methods).

The rest can be handed no KL term, so their analysis on their own finds nothing; they are still
interpreted wherever a function worth interpreting calls them. A file none of whose functions is
worth interpreting is not parsed by LibCST at all (klaudit.lint.engine). Read from Python's tree and the text
before any interpretation: identifiers are taken from the text (comments and strings too, which only
adds functions).
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Callable, Iterable, Iterator

from klaudit.lint import roles
from klaudit.lint.modules import MODULE_BODY, stored_slots
from klaudit.lint.project import Project
from klaudit.lint.syntax import python_ast

_IDENTIFIER = re.compile(r"[A-Za-z_]\w*")
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)


class _Unit:
    """A function of `klaudit.lint.modules.module_functions`, as its text names things."""

    def __init__(self, name: str, cls: str | None, text: str) -> None:
        self.name = name
        self.cls = cls
        found = _IDENTIFIER.findall(text)
        # its own name counts where the function refers to itself, not where `def` names it
        self.names = frozenset(found) - ({name} if found.count(name) == 1 else set())
        self.seeded = _speaks_of_kl(text, self.names)


def _speaks_of_kl(text: str, names: frozenset[str]) -> bool:
    return roles.might_contain_kl(text) or any(_names_reference(name) for name in names)


@functools.lru_cache(maxsize=8192)  # a pure function of the name; names recur across functions and files
def _names_reference(name: str) -> bool:
    """A name the roles read as the reference's log-probs or logits or the reference model, or a class
    name whose words speak of KL (`KLEstimator`, followed by the interpreter as such)."""
    return (roles.names_reference_outputs(name) or roles.is_reference_model(name)
            or (name[:1].isupper() and roles.might_contain_kl(roles.snake_words(name))))


def _text(lines: list[str], node: ast.AST) -> str:
    first, last = node.lineno, node.end_lineno  # type: ignore[attr-defined]  # set by the parser on statements
    return "\n".join(lines[first - 1:last if last is not None else first])


def _statements(body: Iterable[ast.stmt]) -> Iterator[ast.stmt]:
    """The statements of a block at any depth, not entering nested definitions."""
    for stmt in body:
        yield stmt
        if not isinstance(stmt, (*_FUNCTIONS, ast.ClassDef)):
            for block in _blocks(stmt):
                yield from _statements(block)


def _blocks(stmt: ast.stmt) -> Iterator[list[ast.stmt]]:
    """The blocks a compound statement holds (if/for/while/with/try/match)."""
    for field in ("body", "orelse", "finalbody"):
        inner = getattr(stmt, field, None)
        if isinstance(inner, list):
            yield inner
    for part in [*getattr(stmt, "handlers", ()), *getattr(stmt, "cases", ())]:
        yield part.body


def _assigned(stmt: ast.stmt) -> list[tuple[ast.expr, ast.expr]]:
    """(target, value) of an assignment statement."""
    if isinstance(stmt, ast.Assign):
        return [(target, stmt.value) for target in stmt.targets]
    if isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
        return [(stmt.target, stmt.value)]
    return []


def _runs_nothing(stmt: ast.stmt) -> bool:
    """An import, `pass` or a string (a docstring), as klaudit.lint.modules.module_body reads them."""
    return isinstance(stmt, (ast.Import, ast.ImportFrom, ast.Pass)) or (
        isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str))


def worth_interpreting(source: str, tree: ast.Module, stored: Iterable[str],
                       follows: Callable[[str], bool]) -> list[bool]:
    """For each function of the module (module_functions order with its body, read from Python's `tree` of
    `source`), whether to interpret it on its own. `stored`: the module's KL fields and key slots;
    `follows(name)`: whether a name is imported from a module the interpreter would follow."""
    lines = source.splitlines()
    units: list[_Unit] = []
    values: dict[str, list[str]] = {}  # attribute or constant -> the texts of the values assigned to it
    links = {slot[2:-2] if slot.startswith("[") else slot for slot in stored}
    derived: set[str] = set()  # classes derived from a class the interpreter follows into another module
    for stmt in tree.body:
        if isinstance(stmt, _FUNCTIONS):
            units.append(_Unit(stmt.name, None, _text(lines, stmt)))
        elif isinstance(stmt, ast.ClassDef):
            bases = {base.id if isinstance(base, ast.Name) else base.attr
                     for base in stmt.bases if isinstance(base, (ast.Name, ast.Attribute))}
            if any(follows(base) or base in derived for base in bases):
                derived.add(stmt.name)
            for item in stmt.body:
                if isinstance(item, _FUNCTIONS):
                    units.append(_Unit(item.name, stmt.name, _text(lines, item)))
                    for inner in _statements(item.body):
                        for target, value in _assigned(inner):
                            if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) \
                                    and target.value.id == "self":
                                values.setdefault(target.attr, []).append(_text(lines, value))
                for target, value in _assigned(item):
                    if isinstance(target, ast.Name):
                        values.setdefault(target.id, []).append(_text(lines, value))
        elif isinstance(stmt, (ast.If, ast.Try)):  # definitions made under a module-level if / try
            links.update(node.name for node in _statements([stmt]) if isinstance(node, (*_FUNCTIONS, ast.ClassDef)))
        for target, value in _assigned(stmt):
            if isinstance(target, ast.Name):
                values.setdefault(target.id, []).append(_text(lines, value))
    body = [stmt for stmt in tree.body if not isinstance(stmt, (*_FUNCTIONS, ast.ClassDef)) and not _runs_nothing(stmt)]
    if body:  # the module's own statements, the last function of module_functions(with_body=True); those
        # that call nothing (`KL_COEF = 0.1`, a settings module) cannot reach a loss or a reward
        calling = [stmt for stmt in body if any(isinstance(node, ast.Call) for node in ast.walk(stmt))]
        units.append(_Unit(MODULE_BODY, None, "\n".join(_text(lines, stmt) for stmt in calling)))
    valued = {name: [(names, _speaks_of_kl(text, names) or any(follows(n) for n in names))
                     for text in texts for names in (frozenset(_IDENTIFIER.findall(text)),)]
              for name, texts in values.items()}
    # what never changes: the function's own text, an import it uses, `self` in a class derived from one
    relevant = [unit.seeded or any(follows(name) for name in unit.names)
                or (unit.cls in derived and not unit.names.isdisjoint(("self", "super"))) for unit in units]
    while True:  # what functions worth interpreting link: until no function is added
        for unit, worth in zip(units, relevant):
            if worth:
                links.add(unit.name)
                if unit.cls is not None:
                    links.add(unit.cls)
        links.update(name for name, assigned in valued.items()
                      if any(speaks or not names.isdisjoint(links) for names, speaks in assigned))
        added = [index for index, unit in enumerate(units) if not relevant[index] and not unit.names.isdisjoint(links)]
        if not added:
            return relevant
        for index in added:
            relevant[index] = True


def python_imports(tree: ast.Module) -> dict[str, tuple[str, int, str | None]]:
    """{local name: (the module it is imported from, relative level, the name imported from it or None
    for a module)} for the imports at module level and under a module-level if / try, the ones
    klaudit.lint.modules.Module follows."""
    found: dict[str, tuple[str, int, str | None]] = {}
    for stmt in _statements(tree.body):
        if isinstance(stmt, ast.Import):
            for alias in stmt.names:
                found[alias.asname or alias.name.split(".")[0]] = (alias.name if alias.asname else alias.name.split(".")[0], 0, None)
        elif isinstance(stmt, ast.ImportFrom):
            for alias in stmt.names:
                if alias.name != "*":
                    found[alias.asname or alias.name] = (stmt.module or "", stmt.level, alias.name)
    return found


def functions_worth_interpreting(path: str, source: str, project: Project) -> list[bool] | None:
    """`worth_interpreting` for the file `path`, its imports resolved by `project` (followed where the
    interpreter follows them: klaudit.lint.project); None where Python's parser does not read the
    source (then every function is interpreted)."""
    try:
        tree = python_ast(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    imports = python_imports(tree)
    followed: dict[str, bool] = {}

    def follows(name: str) -> bool:
        if name not in followed:
            module, level, imported = imports.get(name, (None, 0, None))
            found = project.module_path(module, path, level) if module is not None else None
            followed[name] = found is not None and project.follows(found, imported)
        return followed[name]

    return worth_interpreting(source, tree, stored_slots(source), follows)
