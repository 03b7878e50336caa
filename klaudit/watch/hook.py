"""`watch`: a KL function wrapped so that the calls it samples are audited, the training untouched.

The wrapper calls the function exactly as before and returns its result as it is; on a sampled call it
then audits copies of the call's tensors (klaudit.watch.verdict) with autograd on, autocast off and the
CPU random state restored, inside no graph of the training's, and keeps nothing of them once it
returns. Calls made while an audit runs (the audit calls the function again) pass straight through.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
from collections.abc import Callable, Mapping
from types import FrameType
from typing import Any

import torch

from klaudit.audit.bind import Role, callable_name
from klaudit.catalog import Aggregation
from klaudit.watch.report import Reporter
from klaudit.watch.verdict import DEFAULT_ROWS, PLACEMENTS, NotAuditable, Verdict, audit_call

_auditing = threading.local()

# How a caller's frame says how it reduces the result (a framework's loss_agg_mode), None when it cannot.
AggregationOf = Callable[[FrameType], "Aggregation | None"]


class WatchState:
    """What a watched function keeps between calls: a call counter and its reporter (no tensors)."""

    def __init__(self, fn: Callable, *, placement: str, overrides: Mapping[str, Role], every: int | None,
                 reporter: Reporter, aggregation: Aggregation | AggregationOf, rows: int, name: str,
                 site: str | None, fixes: Mapping[str, str]):
        self.fn = fn
        self.placement = placement
        self.overrides = dict(overrides)
        self.every = every
        self.reporter = reporter
        self.aggregation = aggregation
        self.rows = rows
        self.name = name
        self.site = site
        self.fixes = dict(fixes)
        self.calls = 0
        self.audits = 0

    def sampled(self) -> bool:
        """Whether this call is audited: the first, then every `every`-th."""
        index = self.calls
        self.calls += 1
        return index == 0 or (self.every is not None and index % self.every == 0)

    def audit(self, args: tuple, kwargs: dict, result: Any, caller: FrameType | None) -> None:
        """Audit one call and report; an internal failure is one warning (KLGradientError passes in mode raise)."""
        self.audits += 1
        try:
            aggregation = self.aggregation
            if callable(aggregation):
                aggregation = (aggregation(caller) if caller is not None else None) or Aggregation.SUM
            audit = functools.partial(audit_call, self.fn, args, kwargs, name=self.name, placement=self.placement,
                                      aggregation=aggregation, overrides=self.overrides, rows=self.rows,
                                      result=result)
            verdict = _isolated(lambda: _on_cpu_first(audit, args, kwargs))
            if self.fixes:
                verdict = verdict.with_framework_fixes(self.fixes)
        except Exception as error:  # noqa: BLE001 - nothing the audit does may stop the training
            self.reporter.failed(self.name, error)
            return
        self.reporter.report(verdict, call=self.calls - 1, site=self.site)


def _on_cpu_first(audit: Callable[..., Verdict], args: tuple, kwargs: dict) -> Verdict:
    """The verdict on CPU copies of the call's tensors, or, where the function cannot run on them (it keeps a
    GPU tensor of its own, say), on copies on the tensors' own devices."""
    try:
        return audit(device="cpu")
    except NotAuditable:
        raise
    except Exception:
        if all(value.device.type == "cpu" for value in (*args, *kwargs.values()) if isinstance(value, torch.Tensor)):
            raise
        return audit(device=None)


def _isolated(run: Callable):
    """`run()` with autograd on, autocast off, one CPU thread, the CPU random state restored, and watched calls
    passing through."""
    _auditing.active = True
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the audit's tensors are a few sequences: more threads only contend (CPU)
    try:
        with torch.random.fork_rng(devices=[]), torch.inference_mode(False), torch.enable_grad(), \
                torch.autocast("cpu", enabled=False), _cuda_autocast_off():
            return run()
    finally:
        torch.set_num_threads(threads)
        _auditing.active = False


def _cuda_autocast_off():
    if torch.cuda.is_available():
        return torch.autocast("cuda", enabled=False)
    return torch.autocast("cpu", enabled=torch.is_autocast_enabled("cpu"))  # a no-op context


def watch(fn: Callable | None = None, *, placement: str = "auto", args: Mapping[str, str] | None = None,
          every: int | None = None, mode: str = "warn", log_file: str | os.PathLike | None = None,
          aggregation: str | Aggregation | AggregationOf = Aggregation.SUM, rows: int = DEFAULT_ROWS,
          name: str | None = None, site: str | None = None, fixes: Mapping[str, str] | None = None,
          reporter: Reporter | None = None):
    """Wrap a KL function (or a loss function) so that the calls it samples are audited.

    Use as `@watch`, `@watch(placement="loss", every=100)` or `watch(fn, ...)`.

    placement: how the training uses the result: "loss" (differentiated), "reward" (detached into the
        rewards, reward-to-go), "loss+reward", "loss+future", "advantage" (each token's own detached value as its
        advantage), or "auto" (by the function's name, then a
        scalar or a result that carries a gradient is a loss, a detached one a reward).
    args: {parameter: role} for parameters klaudit's naming table does not read (roles as check-grad's
        --bind: logprobs, ref_logprobs, old_logprobs, mask, log_ratio, zeros, coef, ...).
    every: audit the first call, then every `every`-th (None: the first call only).
    mode: "warn" (a KLGradientWarning and a log line on the "klaudit.watch" logger), "raise"
        (KLGradientError once the call returned), "log" (JSON lines to `log_file`, default
        klaudit-watch.jsonl). Each configuration is reported once.
    aggregation: how the caller reduces a per-token result ("token-sum", "seq-token-mean",
        "batch-token-mean", "divide-by-constant"), or a callable reading it from the caller's frame.
    rows: the sequences of the batch the audit copies (the verdict is exact on any of them).

    The wrapped function's values and gradients are those of the function: the audit works on copies
    and calls the function again on them (a function with side effects, e.g. one that updates an
    adaptive KL controller, sees those calls too).
    """
    if fn is None:
        return lambda inner: watch(inner, placement=placement, args=args, every=every, mode=mode, log_file=log_file,
                                   aggregation=aggregation, rows=rows, name=name, site=site, fixes=fixes,
                                   reporter=reporter)
    if placement not in PLACEMENTS:
        raise ValueError(f"placement must be one of {', '.join(PLACEMENTS)}, got {placement!r}")
    if every is not None and (isinstance(every, bool) or not isinstance(every, int) or every < 1):
        raise ValueError(f"every must be a positive integer or None, got {every!r}")
    if not isinstance(rows, int) or rows < 1:
        raise ValueError(f"rows must be a positive integer, got {rows!r}")
    overrides = {param: Role(role) for param, role in (args or {}).items()}
    if not callable(aggregation):
        aggregation = Aggregation(aggregation)
    state = WatchState(fn, placement=placement, overrides=overrides, every=every,
                       reporter=reporter or Reporter(mode, log_file), aggregation=aggregation, rows=rows,
                       name=name or callable_name(fn), site=site,
                       fixes=fixes or {})

    @functools.wraps(fn)
    def watched(*call_args, **call_kwargs):
        result = fn(*call_args, **call_kwargs)
        if not getattr(_auditing, "active", False) and state.sampled():
            state.audit(call_args, call_kwargs, result, sys._getframe(1))
        return result

    watched.__klaudit_watch__ = state  # type: ignore[attr-defined]
    return watched


def state_of(fn: Callable) -> WatchState | None:
    """The watch state of a watched function, None for any other."""
    return getattr(fn, "__klaudit_watch__", None)
