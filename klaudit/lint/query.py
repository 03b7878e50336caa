"""What check-grad asks the lint analysis: the KL functions of a file, and how the code around a
KL helper uses its result (as a loss, as a reward, or both).

check-grad audits a helper such as OpenRLHF's `compute_approx_kl` both ways; this query says which
way the user's own code takes. It runs the lint's flow analysis over the files of the helper's
project that call it by name: a KL term keeps the origin (the statement where the estimator was
formed) through arithmetic, reductions and calls, so a loss or reward sink that holds a term with
an origin the helper returned is a use of the helper in that placement.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import libcst as cst

from klaudit.catalog import Config, Returns, without_gradient
from klaudit.config import load_settings
from klaudit.frameworks.drivers import reward_training
from klaudit.lint import algebra, roles
from klaudit.lint.checks import as_trained, config_of, trained_later
from klaudit.lint.engine import discover_files
from klaudit.lint.facts import (
    Env,
    Fact,
    Labels,
    Outcome,
    SwitchValue,
    Value,
    bare_parameter_facts,
    is_excluded,
    is_literal,
    param_facts,
    takes,
    tensor,
)
from klaudit.lint.flow import registered_names
from klaudit.lint.kinds import Placement, SinkKind
from klaudit.lint.modules import Analyzer, Module, module_functions
from klaudit.lint.project import Project
from klaudit.lint.registries import passes_rewards_through
from klaudit.lint.signatures import InputReads, Signature, input_reads, parameter_reads, signatures
from klaudit.lint.sources import read_source
from klaudit.lint.syntax import params

PLACEMENT_OF_SINK: dict[SinkKind, Placement] = {"loss": "loss", "reward": "reward", "advantage": "reward"}


def placement_of(config: Config | None, sink_kind: SinkKind) -> Placement:
    """check-grad's name for how a KL term is used: "loss", "reward", or, when the same values are
    differentiated and also propagated detached, "loss+reward" (reward-to-go or whole sequence: the
    same expectation) or "loss+future" (future-only returns). A detached term added to a loss as it is is a
    loss (kl-math.md row 1c)."""
    if config is None:
        return PLACEMENT_OF_SINK[sink_kind]
    if config.loss is not None and config.reward is not None:
        return "loss+future" if config.returns is Returns.FUTURE else "loss+reward"
    return "loss" if config.loss is not None or without_gradient(config) else "reward"


class _Watching(Analyzer):
    """An Analyzer that remembers the origins of the KL terms one function returns to its callers."""

    def __init__(self, project: Project, watched: cst.FunctionDef) -> None:
        super().__init__(project)
        self.watched = watched
        self.returned_origins: set[int] = set()

    def call(self, module: Module, func: cst.FunctionDef, cls: str | None, env: Env, fresh: bool = False,
             across: bool = False) -> Outcome:
        outcome = super().call(module, func, cls, env, fresh, across)
        if func is self.watched:
            self.returned_origins |= {id(fact.origin) for fact in _kl_facts(outcome.returns)}
        return outcome


def _kl_facts(facts: Value) -> Iterator[Fact]:
    """The KL facts of a value, inside tuples and dicts too (`kl, stats = helper(...)`)."""
    for fact in facts:
        if fact.role in ("tuple", "dict"):
            for item in fact.items:
                yield from _kl_facts(item[1] if fact.role == "dict" else item)
        elif fact.is_kl() and fact.origin is not None:
            yield fact


def kl_functions(path: str) -> list[str]:
    """Qualified names of the functions and methods of `path` that return a KL term or put one into a
    loss or reward (parameters take their roles from their names, as the lint reads them)."""
    file = Path(path).resolve()
    project = Project([package_root(file)])
    tree = project.parse(file)
    if tree is None:
        return []
    analyzer = Analyzer(project)
    module = analyzer.module(str(file), tree)
    found = []
    for func, cls in module_functions(tree):
        try:
            outcome = analyzer.analyse(module, func, cls)
        except RecursionError:
            continue
        if any(True for _ in _kl_facts(outcome.returns)) or any(sink.facts for sink in outcome.sinks):
            found.append(f"{cls}.{func.name.value}" if cls else func.name.value)
    return found


@dataclass(frozen=True)
class InlineSite:
    """A KL term a function computes and puts into a loss or reward itself: the function, the line of
    the statement that forms the estimator, the line of the sink, the placement, and the line where the term
    enters the sink's value (`loss = pg + beta * kl` before `loss.backward()`)."""

    qualname: str
    origin_line: int
    sink_line: int
    placement: Placement
    entry_line: int = 0  # the statement where the term enters the loss or reward (0: the sink's)


@dataclass(frozen=True)
class KLSite:
    """One KL term the lint judges in `path`, one switch branch of it: where the lint reports it (`line`,
    the statement where the term enters the loss or reward, in `function`), the configuration it reads
    and its rules, and what check-grad audits for it: the inline statements (`inline`, formed in
    `function` itself at `origin_line`) or the function of the linted tree that `function` calls and
    whose result carries the term (`helper_path`::`helper`; None when the term comes from elsewhere,
    e.g. a field another function stored). `labels`: the switch values that select the branch."""

    path: str
    function: str
    line: int
    sink_line: int
    origin_path: str | None
    origin_line: int | None
    inline: bool
    helper_path: str | None
    helper: str | None
    placement: Placement
    config: Config
    clamped: bool
    labels: Labels
    rules: tuple[str, ...]
    # of each of `helpers()`, in that order: ((parameter, role), ...) the lint reads the inputs its call hands it as
    # (`_input_role`), and ((parameter, values), ...) that call fixes to string literals
    # (`compute_approx_kl(..., kl_penalty="k3")`: the only values of that switch this branch takes)
    helper_inputs: tuple[tuple[tuple[str, str], ...], ...] = ()
    passed: tuple[tuple[tuple[str, tuple[str, ...]], ...], ...] = ()
    admits: frozenset[str] = frozenset()  # the only names a registry runs `function` under (none: any)
    # the functions under `helper` whose results carry the term too, outermost first (path, qualname): where
    # `helper` takes what check-grad cannot make (configs, a model's output dict), the estimator it calls
    inner_helpers: tuple[tuple[str, str], ...] = ()
    # of each of `helpers()`, the function boundaries the term had crossed when its call returned it; and those
    # it had crossed when first clamped (where `clamped`)
    helper_depths: tuple[int, ...] = ()
    clamped_calls: int = 0

    def helpers(self) -> tuple[tuple[str, str], ...]:
        """`helper` and then `inner_helpers`: the functions check-grad may audit for this term, in that order."""
        outer = ((self.helper_path, self.helper),) if self.helper_path and self.helper else ()
        return outer + self.inner_helpers

    def inputs_of(self, helper: tuple[str, str]) -> tuple[tuple[str, str], ...]:
        """The inputs the call of `helper` (one of `helpers()`) hands it, as the lint reads them (`helper_inputs`)."""
        return dict(zip(self.helpers(), self.helper_inputs)).get(helper, ())

    def passed_to(self, helper: tuple[str, str]) -> tuple[tuple[str, tuple[str, ...]], ...]:
        """The switches the call of `helper` (one of `helpers()`) fixes to literals (`passed`)."""
        return dict(zip(self.helpers(), self.passed)).get(helper, ())

    def clamped_in(self, helper: tuple[str, str]) -> bool:
        """Whether the term is clamped inside `helper` (one of `helpers()`), not by the code that calls it."""
        depth = dict(zip(self.helpers(), self.helper_depths)).get(helper)
        return self.clamped and (depth is None or self.clamped_calls < depth)


class _Tracing(Analyzer):
    """An Analyzer that remembers, for each estimator, the function calls whose results carry it, by the
    function boundaries it had crossed (the helper a trainer calls, and the one that helper calls)."""

    def __init__(self, project: Project) -> None:
        super().__init__(project)
        # (function, id(origin)) -> {function boundaries the returned term had crossed: (path, qualname)} of the
        # calls made inside that function, the analysed one's included
        self.inside: dict[tuple[tuple[str, str], int], dict[int, tuple[str, str]]] = {}
        self._running: list[tuple[str, str]] = []  # the functions whose bodies are being interpreted, innermost last
        self.analysed: tuple[str, str] | None = None
        # (id(origin), the called function) -> {parameter: role} of the calls of it that formed the term (a helper
        # called on per-token log-probs in one branch and on log-probs over the vocabulary in another forms a
        # different term in each), and {parameter: string literals} they pass
        self.inputs: dict[tuple[int, tuple[str, str]], dict[str, str]] = {}
        self.passed: dict[tuple[int, tuple[str, str]], dict[str, set[str]]] = {}

    def analyse(self, module: Module, func: cst.FunctionDef, cls: str | None) -> Outcome:
        """As Analyzer.analyse, with the calls made inside each function recorded by that function (recorded by the
        term alone, a caller analysed before had named this function itself as the call that returned the term);
        they are kept from one analysis to the next, as a call met again is answered from the Analyzer's memo."""
        self.analysed = (str(Path(module.path).resolve()), f"{cls}.{func.name.value}" if cls else func.name.value)
        self._running = [self.analysed]
        try:
            return super().analyse(module, func, cls)
        finally:
            self._running = []

    def callees_of(self, fact) -> list[tuple[int, tuple[str, str]]]:
        """The calls that returned `fact`'s term, outermost first, each with the function boundaries the term had
        crossed when it returned: the call of the analysed function whose result had crossed as many as `fact`,
        else the deepest one below that (the term passed through more helpers, such as a reward-to-go, after
        the call that formed it); then, inside each, the call that returned it. A term that came through stored
        state (`experience.kl`, set by another method) starts from the calls that returned it in any analysis."""
        origin = id(fact.origin)
        found = self.inside.get((self.analysed, origin), {}) if self.analysed is not None else {}
        if not any(calls <= fact.calls for calls in found):
            found = {}
            for (_, held), made in self.inside.items():
                for calls, called in made.items() if held == origin else ():
                    if called != self.analysed:
                        found.setdefault(calls, called)
        below = [calls for calls in found if calls <= fact.calls]
        if not below:
            return []
        chain = [(max(below), found[max(below)])]
        while True:
            depth, helper = chain[-1]
            inner = {calls: called for calls, called in self.inside.get((helper, origin), {}).items()
                     if called not in {link for _, link in chain}}
            if not inner:
                return chain
            # the call that returned it with the most crossings up to this one's (a straight-through estimate, whose
            # detached half keeps its own count, can return it with as many as the helper around it)
            nearest = max((calls for calls in inner if calls <= depth), default=max(inner))
            chain.append((nearest, inner[nearest]))

    def call(self, module: Module, func: cst.FunctionDef, cls: str | None, env: Env, fresh: bool = False,
             across: bool = False) -> Outcome:
        qualname = f"{cls}.{func.name.value}" if cls else func.name.value
        called = (str(Path(module.path).resolve()), qualname)
        enclosing = self._running[-1] if self._running else None
        self._running.append(called)
        try:
            outcome = super().call(module, func, cls, env, fresh, across)
        finally:
            self._running.pop()
        passed = {id(fact.origin) for facts in env.values() if isinstance(facts, tuple) for fact in _kl_facts(facts)}
        formed = [fact for fact in _kl_facts(outcome.returns) if id(fact.origin) not in passed]
        inputs: dict[str, str] = {}  # what the call hands the function: inputs read by role,
        literals: dict[str, str] = {}  # and switches fixed to a literal
        for parameter, facts in env.items() if formed else ():
            role = _input_role(facts, parameter) if isinstance(facts, tuple) else None
            if role is not None:
                inputs[parameter] = role
            text = _literal_text(facts) if isinstance(facts, tuple) else None
            if text is not None:
                literals[parameter] = text
        # log-probs swapped at this call: both sides, else one side read as the other's is a name the lint
        # misreads (a teacher's log-probs in the phase that trains the teacher), no swap
        swapped = {parameter for parameter, role in inputs.items() if role in _SWAPPED_INPUTS.values()}
        if {inputs[parameter] for parameter in swapped} != set(_SWAPPED_INPUTS.values()):
            inputs = {parameter: role for parameter, role in inputs.items() if parameter not in swapped}
        for fact in formed:  # formed inside the call, not handed to it (reward_to_go(kl))
            if enclosing is not None:
                self.inside.setdefault((enclosing, id(fact.origin)), {}).setdefault(fact.calls, called)
            self.inputs.setdefault((id(fact.origin), called), {}).update(inputs)
            for parameter, text in literals.items():
                self.passed.setdefault((id(fact.origin), called), {}).setdefault(parameter, set()).add(text)
        return outcome

    def handed(self, fact, helpers: Sequence[tuple[str, str]]) -> tuple[tuple, tuple]:
        """Of each of `helpers`, what the calls of it that formed `fact`'s term hand it: the inputs by role
        (`_inputs_of`) and the literals by parameter (`KLSite.helper_inputs`, `KLSite.passed`)."""
        inputs = tuple(_inputs_of(self.inputs.get((id(fact.origin), helper), {}), fact) for helper in helpers)
        passed = tuple(tuple(sorted((parameter, tuple(sorted(texts))) for parameter, texts in
                                    self.passed.get((id(fact.origin), helper), {}).items())) for helper in helpers)
        return inputs, passed


# check-grad's role for an input the lint reads as log-probs over the whole vocabulary (log_softmax of a model's
# logits, [B, T, V]), and the lint's tensor for it: names alone would give it one log-prob per sampled token
_VOCABULARY_INPUTS = {"vocab_logprobs": algebra.Atom(algebra.VOCAB_POLICY, True),
                      "ref_vocab_logprobs": algebra.Atom(algebra.VOCAB_REF)}


def _inputs_of(inputs: Mapping[str, str], fact: Fact) -> tuple[tuple[str, str], ...]:
    """The helper's inputs (`_input_role`) as the site of `fact` reads them: an importance ratio only where its
    term is weighted by one (a branch that passes None to the same parameter is not)."""
    weighted = fact.poly is not None and any(term.weighted for place in ("loss", "reward")
                                             for term in algebra.terms_of(fact.poly, place))
    return tuple(sorted((name, role) for name, role in inputs.items() if role != "ratio" or weighted))


# the roles of per-token log-probs handed to parameters named for the other side (RLinf's `kl_penalty(ref_logprobs,
# logprobs, ...)` into `(logprob, ref_logprob, ...)`): the lint reads the call's order, which names alone would not;
# only both sides swapped at one call count (`_Tracing.call`)
_SWAPPED_INPUTS: dict[tuple[str, str], str] = {(algebra.POLICY, algebra.REF): "logprobs",
                                               (algebra.REF, algebra.POLICY): "ref_logprobs"}


def _input_role(facts: Value, parameter: str) -> str | None:
    """check-grad's role for an input the lint reads as log-probs over the vocabulary (`_VOCABULARY_INPUTS`), as
    the importance ratio exp(logp - old) ("ratio"), or as the policy's or the reference's per-token log-probs where
    the parameter's name says the other (`_SWAPPED_INPUTS`), else None."""
    kinds = {atom.kind for fact in facts if fact.poly is not None for atom in fact.poly.atoms()}
    if kinds and kinds <= {algebra.IS_RATIO, algebra.SCORE}:  # exp(logp - old), where old may be sg(logp)
        return "ratio"
    swapped = _SWAPPED_INPUTS.get((next(iter(kinds)), roles.tensor_role(parameter) or "")) if len(kinds) == 1 else None
    return swapped or next((role for role, atom in _VOCABULARY_INPUTS.items() if kinds == {atom.kind}), None)


def _literal_text(facts: Value) -> str | None:
    """The string a call passes where `facts` are one string literal (`kl_penalty="k3"`), else None."""
    texts = {fact.text for fact in facts if fact.role == "str"}
    return next(iter(texts)) if len(facts) == 1 and len(texts) == 1 and None not in texts else None


def inline_sites(path: str) -> list[InlineSite]:
    """The KL terms of `path` whose estimator is formed in the same function that puts it into a loss
    or reward (the lint's `calls == 0`), one per (function, estimator statement, sink statement)."""
    return kl_sites(path)[0]


def kl_sites(path: str) -> tuple[list[InlineSite], list[tuple[tuple[str, str], ...]]]:
    """The KL terms `path` puts into a loss or reward: those formed inline (`inline_sites`), and for the
    others the helpers of the linted tree (file, qualified name) whose results carry them, outermost first
    (`KLSite.helpers`)."""
    sites = site_verdicts(path)
    inline = {InlineSite(site.function, site.origin_line, site.sink_line, site.placement, site.line): None
              for site in sites if site.inline and site.origin_line is not None}
    helpers = {site.helpers(): None for site in sites if site.helpers()}
    return list(inline), list(helpers)


def site_verdicts(path: str) -> list[KLSite]:
    """Every KL term `path` puts into a loss or reward, per switch branch, as the lint judges it."""
    from klaudit.catalog import clamp_matters, defects
    from klaudit.lint.checks import statement_positions

    file = Path(path).resolve()
    project = Project([package_root(file)])
    tree = project.parse(file)
    if tree is None:
        return []
    positions = {str(file): statement_positions(tree, project.source(tree))}
    analyzer = _Tracing(project)
    module = analyzer.module(str(file), tree)
    training = reward_training(str(file), project.source(tree))  # a framework's actor that trains its KL reward
    rewards_stay = passes_rewards_through(tree)

    def where(origin_path: str, node) -> int | None:
        """The line of statement `node` of the module at `origin_path`."""
        key = str(Path(origin_path).resolve()) if origin_path else str(file)
        if key not in positions:
            found = analyzer.module_at(Path(key))
            positions[key] = {} if found is None else statement_positions(found.tree, project.source(found.tree))
        at = positions[key].get(id(node))
        return None if at is None else at[0]

    sites: dict[KLSite, None] = {}
    entered_here: set[int] = set()  # the terms some use of which enters a loss or reward in this module
    elsewhere: list[tuple[int, KLSite]] = []  # a use entered in another module, reported here where none is
    for func, cls in module_functions(tree):
        qualname = f"{cls}.{func.name.value}" if cls else func.name.value
        span = positions[str(file)].get(id(func))
        try:
            outcome = analyzer.analyse(module, func, cls)
        except RecursionError:
            continue
        for sink in outcome.sinks:
            sink_line = positions[str(file)].get(id(sink.node), (None,))[0]
            for fact in sink.facts:  # judged as the lint judges it: a loss formed under no_grad trains nothing
                config = config_of(fact, sink.kind, sink.trained, rewards_stay)
                if config is None or sink_line is None:
                    continue
                trained = as_trained(config, fact.aggregation is not None, sink.kind, training or trained_later(
                    analyzer, module, (func, cls), config, sink.kind, lambda home, node: where(home.path, node)))
                trained_here, config = trained != config, trained
                entry = positions[str(file)].get(id(fact.entry)) if fact.entry is not None else None
                if fact.entry is not None and entry is None and not trained_here:
                    continue  # it entered the loss in another module: the lint reports it there
                if fact.entry is None or entry is not None:
                    entered_here.add(id(fact.origin))
                origin_path = str(Path(fact.origin_path).resolve()) if fact.origin_path else str(file)
                origin_line = where(fact.origin_path, fact.origin) if fact.origin is not None else None
                inline = origin_path == str(file) and origin_line is not None and origin_line <= sink_line \
                    and span is not None and span[0] <= origin_line <= span[2]  # formed in this function
                chain: dict[tuple[str, str], int] = {}  # helper -> depth, outermost first
                for depth, helper in [] if inline else analyzer.callees_of(fact):
                    chain.setdefault(helper, depth)  # a helper met twice keeps its outermost call
                callee = next(iter(chain), None)
                inputs, literals = analyzer.handed(fact, list(chain))
                clamped = clamp_matters(config, fact.clamped)
                site = KLSite(
                    str(file), qualname, entry[0] if entry else sink_line, sink_line,
                    origin_path if fact.origin is not None else None, origin_line, inline,
                    callee[0] if callee else None, callee[1] if callee else None,
                    placement_of(config, sink.kind), config, clamped, fact.labels,
                    tuple(row.rule for row in defects(config, clamped) if row.rule),
                    inputs, literals,
                    registered_names(func), tuple(chain)[1:], tuple(chain.values()),
                    fact.clamped_calls if clamped else 0)
                if fact.entry is not None and entry is None:
                    elsewhere.append((id(fact.origin), site))
                else:
                    sites[site] = None
    first: dict[tuple, KLSite] = {}  # of each term, branch and function, the first sink it reaches, as reported
    for origin, site in sorted(elsewhere, key=lambda item: item[1].sink_line):
        if origin not in entered_here:
            first.setdefault((origin, site.function, site.labels, site.config), site)
    sites.update((site, None) for site in first.values())
    return _without_logged_copies(list(sites))


def _without_logged_copies(sites: list[KLSite]) -> list[KLSite]:
    """The records less a detached copy of a term that the same function also trains (`mean_loss = (per_token_loss
    * mask).sum() / n` logged with `.item()` beside the loss): the report leaves it out
    (klaudit.lint.checks._without_logged_copies), so it has no verdict to compare."""
    trained = {(site.function, site.origin_path, site.origin_line) for site in sites if not without_gradient(site.config)}
    return [site for site in sites if not without_gradient(site.config)
            or (site.function, site.origin_path, site.origin_line) not in trained]


def functions_of(path: str) -> list[Signature]:
    """The top-level functions and methods of `path` with their parameters and the instance state they read
    (OSError or UnicodeDecodeError when the file does not read, SyntaxError when it does not parse)."""
    try:
        tree = cst.parse_module(Path(path).read_text(encoding="utf-8"))
    except cst.ParserSyntaxError as error:
        raise SyntaxError(error.message, (path, error.raw_line, error.raw_column, "")) from None
    return list(signatures(tree))


_COMPARED = re.compile(r"^(\w+) == (.+)$")  # a numeric comparison's label, `alpha == 1`


def numeric_comparison(label: str) -> tuple[str, float] | None:
    """(switch, number) of the label of a numeric comparison (`alpha == 1`, its values True or False)."""
    compared = _COMPARED.match(label)
    if compared is None:
        return None
    try:
        return compared.group(1), float(compared.group(2))
    except ValueError:
        return None  # an enum member or a constant: no number


def switch_values(path: str, qualname: str,
                  inputs: Mapping[str, str] | None = None) -> dict[str, list[SwitchValue | float]]:
    """`switch_values_at` for the top-level function or method `qualname` of `path`."""
    file = Path(path).resolve()
    project = Project([package_root(file)])
    tree = project.parse(file)
    func = _function(tree, qualname) if tree is not None else None
    owner = qualname.rpartition(".")[0] or None
    return {} if tree is None or func is None else _switch_values(project, file, tree, func, owner, inputs)


def switch_values_at(path: str, name: str, line: int,
                     inputs: Mapping[str, str] | None = None) -> dict[str, list[SwitchValue | float]]:
    """The values of each switch parameter of the function `name` whose definition starts at `line` of `path`
    (nested ones too) that select the KL terms the lint judges, as it labels them: string literals (`==`, `in`,
    `match`, dict dispatch, a value cut after an endswith test), integer indices, the values of a flag that
    select a KL term, and for a numeric comparison (`alpha == 1`) each number compared with and one that is
    none of them. Every parameter the lint gives no role is followed as a switch under its own name, into the
    functions it is passed to. `inputs`: parameters that hold log-probs over the vocabulary (`vocab_logprobs`,
    `ref_vocab_logprobs`, as the lint reads them at a call: `KLSite.inputs_of`), which names alone would
    read as one log-prob per token."""
    located = _located(path, name, line)
    if located is None:
        return {}
    project, file, tree, func, owner = located
    return _switch_values(project, file, tree, func, owner, inputs)


def configs_read_at(path: str, name: str, line: int) -> set[str]:
    """The parameters of the function `name` whose definition starts at `line` of `path` that it reads settings
    through (`config.kl_penalty`, `config.get("kl_penalty", "kl")`) and never uses whole."""
    located = _located(path, name, line)
    if located is None:
        return set()
    chains, bare = parameter_reads(located[3])
    return {chain.split(".")[0] for chain in chains} - set(bare)


def input_reads_at(path: str, name: str, line: int) -> InputReads:
    """How the function `name` whose definition starts at `line` of `path` reads its tensor parameters: the ones it
    cuts a position off and the ones it fills in itself when not given (signatures.InputReads)."""
    located = _located(path, name, line)
    return input_reads(located[3]) if located is not None else InputReads()


def _located(path: str, name: str, line: int) -> tuple[Project, Path, cst.Module, cst.FunctionDef, str | None] | None:
    """The project of `path`, the file, its tree, and the function `name` defined at `line` with its class, or None."""
    file = Path(path).resolve()
    project = Project([package_root(file)])
    tree = project.parse(file)
    found = _function_at(tree, project.source(tree), name, line) if tree is not None else None
    return None if tree is None or found is None else (project, file, tree, *found)


def _switch_values(project: Project, file: Path, tree: cst.Module, func: cst.FunctionDef,
                   cls: str | None, inputs: Mapping[str, str] | None = None) -> dict[str, list[SwitchValue | float]]:
    analyzer = Analyzer(project)
    module = analyzer.module(str(file), tree)
    names = [param.name.value for param in params(func)] + [func.name.value]
    env: Env = {}
    for param in params(func):
        own = param.name.value
        vocabulary = _VOCABULARY_INPUTS.get((inputs or {}).get(own, ""))
        env[own] = (tensor(algebra.Poly.atom(vocabulary)),) if vocabulary is not None else param_facts(param, may_be_none=True) or \
            bare_parameter_facts(own, names) or (() if own in ("self", "cls") else (Fact(role="str", name=own),))
    switches = {own for own, facts in env.items() if any(f.role in ("str", "bool") for f in facts)}
    switches |= _instance_switches(tree, func, cls) | {chain.rsplit(".", 1)[-1] for chain in parameter_reads(func)[0]}
    try:
        outcome = analyzer.call(module, func, cls, env)
    except RecursionError:
        return {}
    # the terms the lint judges (a catalog estimator in a loss or a reward): a switch value that selects only
    # a form it leaves unjudged (the exact forward KL, a JSD mixture) makes no claim to compare or audit
    facts = [fact for fact in _kl_facts(outcome.returns) if config_of(fact, "loss") or config_of(fact, "reward")]
    facts += [fact for sink in outcome.sinks for fact in _kl_facts(sink.facts) if config_of(fact, sink.kind)]
    values: dict[str, list[SwitchValue | float]] = {}
    others: dict[str, set[float]] = {}  # a switch -> the numbers it is compared with, where a term needs none of them
    unnamed: dict[str, list[list[tuple[SwitchValue, ...]]]] = {}  # a switch -> the exclusions selecting a term
    for fact in facts:
        numbers: dict[str, list[tuple[float, SwitchValue]]] = {}
        excluded: dict[str, list[tuple[SwitchValue, ...]]] = {}
        for label, chosen in fact.labels:
            compared = numeric_comparison(label)
            if compared is not None and compared[0] in switches:
                numbers.setdefault(compared[0], []).append((compared[1], chosen[0]))
            elif label in switches:
                values.setdefault(label, []).extend(v for v in chosen if is_literal(v))
                if chosen and all(is_excluded(v) for v in chosen):
                    excluded.setdefault(label, []).append(chosen)
        for switch, exclusions in excluded.items():
            unnamed.setdefault(switch, []).append(exclusions)
        for switch, tested in numbers.items():
            equal = [number for number, truth in tested if truth is True]
            values.setdefault(switch, []).extend(equal)
            if not equal:  # the term is selected where the switch equals none of the numbers compared
                others.setdefault(switch, set()).update(number for number, _ in tested)
    source = project.source(tree)
    ordered = {switch: sorted(dict.fromkeys(found), key=lambda value: _written_at(value, source))
               for switch, found in values.items() if found}
    for switch, tested_numbers in others.items():  # a value that takes the branch where every comparison is false
        low = sorted(tested_numbers)
        ordered.setdefault(switch, []).append((low[0] + low[1]) / 2 if len(low) > 1 else low[0] + 1.0)
    defaults = {param.name.value: str(param.default.evaluated_value) for param in params(func)
                if isinstance(param.default, cst.SimpleString)}
    for switch, branches in unnamed.items():  # a term selected by a value none of the literals is: one such value
        for exclusions in branches:
            known: list[SwitchValue | float] = ordered.get(switch, []) + ([defaults[switch]] if switch in defaults else [])
            if not any(not isinstance(value, float) and all(takes(value, chosen) for chosen in exclusions)
                       for value in known):
                ordered.setdefault(switch, []).append(_other_value(known))
    return ordered


def _other_value(taken: Sequence[SwitchValue | float]) -> str:
    """A string switch value none of `taken` is: the branch a switch takes past every value the code names."""
    return next(name for name in ("other", *(f"other{n}" for n in range(1, len(taken) + 2))) if name not in taken)


def instance_switches(path: str, qualname: str) -> set[str]:
    """The switches the method `qualname` of `path` reads from its instance (`self.config.kl_penalty`), with
    values its KL terms are labelled with."""
    file = Path(path).resolve()
    tree = Project([package_root(file)]).parse(file)
    func = _function(tree, qualname) if tree is not None else None
    if tree is None or func is None or "." not in qualname:
        return set()
    return _instance_switches(tree, func, qualname.rpartition(".")[0]) & set(switch_values(path, qualname))


def _instance_switches(tree: cst.Module, func: cst.FunctionDef, cls: str | None) -> set[str]:
    """The names a method reads from instance state (`self.config.kl_penalty`: `kl_penalty`), followed as switches
    under that name: check-grad sets them on the instance it calls the method on (klaudit.audit.bind)."""
    if cls is None:
        return set()
    qualname = f"{cls}.{func.name.value}"
    found = next((signature for signature in signatures(tree) if signature.qualname == qualname), None)
    return {chain.rsplit(".", 1)[-1] for chain in found.chains} if found is not None else set()


def _written_at(value: SwitchValue | float, source: str) -> tuple[int, float, int]:
    """Where a switch value is written in the source, to list values in the order the code names them: a
    string at its first quoted spelling (a suffixed one after the value it extends), a number by its value."""
    if not isinstance(value, str):
        return (0, float(value), 0)
    for cut in range(len(value)):
        spelled = value[:len(value) - cut]
        at = min((i for i in (source.find(f'"{spelled}"'), source.find(f"'{spelled}'")) if i >= 0), default=-1)
        if spelled and at >= 0:
            return (1, at, cut)
    return (1, len(source), 0)


def returned_sign(source: str, name: str, near: str) -> int:
    """The sign of the KL estimate the function `name` of `source` returns, as a reward reads it: -1 where
    every KL value it returns is a negated estimator (`teacher_logp - policy_logp`, an advantage to maximise),
    else 1. `near`: the file the source was cut out of (its project resolves the helpers it calls)."""
    tree = cst.parse_module(source)
    func = _function(tree, name)
    if func is None:
        return 1
    analyzer = Analyzer(Project([package_root(Path(near).resolve())]))
    module = analyzer.module(str(Path(near).resolve().with_name(f"_{name}.py")), tree)
    try:
        outcome = analyzer.analyse(module, func, None)
    except RecursionError:
        return 1
    signs = {term.sign for fact in _kl_facts(outcome.returns) if fact.poly is not None
             for term in algebra.terms_of(fact.poly, "reward")}
    return -1 if signs == {-1} else 1


def _function_at(tree: cst.Module, source: str, name: str, line: int):
    """(def, enclosing class name or None) of the function `name` whose definition starts at `line` (its
    first decorator's line, or the def's): the nearest def of that name at or after `line`."""
    from klaudit.lint.checks import statement_positions

    positions = statement_positions(tree, source)
    found = []

    class Defs(cst.CSTVisitor):
        def __init__(self) -> None:
            self.classes: list[str | None] = [None]

        def visit_ClassDef(self, node: cst.ClassDef) -> None:
            self.classes.append(node.name.value)

        def leave_ClassDef(self, node: cst.ClassDef) -> None:
            self.classes.pop()

        def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
            at = positions.get(id(node))
            if node.name.value == name and at is not None and at[0] >= line:
                found.append((at[0], node, self.classes[-1]))
            self.classes.append(None)

        def leave_FunctionDef(self, node: cst.FunctionDef) -> None:
            self.classes.pop()

    tree.visit(Defs())
    return min(found, key=lambda item: item[0])[1:] if found else None


def package_root(path: Path) -> Path:
    """The directory above the outermost package holding `path` (its own directory outside packages)."""
    return package_of(path)[0]


def package_of(path: str | Path) -> tuple[Path, list[str]]:
    """The directory above the outermost package holding `path`, and the file's dotted name below it. A folder
    without an __init__.py inside a package is a namespace subpackage of it (SkyRL's workers/megatron/)."""
    file = Path(path).resolve()
    parts = [file.stem]
    directory = file.parent
    while (directory / "__init__.py").is_file() or (directory.parent / "__init__.py").is_file():
        parts.insert(0, directory.name)
        directory = directory.parent
    return directory, parts


@dataclass(frozen=True)
class Use:
    """One way the code around a helper uses its result: check-grad's placement name, the lint's
    configuration of that use (None where no catalog estimator matches), whether the lint saw a clamp
    on the way, and the switch values that select it (((name, (values, ...)), ...))."""

    placement: Placement
    config: Config | None
    clamped: bool
    labels: Labels


def placements_of(path: str, qualname: str, root: str | None = None) -> set[Placement]:
    """How the Python files under `root` (default: the helper's project) use the result of `qualname`
    defined in `path`: a set of `placement_of` names, empty when no call of it reaches a loss or reward."""
    return {use.placement for use in uses_of(path, qualname, root)}


def uses_of(path: str, qualname: str, root: str | None = None) -> list[Use]:
    """Every use, as the lint sees it, of the result of `qualname` defined in `path` by the Python files
    under `root` (default: the helper's project) that reaches a loss or a reward."""
    helper_path = Path(path).resolve()
    top = Path(root).resolve() if root is not None else package_root(helper_path)
    project = Project([top])
    tree = project.parse(helper_path)
    watched = _function(tree, qualname) if tree is not None else None
    if watched is None:
        return []
    analyzer = _Watching(project, watched)
    called = re.compile(r"\b" + re.escape(qualname.rsplit(".", 1)[-1]) + r"\s*\(")
    sinks = []
    for caller_path in discover_files([str(top)], load_settings([str(top)])):
        text = read_source(caller_path)
        caller_tree = project.parse(Path(caller_path)) if isinstance(text, str) and called.search(text) else None
        if caller_tree is None:
            continue
        module = analyzer.module(caller_path, caller_tree)
        for func, cls in module_functions(caller_tree):
            try:
                sinks += analyzer.analyse(module, func, cls).sinks
            except RecursionError:
                continue  # as the lint does: one function too deeply nested to interpret
    uses = []
    for sink in sinks:
        for fact in sink.facts:
            if id(fact.origin) in analyzer.returned_origins:
                config = config_of(fact, sink.kind, sink.trained)
                uses.append(Use(placement_of(config, sink.kind), config, fact.clamped, fact.labels))
    return list(dict.fromkeys(uses))


def _function(tree: cst.Module, qualname: str) -> cst.FunctionDef | None:
    """The def of `function` or `Class.method` at the top of `tree`."""
    owner, _, name = qualname.rpartition(".")
    body: Sequence[cst.CSTNode] = tree.body
    if owner:
        classes = [s for s in body if isinstance(s, cst.ClassDef) and s.name.value == owner]
        body = classes[0].body.body if classes else ()
    return next((s for s in body if isinstance(s, cst.FunctionDef) and s.name.value == name), None)

