"""Containers in the flow analysis: what iterating a value yields, and what zip/enumerate make.

A list or tuple literal is a fact of role "tuple" whose items are the facts of each position; a
list built by a comprehension is the facts of its element (a list of per-token terms stacked,
summed or indexed keeps the meaning of one element). Iterating a tensor yields its rows, which
keep its meaning, each one sequence's tokens (a reduction of one sums or averages that sequence
alone); iterating `zip(a, b)` yields pairs of the rows of a and b.
"""

from __future__ import annotations

import re

import libcst as cst

from klaudit.lint import algebra as alg
from klaudit.lint import roles
from klaudit.lint.facts import Fact, merge_labels, replace, tensor
from klaudit.lint.flowstate import FlowState
from klaudit.lint.syntax import dotted, is_data_read, last_name, params, walk


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


def _reads(body: cst.CSTNode, name: str) -> bool:
    """Whether `body` indexes the list `name` (`returns[-1]`)."""
    return any(type(node) is cst.Subscript and dotted(node.value) == name for node in walk(body))


def rows(value: tuple) -> tuple:
    """What iterating `value` yields: a list's elements, a tensor's rows. A row of a per-token tensor is
    one sequence's tokens; a packed row's entries, a per-sequence tensor's and a statistic's are not."""
    out: list = []
    for f in value:
        if f.role == "tuple":
            out.extend(elements((f,)))
        elif f.role in ("tensor", "mask"):
            out.append(as_row(f))
    return tuple(dict.fromkeys(out))


def as_row(fact: Fact) -> Fact:
    """One row of a mask or of a per-token tensor, marked as one sequence's; any other value as it is."""
    if fact.role == "mask" or fact.role == "tensor" and fact.poly is not None and not (fact.packed or fact.scalar) and (
            atoms := fact.poly.atoms()) and all(atom.acc not in _OF_A_SEQUENCE for atom in atoms):
        return replace(fact, row=True)
    return fact


_OF_A_SEQUENCE = (alg.SEQUENCE, alg.SEQUENCE_MEAN)  # one value per sequence: its rows hold no tokens


def zipped(arguments: list) -> tuple:
    """zip(a, b, ...): a list whose element is the tuple (row of a, row of b, ...)."""
    pair = Fact(role="tuple", items=tuple(rows(value) for value in arguments))
    return (Fact(role="tuple", items=((pair,),)),)


def enumerated(value: tuple) -> tuple:
    """enumerate(a): a list whose element is the tuple (index, row of a)."""
    return zipped([(), value])


def key_slot(key: str) -> str:
    """The name under which a module's stores into `x["key"]` are collected (fields use their own name)."""
    return f"[{key!r}]"


class ContainerFlow(FlowState):
    """String-keyed containers and records, for klaudit.lint.flow.FunctionRun.

    `batch["kl"] = kl` stores the facts under the path `batch['kl']` of the environment, read back by
    `batch["kl"]` and `batch.get("kl", default)` (joined with the default's facts); a dict display or
    a record built with keywords (`dict(kl=kl)`, `Experience(..., kl=kl)`) holds its entries, read by
    subscript or attribute. Stores a function of the module makes into keys and fields with KL
    vocabulary (in the key or in the stored expression) reach reads of them in its other functions
    (Analyzer.fields_of), so that a value's meaning crosses the methods of a class."""

    def store_key(self, target: cst.Subscript, key: str, value: tuple) -> None:
        base = dotted(target.value)
        if base:
            self.env[f"{base}[{key!r}]"] = value
        self.collect(key_slot(key), value)

    def collect(self, slot: str, value: tuple) -> None:
        """While the module's stores are being collected: `value` was stored into `slot`."""
        writes = self.analyzer.field_writes
        if writes is not None and slot in self.module.kl_fields:
            # a term stored where it entered a reward (`data.batch["token_level_rewards"] = scores - beta * kl`)
            # keeps that place: a function reading the key back (compute_advantage) uses the same reward
            stored = tuple(replace(f, entry=f.entry if f.entry is not None and f.entry is self.stmt else None,
                                   passed=False) for f in value if f.is_kl())
            writes[slot] = writes.get(slot, ()) + stored

    def stored(self, slot: str) -> tuple:
        """What the module's functions store into `slot` (a field name or a key_slot)."""
        if slot not in self.module.kl_fields or not self.analyzer.read_fields:
            return ()
        return self.analyzer.fields_of(self.module).get(slot, ())

    def read_key(self, base_node: cst.BaseExpression, key: str) -> tuple | None:
        """The facts of `base["key"]` when the analysis knows what was stored there, else None."""
        base = dotted(base_node)
        if base and f"{base}[{key!r}]" in self.env:
            return self.env[f"{base}[{key!r}]"]
        entries = entry_of(self.expr(base_node), key)
        if entries:
            return entries
        return self.stored(key_slot(key)) or None

    def named_entry(self, base_node: cst.BaseExpression, key: str, grad: bool) -> tuple:
        """The tensor an unknown record holds under `key`, by the key's name (`batch["ref_logps"]`, and the last part of a
        namespaced key: `batch.aux["opd.teacher_logp_sampled"]`, `"rollout/old_logprobs"`); one sequence's row where
        the record is one sample's, the variable of a loop over such records (`for traj in trajs:`)."""
        poly = roles.named_tensor(re.split(r"[./:]", key)[-1], grad=grad)
        if poly is None:
            return ()
        fact = tensor(poly)
        one_sample = type(base_node) is cst.Name and roles.names_one_sample(base_node.value) and any(
            base_node.value in names for names in self.loop_variables)
        return (as_row(fact) if one_sample else fact,)

    def read_get(self, base_node: cst.BaseExpression, key: str, default: cst.BaseExpression | None) -> tuple:
        """`base.get("key", default)`: what was stored under the key, or the default (None when not given)."""
        found = self.read_key(base_node, key)
        if found is None:
            # rollout data (`batch.get(...)`) holds no gradient, except the current policy's log-probs a loss
            # reads from its inputs; a model's outputs (`outputs.get("logps")`) do, as `outputs["logps"]` does
            grad = not is_data_read(base_node) or roles.is_current_policy_name(key)
            found = self.named_entry(base_node, key, grad and not self.no_grad)
        if default is None:  # the key may be missing: the value may be None (`if x is None:` stays open)
            return tuple(dict.fromkeys(found + (Fact(role="none"),))) if found else found
        defaults = tuple(f for f in self.expr(default) if f.role != "none")
        if not found and any(f.role == "str" or _is_number(f) for f in defaults):
            # `args.get("kl_type", "unbias")`, `config.get("kl_penalty_coef", 0.0)` from a configuration the analysis
            # cannot see: the default is one value of the setting, not the only one (a KL term scaled by the
            # coefficient is not gone because its default is 0)
            found = (Fact(role="str", name=key),)
        return tuple(dict.fromkeys(found + defaults))

    def add_to_list(self, target: cst.BaseExpression, method: str, arg: cst.BaseExpression, node: cst.Call) -> None:
        """`xs.append(x)` / `xs.extend(ys)` on a list named like a reward, advantage or loss stores the
        term into that sink. A KL term appended to a local list (`all_kl.append(kl)`) is held by it, and so are
        log-probs summed over one sequence (`seq_logps.append(token_logps.sum())`, one per sequence), and
        log-probs over the vocabulary, whose name does not tell them from per-token ones (per-token log-probs and
        logits are not: what is made of them on each path, TRL's `selective_log_softmax` of its PPO rollout's
        logits, is better read from the name they are given (a helper's list of whichever model it ran is its
        caller's to name, a rollout's list is a rollout's); the reference's and an older policy's are what they are
        whatever the list is named (`prob_per_token_reference` gathered chunk by chunk), and
        the KL terms a reversed loop appends (the running sums of a GAE or reward-to-go recursion,
        `advantages_reversed.append(lastgaelam)`): `torch.stack(all_kl).mean()` reads them back for the loss,
        where the PPO ratio that weighs them shows how old the samples are. `kl_list.extend(kl_per_sequence)`
        adds the rows of a tensor, which stacking gives back."""
        kind = roles.sink_of_name(last_name(target))
        value = self.expr(arg)
        name = dotted(target)
        if name and any(_reads(loop.body, name) for loop in self.reverse_loop.values()):
            # `nxt = returns[-1] ...; returns.append(r[:, t] + gamma * nxt)`: the recursion runs through the
            # list itself, whose entries are then the reward-to-go of this step's terms
            value = tuple(replace(f, poly=alg.accumulate(f.poly, alg.TO_GO)) if f.poly is not None else f
                          for f in value)
            self.confirm(value)
        if kind is not None:
            sunk = self.sink(kind, value if method == "append" else elements(value), node)
            if method == "append" and not self.reverse_loop:
                value = sunk  # the list holds terms that entered the sink here: a caller's later use is no new entry
        added = value if method == "append" else elements(value)  # `extend` adds the rows of a tensor, the items of a list
        # such terms, or a tuple holding one in a place (`trajectories.append((response, logprobs, rewards))`, which
        # `for response, old_logprobs, rewards in trajectories:` unpacks place by place)
        running = tuple(f for f in added if _running(f) or f.role == "tuple" and method == "append"
                        and any(_running(item) for place in f.items for item in place))
        if name and running and (self.reverse_loop or type(target) is cst.Name):
            held = elements(self.env.get(name, ()))
            self.env[name] = (Fact(role="tuple", items=(tuple(dict.fromkeys(held + running)),)),)

    def dispatch(self, node: cst.Subscript) -> tuple | None:
        """`table[name]` on a dict display with a key the analysis does not know: every entry, each
        labelled as the switch value that selects it (`{"k1": f1, "k3": f3}[kind]`)."""
        tables = [f for f in self.expr(node.value) if f.role == "dict"]
        if not tables or len(node.slice) != 1 or not isinstance(node.slice[0].slice, cst.Index):
            return None
        switch = node.slice[0].slice.value
        known = [f.text for f in self.expr(switch) if f.role == "str" and f.text is not None]
        name = next((f.name for f in self.expr(switch) if f.role == "str" and f.name), "") or dotted(switch).split(".")[-1]
        out: list = []
        for table in tables:
            for key, facts in table.items:
                if known and key not in known:
                    continue
                out.extend(replace(f, labels=merge_labels(f.labels, ((name, (key,)),))) if not known else f for f in facts)
        return tuple(dict.fromkeys(out))

    def build_record(self, fields: list, positional: list, keywords: dict) -> tuple:
        """A record built by a constructor call: its entries by field name."""
        items = [(name, self.expr(arg)) for name, arg in zip(fields, positional)]
        items += [(name, self.expr(arg)) for name, arg in keywords.items()]
        for name, facts in items:
            self.collect(name, facts)
        return (Fact(role="dict", items=tuple(items)),)


def _running(fact: Fact) -> bool:
    """Whether a list keeps `fact` appended to it: a KL term, or log-probs it may be made of later."""
    return fact.poly is not None and (fact.is_kl() or _over_vocabulary(fact.poly) or _one_policys_log_probs(fact.poly)
                                      or _of_a_sequence(fact.poly))


def _over_vocabulary(poly: alg.Poly) -> bool:
    """Log-probs or probabilities over the whole vocabulary (`log_softmax(logits, -1)`), which a name does not
    tell from one log-prob per sampled token."""
    kinds = {atom.kind for atom in poly.atoms()}
    return bool(kinds) and kinds <= {alg.VOCAB_POLICY, alg.VOCAB_REF, alg.VOCAB_PROB, alg.VOCAB_REF_PROB}


def _one_policys_log_probs(poly: alg.Poly) -> bool:
    """One policy's per-token log-probs, nothing else: the reference's or an older policy's without gradient, or
    the trained policy's with it (`all_new_lp.append(new_lps[k])` turn by turn, concatenated for the loss). The
    policy's without gradient stay unread: a helper's forward of whichever model it is given under `no_grad`, whose
    caller names what it holds (the rollout's, the reference's)."""
    atoms = poly.atoms()
    return len({atom.kind for atom in atoms}) == 1 and all(
        atom.kind in (alg.REF, alg.OLD) and not atom.grad or atom.kind == alg.POLICY and atom.grad for atom in atoms)


def _of_a_sequence(poly: alg.Poly) -> bool:
    """One value per sequence (`token_logps.sum()` of one response): a list of them stacked holds a value per
    sequence, whatever its name says of log-probs per token."""
    atoms = poly.atoms()
    return bool(atoms) and all(atom.acc in _OF_A_SEQUENCE for atom in atoms)


def _is_number(fact: Fact) -> bool:
    return fact.role == "tensor" and fact.poly is not None and fact.poly.is_const()


def entry_of(value: tuple, key: str) -> tuple:
    """The facts stored under `key` in the dicts and records among `value`."""
    out: list = []
    for f in value:
        if f.role == "dict":
            for name, facts in f.items:
                if name == key:
                    out.extend(facts)
    return tuple(dict.fromkeys(out))


def record_fields(classdef: cst.ClassDef) -> list:
    """The positional fields of a class used as a record: a dataclass's or NamedTuple's annotated
    fields in order, else the parameters of its __init__."""
    init = next((item for item in classdef.body.body
                 if isinstance(item, cst.FunctionDef) and item.name.value == "__init__"), None)
    if init is not None:
        return [p.name.value for p in params(init)][1:]
    return [small.target.value for line in classdef.body.body if isinstance(line, cst.SimpleStatementLine)
            for small in line.body if isinstance(small, cst.AnnAssign) and isinstance(small.target, cst.Name)]
