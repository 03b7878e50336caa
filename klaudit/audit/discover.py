"""The KL functions of a file that check-grad can audit, found statically (the file is never imported).

A function is a KL function when the lint's flow analysis sees it return a KL term or put one into a
loss or reward (`klaudit.lint.query.kl_functions`), or when its parameters name both the policy's and
the reference's log-probs or logits (a wrapper whose body the lint cannot read, such as a compiled
extension's). It can be audited alone when every parameter without a default binds by its name or
annotation (`bind.role_from_name`) or is a switch whose values select its KL terms
(`klaudit.lint.query.switch_values`), one of them binds to the policy, and, for a method, when it and
the methods of its class it calls read no instance attribute but KL coefficients (a bare instance reads
those as 1). The functions, their parameters and the state they read are the lint's
(`klaudit.lint.signatures`). The others, typically a whole training step that needs models and an
optimizer, are listed with what they lack so that the user can audit their KL helper instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from klaudit.audit.bind import POLICY_ROLES, Role, read_over_vocabulary, role_from_name, takes_the_policy
from klaudit.lint.signatures import Parameter, Signature

_REFERENCE_ROLES = (Role.REF_LOGPROBS, Role.REF_LOGITS, Role.REF_VOCAB_LOGPROBS)
_SCALAR_ANNOTATIONS = ("str", "bool", "float", "int")


class DiscoveryError(ValueError):
    """A file that cannot be read or parsed; the message is one line."""


@dataclass
class Discovery:
    """The auditable KL functions of a file (qualified names, in source order) and one line for each
    KL function that cannot be called alone."""

    auditable: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def discover_kl_functions(path: str) -> Discovery:
    """Discovery of `path` (DiscoveryError when it does not read or parse)."""
    from klaudit.lint.query import functions_of, kl_functions, switch_values

    try:
        found = functions_of(path)
    except (OSError, UnicodeDecodeError) as error:
        raise DiscoveryError(f"{path}: cannot read: {error}") from None
    except SyntaxError as error:
        raise DiscoveryError(f"{path}:{error.lineno}: syntax error: {error.msg}") from None
    seen_by_lint = set(kl_functions(path))
    discovery = Discovery()
    for function in found:
        context = [parameter.name for parameter in function.parameters] + [function.qualname]
        roles = [role_from_name(parameter.name, context) for parameter in function.parameters]
        by_signature = any(r in POLICY_ROLES for r in roles) and any(r in _REFERENCE_ROLES for r in roles)
        if function.qualname not in seen_by_lint and not by_signature:
            continue
        lacks = []
        if not takes_the_policy(role for role in roles if role is not None):
            lacks.append("no parameter takes the policy log-probs or logits")
        unbound = _unbindable(function.parameters, context)
        if unbound:
            # the switches of its KL terms, with its log-prob inputs read per token, else over the vocabulary
            # (a divergence helper: `alpha == 1` selects a KL the lint judges only on [B, T, V] inputs)
            vocabulary = read_over_vocabulary([parameter.name for parameter in function.parameters], context)
            switches = switch_values(path, function.qualname) or switch_values(
                path, function.qualname, {name: role.value for name, role in vocabulary.items()})
            unbound = [name for name in unbound if name not in switches and not _read_as_switches(function, name, switches)]
        if unbound:
            lacks.append(f"{_listed(unbound)} {'does' if len(unbound) == 1 else 'do'} not bind by name")
        state = _state_not_switched(path, function) if function.state else []
        if state:
            lacks.append(f"it reads instance state {_listed('self.' + name for name in state)}")
        if lacks:
            advice = ("audit the KL helper it calls instead" if state else
                      f"name it with ::{function.qualname} and say what its parameters are with --bind PARAM=ROLE")
            discovery.skipped.append(f"{path}::{function.qualname} computes a KL term but cannot be called alone "
                                     f"({'; '.join(lacks)}): {advice}")
        else:
            discovery.auditable.append(function.qualname)
    return discovery


def _read_as_switches(function: Signature, name: str, switches) -> bool:
    """Whether parameter `name` is a config object the function reads switches from (`config.kl_penalty`), and
    never uses whole: check-grad binds it as `switches` (another attribute it reads raises, naming itself, and
    the switch values that reach it are skipped)."""
    chains = [chain.split(".")[1:] for chain in function.parameter_chains if chain.split(".")[0] == name]
    return name not in function.bare and any(chain[-1] in switches for chain in chains)


def _state_not_switched(path: str, function: Signature) -> list[str]:
    """The instance state a method reads other than the switches its KL terms are labelled with (`self.config`
    read only as `self.config.kl_penalty`, compared with "kl", "abs" ...): a bare instance serves those."""
    from klaudit.lint.query import switch_values

    leaves = set(switch_values(path, function.qualname))
    return [name for name in function.state
            if not any(chain.split(".")[0] == name for chain in function.chains)
            or any(chain.split(".")[0] == name and chain.rsplit(".", 1)[-1] not in leaves for chain in function.chains)]


def _listed(names, shown: int = 4) -> str:
    names = list(names)
    return ", ".join(names[:shown]) + (f" and {len(names) - shown} more" if len(names) > shown else "")


def _unbindable(parameters: Sequence[Parameter], context: Sequence[str]) -> list[str]:
    """Parameters without a default that neither their name (among the function's `context` names) nor their
    annotation binds."""
    return [p.name for p in parameters if not p.defaulted and role_from_name(p.name, context) is None
            and p.annotation not in _SCALAR_ANNOTATIONS]
