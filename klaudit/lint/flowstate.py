"""The state of one interpretation of a function body, shared by the parts of the interpreter.

klaudit.lint.flow.FunctionRun is assembled from parts, each a mixin over `FlowState` with one job:
statements (klaudit.lint.statements), assignments (assignments), `if` tests (conditions),
expressions (expressions), operators (arithmetic), calls (calls), library functions (library),
reductions (reductions), sinks and the use of each KL term (sinks), string-keyed containers
(containers) and functions held as values (callables). `FlowState` holds what they share, and
declares for the type checker the methods one part calls on another.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from klaudit.lint import roles
from klaudit.lint.facts import Fact, Sink
from klaudit.lint.kinds import SinkKind
from klaudit.lint.syntax import (
    decorated_no_grad,
    detached_entries,
    encodes_one_text,
    measured_names,
    overwritten_assignments,
    python_number_names,
    reads_a_measure,
    token_id_names,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from klaudit.lint.modules import Analyzer, Module

# (switch name, the values of the switch it holds for): the condition an alternative holds under
Label = tuple
# (label, decided): the switch value an `if` test selects, and the test's truth when it is known
Test = tuple[Label | None, bool | None]


class FlowState:
    """What one interpretation of `func` (a method of `cls` when that is given) knows so far."""

    def __init__(self, analyzer: Analyzer, module: Module, func: cst.FunctionDef, cls: str | None,
                 env: dict, record: bool):
        self.analyzer = analyzer
        self.module = module
        self.func = func
        self.cls = cls
        self.env: dict[str, tuple] = dict(env)  # variable, attribute or key path -> its facts
        self.record = record  # whether sinks and the evidence for fixes are recorded
        self.labels: tuple = ()  # the switch values under which the current statement runs
        self._memo: dict[int, tuple] = {}  # id(expression) -> its facts, for the current statement
        self.stmt: cst.CSTNode | None = None  # the statement being interpreted
        self.no_grad = decorated_no_grad(func)  # inside `torch.no_grad()`: new tensors have no gradient
        self.reverse_loop: dict[int, cst.For | cst.While] = {}  # the reversed loops being run (`for t in reversed(...)`), by id
        self.loop_variables: list[frozenset[str]] = []  # the names each `for` being run binds, innermost last
        # of each `for` being run, the variable counting the sequences -> whether it picks one by itself (`x[i]`)
        self.batch_indices: list[dict[str, bool]] = []
        self.position_indices: list[frozenset[str]] = []  # of each `for` being run, the variable counting positions
        self.one_sequence_loops = 0  # how many loops being run handle one sequence a pass (`for traj in trajs:`)
        self.running_loops: list[cst.For | cst.While] = []  # the loops being run, innermost last
        self.returns: list = []
        self.sinks: list[Sink] = []
        self.waiting: dict[cst.CSTNode, Sink] = {}  # reward-named assignment -> its Sink, until the value is seen to reach a reward
        self.loss_parts: dict[cst.CSTNode, Sink] = {}  # loss-named assignment -> its Sink, unless a later loss takes the term on
        self.confirmed: set[cst.CSTNode] = set()
        self.sink_count = 0  # sinks and reward candidates in execution order
        self.formed: dict = {}  # origin -> a KL term formed in this function and stored in a variable
        self.settled: set = set()  # origins whose use is known: a sink, a return, a metric, a later term
        self.read: set = set()  # origins of the KL terms the current statement reads
        self.compared: list = []  # the labels of the calls so far given the policy's and the behaviour policy's log-probs
        self.reused = False  # inside a loop of several optimizer steps on samples drawn before it (update_loops)
        self.caller_on_fresh_samples = False  # called from a step on samples just drawn (SinkFlow.on_fresh_samples)
        name = func.name.value
        self.loss_function = roles.is_loss_function(name) or (
            name in ("forward", "__call__") and cls is not None and roles.is_loss_function(cls)
        )
        self._detached_entries: frozenset[tuple[str, str]] | None = None
        self._overwritten: frozenset[cst.Assign] | None = None
        self._measured: frozenset[str] | None = None
        self._numbers: frozenset[str] | None = None
        self._token_ids: frozenset[str] | None = None

    def detached_entries(self) -> frozenset[tuple[str, str]]:
        """(container, key) of the entries the function detaches somewhere (klaudit.lint.syntax.detached_entries)."""
        if self._detached_entries is None:
            self._detached_entries = detached_entries(self.func)
        return self._detached_entries

    def overwritten(self) -> frozenset[cst.Assign]:
        """The function's assignments replaced before anything reads them (klaudit.lint.syntax.overwritten_assignments)."""
        if self._overwritten is None:
            self._overwritten = overwritten_assignments(self.func)
        return self._overwritten

    def python_numbers(self) -> frozenset[str]:
        """The function's names bound only to Python numbers (klaudit.lint.syntax.python_number_names)."""
        if self._numbers is None:
            self._numbers = python_number_names(self.func)
        return self._numbers

    def token_ids(self) -> frozenset[str]:
        """The function's names bound only to token ids kept as they are (klaudit.lint.syntax.token_id_names)."""
        if self._token_ids is None:
            self._token_ids = token_id_names(self.func)
        return self._token_ids

    def one_sequence_at_a_time(self) -> bool:
        """Whether the statement being run handles one sequence: in a loop over the drawn samples one by one, in a
        function that encodes one text at a time (klaudit.lint.syntax.encodes_one_text: its tensors a batch of one), or
        in a helper every caller in the module calls so."""
        return (bool(self.one_sequence_loops) or encodes_one_text(self.func.body)
                or self.module.called_on_one_sequence(self.func))

    def one_text_at_a_time(self) -> bool:
        """Whether the statement being run has its tensors from one text, a batch of one (`[1, L, V]`): in a loop, or a
        function, that encodes one text at a time (klaudit.lint.syntax.encodes_one_text)."""
        return any(encodes_one_text(loop.body) for loop in self.running_loops) or encodes_one_text(self.func.body)

    def measured(self, node: cst.BaseExpression) -> bool:
        """Whether a compared value is computed from the data (`x.shape[0]`, a name bound by
        klaudit.lint.syntax.measured_names) rather than read from a setting."""
        if self._measured is None:
            self._measured = measured_names(self.func)
        return reads_a_measure(node) or type(node) is cst.Name and node.value in self._measured

    if TYPE_CHECKING:
        # statements, klaudit.lint.flow
        def block(self, body: cst.BaseSuite) -> None: ...
        def define(self, func: cst.FunctionDef) -> None: ...

        # assignments
        def assign_target(self, target: cst.CSTNode, value: tuple, node: cst.CSTNode | None = None,
                          rhs: cst.CSTNode | None = None, augmented: bool = False) -> None: ...
        def loop_carried(self, small: cst.Assign | cst.AugAssign) -> tuple: ...
        def from_name(self, name: str, rhs: cst.CSTNode) -> tuple: ...

        # conditions
        def condition(self, test: cst.BaseExpression) -> Test: ...
        def holding(self, test: cst.BaseExpression) -> tuple: ...
        def negation(self, test: cst.BaseExpression) -> tuple: ...
        def none_test(self, func: cst.BaseExpression) -> bool | None: ...
        def switch_name(self, node: cst.BaseExpression) -> str: ...

        # expressions and operators
        def expr(self, node: cst.BaseExpression) -> tuple: ...
        def binary(self, left: tuple, right: tuple, op: cst.CSTNode, node: cst.CSTNode) -> tuple: ...
        def additive(self, left: tuple, right: tuple, sign: float, node: cst.CSTNode) -> tuple: ...
        def multiply(self, left: tuple, right: tuple, node: cst.CSTNode) -> tuple: ...
        def square(self, value: tuple, node: cst.CSTNode) -> tuple: ...
        def divide(self, left: tuple, right: tuple, node: cst.CSTNode) -> tuple: ...

        # calls, library functions and reductions
        def args(self, node: cst.Call) -> tuple[list, dict]: ...
        def library_call(self, name: str, node: cst.Call) -> tuple: ...
        def tensor_method(self, method: str, base: tuple, positional: list, keywords: dict,
                          node: cst.Call) -> tuple: ...
        def unary_math(self, fn: str, base: tuple, node: cst.CSTNode) -> tuple: ...
        def dim(self, node: cst.BaseExpression | None) -> bool | None: ...
        def along_each_axis(self, base: tuple, dim_node: cst.BaseExpression | None, reduce: Callable) -> tuple: ...
        def reduce(self, base: tuple, method: str, per_row: bool | None, node: cst.CSTNode) -> tuple: ...
        def aggregate(self, name: str, first: tuple, positional: list, keywords: dict) -> tuple: ...

        # sinks and the use of each KL term
        def here(self, node: cst.CSTNode) -> cst.CSTNode: ...
        def sink(self, kind: SinkKind, value: tuple, node: cst.CSTNode, via: Sink | None = None) -> tuple: ...
        def on_fresh_samples(self) -> bool: ...
        def reward_candidate(self, value: tuple, node: cst.CSTNode) -> tuple: ...
        def loss_candidate(self, value: tuple, node: cst.CSTNode) -> tuple: ...
        def note_comparison(self, node: cst.Call) -> None: ...
        def confirm(self, value: tuple) -> None: ...
        def hand_on(self, value: tuple) -> None: ...
        def settle(self, value: tuple) -> None: ...
        def note_read(self, value: tuple) -> tuple: ...
        def track(self, value: tuple) -> None: ...

        # containers and functions held as values
        def store_key(self, target: cst.Subscript, key: str, value: tuple) -> None: ...
        def collect(self, slot: str, value: tuple) -> None: ...
        def stored(self, slot: str) -> tuple: ...
        def read_key(self, base_node: cst.BaseExpression, key: str) -> tuple | None: ...
        def read_get(self, base_node: cst.BaseExpression, key: str, default: cst.BaseExpression | None) -> tuple: ...
        def named_entry(self, base_node: cst.BaseExpression, key: str, grad: bool) -> tuple: ...
        def add_to_list(self, target: cst.BaseExpression, method: str, arg: cst.BaseExpression,
                        node: cst.Call) -> None: ...
        def dispatch(self, node: cst.Subscript) -> tuple | None: ...
        def build_record(self, fields: list, positional: list, keywords: dict) -> tuple: ...
        def callable_values(self, func: cst.BaseExpression) -> list: ...
        def held_by(self, func: cst.BaseExpression) -> tuple: ...
        def loss_module_call(self, module: Fact, node: cst.Call) -> tuple: ...
        def module_value(self, name: str, called: bool = False) -> tuple: ...
        def partial(self, node: cst.Call) -> tuple: ...
        def instance(self, module: Module, classdef: cst.ClassDef, node: cst.Call) -> tuple: ...
