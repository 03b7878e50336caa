"""Update loops: a loop that takes several optimizer steps on samples drawn before it.

`for inner in range(K): loss = pg + beta * kl; loss.backward(); optimizer.step()`, with the completions and
the reference's log-probs computed once before the loop, trains every step after the first on samples of an
older policy (kl-math.md section 8, rows 22 and 23), whether or not the code forms a ratio to them. Read
from the loop's text alone, and only where nothing in the loop could draw new samples: it generates nothing
(no call named like a generation or a rollout), takes no `next(...)` batch of an iterator, and computes no
reference log-probs (which are recomputed for each new batch of samples).

The converse, `steps_on_fresh_samples`: a function whose every optimizer step is the first on samples drawn
since the step before (one step per rollout) trains on the policy that drew them, and a PPO ratio in it, to
the rollout's own log-probs, is 1 and no sign of older samples (row 22 needs an earlier step in between).

And `trained_by_a_later_loop`: what a function that draws the samples computes (a KL reward made in
`make_experience`) is trained by the loop of several steps its single caller runs after the call.
"""

from __future__ import annotations

import functools
import io
import re
import tokenize
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import libcst as cst

from klaudit.frameworks.options import configured_values, option_defaults
from klaudit.lint import roles
from klaudit.lint.conditions import threshold_holds, threshold_setting
from klaudit.lint.facts import Labels
from klaudit.lint.pinned import given_literal_ints, written_out
from klaudit.lint.project import Project, python_files
from klaudit.lint.syntax import (
    SCOPES,
    child_nodes,
    dotted,
    encodes_one_text,
    functions_and_methods,
    handles_one_sequence,
    int_literal,
    is_test,
    last_name,
    name_bindings,
    one_sample_at_a_time,
    own_nodes,
    params,
    statement_nodes,
    walk,
)


@dataclass(frozen=True)
class Beyond:
    """What may set a loop's count outside the module's code: the linted YAML files (`configs`), the linted
    modules the module imports a class from (`class_sources`), whose fields' defaults a count may read, and the calls
    other modules make of one of the module's functions, by its name (`callers`: None where they are more than the
    text shows), which may pass a count its parameter defaults otherwise; and whether some module of the project
    passes a field of its classes by keyword (`passed(name, classes)`: `Config(num_iterations=cfg.train.mu)` of a
    field `Config` defaults to 1)."""

    configs: tuple[str, ...] = ()
    class_sources: tuple[cst.Module, ...] = ()
    callers: Callable[[str], tuple[cst.Call, ...] | None] | None = None
    passed: Callable[[str, frozenset[str]], bool] | None = None


def reuses_samples(loop: cst.For | cst.While, module: cst.Module,
                   methods: dict[str, cst.FunctionDef] | None = None, beyond: Beyond | None = None) -> bool:
    """Whether `loop` is `for ... in range(n)` (n not 1) whose body takes an optimizer step and draws no samples: each
    step after the first trains on the samples of an older policy, whatever the body recomputes on them (the
    reference's log-probs of the same completions, karinazad/nano-rlvr's `kl_penalty(logps, ref_model, ...)` in
    each of its two epochs, are no new samples). A count
    read from a setting (`range(args.num_ppo_epochs)`) that the classes of `module` default to 1 is one round, unless
    one of the linted YAML files of `beyond` sets it to more (`grpo_epochs: 4` in the run's configuration); the
    classes of the modules `module` imports a class from (`beyond.class_sources`) count where its own give no
    default. The
    step may be taken by a method of the loop's class, `methods`, or a function of `module` that the body calls
    (legacy TRL's `self.train_minibatch(...)` in `for _ in range(self.config.ppo_epochs)`, a script's
    `train_step(batch)`)."""
    if not isinstance(loop, cst.For):
        return False
    rounds = _several_rounds(loop.iter, module, beyond) or one_sample_at_a_time(loop)
    if not rounds and type(loop.iter) not in (cst.Call, cst.Name):
        return False
    steps = False
    draws = _drawing(methods, module, CallIndex())
    for node in own_nodes(loop.body):
        if type(node) is cst.Call:
            name = last_name(node.func) or ""
            if _is_step(node) or _steps_in_callee(node, methods, module):
                steps = True
            elif draws(node) or name == "next" and type(node.func) is cst.Name:
                return False  # a generation or a rollout, here or in a function it calls that takes no step
                # (viralcode/superGPT's `grpo_step`, sampling with torch.multinomial), or the next batch of a data
                # iterator; not a draw from a buffer of earlier rollouts (navidmdn/LLM_RL's `self.buffer.sample`)
    return steps and (rounds or _rounds_listed(loop.iter, module, beyond))


def _steps_in_callee(call: cst.Call, methods: dict[str, cst.FunctionDef] | None, module: cst.Module) -> bool:
    """`self.name(...)` of a method of `methods`, or `name(...)` of a function of `module`, that steps an optimizer
    and draws no samples of its own (legacy TRL's `train_minibatch`, not a `train_step` that generates before it
    steps)."""
    callee = _callee(call, methods, module)
    if callee is None:
        return False
    calls = ordered_calls(callee)
    return takes_a_step(calls) and not any(_named_as_draw(inner) or _generates(inner) for inner, _ in calls)


def _several_rounds(iterated: cst.BaseExpression, module: cst.Module, beyond: Beyond | None = None) -> bool:
    """`range(k)` (or `trange(k)`, `tqdm(range(k))`) with k not the literal 1, nor a setting the module's classes all
    default to 1 (else those of the modules `beyond.class_sources` all do) and no YAML file of `beyond` sets to
    another number. A mini-batch loop, `range(start, stop, step)`, is left out: how many batches it makes is the batch
    sizes' (often one)."""
    if type(iterated) is cst.Call and last_name(iterated.func) == "tqdm" and iterated.args:
        iterated = iterated.args[0].value  # a progress bar over the rounds: `tqdm(range(n))`
    if type(iterated) is not cst.Call or dotted(iterated.func) not in ("range", "trange") or len(iterated.args) != 1:
        return False
    count = iterated.args[0].value
    literal = int_literal(count)
    if literal is None and type(count) is cst.Attribute:
        return settled_setting(count.attr.value, module, beyond) not in (0, 1)
    elif literal is None and type(count) is cst.Name:  # `def train(..., ppo_epochs=1)`, its callers leaving it
        literal = _parameter_default(module, count.value, beyond)
        if literal is None:  # `mu_iterations = 1` at the top of a script
            literal = _module_constant(module, count.value)
    return literal not in (0, 1)


def _rounds_listed(iterated: cst.BaseExpression, module: cst.Module, beyond: Beyond | None = None) -> bool:
    """`memory.get_minibatches()` of a method of the module's classes that returns a list it fills in a loop of
    several rounds (`for _ in range(self.args.batches_per_learning_phase): ... minibatches.append(...)`, ARENA's
    replay memory): every sample of the memory comes up once per round, so the loop over the list visits each
    more than once, whatever the mini-batch size. The list may be bound to a name first (`mbs =
    memory.get_minibatches()`, then `for mb in mbs:`), where every binding of the name in the function is that call."""
    functions = [func for func, _ in functions_and_methods(module)]
    if type(iterated) is cst.Name:
        scope = next((func for func in functions if any(node is iterated for node in walk(func.body))), module)
        bound = name_bindings(scope).get(iterated.value, [])
        values = {cst.Module([]).code_for_node(value) if type(value) is cst.Call else None for _, value in bound}
        if len(values) != 1 or None in values:
            return False
        iterated = bound[0][1]  # type: ignore[assignment]
    if type(iterated) is not cst.Call or type(iterated.func) is not cst.Attribute:
        return False
    name = iterated.func.attr.value
    methods = [func for func in functions if func.name.value == name]
    return len(methods) == 1 and any(
        type(node) is cst.For and _several_rounds(node.iter, module, beyond) and _appends_to_returned(node, methods[0])
        for node in walk(methods[0].body))


def _appends_to_returned(loop: cst.For, method: cst.FunctionDef) -> bool:
    """Whether `loop` appends to a list the method returns by name (`minibatches.append(...)`, `return minibatches`)."""
    returned = {node.value.value for node in walk(method.body) if type(node) is cst.Return
                and node.value is not None and type(node.value) is cst.Name}
    return any(type(node) is cst.Call and type(node.func) is cst.Attribute and node.func.attr.value == "append"
               and type(node.func.value) is cst.Name and node.func.value.value in returned for node in walk(loop.body))


def settled_setting(name: str, module: cst.Module, beyond: Beyond | None = None) -> int | None:
    """The integer a count read as a setting (`self.args.num_iterations`) is left at: the default the classes of
    `module` all give it (else those of the modules `beyond.class_sources` all do), where no YAML file of `beyond`
    sets it to more than 1 and no call of the project passes it by keyword (`beyond.passed`); None where that is not
    known. A loop `range` of it and a test of it (`if self.args.num_iterations > 1:`) read the same value."""
    literal, owners = _field_default(module, name), _field_classes(module, name)
    if literal is None and beyond is not None:
        imported = {_field_default(source, name) for source in beyond.class_sources} - {None}
        literal = imported.pop() if len(imported) == 1 else None
        owners = frozenset(owner for source in beyond.class_sources for owner in _field_classes(source, name))
    configs = beyond.configs if beyond is not None else ()
    if literal is not None and any(value.isdigit() and int(value) > 1 for value in configured_values(configs, name)):
        return None
    if literal is not None and beyond is not None and beyond.passed is not None and beyond.passed(name, owners):
        return None  # a call of the class gives the field more (eth-lre's `num_iterations=cfg.train.mu`, 2 in its YAML)
    return literal


def _field_classes(module: cst.Module, name: str) -> frozenset[str]:
    """The classes of `module` that declare the setting `name` as a field or class attribute."""
    return frozenset(owner for owner, _ in _class_fields(module, name))


def _class_fields(module: cst.Module, name: str) -> Iterator[tuple[str, cst.BaseExpression | None]]:
    """(the class, the value written) of each field (`num_ppo_epochs: int = 1`, `= field(default=1)`) or plain class
    attribute (`num_iterations = 1`) named `name` of the classes of `module`."""
    for stmt in (stmt for stmt in module.body if isinstance(stmt, cst.ClassDef)):
        for line in stmt.body.body:
            small = line.body[0] if isinstance(line, cst.SimpleStatementLine) and line.body else None
            if isinstance(small, cst.AnnAssign) and type(small.target) is cst.Name and small.target.value == name:
                yield stmt.name.value, small.value
            elif isinstance(small, cst.Assign) and len(small.targets) == 1 \
                    and type(target := small.targets[0].target) is cst.Name and target.value == name:
                yield stmt.name.value, small.value


def never_runs_on(labels: Labels, module: cst.Module, beyond: Beyond | None = None) -> bool:
    """Whether a path labelled `labels` tests a count that the settings of `module` leave at a value that rules it
    out (`num_iterations > 1` where its classes default num_iterations to 1 and no YAML file sets more:
    `settled_setting`), as a loop `range(num_iterations)` is then read as one round."""
    for label in labels:
        setting = threshold_setting(label[0])
        value = settled_setting(setting, module, beyond) if setting is not None else None
        if value is not None and threshold_holds(label, value) is False:
            return True
    return False


def _module_constant(module: cst.Module, name: str) -> int | None:
    """The integer a script binds `name` to once, at module level (`mu_iterations = 1`), where nothing else in the
    module binds that name (no parameter, loop target, other assignment or `global` of it); None otherwise."""
    found = name_bindings(module).get(name, [])
    assign = found[0][0] if len(found) == 1 else None
    if not isinstance(assign, cst.Assign) or len(assign.targets) != 1:
        return None
    at_top = any(isinstance(stmt, cst.SimpleStatementLine) and assign in stmt.body for stmt in module.body)
    return int_literal(assign.value) if at_top else None


def _parameter_default(module: cst.Module, name: str, beyond: Beyond | None = None) -> int | None:
    """The integer the parameter `name` of the module's functions (`def train(..., ppo_epochs: int = 1)`) takes in
    every call: its default, where every function that has it agrees, unless a call passes it. Where one module
    function has it, the calls the module makes (a dict literal it splats written out: `**training_config` with
    `"mu": 1`) and those other modules make (`beyond.callers`) count with the integers they give it, where they all
    agree (Shajiu's and alienpenguin10's `train_with_grpo(..., mu=3)`, called only with `"mu": 1`); None otherwise."""
    having = {node.name.value: [p.name.value for p in (*node.params.posonly_params, *node.params.params)]
              for node in walk(module) if type(node) is cst.FunctionDef
              and any(param.name.value == name for param in params(node))}
    found = {_default_of(param.default) for node in walk(module) if type(node) is cst.FunctionDef
             and node.name.value in having for param in params(node) if param.name.value == name}

    def passes(call: cst.Call) -> bool:
        positional = having[last_name(call.func) or ""]
        at = positional.index(name) - (positional[:1] == ["self"]) if name in positional else len(call.args)
        return any(arg.star or arg.keyword is not None and arg.keyword.value == name for arg in call.args) \
            or sum(arg.keyword is None for arg in call.args) > at

    own = [written_out(node, module) for node in walk(module) if type(node) is cst.Call and last_name(node.func) in having]
    default = found.pop() if len(found) == 1 else None
    if default is None:
        return None
    outside = beyond.callers(*having) if beyond is not None and beyond.callers is not None and len(having) == 1 \
        else None
    passing = [call for call in own if passes(call)]
    if not outside and not passing:
        return default
    if len(having) != 1:
        return None
    func = next(node for node in walk(module) if type(node) is cst.FunctionDef and node.name.value in having)
    values = given_literal_ints(func, [*passing, *(outside or ())], name)
    if values is None:
        return None
    if len(passing) < len(own):
        values.add(default)  # a call of the module's own leaves it
    return values.pop() if len(values) == 1 else None


def _configured_above_one(count: cst.BaseExpression, beyond: Beyond | None) -> bool:
    """Whether a YAML file of `beyond` sets the setting a loop count reads (`cfg.grpo_epochs`) to more than 1."""
    configs = beyond.configs if beyond is not None else ()
    return type(count) is cst.Attribute and any(value.isdigit() and int(value) > 1
                                                for value in configured_values(configs, count.attr.value))


def _field_default(module: cst.Module, name: str) -> int | None:
    """The integer `module` defaults the setting `name` to, as a field of its classes (`num_ppo_epochs: int = 1`,
    `= field(default=1, ...)`, a plain class attribute `num_iterations = 1`), a parameter of their methods (`def __init__(self, ppo_steps: int = 1)`) or an option
    of its command line (`parser.add_argument("--num_ppo_epochs", type=int, default=1)`), where every such default
    agrees; None when none is written or they differ."""
    found = set(_option_defaults(module).get(name, ()))
    found.update(_default_of(value) for _, value in _class_fields(module, name))
    for stmt in (stmt for stmt in module.body if isinstance(stmt, cst.ClassDef)):
        for line in stmt.body.body:
            if isinstance(line, cst.FunctionDef):
                found.update(_default_of(param.default) for param in params(line)
                             if param.name.value == name and param.default is not None)
    return found.pop() if len(found) == 1 else None


# a module's loops are read one after another, but with the defaults of every module it imports a class from (fourteen
# for open-instruct's grpo_fast.py, which with room for eight printed each module again at every loop, 99% of its lint)
@functools.lru_cache(maxsize=128)
def _option_defaults(module: cst.Module) -> dict[str, tuple[int | None, ...]]:
    """The integer defaults `module` gives its command-line options (klaudit.frameworks.options), by the attribute
    each is stored under (`add_argument("--num-ppo-epochs", type=int, default=1)`: num_ppo_epochs, 1)."""
    given = option_defaults({"": module.code}).given
    return {name: tuple(int(d.value) if d.value.isdigit() else None for d in by_path.get("", ()))
            for name, by_path in given.items()}


def _default_of(value: cst.BaseExpression | None) -> int | None:
    if type(value) is cst.Call and last_name(value.func) == "field":
        value = next((arg.value for arg in value.args if arg.keyword is not None and arg.keyword.value == "default"), None)
    return int_literal(value) if value is not None else None


# The calls of a function in the code's order, each with the loops around it (within the function).
OrderedCalls = list[tuple[cst.Call, tuple]]


def steps_on_fresh_samples(func: cst.FunctionDef | cst.Module, methods: dict[str, cst.FunctionDef] | None,
                           module: cst.Module,
                           calls_of: CallIndex | None = None,
                           depth: int = 0,
                           called_elsewhere: Callable[[str, bool, bool], bool] | None = None,
                           beyond: Beyond | None = None) -> bool:
    """Whether each optimizer step of `func` (a function, or the module's own code) is the only one since its
    samples were drawn: going out from the step, every loop around it runs once (`range(1)`, or a setting
    `module` defaults to 1) up to one whose body draws samples before the step, or to `func`, which draws them
    before the step or has a single caller (a method of its class, `methods`, or a function of `module`) that
    draws them before the call, outside loops of several rounds, and takes no step of its own. An optimizer
    stepped at two places is not. A function that takes no step (a loss helper) is on fresh samples where its
    single caller's steps are, the module's own training loop included. `calls_of`: the `ordered_calls` of a
    function, cached by the caller. `called_elsewhere(name, method, steps)`, for a function that nothing in
    `module` calls: where it takes steps, whether its one call, made by another module (`trainer.train_step(...)`
    in a training script), comes just after that module draws the samples (`drawn_before_the_call_elsewhere`);
    where it takes none, whether the functions of other modules that call it step on fresh samples
    (`called_on_fresh_samples`). `beyond`: the linted YAML files, which may set a loop's count to more than the
    module's default of 1."""
    if calls_of is None:
        calls_of = CallIndex()
    calls = calls_of(func)
    stepping = _stepping_inner_functions(func, calls_of)
    steps = [(i, loops) for i, (call, loops) in enumerate(calls)
             if _is_step(call) and not _steps_another_model(call) or dotted(call.func) in stepping]
    if not steps and _stepped_by_lightning(func, methods):
        # one step after the function returns, out of its loops (or after a window of such calls, none stepping)
        return _drawn_since(len(calls), (), calls, module, _drawing(methods, module, calls_of), beyond) is True
    if not steps:
        site = _single_caller(func, methods, module, calls_of, anywhere=True) if isinstance(func, cst.FunctionDef) \
            else None
        if site is None and isinstance(func, cst.FunctionDef) and called_elsewhere is not None \
                and _uncalled(func.name.value, module, calls_of):
            return called_elsewhere(func.name.value, methods is not None, False)  # a loss helper other modules call
        if site is None or depth >= 3:
            return False
        return steps_on_fresh_samples(site[0], _methods_around(site[0], module) or methods, module, calls_of, depth + 1,
                                      called_elsewhere, beyond)
    stepped = [dotted(calls[i][0].func) for i, _ in steps  # `self.opt.step`: the optimizer stepped
               if not _flushes_an_accumulation(func, calls[i][0], calls[i][1], steps, calls)]
    if len(set(stepped)) < len(stepped):
        return False
    draws = _drawing(methods, module, calls_of)
    fresh = [_drawn_since(i, loops, calls, module, draws, beyond) for i, loops in steps]
    if False in fresh:
        return False
    if None not in fresh:
        return True
    if not isinstance(func, cst.FunctionDef):
        return False
    if _uncalled(func.name.value, module, calls_of):  # an entry point, trained on the samples handed to it
        return all(drawn or _passes_counted_once(func, i, loops, calls, beyond)
                   for drawn, (i, loops) in zip(fresh, steps)) \
            or called_elsewhere is not None and called_elsewhere(func.name.value, methods is not None, True)
    site = _single_caller(func, methods, module, calls_of)
    if site is None:
        return False
    caller, index, loops = site
    calls = calls_of(caller)
    if takes_a_step(calls):
        return False
    drawn = _drawn_since(index, loops, calls, module, draws, beyond)
    if drawn is None and isinstance(caller, cst.FunctionDef) and _uncalled(caller.name.value, module, calls_of):
        return _passes_counted_once(caller, index, loops, calls, beyond)
    return drawn is True


def _stepping_inner_functions(func: cst.FunctionDef | cst.Module, calls_of: CallIndex) -> frozenset[str]:
    """The names of the functions `func` defines that step the policy's optimizer and draw nothing (a `flush_optimizer`
    closure over a window of accumulated gradients): a call of one is a step where it is made."""
    if not isinstance(func, cst.FunctionDef):
        return frozenset()
    return frozenset(inner.name.value for inner in calls_of.inner_functions(func)
                     if any(_is_step(call) and not _steps_another_model(call) for call, _ in calls_of(inner))
                     and not any(_named_as_draw(call) or _generates(call) for call, _ in calls_of(inner)))


def _flushes_an_accumulation(func: cst.FunctionDef | cst.Module, step: cst.Call, loops: tuple, steps: list,
                             calls: Sequence) -> bool:
    """A step after the training loop that flushes gradients a last, partial accumulation window left
    (`if step % accumulation_steps != 0: scaler.step(optimizer)`, or `flush_optimizer(force=True)` with no gradient
    taken after the loop): outside every loop, stepping the optimizer a loop of the function steps too, under a test
    of a remainder or with no `backward()` between the loop and it. It steps on samples no step has used, so it is
    no second step on one batch."""
    if loops or not any(calls[i][1] and dotted(calls[i][0].func) == dotted(step.func) for i, _ in steps):
        return False
    if any(type(node) is cst.If and any(type(part) is cst.BinaryOperation and type(part.operator) is cst.Modulo
                                        for part in walk(node.test))
           and any(inner is step for inner in walk(node.body)) for node in walk(func)):
        return True
    index = next(i for i, (call, _) in enumerate(calls) if call is step)
    in_loops = [i for i, (_, around) in enumerate(calls[:index]) if around]
    return bool(in_loops) and not any(last_name(call.func) == "backward" for call, _ in calls[in_loops[-1] + 1:index])


def calls_elsewhere(name: str, method: bool, path: str, project: Project, calls_of: CallIndex,
                    also: Sequence[str] = (), twice: bool = False) -> list[tuple] | None:
    """(module, its caller's methods, the caller's calls, the call's index among them, the loops around it) of each
    call of the function `name` (a method where `method`: `x.name(...)`) that the modules of the folder of `path`,
    the folder above, the linted roots and `also` make (each module but `path` itself); a docstring's or comment's
    `name(...)` is none. None where one function calls it twice (the second call may train the first's samples
    again), unless `twice` (the caller then looks at what comes between), or a module holding such text cannot be
    parsed."""
    called = re.compile(rf"\.{re.escape(name)}\s*\(" if method else rf"(?<![\w.]){re.escape(name)}\s*\(")
    places = [other for other in dict.fromkeys([*nearby_modules(Path(project.key(path)), project), *also])
              if name in project.called_names(other) and (text := project.raw_text(other)) is not None
              and called.search(text)]
    found = []
    for place in places:
        other = project.parse(Path(place))
        if other is None:
            return None
        for caller, methods in _callers(other, nested=True):
            calls = calls_of(caller)
            made = [(other, methods, calls, i, loops) for i, (call, loops) in enumerate(calls)
                    if last_name(call.func) == name and (type(call.func) is cst.Attribute) == method]
            if len(made) > 1 and not twice:
                return None
            found += made
    return found


def made_outside_tests(found: list[tuple]) -> list[tuple]:
    """The calls of `found` (as `calls_elsewhere` gives them) that no unit test makes: a test's made-up arguments
    (`kl_beta=0.5` on a dummy model) are not a run of the code it tests."""
    return [made for made in found if id(made[2][made[3]][0]) not in _test_calls(made[0])]


@functools.lru_cache(maxsize=64)  # a module near a function is asked of for each of its names
def _test_calls(module: cst.Module) -> frozenset[int]:
    """The ids of the calls the unit tests of `module` make."""
    return frozenset(id(node) for func in walk(module) if type(func) is cst.FunctionDef and is_test(func)
                     for node in walk(func) if type(node) is cst.Call)


def calls_through_module(name: str, path: str, project: Project, calls_of: CallIndex, also: Sequence[str] = ()
                         ) -> list[tuple] | None:
    """`calls_elsewhere` of `name` written as an attribute call (`x.name(...)`), where each names the module at `path`
    as its caller imports it (`import grpo_core as gc`, then `gc.grpo_step(...)`): a plain call of the function.
    None where one is called on anything else (an object's method of the same name) or `calls_elsewhere` is None."""
    found = calls_elsewhere(name, True, path, project, calls_of, also, twice=True)
    if found is None:
        return None
    stem = Path(path).stem
    through = [made for made in found
               if dotted(made[2][made[3]][0].func.value) in _module_names(made[0], stem)]
    return through if len(through) == len(found) else None


def _module_names(module: cst.Module, stem: str) -> frozenset[str]:
    """The names `module` imports the module `stem` under: `gc` of `import grpo_core as gc` or of `from pkg import
    grpo_core as gc`, `pkg.grpo_core` of `import pkg.grpo_core`."""
    names = set()
    for node in walk(module):
        if type(node) is cst.Import:
            names |= {dotted(alias.asname.name) if alias.asname else dotted(alias.name) for alias in node.names
                      if dotted(alias.name).rsplit(".", 1)[-1] == stem}
        elif type(node) is cst.ImportFrom and not isinstance(node.names, cst.ImportStar):
            names |= {dotted(alias.asname.name) if alias.asname else stem for alias in node.names
                      if dotted(alias.name) == stem}
    return frozenset(names)


def outside_call_sites(name: str, path: str, project: Project, calls_of: CallIndex) -> list[tuple] | None:
    """The calls of the module function `name` (of the module at `path`) that the modules near it and those that
    import it from afar make (also as `alias.name(...)` of the module imported as `alias`), but not in unit tests, as
    `calls_elsewhere` gives them; None where they, or its own module, also call it as `obj.name(...)` or hand it on
    as a value (its callers are then more than the text shows), or a module that may call it cannot be parsed."""
    afar = importers_afar(path, name, project)
    found = calls_elsewhere(name, False, path, project, calls_of, afar, twice=True)
    through = calls_through_module(name, path, project, calls_of, afar)
    if handed_on_elsewhere(name, path, project, afar) or found is None or through is None:
        return None
    return made_outside_tests(found + through)


def handed_on_elsewhere(name: str, path: str, project: Project, also: Sequence[str] = ()) -> bool:
    """Whether the module at `path`, a module near it (as `calls_elsewhere` looks) or one of `also` names the function
    `name` other than to call it, import it or define it (`partial(name, flag=True)`, `fn = module.name`,
    `{"k": name}`): its callers are then more than the calls the text shows."""
    return any(named_beyond_declarations(project.raw_text(other) or "", name, calls=False)
               for other in [project.key(path), *nearby_modules(Path(project.key(path)), project), *also])


_DECLARATIONS = ("class", "def", "async", "import", "from", "#")  # the first word of a line that names without using
# a line of `__all__ = ["train", "grpo_loss"]` or of its items alone, one per line, or of a lazy package's
# `_import_structure` (`"gkd_trainer": ["GKDTrainer"],`, as TRL and transformers write it): names exported, not used
_EXPORTS = re.compile(r"""^\s*(__all__\s*\+?=\s*[\[(]?|["'][\w.]+["']\s*:\s*\[)?\s*(["']\w+["']\s*,?\s*)+[\])]?\s*,?\s*$""")


def named_beyond_declarations(text: str, name: str, calls: bool = True) -> bool:
    """Whether `text` names `name` (also as the last part of a dotted path: `"pkg.mod.Name"`) on a line that does more
    than define it, derive from it, import it (also on the lines of a parenthesised import), export it (`__all__`)
    or comment on it; a call of it counts only where `calls`."""
    if name not in text:
        return False
    word = re.compile(rf"(?<!\w){re.escape(name)}(?!\w)" + ("" if calls else r"(?!\s*\()"))
    quoted = re.compile(rf"""["']{re.escape(name)}["']""")
    importing = False
    # the export test reads the line as written: the other names of `__all__ = ["a", "b"]` are strings prose blanks
    for line, written in zip(_without_prose(text, name).splitlines(), text.splitlines()):
        first = (line.split() or [""])[0].split("(")[0]
        declared = importing or first in _DECLARATIONS or _EXPORTS.match(written) is not None and quoted.search(line)
        if first in ("from", "import") and "(" in line and ")" not in line:
            importing = True
        elif importing and ")" in line:
            importing = False
        if name in line and word.search(line) and not declared:
            return True
    return False


@functools.lru_cache(maxsize=32)  # the modules near a function are read for each of its names
def _without_prose(text: str, name: str) -> str:
    """`text` with its comments and its strings blanked out, but for a string that names `name` (a registry's
    `"train"`, `getattr(module, "train")`, a dotted path a factory imports, `"pkg.mod.train"`): a docstring that speaks
    of a function hands it to nothing. `text` as it is where Python's tokenizer rejects it."""
    prose = _prose(text)
    if prose is None:
        return text
    lines = text.splitlines(keepends=True)
    naming = re.compile(rf"(?:[\w.]*[.:])?{re.escape(name)}")
    for string, (first, start), (last, end) in prose:
        if string is None or not naming.fullmatch(string.lstrip("rbfuRBFU").strip("\"'")):
            for row in range(first - 1, last):
                line = lines[row]
                left = start if row == first - 1 else 0
                right = end if row == last - 1 else len(line.rstrip("\r\n"))
                lines[row] = line[:left] + " " * (right - left) + line[right:]
    return "".join(lines)


@functools.lru_cache(maxsize=512)  # each module near a function, read for each of its names: tokenized once
def _prose(text: str) -> tuple[tuple[str | None, tuple[int, int], tuple[int, int]], ...] | None:
    """The comments (None) and strings (their text) of `text`, each with where it starts and ends (row, column);
    None where Python's tokenizer rejects it."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError):
        return None
    return tuple((None if token.type == tokenize.COMMENT else token.string, token.start, token.end)
                 for token in tokens if token.type in (tokenize.COMMENT, tokenize.STRING))


def drawn_before_the_call_elsewhere(name: str, method: bool, path: str, project: Project,
                                    calls_of: CallIndex, owner: str | None = None) -> bool:
    """Whether each call of the function `name` that other modules make (`calls_elsewhere`, and the modules anywhere
    that import it, its class `owner` or its module, `importers_afar`) comes right after its caller draws new samples, the caller taking
    no step of its own (`generate_batch_responses(model, ...)` then `trainer.train_step(...)` in each round of a
    script's loop, or of each of two scripts' loops; a warm-up step on a batch drawn for it, then the loop): each call
    then trains on the policy that drew them. A call the same function made before with no draw in between trains
    those samples again. False where they make none."""
    afar = importers_afar(path, owner if method and owner else name, project)
    found = calls_elsewhere(name, method, path, project, calls_of, afar, twice=True) or []
    return bool(found) and all(
        not takes_a_step(calls)
        and _drawn_since(index, loops, calls, other, drawing := _drawing(methods, other, calls_of),
                         Beyond(project.configs))
        is True and _drawn_after_each_earlier_call(index, calls, found, drawing)
        for other, methods, calls, index, loops in found)


def _drawn_after_each_earlier_call(index: int, calls: OrderedCalls, found: list[tuple],
                                   drawing: Callable[[cst.Call], bool]) -> bool:
    """Whether, between each earlier call of `found` in the same function (the same `calls`) and the one at
    `index`, samples are drawn anew."""
    earlier = [at for _, _, others, at, _ in found if others is calls and at < index]
    return all(any(drawing(call) for call, _ in calls[at + 1:index]) for at in earlier)


def called_on_fresh_samples(name: str, method: bool, path: str, project: Project, calls_of: CallIndex,
                            owner: str | None = None) -> bool:
    """Whether a function that takes no step and that nothing in its module calls (a loss helper, `grpo_loss`) is
    called, in the modules of the folder of `path`, the folder above, that folder's other folders, the linted roots
    and their folders, only by functions whose steps are each the first on samples just drawn (`steps_on_fresh_samples` in
    their module: a script's loop that samples a group, computes the loss and steps once), or by tests that take
    no step (`def test_...`, a loss computed on made-up tensors): no step then trains it on an older policy's
    samples. The `forward` of a loss module (`owner`, its class) is called through the object built from it
    (`self.objective = GRPOLoss(...)`, then `self.objective(...)`). False where none of those modules calls it."""
    by_instance = method and name in ("forward", "__call__") and owner is not None
    called = re.compile(rf"(?<![\w.]){re.escape(owner or '')}\s*\(" if by_instance else
                        rf"\.{re.escape(name)}\s*\(" if method else rf"(?<![\w.]){re.escape(name)}\s*\(")
    word = owner if by_instance and owner else name
    places = [(other, text) for other in nearby_modules(Path(project.key(path)), project, siblings=True)
              if word in project.called_names(other) and (text := project.raw_text(other)) is not None
              and called.search(text)]
    found = False
    for place, text in places:
        other = project.parse(Path(place))
        if other is None:
            return False
        objects = set(re.findall(rf"([\w.]+)\s*=\s*(?:[\w.]+\.)?{re.escape(owner or '')}\s*\(", text)) \
            if by_instance else set()
        for caller, methods in _callers(other):
            calls = calls_of(caller)
            # a function's closures run within it (`def loss_fn(model): ...` handed to `value_and_grad` or an
            # optimizer's `step`): their calls are its calls
            made = [node for node in walk(caller.body) if type(node) is cst.Call] \
                if isinstance(caller, cst.FunctionDef) else [call for call, _ in calls]
            if not any(dotted(call.func) in objects if by_instance else
                       last_name(call.func) == name and (type(call.func) is cst.Attribute) == method
                       for call in made):
                continue
            found = True
            if is_test(caller) and not takes_a_step(calls):
                continue
            if not steps_on_fresh_samples(caller, methods, other, calls_of, depth=1, beyond=Beyond(project.configs)):
                return False
    return found


def nearby_modules(path: Path, project: Project, siblings: bool = False) -> list[str]:
    """The Python files of the folder of `path`, of the folder above it and of the linted roots (not those
    folders' subfolders; with `siblings`, also of the other folders of the folder above where it lies in a linted
    root, and of the folders of the linted roots: `scripts/`, `experiments/`, `tests/`), `path` itself left out;
    each once. Read once per project."""
    return project.remembered(("nearby", str(path), siblings), lambda: _nearby(path, project, siblings))


def importers_afar(path: str, name: str, project: Project) -> list[str]:
    """The Python files under the linted roots, beyond the modules near `path`, whose import lines name the function
    `name` or the module at `path` (`from pkg.grpo.utils import compute_kl`, `from pkg.grpo import utils`) and which
    do not define a function `name` of their own: the callers a package's helper has in other folders."""
    module = Path(project.key(path))
    near = {project.key(other) for other in nearby_modules(module, project)} | {str(module)}
    imports = re.compile(rf"^[ \t]*(?:from[ \t]+[\w.]+[ \t]+)?import[ \t]+(?:\([^)]*|[^\n]*)"
                         rf"\b(?:{re.escape(name)}|{re.escape(module.stem)})\b", re.MULTILINE)
    defines = re.compile(rf"^[ \t]*(?:async[ \t]+)?def[ \t]+{re.escape(name)}\b", re.MULTILINE)
    return [other for other in python_files(project) if project.key(other) not in near
            and name in (text := project.raw_text(other) or "") and imports.search(text) and not defines.search(text)]


def _nearby(path: Path, project: Project, siblings: bool) -> list[str]:
    above = path.parent.parent
    inside = siblings and above.is_dir() and any(above == root or root in above.parents for root in project.roots)
    tops = [*([above] if inside else []), *(root for root in project.roots if siblings and root.is_dir())]
    others = sorted(folder for top in tops for folder in top.iterdir() if folder.is_dir())
    folders = dict.fromkeys([path.parent, above, *others, *project.roots])
    found = [str(file) for folder in folders if folder.is_dir() for file in sorted(folder.glob("*.py"))]
    return [file for file in dict.fromkeys(found) if project.key(file) != str(path)]


@functools.lru_cache(maxsize=64)  # a module near a function is asked of for each of its names
def _callers(module: cst.Module, nested: bool = False
             ) -> tuple[tuple[cst.FunctionDef | cst.Module, dict[str, cst.FunctionDef] | None], ...]:
    """Each function of `module` that may call another (its functions, its classes' methods, its own code),
    with the methods of the class it belongs to; with `nested`, the functions those define too (a worker
    `def _do_update(job): ...` handed to a thread pool), each on its own."""
    found: list[tuple[cst.FunctionDef | cst.Module, dict[str, cst.FunctionDef] | None]] = []
    for stmt in module.body:
        if isinstance(stmt, cst.FunctionDef):
            found.append((stmt, None))
        elif isinstance(stmt, cst.ClassDef):
            methods = _class_methods(stmt)
            found.extend((method, methods) for method in methods.values())
    if nested:
        found += [(inner, None) for outer, _ in list(found) for inner in walk(outer)
                  if type(inner) is cst.FunctionDef and inner is not outer]
    return (*found, (module, None))


def _stepped_by_lightning(func: cst.FunctionDef | cst.Module, methods: dict[str, cst.FunctionDef] | None) -> bool:
    """Whether `func` is the `training_step` of a LightningModule (a class with `configure_optimizers`) left to
    Lightning's automatic optimization, which backpropagates the loss it returns and steps the optimizer once per
    call, or once per window of `accumulate_grad_batches` calls."""
    if not isinstance(func, cst.FunctionDef) or func.name.value != "training_step" or not methods \
            or "configure_optimizers" not in methods:
        return False
    return not any(type(node) is cst.Attribute and node.attr.value == "automatic_optimization"
                   for method in methods.values() for node in walk(method))


def called_on_one_sequence(name: str, tree: cst.Module, calls_of: CallIndex,
                           elsewhere: Sequence[tuple] | None = None) -> bool:
    """Whether every call of `name` in the module (outside unit tests), and there is one, hands it one sequence: made by
    a caller that encodes one text at a time (klaudit.lint.syntax.encodes_one_text), or in a loop over the drawn samples
    one by one. Then the helper's tensors hold that one sequence, as its callers' do. Where the module makes none,
    `elsewhere` holds the loops around each call other modules make (None: none known), each in such a loop."""
    callers: list[cst.FunctionDef | cst.Module] = [node for node in statement_nodes(tree)
                                                   if isinstance(node, cst.FunctionDef) and not is_test(node)]
    sites = [(caller, loops) for caller in (*callers, tree) for call, loops in calls_of(caller)
             if last_name(call.func) == name]
    if not sites and elsewhere:
        return all(any(map(handles_one_sequence, loops)) for loops in elsewhere)
    return bool(sites) and all(encodes_one_text(caller.body if type(caller) is cst.FunctionDef else caller)
                               or any(map(handles_one_sequence, loops)) for caller, loops in sites)


def takes_a_step(calls: OrderedCalls) -> bool:
    """Whether a function with these `ordered_calls` steps an optimizer itself."""
    return any(_is_step(call) for call, _ in calls)


_LOOPS = frozenset({cst.For, cst.While})


def ordered_calls(func: cst.FunctionDef | cst.Module) -> OrderedCalls:
    """The calls of `func`'s body (or of a module's own code) in the order of the code's fields, each with the
    loops around it, except those of the functions, classes and lambdas it defines."""
    found: OrderedCalls = []
    stack: list[tuple[cst.CSTNode, tuple]] = [(func.body if isinstance(func, cst.FunctionDef) else func, ())]
    while stack:
        node, loops = stack.pop()
        if type(node) is cst.Call:
            found.append((node, loops))
        inner = loops + (node,) if type(node) in _LOOPS else loops
        for child in reversed(child_nodes(node)):
            if type(child) not in SCOPES:
                stack.append((child, inner))
    return found


class CallIndex:
    """What the questions of this module ask of one module's code, each read once: the `ordered_calls` of each
    function (calling the index gives them), the functions each one defines, and where the methods of a class
    call each method name on `self`, `cls` or a class."""

    def __init__(self) -> None:
        self._calls: dict[int, OrderedCalls] = {}
        self._inner: dict[int, list[cst.FunctionDef]] = {}
        self._method_sites: dict[int, tuple[dict, dict[str, list[tuple]]]] = {}
        self._called: dict[int, frozenset[str | None]] = {}

    def __call__(self, func: cst.FunctionDef | cst.Module) -> OrderedCalls:
        key = id(func)
        if key not in self._calls:
            self._calls[key] = ordered_calls(func)
        return self._calls[key]

    def called_names(self, module: cst.Module) -> frozenset[str | None]:
        """The last name of everything `module` calls (`f(...)`, `x.f(...)`), anywhere in it."""
        key = id(module)
        if key not in self._called:
            self._called[key] = frozenset(last_name(node.func) for node in walk(module) if type(node) is cst.Call)
        return self._called[key]

    def inner_functions(self, func: cst.FunctionDef) -> list[cst.FunctionDef]:
        """The functions `func`'s body defines, at any depth of its statements."""
        key = id(func)
        if key not in self._inner:
            self._inner[key] = [node for node in statement_nodes(func.body) if type(node) is cst.FunctionDef]
        return self._inner[key]

    def method_sites(self, methods: dict[str, cst.FunctionDef]) -> dict[str, list[tuple]]:
        """Method name -> (caller, the call's index among its calls, the loops around it) of each call of it on
        `self`, `cls` or a class by one of `methods`."""
        key = id(methods)
        if key not in self._method_sites:
            sites: dict[str, list[tuple]] = {}
            for caller in methods.values():
                for index, (call, loops) in enumerate(self(caller)):
                    name = _method_called(call)
                    if name is not None:
                        sites.setdefault(name, []).append((caller, index, loops))
            self._method_sites[key] = (methods, sites)  # the dict held, so that its id stays its own
        return self._method_sites[key][1]


def trained_by_a_later_loop(func: cst.FunctionDef, methods: dict[str, cst.FunctionDef] | None, module: cst.Module,
                            calls_of: CallIndex,
                            depth: int = 0,
                            elsewhere: Callable[[str, bool], list[tuple] | None] | None = None,
                            inherited: Callable[[cst.FunctionDef], cst.For | None] | None = None,
                            beyond: Beyond | None = None) -> cst.For | None:
    """The loop of several optimizer steps that trains what `func` computes, where `func` takes no step: after
    its single call (by a method of its class, a function of `module`, or the module's own code; going up to
    that caller's single call where the caller takes no step either), the caller runs a loop that reuses its
    samples (`reuses_samples`) or calls a function of the module, or a method of the class, that holds one.
    A KL reward computed when the samples are drawn (`make_experience`) is then trained by every step of that
    loop, each after the first on an older policy's samples (kl-math.md section 8, row 23). `elsewhere(name,
    method)`: `calls_elsewhere` of a function nothing in `module` calls, where each such call is followed, in its
    caller, by a call of a function of `module` that holds the loop (a script's `collect_rollouts(...)` then
    `ppo_update(...)`). `inherited(method)`: the loop a base class of another module runs after its own call of
    `self.<method>(...)`, for a method its class never calls. `beyond`: what may set the counts of `module`'s loops
    beyond its code; the YAML files it names, of the loops of the other modules."""
    if takes_a_step(calls_of(func)):
        return None
    sites = _call_sites(func, methods, module, calls_of, anywhere=True, branches=True)
    if not sites and elsewhere is not None and methods is None and _uncalled(func.name.value, module, calls_of):
        return _later_loop_elsewhere(elsewhere(func.name.value, False), module, beyond)
    if not sites:
        return inherited(func) if inherited is not None and methods is not None else None
    # any call whose caller goes on to train its samples over several steps (a notebook's trial call of
    # `compute_rewards(...)` before the training loop calls it again); a loop that calls `func` again trains what
    # that call computes, not the samples of the one before it
    for caller, index, loops in sites:
        redrawn = [loop for other, at, around in sites if other is caller and at != index for loop in around]
        for call, around in calls_of(caller)[index + 1:]:
            loop = next((loop for loop in around if loop not in loops and not any(loop is held for held in redrawn)
                         and reuses_samples(loop, module, methods, beyond)), None)
            if loop is None:
                loop = _reusing_loop_of(call, methods, module, beyond)
            if loop is not None:
                return loop
    # up to its single caller, not counting the module's own calls outside any loop: a notebook's trial calls
    # (`play_game(model, data[:2])` shown before the training loop calls it again)
    upward = [caller for caller, _, loops in sites if caller is not module or loops]
    if len(upward) == 1 and depth < 2 and isinstance(caller := upward[0], cst.FunctionDef) \
            and not takes_a_step(calls_of(caller)):
        own = methods if methods is not None and caller in methods.values() else None
        return trained_by_a_later_loop(caller, own, module, calls_of, depth + 1, elsewhere, inherited, beyond)
    return None


def reusing_loop_after(func: cst.FunctionDef, site: cst.CSTNode, module: cst.Module,
                       methods: dict[str, cst.FunctionDef] | None = None,
                       beyond: Beyond | None = None) -> cst.For | None:
    """A loop of `func` that begins after `site` (and does not hold it) and trains several optimizer steps on the
    same samples (`reuses_samples`): a script that stores each rollout's KL reward in a buffer of dicts, then runs
    `for ppo_epoch in range(PPO_EPOCHS)` over it, trains the reward on an older policy's samples after the first
    step, though the analysis loses the reward in the buffer."""
    nodes = list(_in_source_order(func))
    start = next((index for index, node in enumerate(nodes) if node is site), None)
    if start is None:
        return None
    return next((node for node in nodes[start + 1:] if type(node) is cst.For
                 and reuses_samples(node, module, methods, beyond)), None)


def _in_source_order(func: cst.FunctionDef) -> Iterator[cst.CSTNode]:
    """The nodes of `func`'s body, each before what it holds and after what precedes it in the source, except those
    of the functions, classes and lambdas it defines (as `ordered_calls` walks it)."""
    stack: list[cst.CSTNode] = [func.body]
    while stack:
        current = stack.pop()
        yield current
        stack.extend(child for child in reversed(child_nodes(current)) if type(child) not in SCOPES)


def _later_loop_elsewhere(found: list[tuple] | None, module: cst.Module, beyond: Beyond | None = None) -> cst.For | None:
    """The loop that trains the samples at each of the calls `found` in other modules: every caller goes on to run a
    loop of its own that reuses them (`token_rewards = build_token_rewards(...)`, then `for _ in range(epochs)`), or
    to call a function of `module` (by its name) that holds such a loop; None where one does not. `beyond`: what may
    set the counts of `module`'s loops; of a caller's own loops, the YAML files it names."""
    elsewhere = Beyond(beyond.configs) if beyond is not None else None
    loops = []
    for other, methods, calls, index, around in found or ():
        loop = next((held for _, later in calls[index + 1:] for held in later
                     if held not in around and reuses_samples(held, other, methods, elsewhere)), None) or next(
            (held for call, _ in calls[index + 1:] if (held := _reusing_loop_of(call, None, module, beyond))), None)
        if loop is None:
            return None
        loops.append(loop)
    return loops[0] if loops else None


def _single_caller(func: cst.FunctionDef, methods: dict[str, cst.FunctionDef] | None, module: cst.Module,
                   calls_of: CallIndex,
                   anywhere: bool = False, branches: bool = False) -> tuple | None:
    """(caller, the call's index among its calls, the loops around it) where `func` is called at one place only
    (`_call_sites`); else None."""
    found = _call_sites(func, methods, module, calls_of, anywhere, branches)
    return found[0] if len(found) == 1 else None


def _call_sites(func: cst.FunctionDef, methods: dict[str, cst.FunctionDef] | None, module: cst.Module,
                calls_of: CallIndex, anywhere: bool = False, branches: bool = False) -> list[tuple]:
    """(caller, the call's index among its calls, the loops around it) of each place that calls `func`: another
    method of its class (`self.name(...)`) or function of `module` (`name(...)`), never `func` itself.
    `anywhere`: also the module's own code, and a method its class never calls by whatever calls it on an
    object (`maker.make_experience(...)`). `branches`: two calls in the two branches of one `if` are one place,
    the first of them."""
    name = func.name.value
    found: list[tuple[cst.FunctionDef | cst.Module, int, tuple]] = []
    if methods is not None:
        found = list(calls_of.method_sites(methods).get(name, ()))
        if not found:
            found = [site for caller in methods.values() for site in _calls_in_closures(caller, name, calls_of)]
    if not found and (methods is None or anywhere):
        callers: list[cst.FunctionDef | cst.Module] = [stmt for stmt in module.body
                                                       if isinstance(stmt, cst.FunctionDef)]
        if methods is None:  # a module function a method calls (a trainer's `step` calling `grpo_loss(...)`)
            callers += [method for cls in module.body if isinstance(cls, cst.ClassDef)
                        for method in _class_methods(cls).values()]
        if anywhere:
            callers.append(module)
        found = [(caller, i, loops) for caller in callers for i, (call, loops) in enumerate(calls_of(caller))
                 if (_calls(call, name, False) if methods is None
                     else type(call.func) is cst.Attribute and call.func.attr.value == name)]
    if branches and len(found) == 2 and found[0][0] is found[1][0] and _exclusive_calls(
            found[0][0], *(calls_of(found[0][0])[i][0] for _, i, _ in found)):
        found = found[:1]
    return [] if any(caller is func for caller, _, _ in found) else found


def _calls_in_closures(caller: cst.FunctionDef, name: str,
                       calls_of: CallIndex) -> list[tuple]:
    """(caller, index, loops) where a function `caller` defines calls the method `name` (`def loss_fn(model): ...
    self._grpo_loss(...)`, differentiated by `value_and_grad(loss_fn)`): the call runs where `caller` first uses
    that function, at that call's index among its own calls."""
    sites = []
    for inner in calls_of.inner_functions(caller):
        if not any(_calls(call, name, True) for call, _ in calls_of(inner)):
            continue
        uses = [(i, loops) for i, (call, loops) in enumerate(calls_of(caller))
                if any(type(node) is cst.Name and node.value == inner.name.value for node in walk(call))]
        if uses:
            sites.append((caller, *uses[0]))
    return sites


def _exclusive_calls(caller: cst.FunctionDef | cst.Module, first: cst.Call, second: cst.Call) -> bool:
    """Whether the two calls sit in the two branches of one `if` of `caller`: one of them runs."""
    for node in statement_nodes(caller):
        if type(node) is cst.If and node.orelse is not None:
            body, orelse = set(map(id, walk(node.body))), set(map(id, walk(node.orelse)))
            if id(first) in body and id(second) in orelse or id(second) in body and id(first) in orelse:
                return True
    return False


def _class_methods(classdef: cst.ClassDef) -> dict[str, cst.FunctionDef]:
    return {item.name.value: item for item in classdef.body.body if isinstance(item, cst.FunctionDef)}


def _methods_around(func: cst.FunctionDef | cst.Module, module: cst.Module) -> dict[str, cst.FunctionDef] | None:
    """The methods of the class of `module` that defines `func`, where it is a method."""
    for stmt in module.body:
        if isinstance(stmt, cst.ClassDef) and any(item is func for item in stmt.body.body):
            return _class_methods(stmt)
    return None


def _reusing_loop_of(call: cst.Call, methods: dict[str, cst.FunctionDef] | None, module: cst.Module,
                     beyond: Beyond | None = None) -> cst.For | None:
    """The loop that reuses samples in the body of the method (`self.name(...)`) or module function (`name(...)`)
    that `call` runs (`beyond`: what may set its count beyond `module`'s code)."""
    callee = _callee(call, methods, module)
    if callee is None:
        return None
    return next((node for node in own_nodes(callee.body)
                 if isinstance(node, cst.For) and reuses_samples(node, module, methods, beyond)), None)


def _callee(call: cst.Call, methods: dict[str, cst.FunctionDef] | None, module: cst.Module) -> cst.FunctionDef | None:
    """The method (`self.name(...)`, of `methods`) or module function (`name(...)`) that `call` runs."""
    if methods is not None and type(call.func) is cst.Attribute and dotted(call.func.value) == "self":
        return methods.get(call.func.attr.value)
    if type(call.func) is cst.Name:
        return next((stmt for stmt in module.body if isinstance(stmt, cst.FunctionDef)
                     and stmt.name.value == call.func.value), None)
    return None


def _drawing(methods: dict[str, cst.FunctionDef] | None, module: cst.Module,
             calls_of: CallIndex) -> Callable[[cst.Call], bool]:
    """Whether a call draws new samples: a call named so (`_draws`), or one of a method or module function that
    takes no step and runs a model's generation (`self.model.generate(...)`, or a function of another module
    handed the policy model, up to three calls deep): a `train_step` that generates, scores and backpropagates,
    its caller stepping once every few calls. Inside such a function a name alone is no evidence
    (`generate_loss_mask(...)` builds a mask)."""
    def draws(call: cst.Call, depth: int = 0) -> bool:
        callee = _callee(call, methods, module)
        if depth and callee is not None and _keeps_a_buffer(callee):
            return False  # `self.generate(...)` that hands out a buffered generation for several steps
        if callee is not None and _samples_with_an_old_copy(callee):
            return False  # samples of the lagging copy, not of the policy the step updates
        if _draws(call) if depth == 0 else (_generates(call) or callee is None and _draws_with_the_policy(call)):
            return True
        if depth == 0 and _builds_a_sampler(call, module):
            return True
        if callee is None or depth >= 3:
            return False
        inner = calls_of(callee)
        return any(draws(found, depth + 1) for found, _ in inner) and not takes_a_step(inner)

    return draws


def _builds_a_sampler(call: cst.Call, module: cst.Module) -> bool:
    """`LocalPolicyClient(model, tokenizer, ...)`: a class of `module` whose methods generate with the model it is
    handed, made with the policy model. Made where the samples are wanted (an agent's client for one episode,
    handed to the environment's loop), it stands for the draw its episode makes."""
    if type(call.func) is not cst.Name or not any(
            type(arg.value) in (cst.Name, cst.Attribute) and roles.names_policy_model(last_name(arg.value) or "")
            for arg in call.args):
        return False
    classdef = next((stmt for stmt in module.body if isinstance(stmt, cst.ClassDef)
                     and stmt.name.value == call.func.value), None)
    return classdef is not None and any(type(node) is cst.Call and _generates(node)
                                        for method in _class_methods(classdef).values() for node in walk(method))


def _keeps_a_buffer(func: cst.FunctionDef) -> bool:
    """Whether `func` reads or fills a buffer of samples (`self._buffered_generation`, `self.replay_buffer`)."""
    return any(type(node) is cst.Attribute and _BUFFER.search(node.attr.value) for node in own_nodes(func.body))


def _generates(call: cst.Call) -> bool:
    """`model.generate(...)`, `llm.generate(...)`, `policy.sample(...)`: a model's own generation, from the policy
    (no older copy of it among the arguments); or a token drawn from its distribution in a hand-written decoding
    loop (`torch.multinomial(probs, 1)`, `jax.random.categorical(key, logits)`)."""
    return (type(call.func) is cst.Attribute and call.func.attr.value in _GENERATION and _draws(call)
            or _samples_a_token(call))


def _draws_with_the_policy(call: cst.Call) -> bool:
    """`generate_group(model, tokenizer, prompt, ...)`: a function of another module, named as a draw and handed
    the policy model itself, generates with it (a mask builder named `generate_...` is not handed the model)."""
    return _draws(call) and any(type(arg.value) in (cst.Name, cst.Attribute)
                                and roles.names_policy_model(last_name(arg.value) or "") for arg in call.args)


def _samples_a_token(call: cst.Call) -> bool:
    """`torch.multinomial(probs, 1)`, `random.categorical(key, logits)`: a draw from a distribution its arguments
    name as the model's (probabilities or logits), not a weighted pick of prompts or indices."""
    return last_name(call.func) in ("multinomial", "categorical") and any(
        _DISTRIBUTION.search(dotted(arg.value) or last_name(arg.value)) for arg in call.args)


_DISTRIBUTION = re.compile(r"prob|logit|softmax", re.IGNORECASE)  # how a model's output distribution is named


def _drawn_since(index: int, loops: tuple, calls: OrderedCalls, module: cst.Module,
                 drawing: Callable[[cst.Call], bool], beyond: Beyond | None = None) -> bool | None:
    """For the node at `index` among its function's `calls`, within `loops`: True where samples are drawn before
    it (a call `drawing` says draws) in the body of the innermost loop of several rounds around it (or, out of
    loops, in the function); False where a loop of several rounds around it draws none; None where it is in no
    such loop and none is drawn."""
    draws = [(i, within) for i, (call, within) in enumerate(calls) if drawing(call)]
    for loop in reversed(loops):
        if any(i < index and any(around is loop for around in within) for i, within in draws):
            return True
        if not _one_round(loop, module, beyond):
            return False
    return True if any(i < index for i, _ in draws) else None


def _passes_counted_once(func: cst.FunctionDef, index: int, loops: tuple, calls: OrderedCalls,
                         beyond: Beyond | None = None) -> bool:
    """Whether the step at `index` of `func`, within `loops` that each run once, is under one that counts the
    passes over the samples by a setting defaulted to 1 (`for epoch in range(cfg.n_epochs)`) that no YAML file of
    `beyond` sets to more, with no batch taken from a queue or a buffer: each batch handed to `func` is trained
    once."""
    counted = any(int_literal(loop.iter.args[0].value) is None for loop in loops) \
        and not any(_configured_above_one(loop.iter.args[0].value, beyond) for loop in loops)
    return counted and not any(_takes_queued(call) for call, _ in calls[:index]) and not _keeps_a_buffer(func)


def _takes_queued(call: cst.Call) -> bool:
    """`self.batches.pop()`, `queue.get_nowait()`, `buffer.sample(n)`, `next(loader)`: a batch made earlier."""
    if type(call.func) is cst.Name:
        return call.func.value == "next"
    return type(call.func) is cst.Attribute and (call.func.attr.value in ("pop", "popleft", "get_nowait")
                                                 or _BUFFER.search(dotted(call.func.value)) is not None)


def _uncalled(name: str, module: cst.Module, calls_of: CallIndex) -> bool:
    """Whether nothing in `module` calls a function or method named `name`."""
    return name not in calls_of.called_names(module)


def _one_round(loop: cst.For | cst.While, module: cst.Module, beyond: Beyond | None = None) -> bool:
    """`for ... in range(n)` with n 1 (or 0), or a setting that the classes of `module` default to 1 (and no YAML
    file of `beyond` sets to more)."""
    if not isinstance(loop, cst.For) or type(loop.iter) is not cst.Call or dotted(loop.iter.func) != "range" \
            or len(loop.iter.args) != 1:
        return False
    return not _several_rounds(loop.iter, module, beyond)


def _is_step(node: cst.CSTNode) -> bool:
    """`optimizer.step()`, or MLX's and optax's `optimizer.update(model, grads)`: an update of the policy; or a
    helper named for one, on whatever object holds it (OpenRLHF's `self.strategy.optimizer_step(loss, model,
    optim)`, `self.trainer.optim_step(loss)`); or an object stepping the optimizer it is handed (mixed precision's
    `self.scaler.step(self.optimizer)`, torch.amp.GradScaler; `self.device_manager.step(optimizer, max_norm)`)."""
    if type(node) is not cst.Call:
        return False
    if type(node.func) is cst.Name:
        return _STEP_HELPER.match(node.func.value.lstrip("_")) is not None  # a script's `_optimizer_step(model, opt)`
    if type(node.func) is not cst.Attribute:
        return False
    method = node.func.attr.value
    if _STEP_HELPER.match(method):
        return True
    if method == "step" and node.args and roles.names_optimizer(last_name(node.args[0].value) or ""):
        return True  # a gradient scaler or a device manager stepping the optimizer it is handed
    return (method == "step" or method == "update" and bool(node.args)) and roles.names_optimizer(last_name(node.func.value))


# an optimizer named for a model other than the policy: a critic's, a value head's, a discriminator's, a reward model's
_ANOTHER_MODELS_OPTIMIZER = re.compile(r"(^|_)(critic|value|vf|disc|discriminator|reward|rm|d)(_|$)", re.IGNORECASE)


def _steps_another_model(node: cst.Call) -> bool:
    """`critic_opt.step()`, `disc_optimizer.step()`: an update of another model, which says nothing of how old the
    policy's samples are (DhawalV1's discriminator, stepped in a loop of its own after the policy's)."""
    if type(node.func) is not cst.Attribute:
        return False
    handed = node.args[0].value if node.args and node.func.attr.value == "step" else None
    held = handed if handed is not None and roles.names_optimizer(last_name(handed) or "") else node.func.value
    return _ANOTHER_MODELS_OPTIMIZER.search(last_name(held) or "") is not None


def _named_as_draw(node: cst.Call) -> bool:
    """A call named like a generation, a rollout or a draw of samples, not one that only sounds like it
    (`gc.collect()`, `display(...)`), nor the making of a record or a buffer to hold samples (`RolloutBuffer(...)`,
    `Experience(...)`: a class's name)."""
    name = last_name(node.func) or ""
    return (roles.draws_samples(name) and not _NOT_A_DRAW.search(dotted(node.func)) and not name[:1].isupper()
            and not _BUFFER.search(name))


def _draws(node: cst.CSTNode) -> bool:
    """A call that draws new samples: named so (`_named_as_draw`), and not a draw from a buffer of earlier ones
    nor from an older copy of the policy (`sample_response(model=old_model, ...)`)."""
    if type(node) is not cst.Call or not _named_as_draw(node):
        return False
    if _given_an_old_copy(node) or _greedy(node):
        return False
    return type(node.func) is not cst.Attribute or not _BUFFER.search(dotted(node.func.value))


def _greedy(call: cst.Call) -> bool:
    """`model.generate(..., do_sample=False)`: greedy decoding, an evaluation's output, not samples of the policy
    to train on (JunyiJ/PostTraining-LLM-Small's periodic eval inside its PPO epochs)."""
    return any(arg.keyword is not None and arg.keyword.value == "do_sample" and type(arg.value) is cst.Name
               and arg.value.value == "False" for arg in call.args)


def _given_an_old_copy(call: cst.Call) -> bool:
    """A call given a copy of the policy kept for sampling (`generate(self.model_old, ...)`, `model=old_model`)."""
    return any(type(arg.value) in (cst.Name, cst.Attribute) and roles.is_old_policy_model(dotted(arg.value))
               for arg in call.args)


def _samples_with_an_old_copy(func: cst.FunctionDef) -> bool:
    """Whether `func` generates with a copy of the policy kept for sampling (MLX-GRPO's `generate_responses`, run
    on `self.model_old`, which is synced every few updates): what it draws is an older policy's."""
    return any(type(node) is cst.Call and _given_an_old_copy(node) and (_named_as_draw(node) or _generates(node))
               for node in own_nodes(func.body))


def _calls(node: cst.Call, name: str, method: bool) -> bool:
    """A call of the function `name`: `self.name(...)` for a method, `name(...)` for a function."""
    if method:
        return _method_called(node) == name
    return type(node.func) is cst.Name and node.func.value == name


def _method_called(node: cst.Call) -> str | None:
    """The method `node` calls on the instance or on the class (`self.name(...)`, `cls._loss(...)`,
    `GRPOTrainer._loss(...)` of a static method); None for any other call."""
    func = node.func
    if type(func) is not cst.Attribute:
        return None
    owner = func.value
    if dotted(owner) in ("self", "cls") or type(owner) is cst.Name and owner.value[:1].isupper():
        return func.attr.value
    return None


_BUFFER = re.compile(r"buffer|replay|memory|queue|pool", re.IGNORECASE)
_STEP_HELPER = re.compile(r"(optim|optimizer|opt)_step$|step_(optim|optimizer)$")  # a method that steps an optimizer
_GENERATION = frozenset({"generate", "generate_sequences", "sample", "rollout"})  # a model's or engine's own generation
# a predicate or a record of the samples named with them (`_has_rollout_log_probs`, `_log_rollout_data`), a part
# taken of them (`slice_rollout_batch(rollout, indices)`, a mini-batch), a collection of statistics
# (`collect_weight_entropy_stats`, `collect_metrics`), or a loss computed on them (`ppo_loss_for_rollout`), draws none
_NOT_A_DRAW = re.compile(r"^gc\.collect$|display|replay|(^|[._])(has|is|log|save|dump|print|plot|record|report"
                         r"|slice|select|split|shard|chunk|subset|index|collate|pad)_"
                         r"|(^|_)(stats?|statistics|metrics?|loss|losses)(_|$)", re.IGNORECASE)
