"""Vocabulary-level tensors: logits, log_softmax, probabilities, gathers, the exact per-step KL."""

from __future__ import annotations

import libcst as cst

from klaudit.catalog import Aggregation, Position
from klaudit.lint import algebra as alg
from klaudit.lint import roles
from klaudit.lint.algebra import Atom, AtomKind, Poly
from klaudit.lint.facts import Fact, Value, replace
from klaudit.lint.syntax import last_name, names_last_position, string_value


def apply_math(fn: str, poly: Poly) -> Poly | None:
    """exp / expm1 / log / abs / log_softmax / softmax of a symbolic tensor, when it has a meaning."""
    kinds = {a.kind for a in poly.atoms()}
    if fn == "exp":
        if kinds and kinds <= {alg.VOCAB_POLICY, alg.VOCAB_REF} and len(poly.terms) == 1 and poly.terms[0][1] == 1.0:
            atom = poly.terms[0][0][0]
            return Poly.atom(Atom(alg.VOCAB_PROB if atom.kind == alg.VOCAB_POLICY else alg.VOCAB_REF_PROB, atom.grad, atom.acc))
        return alg.exp(poly)
    if fn == "expm1":
        e = alg.exp(poly)
        return None if e is None else alg.add(e, Poly.const(1.0), -1.0)
    if fn == "log":
        poly = without_stabilizer(poly)
        if kinds and kinds <= {alg.VOCAB_PROB, alg.VOCAB_REF_PROB} and len(poly.terms) == 1 and poly.terms[0][1] == 1.0:
            atom = poly.terms[0][0][0]  # log of softmax probabilities: the log_softmax they came from
            return Poly.atom(Atom(alg.VOCAB_POLICY if atom.kind == alg.VOCAB_PROB else alg.VOCAB_REF, atom.grad, atom.acc))
        return alg.log(poly)
    if fn == "abs":
        return alg.absolute(poly)
    if fn in ("neg", "negative"):
        return alg.scale(poly, -1.0)
    if fn in ("log_softmax", "softmax"):
        # of logits, or of entries picked from them: normalised over the last axis, the picked ids were a set of
        # candidates at one position (`logits[pos, topk_ids]`), not one token per position
        if kinds == {alg.LOGITS} or kinds == {alg.REF_LOGITS} or (kinds == {alg.POLICY} or kinds == {alg.REF}) \
                and len(poly.terms) == 1 and poly.terms[0][1] == 1.0 and poly.terms[0][0][0].acc == alg.TOKEN:
            atom = next(iter(poly.atoms()))
            policy = atom.kind in (alg.LOGITS, alg.POLICY)
            kind: AtomKind = (alg.VOCAB_POLICY if policy else alg.VOCAB_REF) if fn == "log_softmax" else (
                alg.VOCAB_PROB if policy else alg.VOCAB_REF_PROB)
            return Poly.atom(Atom(kind, atom.grad, atom.acc))
    return None


def log_sum_exp(logits: Value, keepdim: bool) -> Value:
    """logsumexp of raw logits over the vocabulary: the log-softmax's normaliser, for one model's logits."""
    role = "lse-vocab" if keepdim else "lse"
    return tuple(replace(f, role=role) for f in logits
                 if f.role == "tensor" and f.poly is not None and _raw_logits_kind(f.poly) is not None)


def normalised(logits: Value, normaliser: Value) -> Value:
    """Raw logits minus their log-sum-exp: log-probs, of the sampled tokens (one normaliser per position,
    RL2's `gathered_logits - logsumexp`) or over the vocabulary (`logits - logits.logsumexp(-1, keepdim=True)`).
    A gather of raw logits is read as the sampled tokens' log-probs already: the normaliser leaves it so."""
    out = []
    for lse in normaliser:
        kind = _raw_logits_kind(lse.poly) if lse.role in ("lse", "lse-vocab") and lse.poly is not None else None
        for f in logits:
            if kind is None or f.role != "tensor" or f.poly is None:
                continue
            per_token = lse.role == "lse"
            if per_token and f.poly == Poly.atom(Atom(_GATHERED[kind], f.poly.has_grad())):
                out.append(f)
                continue
            if _raw_logits_kind(f.poly) == kind:
                grad = kind == alg.LOGITS and f.poly.has_grad()
                out.append(replace(f, poly=Poly.atom(Atom((_GATHERED if per_token else _VOCAB)[kind], grad))))
    return tuple(dict.fromkeys(out))


# the log-probs a model's raw logits normalise to: of the sampled tokens, or over the vocabulary
_GATHERED: dict[AtomKind, AtomKind] = {alg.LOGITS: alg.POLICY, alg.REF_LOGITS: alg.REF}
_VOCAB: dict[AtomKind, AtomKind] = {alg.LOGITS: alg.VOCAB_POLICY, alg.REF_LOGITS: alg.VOCAB_REF}


def _raw_logits_kind(poly: Poly) -> AtomKind | None:
    kinds = {a.kind for a in poly.atoms()}
    return kinds.pop() if len(poly.terms) == 1 and poly.terms[0][1] == 1.0 and kinds in (
        {alg.LOGITS}, {alg.REF_LOGITS}) else None


STABILIZER = 1e-4  # the largest constant added inside a log to keep it finite that is read as nothing


def without_stabilizer(poly: Poly) -> Poly:
    """`x` of `x + 1e-10` inside a log or in a divisor: a small positive constant added to keep log(0) or x / 0
    finite changes neither the value nor the gradient where x is a probability or a ratio of any size that matters."""
    constant = dict(poly.terms).get(())
    if constant is None or not 0 < constant <= STABILIZER or len(poly.terms) == 1:
        return poly
    return Poly.of({monomial: coefficient for monomial, coefficient in poly.terms if monomial != ()})


def over_vocab(poly: Poly) -> Poly | None:
    """sum over the vocabulary of p * (log p - log q): the exact per-step KL, either direction."""
    shape = {tuple(sorted(a.kind for a in m)): c for m, c in poly.terms}
    grad = poly.has_grad()
    if not any(k in (alg.VOCAB_POLICY, alg.VOCAB_REF, alg.VOCAB_PROB, alg.VOCAB_REF_PROB) for m in shape for k in m):
        return None
    # (the exact KL, the probabilities it weights by, the log-probs it adds, those it subtracts)
    directions: tuple[tuple[AtomKind, AtomKind, AtomKind, AtomKind], ...] = (
        (alg.FULL, alg.VOCAB_PROB, alg.VOCAB_POLICY, alg.VOCAB_REF),
        (alg.FULL_FWD, alg.VOCAB_REF_PROB, alg.VOCAB_REF, alg.VOCAB_POLICY))
    for kind, prob, plus, minus in directions:
        a = shape.get(tuple(sorted((prob, plus))))
        b = shape.get(tuple(sorted((prob, minus))))
        if a is not None and b is not None and abs(a + b) < 1e-12 and len(shape) == 2:
            return Poly.atom(Atom(kind, grad), a)
    return Poly.of({})

def gather(base: Value, index: cst.CSTNode | None) -> Value:
    """gather over the vocabulary picks the sampled tokens' log-probs. Over positions it picks some
    tokens of a per-token value: a KL gathered so is taken at the last one (what that idiom is for),
    a log-prob keeps its meaning at the positions picked, the last when its index says so."""
    if index is not None and _top_k_ids(index):
        return base  # the entries of each position's k most likely tokens: a slice of the vocabulary axis
    out: list[Fact] = []
    for f in base:
        if f.poly is None:
            continue
        mapped = picked_from_vocabulary((f,))
        if mapped:
            out.extend(mapped)
        elif f.is_kl() or (index is not None and names_last_position(index)):
            out.append(replace(f, position=Position.LAST))
        else:
            out.append(f)
    return tuple(out)


def _top_k_ids(index: cst.CSTNode) -> bool:
    """A gather index of top-k token ids: a name that says so (`top_k_indices`), or `torch.topk(...)`'s own."""
    if type(index) is cst.Call and type(index.func) is cst.Attribute and index.func.attr.value in ("long", "to"):
        index = index.func.value  # `topk_ids.long()`
    while isinstance(index, (cst.Subscript, cst.Attribute)) and not (
            isinstance(index, cst.Attribute) and roles.names_top_k(index.attr.value)):
        index = index.value  # `topk_out.indices`, `torch.topk(x, k)[1]`
    if type(index) is cst.Call:
        index = index.func
    return type(index) in (cst.Name, cst.Attribute) and roles.names_top_k(last_name(index))


def picked_from_vocabulary(facts: Value) -> Value | None:
    """The sampled tokens' entries of vocabulary-level values, a gather: their log-probs from log-probs or logits
    (per_token_from_logits), their probabilities from softmax probabilities (pi(y_t), whose log is log pi(y_t))."""
    picked = per_token_from_logits({a.kind for f in facts if f.poly is not None for a in f.poly.atoms()}, facts)
    if picked:
        return picked
    for f in facts:
        kinds = {a.kind for a in f.poly.atoms()} if f.poly is not None else set()
        if f.poly is not None and len(f.poly.terms) == 1 and f.poly.terms[0][1] == 1.0 and len(kinds) == 1 \
                and kinds <= _PICKED_PROBABILITY.keys():
            kind = _PICKED_PROBABILITY[kinds.pop()]
            return (replace(f, poly=Poly.atom(Atom(kind, f.poly.has_grad() and kind == alg.PROB))),)
    return None


_PICKED_PROBABILITY: dict[AtomKind, AtomKind] = {alg.VOCAB_PROB: alg.PROB, alg.VOCAB_REF_PROB: alg.REF_PROB}


def per_token_from_logits(kinds: set[AtomKind], facts: Value) -> Value | None:
    """log-probs of the sampled tokens from vocabulary-level log-probs or logits."""
    for f in facts:
        if f.poly is None:
            continue
        fk = {a.kind for a in f.poly.atoms()}
        grad = f.poly.has_grad()
        if fk <= {alg.VOCAB_POLICY, alg.LOGITS} and fk:
            return (replace(f, poly=Poly.atom(Atom(alg.POLICY, grad))),)
        if fk <= {alg.VOCAB_REF, alg.REF_LOGITS} and fk:
            return (replace(f, poly=Poly.atom(Atom(alg.REF, False))),)
    return None

# verl-style `loss_agg_mode` values and the aggregation each stands for
AGG_MODES = {
    "token-mean": Aggregation.BATCH_MEAN,
    "seq-mean-token-sum": Aggregation.SUM,
    "seq-mean-token-mean": Aggregation.SEQ_MEAN,
    "seq-mean-token-sum-norm": Aggregation.CONSTANT,
}


def agg_mode(node: cst.CSTNode | None) -> Aggregation:
    if isinstance(node, cst.SimpleString):
        return AGG_MODES.get(str(string_value(node)), Aggregation.BATCH_MEAN)
    return Aggregation.BATCH_MEAN
