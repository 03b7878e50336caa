"""Sinks: where KL terms reach a loss, a reward or an advantage, and what became of each term.

A value assigned to a loss-, reward- or advantage-named target, passed to `.backward()`, or returned
by a loss function reaches that sink. A value named like a reward waits until it is seen to be
used as one (it reaches a loss, a return, advantages, or code the analysis does not follow); a
loss-named part that a later loss carries on is part of that loss. Each KL term formed and stored
here is settled once its use is known; the terms nothing explains are reported as KL100.
"""

from __future__ import annotations

import libcst as cst

from klaudit.lint import algebra as alg
from klaudit.lint.evidence import note_entry
from klaudit.lint.facts import (
    Fact,
    Labels,
    Sink,
    compatible,
    contained,
    holds_behaviour_ratio,
    logprob_kinds,
    merge_labels,
    replace,
)
from klaudit.lint.flowstate import FlowState
from klaudit.lint.kinds import SinkKind
from klaudit.lint.update_loops import never_runs_on


class SinkFlow(FlowState):
    """Sinks, reward and loss candidates, and the use of each KL term, for klaudit.lint.flow.FunctionRun."""

    def here(self, node: cst.CSTNode) -> cst.CSTNode:
        """The statement being interpreted: findings and origins are reported at statements."""
        return self.stmt if self.stmt is not None else node

    def sink(self, kind: SinkKind, value: tuple, node: cst.CSTNode, via: Sink | None = None) -> tuple:
        """Record that `value` reaches a loss, reward or advantage at `node` (`via`: the sink of a function
        called there that it reaches); returns it with its entry set."""
        node = self.here(node)
        marked = tuple(f if f.entry is not None or not f.is_kl() else replace(f, entry=node) for f in value)
        if kind == "loss":
            marked = self.mark_stale(marked)
        facts = tuple(f for f in marked if f.is_kl())
        if facts and self.record:
            note_entry(self, node)
            self.sinks.append(Sink(kind, facts, node, self.next_order(), via=via.via or via.node if via is not None else None,
                                   depth=via.depth + 1 if via is not None else 0, trained=not self.no_grad))
        self.confirm(value)
        self.settle(value)
        if kind == "loss":
            self.take_on(facts)
        return marked

    def reward_candidate(self, value: tuple, node: cst.CSTNode) -> tuple:
        """A KL value stored under a reward name waits: it is a reward sink once it reaches a loss,
        returns, advantages or code the analysis does not see; if it only feeds metrics or the
        statistics a loss function returns (a DPO loss's `chosen_rewards`), it is not one."""
        node = self.here(node)
        if node in self.confirmed:
            return self.sink("reward", value, node)
        # an earlier candidate this value came from (`kl_reward = beta * kl`, then `rewards = scores -
        # kl_reward`) was an intermediate on this path: the sign and estimator count where the reward
        # is final. It still waits for uses along paths that skip this assignment (an `if` branch).
        intermediates = {p for f in value for p in f.pending if p is not node and p in self.waiting}
        marked = tuple(replace(f, entry=f.entry or node,
                               pending=tuple(p for p in f.pending if p not in intermediates) + (node,)) if f.is_kl() else f
                       for f in value)
        facts = tuple(f for f in marked if f.is_kl())
        if facts and self.record:
            note_entry(self, node)
            earlier = self.waiting.get(node)
            facts = tuple(dict.fromkeys(earlier.facts + facts)) if earlier is not None else facts
            self.waiting[node] = Sink("reward", facts, node, earlier.order if earlier else self.next_order(),
                                      trained=not self.no_grad)
        return marked

    def loss_candidate(self, value: tuple, node: cst.CSTNode) -> tuple:
        """A KL value stored under a loss name is a loss term; when it flows on, with its gradient, into
        a later loss (`per_token_loss = -pg_loss + ...`), that later loss is the objective whose sign and
        form count, and the earlier name was a part of it (reported where the term first entered)."""
        node = self.here(node)
        marked = self.mark_stale(tuple(replace(f, entry=f.entry or node, pending=f.pending + (node,))
                                       if f.is_kl() else f for f in value))
        facts = tuple(f for f in marked if f.is_kl())
        self.take_on(facts, node)
        if facts and self.record and node not in self.overwritten():  # a dead store is no loss
            note_entry(self, node)
            earlier = self.loss_parts.get(node)
            facts = tuple(dict.fromkeys(earlier.facts + facts)) if earlier is not None else facts
            self.loss_parts[node] = Sink("loss", facts, node, earlier.order if earlier else self.next_order(),
                                         trained=not self.no_grad, named=True)
        self.confirm(value)
        self.settle(value)
        return marked

    def mark_stale(self, value: tuple) -> tuple:
        """KL terms entering a loss in a step that compares the policy with the samples' behaviour
        policy (a PPO ratio to `old_log_probs`, here or in a call given both), or in a loop of several
        optimizer steps on samples drawn before it (klaudit.lint.update_loops), are on older samples; a ratio
        is no such sign where each step of the function (or of its single caller) is the first on samples
        just drawn: it is then 1."""
        if self.on_fresh_samples():
            return tuple(_on_fresh_samples(f, self.reused) if f.is_kl() else f for f in value)
        if not any(f.is_kl() and not f.stale for f in value):
            return value
        # the ratios formed here, apart from the KL terms already added to them (whose switches they lost)
        formed = [g for v in self.env.values() for g in v if holds_behaviour_ratio((g,)) and not g.is_kl()]
        # not those on a path the module's settings never take (`if self.args.num_iterations > 1:` left at 1)
        ratios = [g for g in formed if not never_runs_on(g.labels, self.module.tree, self.module.beyond)]
        # an alternative on an exclusive path (another switch value or branch) is no evidence for this one
        # a call that compares them counts on the paths where it ran, not in the other branch of its `if`
        compared = any(compatible(labels, self.labels) for labels in self.compared)
        if formed and not ratios and not compared and not self.reused:
            # every ratio to a behaviour policy is formed where it never runs: the samples are the policy's own
            return tuple(_on_fresh_samples(f, False) if f.is_kl() else f for f in value)
        # a ratio of 1 formed on another path (`exp(logp - logp.detach())` where num_iterations is 1): the samples'
        # age is a switch of its own there
        ones = [g.labels for v in self.env.values() for g in v if _a_ratio_of_one(g)]
        out: list = []
        for f in value:
            paths = [g.labels for g in ratios if compatible(g.labels, f.labels)]
            if not f.is_kl():
                out.append(f)
            elif compared or self.reused and not _sequence_weighted(f):
                out.append(replace(f, stale=True))
            elif paths and any(not compatible(one, path) for one in ones for path in paths):
                out += _under_the_ratios(f, paths)  # older samples under the ratios' switches only
            else:
                out.append(replace(f, stale=True) if paths or holds_behaviour_ratio((f,)) else f)
        return tuple(out)

    def on_fresh_samples(self) -> bool:
        """Each optimizer step of this function is the first on samples just drawn (klaudit.lint.update_loops):
        its own, or, for a function that takes none (a loss helper of another module), its caller's."""
        return self.module.steps_on_fresh_samples(self.func, self.cls) or (
            self.caller_on_fresh_samples and not self.module.takes_a_step(self.func))

    def note_comparison(self, node: cst.Call) -> None:
        """A call given the policy's log-probs and, in another argument, the behaviour policy's
        (`policy_loss_fn(old_log_prob=..., log_prob=...)`) compares the two, like a ratio formed here; only
        on the paths where the call runs (the switch values it is under)."""
        if self.labels in self.compared:
            return
        held = []
        for arg in node.args:
            value = self.env.get(arg.value.value) if type(arg.value) is cst.Name else self._memo.get(id(arg.value))
            held.append(logprob_kinds(value or ()))
        if any(alg.POLICY in a and alg.OLD in b for i, a in enumerate(held) for j, b in enumerate(held) if i != j):
            self.compared.append(self.labels)

    def take_on(self, facts: tuple, node: cst.CSTNode | None = None) -> None:
        """Earlier loss-named parts that these differentiable facts carry on are not losses of their own."""
        for f in facts:
            if f.poly is None or not f.poly.has_grad():
                continue
            for p in f.pending:
                part = self.loss_parts.get(p)
                # the same term carried on (not combined with another into a new term), or a new term
                # made from it and bound to the same name (`kl = -kl; kl = kl.exp() - 1 - kl`): a step
                # of the estimator, not a loss of its own
                if p is not node and part is not None and (
                        any(g.origin is f.origin for g in part.facts) or rebinds(node, p)):
                    del self.loss_parts[p]

    def confirm(self, value: tuple) -> None:
        """The reward candidates `value` passed through are rewards after all: record their sinks."""
        for f in contained(value):
            for node in f.pending:
                waiting = self.waiting.pop(node, None)
                if waiting is not None:
                    self.confirmed.add(node)
                    self.sinks.append(waiting)
                    self.settle(waiting.facts)

    def hand_on(self, value: tuple) -> None:
        """`value` goes on to code that uses it (a caller, a queue out of sight): the reward candidates in it
        are rewards, except a KL estimate alone with a bonus's sign (`rewards = logp - ref_logp`: a DPO
        implicit reward, or a penalty the receiver subtracts), whose sign is the receiver's to give."""
        self.confirm(tuple(f for f in value if not _lone_estimate(f)))

    def settle(self, value: tuple) -> None:
        """The KL terms of `value` have a known use (a sink, a return, a metric, a comparison), and so
        have the terms the current statement read to make them."""
        self.settled.update(self.read)
        self.settled.update(f.origin for f in contained(value) if f.is_kl())

    def note_read(self, value: tuple) -> tuple:
        """Remember the KL terms a statement reads; returns `value`."""
        self.read.update(f.origin for f in value if f.origin is not None and f.is_kl())
        return value

    def track(self, value: tuple) -> None:
        """A KL term formed here and stored; the terms a new tensor was computed from are used by it."""
        origins = {f.origin for f in value if f.is_kl()}
        if any(f.role == "tensor" and f.poly is not None for f in value):
            self.settled.update(self.read - origins)  # a new term, or a margin in which the terms cancel
        for f in value:
            if f.is_kl() and f.origin is not None and f.calls == 0 and f.origin_path == self.module.path:
                self.formed.setdefault(f.origin, f)

    def next_order(self) -> int:
        self.sink_count += 1
        return self.sink_count


def rebinds(later: cst.CSTNode | None, earlier: cst.CSTNode) -> bool:
    """Whether the assignment `later` binds a name that the assignment `earlier` bound."""
    return later is not None and bool(_bound_names(later) & _bound_names(earlier))


def _bound_names(stmt: cst.CSTNode) -> set[str]:
    if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1:
        stmt = stmt.body[0]
    if not isinstance(stmt, cst.Assign):
        return set()
    return {t.target.value for t in stmt.targets if isinstance(t.target, cst.Name)}


def _lone_estimate(fact: Fact) -> bool:
    """A KL estimate added to nothing else, whose sign in a reward would make it a bonus."""
    if not fact.is_kl() or fact.beside or fact.poly is None:
        return False
    terms = alg.terms_of(fact.poly, "reward")
    return bool(terms) and all(term.sign > 0 for term in terms)


def _sequence_weighted(fact: Fact) -> bool:
    """A term weighed by exp of the whole sequence's log-ratio to a detached copy: in a loop of several
    optimizer steps on one batch of samples that copy is the rollout's, and the weight the exact
    sequence-level importance ratio (kl-math.md §8, row 25), not evidence of a biased gradient."""
    if fact.poly is None:
        return False
    weighs = any(len(monomial) > 1 and any(atom.kind == alg.SCORE and atom.acc == alg.SEQUENCE for atom in monomial)
                 for monomial, _ in fact.poly.terms)  # the sequence's score times a (detached) reward
    return weighs or any(term.weighted in ("score-seq", "is-seq") for term in alg.terms_of(fact.poly, "loss"))


def _on_fresh_samples(fact: Fact, reused: bool) -> Fact:
    """A KL term entering a loss in a step on samples just drawn: a ratio to their log-probs is the score
    (alg.on_fresh_samples); only a loop of several steps on them (`reused`) makes them older."""
    poly = alg.on_fresh_samples(fact.poly) if fact.poly is not None else None
    return replace(fact, poly=poly, stale=fact.stale or (reused and not _sequence_weighted(fact)))


def _a_ratio_of_one(f: Fact) -> bool:
    """exp(logp - sg logp), no KL term: value 1, gradient the score (a ratio to the samples' policy, itself)."""
    return f.poly is not None and not f.is_kl() and any(atom.kind == alg.SCORE for atom in f.poly.atoms())


def _under_the_ratios(f: Fact, paths: list[Labels]) -> list[Fact]:
    """A KL term beside ratios to the behaviour policy formed on the switch paths `paths` (compatible with its own),
    where another path forms a ratio of 1: on older samples on those paths. Where each such ratio holds on a narrower
    path than the term (TRL's `old = inputs["old_per_token_logps"] if self.num_iterations > 1 else logps.detach()`),
    the term is on older samples under that path's switches only, and as it was on the others."""
    if any(merge_labels(f.labels, labels) == f.labels for labels in paths):
        return [replace(f, stale=True)]
    return [f, *dict.fromkeys(replace(f, stale=True, labels=merge_labels(f.labels, labels)) for labels in paths)]
