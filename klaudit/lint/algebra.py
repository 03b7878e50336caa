"""Symbolic per-token KL terms: sums of monomials over log-prob atoms, and the estimator they are.

A value the linter tracks is a polynomial whose atoms are per-token tensors of known meaning:
P (policy log-prob), Q (reference log-prob), O (old / behaviour log-prob), the log-ratio
d = P - Q, r = exp(-d) = ref / pi, |d|, the exact per-step KL over the vocabulary, and score
or importance multipliers. Each atom remembers whether gradient flows through it and how it was
accumulated over tokens (per token, reward-to-go, summed over the sequence). Recognising an
estimator is then a comparison of coefficients: k3 is r - 1 + d, whatever the spelling.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Final, Literal, NamedTuple, TypeAlias

from klaudit.catalog import Estimator, Returns
from klaudit.lint.kinds import Place, Weighting

# Atom kinds.
AtomKind: TypeAlias = Literal["P", "Q", "O", "d", "r", "R", "a", "s", "S", "w", "W", "eP", "eQ", "eO", "f", "F",
                              "VP", "VQ", "VpP", "VpQ", "LP", "LQ"]
POLICY: Final = "P"  # log pi(y_t | h_t)
REF: Final = "Q"  # log ref(y_t | h_t)
OLD: Final = "O"  # log pi_old(y_t | h_t)
DELTA: Final = "d"  # P - Q
RATIO: Final = "r"  # exp(-d) = ref / pi
INV_RATIO: Final = "R"  # exp(d) = pi / ref
ABS: Final = "a"  # |d|
SCORE_LOG: Final = "s"  # P - sg(P): value 0, gradient the score
SCORE: Final = "S"  # exp(P - sg(P)): value 1, gradient the score
IS_LOG: Final = "w"  # P - O
IS_RATIO: Final = "W"  # exp(P - O)
PROB: Final = "eP"  # pi(y_t | h_t), the probability of the sampled token
REF_PROB: Final = "eQ"
OLD_PROB: Final = "eO"
FULL: Final = "f"  # sum_v pi(v) (log pi(v) - log ref(v)), the exact per-step reverse KL
FULL_FWD: Final = "F"  # sum_v ref(v) (log ref(v) - log pi(v)), the exact per-step forward KL
VOCAB_POLICY: Final = "VP"  # log_softmax(policy logits), [.., V]
VOCAB_REF: Final = "VQ"  # log_softmax(reference logits), [.., V]
VOCAB_PROB: Final = "VpP"  # softmax(policy logits)
VOCAB_REF_PROB: Final = "VpQ"  # softmax(reference logits)
LOGITS: Final = "LP"  # raw policy logits
REF_LOGITS: Final = "LQ"  # raw reference logits

# How an atom was accumulated over the token axis.
Accumulation: TypeAlias = Literal["tok", "rtg", "seq", "seqmean"]
TOKEN: Final = "tok"
TO_GO: Final = "rtg"  # reversed cumulative sum: sum over u >= t
SEQUENCE: Final = "seq"  # summed over the response
SEQUENCE_MEAN: Final = "seqmean"  # averaged over the response (the sum over its length), inside an exp: a mean log-ratio

_MULTIPLIERS: frozenset[AtomKind] = frozenset({SCORE, IS_RATIO})
SURROGATES: frozenset[AtomKind] = frozenset({SCORE, SCORE_LOG, IS_LOG, IS_RATIO})  # a policy-gradient term's atoms
_POLICY_SIDE: frozenset[AtomKind] = frozenset({POLICY, SCORE, IS_RATIO})  # the policy and the multipliers
# the policy, the multipliers and the policy's full-vocabulary tensors (an entropy bonus is made of them), and
# the behaviour policy's log-probs (a PPO or SPPO surrogate, a trust region to the old policy): no reference
_POLICY_ONLY: frozenset[AtomKind] = _POLICY_SIDE | {LOGITS, VOCAB_POLICY, VOCAB_PROB, OLD, IS_LOG, OLD_PROB}


class Atom(NamedTuple):
    """One symbolic tensor: its kind, whether gradient flows through it, how it was accumulated.

    A named tuple: atoms are hashed, compared and sorted at every step of the algebra (they are the
    keys of a polynomial's monomials), which a tuple does in C, where a dataclass runs its generated
    methods as Python code. Equal, hashed and ordered as the tuple of its fields, as a frozen ordered
    dataclass is."""

    kind: AtomKind
    grad: bool = False
    acc: Accumulation = TOKEN

    def detached(self) -> Atom:
        return Atom(self.kind, False, self.acc)

    def accumulated(self, acc: Accumulation) -> Atom:
        return Atom(self.kind, self.grad, acc)


Monomial: TypeAlias = "tuple[Atom, ...]"  # sorted; () is the constant 1
Terms: TypeAlias = "list[tuple[Monomial, float]]"  # (monomial, coefficient) pairs of a polynomial, in any order


@dataclass(frozen=True)
class Poly:
    """A sum of coefficient * monomial. Coefficients are floats; unknown positive scales are dropped."""

    terms: tuple[tuple[Monomial, float], ...]  # sorted

    @staticmethod
    def of(mapping: Mapping[Monomial, float]) -> Poly:
        return Poly(tuple(sorted((m, c) for m, c in mapping.items() if abs(c) > 1e-12)))

    @staticmethod
    def atom(atom: Atom, coef: float = 1.0) -> Poly:
        return Poly.of({(atom,): coef})

    @staticmethod
    def const(value: float) -> Poly:
        return Poly.of({(): value})

    def as_dict(self) -> dict[Monomial, float]:
        return dict(self.terms)

    def is_const(self) -> bool:
        return all(m == () for m, _ in self.terms)

    def const_value(self) -> float | None:
        if not self.terms:
            return 0.0
        if self.is_const():
            return self.terms[0][1]
        return None

    def atoms(self) -> set[Atom]:
        return {a for m, _ in self.terms for a in m}

    def has_grad(self) -> bool:
        return any(a.grad for a in self.atoms())

    def map_atoms(self, fn: Callable[[Atom], Atom]) -> Poly:
        out: dict[Monomial, float] = {}
        for mono, coef in self.terms:
            key = tuple(sorted(fn(a) for a in mono))
            out[key] = out.get(key, 0.0) + coef
        return _normalize(Poly.of(out))


# Sums and products are asked of the same few polynomials again and again (every alternative of one
# operand with every compatible alternative of the other: TRL's 8,200 sums are 390 distinct ones), and
# a polynomial is an immutable value: each is computed once.
@functools.lru_cache(maxsize=4096)
def add(left: Poly, right: Poly, sign: float = 1.0) -> Poly:
    out = left.as_dict()
    for mono, coef in right.terms:
        out[mono] = out.get(mono, 0.0) + sign * coef
    return _normalize(Poly.of(out))


def scale(poly: Poly, factor: float) -> Poly:
    return Poly.of({m: c * factor for m, c in poly.terms})


@functools.lru_cache(maxsize=4096)  # see add
def mul(left: Poly, right: Poly) -> Poly:
    out: dict[Monomial, float] = {}
    for m1, c1 in left.terms:
        for m2, c2 in right.terms:
            key = _cancel_ratios(tuple(sorted(m1 + m2)))
            out[key] = out.get(key, 0.0) + c1 * c2
    return _normalize(Poly.of(out))


def _cancel_ratios(mono: Monomial) -> Monomial:
    """(pi/ref) * (ref/pi) = 1: an R and an r of the same log-ratio (both differentiable or both detached)
    cancel, value and gradient; a detached one beside a differentiable one does not (exp(sg d - d))."""
    atoms = list(mono)
    for atom in mono:
        inverse = Atom(RATIO, atom.grad, atom.acc)
        if atom.kind == INV_RATIO and atom in atoms and inverse in atoms:
            atoms.remove(atom)
            atoms.remove(inverse)
    return tuple(atoms) if len(atoms) != len(mono) else mono


def _normalize(poly: Poly) -> Poly:
    """Fold pairs of linear atoms into the log-ratios they spell: P - Q -> d, P - sg(P) -> s, P - O -> w."""
    terms = poly.as_dict()
    changed = True
    while changed:
        changed = False
        linear = {m[0]: c for m, c in terms.items() if len(m) == 1}
        for atom, coef in linear.items():
            if atom.kind not in (POLICY, OLD):
                continue
            for other, other_coef in linear.items():
                if abs(other_coef + coef) > 1e-12 or other.acc != atom.acc:
                    continue
                folded = _fold(atom, other)
                if folded is None:
                    continue
                terms[(atom,)] -= coef
                terms[(other,)] += coef
                terms[(folded,)] = terms.get((folded,), 0.0) + coef
                terms = {m: c for m, c in terms.items() if abs(c) > 1e-12}
                changed = True
                break
            if changed:
                break
    return Poly(tuple(sorted(terms.items())))


def _fold(plus: Atom, minus: Atom) -> Atom | None:
    if minus.kind == REF and plus.kind in (POLICY, OLD):
        return Atom(DELTA, plus.grad and plus.kind == POLICY, plus.acc)
    if plus.kind == POLICY and minus.kind == POLICY and plus.grad and not minus.grad:
        return Atom(SCORE_LOG, True, plus.acc)
    if plus.kind == POLICY and minus.kind == OLD:
        return Atom(IS_LOG, plus.grad, plus.acc)
    return None


def exp(poly: Poly) -> Poly | None:
    """exp of a log-ratio: d -> R, -d -> r, s -> S, w -> W (a constant offset is a scale)."""
    linear = [(m, c) for m, c in poly.terms if m != ()]
    if len(linear) != 1 or len(linear[0][0]) != 1:
        return None
    (atom,), coef = linear[0]
    if abs(abs(coef) - 1.0) > 1e-12:
        return None
    kinds: dict[tuple[AtomKind, int], AtomKind] = {
        (DELTA, 1): INV_RATIO, (DELTA, -1): RATIO, (SCORE_LOG, 1): SCORE, (IS_LOG, 1): IS_RATIO,
        (POLICY, 1): PROB, (REF, 1): REF_PROB, (OLD, 1): OLD_PROB}
    kind = kinds.get((atom.kind, int(round(coef))))
    if kind is None:
        return None
    return Poly.atom(Atom(kind, atom.grad, atom.acc))


def log(poly: Poly) -> Poly | None:
    """log of a ratio: log r = -d, log R = d; of a sampled token's probability: its log-prob."""
    if len(poly.terms) != 1:
        return None
    mono, coef = poly.terms[0]
    if abs(coef - 1.0) > 1e-12 or len(mono) != 1:
        return None
    atom = mono[0]
    inverse: dict[AtomKind, tuple[AtomKind, float]] = {
        RATIO: (DELTA, -1.0), INV_RATIO: (DELTA, 1.0), SCORE: (SCORE_LOG, 1.0), IS_RATIO: (IS_LOG, 1.0),
        PROB: (POLICY, 1.0), REF_PROB: (REF, 1.0), OLD_PROB: (OLD, 1.0)}
    if atom.kind not in inverse:
        return None
    kind, sign = inverse[atom.kind]
    return Poly.atom(Atom(kind, atom.grad, atom.acc), sign)


def probability_ratio(numerator: Poly, denominator: Poly) -> Poly | None:
    """The ratio of two sampled tokens' probabilities as the exp of their log-ratio: ref(y) / pi(y) = exp(Q - P)
    = r, pi(y) / pi_old(y) = W; None unless both are one probability atom."""
    if not all(len(p.terms) == 1 and len(p.terms[0][0]) == 1 and p.terms[0][0][0].kind in _PROBABILITIES
               for p in (numerator, denominator)):
        return None
    upper, lower = log(numerator), log(denominator)
    return None if upper is None or lower is None else exp(add(upper, lower, -1.0))


_PROBABILITIES = frozenset({PROB, REF_PROB, OLD_PROB})


def absolute(poly: Poly) -> Poly | None:
    if len(poly.terms) == 1 and len(poly.terms[0][0]) == 1 and poly.terms[0][0][0].kind == DELTA:
        atom = poly.terms[0][0][0]
        return Poly.atom(Atom(ABS, atom.grad, atom.acc), abs(poly.terms[0][1]))
    return None


def detach(poly: Poly) -> Poly:
    return poly.map_atoms(Atom.detached)


_ON_FRESH_SAMPLES: Mapping[AtomKind, AtomKind] = {IS_RATIO: SCORE, IS_LOG: SCORE_LOG}


def on_fresh_samples(poly: Poly) -> Poly:
    """The ratio to the behaviour policy where the samples were drawn by the policy as it is: exp(P - O) with
    O the same log-probs, detached, is 1 in value and the score in gradient (W -> S, w -> s)."""
    return poly.map_atoms(lambda a: Atom(_ON_FRESH_SAMPLES.get(a.kind, a.kind), a.grad, a.acc))


def accumulate(poly: Poly, acc: Accumulation) -> Poly:
    """Sum per-token atoms over the tokens (reward-to-go or the whole sequence).

    Only first-degree per-token terms become accumulated atoms: the token-sum of a product
    (logp * sg(d), d * d) is the aggregation of a per-token term, not a product of sums.
    """
    out: dict[Monomial, float] = {}
    for mono, coef in poly.terms:
        if len(mono) == 1 and mono[0].acc == TOKEN:
            mono = (mono[0].accumulated(acc),)
        out[mono] = out.get(mono, 0.0) + coef
    return _normalize(Poly.of(out))


# ---- recognising estimators -------------------------------------------------------------

# Each estimator's value, as a polynomial in d (atoms given by kind), up to a positive scale and an
# additive constant: a constant never changes a gradient (pathwise it has none; as a reward it
# multiplies a zero-mean score), so k3 = r - 1 + d is matched as r + d, whatever else is added.
_FORMS: dict[Estimator, dict[tuple[AtomKind, ...], float]] = {
    Estimator.K1: {(DELTA,): 1.0},
    Estimator.K2: {(DELTA, DELTA): 1.0},
    Estimator.K3: {(RATIO,): 1.0, (DELTA,): 1.0},
    Estimator.K3_REVERSED: {(INV_RATIO,): 1.0, (DELTA,): -1.0},
    Estimator.ABS: {(ABS,): 1.0},
    Estimator.FULL: {(FULL,): 1.0},
    Estimator.FULL_FORWARD: {(FULL_FWD,): 1.0},
}


def _shape(terms: Iterable[tuple[Monomial, float]]) -> dict[tuple[AtomKind, ...], float]:
    """Drop grad, accumulation and the constant: monomials keyed by atom kinds only."""
    out: dict[tuple[AtomKind, ...], float] = {}
    for mono, coef in terms:
        if not mono:
            continue
        key = tuple(sorted(a.kind for a in mono))
        out[key] = out.get(key, 0.0) + coef
    return {k: v for k, v in out.items() if abs(v) > 1e-12}


def match_estimator(terms: Iterable[tuple[Monomial, float]]) -> tuple[Estimator, int] | None:
    """(estimator, sign) when the terms are a nonzero multiple of a known estimator's value."""
    shape = _shape(terms)
    if not shape:
        return None
    for estimator, form in _FORMS.items():
        if set(shape) != set(form):
            continue
        key = next(iter(form))
        factor = shape[key] / form[key]
        if all(abs(shape[m] - factor * form[m]) <= 1e-9 * max(1.0, abs(factor)) for m in form):
            return estimator, (1 if factor > 0 else -1)
    return None


@dataclass(frozen=True)
class Term:
    """One KL contribution inside a polynomial, as the catalog needs it.

    `place` is "loss" (pathwise gradient through the estimator) or "reward" (a detached estimator
    times the score of the sampled token, or a detached value put into a reward).
    """

    place: Place
    estimator: Estimator | None  # None: a KL-like form no catalog estimator matches
    sign: int
    returns: Returns
    weighted: Weighting = ""


_KL_KINDS = frozenset({DELTA, RATIO, INV_RATIO, ABS, FULL, FULL_FWD})


def kl_atoms(poly: Poly) -> bool:
    """True when the polynomial involves a reference log-ratio (something a KL is made of); kept on the
    polynomial, which every fact that holds it is asked about again and again."""
    cached = poly.__dict__.get("_kl")
    if cached is None:
        cached = any(a.kind in _KL_KINDS for a in poly.atoms())
        object.__setattr__(poly, "_kl", cached)
    return cached


def kl_part(poly: Poly) -> Poly:
    """The monomials that involve a KL atom: what a verdict reads (the policy-gradient terms added to
    the same loss change no KL gradient, by linearity)."""
    return Poly(tuple((m, c) for m, c in poly.terms if any(a.kind in _KL_KINDS for a in m)))


def without_kl(poly: Poly) -> Poly:
    """The monomials that involve no KL atom."""
    return Poly(tuple((m, c) for m, c in poly.terms if not any(a.kind in _KL_KINDS for a in m)))


def _returns_of(terms: Terms) -> Returns:
    accs = {a.acc for mono, _ in terms for a in mono}
    if accs == {TO_GO}:
        return Returns.TO_GO
    if accs == {SEQUENCE}:
        return Returns.SEQUENCE
    return Returns.LOCAL


def _split_future(terms: Terms) -> Terms | None:
    """rtg(x) - x: the reward-to-go minus the same token's value is the future-only return."""
    rtg = [(m, c) for m, c in terms if all(a.acc == TO_GO for a in m)]
    tok = [(m, c) for m, c in terms if all(a.acc == TOKEN for a in m)]
    if not rtg or not tok or len(rtg) + len(tok) != len(terms):
        return None
    base = {tuple(a.accumulated(TOKEN) for a in m): c for m, c in rtg}
    tok_map = dict(tok)
    if set(base) != set(tok_map) or any(abs(base[m] + tok_map[m]) > 1e-9 for m in base):
        return None
    return [(m, c) for m, c in base.items()]


def _reward_term(factor: Terms, weighted: Weighting = "") -> Term | None:
    if not factor:
        return None
    future = _split_future(factor)
    if future is not None:
        found = match_estimator(future)
        returns = Returns.FUTURE
    else:
        found = match_estimator(factor)
        returns = _returns_of(factor)
    if found is None:
        return Term("reward", None, 1, returns, weighted) if kl_atoms(Poly.of(dict(factor))) else None
    return Term("reward", found[0], found[1], returns, weighted)


# A value with k2's gradient (sg(value) + k2 - sg(k2)), as a loss: the straight-through form of the value's
# estimator. abs+ has no row of its own: a loss's expected gradient is its gradient's, k2's.
_STRAIGHT_THROUGH = {Estimator.K1: Estimator.K1_ST, Estimator.K3: Estimator.K3_ST, Estimator.ABS: Estimator.K2}


def _loss_term(factor: Terms, weighted: Weighting = "") -> Term | None:
    """A differentiated factor: the estimator is named by its value, straight-through by its gradient."""
    value = match_estimator(factor)
    grad_part = [(m, c) for m, c in factor if any(a.grad for a in m)]
    if not grad_part:
        return None
    gradient = match_estimator(grad_part)
    if value and gradient and value[0] != gradient[0] and gradient[0] == Estimator.K2:
        straight = _STRAIGHT_THROUGH.get(value[0])
        if straight is not None:
            return Term("loss", straight, value[1], Returns.LOCAL, weighted)
    if value and (gradient is None or gradient[0] == value[0]):
        return Term("loss", value[0], value[1], Returns.LOCAL, weighted)

    if kl_atoms(Poly.of(dict(factor))):
        return Term("loss", None, 1, Returns.LOCAL, weighted)
    return None


def _strip(mono: Monomial, kinds: frozenset[AtomKind]) -> tuple[Atom | None, Monomial]:
    """Split a monomial into (multiplier atom or None, the rest)."""
    found = [a for a in mono if a.kind in kinds]
    if len(found) != 1:
        return None, mono
    rest = list(mono)
    rest.remove(found[0])
    return found[0], tuple(rest)


def terms_of(poly: Poly, sink: Place) -> list[Term]:
    """The KL contributions of a polynomial that reaches a `sink` ("loss" or "reward").

    In a loss: a differentiated estimator is a pathwise term; P_grad * sg(x) is x used as a
    reward with the returns its accumulation shows; S * x (S = exp(P - sg P)) and W * x (a
    differentiable importance ratio) add a loss term and a same-token reward term. A detached
    estimator added to a loss contributes nothing. In a reward every estimator counts by value.
    A monomial made only of the policy's and the behaviour policy's log-probs, ratios and logits (the
    policy-gradient part of the same loss, -A * ratio * rho or SPPO's (log pi/pi_old - eta r)^2, or an
    entropy bonus over the policy's logits) is another term of the sum: by linearity it changes no KL gradient.
    """
    if sink == "reward":
        term = _reward_term(list(detach(poly).terms))
        return [term] if term is not None else []
    groups: dict[tuple[AtomKind, bool, Accumulation] | None, Terms] = {}
    for mono, coef in poly.terms:
        multiplier, rest = _strip(mono, _POLICY_SIDE)
        if multiplier is not None and multiplier.kind == POLICY and not multiplier.grad:
            multiplier, rest = None, mono
        if multiplier is None and mono and all(a.kind in _POLICY_ONLY for a in mono):
            continue
        key = multiplier if multiplier is None else (multiplier.kind, multiplier.grad, multiplier.acc)
        groups.setdefault(key, []).append((rest, coef))
    out = []
    for key, factor in groups.items():
        factor = _without_reference_weights(factor, key is not None)
        if not kl_atoms(Poly.of(dict(factor))):
            continue
        differentiable = any(a.grad for m, _ in factor for a in m)
        if key is None:
            term = _loss_term(factor) if differentiable else _detached_in_loss(factor)
        elif key[0] == POLICY:
            term = _reward_term(factor) if not differentiable else _log_prob_times_k1(key, factor)
        elif key[1] and not differentiable:
            # exp(logp - sg logp) or a differentiable ratio times a detached KL: a REINFORCE term
            term = _reward_term(factor, "score" if key[0] == SCORE else "is")
        elif key[1]:
            weighted = _weighting(key[0], key[2])
            loss = _loss_term(factor, weighted)
            if loss is not None:
                out.append(loss)
            reward = _reward_term([(tuple(a.detached() for a in m), c) for m, c in factor], weighted)
            term = None if reward is None else Term("reward", reward.estimator, reward.sign, Returns.LOCAL, weighted)
        else:
            term = _loss_term(factor, "is-detached")
            if term is not None and term.estimator is None:
                term = _weighted_straight_through(factor, groups.get(None, [])) or term
        if term is not None:
            out.append(term)
    return out


def _without_reference_weights(factor: Terms, weighted: bool) -> Terms:
    """The factor less its monomials of pi / ref alone (exp(log pi - log ref) times nothing else of the KL's), where
    the whole factor matches no estimator and they weight a policy term: under a score or importance multiplier
    (`weighted`: GCPO's `A * exp(logp - sg logp) * exp(clamp(logp - ref))`, the advantage dropped as a scale), or
    beside what is an estimator without them (zmisource's `-f * exp(logp - ref) + beta * k2`). No catalog form has
    pi / ref without the log-ratio beside it (k3-reversed is R - 1 - d): a factor that matches one as a whole is kept,
    and so is one whose rest matches none either (`r - log(r + 1) - 1`, a KL term of a form the lint does not read)."""
    if match_estimator(factor) is not None:
        return factor
    rest = [(mono, coef) for mono, coef in factor if not _reference_weight(mono)]
    if len(rest) < len(factor) and (weighted or match_estimator(rest) is not None):
        return rest
    return factor


def reference_weighted_only(poly: Poly) -> bool:
    """Every KL monomial of the polynomial is pi / ref weighting a policy term (see _without_reference_weights)."""
    part = kl_part(poly)
    return bool(part.terms) and all(_reference_weight(mono) for mono, _ in part.terms)


def _reference_weight(mono: Monomial) -> bool:
    """pi / ref with its gradient, once, beside only the policy's and the behaviour policy's own tensors (a detached
    one, OREO's clipped sequence weight of other losses, is left to the factor: what it multiplies is not seen)."""
    kl = [a for a in mono if a.kind in _KL_KINDS]
    return len(kl) == 1 and kl[0].kind == INV_RATIO and kl[0].grad \
        and all(a.kind in _POLICY_ONLY for a in mono if a is not kl[0])


def _log_prob_times_k1(multiplier: tuple[AtomKind, bool, Accumulation], factor: Terms) -> Term | None:
    """`logp * (A - beta * (logp - ref))` with the k1 left differentiable, both per token: logp * k1 as a loss
    (kl-math.md row 13d); both summed over the response, `logp.sum(-1) * (R - beta * (logp - ref).sum(-1))`, the
    sequence form (row 13e, its returns SEQUENCE). Another differentiable factor of the log-prob is no catalog form."""
    found = match_estimator(factor)
    span = multiplier[2]
    if found is None or found[0] is not Estimator.K1 or span not in (TOKEN, SEQUENCE) \
            or any(a.acc != span for mono, _ in factor for a in mono):
        return None
    return Term("loss", Estimator.LOGP_K1, found[1], Returns.LOCAL if span == TOKEN else Returns.SEQUENCE)


def _detached_in_loss(factor: Terms) -> Term | None:
    """A detached estimate added as it is to a loss: with no gradient of its own, whatever the rest of the loss
    trains (kl-math.md row 1c; klaudit.lint.checks decides whether that loss is trained). Returns are not one (a
    critic's squared error against returns that hold the KL reward is a regression target)."""
    if any(a.acc == TO_GO for mono, _ in factor for a in mono):
        return None
    found = match_estimator(factor)
    return None if found is None else Term("reward", found[0], found[1], Returns.NOWHERE)


def _weighting(multiplier: AtomKind, acc: Accumulation) -> Weighting:
    """The weighting of a differentiable multiplier, S = exp(P - sg P) ("score") or W (an importance ratio,
    "is"), by its span: the token's own, the sequence's (exp of the summed log-ratio, "-seq"), or exp of its
    mean log-ratio ("-seqmean"), whose score is the sequence's over its length."""
    score = multiplier == SCORE
    if acc == SEQUENCE:
        return "score-seq" if score else "is-seq"
    if acc == SEQUENCE_MEAN:
        return "score-seqmean" if score else "is-seqmean"
    return "score" if score else "is"


def _weighted_straight_through(weighted: Terms, plain: Terms) -> Term | None:
    """`sg(value) + w * (k2 - sg(k2))` with w a detached weight (OpenRLHF's unbiased_gradient): the
    weighted part has no value of its own and k2's gradient, the value is the unweighted detached
    estimate; read as that estimate's straight-through form (k1+, k3+), weighted per token."""
    if not plain or any(a.grad for mono, _ in plain for a in mono):
        return None
    grad_part = [(mono, coef) for mono, coef in weighted if any(a.grad for a in mono)]
    value_part = [(mono, coef) for mono, coef in weighted if not any(a.grad for a in mono)]
    if set(value_part) != {(tuple(a.detached() for a in mono), -coef) for mono, coef in grad_part}:
        return None  # the weighted part changes the value: not a pure straight-through gradient
    value, gradient = match_estimator(plain), match_estimator(grad_part)
    if value is None or gradient is None or gradient[0] is not Estimator.K2:
        return None
    straight = {**_STRAIGHT_THROUGH, Estimator.K2: Estimator.K2}.get(value[0])
    return None if straight is None else Term("loss", straight, value[1], Returns.LOCAL, "is-detached")
