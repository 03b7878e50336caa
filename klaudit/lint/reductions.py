"""Reductions: sums, means and aggregations of KL terms, and math functions of them.

A sum or mean over the token axis makes a per-sequence term (accumulated over the sequence); over
every axis, a scalar with its aggregation (sum, token mean, sequence mean: klaudit.catalog.Aggregation);
over the vocabulary, `p * (log p - log q)` summed is the exact per-token KL. A mask summed is a
length or a token count, which a later division turns into a mean.
"""

from __future__ import annotations

import libcst as cst

from klaudit.catalog import Aggregation, Position
from klaudit.lint import algebra as alg
from klaudit.lint.containers import as_row
from klaudit.lint.facts import Fact, compatible, kl_targets, merge_labels, replace
from klaudit.lint.flowstate import FlowState
from klaudit.lint.project import integer_default, sums_each_row
from klaudit.lint.syntax import int_literal, last_name
from klaudit.lint.tensors import AGG_MODES, agg_mode, apply_math, over_vocab


class ReductionFlow(FlowState):
    """Reductions, aggregations and math functions of tensors, for klaudit.lint.flow.FunctionRun."""

    def dim(self, node) -> bool | None:
        """True for a reduction over the token axis (per row), False over everything, None over the batch axis."""
        if node is None:
            return False
        if int_literal(node) == 0:
            return None
        facts = self.expr(node)
        return any(f.role == "tensor" and f.poly is not None and f.poly.is_const() for f in facts) or (
            not facts and not isinstance(node, cst.Name))

    def along_each_axis(self, base: tuple, dim_node, reduce) -> tuple:
        """`reduce(part, per_row)` of `base` on each path a switch gives the axis its own value (`dim = None
        if token_level else -1`, `dim=self.aggregation_dim` set so in __init__), each part under the labels
        of its path; one reduction along `dim` where no switch decides it."""
        facts = self.expr(dim_node) if dim_node is not None and int_literal(dim_node) is None else ()
        axes = [(_literal_axis(f), f.labels) for f in facts]
        if len(axes) < 2 or any(axis is _UNKNOWN or not labels for axis, labels in axes) \
                or len({axis for axis, _ in axes}) < 2:
            return reduce(base, self.dim(dim_node))
        out: tuple = ()
        for axis, labels in dict.fromkeys(axes):
            part = tuple(replace(f, labels=merge_labels(f.labels, labels)) for f in base if compatible(f.labels, labels))
            out += reduce(part, axis)
        return out

    def reduce(self, base: tuple, method: str, along_tokens: bool | None, node) -> tuple:
        out = []
        for f in base:
            if along_tokens is False and self.one_sequence_at_a_time():
                f = as_row(f)  # all of a tensor of one sequence (one drawn sample, one text encoded): that sequence's
            # one sequence's row reduced along any axis is reduced over that sequence's tokens, and stays that
            # sequence's value (the builtin sum of such values is a sum over the batch)
            per_row = True if f.row else along_tokens
            if per_row is None:
                out.append(f)  # over the batch axis: the per-sequence terms are kept
                continue
            if f.role == "mask":
                out.append(Fact(role="length" if per_row else "ntokens", labels=f.labels, row=f.row))
                continue
            if f.role != "tensor" or f.poly is None:
                continue
            vocab = over_vocab(f.poly)
            if vocab is not None and per_row:
                out.append(replace(f, poly=vocab, origin=self.here(node), against=kl_targets(node, f)))
                continue
            if vocab is not None and vocab.terms and per_row is False:
                # `p * (log p - log q)` summed over every axis at once (tokens flattened by a mask
                # index): the exact per-step KL, summed (or averaged) over the tokens
                aggregation = f.aggregation or (Aggregation.SUM if method == "sum" else Aggregation.CONSTANT)
                out.append(replace(f, poly=vocab, origin=self.here(node), against=kl_targets(node, f),
                                   aggregation=aggregation, scalar=True))
                continue
            if per_row and f.packed:  # one row of every sequence's tokens: reduced over all of them
                aggregation = f.aggregation or (Aggregation.SUM if method == "sum" else Aggregation.BATCH_MEAN)
                out.append(replace(f, aggregation=aggregation, scalar=True))
                continue
            if per_row and f.poly.atoms() and all(a.acc == alg.SEQUENCE for a in f.poly.atoms()):
                out.append(replace(f, scalar=True))  # already one value per sequence: a group statistic
                continue
            if per_row:
                poly = alg.accumulate(f.poly, alg.SEQUENCE)
                if method != "mean":
                    aggregation = f.aggregation or Aggregation.SUM
                elif f.row:
                    aggregation = Aggregation.SEQ_MEAN  # one sequence's own tokens: 1 / its length
                else:
                    # each row of a padded batch over the batch's width: every sequence divided by the same number
                    aggregation = f.aggregation or Aggregation.CONSTANT
                out.append(replace(f, poly=poly, aggregation=aggregation))
            else:
                aggregation = f.aggregation or (Aggregation.SUM if method == "sum" else Aggregation.CONSTANT)
                out.append(replace(f, aggregation=aggregation, scalar=True))
        return tuple(out)

    def aggregate(self, name, first, positional, keywords) -> tuple:
        if name == "masked_mean":
            dim = positional[2] if len(positional) > 2 else keywords.get("dim", keywords.get("axis"))
            if dim is not None:
                return self.along_each_axis(first, dim, lambda part, per_row: _aggregated(
                    part, Aggregation.SEQ_MEAN if per_row else Aggregation.BATCH_MEAN))
            aggregation = Aggregation.SEQ_MEAN if self.imported_default_axis(name) else Aggregation.BATCH_MEAN
        elif name == "masked_sum":
            aggregation = Aggregation.SUM
        elif name in ("agg_loss", "aggregate_loss", "masked_aggregator"):
            mode = positional[2] if len(positional) > 2 else keywords.get("loss_agg_mode") or keywords.get("mode")
            if mode is not None and not isinstance(mode, cst.SimpleString):
                return self.each_agg_mode(first, mode)
            aggregation = agg_mode(mode)
        else:
            aggregation = Aggregation.SEQ_MEAN
        return _aggregated(first, aggregation)

    def imported_default_axis(self, name: str) -> bool:
        """Whether `name(x, mask)` called without an axis, imported from a module of the tree that is not
        followed (it has no KL words), averages each row: by its own default (`dim=1`; verl's is `axis=None`), or,
        with no axis to choose, by summing along a fixed one (safe-rlhf's `.sum(dim=-1)`)."""
        if name not in self.module.imports:
            return False
        source, attr, level = self.module.imports[name]
        path = self.analyzer.project.module_path(source, self.module.path, level) if attr is not None else None
        if attr is None or path is None:
            return False
        definition = self.analyzer.project.module_function(path, attr)
        if definition is None:
            return False
        default = integer_default(definition, _AXES)
        return default != 0 if default is not None else sums_each_row(definition, _AXES)

    def each_agg_mode(self, first: tuple, mode: cst.BaseExpression) -> tuple:
        """A `loss_agg_mode` the code reads from its configuration: every mode the aggregator knows,
        each under its value of the switch (a string the analysis knows picks its own)."""
        known = [f.text for f in self.expr(mode) if f.role == "str" and f.text in AGG_MODES]
        switch = last_name(mode) or "loss_agg_mode"
        out: list = []
        for value in known or list(AGG_MODES):
            aggregation = AGG_MODES[value]
            labels = () if known else ((switch, (value,)),)
            out.extend(replace(f, aggregation=f.aggregation or aggregation, labels=merge_labels(f.labels, labels),
                               scalar=aggregation is not Aggregation.SEQ_MEAN)
                       for f in first if f.role == "tensor")
        return tuple(out)

    def unary_math(self, fn: str, base: tuple, node) -> tuple:
        if fn == "log" and any(f.role == "tuple" for f in base) and any(
                f.role == "tensor" and (f.poly is None or apply_math(fn, f.poly) is None) for f in base):
            return ()  # pieces stacked side by side (`[p, 1 - p]`): the log of some has no meaning, nor has the whole
        out = []
        for f in base:
            if f.role != "tensor" or f.poly is None:
                continue
            mean = fn == "exp" and f.aggregation is Aggregation.SEQ_MEAN and any(
                a.acc == alg.SEQUENCE for a in f.poly.atoms())
            if mean:  # exp of a log-ratio averaged over the response: a weight, not a length-normalised KL
                f = replace(f, poly=f.poly.map_atoms(lambda a: a.accumulated(alg.SEQUENCE_MEAN)
                                                     if a.acc == alg.SEQUENCE else a), aggregation=None)
            poly = apply_math(fn, f.poly)
            if poly is None:
                continue
            if fn == "log" and f.clamped and {a.kind for a in poly.atoms()} <= {alg.VOCAB_POLICY, alg.VOCAB_REF}:
                f = replace(f, clamped=False)  # log(probs.clamp_min(eps)): a safe log, the KL is not clamped
            position = f.position
            if mean and f.is_kl():
                position = Position.SEQUENCE_MEAN  # exp(-D / L) of the reference: an estimator of the mean log-ratio
            elif fn in ("exp", "abs", "expm1") and f.is_kl() and any(a.acc == alg.SEQUENCE for a in f.poly.atoms()):
                position = Position.SEQUENCE
            out.append(replace(f, poly=poly, origin=self.here(node), origin_path=self.module.path, position=position,
                               against=kl_targets(node, f)))
        return tuple(out)


def _aggregated(value: tuple, aggregation: Aggregation) -> tuple:
    """The tensors of `value` reduced by an aggregator: a per-sequence mean of packed rows is a mean over all tokens."""
    out = []
    for f in value:
        if f.role != "tensor":
            continue
        mode = Aggregation.BATCH_MEAN if f.packed and aggregation is Aggregation.SEQ_MEAN else aggregation
        if f.row and mode is Aggregation.BATCH_MEAN:
            mode = Aggregation.SEQ_MEAN  # the tokens of one sequence averaged: that sequence's mean
        out.append(replace(f, aggregation=f.aggregation or mode, scalar=mode is not Aggregation.SEQ_MEAN))
    return tuple(out)


_UNKNOWN = object()
_AXES = ("dim", "axis")  # the parameters an aggregation helper takes its axis by


def _literal_axis(fact: Fact):
    """The axis a literal `dim` value stands for, as ReductionFlow.dim gives it (None: `dim=None`, every
    axis, is False; 0 the batch axis, None; any other integer the token axis, True); _UNKNOWN otherwise."""
    if fact.role == "none":
        return False
    value = fact.poly.const_value() if fact.role == "tensor" and fact.poly is not None else None
    if value is None:
        return _UNKNOWN
    return None if value == 0 else True
