"""The KL configurations klaudit knows, as data (docs/kl-math.md section 8).

A configuration says how a per-token KL estimate enters training: which estimator, whether it
is differentiated as a loss or detached into the reward (and how that reward reaches earlier
tokens), how per-token terms are aggregated, at which positions, and on which samples. Each row
of `CATALOG` states the objective whose gradient the configuration follows in expectation, the
verdict, the lint rule that flags it, and the fix as a call of `klaudit.estimators`.

Plain Python: no torch here. `klaudit.audit.surrogates.build_surrogate` turns a `Config` into an
executable per-sequence surrogate, and the tests prove every row against exact enumeration.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class Estimator(str, Enum):
    """Per-token KL estimators, with delta = log pi - log ref and r = ref / pi = exp(-delta)."""

    K1 = "k1"  # delta
    K2 = "k2"  # delta^2 / 2
    K3 = "k3"  # r - 1 - log r = exp(-delta) - 1 + delta
    LOW_VAR_KL = "low_var_kl"  # k3 with verl's clamps: delta to [-20, 20], the value to [-10, 10]
    ABS = "abs"  # |delta|
    K1_ST = "k1+"  # straight-through: value k1, gradient of k2
    K3_ST = "k3+"  # straight-through: value k3, gradient of k2
    FULL = "full"  # exact per-step KL_t(h) over the vocabulary (needs logits)
    FULL_FORWARD = "full-fwd"  # exact per-step forward FKL_t(h) = KL(ref || pi) over the vocabulary (needs logits)
    RATIO_K3 = "ratio*k3"  # exp(logp - sg(logp)) * k3: value k3, gradient of the score-weighted k3
    K3_REVERSED = "k3-reversed"  # exp(delta) - 1 - delta: k3 with pi / ref where ref / pi belongs
    LOGP_K1 = "logp*k1"  # logp * delta, both differentiated: an undetached k1 in a return that multiplies logp
    PROB_K1 = "p*k1"  # pi(y_t) * delta: the summand of the exact KL_t taken at the sampled token alone


class Returns(str, Enum):
    """How a detached per-token reward reaches the score of token t."""

    TO_GO = "reward-to-go"  # sum over u >= t (PPO/GAE with gamma = lambda = 1)
    FUTURE = "future-only"  # sum over u > t (the companion of a loss on the same token)
    SEQUENCE = "whole-sequence"  # the sequence total, on every token (GRPO/RLOO outcome style)
    SEQUENCE_MEAN = "whole-sequence / L"  # the sequence total over its length L, on every token: the score
    # part of exp(mean_t (logp_t - sg logp_t)) * k_t, a sequence ratio of the mean log-ratio (GSPO-style)
    LOCAL = "same-token"  # token t's own value only, no accumulation
    NOWHERE = "no score"  # the detached value added to the loss as it is: it multiplies no score, so no gradient


class Aggregation(str, Enum):
    """How per-token terms become one scalar; each is a weight h(L) on the sequence's token-sum."""

    SUM = "token-sum"  # h = 1
    CONSTANT = "divide-by-constant"  # h = 1 / T_max
    SEQ_MEAN = "seq-token-mean"  # h = 1 / L
    BATCH_MEAN = "batch-token-mean"  # h = B E[1 / (L + S_{B-1})]; 1 / E[L] as B -> infinity


class Position(str, Enum):
    """Which tokens carry the KL term."""

    ALL = "all-tokens"
    LAST = "last-token"  # only the final response token
    SEQUENCE = "sequence-log-ratio"  # the estimator applied to D = sum_t delta_t
    SEQUENCE_MEAN = "sequence-mean-log-ratio"  # the estimator applied to D / L, the response's mean log-ratio


class Sampling(str, Enum):
    """Where the samples come from and how they are reweighted towards pi."""

    ON_POLICY = "on-policy"
    OFF_POLICY = "off-policy"  # from pi_old, no correction
    TOKEN_IS = "token-is"  # sg(pi_t / pi_old_t) on each token's term
    PER_DECISION_IS = "per-decision-is"  # prefix products w_{1:t}; exact


class Objective(str, Enum):
    """What the expected gradient equals (docs/kl-math.md section 1)."""

    REV = "REV"  # grad KL(pi || ref), the target
    FWD = "FWD"  # grad KL(ref || pi), sequence level
    PART = "PART"  # sum_t E[grad KL_t(h_t)], prefix distribution frozen
    PFWD = "PFWD"  # sum_t E[grad FKL_t(h_t)], per-token forward KL at the policy's prefixes
    FUT = "FUT"  # REV - PART, the future term alone
    ZERO = "ZERO"  # zero in expectation
    LEN = "LEN"  # grad E[1 / L]
    OTHER = "OTHER"


class Target(str, Enum):
    """Reference gradients the exact engine computes; identities are combinations of these."""

    REV = "REV"
    FWD = "FWD"
    PART = "PART"
    PFWD = "PFWD"
    FUT = "FUT"
    LEN = "LEN"
    PTV = "PTV"  # sum_t E[grad TV_t(h_t)]
    PCHI = "PCHI"  # sum_t E[grad CHI_t(h_t)], CHI_t = sum_v pi(v)^2 / ref(v) - 1, prefixes held fixed


@dataclass(frozen=True)
class Config:
    """One way of putting a KL estimate into training.

    `loss` is the estimator differentiated as a loss (pathwise), `reward` the estimator detached
    into the reward and propagated by `returns`; either may be None. `sign` is -1 when the term
    is added with the wrong sign (a KL bonus instead of a penalty).
    """

    loss: Estimator | None = None
    reward: Estimator | None = None
    returns: Returns = Returns.TO_GO
    aggregation: Aggregation = Aggregation.SUM
    position: Position = Position.ALL
    sampling: Sampling = Sampling.ON_POLICY
    sign: int = 1


# --- Fixes: the minimal correct replacement, as a call of klaudit.estimators (kl-math.md §8, R-A..R-F).

FIX_K1_LOSS = (
    "loss = pg_loss + beta * klaudit.estimators.kl_penalty(logprobs, ref_logprobs, mask).loss.mean()"
    "  # k1 with reward-to-go (R-A)"
)
FIX_K3_LOSS = (
    "loss = pg_loss + beta * klaudit.estimators.kl_penalty(logprobs, ref_logprobs, mask, estimator=\"k3\")"
    ".loss.mean()  # k3 loss plus k3 reward-to-go (R-C)"
)
FIX_RB_LOSS = (
    "loss = pg_loss + beta * klaudit.estimators.kl_penalty(logprobs, ref_logprobs, mask, estimator=\"rb\", "
    "logits=logits, ref_logits=ref_logits).loss.mean()  # Rao-Blackwellized with the future term (R-D)"
)
FIX_REWARD = (
    "rewards = rewards - beta * klaudit.estimators.kl_reward(logprobs, ref_logprobs, mask)"
    "  # detached k1, then reward-to-go or a whole-sequence return"
)
FIX_OFF_POLICY = (
    "loss = pg_loss + beta * klaudit.estimators.kl_penalty(logprobs, ref_logprobs, mask, "
    "old_logprobs=old_logprobs).loss.mean()  # per-decision importance weights (R-F)"
)
FIX_AGGREGATION = (
    "aggregate the KL term as a token-sum per sequence, or divide by a constant: "
    "klaudit.estimators.kl_penalty(logprobs, ref_logprobs, mask).loss.mean()"
)
FIX_ALL_TOKENS = "sum the KL over every response token: " + FIX_K1_LOSS
FIX_SIGN = "subtract the KL penalty from the objective (add it to the loss): " + FIX_K1_LOSS
FIX_DOUBLE = (
    "keep one of the two: the k1 reward alone (klaudit.estimators.kl_reward), or "
    "klaudit.estimators.kl_penalty(..., estimator=\"k3\").loss alone"
)
FIX_UNCLAMPED = "drop the clamps: " + FIX_K3_LOSS


# `.loss` of the estimators is a per-sequence token-sum; `.loss.mean()` has the scale of code that sums
# the KL over each sequence's tokens. Code that averages over tokens gets the batch token-mean instead,
# unbiased like the sum (row 20: only the scale changes), so that beta keeps its strength.
_PER_SEQUENCE_SUM = ".loss.mean()"
_SCALES = {
    Aggregation.SEQ_MEAN: (".loss.sum() / mask.sum()",
                           " (÷ the batch's token count: about the scale of the per-sequence token-mean replaced)"),
    Aggregation.BATCH_MEAN: (".loss.sum() / mask.sum()", " (÷ the batch's token count: the token-mean's scale, as before)"),
    Aggregation.CONSTANT: (".loss.sum() / constant", " (÷ the same constant as before: the same scale)"),
}


def scaled_fix(fix: str | None, aggregation: Aggregation) -> str | None:
    """`fix` at the KL scale of the code it replaces, which aggregates its KL term by `aggregation`."""
    if fix is None or _PER_SEQUENCE_SUM not in fix or aggregation not in _SCALES:
        return fix
    reduction, note = _SCALES[aggregation]
    return fix.replace(_PER_SEQUENCE_SUM, reduction) + note


@dataclass(frozen=True)
class Row:
    """A catalog entry: a configuration and what its expected gradient really is.

    `number` is the row of kl-math.md §8. `identity` writes the expected gradient exactly as a
    combination of `Target` gradients when one is known (before any aggregation rescaling);
    `objective` is the closest name from `Objective`. `rule` is None for a correct configuration.
    `config` is None for the generic rows that `classify` falls back on.
    """

    number: str
    label: str
    config: Config | None
    objective: Objective
    rule: str | None
    explanation: str
    fix: str = ""
    identity: Mapping[Target, float] = field(default_factory=dict)
    needs_eos: bool = False  # the verdict holds only when lengths vary (with a fixed length it is 0)

    @property
    def unbiased(self) -> bool:
        """True when the expected gradient is a positive multiple of grad KL(pi || ref)."""
        return self.objective is Objective.REV and self.rule is None


E = Estimator
_LOSS = "{} differentiated as a loss"


def _row(number, label, config, objective, rule, explanation, fix="", identity=None, needs_eos=False):
    if identity is None:
        identity = {Target(objective.value): 1.0} if objective.value in Target.__members__ else {}
    return Row(number, label, config, objective, rule, explanation, fix, identity, needs_eos)


def _loss(estimator: Estimator, **kw) -> Config:
    return Config(loss=estimator, **kw)


def _reward(estimator: Estimator, returns: Returns = Returns.TO_GO, **kw) -> Config:
    return Config(reward=estimator, returns=returns, **kw)


_PARTIAL = (
    "differentiating a per-token KL gives only the local gradient, with the prefix distribution frozen "
    "(PART): the term that carries later tokens' KL back to earlier tokens is missing"
)
_REWARD_BIASED = (
    "only k1 values carry the first-order score-function signal: this reward's expected gradient is "
    "not grad KL(pi || ref), and near the reference it is second order (no restoring force)"
)

CATALOG: tuple[Row, ...] = (
    _row("1", "k1 as loss", _loss(E.K1), Objective.ZERO, "KL001",
         "the log-ratio's expected gradient is E[score] = 0: the KL term adds noise and no regularisation",
         FIX_K1_LOSS),
    _row("1b", "k1 as loss, per-sequence token-mean", _loss(E.K1, aggregation=Aggregation.SEQ_MEAN),
         Objective.LEN, "KL001",
         "with 1/L weights the k1 loss's expected gradient is grad E[1/L]: it pushes towards longer "
         "responses instead of towards the reference", FIX_K1_LOSS, needs_eos=True),
    _row("1c", "KL estimate added to the loss without its gradient", _reward(E.K1, Returns.NOWHERE), Objective.ZERO,
         "KL001", "the KL term reaches the loss detached (detach, no_grad, item): its gradient is exactly zero, so "
         "the KL regularises nothing while its value is logged as part of the loss", FIX_K1_LOSS),
    _row("2", "k2 as loss", _loss(E.K2), Objective.PART, "KL003", _PARTIAL, FIX_K1_LOSS),
    _row("2", "k1+ (straight-through) as loss", _loss(E.K1_ST), Objective.PART, "KL003",
         "the straight-through k1+ has the gradient of k2: " + _PARTIAL, FIX_K1_LOSS),
    _row("2", "k3+ (straight-through) as loss", _loss(E.K3_ST), Objective.PART, "KL003",
         "the straight-through k3+ has the gradient of k2: " + _PARTIAL, FIX_K3_LOSS),
    _row("2", "exact per-step KL as loss", _loss(E.FULL), Objective.PART, "KL003", _PARTIAL, FIX_RB_LOSS),
    _row("2", "ratio * k3 as loss", _loss(E.RATIO_K3), Objective.PART, "KL003",
         "the score-weighted k3 has the local gradient of the reverse KL only: " + _PARTIAL, FIX_K3_LOSS),
    _row("2", "ratio * k1 as loss: k1 as loss + k1 in reward, same token", Config(loss=E.K1, reward=E.K1,
                                                                                 returns=Returns.LOCAL),
         Objective.PART, "KL003", "the score-weighted k1 (k1 * exp(logp - sg(logp))) is a zero-mean score plus a k1 "
         "reward on its own token: " + _PARTIAL, FIX_K1_LOSS),
    _row("3", "k3 as loss", _loss(E.K3), Objective.PFWD, "KL002",
         "k3 = r - 1 - log r differentiated gives E[(1 - r) score] = grad of the per-token forward KL "
         "KL(ref || pi) at the policy's prefixes, not grad KL(pi || ref)", FIX_K3_LOSS),
    _row("3b", "exact per-step forward KL as loss", _loss(E.FULL_FORWARD), Objective.PFWD, "KL002",
         "sum_v ref(v) (log ref(v) - log pi(v)) at each step differentiated gives grad of the per-token forward KL "
         "KL(ref || pi) at the policy's prefixes, not grad KL(pi || ref)", FIX_RB_LOSS),
    _row("4", "low_var_kl (clamped k3) as loss", _loss(E.LOW_VAR_KL), Objective.OTHER, "KL002",
         "low_var_kl is k3 with clamps: as a loss it follows the per-token forward KL, and the clamps "
         "zero the gradient where pi << ref", FIX_K3_LOSS),
    _row("5", "abs as loss", _loss(E.ABS), Objective.OTHER, "KL009",
         "|log pi - log ref| differentiated gives twice the gradient of the per-token total variation, "
         "not of any KL", FIX_K1_LOSS, identity={Target.PTV: 2.0}),
    _row("5b", "k3 with the ratio reversed as loss", _loss(E.K3_REVERSED), Objective.OTHER, "KL009",
         "exp(log pi - log ref) - 1 - (log pi - log ref) is k3 with pi / ref where ref / pi belongs: differentiated "
         "it gives half the gradient of the per-token chi-square divergence sum_v pi^2 / ref - 1, not of any KL",
         FIX_K3_LOSS, identity={Target.PCHI: 0.5}),
    _row("5c", "p * k1 at the sampled token as loss", _loss(E.PROB_K1), Objective.OTHER, "KL009",
         "pi(y) * (log pi(y) - log ref(y)) is one summand of the exact per-step KL taken at the sampled token, not an "
         "estimate of it (its mean is sum_v pi(v)^2 delta(v)): differentiated it gives the gradient of "
         "sum_v pi(v)^2 (delta(v) + 1/2) / 2 at each step, not of any KL", FIX_K1_LOSS),
    _row("6", "k1 in reward, reward-to-go", _reward(E.K1), Objective.REV, None,
         "k1 detached into the reward with reward-to-go is the score-function gradient of KL(pi || ref)"),
    _row("6", "k1 in reward, whole-sequence return", _reward(E.K1, Returns.SEQUENCE), Objective.REV, None,
         "k1 summed over the sequence and detached into the return is the score-function gradient of "
         "KL(pi || ref)"),
    _row("2", "k1 in reward, same token only (no reward-to-go)", _reward(E.K1, Returns.LOCAL), Objective.PART,
         "KL003", "a k1 reward that reaches only its own token's score gives the local gradient (PART): "
         "the later tokens' KL never reaches earlier tokens", FIX_REWARD),
    _row("7", "k3 in reward, reward-to-go", _reward(E.K3), Objective.OTHER, "KL004",
         "k3 values in the reward give grad REV - PFWD: " + _REWARD_BIASED, FIX_REWARD,
         identity={Target.REV: 1.0, Target.PFWD: -1.0}),
    _row("7", "k3 in reward, whole-sequence return", _reward(E.K3, Returns.SEQUENCE), Objective.OTHER,
         "KL004", "k3 values in the return give grad REV - PFWD: " + _REWARD_BIASED, FIX_REWARD,
         identity={Target.REV: 1.0, Target.PFWD: -1.0}),
    _row("7", "k3 in reward, same token only (no reward-to-go)", _reward(E.K3, Returns.LOCAL), Objective.OTHER,
         "KL004", "k3 values that reach only their own token's score give grad PART - PFWD: " + _REWARD_BIASED,
         FIX_REWARD, identity={Target.PART: 1.0, Target.PFWD: -1.0}),
    _row("7", "low_var_kl in reward, reward-to-go", _reward(E.LOW_VAR_KL), Objective.OTHER, "KL004",
         "low_var_kl (clamped k3) values in the reward: " + _REWARD_BIASED, FIX_REWARD),
    _row("7", "low_var_kl in reward, same token only (no reward-to-go)", _reward(E.LOW_VAR_KL, Returns.LOCAL),
         Objective.OTHER, "KL004", "low_var_kl (clamped k3) values on their own token's score: " + _REWARD_BIASED,
         FIX_REWARD),
    _row("8", "k2 in reward, reward-to-go", _reward(E.K2), Objective.OTHER, "KL004",
         "k2 values in the reward: " + _REWARD_BIASED, FIX_REWARD),
    _row("8", "k2 in reward, same token only (no reward-to-go)", _reward(E.K2, Returns.LOCAL), Objective.OTHER,
         "KL004", "k2 values on their own token's score: " + _REWARD_BIASED, FIX_REWARD),
    _row("9", "abs in reward, reward-to-go", _reward(E.ABS), Objective.OTHER, "KL004",
         "|log-ratio| values in the reward: " + _REWARD_BIASED, FIX_REWARD),
    _row("9", "abs in reward, same token only (no reward-to-go)", _reward(E.ABS, Returns.LOCAL), Objective.OTHER,
         "KL004", "|log-ratio| values on their own token's score: " + _REWARD_BIASED, FIX_REWARD),
    _row("9b", "k3 with the ratio reversed in reward, reward-to-go", _reward(E.K3_REVERSED), Objective.OTHER,
         "KL004", "values of k3 with pi / ref where ref / pi belongs (in expectation the per-token chi-square "
         "minus the KL) in the reward: " + _REWARD_BIASED, FIX_REWARD),
    _row("9c", "p * k1 at the sampled token in reward, reward-to-go", _reward(E.PROB_K1), Objective.OTHER, "KL004",
         "values of pi(y) * (log pi(y) - log ref(y)) at the sampled token (in expectation sum_v pi(v)^2 delta(v), "
         "no KL) in the reward: " + _REWARD_BIASED, FIX_REWARD),
    _row("9c", "p * k1 at the sampled token in reward, same token only (no reward-to-go)",
         _reward(E.PROB_K1, Returns.LOCAL), Objective.OTHER, "KL004",
         "values of pi(y) * (log pi(y) - log ref(y)) on their own token's score: " + _REWARD_BIASED, FIX_REWARD),
    _row("10", "exact per-step KL in reward, reward-to-go", _reward(E.FULL), Objective.FUT, "KL004",
         "the detached per-step KL_t(h_t) does not depend on the sampled token, so in the reward it gives "
         "only the future term FUT; the local term (the KL_t as a loss) is missing", FIX_RB_LOSS),
    _row("10b", "exact per-step KL in reward, same token only", _reward(E.FULL, Returns.LOCAL), Objective.ZERO,
         "KL004", "the detached per-step KL_t(h_t) is fixed before token t is drawn, and it reaches only that token's "
         "score, whose expectation is zero: this reward adds no gradient in expectation, neither the local term "
         "nor the future one", FIX_RB_LOSS),
    _row("10c", "exact per-step forward KL in reward, reward-to-go", _reward(E.FULL_FORWARD), Objective.OTHER,
         "KL004", "the detached per-step forward KL(ref || pi) at h_t is fixed before token t is drawn, so in the reward "
         "it only reweights prefixes by the later steps' forward KL: no KL's gradient", FIX_RB_LOSS),
    _row("11", "Rao-Blackwellized: exact KL as loss + future exact KL in reward",
         Config(loss=E.FULL, reward=E.FULL, returns=Returns.FUTURE), Objective.REV, None,
         "the per-step KL's local gradient plus the later steps' KL as a future return is grad KL(pi || ref)"
         " with the lowest variance"),
    _row("12", "k2 as loss + k1 future reward", Config(loss=E.K2, reward=E.K1, returns=Returns.FUTURE),
         Objective.REV, None, "k2's local gradient plus the later tokens' k1 as a return is grad KL(pi || ref)"),
    _row("13", "k3 as loss + k3 in reward, reward-to-go", Config(loss=E.K3, reward=E.K3),
         Objective.REV, None,
         "k3's pathwise gradient plus k3 values with reward-to-go is grad E[sum k3] = grad KL(pi || ref)"),
    _row("13b", "k3 as loss + k3 in reward, whole-sequence return / L",
         Config(loss=E.K3, reward=E.K3, returns=Returns.SEQUENCE_MEAN), Objective.OTHER, "KL009",
         "a k3 weighted by exp of the mean log-ratio over the response (value 1, gradient score / L) gives "
         "k3's pathwise gradient (PFWD) plus the whole sequence's k3 times its score divided by its length: the "
         "score-function half of R-C is cut by 1/L, so the sum follows no KL objective", FIX_K3_LOSS),
    _row("13c", "ratio * k2 as loss: k2 as loss + k2 in reward, same token", Config(loss=E.K2, reward=E.K2,
                                                                                   returns=Returns.LOCAL),
         Objective.OTHER, "KL009", "the score-weighted k2 (k2 * exp(logp - sg(logp))) differentiated gives k2's "
         "pathwise gradient (PART) plus k2 values times their own token's score: the sum follows no KL objective",
         FIX_K1_LOSS),
    _row("13d", "logp * k1 as loss: k1 left undetached in a same-token return", _loss(E.LOGP_K1), Objective.OTHER,
         "KL009", "the log-prob times a k1 that keeps its gradient (REINFORCE's logp * (A - beta * (logp - ref)) with "
         "the KL not detached) differentiates to k1 times its own token's score (PART) plus the log-prob times the "
         "score, whose expectation is minus the gradient of each step's entropy: the sum follows no KL objective and "
         "raises the entropy even where pi = ref", FIX_REWARD),
    _row("13e", "logp * k1 as loss, whole sequence: k1 left undetached in a sequence return",
         _loss(E.LOGP_K1, position=Position.SEQUENCE), Objective.OTHER, "KL009",
         "the response's summed log-prob times its summed k1 left with its gradient (REINFORCE's "
         "sum(logp) * (R - beta * sum(logp - ref)) with the KL not detached) differentiates to the sequence's k1 "
         "times its score, unbiased for grad KL(pi || ref), plus the summed log-prob times the score, whose "
         "expectation is minus the gradient of the response's entropy: the sum follows no KL objective and raises "
         "the entropy even where pi = ref", FIX_REWARD),
    _row("14", "k3 as loss + k1 in reward", Config(loss=E.K3, reward=E.K1), Objective.OTHER, "KL006",
         "k1 in the reward is already the whole gradient; the k3 loss adds the per-token forward-KL gradient "
         "on top (REV + PFWD)", FIX_DOUBLE, identity={Target.REV: 1.0, Target.PFWD: 1.0}),
    _row("14", "k2 as loss + k1 in reward, reward-to-go", Config(loss=E.K2, reward=E.K1), Objective.OTHER,
         "KL006", "the k1 reward-to-go already contains the local term; the k2 loss counts it twice "
         "(REV + PART)", FIX_DOUBLE, identity={Target.REV: 1.0, Target.PART: 1.0}),
    _row("15", "k1 left undetached in the advantage (kl-rb, Monte Carlo)",
         Config(loss=E.K1, reward=E.K1, returns=Returns.SEQUENCE), Objective.REV, None,
         "the undetached sequence k1 in the advantage adds a zero-mean pathwise term to the unbiased "
         "whole-sequence score-function term"),
    _row("15", "exact KL left undetached in the advantage (kl-rb, Rao-Blackwellized)",
         Config(loss=E.FULL, reward=E.FULL, returns=Returns.SEQUENCE), Objective.REV, None,
         "the undetached sum of per-step KLs in the advantage gives their local gradient plus the "
         "whole-sequence score-function term: grad KL(pi || ref)"),
    _row("16", "sequence log-ratio D = sum(logp - ref) as loss", _loss(E.K1, position=Position.SEQUENCE),
         Objective.ZERO, "KL001",
         "the summed log-ratio differentiated gives E[score of the sequence] = 0: no regularisation",
         FIX_K1_LOSS),
    _row("17", "0.5 * D^2 of the sequence log-ratio as loss", _loss(E.K2, position=Position.SEQUENCE),
         Objective.REV, None,
         "grad 0.5 D^2 = D * score(y): k1 with the whole-sequence return, unbiased (high variance)"),
    _row("18", "sequence-level k3 (e^-D - 1 + D) as loss", _loss(E.K3, position=Position.SEQUENCE),
         Objective.FWD, "KL002",
         "the sequence-level k3 differentiated gives E[(1 - ref(y)/pi(y)) score(y)] = grad KL(ref || pi), "
         "the forward KL", FIX_K3_LOSS),
    _row("18b", "k3 of the sequence's mean log-ratio (e^-D/L - 1 + D/L) as loss",
         _loss(E.K3, position=Position.SEQUENCE_MEAN), Objective.OTHER, "KL009",
         "k3 of the mean log-ratio D/L differentiated gives E[(1 - e^(-D/L)) score(y) / L]: the forward KL only for "
         "L = 1, never the reverse KL, and a different divergence for each length", FIX_K1_LOSS),
    _row("19", "k1 as loss at the last token only", _loss(E.K1, position=Position.LAST), Objective.OTHER,
         "KL005", "a KL at the final token only matches no KL objective (with EOS, which token is last "
         "depends on its own value)", FIX_ALL_TOKENS, needs_eos=True),
    _row("19", "k2 as loss at the last token only", _loss(E.K2, position=Position.LAST), Objective.OTHER,
         "KL005", "a KL at the final token only matches no KL objective", FIX_ALL_TOKENS),
    _row("19", "k3 as loss at the last token only", _loss(E.K3, position=Position.LAST), Objective.OTHER,
         "KL005", "a KL at the final token only matches no KL objective", FIX_ALL_TOKENS),
    _row("19", "k1 in reward at the last token only", _reward(E.K1, position=Position.LAST),
         Objective.OTHER, "KL005", "a KL reward at the final token only matches no KL objective",
         FIX_ALL_TOKENS),
    _row("20", "k1 in reward, reward-to-go, divided by a constant",
         _reward(E.K1, aggregation=Aggregation.CONSTANT), Objective.REV, None,
         "dividing by a constant only rescales the unbiased gradient (the effective beta changes)"),
    _row("20", "k1 in reward, reward-to-go, token-mean over a large batch",
         _reward(E.K1, aggregation=Aggregation.BATCH_MEAN), Objective.REV, None,
         "a global token-mean over a large batch only rescales the unbiased gradient (by 1/E[L]); "
         "over a small batch it is length-weighted, with a bias of order 1/B"),
    _row("20", "Rao-Blackwellized, divided by a constant",
         Config(loss=E.FULL, reward=E.FULL, returns=Returns.FUTURE, aggregation=Aggregation.CONSTANT),
         Objective.REV, None, "dividing by a constant only rescales the unbiased gradient"),
    _row("21", "k1 in reward, reward-to-go, per-sequence token-mean",
         _reward(E.K1, aggregation=Aggregation.SEQ_MEAN), Objective.OTHER, "KL007",
         "dividing each sequence by its own length weights sequences by 1/L, which changes the expected "
         "direction whenever lengths vary", FIX_AGGREGATION, needs_eos=True),
    _row("21", "Rao-Blackwellized, per-sequence token-mean",
         Config(loss=E.FULL, reward=E.FULL, returns=Returns.FUTURE, aggregation=Aggregation.SEQ_MEAN),
         Objective.OTHER, "KL007",
         "dividing each sequence by its own length weights sequences by 1/L, which changes the expected "
         "direction whenever lengths vary", FIX_AGGREGATION, needs_eos=True),
    _row("22", "off-policy k1 in reward, no importance weights",
         _reward(E.K1, sampling=Sampling.OFF_POLICY), Objective.OTHER, "KL008",
         "samples from an older policy without importance weights estimate the gradient at the wrong "
         "distribution", FIX_OFF_POLICY),
    _row("22", "off-policy k3 as loss, no importance weights", _loss(E.K3, sampling=Sampling.OFF_POLICY),
         Objective.OTHER, "KL008",
         "k3 as a loss on samples from an older policy follows neither the reverse nor the forward KL",
         FIX_OFF_POLICY),
    _row("23", "off-policy k3 as loss, token importance ratio", _loss(E.K3, sampling=Sampling.TOKEN_IS),
         Objective.OTHER, "KL008",
         "a per-token importance ratio corrects the sampled token but not the prefix distribution",
         FIX_OFF_POLICY),
    _row("23", "off-policy k2 as loss, token importance ratio", _loss(E.K2, sampling=Sampling.TOKEN_IS),
         Objective.OTHER, "KL008",
         "a per-token importance ratio corrects the sampled token but not the prefix distribution",
         FIX_OFF_POLICY),
    _row("23", "off-policy k1 in reward, token importance ratio (PPO ratio)",
         _reward(E.K1, sampling=Sampling.TOKEN_IS), Objective.OTHER, "KL008",
         "a per-token importance ratio corrects the sampled token but not the prefix distribution",
         FIX_OFF_POLICY),
    _row("25", "off-policy k1 in reward, per-decision importance weights",
         _reward(E.K1, sampling=Sampling.PER_DECISION_IS), Objective.REV, None,
         "prefix products of importance ratios make the score-function estimate exact off-policy"),
    _row("25", "off-policy Rao-Blackwellized with prefix importance weights",
         Config(loss=E.FULL, reward=E.FULL, returns=Returns.FUTURE, sampling=Sampling.PER_DECISION_IS),
         Objective.REV, None, "prefix importance weights make the Rao-Blackwellized gradient exact off-policy"),
    _row("25", "off-policy k3 loss + k3 reward with per-decision importance weights",
         Config(loss=E.K3, reward=E.K3, sampling=Sampling.PER_DECISION_IS), Objective.REV, None,
         "prefix importance weights make the k3 loss + k3 reward gradient exact off-policy"),
    _row("KL010", "low_var_kl loss + low_var_kl reward (R-C with clamps)",
         Config(loss=E.LOW_VAR_KL, reward=E.LOW_VAR_KL), Objective.OTHER, "KL010",
         "the clamps of low_var_kl cut the gradient of an otherwise unbiased k3 loss + k3 reward "
         "exactly where pi << ref", FIX_UNCLAMPED),
    _row("KL011", "k1 in reward with the wrong sign", _reward(E.K1, sign=-1), Objective.OTHER, "KL011",
         "the expected gradient is -grad KL(pi || ref), which pushes the policy "
         "away from the reference", FIX_SIGN, identity={Target.REV: -1.0}),
    _row("KL011", "k3 loss + k3 reward with the wrong sign", Config(loss=E.K3, reward=E.K3, sign=-1),
         Objective.OTHER, "KL011",
         "the expected gradient is -grad KL(pi || ref)", FIX_SIGN,
         identity={Target.REV: -1.0}),
)


# --- Generic rows: the verdict for configurations the table does not list one by one.

_GENERIC_SIGN = _row("KL011", "KL term with the wrong sign", None, Objective.OTHER, "KL011",
                     "a KL bonus instead of a penalty: the expected gradient points away from the reference", FIX_SIGN)
_GENERIC_LAST = _row("19", "KL at the last token only", None, Objective.OTHER, "KL005",
                     "a KL at the final token only matches no KL objective", FIX_ALL_TOKENS)
_GENERIC_OFF_POLICY = _row("22", "off-policy KL without per-decision importance weights", None, Objective.OTHER,
                           "KL008", "samples from an older policy need prefix importance weights; a per-token "
                           "ratio or none leaves the gradient biased", FIX_OFF_POLICY)
OFF_POLICY_RULE = _GENERIC_OFF_POLICY.rule  # the one rule whose only cause is samples of an older policy
_GENERIC_LENGTH = _row("21", "KL term divided by each sequence's length", None, Objective.OTHER, "KL007",
                       "1/L weights change the expected direction whenever lengths vary", FIX_AGGREGATION)
_GENERIC_DOUBLE = _row("14", "KL loss on top of an unbiased k1 reward", None, Objective.OTHER, "KL006",
                       "the k1 reward already carries the whole gradient of KL(pi || ref); the loss adds its own "
                       "local gradient on top, so the KL is counted twice", FIX_DOUBLE)
_GENERIC_OTHER = _row("-", "unrecognised combination of KL loss and reward", None, Objective.OTHER, "KL009",
                      "this combination of KL loss and reward matches no unbiased configuration", FIX_K1_LOSS)
CLAMPED = _row("KL010", "clamped KL estimate", None, Objective.OTHER,
               "KL010", "the clamp changes the estimate on every token it cuts (where pi and ref differ most, or all "
               "of one sign for a clamp at 0), so the expected gradient is no longer grad KL(pi || ref) there",
               FIX_UNCLAMPED)

# The rules whose defect holds on any sequences, the policy's samples or a dataset's fixed ones: a clamp flattens
# the term's gradient where it cuts, and a bonus pushes away from the reference whatever the tokens.
SAMPLE_FREE_RULES = frozenset({CLAMPED.rule, _GENERIC_SIGN.rule})


def without_gradient(config: Config) -> bool:
    """A detached estimate added to the loss as it is, and nothing differentiated beside it (row 1c)."""
    return config.loss is None and config.reward is not None and config.returns is Returns.NOWHERE


def _normalized(config: Config) -> Config:
    """The returns mode only matters when there is a reward; drop it otherwise. A reward that reaches no score
    adds nothing to a loss beside it, and alone it is the same row whatever its aggregation, position,
    sampling and sign: its gradient is zero."""
    if config.returns is Returns.NOWHERE and config.reward is not None:
        return Config(reward=config.reward, returns=Returns.NOWHERE) if config.loss is None else _with(
            config, reward=None, returns=Returns.TO_GO)
    if config.reward is None and config.returns is not Returns.TO_GO:
        return Config(config.loss, None, Returns.TO_GO, config.aggregation, config.position,
                      config.sampling, config.sign)
    return config


_BY_CONFIG: Mapping[Config, Row] = {row.config: row for row in CATALOG if row.config is not None}
NO_GRADIENT = _BY_CONFIG[Config(reward=E.K1, returns=Returns.NOWHERE)]  # every estimator's, detached into a loss
# row 1, k1 as a loss: its claim, a zero expected gradient that adds noise and no regularisation, also names a term
# no row matches per sample whose exact expected gradient is zero (the k1 loss with the log-probs swapped, ref - logp)
ZERO_GRADIENT = _BY_CONFIG[Config(loss=E.K1)]


def _with(config: Config, **changes: Any) -> Config:
    return _normalized(dataclasses.replace(config, **changes))


def classify(config: Config) -> Row:
    """The catalog row that gives the verdict, rule, explanation and fix for `config`.

    A configuration listed in `CATALOG` returns its own row. Otherwise the aspects are judged in
    order of severity: the sign, the position, the estimator and its placement (on-policy,
    token-sum), then the sampling, then the aggregation; the first wrong one decides.
    """
    config = _normalized(config)
    if config.loss is None and config.reward is None:
        raise ValueError("a KL configuration needs a loss estimator, a reward estimator, or both")
    if config in _BY_CONFIG:
        return _BY_CONFIG[config]
    if without_gradient(config):
        return NO_GRADIENT
    if config.sign < 0:
        if sign_matters(config):
            return _GENERIC_SIGN
        return classify(_with(config, sign=1))
    if config.position is Position.LAST:
        return _GENERIC_LAST
    placement = _BY_CONFIG.get(_with(config, aggregation=Aggregation.SUM, sampling=Sampling.ON_POLICY))
    if placement is None:
        return _placement_fallback(config)
    if placement.rule is not None:
        return placement
    if config.sampling in (Sampling.OFF_POLICY, Sampling.TOKEN_IS):
        return _GENERIC_OFF_POLICY
    if config.aggregation is Aggregation.SEQ_MEAN:
        return _GENERIC_LENGTH
    return placement


def _placement_fallback(config: Config) -> Row:
    """Verdict for an estimator/placement pair the table does not list."""
    if config.reward is None and config.position is Position.ALL:
        return _BY_CONFIG[Config(loss=config.loss)]
    if config.loss not in (None, E.K1) and config.reward is not None:
        reward_alone = _BY_CONFIG.get(_with(config, loss=None))
        if reward_alone is not None and reward_alone.unbiased:
            return _GENERIC_DOUBLE
    if config.loss is None and config.position is Position.ALL:
        same_estimator = _BY_CONFIG.get(Config(reward=config.reward))
        if same_estimator is not None and same_estimator.rule is not None:
            return same_estimator
    return _GENERIC_OTHER


_STRAIGHT_THROUGH = (E.K1_ST, E.K3_ST)


def sign_matters(config: Config) -> bool:
    """Whether the term's sign can turn it towards or away from the reference.

    A k1 loss alone cannot: d/dθ (log pi - log ref) = grad log pi never involves the reference, so
    with either sign it does not regularise (zero in expectation on-policy, kl-math.md section 8 row 1).
    """
    return not (config.loss is E.K1 and config.reward is None)


def clamp_matters(config: Config, clamped: bool) -> bool:
    """Whether a clamp on the term can change its expected gradient: on a reward's value always; a
    straight-through loss (k1+, k3+) takes its gradient from the unclamped k2 and only its value
    from the clamped, detached estimate."""
    return clamped and not (config.reward is None and config.loss in _STRAIGHT_THROUGH)


def defects(config: Config, clamped: bool = False) -> tuple[Row, ...]:
    """Every independent defect of `config`, one row per aspect, in order of severity; () when correct.

    The aspects are judged apart: the sign (a bonus is wrong whatever the estimator), the
    position (the last-token rows judge the estimator there too), the estimator and its placement
    (on-policy, token-sum), the sampling and the aggregation. For each aspect the row of the
    configuration that differs from a correct one only in that aspect decides, the listed one when
    the table has it. A clamp is a defect of its own (KL010: fixing the placement keeps it, dropping it
    keeps a wrong placement), except where the estimator is low_var_kl, whose rows name the clamps.
    Rows are distinct by rule.
    """
    config = _normalized(config)
    if config.loss is None and config.reward is None:
        raise ValueError("a KL configuration needs a loss estimator, a reward estimator, or both")
    if without_gradient(config):
        return (NO_GRADIENT,)
    found: list[Row | None] = []
    if config.sign < 0:
        if sign_matters(config):
            found.append(_listed(config, _GENERIC_SIGN))
        config = _with(config, sign=1)
    if config.position is Position.LAST:
        found.append(_listed(_with(config, aggregation=Aggregation.SUM, sampling=Sampling.ON_POLICY), _GENERIC_LAST))
    else:
        placement = _placement(_with(config, aggregation=Aggregation.SUM, sampling=Sampling.ON_POLICY))
        if placement.rule is not None:
            found.append(placement)
        if clamp_matters(config, clamped) and E.LOW_VAR_KL not in (config.loss, config.reward):
            found.append(CLAMPED)  # low_var_kl's rows already name its clamps
    if config.sampling in (Sampling.OFF_POLICY, Sampling.TOKEN_IS):
        found.append(_listed(_with(config, aggregation=Aggregation.SUM), _GENERIC_OFF_POLICY))
    if config.aggregation is not Aggregation.SUM:
        found.append(_listed(_with(config, sampling=Sampling.ON_POLICY),
                             _GENERIC_LENGTH if config.aggregation is Aggregation.SEQ_MEAN else None))
    distinct: dict[str, Row] = {}
    for row in found:
        if row is not None and row.rule is not None:
            distinct.setdefault(row.rule, row)
    return tuple(distinct.values())


def _listed(config: Config, generic: Row | None) -> Row | None:
    """The table's row for `config`, else the generic row of the aspect that differs.

    A detached reward's whole-sequence return and its reward-to-go have the same expectation (the
    earlier tokens' terms multiply a zero-mean score), so an unlisted whole-sequence form takes the
    row of its reward-to-go twin.
    """
    if config in _BY_CONFIG:
        return _BY_CONFIG[config]
    if config.returns is Returns.SEQUENCE and config.reward is not None:
        return _BY_CONFIG.get(_with(config, returns=Returns.TO_GO), generic)
    return generic


def _placement(config: Config) -> Row:
    """The verdict on the estimator and its placement alone (on-policy, token-sum, right sign)."""
    return _listed(config, None) or _placement_fallback(config)
