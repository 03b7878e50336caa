"""Calls: which function a call runs, and the facts it is given and returns.

A call is, in this order: a method the analysis knows (`.backward()`, `.get("key")`, `.append(x)`,
`.remote(...)`, a tensor method, klaudit.lint.library), a function held as a value
(klaudit.lint.callables), a function or class of the linted tree (interpreted by
klaudit.lint.modules.Analyzer with the caller's argument facts bound to its parameters), or a
library function (klaudit.lint.library). A call of code outside the tree that computes returns or
logs metrics uses the values it is given.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable

import libcst as cst

from klaudit.lint import algebra as alg
from klaudit.lint import roles
from klaudit.lint.algebra import Atom, Poly
from klaudit.lint.assignments import records_metrics
from klaudit.lint.callables import Callee, callees_among, left_default
from klaudit.lint.facts import (
    CRITIC,
    Fact,
    compatible,
    computed_without_grad,
    detach_all,
    logits_of_the_reference,
    loss_part,
    merge_labels,
    of_the_old_policy,
    of_the_reference,
    param_facts,
    reference_kinds,
    replace,
    returned_by,
    tensor,
)
from klaudit.lint.flowstate import FlowState
from klaudit.lint.library import LOSS_MODULES
from klaudit.lint.project import is_installed_model
from klaudit.lint.syntax import (
    bound_names,
    decorated_no_grad,
    dotted,
    last_name,
    marks_counted_tokens,
    maximises,
    params,
    string_value,
)

_BUILTINS = frozenset(dir(builtins))  # len(v), sum(v), isinstance(...): Python's own, which use nothing


class CallFlow(FlowState):
    """Calls and the binding of their arguments, for klaudit.lint.flow.FunctionRun."""

    def e_Call(self, node: cst.Call) -> tuple:
        func = node.func
        value = None
        if type(func) is cst.Attribute:  # type(): see klaudit.lint.syntax
            value = self.method_call(func.attr.value, func.value, node)
        if value is None:
            value = self.call_target(func, node)
        self.note_comparison(node)
        return value

    def call_target(self, func: cst.BaseExpression, node: cst.Call) -> tuple:
        """A call of `func` with the arguments of `node` (`f.remote(...)` calls f with them)."""
        held = self.held_by(func)
        callees = callees_among(held)
        if callees:
            # a callee picked by a switch (a dispatch table's entry) gives results under that switch value
            return tuple(dict.fromkeys(replace(fact, labels=merge_labels(fact.labels, held.labels))
                                       for held in callees for fact in self.call_callee(held.callee, node)
                                       if compatible(fact.labels, held.labels)))
        modules = [f for f in held if f.role == "loss-module"]
        if modules:
            return self.loss_module_call(modules[0], node)
        resolved = self.analyzer.resolve(self.module, func, self.cls, imports=self.worth_following(node))
        if resolved is not None:
            return self.call_summary(resolved, node) or _logprobs_of_a_model(func, self.no_grad, self.stmt)
        name = dotted(func).split(".")[-1]
        logged = records_metrics(func)
        if roles.is_return_computation(name):
            for arg in node.args:  # rewards handed to a GAE / RLOO / GRPO advantage outside the tree
                self.confirm(self.expr(arg.value))
            if roles.names_whitening(name) and node.args:
                # `masked_whiten(advantages, mask)` (TRL's, in a module without KL words): a shift by the batch
                # mean, a baseline, and a scale by a batch statistic: the per-token terms go on to the loss
                return self.expr(node.args[0].value)
        elif logged:
            for arg in node.args:  # logged: `self.log(...)`, `gather_for_metrics(kl)`, `self.stats[k].append(kl)`
                self.settle(self.expr(arg.value))
        # an imported class is followed when its words speak of KL or a loss (KLEstimator) or KL facts go in
        words = roles.snake_words(name)
        found = (self.analyzer.resolve_class(self.module, func, imports=self.worth_following(node)
                                             or roles.might_contain_kl(words) or "estimator" in name.lower())
                 if name[:1].isupper() else None)
        if found is not None:
            module, classdef = found
            return self.instance(module, classdef, node)
        if name == "partial":
            return self.partial(node)
        if name in LOSS_MODULES:
            return self.library_call(name, node)
        if name == "dict" or (name[:1].isupper() and node.args and all(a.keyword is not None for a in node.args)):
            return self.build_record([], [], self.args(node)[1])  # dict(kl=kl), Experience(kl=kl, ...)
        if roles.calls_a_critic(dotted(func)) and not self.no_grad:
            return (CRITIC,)  # a value network's estimate, with gradient: what a critic's loss trains
        if _per_token_loss_of_a_model(node):
            return _token_losses_of_a_model(func, self.no_grad)
        if logprobs := _logprobs_of_a_model(func, self.no_grad, self.stmt):
            return logprobs
        value = self.library_call(name, node)
        if not value and not logged and self.out_of_sight(func, name):
            for arg in node.args:  # what code out of sight makes of a reward (`truncate_rows(rewards)`,
                facts = self.expr(arg.value)  # `queue.put(...)`), the analysis cannot follow: it is used
                if arg.keyword is not None and roles.sink_of_name(arg.keyword.value) == "advantage":
                    self.given_as_advantages(facts, arg.value)
                else:
                    self.hand_on(facts)
        return value

    def out_of_sight(self, func: cst.BaseExpression, name: str) -> bool:
        """A call of code the analysis does not see: not Python's builtins, not an array library's
        function, and not made to fill a metrics entry (`metrics["r"] = torch.Tensor([...])`)."""
        if name in _BUILTINS or dotted(func).rsplit(".", 1)[0] in roles.ARRAY_MODULES:
            return False
        return not any(records_metrics(target.target) for target in getattr(self.stmt, "targets", ()))

    def worth_following(self, node: cst.Call) -> bool:
        """Follow a call into another module only when it can matter: KL or log-prob facts go in,
        or its name speaks of KL, log-probs or a loss (parsing other modules is the costly part)."""
        name = dotted(node.func).split(".")[-1]
        if roles.might_contain_kl(name) or roles.speaks_of_logprobs(name) or "loss" in name.lower() or "reward" in name.lower():
            return True
        return any(f.role == "tensor" and f.poly is not None and not f.poly.is_const()
                   for arg in node.args for f in self.expr(arg.value))

    def args(self, node: cst.Call) -> tuple:
        positional = [a.value for a in node.args if a.keyword is None and not a.star]
        keywords = {a.keyword.value: a.value for a in node.args if a.keyword is not None}
        return positional, keywords

    def call_callee(self, callee: Callee, node: cst.Call) -> tuple:
        """A call of a function held as a value: its closure and the partial's bound arguments come first."""
        bound = {name: _handed_in(facts) for name, facts in callee.bound_keywords}
        return self.call_summary((callee.module, callee.func, callee.cls), node, dict(callee.closure), callee.bound, bound,
                                 built=callee.built)

    def call_summary(self, resolved, node: cst.Call, closure=None, bound=(), bound_keywords=None, built=None) -> tuple:
        module, func, cls = resolved
        positional, keywords = self.args(node)
        positional = [*bound, *positional]
        parameters = params(func)
        if parameters and parameters[0].name.value in ("self", "cls") and (cls is not None):
            if parameters[0].name.value == "self" and _through_the_class(node, cls) and positional:
                positional = positional[1:]  # `GRPOTrainer._compute_grpo_loss(self, ...)`: the instance comes first
            parameters = parameters[1:]
        env = dict(closure or {})
        handed_on: set[int] = set()  # the origins of terms this function was handed and hands on here
        spread = any(a.star == "**" for a in node.args)  # f(x, **options): any parameter may come from it
        spread_entries: dict = {}  # the entries of a spread dict the analysis knows (`f(**{"mode": m})`)
        explained_by_name: set[str] = set()  # parameters given an argument only their own name explains
        for a in node.args:
            if a.star == "**":
                for key, facts in (item for f in self.expr(a.value) if f.role == "dict" for item in f.items):
                    spread_entries[key] = tuple(dict.fromkeys(spread_entries.get(key, ()) + facts))
        for index, param in enumerate(parameters):
            name = param.name.value
            arg = positional[index] if index < len(positional) else keywords.get(name, spread_entries.get(name))
            if bound_keywords and name in bound_keywords and arg is None:
                env[name] = bound_keywords[name]
                continue
            if isinstance(arg, tuple):  # facts bound ahead of the call
                handed_on.update(id(f.origin) for f in arg if f.is_kl() and f.passed)
                env[name] = _handed_in(arg)
                continue
            if arg is not None:
                given = self.expr(arg)
                handed_on.update(id(f.origin) for f in given if f.is_kl() and f.passed)
                facts = _handed_in(given)
                label = last_name(arg)
                # the log-probs of a preference pair's side hold no KL atom: nothing to explain
                if (any(f.role == "str" for f in facts) or not facts) and not roles.names_pair_logprobs(label):
                    facts = tuple(replace(f, name=f.name or label) if f.role == "str" else f for f in facts)
                    if not facts:
                        # an argument the analysis cannot explain: the parameter's name can (a tensor
                        # role), else it is taken for a switch value named after the argument
                        facts = tuple(f for f in param_facts(param) if f.role in ("tensor", "mask"))
                        explained_by_name.add(name)
                    if not facts and label and not roles.tensor_role(label):
                        facts = (Fact(role="str", name=label),)
                if roles.names_pair_logprobs(name) and reference_kinds(facts):
                    facts = ()  # a preference pair's reference side (`ref_chosen_logps`): a DPO loss holds no KL
                if roles.sink_of_name(name) == "advantage" and any(f.is_kl() for f in given):
                    # the caller's terms enter the advantages here, as the caller holds them (handed in or not)
                    facts = _handed_in(self.given_as_advantages(given, arg))
                env[name] = facts
            elif param.default is not None:
                env[name] = left_default(param, spread, self.expr)
            else:
                env[name] = param_facts(param)
        _bind_detached_copies(env, parameters, positional, keywords, explained_by_name)
        outcome = self.analyzer.call(module, func, cls, env, self.on_fresh_samples(), across=module is not self.module)
        for facts in env.values():
            self.settle(facts)  # handed to a function of the tree, whose analysis follows it
        # where a term already entered a loss or reward here, it stays reported there; a term that enters
        # one inside the callee is reported at this call, or, formed by an installed framework's object this module
        # built, where it was built (its settings: Liger's `LigerFusedLinearGRPOLoss(beta=..., loss_type=...)`)
        entered = {f.entry for facts in env.values() for f in facts if f.entry is not None}
        site = built[1] if built is not None and built[0] == self.module.path else node
        # a term this function was itself handed stays its caller's through the callee's sinks and returns
        for sink in outcome.sinks:
            self.sink(sink.kind, tuple(replace(f, entry=f.entry if f.entry in entered else site if is_installed_model(
                f.origin_path) and site is not node else None, passed=id(f.origin) in handed_on)
                for f in sink.facts), node, via=sink)
        if roles.names_implicit_reward(func.name.value):
            return ()  # PRIME's compute_implicit_reward: the reward model's score, whatever its caller names it
        returns = _as_the_callers(outcome.returns, handed_on)
        models = [*_receiver(node), *positional]  # `ref.seq_logprob(x)`: the model is the object called on
        if self.runs_the_reference(func, models, keywords):
            returns = of_the_reference(returns)
        elif _computes_the_references_logits(func, models, keywords):
            returns = logits_of_the_reference(returns)
        elif _runs_the_old_policy(func, models, keywords):
            returns = of_the_old_policy(returns)
        returns = returned_by(func, returns)  # after those: log-probs of the reference it ran on are no rollout's
        if decorated_no_grad(func) and not self.no_grad:
            returns = computed_without_grad(returns)
        if module is self.module:
            return returns
        return _entering_here(returns, entered, site, self.module.path)

    def runs_the_reference(self, func: cst.FunctionDef, positional: list, keywords: dict) -> bool:
        """A helper named for the reference's log-probs (`ref_logps(policy, ...)`), or named for log-probs and given
        the reference model (`logps(ref, seq)`, `get_logps(self.ref_model, batch)`) and none of the policy's log-probs or logits (which
        its result could be made of). Only a result of the policy's kinds alone is read so (of_the_reference), and
        not where it is stored as a preference pair's side (`ref_chosen_logps`: a DPO loss holds no KL penalty)."""
        if any(roles.names_pair_logprobs(name) for name in bound_names(self.stmt)):
            return False
        given = [arg for arg in [*positional, *keywords.values()] if isinstance(arg, cst.BaseExpression)]
        if roles.names_reference_outputs(func.name.value):
            return not self.serves_both_models(func, given)
        if not roles.speaks_of_logprobs(func.name.value):
            return False  # a helper of raw logits (`_last_logits(ref_model, ...)`): a logit MSE is no KL
        model = any(type(arg) in (cst.Name, cst.Attribute) and roles.is_reference_model(dotted(arg)) for arg in given)
        return model and not any(f.role == "tensor" and f.poly is not None and f.poly.atoms() and {
            a.kind for a in f.poly.atoms()} <= _POLICY_OUTPUTS for arg in given for f in self.expr(arg))

    def serves_both_models(self, func: cst.FunctionDef, given: list) -> bool:
        """A helper named for the reference (`_teacher_logp`: teacher forcing) that this module also calls with the
        reference model, called here with another model first (`_teacher_logp(policy, ids)`): its result is that
        model's, as the argument says, not the reference's as the name does."""
        first = given[0] if given else None
        if type(first) not in (cst.Name, cst.Attribute) or roles.is_reference_model(dotted(first)):
            return False
        return any(roles.is_reference_model(other) for other in self.module.first_arguments(func.name.value))

    def given_as_advantages(self, facts: tuple, node: cst.CSTNode) -> tuple:
        """`policy_loss_fn(..., advantages=-kl.detach())`: whatever the function does, what it is given as the
        advantages weighs each token's policy gradient, so the terms enter the advantages here, also those
        that only passed a loss-named value on their way (`distillation_losses = kl_penalty(...)`, returned)."""
        return self.sink("advantage", tuple(replace(f, entry=None) if passed_loss_name(f) else f for f in facts), node)

    def method_call(self, method: str, base_node: cst.BaseExpression, node: cst.Call) -> tuple | None:
        positional, keywords = self.args(node)
        if roles.BACKWARD_CALLS.match(method):
            target = loss_part(self.expr(base_node) if not positional else self.expr(positional[0]))
            if maximises(self.module.tree):  # an objective its optimizers ascend: minimised, it is negated
                target = tuple(replace(f, poly=alg.scale(f.poly, -1.0)) if f.poly is not None else f for f in target)
            self.sink("loss", target, node)
            return ()
        if method in ("log_prob",) and dotted(base_node).split(".")[-1].rstrip("()") in ("Categorical", "Normal"):
            return self.from_name("log_prob", node) or (tensor(Poly.atom(Atom(alg.POLICY, not self.no_grad))),)
        receiver_name = dotted(base_node)
        if receiver_name in roles.ARRAY_MODULES:
            return None
        if method == "generate" and _GENERATION_OUTPUTS & keywords.keys():
            return _generation_output()
        if method == "remote":  # a Ray task or actor method: the function, called with these arguments
            return self.call_target(base_node, node)
        if method in ("get", "pop") and positional and isinstance(positional[0], cst.SimpleString) \
                and isinstance(key := string_value(positional[0]), str):
            default = positional[1] if len(positional) > 1 else keywords.get("default")
            return self.read_get(base_node, key, default)
        if method in ("append", "extend") and len(positional) == 1 and last_name(base_node):
            self.add_to_list(base_node, method, positional[0], node)
            return ()
        if _receiver(node) and self.analyzer.method_of_a_local(self.module, method) is not None:
            return None  # `ref.seq_logprob(x)`: a model class's own method, whatever the object's name reads as
        if method == "ne" and len(positional) == 1 and marks_counted_tokens(positional[0]):
            return (Fact(role="mask"),)  # `labels.ne(-100)`: the tokens that count, as `labels != -100` marks them
        base = self.expr(base_node)
        if method in ("endswith", "startswith", "lower", "upper", "strip"):
            return base if method in ("lower", "upper", "strip") else ()
        if not base:
            return None if method not in ("sum", "mean") else ()
        return self.tensor_method(method, base, positional, keywords, node)


def _entering_here(value: tuple, entered: set, call: cst.Call, path: str) -> tuple:
    """A term formed in the module at `path` that entered a loss inside another module's function (`self.loss_fn =
    PolicyLoss(...)`) is reported where that loss comes back: the other module's lint never sees it. One formed and
    entered inside klaudit's model of an installed framework (Liger's fused GRPO loss) enters the loss at `call`,
    where the project chose it (the object's construction, when this module built it)."""
    out = []
    for f in value:
        if f.role == "tuple":
            f = replace(f, items=tuple(_entering_here(item, entered, call, path) for item in f.items))
        elif f.entry is not None and f.entry not in entered and f.origin_path == path:
            f = replace(f, entry=None)
        elif f.entry is not None and is_installed_model(f.origin_path):
            f = replace(f, entry=call)
        out.append(f)
    return tuple(out)


def _bind_detached_copies(env: dict, parameters: list[cst.Param], positional: list, keywords: dict,
                          explained_by_name: set[str]) -> None:
    """An argument that is another argument detached (`grpo_loss(lp, lp.detach(), ...)`, a unit test's ratio of 1),
    where neither says what it is: the parameter holds the other's facts without gradient (exp(logp - sg logp)),
    not what its own name would say (`old_logprobs`: an older policy's)."""
    given = {param.name.value: positional[i] if i < len(positional) else keywords.get(param.name.value)
             for i, param in enumerate(parameters)}
    for name in explained_by_name:
        arg = given[name]
        if not (type(arg) is cst.Call and not arg.args and type(arg.func) is cst.Attribute
                and arg.func.attr.value == "detach"):
            continue
        source = arg.func.value
        twin = next((other for other, given_arg in given.items() if other != name and
                     isinstance(given_arg, cst.BaseExpression) and given_arg.deep_equals(source)), None)
        if twin is not None:
            env[name] = detach_all(env[twin])


def _through_the_class(node: cst.Call, cls: str) -> bool:
    """`Cls.method(obj, ...)`: a method called through its class, handed the instance as its first argument."""
    func = node.func
    return type(func) is cst.Attribute and type(func.value) is cst.Name and func.value.value == cls


def _handed_in(value: tuple) -> tuple:
    """`value` as the callee sees an argument: its KL terms handed in by the caller."""
    return tuple(replace(f, passed=True) if f.is_kl() else f for f in value)


_POLICY_OUTPUTS = frozenset({alg.POLICY, alg.LOGITS, alg.VOCAB_POLICY, alg.VOCAB_PROB, alg.PROB})


def _receiver(node: cst.Call) -> list[cst.BaseExpression]:
    """The object a method is called on, where it is a local name (`ref` of `ref.seq_logprob(x)`), else none."""
    func = node.func
    if type(func) is cst.Attribute and type(func.value) is cst.Name and func.value.value not in ("self", "cls"):
        return [func.value]
    return []


def _runs_the_old_policy(func: cst.FunctionDef, positional: list, keywords: dict) -> bool:
    """A helper named for log-probs given a lagging copy of the policy (`calculate_log_probs(model_old, ...)`):
    its result is the behaviour policy's, the other side of a PPO ratio, whatever name it is stored under."""
    return roles.speaks_of_logprobs(func.name.value) and _given(positional, keywords, roles.is_old_policy_model)


def _computes_the_references_logits(func: cst.FunctionDef, positional: list, keywords: dict) -> bool:
    """A helper named for raw logits given the reference model (`model_all_logits(self.ref, seqs)`)."""
    return "logit" in func.name.value.lower() and _given(positional, keywords, roles.is_reference_model)


def _given(positional: list, keywords: dict, names_model: Callable[[str], bool]) -> bool:
    """Whether an argument is a name or attribute path that `names_model` reads as that model."""
    return any(type(arg) in (cst.Name, cst.Attribute) and names_model(dotted(arg))
               for arg in [*positional, *keywords.values()])


def _as_the_callers(value: tuple, handed_on: set[int], nested: bool = False) -> tuple:
    """A callee's returned `value` with `passed` as its caller sees it: a term of an origin the caller was
    itself handed (`handed_on`) stays handed in; inside returned tuples and dicts, only where the callee
    was handed it too (its own marking, which the callee's return keeps there)."""
    out = []
    for f in value:
        if f.role == "tuple":
            f = replace(f, items=tuple(_as_the_callers(item, handed_on, True) for item in f.items))
        elif f.role == "dict":
            f = replace(f, items=tuple((key, _as_the_callers(item, handed_on, True)) for key, item in f.items))
        elif f.is_kl():
            f = replace(f, passed=(f.passed or not nested) and id(f.origin) in handed_on)
        out.append(f)
    return tuple(out)


def passed_loss_name(fact: Fact) -> bool:
    """Whether the term's entry is a loss-named assignment it only passed (not a loss it was reduced into)."""
    entry = fact.entry
    return entry is not None and entry in fact.pending and isinstance(entry, cst.Assign) and any(
        roles.sink_of_name(last_name(target.target)) == "loss" for target in entry.targets)


def _per_token_loss_of_a_model(node: cst.Call) -> bool:
    """`model(inputs, targets, loss_reduction='none')`: a language model's forward given the targets and asked for
    each token's loss (nanochat's convention), not a mean."""
    keyword = next((arg.value for arg in node.args if arg.keyword is not None and arg.keyword.value == "loss_reduction"),
                   None)
    positional = [arg for arg in node.args if arg.keyword is None and not arg.star]
    return isinstance(keyword, cst.SimpleString) and string_value(keyword) == "none" and len(positional) >= 2


# keywords only Hugging Face's `generate` takes: its output then holds the sampling step's logits
_GENERATION_OUTPUTS = frozenset({"return_dict_in_generate", "output_scores", "output_logits"})


def _generation_output() -> tuple:
    """`model.generate(..., return_dict_in_generate=True, output_scores=True)`: a record whose `scores` and `logits`
    are the logits each step sampled from, without gradient (Hugging Face's generate runs under no_grad), so
    log-probs read from them train nothing; its `sequences` are token ids."""
    logits = tensor(Poly.atom(Atom(alg.LOGITS, False)))
    return (Fact(role="dict", items=(("scores", (logits,)), ("logits", (logits,)), ("sequences", ()))),)


def _logprobs_of_a_model(func: cst.BaseExpression, no_grad: bool, stmt: cst.CSTNode | None) -> tuple:
    """`model.log_probs(ids, targets)`, `ref_model.get_logprobs(batch)`: the per-token log-probs of the model the
    receiver names (klaudit.lint.roles.logprobs_method_role), with the policy's gradient outside `no_grad`; nothing
    where `stmt` stores them under a name that says whose they are (`ref_logps = model.log_probs(...)` under a
    disabled adapter is the reference's: the name decides)."""
    if type(func) is not cst.Attribute or any(roles.tensor_role(name) for name in bound_names(stmt)):
        return ()
    kind = roles.logprobs_method_role(func.attr.value, last_name(func.value))
    return () if kind is None else (tensor(Poly.atom(Atom(kind, kind == alg.POLICY and not no_grad))),)


def _token_losses_of_a_model(func: cst.BaseExpression, no_grad: bool) -> tuple:
    """`model(inputs, targets, loss_reduction='none')` (nanochat's GPT): each target token's cross-entropy under the
    model, -log pi(token); the reference's where the model is named so (`ref_model(...)`)."""
    reference = roles.is_reference_model(dotted(func))
    atom = Atom(alg.REF, False) if reference else Atom(alg.POLICY, not no_grad)
    return (tensor(alg.scale(Poly.atom(atom), -1.0)),)
