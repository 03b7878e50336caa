"""The audit of one real call of a KL function: which catalog configuration its gradient is, on these tensors.

The call's own tensors are copied (detached, float64, on the CPU by default: a few sequences, where a GPU's
kernel launches and synchronisations would cost more than the arithmetic; the first `rows` sequences,
every position) and fed again to the function, now with a gradient: the policy log-probs become the log-probs
of a two-token vocabulary whose first logit is log p and whose second is log(1 - p), so that
log_softmax gives back exactly the log-probs of the call and check-grad's fingerprint
(klaudit.audit.fingerprint) compares the function's per-sample gradient with every catalog
configuration's on this batch. An estimator of the log-probs has the same gradient structure whatever
the vocabulary, so the match is exact to rounding and names the configuration with no model and no
sampling (kl-math.md section 12.1). The verdict and the words are the catalog's and the lint's
(`klaudit.catalog.defects`, `klaudit.describe.describe`).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from klaudit.audit.batch import Batch
from klaudit.audit.bind import Binding, Role, role_from_name
from klaudit.audit.fingerprint import Fingerprinter, leaf_batches
from klaudit.audit.measure import Term, identify_clamped, result_kind, scalar_aggregation, surrogate
from klaudit.catalog import Aggregation, Config, Row, defects, scaled_fix
from klaudit.describe import describe
from klaudit.lint.roles import is_loss_function, is_reward_function

DEFAULT_ROWS = 8  # sequences of the batch the audit copies: the per-sample identity holds on any of them
PLACEMENTS = ("auto", "loss", "reward", "loss+reward", "loss+future", "advantage")
_FED = (Role.LOGPROBS, Role.REF_LOGPROBS, Role.OLD_LOGPROBS, Role.MASK, Role.LOG_RATIO)
_UNSUPPORTED = {Role.LOGITS: "the policy logits", Role.REF_LOGITS: "the reference logits",
                Role.TOKENS: "the sampled token ids"}
_SAME_POLICY_ATOL = 1e-6  # old log-probs this close to the policy's: the step is on-policy


class NotAuditable(ValueError):
    """This call cannot be audited (what it lacks is the message); the training is not affected."""


@dataclass(frozen=True)
class Verdict:
    """What one audited call's KL term is: its configuration and every defect the catalog finds in it."""

    where: str  # the function and its switch values: kl_penalty(kl_penalty='low_var_kl')
    placement: str
    config: Config | None  # None: no catalog configuration has this per-sample gradient
    defects: tuple[Row, ...]
    same_gradient_as: tuple[str, ...] = ()
    framework_fixes: Mapping[str, str] = field(default_factory=dict)  # rule -> a framework's own fix (a flag)

    @property
    def configuration(self) -> str:
        return describe(self.config) if self.config is not None else "unrecognised configuration"

    @property
    def unbiased(self) -> bool | None:
        """True: a positive multiple of grad KL(pi || ref); False: biased; None: not recognised."""
        return None if self.config is None else not self.defects

    def with_framework_fixes(self, fixes: Mapping[str, str]) -> Verdict:
        """The verdict with a framework's own fix (a flag change) for the rules it has one for."""
        return dataclasses.replace(self, framework_fixes=dict(fixes))

    def fixes(self) -> list[str]:
        """The fix of each defect: the framework's, else the catalog's at the KL scale of the code it replaces."""
        aggregation = self.config.aggregation if self.config is not None else Aggregation.SUM
        found = [self.framework_fixes.get(row.rule or "") or scaled_fix(row.fix, aggregation) or ""
                 for row in self.defects]
        return list(dict.fromkeys(fix for fix in found if fix))

    def as_record(self) -> dict:
        """The JSON-lines record (the words of `klaudit lint` and `check-grad`)."""
        return {"function": self.where, "placement": self.placement, "configuration": self.configuration,
                "unbiased": self.unbiased, "rules": [row.rule for row in self.defects],
                "explanations": [row.explanation for row in self.defects], "fixes": self.fixes(),
                "same_gradient_as": list(self.same_gradient_as)}

    def lines(self) -> list[str]:
        """The report: one line per defect, as the lint writes a finding, then the fix."""
        head = f"{self.where} as {self.placement}"
        if self.config is None:
            return [f"{head}: no catalog configuration has this per-sample gradient; audit it with "
                    f"`klaudit check-grad`, which measures its exact expected gradient"]
        if not self.defects:
            return [f"{head}: {self.configuration}: unbiased"]
        found = [f"{head}: {row.rule} {self.configuration}: {row.explanation}" for row in self.defects]
        return found + [f"  fix: {fix}" for fix in self.fixes()]


def _pseudo_logits(logprobs: torch.Tensor) -> torch.Tensor:
    """[..., 2] logits whose log_softmax is (logprobs, log(1 - exp(logprobs))): token 0 has the given log-prob."""
    bounded = logprobs.clamp(min=-1e4, max=-1e-9)  # log 0 and log 1 have no two-token logits
    return torch.stack([bounded, torch.log(-torch.expm1(bounded))], dim=-1)


def _copied(value: torch.Tensor, rows: int, device: str | None) -> torch.Tensor:
    """The first `rows` sequences of `value`, detached, in float64 on `device` (None: its own)."""
    with torch.inference_mode(False):
        return value[:rows].detach().to(device=device or value.device, dtype=torch.float64, copy=True)


def _policy_and_sequences(roles: Mapping[str, Role], values: Mapping[str, Any]) -> torch.Tensor:
    for role in (Role.LOGPROBS, Role.LOG_RATIO):
        for name, given in roles.items():
            if given is role and isinstance(values.get(name), torch.Tensor):
                return values[name]
    raise NotAuditable("no argument holds the policy log-probs: name it with args={'PARAM': 'logprobs'}")


def audit_call(fn: Callable, args: tuple, kwargs: Mapping[str, Any], *, name: str, placement: str = "auto",
               aggregation: Aggregation = Aggregation.SUM, overrides: Mapping[str, Role] | None = None,
               rows: int = DEFAULT_ROWS, result: Any = None, device: str | None = "cpu") -> Verdict:
    """The verdict on the KL term `fn(*args, **kwargs)` computes, from copies of the call's tensors.

    `placement` says how the training uses the result ("auto": a function named like a loss, or a scalar
    result, is a loss; one named like a reward is a reward whose negation is the KL cost; otherwise a
    result that carries a gradient is a loss and a detached one a reward). `aggregation`: how the caller
    reduces a per-token result (a verl loss_agg_mode, say). `result` is what the real call returned, to
    read its gradient and shape without calling again. `device`: where the copies of the call's tensors live
    and the function runs again (None: each tensor's own device). NotAuditable when the call cannot be audited.
    """
    try:
        bound = inspect.signature(fn).bind(*args, **kwargs)
    except (TypeError, ValueError) as error:
        raise NotAuditable(f"cannot read the arguments of {name}: {error}") from None
    bound.apply_defaults()
    values = dict(bound.arguments)
    roles = _roles(fn, values, overrides or {})
    policy = _policy_and_sequences(roles, values)
    if policy.dim() != 2:
        raise NotAuditable(f"the policy log-probs of {name} have shape {list(policy.shape)}, not [B, T]")
    sequences = policy.shape[0]
    rows = max(1, min(rows, sequences))
    batch_factory, current_old, off_policy = _batch(roles, values, rows, device)
    fed = {param: role for param, role in roles.items()
           if role in _FED or role in (Role.ZEROS, Role.COEF, Role.OFF, Role.NONE)}
    if current_old:
        fed = {param: role for param, role in fed.items() if role is not Role.OLD_LOGPROBS}
    switches: dict[str, Any] = {param: value for param, value in values.items()
                                if param not in fed and isinstance(value, (str, bool))}
    actual = {param: _sliced(value, sequences, rows, device) for param, value in values.items()
              if param not in fed and param not in switches}
    kinds = {param.name: param.kind for param in inspect.signature(fn).parameters.values()}
    positional = [param for param in fed if kinds.get(param) is inspect.Parameter.POSITIONAL_ONLY]
    if positional or any(kinds.get(param) is inspect.Parameter.POSITIONAL_ONLY for param in {**actual, **switches}):
        raise NotAuditable(f"{name} has positional-only parameters, which the audit cannot feed")
    binding = Binding({**fed, **{param: Role.SWITCH for param in switches}},
                      {param: (value,) for param, value in switches.items()})  # bool flags pass as themselves
    partial = _with_arguments(fn, actual)
    reward_named = is_reward_function(getattr(fn, "__name__", ""))
    term = Term(partial, binding, switches, name, negated=reward_named)
    kind = result_kind(term, batch_factory())
    chosen = _placement(fn, placement, kind, result, reward_named)
    scalar_weight = scalar_aggregation(term, batch_factory) if kind == "scalar" else None
    per_sequence = surrogate(term, kind, chosen, scalar_weight)
    fingerprinter = Fingerprinter(batch_factory, off_policy=off_policy)
    if kind == "scalar":  # the function aggregates itself: check-grad's reading of how
        told = Aggregation.BATCH_MEAN if scalar_weight == "batch-token-mean" else Aggregation.SUM
    else:
        told = aggregation if aggregation is not Aggregation.SEQ_MEAN else Aggregation.SUM
    match, clamped = identify_clamped(lambda b: per_sequence(b).sum(), fingerprinter, rtol=term.rtol,
                                      aggregation=told, placement=chosen)
    if match is None:
        return Verdict(term.where(), chosen, None, ())
    config = match.config
    if kind == "token" and aggregation is Aggregation.SEQ_MEAN and config.aggregation is Aggregation.SUM:
        config = dataclasses.replace(config, aggregation=Aggregation.SEQ_MEAN)
    return Verdict(term.where(), chosen, config, defects(config, clamped=clamped is not None),
                   tuple(describe(twin) for twin in match.twins))


def _roles(fn: Callable, values: Mapping[str, Any], overrides: Mapping[str, Role]) -> dict[str, Role]:
    """The role of each argument by override, then by name (klaudit's naming table); None values are None."""
    roles: dict[str, Role] = {}
    for param, value in values.items():
        role = overrides.get(param) or role_from_name(param)
        if role in _UNSUPPORTED and isinstance(value, torch.Tensor):
            raise NotAuditable(f"{getattr(fn, '__name__', fn)} takes {_UNSUPPORTED[role]} ({param}); the watch "
                               f"audits KL functions of log-probs: run `klaudit check-grad` on it instead")
        if value is None and role is not None:
            role = Role.NONE
        elif role in _FED and not isinstance(value, torch.Tensor):
            role = None  # a name that sounds like a tensor but holds something else: passed as it is
        if role is not None:
            roles[param] = role
    return roles


def _batch(roles: Mapping[str, Role], values: Mapping[str, Any], rows: int,
           device: str | None) -> tuple[Callable[[], Batch], bool, bool]:
    """Fresh leaf batches of copies of the call's tensors (each fingerprint gradient needs a graph of its own),
    whether the old log-probs are the policy's own, and whether the batch is off-policy."""
    def copy_of(role: Role) -> torch.Tensor | None:
        return next((_copied(values[param], rows, device) for param, given in roles.items()
                     if given is role and isinstance(values.get(param), torch.Tensor)), None)

    logprobs = copy_of(Role.LOGPROBS)
    ref = copy_of(Role.REF_LOGPROBS)
    ratio = copy_of(Role.LOG_RATIO)
    if logprobs is None:  # only a log-ratio is given: any reference with this ratio has the same gradients
        if ratio is None:
            raise NotAuditable("no argument holds the policy log-probs: name it with args={'PARAM': 'logprobs'}")
        logprobs = ratio - torch.logsumexp(torch.stack([ratio, torch.zeros_like(ratio)]), 0)
        ref = logprobs - ratio
    elif ref is None:
        ref = logprobs - ratio if ratio is not None else torch.full_like(logprobs, -1.0)
    mask = copy_of(Role.MASK)
    mask = torch.ones_like(logprobs) if mask is None else (mask != 0).to(torch.float64)
    old = copy_of(Role.OLD_LOGPROBS)
    current_old = old is not None and bool(((old - logprobs).abs() * mask).max() <= _SAME_POLICY_ATOL)
    tokens = torch.zeros(logprobs.shape, dtype=torch.long, device=logprobs.device)
    logits, ref_logits = _pseudo_logits(logprobs), _pseudo_logits(ref)
    behaviour = None if old is None or current_old else old
    return leaf_batches(tokens, mask, logits, ref_logits, behaviour), current_old, behaviour is not None


def _sliced(value: Any, sequences: int, rows: int, device: str | None) -> Any:
    """An argument the audit passes as it was: a tensor is detached and copied to `device` (None: its own), cut
    to `rows` when it has one row per sequence."""
    if not isinstance(value, torch.Tensor):
        return value
    with torch.inference_mode(False):
        kept = value[:rows] if value.dim() >= 1 and value.shape[0] == sequences else value
        return kept.detach().to(device=device or value.device, copy=True)


def _with_arguments(fn: Callable, fixed: Mapping[str, Any]) -> Callable:
    """`fn` with the arguments the audit does not feed fixed to the call's values, its name kept."""
    if not fixed:
        return fn

    def call(*args, **kwargs):
        return fn(*args, **{**fixed, **kwargs})

    call.__name__ = getattr(fn, "__name__", "kl")
    call.__qualname__ = getattr(fn, "__qualname__", call.__name__)
    return call


def _placement(fn: Callable, placement: str, kind: str, result: Any, reward_named: bool) -> str:
    """The placement to audit: the one given, else from the name, the result's shape and its gradient."""
    if placement != "auto":
        if kind == "scalar" and placement != "loss":
            raise NotAuditable(f"a scalar result cannot be a per-token reward (placement={placement!r})")
        return placement
    if reward_named:
        return "reward"
    if kind == "scalar" or is_loss_function(getattr(fn, "__name__", "")):
        return "loss"
    tensor = getattr(result, "loss", result)  # a KLTerm: its differentiable part
    tensor = tensor[0] if isinstance(tensor, (tuple, list)) and tensor else tensor
    carries_gradient = isinstance(tensor, torch.Tensor) and tensor.requires_grad
    return "loss" if carries_gradient else "reward"
