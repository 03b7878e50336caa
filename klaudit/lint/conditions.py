"""Conditions: which switch value an `if` test selects, and whether the analysis can decide it.

A test is read as a label, (switch name, values): `kind == "k3"` and `kind in ("k3", "low_var_kl")`
label their literals, `kind != "k1"` the literal excluded (`!=k1`), `kind.endswith("+")` the pattern
`*+`, a flag its value True, `weight == 0`, `weight != 0`, `pp_size > 1` and `loss_type ==
LossType.TOKEN_LEVEL` a value of their own (True on one side, False on the other); `a and b` holds
the labels of both where it is true, and nothing where it is false. `not test` and
the statements after `if test: return` hold the negation where labels can say it
(klaudit.lint.facts.negated). A test
on a value the analysis knows (a string passed by the caller, `x is None` for a None default) is
decided, and only its branch runs.
"""

from __future__ import annotations

import operator
import re

import libcst as cst

from klaudit.lint.facts import (
    UNKNOWN,
    is_excluded,
    is_negated_pattern,
    is_pattern,
    measured_label,
    negated,
    operands,
    takes,
)
from klaudit.lint.flowstate import FlowState, Label, Test
from klaudit.lint.syntax import dotted, last_name, number_value, string_literals

_ORDER = {cst.GreaterThan: ">", cst.GreaterThanEqual: ">=", cst.LessThan: "<", cst.LessThanEqual: "<="}


class ConditionFlow(FlowState):
    """`if` tests read as switch labels, for klaudit.lint.flow.FunctionRun."""

    def condition(self, test: cst.BaseExpression) -> Test:
        """(label, decided): the switch value an `if` selects, and its truth when known."""
        if type(test) is cst.UnaryOperation and type(test.operator) is cst.Not:  # type(): see klaudit.lint.syntax
            label, decided = self.condition(test.expression)
            if decided is not None:
                return None, not decided
            otherwise = where_false(label)
            return (otherwise[0] if otherwise else None), None
        if type(test) is cst.BooleanOperation and type(test.operator) is cst.Or:
            (left_label, left_decided), (right_label, right_decided) = self.condition(test.left), self.condition(test.right)
            if True in (left_decided, right_decided):
                return None, True
            if left_decided is False or right_decided is False:
                return (right_label, right_decided) if left_decided is False else (left_label, left_decided)
            return _either(left_label, right_label), None
        if type(test) is cst.BooleanOperation and type(test.operator) is cst.And:
            sides = (self.condition(test.left), self.condition(test.right))
            if any(decided is False for _, decided in sides):
                return None, False
            undecided = [side for side in sides if side[1] is None]
            # one side known true: the other's test; both open: `holding` gives the labels of each
            return undecided[0] if len(undecided) == 1 else (None, None if undecided else True)
        if type(test) is cst.Call and len(test.args) == 1 and (none_test := self.none_test(test.func)) is not None \
                and (decided := self.is_none(test.args[0].value)) is not None:
            return None, decided is none_test  # `exists(labels)`: a helper that is `v is not None`
        if type(test) is cst.Comparison and len(test.comparisons) == 1:
            comp = test.comparisons[0]
            if isinstance(comp.operator, (cst.Is, cst.IsNot)) and last_name(comp.comparator) == "None":
                decided = self.is_none(test.left)
                if decided is not None and isinstance(comp.operator, cst.IsNot):
                    decided = not decided
                return None, decided
            left, right = test.left, comp.comparator
            strings = string_literals(right) or string_literals(left)
            subject = left if string_literals(right) else right
            if strings and isinstance(comp.operator, (cst.Equal, cst.In, cst.NotEqual, cst.NotIn)):
                facts = self.expr(subject)
                known = [f.text for f in facts if f.role == "str" and f.text is not None]
                name = next((f.name for f in facts if f.role == "str" and f.name), last_name(subject))
                negate = isinstance(comp.operator, (cst.NotEqual, cst.NotIn))
                if subject is right and isinstance(comp.operator, (cst.In, cst.NotIn)) and not any(
                        f.role == "str" for f in facts):
                    # `"ref_log_prob" in data.batch.keys()`: whether a container holds a key, a switch of its own
                    container = dotted(right) or cst.Module(body=[]).code_for_node(right)
                    return (f'"{strings[0]}" in {container}', (not negate,)), None
                # a value the analysis cannot see beside a known one (`cfg.get("kl_type", "unbias")`) keeps
                # the comparison a switch
                if known and not any(f.role == "str" and f.text is None for f in facts):
                    hit = any(k in strings for k in known)
                    return None, (not hit if negate else hit)
                ran = self.run_values(subject)
                if ran is not None and (ran <= set(strings) or not ran & set(strings)):
                    hit = ran <= set(strings)  # every run takes the branch, or none does
                    return None, (not hit if negate else hit)
                values = spelled(facts, tuple(strings))
                if negate and values:
                    values = negated(values) or ()
                return (None if not values else (name, values)), None
            number = number_value(right) if number_value(left) is None else None
            setting = self.switch_name(left) if number is not None else ""
            if setting and self.measured(left):
                # `b, t = ids.shape; if t > 1:` a value of the data, no setting: its label keeps the paths of one run
                # together (two calls of a helper that tests it take the same side) but is not shown as a switch
                setting = measured_label(setting)
            if setting and type(comp.operator) in (cst.Equal, cst.NotEqual):
                # `if weight == 0:` selects a setting like a flag: its branches exclude each other
                return (f"{setting} == {number:g}", (type(comp.operator) is cst.Equal,)), None
            if setting and type(comp.operator) in _ORDER:
                # `if pp_size > 1:` the same: one side of a threshold
                return (f"{setting} {_ORDER[type(comp.operator)]} {number:g}", (True,)), None
            if number is not None:
                return None, None  # `len(responses) == 0`, `(step + 1) % k == 0`: a computed value, no setting
            if isinstance(comp.operator, cst.Equal) and isinstance(right, cst.Attribute) and right.attr.value.isupper():
                # `if loss_type == LossType.TOKEN_LEVEL:` (an enum member or a constant): the same
                return (f"{last_name(left)} == {dotted(right)}", (True,)), None
            return None, None
        if type(test) is cst.Call and type(test.func) is cst.Attribute and test.func.attr.value in ("endswith", "startswith"):
            strings = string_literals(test.args[0].value) if test.args else None
            facts = self.expr(test.func.value)
            known = [f.text for f in facts if f.role == "str" and f.text is not None]
            if strings and known:
                method = test.func.attr.value
                return None, any(getattr(k, method)(tuple(strings)) for k in known)
            name = next((f.name for f in facts if f.name), last_name(test.func.value))
            if strings:
                return (name, tuple(f"*{s}" for s in strings)), None
            return None, None
        if isinstance(test, (cst.Name, cst.Attribute)):
            facts = self.expr(test)
            if any(f.role in ("tensor", "tuple", "dict") for f in facts):
                return None, None  # a tensor's truth, or whether a list holds anything (`if kl_terms`): no setting
            known = [f.text for f in facts if f.role == "bool" and f.text is not None]
            # a flag read with a default (`getattr(cfg, "x", False) if cfg else False`) is known only
            # in the default's branch: an unexplained alternative leaves it a switch
            if known and not any(f.role == UNKNOWN.role for f in facts):
                return None, known[0] == "True"
            name = last_name(test)
            if name in ("True", "False"):
                return None, name == "True"
            return (self.switch_name(test), (True,)), None
        return None, None

    def run_values(self, subject: cst.BaseExpression) -> frozenset[str] | None:
        """The values a read of a project's option (`args.kl_approximator`, `self.args.kl_approximator`; not an
        instance's own `self.kl_type`) has in the runs the project shows (klaudit.frameworks.options.Options.run_values)."""
        if type(subject) is not cst.Attribute or type(subject.value) is cst.Name and subject.value.value == "self":
            return None
        return self.module.project.options.run_values(subject.attr.value, self.module.path)

    def holding(self, test: cst.BaseExpression) -> tuple:
        """The labels that hold where an undecided `test` is true, as far as labels can say: its own label,
        or for `a and b` those of each side (`kl_estimator == "k2" and k2_mode == "theta_over_ref"`)."""
        label, decided = self.condition(test)
        if decided is not None:
            return ()
        if label is not None:
            return (label,)
        if type(test) is cst.BooleanOperation and type(test.operator) is cst.And:
            return self.holding(test.left) + self.holding(test.right)
        return ()

    def negation(self, test: cst.BaseExpression) -> tuple:
        """Switch values that hold where `test` is false, as far as they can be written as labels:
        `if not flag: return` leaves flag True below, `if not x.endswith("+"): return` the suffixed values."""
        if isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.Or):
            return self.negation(test.left) + self.negation(test.right)
        label, decided = self.condition(test)
        return where_false(label) if decided is None else ()

    def switch_name(self, node: cst.BaseExpression) -> str:
        """The name a switch's labels use: the one its value carries from where it was read (a caller's
        `config.kl_type` passed as `kind`), else its own."""
        return next((f.name for f in self.expr(node) if f.role in ("str", "bool") and f.name), "") or last_name(node)

    def none_test(self, func: cst.BaseExpression) -> bool | None:
        """For a function of this module whose body is `return v is None` (True) or `return v is not None`
        (False, lucidrains' `exists`) of its one parameter: which; else None."""
        if type(func) is not cst.Name or func.value not in self.module.functions:
            return None
        definition = self.module.functions[func.value]
        parameters = definition.params.params
        body = definition.body.body  # statements, or the small statements of a one-line `def f(v): return ...`
        line = body[0] if len(body) == 1 else None
        returned = line.body[0] if isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1 else line
        if len(parameters) != 1 or type(returned) is not cst.Return or type(returned.value) is not cst.Comparison:
            return None
        test = returned.value
        comp = test.comparisons[0] if len(test.comparisons) == 1 else None
        if comp is None or last_name(comp.comparator) != "None" or last_name(test.left) != parameters[0].name.value:
            return None
        return {cst.Is: True, cst.IsNot: False}.get(type(comp.operator))

    def is_none(self, node: cst.BaseExpression) -> bool | None:
        """Whether `node` holds None, when its facts decide it (an argument left at a None default,
        or given a value): `if dim is None:` in a helper, decided by the call."""
        facts = self.expr(node)
        if not facts:
            return None
        nones = [f.role == "none" for f in facts]
        return True if all(nones) else (False if not any(nones) else None)


_THRESHOLD = re.compile(r"^(\w+) (==|>|>=|<|<=) (-?\d+(?:\.\d+)?)$")
_COMPARE = {"==": operator.eq, ">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le}


def threshold_setting(name: str) -> str | None:
    """The setting a label of a numeric test names (`num_iterations` of `num_iterations > 1`); None for another
    kind of label."""
    found = _THRESHOLD.match(name)
    return found.group(1) if found else None


def threshold_holds(label: Label, value: float) -> bool | None:
    """Whether the path labelled `label`, a numeric test of a setting (`("num_iterations > 1", (True,))`), runs
    where that setting is `value`; None for a label of another kind."""
    found = _THRESHOLD.match(label[0])
    if found is None:
        return None
    return _COMPARE[found.group(2)](value, float(found.group(3))) in label[1]


def where_false(label: Label | None) -> tuple:
    """The labels that hold where the test labelled `label` is false: () where labels cannot say it
    (the values other than some literals)."""
    if label is None:
        return ()
    values = negated(label[1])
    return ((label[0], values),) if values is not None else ()


def _either(left: Label | None, right: Label | None) -> Label | None:
    """The label of `a or b` for tests of one switch: the union of their literals or patterns, or a negated
    pattern that the other side's literals all take (`not kind.endswith("+") or kind in ("k2", "mse")`)."""
    if left is None or right is None or left[0] != right[0]:
        return None
    for one, other in ((left[1], right[1]), (right[1], left[1])):
        if all(is_negated_pattern(v) for v in one) and all(not is_pattern(v) and not is_negated_pattern(v)
                                                            and takes(v, one) for v in other):
            return left[0], one
    kinds = {(is_pattern(v), is_negated_pattern(v), is_excluded(v)) for v in left[1] + right[1]}
    return (left[0], tuple(dict.fromkeys(left[1] + right[1]))) if len(kinds) == 1 and kinds <= {
        (False, False, False), (True, False, False)} else None


def spelled(facts: tuple, strings: tuple) -> tuple:
    """The switch values that make an alternative of `facts` equal one of `strings`: the strings, or, for
    the switch with its end cut off under an endswith test (`kind[:-1]` where `kind.endswith("+")`), the
    strings with that end put back (`kind[:-1] == "k3"` is `kind == "k3+"`); none where the cut is unknown."""
    out: list = []
    for f in operands(facts):
        if f.role != "str" or not f.cut:
            out += strings
            continue
        ends = [v[1:] for name, values in f.labels if name == f.name for v in values
                if is_pattern(v) and len(v) - 1 == f.cut]
        out += [string + end for string in strings for end in ends]
    return tuple(dict.fromkeys(out))
