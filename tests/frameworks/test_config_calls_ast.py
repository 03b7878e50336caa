"""Configuration calls read from Python's own tree are the ones LibCST's positions give: the same
names, keyword values and positions, whatever the spelling of the call (klaudit.frameworks.calls)."""

from __future__ import annotations

import libcst
import pytest

from klaudit.frameworks import calls, trl

CONFIGS = '''\
"""Usage: `GRPOConfig(beta=0.1)` (a docstring names it; it is not a call)."""
from trl import GRPOConfig
import trl

x = "é"; c = GRPOConfig(beta=0.04, loss_type = "grpo", num_iterations=1_000, lr=-1e-3, a=0x1F, s=("a" "b"), f=f"x")
if True:
    d = trl.GRPOConfig(
        beta=0.1,  # comment
        **kwargs,
        loss_type=("dr_grpo"),
    )
(GRPOConfig)(beta=2, t=True, n=None, j=1j, e=..., neg=-(-2), by=b"x")
def f(a=GRPOConfig(beta=5)):
    return [GRPOConfig  # a comment between the name and its arguments
            (beta="""two
lines""", k=r"\\d")]
'''


def _with_libcst(source: str):
    reader = calls._Reader(frozenset(trl.CONFIG_CLASSES), tuple(trl.KEYS), "t.py")
    libcst.MetadataWrapper(libcst.parse_module(source), unsafe_skip_copy=True).visit(reader)
    return reader.calls


@pytest.mark.parametrize("newline", ["\n", "\r\n"])
def test_calls_read_from_pythons_tree_are_those_libcsts_positions_give(newline):
    source = CONFIGS.replace("\n", newline)
    from_python = calls._python_calls(source, frozenset(trl.CONFIG_CLASSES), tuple(trl.KEYS))
    assert from_python is not None and len(from_python) == 5
    order = lambda call: (call.where.line, call.where.column)  # noqa: E731
    assert sorted(from_python, key=order) == sorted(_with_libcst(source), key=order)


def test_a_module_that_defines_a_configuration_class_is_read_by_libcst():
    source = "from trl import GRPOConfig\n\n\nclass Mine(GRPOConfig):\n    beta: float = 0.0\n\n\nc = Mine(beta=0.1)\n"
    found, definitions = calls.read_configs(libcst.parse_module(source), {"GRPOConfig", "Mine"}, trl.KEYS, "t.py",
                                            source)
    assert [d.name for d in definitions] == ["Mine"] and definitions[0].fields["beta"].value == "0.0"
    assert [(c.name, c.settings["beta"].value) for c in found] == [("Mine", "0.1")]
