"""The defaults a project gives its own options, for a framework keyword set from one of them.

`GRPOConfig(beta=args.beta)` is common in training scripts, with `beta` an option of the project's
own: `parser.add_argument("--beta", type=float, default=0.04)`, or `beta: float = 0.04` in a
dataclass that a parser fills. A run that leaves the option alone trains with its default, so the
keyword is judged at that value, as a key left out is judged at the framework's default. The same
holds for a keyword set to a parameter of the enclosing function (`def train(beta=0.04)`), unless
the function assigns the name itself.

The options are read from the text of every linted Python file, without parsing it: an option
given different defaults in different places (two scripts, two dataclasses) has none.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

# A literal as klaudit.frameworks.calls reads it: a number, a one-line string, True/False/None.
_LITERAL = r"""(-?(?:\d[\d_]*\.?[\d_]*|\.\d[\d_]*)(?:[eE][-+]?\d+)?|"[^"\\\n]*"|'[^'\\\n]*'|True|False|None)"""
# parser.add_argument("-b", "--beta", type=float, default=0.04, help="...") on any number of lines
_ADD_ARGUMENT = re.compile(r"""\badd_argument\(\s*(?:["']-\w["']\s*,\s*)?["']--([\w-]+)["']([^()]*(?:\([^()]*\)[^()]*)*)\)""")
_DEFAULT = re.compile(rf"\bdefault\s*=\s*{_LITERAL}\s*(?:[,)]|$)")
# a class-level annotated field: `beta: float = 0.04` or `beta: float = field(default=0.04, ...)`
_FIELD = re.compile(rf"^[ \t]+(\w+)[ \t]*:[^=\n]+=[ \t]*(?:field\([^)\n]*?\bdefault[ \t]*=[ \t]*)?{_LITERAL}[ \t]*[,)#\n]",
                    re.MULTILINE)


@dataclass(frozen=True)
class Default:
    value: str  # as klaudit.frameworks.calls reads a literal: a string without its quotes
    origin: str  # where it is given, for the message


def option_defaults(sources: Mapping[str, str]) -> dict[str, Default]:
    """The options of the project's command lines and dataclasses that have one literal default, by name
    (`--kl-coef` as `kl_coef`, the attribute an argparse namespace gives it)."""
    found: dict[str, set[str]] = {}
    first: dict[str, str] = {}
    for path, text in sorted(sources.items()):
        given: list[tuple[str, str, int]] = []
        if "add_argument" in text:
            for match in _ADD_ARGUMENT.finditer(text):
                default = _DEFAULT.search(match.group(2))
                if default is not None:
                    given.append((match.group(1).replace("-", "_"), default.group(1), match.start()))
        if "dataclass" in text:
            given += [(match.group(1), match.group(2), match.start(1)) for match in _FIELD.finditer(text)]
        for name, literal, offset in given:
            found.setdefault(name, set()).add(_value(literal))
            first.setdefault(name, f"{path}:{text.count(chr(10), 0, offset) + 1}")
    return {name: Default(next(iter(values)), first[name]) for name, values in found.items() if len(values) == 1}


def _value(literal: str) -> str:
    """The literal as klaudit.frameworks.calls gives it: a string's content, a number without underscores."""
    return literal[1:-1] if literal[0] in "\"'" else literal.replace("_", "")


def bindings(parameters: Mapping[str, str | None], assigned: Collection[str]) -> dict[str, str | None]:
    """The names a function binds: each parameter's literal default (None where it has none), and None for
    every name its body assigns, which hides a parameter's default and an enclosing function's name."""
    return {**parameters, **dict.fromkeys(assigned)}


def visible(functions: Iterable[Mapping[str, str | None]]) -> dict[str, str]:
    """The parameter defaults seen inside the last of nested `functions` (outermost first, each as
    `bindings` gives it): a name bound by an inner function hides the outer one's."""
    seen: dict[str, str | None] = {}
    for bound in functions:
        seen.update(bound)
    return {name: value for name, value in seen.items() if value is not None}


def resolve(written: str, parameters: Mapping[str, str], options: Mapping[str, Default]) -> Default | None:
    """The default a keyword set to `written` (a name, or a dotted attribute) has: the literal default of
    the enclosing function's parameter of that name (`parameters`, those the function never reassigns), or
    the project's option named like the last attribute (`args.beta`, `self.args.beta`); None otherwise."""
    if written.isidentifier():
        value = parameters.get(written)
        return None if value is None else Default(value, f"the default of parameter {written}")
    head, _, attribute = written.rpartition(".")
    if head and attribute.isidentifier() and all(part.isidentifier() for part in head.split(".")):
        option = options.get(attribute)
        return None if option is None else Default(option.value, f"the default of {attribute} at {option.origin}")
    return None
