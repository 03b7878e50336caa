"""Containers in the flow analysis: what iterating a value yields, and what zip/enumerate make.

A list or tuple literal is a fact of role "tuple" whose items are the facts of each position; a
list built by a comprehension is the facts of its element (a list of per-token terms stacked,
summed or indexed keeps the meaning of one element). Iterating a tensor yields its rows, which
keep its meaning; iterating `zip(a, b)` yields pairs of the elements of a and b.
"""

from __future__ import annotations

from klaudit.lint.facts import Fact


def elements(value: tuple) -> tuple:
    """The facts of one element of an iterable holding `value`."""
    out: list = []
    for f in value:
        if f.role == "tuple":
            for item in f.items:
                out.extend(item)
        elif f.role in ("tensor", "mask"):
            out.append(f)
    return tuple(dict.fromkeys(out))


def zipped(arguments: list) -> tuple:
    """zip(a, b, ...): a list whose element is the tuple (element of a, element of b, ...)."""
    pair = Fact(role="tuple", items=tuple(elements(value) for value in arguments))
    return (Fact(role="tuple", items=((pair,),)),)


def enumerated(value: tuple) -> tuple:
    """enumerate(a): a list whose element is the tuple (index, element of a)."""
    return zipped([(), value])
