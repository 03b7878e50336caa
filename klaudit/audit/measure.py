"""Audit one KL callable in this process: exact expected gradient and per-batch fingerprint.

For each switch value (mode) and placement the user's term becomes a per-sequence surrogate S:

    loss:   S = sum_t f_t m_t   (per-token result, token-sum applied here), f ([B] result), or
            the scalar f evaluated on each sequence alone, for a callable that aggregates itself;
    reward: S = sum_t logp_t m_t sg(sum_{u>=t} f_u m_u)   (reward-to-go; a [B] result is the
            whole-sequence return on every token);
    loss+reward: the sum of both (the same values differentiated and, detached, as a reward-to-go:
            kl-math.md R-C); loss+future: the loss plus the future-only return sum_{u>t} (R-B, R-D);
    advantage: S = sum_t logp_t m_t sg(f_t m_t)   (each token's own value as its advantage, no accumulation:
            the same-token return of slime's on-policy distillation; per-token results only).

The exact audit enumerates every response of tabular policies (3 seeds) and of a tiny causal
transformer, each placed at KL_seq = 1 nat from its reference, and compares E[grad] with the targets of
kl-math.md section 1; the fingerprint names the configuration on one sampled batch. Both are
reported per row; `unbiased` holds when E[grad] is a positive multiple of REV on every policy.
"""

from __future__ import annotations

import dataclasses
import functools
import linecache
import math
import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from klaudit.audit.batch import Batch, required
from klaudit.audit.bind import Binding, Role, defaulted_attributes, only_sampling_policy, set_instance_switches
from klaudit.audit.confine import memory_note
from klaudit.audit.exact import MATCH_ORDER, ExactProblem, cosine, match_objective, positive_multiple, relerr
from klaudit.audit.fingerprint import (
    MATCH_RTOL_FLOAT32,
    MATCH_RTOL_FLOAT64,
    Fingerprinter,
    Match,
    holds_far_from_reference,
    leaf_batches,
    logits_gradient,
    sample_rows,
)
from klaudit.audit.report import ResultRow
from klaudit.catalog import CLAMPED, FIX_K1_LOSS, NO_GRADIENT, ZERO_GRADIENT, Aggregation, Objective, Target
from klaudit.describe import describe

AUDIT_KL = 1.0  # nats between policy and reference: far enough that biased terms show (kl-math.md 12.2)
AUDIT_KL_RTOL = 0.02  # "about 1 nat": a tighter bisection only costs time (seconds on the transformer)
TABULAR_PROBLEMS = 3
DEGENERATE_COS_GAP = 1e-3
STALENESS = 0.3  # scale of the perturbation that makes the behaviour policy of off-policy audits
FINGERPRINT_BATCH = 16
EXTREME_ROWS = 4


class TermError(ValueError):
    """The user's callable failed or returned something unusable; the message says what and where."""


class ModeNotImplemented(Exception):
    """The callable raised NotImplementedError for this switch value."""


class ModeRefused(ModeNotImplemented):
    """An assertion of the callable refused this combination of switch values ("only reverse KL without full
    logits"): skipped like a value not implemented, unless it refuses every one (then it is the callable's error)."""


@dataclass
class Problem:
    """An enumerable policy/reference pair with its reference gradients."""

    name: str
    exact: ExactProblem
    targets: Mapping[Target, torch.Tensor]
    kl: float

    def to(self, device: str) -> Problem:
        """A copy whose policies, enumeration and targets live on `device`."""
        exact = self.exact.to(device)
        return Problem(self.name, exact, {target: value.to(device) for target, value in self.targets.items()},
                       self.kl)


def _distinguishes(targets: Mapping[Target, torch.Tensor]) -> bool:
    """False when two targets are (anti-)parallel, so that matching could not tell them apart.

    A policy placed far out along a saturating direction turns almost deterministic, and then every
    gradient points the same way; such a policy is skipped.
    """
    names = list(MATCH_ORDER)
    return all(abs(cosine(targets[a], targets[b])) < 1 - DEGENERATE_COS_GAP
               for i, a in enumerate(names) for b in names[i + 1:])


@functools.lru_cache(maxsize=8)
def standard_problems(*, off_policy: bool = False, count: int = TABULAR_PROBLEMS,
                      transformer: bool = True, device: str = "cpu") -> tuple[Problem, ...]:
    """`count` tabular policies (V=4 with EOS, T=4; seeds 0, 1, ... skipping degenerate ones) and a
    tiny causal transformer, each at KL_seq = 1 nat from its reference, on `device`. They are placed on
    the CPU (the same policies whatever the device) and copied there. Cached: audits only read them."""
    if torch.device(device) != torch.device("cpu"):
        return tuple(problem.to(device) for problem in standard_problems(
            off_policy=off_policy, count=count, transformer=transformer))
    from klaudit.audit.policies import TabularPolicy, TinyCausalLM, perturbed, place_at_kl

    def problem(name: str, reference, seed: int) -> Problem:
        policy = place_at_kl(reference, AUDIT_KL, seed=seed, rtol=AUDIT_KL_RTOL)
        old = perturbed(policy, STALENESS, seed=seed + 7) if off_policy else None
        exact = ExactProblem(policy, reference, old)
        return Problem(name, exact, exact.targets(), exact.kl_seq())

    problems: list[Problem] = []
    seed = 0
    while len(problems) < count:
        candidate = problem(f"tabular seed {seed}", TabularPolicy.random(4, 4, eos=True, seed=seed), seed)
        if _distinguishes(candidate.targets):
            problems.append(candidate)
        seed += 1
        if seed > 10 * count:
            raise RuntimeError("no non-degenerate tabular policy found at KL_seq = 1 nat")
    if transformer:
        problems.append(problem("tiny transformer", TinyCausalLM(4, 4, seed=0), 0))
    return tuple(problems)


def _row_of(batch: Batch, index: int) -> Batch:
    """Row `index` of every tensor of the batch, as a batch of one."""
    rows: dict[str, Any] = {field.name: None if getattr(batch, field.name) is None else
                            getattr(batch, field.name)[index:index + 1] for field in dataclasses.fields(batch)}
    return Batch(**rows)  # each field a tensor or None, as in `batch`


class Term:
    """The user's callable with its binding and one switch value, called on a Batch.

    `negated`: the callable returns a reward (maximised), so the KL cost audited is its negation.
    """

    def __init__(self, fn: Callable, binding: Binding, mode: Mapping[str, str], name: str, negated: bool = False):
        self.fn = fn
        self.binding = binding
        self.mode = dict(mode)
        self.name = name
        self.negated = negated
        self.dtype = torch.float64

    def rebound(self, binding: Binding) -> Term:
        """The same callable and mode with another binding."""
        return Term(self.fn, binding, self.mode, self.name, self.negated)

    def where(self) -> str:
        mode = ", ".join(f"{key}={value!r}" for key, value in self.mode.items())
        return f"{self.name}({mode})" if mode else self.name

    def __call__(self, batch: Batch) -> torch.Tensor:
        """The result as a tensor [B, T], [B] or [], checked for type, shape and finiteness."""
        args, kwargs = self.binding.arguments_for(batch, self.mode)
        set_instance_switches(self.fn, self.binding, self.mode)
        try:
            result = self.fn(*args, **kwargs)
        except NotImplementedError as error:
            raise ModeNotImplemented(f"{self.where()} raised NotImplementedError: {error}") from error
        except AssertionError as error:
            if self.mode:
                raise ModeRefused(f"{self.where()} raised AssertionError: {error}") from error
            raise TermError(self._failure(error)) from error
        except SystemExit as error:
            raise TermError(f"{self.where()} called sys.exit({error.code!r}) instead of returning its term") from error
        except Exception as error:  # the user's code: every failure becomes one clear line
            raise TermError(self._failure(error)) from error
        if isinstance(result, Mapping) and ENTRY in self.mode:
            result = result.get(self.mode[ENTRY])  # one estimate of a dict of them (see expand_entries)
        if not isinstance(result, torch.Tensor) and hasattr(result, "loss"):
            result = result.loss  # a KLTerm-like result: the differentiable part
        rows, horizon = batch.mask.shape
        if _per_sample(result, rows, horizon):
            result = torch.stack(result)  # one tensor per sequence (slime's lists): [B, T] or [B]
        elif isinstance(result, (tuple, list)) and result and isinstance(result[0], torch.Tensor):
            result = result[0]
        if not isinstance(result, torch.Tensor):
            raise TermError(f"{self.where()} returned {type(result).__name__}, not a torch.Tensor")
        if tuple(result.shape) == (rows * horizon,) and horizon > 1:
            result = result.reshape(rows, horizon)  # per token, flattened (`.view(-1)`) in row order
        if tuple(result.shape) not in ((rows, horizon), (rows,), (), (1,)):
            raise TermError(
                f"{self.where()} returned shape {list(result.shape)}; expected per-token [{rows}, {horizon}], "
                f"per-sequence [{rows}] or a scalar")
        if not result.is_floating_point():
            raise TermError(f"{self.where()} returned {result.dtype} values, not floating point")
        if not bool(torch.isfinite(result.detach()).all()):
            raise TermError(f"{self.where()} returned NaN or inf")
        self.dtype = result.dtype
        result = -result if self.negated else result
        return result.reshape(()) if result.shape == (1,) else result

    def _failure(self, error: Exception) -> str:
        """The line for an exception of the user's code: what it raised, with what check-grad knows of
        the likely cause (its memory limit; the float mask a boolean index cannot take)."""
        raised = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
        if isinstance(error, MemoryError) or "can't allocate memory" in str(error):
            return f"{self.where()} ran out of memory{memory_note()}: {raised}"
        masks = [name for name, role in self.binding.roles.items() if role is Role.MASK]
        if isinstance(error, IndexError) and masks and "tensors used as indices must be" in str(error):
            return (f"{self.where()} indexes with a float tensor as if it were boolean: check-grad passes the mask "
                    f"{' and '.join(masks)} as float 0.0/1.0 values, as trainers multiply by it; index with "
                    f"{masks[0]}.bool() ({raised})")
        return f"{self.where()} raised {raised}"

    @property
    def rtol(self) -> float:
        return MATCH_RTOL_FLOAT64 if self.dtype == torch.float64 else MATCH_RTOL_FLOAT32


def _per_sample(result: object, rows: int, horizon: int) -> bool:
    """Whether a result is a list of one tensor per sequence, each [T] or a scalar (not a tuple such as
    `(loss, metrics)`, whose first item is the term)."""
    return (isinstance(result, list) and len(result) == rows and rows > 0
            and all(isinstance(item, torch.Tensor) and tuple(item.shape) in ((horizon,), ()) for item in result)
            and len({tuple(item.shape) for item in result}) == 1)


def result_kind(term: Term, batch: Batch) -> str:
    """'token', 'sequence' or 'scalar' by the shape of the result on `batch`."""
    return {2: "token", 1: "sequence", 0: "scalar"}[term(batch).dim()]


# The mode key naming the entry of a returned dict that a term audits; no switch parameter is called so
ENTRY = "entry"


def expand_entries(term: Term, batch: Batch) -> list[Term]:
    """One term per estimate in the dict the callable returns (`{"k1": ..., "k3": ...}`, a table of
    estimators a caller picks from by key), else the term itself. An estimate is a floating-point tensor
    with a gradient or one value per row of the batch; a statistic beside them (a length) is left out.
    A call that fails here is reported, or retried with another binding, where the term is first called."""
    if ENTRY in term.binding.roles:
        return [term]
    args, kwargs = term.binding.arguments_for(batch, term.mode)
    set_instance_switches(term.fn, term.binding, term.mode)
    try:
        result = term.fn(*args, **kwargs)
    except (Exception, SystemExit):  # the user's code: its failure is reported by the checked call
        return [term]
    if not isinstance(result, Mapping):
        return [term]
    rows = batch.mask.shape[0]
    keys = [key for key, value in result.items()
            if isinstance(key, str) and isinstance(value, torch.Tensor) and value.is_floating_point()
            and (value.requires_grad or (value.dim() > 0 and value.shape[0] == rows))]
    return [Term(term.fn, term.binding, {**term.mode, ENTRY: key}, term.name, term.negated) for key in keys] or [term]


def first_result_kind(term: Term, batch: Batch) -> tuple[Term, str, str | None]:
    """The result kind of the term's first call, and the term that gave it, with a note when it changed.

    Zeros [B, T] stand for a task reward or advantage, and the mask is 1.0 on response tokens; code that
    wants a per-sequence reward (a score added at the last token, `advantages.unsqueeze(-1)`), a boolean
    mask (`torch.where(mask, ...)`) or the batch's tokens as one vector (`if logps.dim() != 1: raise`) fails
    on them with a RuntimeError or IndexError, or refuses them itself with a ValueError or TypeError (a `raise`
    of its own: a failure of its arithmetic, such as unpacking a shape it did not expect, says nothing of what the
    inputs mean). Then the call is tried again with per-sequence zeros [B], with a boolean mask, with both, and
    with every input flattened to [B*T] (with float and then boolean masks); the first that works is kept.
    Otherwise the first failure is the one reported.
    """
    try:
        return term, result_kind(term, batch), None
    except TermError as error:
        cause = error.__cause__
        if not (isinstance(cause, (RuntimeError, IndexError))
                or isinstance(cause, (ValueError, TypeError)) and _raised_by_the_code(cause)):
            raise
        raised = type(error.__cause__).__name__
        for binding, why in _rebindings(term.binding):
            retried = term.rebound(binding)
            try:
                kind = result_kind(retried, batch)
            except (TermError, ModeNotImplemented):
                continue
            return retried, kind, "; ".join(f"{what} of {term.name}: {how} ({before} raised {raised})"
                                            for what, how, before in why)
        raise error from error.__cause__


def _raised_by_the_code(error: BaseException) -> bool:
    """Whether the line that raised `error` is a `raise` statement of the code (its check of its inputs)."""
    trace = error.__traceback__
    while trace is not None and trace.tb_next is not None:
        trace = trace.tb_next
    if trace is None:
        return False
    return linecache.getline(trace.tb_frame.f_code.co_filename, trace.tb_lineno).lstrip().startswith("raise")


def _rebindings(binding: Binding) -> list[tuple[Binding, list[tuple[str, str, str]]]]:
    """The other bindings `first_result_kind` tries, each with what it changed: (parameters, now, before)."""
    zeros = [(", ".join(binding.zeroed), "per-sequence zeros [B]", "zeros [B, T]")] if (
        binding.zeroed and not binding.sequence_zeros) else []
    masks = [(", ".join(binding.masks), "a boolean mask", "a float mask")] if (
        binding.masks and not binding.bool_masks) else []
    tries = []
    if zeros:
        tries.append((dataclasses.replace(binding, sequence_zeros=True), zeros))
    if masks:
        tries.append((dataclasses.replace(binding, bool_masks=True), masks))
    if zeros and masks:
        tries.append((dataclasses.replace(binding, sequence_zeros=True, bool_masks=True), zeros + masks))
    if not binding.flat_tokens:
        flat = [("the per-token inputs", "one token vector [B*T]", "[B, T]")]
        tries.append((dataclasses.replace(binding, flat_tokens=True), flat))
        if masks:
            tries.append((dataclasses.replace(binding, flat_tokens=True, bool_masks=True), flat + masks))
    return tries


def _reward_to_go(values: torch.Tensor) -> torch.Tensor:
    return values.flip(-1).cumsum(-1).flip(-1)


def surrogate(term: Term, kind: str, placement: str, scalar_weight: str | None = None):
    """Per-sequence surrogate S(batch) [N] of the term in the placement (see the module docstring)."""

    def per_sequence(batch: Batch) -> torch.Tensor:
        if kind == "scalar":
            values = torch.stack([term(_row_of(batch, n)) for n in range(batch.mask.shape[0])])
            return values * batch.lengths if scalar_weight == "batch-token-mean" else values
        values = term(batch)
        loss = (values * batch.mask).sum(-1) if kind == "token" else values
        if placement == "loss":
            return loss
        rewards = (values * batch.mask).detach() if kind == "token" else values.detach().unsqueeze(-1)
        coefficient = _reward_to_go(rewards) if kind == "token" else rewards.expand_as(batch.mask)
        if placement == "advantage":
            coefficient = rewards
        if placement == "loss+future":
            coefficient = coefficient - rewards
        reward = (batch.logprobs * batch.mask * coefficient).sum(-1)
        return reward if placement in ("reward", "advantage") else loss + reward

    return per_sequence


def scalar_aggregation(term: Term, batch_factory: Callable[[], Batch]) -> str:
    """How a scalar term combines sequences, from its gradient on a batch against each row alone.

    'mean' when the batch result is c * sum_n f(row n) (a mean or sum of per-sequence values),
    'batch-token-mean' when row n enters with weight proportional to its length L_n (a division by
    the batch's token count), else 'other'.
    """
    whole = logits_gradient(term, batch_factory)
    alone = logits_gradient(lambda b: functools.reduce(operator.add, (term(_row_of(b, n)) for n in range(b.mask.shape[0]))),
                            batch_factory)
    lengths = batch_factory().lengths.to(torch.float64)
    ratios = []
    for n in range(whole.shape[0]):
        own = alone[n].flatten()
        squared = torch.dot(own, own).item()
        if squared == 0.0:
            continue
        factor = torch.dot(whole[n].flatten(), own).item() / squared
        if relerr(whole[n].flatten(), factor * own) > term.rtol:
            return "other"
        ratios.append((factor, lengths[n].item()))
    if not ratios:
        return "other"
    factors = torch.tensor([f for f, _ in ratios])
    per_length = torch.tensor([f / length for f, length in ratios])
    if (factors - factors[0]).abs().max() <= term.rtol * abs(factors[0]):
        return "mean"
    if (per_length - per_length[0]).abs().max() <= term.rtol * abs(per_length[0]):
        return "batch-token-mean"
    return "other"


def _describe_aggregation(kind: str, placement: str, scalar_weight: str | None, negated: bool = False) -> str:
    if kind == "token":
        text = "token-sum per sequence (applied by klaudit)"
    elif kind == "sequence":
        text = "per-sequence values" + (", whole-sequence return" if "reward" in placement else "")
    else:
        text = {"mean": "the callable's own mean over sequences",
                "batch-token-mean": "the callable's own token-mean over the batch, audited for a large batch "
                                    "(weight 1/E[L]); a small batch adds a length bias of order 1/B (kl-math.md "
                                    "section 5, row 21)",
                }.get(scalar_weight or "", "the callable's own aggregation, audited per sequence")
    return text + ("; result negated: a reward" if negated else "")


def fingerprint_batch(problem: Problem, size: int, seed: int) -> Callable[[], Batch]:
    """One batch of responses of the problem's policy (behaviour policy off-policy) for the fingerprint.

    `size` responses are sampled, with at least two different lengths so that per-sequence length
    weights are visible; EXTREME_ROWS more are the responses holding the most negative and the most
    positive log-ratios of the whole enumeration, so that a clamp which acts anywhere in the exact
    audit of this policy also acts on the fingerprint batch (it tells k3 from a clamped k3).
    """
    exact = problem.exact
    with torch.no_grad():
        full = exact.batch()
        sampling = full.old_logprobs if full.old_logprobs is not None else full.logprobs
        probabilities = (sampling * full.mask).sum(-1).exp()
        for attempt in range(16):
            rows = sample_rows(probabilities, size, seed + attempt).to(exact.device)
            if exact.lengths[rows].unique().numel() > 1:
                break
        log_ratio = (full.logprobs - full.ref_logprobs) * full.mask
        lowest = log_ratio.min(-1).values.argsort()[:EXTREME_ROWS // 2]
        highest = log_ratio.max(-1).values.argsort(descending=True)[:EXTREME_ROWS // 2]
        rows = torch.cat([rows, lowest, highest])
        logits, ref_logits = required(full.logits, "logits")[rows], exact.ref_logits[rows]
        old_logprobs = None if full.old_logprobs is None else full.old_logprobs[rows]
    return leaf_batches(exact.tokens[rows], exact.mask[rows], logits, ref_logits, old_logprobs)


def audit(fn: Callable, binding: Binding, *, name: str, placements: Sequence[str] | None = None,
          problems: list[Problem] | None = None, batch: Callable[[], Batch] | None = None,
          progress: Callable[[str], None] = lambda message: None,
          also: Callable[[], Sequence[str]] = tuple, device: str = "cpu") -> tuple[list[ResultRow], list[str]]:
    """Rows for every (mode, placement) of `fn`, and notes (switch values that are not implemented).

    `placements` None: a scalar result or a function named like a loss is audited as a loss, any
    other result both as a loss and as a detached reward with reward-to-go. A function named like a
    reward (`compute_rewards`) returns a reward to be maximised, in which a KL penalty enters with a
    minus sign: its negated result is the KL cost, audited as a reward. `also()`, asked once those
    rows are done, names more placements to audit (the ones the surrounding code uses, which the
    parent process finds meanwhile); those a result's shape does not allow are left out. TermError on
    bad results. `device`: where the standard policies, and so every tensor the callable sees, live (a
    given `batch` or `problems` stay where they are).
    """
    threads = torch.get_num_threads()
    # the tabular policies' tensors are tiny, and a model's batch is compared in the row basis (a few passes over
    # its [N, T, V] logits): more threads only contend for the CPU, ten times slower on a loaded 2-core machine
    torch.set_num_threads(1)
    try:
        return _audit(fn, binding, name, placements, problems, batch, progress, also, device)
    finally:
        torch.set_num_threads(threads)


class Plan(NamedTuple):
    """One switch value of a term: its result kind, the placements to audit, a scalar's aggregation."""

    term: Term
    kind: str
    placements: list[str]
    scalar_weight: str | None


def plan_mode(term: Term, kind: str, placements: Sequence[str] | None, reward_function: bool,
              batch_factory: Callable[[], Batch], notes: list[str]) -> Plan:
    """The plan of one mode whose result kind is known: TermError when the result does not depend on the
    policy, or cannot take a placement asked for."""
    _require_dependence(term, batch_factory)
    chosen = _placements_for(term, kind, placements, reward_function, batch_factory, notes)
    return Plan(term, kind, chosen, scalar_aggregation(term, batch_factory) if kind == "scalar" else None)


def _allowed(kind: str, placement: str) -> bool:
    """A scalar is only a loss; per-sequence values have no future-only return and no token of their own."""
    return placement == "loss" if kind == "scalar" else not (
        kind == "sequence" and placement in ("loss+future", "advantage"))


def _audit(fn, binding, name, placements, problems, batch, progress, also, device):
    """The body of `audit`."""
    from klaudit.lint.roles import is_reward_function

    reward_function = is_reward_function(getattr(fn, "__name__", ""))
    first = problems[0] if problems else standard_problems(off_policy=binding.off_policy, count=1,
                                                            transformer=False, device=device)[0]
    batch_factory = batch or fingerprint_batch(first, FINGERPRINT_BATCH, seed=0)
    notes: list[str] = []
    if binding.current_old and only_sampling_policy(binding.roles.values()):
        notes.append(f"{', '.join(binding.old)} of {name}: the only log-probs of the policy it takes are the sampling "
                     f"policy's, as at the rollout: audited as the policy's own, detached")
    if reward_function:
        notes.append(f"{name} is named like a reward function: its result is a reward to be maximised, so its "
                     f"negation is audited as the KL cost, in the reward")
    plans = []  # every mode is checked on the cheap batch before the expensive policies are built
    refused: list[Exception] = []  # the switch values whose code refused or failed
    for mode in binding.modes():
        for entry in expand_entries(Term(fn, binding, mode, name, negated=reward_function), batch_factory()):
            term = entry.rebound(binding)  # with the binding the first call settled
            try:
                if plans:
                    kind = result_kind(term, batch_factory())
                else:  # the first call settles the binding of zeroed and old inputs for every mode
                    term, kind, note = first_result_kind(term, batch_factory())
                    notes += [note] if note else []
                    if binding.off_policy and batch is None and not _depends_on_old(term, batch_factory()):
                        term = term.rebound(dataclasses.replace(term.binding, current_old=True))
                        batch_factory = fingerprint_batch(problems[0] if problems else standard_problems(
                            count=1, transformer=False, device=device)[0], FINGERPRINT_BATCH, seed=0)
                        notes.append(_on_policy_note(term, name))
                    binding = term.binding
            except ModeNotImplemented as skipped:
                notes.append(f"skipped: {skipped}")
                refused += [skipped] if isinstance(skipped, ModeRefused) else []
                continue
            except TermError as failed:  # one switch value's code fails (needs an input only it reads): the rest run
                if not binding.switches:
                    raise
                notes.append(f"skipped: {failed}")
                refused.append(failed)
                continue
            plans.append(plan_mode(term, kind, placements, reward_function, batch_factory, notes))
    if refused and not plans:
        raise TermError(str(refused[0]))  # it fails at every switch value: no configuration of it runs
    problems = problems or list(standard_problems(off_policy=binding.off_policy, device=device))
    fingerprinter = Fingerprinter(batch_factory, off_policy=binding.off_policy)

    def audit_rows(term, kind, placements_here, scalar_weight) -> list[ResultRow]:
        audited = []
        for placement in placements_here:
            progress(f"{term.where()} as {placement}")
            audited.append(_audit_row(term, kind, placement, scalar_weight, problems, fingerprinter, batch_factory))
        return audited

    rows: list[ResultRow] = []
    for term, kind, chosen, scalar_weight in plans:
        rows += audit_rows(term, kind, chosen, scalar_weight)
    extra = [placement for placement in also() if placement not in {row.placement for row in rows}]
    for term, kind, _chosen, scalar_weight in plans:
        usable = [placement for placement in extra if _allowed(kind, placement)
                  and (placement in ("reward", "advantage") or term(batch_factory()).requires_grad)]
        rows += audit_rows(term, kind, usable, scalar_weight)
    mode_order = {tuple(term.mode.items()): index for index, (term, *_) in enumerate(plans)}
    rows.sort(key=lambda row: mode_order[tuple(row.mode.items())])
    if binding.unset:
        notes.append(f"{', '.join(dict.fromkeys(binding.unset))} of {name}: read as None, a setting no KL switch "
                     f"selects (off); bind the parameter with --bind to give it")
    defaulted = defaulted_attributes(fn)
    if defaulted:
        notes.append(f"{', '.join('self.' + attribute for attribute in defaulted)} of {name}: set to 1.0 (a KL "
                     f"coefficient read on an instance whose __init__ did not run)")
    return rows, notes


def _placements_for(term: Term, kind: str, placements: Sequence[str] | None, reward_function: bool,
                    batch_factory: Callable[[], Batch], notes: list[str]) -> list[str]:
    """The placements to audit a mode in: the ones asked for, else by the function's name and result
    (a loss function or scalar as a loss, a reward function as a reward, a detached result as a
    reward, anything else both ways). TermError for a placement the result cannot take."""
    from klaudit.lint.roles import is_loss_function

    if placements:
        chosen = list(placements)
    elif reward_function:
        chosen = ["reward"]
    else:
        loss_only = kind == "scalar" or is_loss_function(getattr(term.fn, "__name__", ""))
        chosen = ["loss"] if loss_only else ["loss", "reward"]
    if not all(_allowed(kind, placement) for placement in chosen):
        what = "a scalar: it cannot be audited as a per-token reward" if kind == "scalar" else (
            "per-sequence values: they have no future-only return and no token of their own")
        raise TermError(f"{term.where()} returns {what}")
    detached = not term(batch_factory()).requires_grad
    if detached and not placements and kind != "scalar" and chosen != ["reward"]:
        notes.append(f"{term.where()} returns a detached result: audited as a reward only")
        return ["reward"]  # a detached helper (e.g. under no_grad) can only be a reward
    return chosen


def _on_policy_note(term: Term, name: str) -> str:
    zeroed = term.binding.zeroed
    return (f"{', '.join(term.binding.old)} of {name} do not change its result"
            f"{' with ' + ', '.join(zeroed) + ' zeroed' if zeroed else ''}: audited on-policy, with the policy's "
            f"own detached log-probs as old log-probs (on samples of an older policy kl-math.md row 22 applies)")


def _seeded(draw: Callable, like: torch.Tensor, seed: int) -> torch.Tensor:
    """`draw` (torch.rand or torch.randn) shaped and typed like `like`, on its device: drawn on the CPU,
    so that every device sees the same numbers. Shared between calls (a real vocabulary's logits take
    5M draws): read it, never write to it."""
    return _seeded_draw(draw, like.shape, like.dtype, like.device, seed)


@functools.lru_cache(maxsize=4)
def _seeded_draw(draw: Callable, shape: torch.Size, dtype: torch.dtype, device: torch.device, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return draw(shape, generator=generator, dtype=dtype).to(device)


def _depends_on_old(term: Term, batch: Batch) -> bool:
    """Whether the result changes when the old log-probs change."""
    old_logprobs = required(batch.old_logprobs, "old_logprobs")
    shifted = dataclasses.replace(batch, old_logprobs=old_logprobs - 0.25 * _seeded(torch.rand, old_logprobs, 2))
    with torch.no_grad():
        return not torch.equal(term(batch).detach(), term(shifted).detach())


def _require_dependence(term: Term, batch_factory: Callable[[], Batch]) -> None:
    """TermError when the result does not change when the policy log-probs and logits change."""
    batch = batch_factory()
    logits = required(batch.logits, "logits")
    shifted = dataclasses.replace(batch, logprobs=batch.logprobs.detach() - 0.25 * _seeded(torch.rand, batch.logprobs, 1),
                                  logits=logits.detach() + _seeded(torch.randn, logits, 1))
    with torch.no_grad():
        if torch.equal(term(batch).detach(), term(shifted).detach()):
            raise TermError(f"the result of {term.where()} does not depend on the policy log-probs: "
                            f"no gradient flows, this KL term does nothing")


def _audit_row(term: Term, kind: str, placement: str, scalar_weight: str | None, problems: list[Problem],
               fingerprinter: Fingerprinter, batch_factory: Callable[[], Batch]) -> ResultRow:
    per_sequence = surrogate(term, kind, placement, scalar_weight)
    aggregation = Aggregation.BATCH_MEAN if scalar_weight == "batch-token-mean" else Aggregation.SUM
    off_policy = fingerprinter.off_policy
    if not problems:
        raise ValueError("an audit row needs at least one problem to enumerate")
    objectives, unbiased, gradients = [], True, []
    for problem in problems:
        gradient = problem.exact.expected_gradient(per_sequence, aggregation=aggregation, off_policy=off_policy)
        gradients.append(gradient)
        # a term computed partly in float32 leaves ~1e-8 of rounding where the exact answer is 0
        objectives.append(match_objective(gradient, problem.targets, rtol=term.rtol, zero_rtol=term.rtol,
                                          proportional=True))
        unbiased = unbiased and positive_multiple(gradient, problem.targets[Target.REV], term.rtol) is not None
    problem, gradient = problems[0], gradients[0]
    objective = objectives[0] if len(set(objectives)) == 1 else Objective.OTHER
    value = problem.exact.expected_value(value_per_sequence(term, kind, scalar_weight), off_policy=off_policy)

    def user_objective(batch: Batch) -> torch.Tensor:
        values = per_sequence(batch)
        return values.sum()

    configuration, rule, fix, unbiased, fingerprint_objective, same_gradient = _named(
        user_objective, fingerprinter, rtol=term.rtol, aggregation=aggregation, unbiased=unbiased, placement=placement)
    if rule is None and fingerprint_objective is None and objective is Objective.ZERO:
        rule, fix = ZERO_GRADIENT.rule, ZERO_GRADIENT.fix  # no row's per-sample gradient, but none in expectation
    cos = cosine(gradient, problem.targets[Target.REV])
    return ResultRow(
        target=term.name, mode=dict(term.mode), placement=placement, configuration=configuration,
        objective=objective.value, unbiased=unbiased,
        # A zero expected gradient has no direction: its cosine would be rounding noise.
        cos_rev=None if math.isnan(cos) or objective is Objective.ZERO else cos,
        rel_err_rev=relerr(gradient, problem.targets[Target.REV]),
        value_bias=value - problem.kl, rule=rule, fix=fix or "",
        aggregation=_describe_aggregation(kind, placement, scalar_weight, term.negated),
        fingerprint_objective=fingerprint_objective, same_gradient_as=same_gradient,
        per_policy={p.name: o.value for p, o in zip(problems, objectives)},
    )


def _named(objective: Callable[[Batch], torch.Tensor], fingerprinter: Fingerprinter, *, rtol: float,
           aggregation: Aggregation, unbiased: bool,
           placement: str = "") -> tuple[str, str | None, str, bool, str | None, list[str]]:
    """The catalog's name for a term: configuration, rule, fix, verdict (a clamp that acts only far from the
    reference makes a right row wrong), the fingerprint's objective and the configurations with its gradient."""
    if not objective(fingerprinter.batch_factory()).requires_grad:  # nothing of it reaches the policy: row 1c
        return NO_GRADIENT.label, NO_GRADIENT.rule, NO_GRADIENT.fix, unbiased, NO_GRADIENT.objective.value, []
    match, clamped = identify_clamped(objective, fingerprinter, rtol=rtol, aggregation=aggregation, placement=placement)
    if match is None:
        return ("unrecognised (no catalog configuration matches per sample)", None, "" if unbiased else FIX_K1_LOSS,
                unbiased, None, [])
    rule, fix = match.row.rule, match.row.fix
    if clamped and rule is None:
        rule, fix, unbiased = CLAMPED.rule, CLAMPED.fix, False  # right only where pi stays near ref
    # a clamp that acts on the fingerprint batch acts on the audited policies: no row's objective holds
    fingerprint_objective = Objective.OTHER.value if clamped == "near" else match.objective.value
    return match.description, rule, fix, unbiased, fingerprint_objective, [describe(config) for config in match.twins]


def identify_clamped(objective: Callable[[Batch], torch.Tensor], fingerprinter: Fingerprinter, *, rtol: float,
                     aggregation: Aggregation, placement: str = "") -> tuple[Match | None, str | None]:
    """The catalog configuration of a term, and where a clamp changes it: "far" when the term has that
    configuration's per-sample gradient on the fingerprint batch but not far from the reference (the
    clamp acts beyond the audited policies), "near" when it has it only on the near batch (the clamp
    acts on the fingerprint batch), None when the term is that configuration everywhere probed."""
    match = fingerprinter.identify(objective, rtol=rtol, aggregation=aggregation, placement=placement)
    if match is not None:
        far = match.row.rule is None and not holds_far_from_reference(objective, match, fingerprinter, rtol=rtol)
        return match, "far" if far else None
    if fingerprinter.off_policy:
        return None, None
    match = fingerprinter.near().identify(objective, rtol=rtol, aggregation=aggregation, placement=placement)
    return match, "near" if match is not None else None


def value_per_sequence(term: Term, kind: str, scalar_weight: str | None) -> Callable[[Batch], torch.Tensor]:
    """The term's value per sequence: token-sum, [B] values, or the scalar on each sequence alone."""

    def value(batch: Batch) -> torch.Tensor:
        if kind == "scalar":
            values = torch.stack([term(_row_of(batch, n)) for n in range(batch.mask.shape[0])])
            return values * batch.lengths if scalar_weight == "batch-token-mean" else values
        values = term(batch)
        return (values * batch.mask).sum(-1) if kind == "token" else values

    return value
