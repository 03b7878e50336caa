"""Which tensor each parameter of a user's KL callable receives, and which switch values to audit.

A parameter gets a `Role`: the policy log-probs (the one that carries gradient), reference or old
log-probs, the mask, policy or reference logits, the log-ratio logp - ref, the importance ratio to the sampling policy, the sampled token ids,
a coefficient (set to 1), an entropy bonus's coefficient (set to 0), a zeroed task reward or advantage,
a string switch (audited once per literal the code compares it with), its own default, or None. Names are read with the lint's
naming table (`klaudit.lint.roles`), then annotations and defaults decide; `--bind PARAM=ROLE`
overrides. Torch-free until `arguments_for` is called, so the parent process can bind (for
discovery) without importing torch or the user's code. A method is called on a `bare_instance`.
"""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from klaudit.audit.roles import Role  # noqa: F401 - defined beside PLACEMENTS, imported from here too
from klaudit.lint import algebra
from klaudit.lint.roles import (
    bare_parameter_role,
    is_coefficient_name,
    is_entropy_coefficient_name,
    is_mask_name,
    is_task_score_name,
    is_token_ids_name,
    sink_of_name,
    tensor_role,
)

if TYPE_CHECKING:
    from klaudit.lint.signatures import InputReads

MAX_MODES = 64  # switch combinations audited at most; more is a configuration explosion, not a KL term


POLICY_ROLES = (Role.LOGPROBS, Role.LOGITS, Role.LOG_RATIO, Role.VOCAB_LOGPROBS)  # where the policy's gradient enters


def only_sampling_policy(roles: Iterable[Role]) -> bool:
    """Whether the only log-probs of the policy among `roles` are the sampling policy's (old): a KL reward computed
    at the rollout, audited with them as the policy's own, detached."""
    roles = set(roles)
    return Role.OLD_LOGPROBS in roles and not roles & set(POLICY_ROLES)


def takes_the_policy(roles: Iterable[Role]) -> bool:
    """Whether a callable with parameters of `roles` can be audited as a function of the policy."""
    roles = set(roles)
    return bool(roles & set(POLICY_ROLES)) or Role.OLD_LOGPROBS in roles


class BindError(ValueError):
    """A parameter cannot be bound, or a --bind override is malformed."""


_ROLE_OF_KIND = {algebra.POLICY: Role.LOGPROBS, algebra.REF: Role.REF_LOGPROBS,
                 algebra.OLD: Role.OLD_LOGPROBS, algebra.LOGITS: Role.LOGITS,
                 algebra.REF_LOGITS: Role.REF_LOGITS}
BIND_SYNTAX = "--bind PARAM=ROLE with ROLE one of " + ", ".join(role.value for role in Role)


@dataclass(frozen=True)
class Binding:
    """Roles of a callable's parameters and the switch values found in its source.

    `sequence_zeros`: ZEROS parameters receive per-sequence zeros [B] instead of [B, T].
    `bool_masks`: MASK parameters receive the mask as booleans (for `torch.where(mask, ...)`), not floats.
    `longer`: tensor parameters the code reads with one end of the positions' axis cut off ("last": `logits[:, :-1]`,
    `logits[..., :-1, :]`; "first": `input_ids[:, 1:]`) receive one more position at that end, a copy of the position
    beside it, which the cut drops.
    `flat_tokens`: every [B, T] tensor (and [B, T, V] one) is passed flattened to one token vector, [B*T] ([B*T, V]),
    in row order, for code that takes the batch's tokens as one vector (a per-token result is read back per row).
    `current_old`: OLD_LOGPROBS parameters receive the policy's own log-probs, detached (pi_old = pi),
    and the audit is on-policy. `instance_switches`: the switches among `switches` that are no parameter but
    read from instance state (set on the bare instance for each mode, `set_instance_switches`) or from a
    parameter bound as SWITCHES (`config.kl_penalty`).
    """

    roles: Mapping[str, Role]
    switches: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    positional_only: frozenset = frozenset()
    sequence_zeros: bool = False
    bool_masks: bool = False
    flat_tokens: bool = False
    current_old: bool = False
    instance_switches: frozenset = frozenset()  # switches read from instance state or a config parameter
    longer: Mapping[str, tuple[str, int]] = field(default_factory=dict)  # a parameter's end and axis the code cuts
    unset: list = field(default_factory=list, compare=False)  # a SWITCHES parameter's other attributes read (None)

    @property
    def off_policy(self) -> bool:
        return Role.OLD_LOGPROBS in self.roles.values() and not self.current_old

    @property
    def old(self) -> list[str]:
        """The parameters that receive old log-probs."""
        return [name for name, role in self.roles.items() if role is Role.OLD_LOGPROBS]

    @property
    def zeroed(self) -> list[str]:
        """The parameters that receive zeros (task rewards, advantages, scores)."""
        return [name for name, role in self.roles.items() if role is Role.ZEROS]

    @property
    def masks(self) -> list[str]:
        """The parameters that receive the response mask."""
        return [name for name, role in self.roles.items() if role is Role.MASK]

    def modes(self) -> list[dict[str, str]]:
        """Every combination of switch values ([{}] when there is no switch)."""
        names = sorted(self.switches)
        combos = list(itertools.islice(itertools.product(*(self.switches[n] for n in names)), MAX_MODES))
        return [dict(zip(names, values)) for values in combos]

    def arguments_for(self, batch, mode: Mapping[str, str]) -> tuple[list, dict]:
        """Positional and keyword arguments that feed `batch` (a klaudit Batch) to the callable."""
        tensors = {
            Role.LOGPROBS: batch.logprobs, Role.REF_LOGPROBS: batch.ref_logprobs,
            Role.OLD_LOGPROBS: batch.old_logprobs, Role.MASK: batch.mask, Role.LOGITS: batch.logits,
            Role.REF_LOGITS: batch.ref_logits, Role.TOKENS: batch.tokens,
        }
        import torch

        vocabulary = {Role.VOCAB_LOGPROBS, Role.REF_VOCAB_LOGPROBS} & set(self.roles.values())
        if vocabulary and batch.logits is not None and batch.ref_logits is not None:
            tensors[Role.VOCAB_LOGPROBS] = torch.log_softmax(batch.logits, dim=-1)
            tensors[Role.REF_VOCAB_LOGPROBS] = torch.log_softmax(batch.ref_logits, dim=-1)
        args: list = []
        kwargs: dict = {}
        for name, role in self.roles.items():
            if role is Role.DEFAULT:
                continue
            if role is Role.TOKENS and batch.tokens is None:
                raise BindError(f"parameter {name} wants the sampled token ids, and this batch has none")
            if role in (Role.VOCAB_LOGPROBS, Role.REF_VOCAB_LOGPROBS) and role not in tensors:
                raise BindError(f"parameter {name} wants log-probs over the vocabulary, and this batch has no logits")
            if role is Role.LOG_RATIO:
                value: Any = batch.logprobs - batch.ref_logprobs
            elif role is Role.RATIO:  # to the behaviour policy off-policy, else to the policy itself: value 1, the score
                old = batch.old_logprobs if batch.old_logprobs is not None and not self.current_old else None
                value = torch.exp(batch.logprobs - (batch.logprobs.detach() if old is None else old))
            elif role is Role.OLD_LOGPROBS and self.current_old:
                value = batch.logprobs.detach()
            elif role is Role.MASK and self.bool_masks:
                value = batch.mask.bool()
            elif role in tensors:
                value = tensors[role]
            elif role is Role.ZEROS:
                value = torch.zeros_like(batch.mask[:, 0] if self.sequence_zeros else batch.mask)
            elif role is Role.COEF:
                value = 1.0
            elif role is Role.OFF:
                value = 0.0
            elif role is Role.SWITCH:
                value = mode[name]
            elif role is Role.SWITCHES:
                value = _ConfigView(name, {key: mode[key] for key in self.instance_switches if key in mode},
                                    f"check-grad passes {name} as the switch values of the mode audited, its other "
                                    f"settings None; say what it is with --bind {name}=ROLE", self.unset)
            else:
                value = None
            if name in self.longer and isinstance(value, torch.Tensor):
                value = _one_position_longer(value, *self.longer[name])
            if self.flat_tokens and isinstance(value, torch.Tensor) and value.shape[:2] == batch.mask.shape:
                value = value.reshape(-1, *value.shape[2:])
            if name in self.positional_only:
                args.append(value)
            else:
                kwargs[name] = value
        return args, kwargs


def parse_overrides(specs: Sequence[str]) -> dict[str, Role]:
    """`["kl_coef=coef", "lp=logprobs"]` -> {"kl_coef": Role.COEF, "lp": Role.LOGPROBS}."""
    overrides: dict[str, Role] = {}
    for spec in specs:
        name, sep, role = spec.partition("=")
        if not sep or not name.strip() or not role.strip():
            raise BindError(f"--bind {spec!r} is not PARAM=ROLE; use {BIND_SYNTAX}")
        try:
            overrides[name.strip()] = Role(role.strip())
        except ValueError:
            raise BindError(f"--bind {spec!r}: unknown role {role.strip()!r}; use {BIND_SYNTAX}") from None
    return overrides


def role_from_name(name: str, context: Sequence[str] = ()) -> Role | None:
    """The role a parameter name denotes, from the lint's naming table (a task reward, advantage or
    score is zeroed and the KL coefficient is 1, kl-math.md section 12.1); `context`, the function's
    other names, gives bare `new`, `old` or `current` theirs."""
    if is_entropy_coefficient_name(name):
        return Role.OFF
    if is_coefficient_name(name):
        return Role.COEF
    if is_mask_name(name):
        return Role.MASK
    if sink_of_name(name) in ("reward", "advantage") or is_task_score_name(name):
        return Role.ZEROS
    if is_token_ids_name(name):
        return Role.TOKENS
    kind = tensor_role(name) or bare_parameter_role(name, [other for other in context if other != name])
    return _ROLE_OF_KIND.get(kind) if kind is not None else None


def _annotation_text(annotation: Any) -> str:
    if annotation is inspect.Parameter.empty:
        return ""
    return annotation if isinstance(annotation, str) else getattr(annotation, "__name__", str(annotation))


def _role_from_signature(parameter: inspect.Parameter) -> Role | None:
    """A role from the annotation and the default when the name says nothing."""
    annotation = _annotation_text(parameter.annotation)
    default = parameter.default
    if annotation == "str" or isinstance(default, str):
        return Role.SWITCH
    if isinstance(default, bool) or annotation == "bool":
        return Role.DEFAULT if default is not inspect.Parameter.empty else None
    if annotation == "float" or isinstance(default, float):
        return Role.COEF
    if annotation == "int" or isinstance(default, int):  # a size or a count (top_k, dim), not a coefficient
        return Role.DEFAULT if default is not inspect.Parameter.empty else Role.COEF
    if default is not inspect.Parameter.empty:
        return Role.DEFAULT
    return None


def bind(fn: Callable, overrides: Mapping[str, Role] | None = None, *,
         switch_values: Mapping[str, Sequence[str]] | None = None, current_old: bool = False) -> Binding:
    """Bind every parameter of `fn`; BindError naming the parameters that cannot be bound.

    `switch_values` maps a switch parameter to the literals found in the source (see
    `switch_literals`); a switch with none found keeps its default, or is an error without one.
    `current_old`: old log-probs are the policy's own (an on-policy step), so they may stand for the policy's.
    """
    overrides = dict(overrides or {})
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError) as error:
        raise BindError(f"cannot read the signature of {fn!r}: {error}") from None
    parameters = {
        name: p for name, p in signature.parameters.items()
        if p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    }
    unknown = sorted(set(overrides) - set(parameters))
    if unknown:
        raise BindError(f"--bind names no parameter of {callable_name(fn)}: {', '.join(unknown)} "
                        f"(parameters: {', '.join(parameters) or 'none'})")
    roles: dict[str, Role] = {}
    switches: dict[str, tuple[str, ...]] = {}
    unbound: list[str] = []
    # switches that are no parameter: read from the instance (self.config.kl_penalty) or a config parameter
    state = {name: tuple(values) for name, values in (switch_values or {}).items() if name not in parameters and values}
    reads = _input_reads(fn)
    for name, parameter in parameters.items():
        named = role_from_name(name, [*parameters, callable_name(fn)])
        if name in reads.filled:
            named = Role.DEFAULT  # `if probs is None: probs = softmax(logits)`: the code's own value, not an input
        if named is Role.COEF and any(not isinstance(v, (str, bool)) for v in (switch_values or {}).get(name, ())):
            named = Role.SWITCH  # a weight the code branches on (`if beta == 0:` forward KL, `== 1:` reverse): its values
        role = overrides.get(name) or named or (
            Role.SWITCH if (switch_values or {}).get(name) else _role_from_signature(parameter)) or (
            Role.SWITCHES if state else None)  # a config object its switches are read from (config.kl_penalty)
        if role is Role.SWITCH:
            values = list((switch_values or {}).get(name, ()))
            if isinstance(parameter.default, str) and parameter.default not in values:
                values.insert(0, parameter.default)
            if not values:
                role = None
            else:
                switches[name] = tuple(values)
        if role is None:
            unbound.append(name)
            continue
        roles[name] = role
    served = Role.SWITCHES in roles.values() or _INSTANCE_VALUES in type(getattr(fn, "__self__", None)).__dict__
    instance = state if served else {}
    switches.update(instance)
    if unbound:
        raise BindError(
            f"cannot bind parameter{'s' if len(unbound) > 1 else ''} {', '.join(unbound)} of {callable_name(fn)}; "
            f"say what {'they are' if len(unbound) > 1 else 'it is'} with {BIND_SYNTAX}"
        )
    current_old = current_old or only_sampling_policy(roles.values())
    if not takes_the_policy(roles.values()):
        raise BindError(f"no parameter of {callable_name(fn)} receives the policy log-probs or logits; "
                        f"name it with --bind PARAM=logprobs")
    positional_only = frozenset(n for n, p in parameters.items() if p.kind is inspect.Parameter.POSITIONAL_ONLY)
    return Binding(roles, switches, positional_only, current_old=current_old, instance_switches=frozenset(instance),
                   longer={name: (end, axis) for name, end, axis in reads.shifted if name in roles})


def _one_position_longer(value, end: str, axis: int):
    """`value` [B, T, ...] with one more position at `end` of axis 1, a copy of its neighbour, where `axis` (1, or
    counted from the end after an ellipsis) is the positions' axis of this tensor; `value` itself otherwise."""
    import torch

    if value.dim() < 2 or axis % value.dim() != 1:
        return value
    return torch.cat([value, value[:, -1:]] if end == "last" else [value[:, :1], value], dim=1)


def callable_name(fn: Callable) -> str:
    """The callable's qualified name; its repr only where it has no name (a method's repr shows its instance, whose
    own repr may read state a bare instance lacks: torch.nn.Module's `_modules`)."""
    for attribute in ("__qualname__", "__name__"):
        name = getattr(fn, attribute, None)
        if isinstance(name, str):
            return name
    return repr(fn)


# ----- methods called on an instance whose __init__ did not run -----

_DEFAULTED = "_klaudit_defaulted_attributes"
_INSTANCE_VALUES = "_klaudit_instance_switches"  # the switch values a bare instance serves, per mode


class Coefficient(float):
    """A KL coefficient read from a bare instance: 1.0, which also answers `.value` (the adaptive
    KL controller spelling `self.kl_ctl.value`)."""

    @property
    def value(self) -> float:
        return float(self)


class _StateView:
    """State check-grad does not have (`self.config` on a bare instance, a `config` parameter), read through to
    the switch values of the mode audited (`config.kl_penalty`) and KL coefficients (1.0); anything else raises an
    AttributeError naming its chain, and `why`, once it is used."""

    def __init__(self, chain: str, values: Mapping[str, Any], why: str, unset: list[str] | None = None) -> None:
        self._chain, self._values, self._why, self._unset = chain, values, why, unset

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        if name in self._values:
            return self._values[name]
        if is_coefficient_name(name):
            return Coefficient(1.0)
        if self._unset is not None:  # a config's setting no KL switch selects: off (is_clip, distillation_topk)
            self._unset.append(f"{self._chain}.{name}")
            return None
        return _StateView(f"{self._chain}.{name}", self._values, self._why)

    def _missing(self, *args, **kwargs):
        raise AttributeError(f"{self._chain} is not set: {self._why}")

    __call__ = __bool__ = __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = _missing
    __iter__ = __len__ = __getitem__ = __float__ = __int__ = __index__ = __neg__ = _missing
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __rtruediv__ = _missing
    __pow__ = __rpow__ = __matmul__ = __rmatmul__ = _missing
    __hash__ = None  # type: ignore[assignment]


class _ConfigView(_StateView):
    """A config parameter bound as SWITCHES: a _StateView that is also read as a dict (`config.get("kl_penalty",
    "kl")`, `config["kl_penalty"]`, `"kl_penalty" in config`) and tested for truth (`if config`): it is there."""

    def get(self, key: str, default: Any = None) -> Any:
        """The mode's value of switch `key`, else a KL coefficient's 1.0, else the code's own `default`."""
        if key in self._values:
            return self._values[key]
        return Coefficient(1.0) if is_coefficient_name(key) else default

    def __getitem__(self, key: str) -> Any:
        return getattr(self, key)

    def __contains__(self, key: object) -> bool:
        return key in self._values

    def __bool__(self) -> bool:
        return True


def _bare_why(owner: type) -> str:
    return (f"check-grad called a method of {owner.__qualname__} on an instance whose __init__ did not run, so only "
            f"KL coefficients (read as 1) and the switches it reads exist on self; audit a function that takes it "
            f"as a parameter")


def bare_instance(owner: type) -> Any:
    """An instance of (a subclass of) `owner` whose __init__ did not run, for auditing a method.

    A missing attribute named like a KL coefficient reads as 1.0 and is recorded (see
    `defaulted_attributes`); a switch the method reads from the instance reads as the value of the mode
    audited (`set_instance_switches`), directly or through the state it is in (`self.config.kl_penalty`);
    any other missing attribute raises an AttributeError that says why it is missing. Underscore names
    raise a plain AttributeError, so that classes whose own __getattr__ reads private state
    (torch.nn.Module) do not recurse.
    """
    defaulted: list[str] = []
    values: dict[str, Any] = {}

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        if name in values:
            return values[name]
        if is_coefficient_name(name):
            if name not in defaulted:
                defaulted.append(name)
            return Coefficient(1.0)
        if values:  # state the switches may be read through
            return _StateView(f"self.{name}", values, _bare_why(owner))
        raise AttributeError(f"self.{name} is not set: {_bare_why(owner)}")

    namespace = {"__getattr__": __getattr__, "__module__": owner.__module__, "__qualname__": owner.__qualname__,
                 _DEFAULTED: defaulted, _INSTANCE_VALUES: values}
    subclass: Any  # a class made at run time: its own __new__ is called below, which mypy reads as type.__new__
    try:
        subclass = type(owner)(owner.__name__, (owner,), namespace)
    except Exception:  # a class that refuses subclasses (final metaclass): plain missing attributes
        subclass = owner
    return subclass.__new__(subclass)


def set_instance_switches(fn: Callable, binding: Binding, mode: Mapping[str, Any]) -> None:
    """Set the instance switches of `binding` to their values in `mode` on the bare instance of method `fn`."""
    values = getattr(type(getattr(fn, "__self__", None)), _INSTANCE_VALUES, None)
    if values is not None and binding.instance_switches:
        values.clear()
        values.update((name, mode[name]) for name in binding.instance_switches if name in mode)


def defaulted_attributes(fn: Callable) -> list[str]:
    """The coefficient attributes a method of a `bare_instance` has read as 1.0 so far."""
    return list(getattr(type(getattr(fn, "__self__", None)), _DEFAULTED, ()))


# ----- switch values, from the lint's analysis of the source (static: nothing is imported) -----


# the roles of log-probs over the vocabulary ([B, T, V]) where a name reads as one log-prob per token
_VOCABULARY_ROLES = {Role.LOGPROBS: Role.VOCAB_LOGPROBS, Role.REF_LOGPROBS: Role.REF_VOCAB_LOGPROBS}


def read_over_vocabulary(names: Sequence[str], context: Sequence[str]) -> dict[str, Role]:
    """The parameters among `names` whose names read as log-probs (among the function's `context` names), bound
    instead to log-probs over the vocabulary: the reading under which a divergence helper's switches select a KL."""
    return {name: _VOCABULARY_ROLES[role] for name in names
            if (role := role_from_name(name, context)) in _VOCABULARY_ROLES}


def bind_with_switches(fn: Callable, overrides: Mapping[str, Role] | None = None, *,
                       current_old: bool = False) -> Binding:
    """`bind` at the switch values the lint reads (`switch_literals`). Where a parameter binds only once the
    inputs named as log-probs are read over the vocabulary (a divergence helper whose `alpha == 1` selects
    the KL of two log_softmax outputs), they are bound so."""
    overrides = dict(overrides or {})
    values = switch_literals(fn, overrides)
    overrides = {**_configs_of(fn, values), **overrides}
    try:
        return bind(fn, overrides, switch_values=values, current_old=current_old)
    except BindError as error:
        names = list(inspect.signature(fn).parameters)
        widened = {**read_over_vocabulary(names, [*names, callable_name(fn)]), **overrides}
        switches = switch_literals(fn, widened) if widened != overrides else {}
        if not switches:
            raise error from None
        return bind(fn, widened, switch_values=switches, current_old=current_old)


def _configs_of(fn: Callable, values: Mapping[str, Sequence]) -> dict[str, Role]:
    """SWITCHES for each parameter `fn` reads switches of `values` through (`config.get("distillation_type")`)
    that its name gives no role, whatever its default (`config: dict | None = None`): the mode's values reach
    the code through it."""
    from klaudit.lint.query import configs_read_at

    try:
        names = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return {}
    located = _located(fn)
    if located is None or not set(values) - set(names):  # no switch is read through a parameter
        return {}
    try:
        configs = configs_read_at(*located)
    except (OSError, UnicodeDecodeError, SyntaxError):
        return {}
    return {name: Role.SWITCHES for name in names if name in configs and role_from_name(name, [*names, callable_name(fn)]) is None}


def _input_reads(fn: Callable) -> InputReads:
    """How the source of `fn` reads its parameters (klaudit.lint.query.input_reads_at); nothing where it has none."""
    from klaudit.lint.query import input_reads_at
    from klaudit.lint.signatures import InputReads

    located = _located(fn)
    if located is None:
        return InputReads()
    try:
        return input_reads_at(*located)
    except (OSError, UnicodeDecodeError, SyntaxError):
        return InputReads()


def _located(fn: Callable) -> tuple[str, str, int] | None:
    """The source file, the name and the first line of the code of `fn` (under a decorator's wrapper), or None."""
    own = inspect.unwrap(fn)  # the user's function under a decorator's wrapper (`@torch.compile`)
    code = getattr(own, "__code__", None)
    try:
        path = inspect.getsourcefile(own)
    except TypeError:
        path = None
    return None if code is None or path is None else (path, code.co_name, code.co_firstlineno)


def switch_literals(fn: Callable, overrides: Mapping[str, Role] | None = None) -> dict[str, list]:
    """The values each switch parameter of `fn` is audited at: those the lint's flow analysis labels the KL
    terms of `fn` with, in `fn` and the functions it calls (`klaudit.lint.query.switch_values_at`: string
    literals, dict dispatch, suffixed spellings, integer indices, flags, numeric comparisons), with the
    parameters `overrides` binds to log-probs over the vocabulary read as such. A flag's default comes first,
    and is audited even where the lint labels no KL term with it."""
    from klaudit.lint.query import switch_values_at

    located = _located(fn)
    if located is None:
        return {}
    try:
        found = switch_values_at(*located, {name: role.value for name, role in (overrides or {}).items()})
    except (OSError, UnicodeDecodeError, SyntaxError):
        return {}
    try:
        defaults = {name: p.default for name, p in inspect.signature(fn).parameters.items()}
    except (TypeError, ValueError):
        defaults = {}
    for name, values in found.items():
        default = defaults.get(name, inspect.Parameter.empty)
        if isinstance(default, bool) and all(isinstance(value, bool) for value in values):
            # the flag's default runs where it is not set: audited first
            found[name] = [default] + [value for value in values if value is not default]
    return found
