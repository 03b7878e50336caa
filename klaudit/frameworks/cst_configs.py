"""Framework configuration calls and classes read from LibCST's tree, with LibCST's positions: the
fallback of klaudit.frameworks.calls for code Python's own parser cannot read (newer syntax). A dict
built before a `**` call (klaudit.frameworks.kwargs_dicts) is followed in Python's tree only: here its
keys are unknown; so is a keyword set to a configuration's section by its keys (`g["kl_coef"]` after
`g = cfg["grpo"]`): here it is unknown too."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from klaudit.frameworks import options
from klaudit.frameworks.options import Default, Options, bindings, click_parameter, module_constants, resolve, visible
from klaudit.frameworks.python_values import imported_constants, integer_arithmetic_of_text
from klaudit.frameworks.settings import RAISE_EXPECTATIONS, ConfigCall, ConfigClass, Setting, skips_always
from klaudit.lint.syntax import dotted, string_value


def _literal(node: cst.BaseExpression) -> str | None:
    """The value of a literal keyword argument as a string; None for anything computed."""
    if isinstance(node, cst.SimpleString):
        return str(string_value(node))
    if isinstance(node, (cst.Integer, cst.Float)):
        return node.value.replace("_", "")
    if isinstance(node, cst.Name) and node.value in ("True", "False", "None"):
        return node.value
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus):
        inner = _literal(node.expression)
        return None if inner is None else "-" + inner
    return None


def _field_default(node: cst.BaseExpression) -> str | None:
    """A dataclass field's default: `0.04` or `field(default=0.04, ...)`; None when computed."""
    if isinstance(node, cst.Call) and dotted(node.func).rsplit(".", 1)[-1] == "field":
        default = next((arg.value for arg in node.args if arg.keyword is not None and arg.keyword.value == "default"),
                       None)
        return None if default is None else _literal(default)
    return _literal(node)


def _parameter_default(node: cst.BaseExpression) -> str | None:
    """A function parameter's default: `0.04`, or the default a typer option declares in its place (`beta: float =
    typer.Option(0.04, help=...)`); None when computed or required (`typer.Option(...)`)."""
    if isinstance(node, cst.Call) and dotted(node.func).rsplit(".", 1)[-1] in options.OPTION_DECLARATIONS:
        default = node.args[0].value if node.args and node.args[0].keyword is None else next(
            (arg.value for arg in node.args if arg.keyword is not None and arg.keyword.value == "default"), None)
        return None if default is None else _literal(default)
    return _literal(node)


# The statements and expressions that bind names, and the field holding the target of each.
_BINDERS = ((cst.AssignTarget, "target"), (cst.AnnAssign, "target"), (cst.AugAssign, "target"), (cst.For, "target"),
            (cst.CompFor, "target"), (cst.NamedExpr, "target"), (cst.Del, "target"), (cst.AsName, "name"))


class _Assigned(cst.CSTVisitor):
    """The names a function body binds, with how many times each: assignment, loop, `with ... as`, walrus and
    `del` targets, `import ... as` and `except ... as` names (an `import x` without `as` binds x: python_values.binds of
    Python's tree)."""

    def __init__(self) -> None:
        self.names: Counter[str] = Counter()

    def _targets(self, node: cst.CSTNode | None) -> None:
        if isinstance(node, cst.Name):
            self.names[node.value] += 1
        elif isinstance(node, (cst.Tuple, cst.List)):
            for element in node.elements:
                self._targets(element.value)
        elif isinstance(node, cst.StarredElement):
            self._targets(node.value)

    def on_visit(self, node: cst.CSTNode) -> bool:
        field = next((field for kind, field in _BINDERS if isinstance(node, kind)), None)
        if field is not None:
            self._targets(getattr(node, field))
        elif isinstance(node, cst.ImportAlias) and node.asname is None:
            self.names[dotted(node.name).split(".")[0]] += 1
        return True


def _chain(node: cst.BaseExpression) -> str:
    """`self.args.beta` of that attribute chain of names; "" for anything else (`x[0].beta`, `f().beta`)."""
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        base = _chain(node.value)
        return f"{base}.{node.attr.value}" if base else ""
    return ""


class _Reads(cst.CSTVisitor):
    """options.local_read of each name a function body binds once (`bound`), to `cfg.get("key", literal)` or an
    environment read (calls._reads of Python's tree)."""

    def __init__(self, bound: Counter[str], line: Callable[[cst.CSTNode], int], options: Options) -> None:
        self.bound, self.line, self.options = bound, line, options
        self.reads: dict[str, Default] = {}

    def on_visit(self, node: cst.CSTNode) -> bool:
        target, value = _single_assignment(node)
        if isinstance(target, cst.Name) and self.bound[target.value] == 1 and value is not None:
            read = options.local_read(target.value, _nested_calls(value), self.line(node), self.options)
            if read is not None:
                self.reads[target.value] = read
        return True


def _bindings(node: cst.FunctionDef, line: Callable[[cst.CSTNode], int], options: Options) -> dict[str, Default | None]:
    """The names a function binds (options.bindings): its parameters' literal defaults, its body's names, and
    the defaults of the configuration reads among them."""
    assigned = _Assigned()
    node.body.visit(assigned)
    reads = _Reads(assigned.names, line, options)
    node.body.visit(reads)
    parameters = (*node.params.posonly_params, *node.params.params, *node.params.kwonly_params)
    defaults = {parameter.name.value: None if parameter.default is None else _parameter_default(parameter.default)
                for parameter in parameters}
    for decorator in node.decorators:
        call = decorator.decorator
        if isinstance(call, cst.Call) and dotted(call.func).rsplit(".", 1)[-1] == "option":
            name = click_parameter([str(string_value(arg.value)) for arg in call.args if arg.keyword is None
                                            and isinstance(arg.value, cst.SimpleString)])
            default = next((arg.value for arg in call.args if arg.keyword is not None and arg.keyword.value == "default"),
                           None)
            if name is not None and name in defaults and defaults[name] is None:
                defaults[name] = None if default is None else _literal(default)
    if isinstance(node.params.star_arg, cst.Param):
        defaults[node.params.star_arg.name.value] = None
    if node.params.star_kwarg is not None:
        defaults[node.params.star_kwarg.name.value] = None
    return bindings(defaults, assigned.names, reads.reads)


class _ModuleBindings(_Assigned):
    """The names bound outside functions and classes (the scopes of their own), and apart from them each
    `NAME = value` with the value's literal and line (python_values.module_constants_of of Python's tree)."""

    def __init__(self, line: Callable[[cst.CSTNode], int]) -> None:
        super().__init__()
        self.line = line
        self.assignments: list[tuple[str, str | None, int, str]] = []
        # (module, level, {name bound: name imported}) of each `from module import ...` of named names
        self.imports: list[tuple[str, int, dict[str, str]]] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        if isinstance(node, cst.ImportFrom) and node.module is not None and not isinstance(node.names, cst.ImportStar):
            names = {dotted(alias.asname.name if alias.asname is not None else alias.name): dotted(alias.name)
                     for alias in node.names if alias.asname is None or isinstance(alias.asname.name, cst.Name)}
            self.imports.append((dotted(node.module), len(node.relative), names))
        if isinstance(node, (cst.FunctionDef, cst.ClassDef)):
            self.names[node.name.value] += 1
            return False
        if isinstance(node, cst.Lambda):
            return False
        target, value = _single_assignment(node)
        if isinstance(target, cst.Name):
            if value is not None:  # `BETA: float` alone binds nothing
                variable, default = _environment_default(value) or ("", _literal(value))
                self.assignments.append((target.value, default, self.line(node), variable))
                value.visit(self)
            return False
        return super().on_visit(node)


def _environment_default(node: cst.BaseExpression) -> tuple[str, str] | None:
    """python_values._environment_default of LibCST's tree: `float(os.environ.get("BETA", 0.04))`."""
    return options.environment_default(_nested_calls(node))


def _nested_calls(node: cst.BaseExpression) -> list[tuple[str, list[str | None]]]:
    """python_values.nested_calls of LibCST's tree: the calls a value nests, from the outside in (at most two)."""
    calls: list[tuple[str, list[str | None]]] = []
    current: cst.BaseExpression | None = node
    while isinstance(current, cst.Call) and len(calls) < 2 and all(a.keyword is None and not a.star for a in current.args):
        calls.append((dotted(current.func), [_literal(argument.value) for argument in current.args]))
        current = current.args[0].value if len(current.args) == 1 else None
    return calls


def _single_assignment(node: cst.CSTNode) -> tuple[cst.BaseExpression | None, cst.BaseExpression | None]:
    """(target, value) of `name: T = value` or of a one-target `name = value`; (None, None) otherwise."""
    if isinstance(node, cst.AnnAssign):
        return node.target, node.value
    if isinstance(node, cst.Assign) and len(node.targets) == 1:
        return node.targets[0].target, node.value
    return None, None


class _Globals(cst.CSTVisitor):
    """The names some `global` statement declares."""

    def __init__(self) -> None:
        self.names: set[str] = set()

    def visit_Global(self, node: cst.Global) -> None:
        self.names.update(item.name.value for item in node.names)


def _expects_a_raise(node: cst.With) -> bool:
    """`with pytest.raises(...)` or `with self.assertRaises(...)`: its body tests that something is refused."""
    return any(isinstance(item.item, cst.Call) and dotted(item.item.func).rsplit(".", 1)[-1] in RAISE_EXPECTATIONS
               for item in node.items)


def _skipped(node: cst.FunctionDef) -> bool:
    """A test decorated to be skipped always (`@unittest.skip(...)`): what its body builds is never run."""
    return any(skips_always(dotted(decorator.decorator.func if isinstance(decorator.decorator, cst.Call)
                                   else decorator.decorator)) for decorator in node.decorators)


class _Reader(cst.CSTVisitor):
    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self, classes: Collection[str], keys: Collection[str], path: str,
                 options: Options) -> None:
        self.classes, self.keys, self.path, self.options = classes, keys, path, options
        self.calls: list[ConfigCall] = []
        self.definitions: list[ConfigClass] = []
        self.functions: list[dict[str, Default | None]] = []  # the enclosing functions' names, innermost last
        self.module: cst.Module | None = None
        self.constants: dict[str, Default] | None = None  # the module's, read at the first keyword set to a name
        self.refused = 0  # how many `with pytest.raises(...)` blocks and skipped tests enclose the node visited

    def visit_Module(self, node: cst.Module) -> None:
        self.module = node

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.functions.append(_bindings(node, lambda inner: self.get_metadata(PositionProvider, inner).start.line,
                                        self.options or Options()))
        self.refused += _skipped(node)

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self.functions.pop()
        self.refused -= _skipped(original_node)

    def visit_With(self, node: cst.With) -> None:
        self.refused += _expects_a_raise(node)

    def leave_With(self, original_node: cst.With) -> None:
        self.refused -= _expects_a_raise(original_node)

    def _keyword(self, arg: cst.Arg) -> Setting:
        assert arg.keyword is not None
        value, default = _literal(arg.value), None
        if value is None and isinstance(arg.value, (cst.Name, cst.Attribute)):
            default = resolve(_chain(arg.value), visible([self._constants(), *self.functions]), self.options,
                              self.path)
        elif value is None and isinstance(arg.value, cst.BinaryOperation) and self.module is not None:
            names = visible([self._constants(), *self.functions])
            default = integer_arithmetic_of_text(self.module.code_for_node(arg.value),
                                         lambda name: resolve(name, names, self.options, self.path))
        elif value is None and isinstance(arg.value, cst.Call):  # `PPOConfig(ppo_epochs=cfg.get("ppo_epochs", 4))`
            line = self.get_metadata(PositionProvider, arg).start.line
            nested = _nested_calls(arg.value)
            read = options.configuration_read(arg.keyword.value, nested, line)
            default = self.options.read(read, self.path) if read is not None else \
                self.options.environment_read(nested, line)
        found = self._setting(arg, value if default is None else default.value, len(arg.keyword.value))
        return options.defaulted(found, default)

    def _constants(self) -> dict[str, Default]:
        if self.constants is None:
            self.constants = {}
            if self.module is not None:
                bound, declared = _ModuleBindings(lambda node: self.get_metadata(PositionProvider, node).start.line), _Globals()
                self.module.visit(bound)
                self.module.visit(declared)
                imported = self._imported(bound.imports)
                other = [(name, None, 0, "") for name, count in bound.names.items()  # any other binding: no constant
                         for _ in range(count - (name in imported))]
                given = [(name, value.value, 0, "") for name, value in imported.items()]
                constants = module_constants([*bound.assignments, *given, *other], declared.names,
                                             (self.options or Options()).environment)
                self.constants = {name: imported.get(name, value) for name, value in constants.items()}
        return self.constants

    def _imported(self, imports: list[tuple[str, int, dict[str, str]]]) -> dict[str, Default]:
        """python_values.imported_constants of each `from module import ...`, by the name each binds."""
        found: dict[str, Default] = {}
        for module, level, names in imports:
            given = imported_constants(module, level, self.path, self.options or Options())
            found.update({bound: given[name] for bound, name in names.items() if name in given})
        return found

    def _setting(self, node: cst.CSTNode, value: str | None, name_length: int) -> Setting:
        span = self.get_metadata(PositionProvider, node)
        end = span.end.column + 1 if span.end.line == span.start.line else span.start.column + 1 + name_length
        return Setting(value, span.start.line, span.start.column + 1, end)

    def visit_Call(self, node: cst.Call) -> None:
        name = dotted(node.func).rsplit(".", 1)[-1]
        if name not in self.classes or self.refused:
            return
        settings = {arg.keyword.value: self._keyword(arg) for arg in node.args if arg.keyword is not None}
        written = frozenset(settings)
        where = self._setting(node.func, None, len(name))
        if any(arg.star == "**" for arg in node.args):  # any key not named may come from the mapping
            unknown = Setting(None, where.line, where.column, where.column)
            settings = {**{key: unknown for key in self.keys}, **settings}
        self.calls.append(ConfigCall(name, where, settings, written))

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        bases = tuple(dotted(arg.value).rsplit(".", 1)[-1] for arg in node.bases if arg.keyword is None)
        if node.name.value not in self.classes and not set(bases) & set(self.classes):
            return
        fields: dict[str, Setting] = {}
        for line in node.body.body if isinstance(node.body, cst.IndentedBlock) else ():
            for statement in line.body if isinstance(line, cst.SimpleStatementLine) else ():
                target, value = _single_assignment(statement)
                if isinstance(target, cst.Name) and target.value in self.keys and value is not None:
                    fields[target.value] = self._setting(statement, _field_default(value), len(target.value))
        passed = {parameter.name.value: self._setting(parameter, _field_default(parameter.default),
                                                      len(parameter.name.value))
                  for parameter in _init_parameters(node)
                  if parameter.name.value in self.keys and parameter.default is not None}
        self.definitions.append(ConfigClass(node.name.value, bases, fields, self.path, passed))


def _init_parameters(node: cst.ClassDef) -> list[cst.Param]:
    """The parameters of a configuration class's own `__init__` (Unsloth's generated UnslothGRPOConfig takes every
    field with its default, `beta = 0.04`, and hands it to GRPOConfig's)."""
    body = node.body.body if isinstance(node.body, cst.IndentedBlock) else ()
    init = next((item for item in body if isinstance(item, cst.FunctionDef) and item.name.value == "__init__"), None)
    return [] if init is None else [*init.params.params, *init.params.kwonly_params]


def libcst_configs(source: str, names: frozenset[str], keys: tuple[str, ...], path: str,
                   module: cst.Module | None,
                   options: Options | None = None) -> tuple[list[ConfigCall], list[ConfigClass]]:
    """klaudit.frameworks.calls.read_configs's answer, read from LibCST's tree (`module`, if parsed)."""
    reader = _Reader(names, keys, path, options or Options())
    MetadataWrapper(module or cst.parse_module(source), unsafe_skip_copy=True).visit(reader)
    return reader.calls, reader.definitions
