"""`patch("verl")`, `patch("openrlhf")`: the frameworks' own KL functions watched in place, in one line.

A *site* is a module attribute through which a framework calls its KL function, with the placement
the framework gives the result there (the site is only reached when the framework's own flag puts the
KL there: verl's `use_kl_loss` / `use_kl_in_reward`, OpenRLHF's `algo.kl.use_loss`) and, where the
caller's configuration says how it reduces the per-token values, that aggregation. A module already
imported is patched at once; any other is patched right after its import (a meta-path finder wraps its
loader), so `from core_algos import kl_penalty` in a module imported later also gets the watch.
No torch is imported here until a site's module is (the framework imports it anyway).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import FrameType, ModuleType
from typing import Any

from klaudit.catalog import Aggregation
from klaudit.frameworks import verl as verl_flags


@dataclass(frozen=True)
class Site:
    """A framework's KL function as one module reaches it, and how the framework uses it there."""

    module: str
    attribute: str
    placement: str  # "loss", "reward" or "auto" (a result with a gradient is a loss, a detached one a reward)
    what: str  # what the framework does with it here, for the report
    aggregation: Callable[[FrameType], Aggregation | None] | None = None  # read from the caller's frame
    fixes: Mapping[str, str] = field(default_factory=dict)  # rule -> the framework's own fix (a flag)


def _verl_loss_aggregation(frame: FrameType) -> Aggregation | None:
    """verl's ppo_loss reduces the KL loss with `config.loss_agg_mode` (its caller's local `config`)."""
    mode = getattr(frame.f_locals.get("config"), "loss_agg_mode", None)
    return verl_flags.AGGREGATIONS.get(mode) if isinstance(mode, str) else None


def _openrlhf_loss_aggregation(frame: FrameType) -> Aggregation | None:
    """OpenRLHF's actor reduces the KL loss by `args.actor.loss_agg_mode`: token-mean over the batch, else a
    token-mean per sequence (openrlhf.models.loss.aggregate_loss)."""
    owner = frame.f_locals.get("self")
    mode = getattr(getattr(getattr(owner, "args", None), "actor", None), "loss_agg_mode", None)
    if not isinstance(mode, str):
        return None
    return Aggregation.BATCH_MEAN if mode == "token-mean" else Aggregation.SEQ_MEAN


_VERL_CORE = "verl.trainer.ppo.core_algos"
_OPENRLHF_UTILS = "openrlhf.models.utils"
FRAMEWORKS: Mapping[str, tuple[Site, ...]] = {
    "verl": (
        Site(_VERL_CORE, "kl_penalty", "auto",
             "verl's kl_penalty (apply_kl_penalty, algorithm.use_kl_in_reward: the rollout's log-probs, detached, "
             "so a reward)", fixes=verl_flags.FIXES),
        Site("verl.workers.utils.losses", "kl_penalty", "loss",
             "verl's KL loss (actor.use_kl_loss with actor.kl_loss_type)", _verl_loss_aggregation, verl_flags.FIXES),
        Site("verl.trainer.distillation.losses", "kl_penalty", "loss", "verl's distillation loss (a KL estimator)"),
    ),
    "openrlhf": (
        Site(_OPENRLHF_UTILS, "compute_approx_kl", "auto", "OpenRLHF's compute_approx_kl"),
        Site("openrlhf.trainer.ray.ppo_actor", "compute_approx_kl", "loss",
             "OpenRLHF's KL loss (algo.kl.use_loss)", _openrlhf_loss_aggregation),
        Site("openrlhf.trainer.ppo_utils.experience_maker", "compute_approx_kl", "reward",
             "OpenRLHF's KL reward (algo.kl.use_loss off: the KL enters the rewards)"),
    ),
}


@dataclass
class _Patched:
    site: Site
    original: Any


class _State:
    """The patches in force: what each patched attribute held before, and the sites awaiting their import."""

    def __init__(self) -> None:
        self.patched: dict[tuple[str, str], _Patched] = {}
        self.pending: dict[str, list[tuple[Site, dict]]] = {}
        self.lock = threading.RLock()


_STATE = _State()


def patch(framework: str, *, every: int | None = None, mode: str = "warn", log_file: str | None = None,
          rows: int | None = None, reporter: Any = None) -> list[str]:
    """Watch `framework`'s KL functions ("verl" or "openrlhf") where the framework calls them; returns the
    sites, "module.attribute" (patched now, or as soon as their module is imported). `every`, `mode`,
    `log_file`, `rows`: as `klaudit.watch.watch`; one reporter serves every site of the call."""
    if framework not in FRAMEWORKS:
        raise ValueError(f"unknown framework {framework!r}; klaudit.watch patches {', '.join(FRAMEWORKS)}")
    from klaudit.watch.report import Reporter

    options = {"every": every, "reporter": reporter or Reporter(mode, log_file)}
    if rows is not None:
        options["rows"] = rows
    with _STATE.lock:
        for site in FRAMEWORKS[framework]:
            module = sys.modules.get(site.module)
            if module is not None:
                _patch_site(module, site, options)
            else:
                _STATE.pending.setdefault(site.module, []).append((site, options))
        if _STATE.pending:
            _install_finder()
    return [f"{site.module}.{site.attribute}" for site in FRAMEWORKS[framework]]


def unpatch(framework: str) -> None:
    """Undo `patch(framework)`: every site gets back what it held, and pending sites are dropped."""
    with _STATE.lock:
        for site in FRAMEWORKS.get(framework, ()):
            _STATE.pending.pop(site.module, None)
            patched = _STATE.patched.pop((site.module, site.attribute), None)
            module = sys.modules.get(site.module)
            if patched is not None and module is not None:
                setattr(module, site.attribute, patched.original)


def patch_module(module: ModuleType, site: Site, **options) -> None:
    """Watch `site.attribute` of `module` (a module loaded by other means, e.g. a file with its heavy
    imports stubbed) as `patch` does."""
    from klaudit.watch.report import Reporter

    options.setdefault("reporter", Reporter(options.pop("mode", "warn"), options.pop("log_file", None)))
    with _STATE.lock:
        _patch_site(module, site, options)


def _patch_site(module: ModuleType, site: Site, options: dict) -> None:
    from klaudit.watch.hook import state_of, watch

    current = getattr(module, site.attribute, None)
    if current is None:
        return  # this release has no such function here
    state = state_of(current)
    original = state.fn if state is not None else current
    _STATE.patched.setdefault((site.module, site.attribute), _Patched(site, current))
    setattr(module, site.attribute, watch(
        original, placement=site.placement, aggregation=site.aggregation or Aggregation.SUM,
        site=f"{site.module}.{site.attribute}: {site.what}", fixes=site.fixes,
        name=getattr(original, "__name__", site.attribute), **options))


class _PatchingLoader(importlib.abc.Loader):
    """The loader of a site's module, which patches the module once it has executed."""

    def __init__(self, loader: importlib.abc.Loader, name: str):
        self._loader = loader
        self._name = name

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        self._loader.exec_module(module)
        with _STATE.lock:
            for site, options in _STATE.pending.pop(self._name, []):
                _patch_site(module, site, options)

    def __getattr__(self, name: str):
        return getattr(self._loader, name)


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Finds a pending site's module with the other finders and hands back its spec with a patching loader."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in _STATE.pending:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _PatchingLoader(spec.loader, fullname)
                return spec
        return None


_FINDER = _PatchOnImport()


def _install_finder() -> None:
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
