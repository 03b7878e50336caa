"""check-grad: targets, discovery, and the isolated child process that runs the user's code.

Targets: `PATH.py` (every KL function found in the file), `PATH.py::function`,
`PATH.py::Class.method`, `package.module:function`. Discovery is static (klaudit.audit.discover,
from the lint's flow analysis and naming table). The parent never imports user code: each target is audited by
a child Python process (`child_command`) confined by klaudit.audit.confine (its own process group,
killed when it ends; a time and a memory limit), and only JSON comes back, in a file of its own.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import json
import os
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from klaudit.audit.bind import BindError, Role
from klaudit.audit.confine import limit_memory, memory_limit_bytes, run_confined
from klaudit.audit.discover import DiscoveryError, discover_kl_functions
from klaudit.audit.report import Report
from klaudit.audit.stubs import import_with_stubs
from klaudit.lint.query import package_of
from klaudit.progress import Progress

DEFAULT_TIMEOUT = 120.0


class TargetError(ValueError):
    """A target that does not name a file, module or function; the message is one line."""


@dataclass(frozen=True)
class Target:
    """A file and a qualified name in it, or an importable module and a name in it."""

    path: str | None = None
    module: str | None = None
    qualname: str | None = None
    label: str | None = None  # how the report names it, when not by path and name (an inline KL term)
    source: str | None = None  # the code of a function cut out of `path` (klaudit.audit.inline)
    placement: str | None = None  # the placement the code gives a cut-out function's result
    origin: str | None = None  # the file a cut-out function comes from: its package imports as there

    def __str__(self) -> str:
        if self.label is not None:
            return self.label
        where = self.path if self.path is not None else self.module
        separator = "::" if self.path is not None else ":"
        return f"{where}{separator}{self.qualname}" if self.qualname else str(where)


def parse_target(text: str) -> Target:
    """`a.py`, `a.py::f`, `a.py::C.m` or `pkg.mod:f` as a Target (files must exist)."""
    if "::" in text or text.endswith(".py"):
        path, _, qualname = text.partition("::")
        if not os.path.isfile(path):
            raise TargetError(f"{path}: no such file")
        if "::" in text and not qualname:
            raise TargetError(f"{text}: give a function after '::' (PATH.py::function)")
        return Target(path=path, qualname=qualname or None)
    module, sep, qualname = text.partition(":")
    if not sep or not module or not qualname:
        raise TargetError(f"{text!r} is not PATH.py, PATH.py::function, PATH.py::Class.method or "
                          f"package.module:function")
    return Target(module=module, qualname=qualname)


def used_placements(target: Target) -> set[str]:
    """How the user's own code uses the target's result ("loss" and/or "reward"), from the lint's flow
    analysis of the target's project (klaudit.lint.query); empty when unknown."""
    from klaudit.lint.query import placements_of

    if target.source is not None:
        return {target.placement} if target.placement else set()
    path = target.path if target.path is not None else module_file(target.module) if target.module is not None else None
    if path is None or not target.qualname:
        return set()
    try:
        return set(placements_of(path, target.qualname))
    except Exception:  # noqa: BLE001 - the mark is a hint: an analysis failure must not lose the audit
        return set()


def module_file(module: str) -> str | None:
    """The source file of `package.module` under the working directory or sys.path, found without
    importing anything."""
    parts = module.split(".")
    for base in [os.getcwd(), *sys.path]:
        candidate = Path(base or ".", *parts)
        for file in (candidate.with_suffix(".py"), candidate / "__init__.py"):
            if file.is_file():
                return str(file)
    return None


# ----- in the child: load and audit -----


def _import_file(path: str, origin: str | None = None) -> tuple[ModuleType, dict[str, str]]:
    """Import a .py file, with the dependencies that do not import here stubbed (klaudit.audit.stubs);
    inside a package by its dotted name so relative imports work, and when the package itself does not
    import even so, as the file alone. A function cut out of `origin` imports the package `origin` is in as
    its own (never stubbed). Returns the module and {stubbed module: why}."""
    file = Path(path).resolve()
    directory, parts = package_of(file)
    sys.path.insert(0, str(directory))
    alone: tuple[str, ...] = (f"_klaudit_target_{file.stem}", parts[0])
    if origin is not None:
        root, package = package_of(origin)
        sys.path.insert(0, str(root))
        alone += (package[0],)
    if len(parts) > 1:
        _forget_other_package(parts[0], directory)
        try:
            return import_with_stubs(lambda: importlib.import_module(".".join(parts)), own=(parts[0],),
                                     audited=".".join(parts))
        except Exception:  # the package does not import here even with stubs: try the file alone
            try:
                return import_with_stubs(lambda: _import_alone(file), own=alone, audited=alone[0])
            except Exception:
                pass
            raise
    try:
        return import_with_stubs(lambda: _import_alone(file), own=alone, audited=alone[0])
    except ImportError as error:
        if "relative import" not in str(error):
            raise
    parent = _parent_packages(file)[-1]
    module, stubbed = import_with_stubs(lambda: _import_in_parents(file), own=(_PARENTS,), audited=f"{parent}.{file.stem}")
    return module, {_as_relative(name, parent): why for name, why in stubbed.items()}


def _as_relative(name: str, package: str) -> str:
    """A stubbed module under `_PARENTS` as the file's relative import spells it (`..core`, `.BaseTrainer`)."""
    if not name.startswith(_PARENTS + "."):
        return name
    parts, own = name.split("."), package.split(".")
    common = next((n for n, (a, b) in enumerate(zip(parts, own)) if a != b), min(len(parts), len(own)))
    return "." * (len(own) - common + 1) + ".".join(parts[common:])


_PARENTS = "_klaudit_parents"  # the packages a module with relative imports but no __init__.py is imported in
_PARENT_LEVELS = 3  # its directory and the two above it: `from ..core import x` reaches one level up


def _parent_packages(file: Path) -> list[str]:
    """The names of the packages `_import_in_parents` nests `file` in, outermost first."""
    levels = min(_PARENT_LEVELS, len(file.parents))
    return [".".join([_PARENTS, *(f"level{n}" for n in range(1, depth + 1))]) for depth in range(levels)]


def _import_in_parents(file: Path) -> ModuleType:
    """Import `file`, whose directory has no __init__.py but whose code imports relatively (a copy of a framework's
    trainer kept in a scripts folder), inside packages whose paths are its directory and the ones above it: `from
    .utils import x` reads the file beside it, `from ..core import y` the one above, and what is not there is
    stubbed as any module of the user's that does not import."""
    names = _parent_packages(file)
    directories = [file.parent, *file.parent.parents][:len(names)][::-1]  # outermost first, as `names`
    for name in [name for name in sys.modules if name == _PARENTS or name.startswith(_PARENTS + ".")]:
        del sys.modules[name]  # another file's parents: never mixed
    for name, folder in zip(names, directories):
        package = ModuleType(name)
        package.__path__ = [str(folder)]
        package.__package__ = name
        sys.modules[name] = package
    return _execute(file, f"{names[-1]}.{file.stem}")


def _forget_other_package(package: str, directory: Path) -> None:
    """Drop a package of the same name imported from elsewhere (a bad and a fixed twin audited in one
    process), so that the import finds the one under `directory`."""
    cached = sys.modules.get(package)
    cached_file = getattr(cached, "__file__", None)
    if cached is None or (cached_file and Path(cached_file).resolve().parent == directory / package):
        return
    for name in [name for name in sys.modules if name == package or name.startswith(package + ".")]:
        del sys.modules[name]


def _import_alone(file: Path) -> ModuleType:
    """Execute one .py file as a module of its own (absolute imports only)."""
    return _execute(file, f"_klaudit_target_{file.stem}")


def _execute(file: Path, name: str) -> ModuleType:
    """Execute `file` as the module `name`, registered in sys.modules."""
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:
        raise ImportError(f"{file}: not importable as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _import_dotted(name: str | None) -> tuple[ModuleType, dict[str, str]]:
    """Import `package.module` from the working directory or sys.path, stubbing what does not import here."""
    if name is None:
        raise ImportError("the target names no file or module")
    sys.path.insert(0, os.getcwd())
    return import_with_stubs(lambda: importlib.import_module(name), own=(name.split(".")[0],), audited=name)


def load(target: Target) -> tuple[Callable, dict[str, str]]:
    """The callable a target names, and the modules stubbed to import it, with why (imports user code:
    call only in the child or the Python API)."""
    qualname = target.qualname
    if qualname is None:
        raise TargetError(f"{target}: name a function to audit (PATH.py::function or package.module:function)")
    try:
        if target.path is not None:
            module, stubbed = _import_file(target.path, target.origin)
        else:
            module, stubbed = _import_dotted(target.module)
    except Exception as error:
        raise TargetError(f"{target}: import failed: {type(error).__name__}: {error}") from error
    obj = module
    for part in qualname.split("."):
        if not hasattr(obj, part):
            raise TargetError(f"{target}: {part!r} not found in {getattr(obj, '__name__', obj)}")
        owner, obj = obj, getattr(obj, part)
    if isinstance(owner, type) and callable(obj) and not isinstance(owner.__dict__.get(obj.__name__),
                                                                    (staticmethod, classmethod)):
        from klaudit.audit.bind import bare_instance

        obj = getattr(bare_instance(owner), obj.__name__)  # __init__ is not run: coefficients read as 1
    if not callable(obj):
        raise TargetError(f"{target}: {target.qualname} is not callable")
    return obj, stubbed


def stubbed_note(target: Target, stubbed: dict[str, str]) -> str:
    """The report's line for the modules stubbed to import a target."""
    return (f"{target}: stubbed: {', '.join(stubbed)} (they do not import here; the audit fails, naming them, "
            f"if the KL code uses them)")


def audit_target(target: Target, *, overrides: dict | None = None, placements: Sequence[str] | None = None,
                 model_dir: str | None = None, device: str = "cpu",
                 progress: Callable[[str], None] = lambda message: None,
                 also: Callable[[], Sequence[str]] = tuple, current_old: bool = False,
                 monte_carlo: MonteCarlo | None = None) -> Report:
    """Load, bind and audit one target in this process; every failure becomes one error line.
    `monte_carlo`: audit on samples of the model at `model_dir` instead (klaudit.audit.montecarlo).
    `also`: more placements to audit once the automatic ones are done (see measure.audit).
    `current_old`: old log-probs are the policy's own, detached (an on-policy step, as the lint reads it)."""
    from klaudit.audit.bind import bind_with_switches
    from klaudit.audit.measure import ModeNotImplemented, TermError, audit

    try:
        fn, stubbed = load(target)
        binding = bind_with_switches(fn, overrides, current_old=current_old)
        _require_device(device)
        if monte_carlo is not None and model_dir is not None:
            rows, notes = _monte_carlo_rows(fn, binding, str(target), placements, model_dir, device, monte_carlo,
                                            progress)
            return Report(rows, [], ([stubbed_note(target, stubbed)] if stubbed else []) + notes)
        fingerprint = None
        if model_dir is not None:
            from klaudit.audit.fingerprint import batch_from_model
            try:
                fingerprint = batch_from_model(model_dir, device=device)
            except Exception as error:
                raise TargetError(
                    f"--model {model_dir}: cannot load and run it: {type(error).__name__}: {error}") from error
        rows, notes = audit(fn, binding, name=str(target), placements=placements, batch=fingerprint,
                            progress=progress, also=also, device=device)
        return Report(rows, [], ([stubbed_note(target, stubbed)] if stubbed else []) + notes,
                      [f"{target}: stubbed {name}: {why}" for name, why in stubbed.items()])
    except (TargetError, BindError, TermError, ModeNotImplemented) as error:
        message = f"{target}: {error}" if isinstance(error, BindError) else str(error)
        return Report([], [_one_line(message)], [], [traceback.format_exc()])
    except Exception as error:  # user code can fail anywhere (e.g. inside torch); report, don't crash
        return Report([], [_one_line(f"{target}: {type(error).__name__}: {error}")], [], [traceback.format_exc()])


@dataclass(frozen=True)
class MonteCarlo:
    """The Monte-Carlo audit's request: how many responses (None: chosen by a pilot), and where to draw the
    picture (or None)."""

    samples: int | None
    plot: str | None = None


def _monte_carlo_rows(fn: Callable, binding, name: str, placements: Sequence[str] | None, model_dir: str,
                      device: str, request: MonteCarlo, progress: Callable[[str], None]):
    """The rows of the Monte-Carlo audit on the model at `model_dir`, and the picture when asked for."""
    from transformers import AutoModelForCausalLM

    from klaudit.audit import montecarlo

    try:
        model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True).to(device)
        sampler = montecarlo.CausalLMSampler(model, seed=0)
    except Exception as error:
        raise TargetError(f"--model {model_dir}: cannot load and run it: {type(error).__name__}: {error}") from error
    rows, notes, curves = montecarlo.audit(fn, binding, name=name, sampler=sampler, samples=request.samples,
                                           placements=placements, progress=progress,
                                           curves=request.plot is not None)
    if request.plot is not None:
        from klaudit.audit.picture import draw

        draw(curves, request.plot, title=f"{name}: {sampler.description}")
        notes.append(f"{name}: per-position gradients drawn to {request.plot}")
    return rows, notes


def _require_device(device: str) -> None:
    """TargetError, in one line, when torch cannot put a tensor on `device` here."""
    import torch

    try:
        torch.empty(0, device=device)
    except (RuntimeError, AssertionError, ValueError) as error:  # a CPU build asserts that CUDA is missing
        raise TargetError(f"--device {device}: {error}") from error


def _one_line(message: str) -> str:
    return " ".join(message.split())


def _child(request_path: str, response_path: str) -> None:
    """Entry point of the child process: read the request, audit, write the report as JSON, and end the
    process at once (a thread or an atexit hook of the user's code cannot keep it running)."""
    # torch.compile'd KL code runs as written (the same math): compiling would start worker threads,
    # which the audit refuses as code doing more than computing its term, and costs seconds per shape
    os.environ["TORCHDYNAMO_DISABLE"] = "1"
    request = json.loads(Path(request_path).read_text())
    limit_memory(request["memory_limit"])
    pid, cwd = os.getpid(), os.getcwd()
    try:
        report = _audit_request(request)
    except SystemExit as stop:  # sys.exit at the import of the user's module
        report = Report([], [f"{Target(**request['target'])}: the KL code called sys.exit({stop.code!r})"])
    if os.getpid() != pid:  # a copy of this process forked by the user's code: it does not report
        os._exit(0)
    report = _misbehaviour(Target(**request["target"]), cwd) or report
    partial = Path(response_path + ".partial")
    partial.write_text(json.dumps(report.to_dict()))
    partial.replace(response_path)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(0)


def _audit_request(request: dict) -> Report:
    """The audit the parent asked for, in this process."""
    try:
        import torch  # noqa: F401 - a torch that is found but does not import is one line, not a traceback
    except ImportError as error:
        from klaudit.audit import TORCH_MISSING

        return Report([], [f"{TORCH_MISSING} ({error})"])
    overrides = {name: Role(role) for name, role in request["overrides"].items()}
    used_path = request["used_path"]

    def combined_uses() -> list[str]:
        """The combined placements (loss+reward, loss+future) the parent finds the user's code uses."""
        used = _read_used_placements(used_path, request["timeout"]) if used_path else []
        return [placement for placement in used if "+" in placement]

    return audit_target(Target(**request["target"]), overrides=overrides, placements=request["placements"],
                        model_dir=request["model_dir"], device=request["device"],
                        progress=lambda message: print(f"progress: {message}", file=sys.stderr, flush=True),
                        also=combined_uses, current_old=request["current_old"],
                        monte_carlo=MonteCarlo(**request["monte_carlo"]) if request["monte_carlo"] else None)


def _misbehaviour(target: Target, cwd: str) -> Report | None:
    """An error report when the user's code changed this process beyond computing its term: a thread
    still running, a working directory other than `cwd` (the audit's rows are then not reported)."""
    running = [thread.name for thread in threading.enumerate()
               if thread.is_alive() and not thread.daemon and thread is not threading.main_thread()]
    if running:
        more = f" and {len(running) - 1} more" if len(running) > 1 else ""
        what = f"started a thread that was still running when the audit ended ({running[0]}{more})"
    elif os.getcwd() != cwd:
        what = f"changed the working directory (to {os.getcwd()})"
    else:
        return None
    return Report([], [f"{target}: the KL code {what}; a KL function must only compute its term, so check-grad "
                       f"does not report this audit"])


# ----- in the parent -----


def run_isolated(target: Target, *, overrides: dict, placements: Sequence[str] | None, timeout: float,
                 memory_limit: int | None, model_dir: str | None, device: str, progress: Progress,
                 monte_carlo: MonteCarlo | None = None) -> Report:
    """Audit one target in a child process and mark the placement the user's code uses; the lint
    analysis that finds it runs in this process while the child audits."""
    with tempfile.TemporaryDirectory(prefix="klaudit-") as scratch, ThreadPoolExecutor(max_workers=1) as pool:
        used_path = Path(scratch, "used.json")
        finding = pool.submit(_write_used_placements, target, used_path)
        report = _audit_in_child(target, overrides=overrides, placements=placements, timeout=timeout,
                                 memory_limit=memory_limit, model_dir=model_dir, device=device, progress=progress,
                                 monte_carlo=monte_carlo,
                                 scratch=Path(scratch), used_path=used_path)
        used = finding.result()
    for row in report.results:
        row.used = row.placement in used
    return report


def _write_used_placements(target: Target, used_path: Path) -> set[str]:
    """`used_placements(target)`, also written to `used_path` (atomically) for the child to read; the
    file is written whatever happens, so that the child never waits in vain."""
    used: set[str] = set()
    try:
        used = used_placements(target)
    finally:
        partial = used_path.with_suffix(".partial")
        partial.write_text(json.dumps(sorted(used)))
        partial.replace(used_path)
    return used


def _read_used_placements(used_path: str, timeout: float) -> list[str]:
    """In the child: the placements the parent found the user's code uses (it writes them while the
    child audits); nothing if they do not come within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not os.path.exists(used_path):
        if time.monotonic() > deadline:
            return []
        time.sleep(0.05)
    return json.loads(Path(used_path).read_text())


def child_command(request_path: str, response_path: str) -> list[str]:
    """The child's command line. `python -m` would put the working directory first on sys.path, where a
    folder named `klaudit` (a clone's parent, a checkout) shadows the installed package; the child
    instead puts the directory klaudit was imported from there, and the user's code is found by path."""
    installed_root = str(Path(__file__).resolve().parents[2])
    boot = ("import sys; sys.path[0] = sys.argv[1]; from klaudit.audit.runner import _child; "
            "_child(sys.argv[2], sys.argv[3])")
    return [sys.executable, "-c", boot, installed_root, request_path, response_path]


def _audit_in_child(target: Target, *, overrides: dict, placements: Sequence[str] | None, timeout: float,
                    memory_limit: int | None, model_dir: str | None, device: str, progress: Progress,
                    scratch: Path, used_path: Path, monte_carlo: MonteCarlo | None = None) -> Report:
    """Audit one target in a child process; a timeout, a crash, an early end or a process left running is
    an error line. With `placements` None the child also audits the combined placements (loss+reward, loss+future) the
    parent finds the user's code uses, as a configuration of their own (kl-math.md R-C, R-B)."""
    request_path, response_path = scratch / "request.json", scratch / "response.json"
    path = target.path
    if target.source is not None:  # a function cut out of the user's file: audited as a file of its own
        path = str(scratch / f"{target.qualname}.py")
        Path(path).write_text(target.source, encoding="utf-8")
        placements = placements or ((target.placement,) if target.placement else None)
    request_path.write_text(json.dumps({
        "target": {"path": path, "module": target.module, "qualname": target.qualname, "label": target.label,
                   "origin": target.path if target.source is not None else target.origin},
        "overrides": {name: role.value for name, role in overrides.items()},
        "placements": list(placements) if placements else None, "model_dir": model_dir, "device": device,
        "used_path": None if placements else str(used_path), "timeout": timeout, "memory_limit": memory_limit,
        # a step cut out of a trainer is audited on-policy, as the lint reads it (pi_old = pi)
        "current_old": target.source is not None,
        "monte_carlo": dataclasses.asdict(monte_carlo) if monte_carlo is not None else None,
    }))
    progress.message = f"checking {target}"
    outcome = run_confined(child_command(str(request_path), str(response_path)), timeout)
    if outcome.returncode is None:
        return Report([], [f"{target}: timed out after {timeout:g} s (raise it with --timeout)"])
    if outcome.leftover:
        return Report([], [f"{target}: the KL code started a process that was still running when the audit ended "
                           f"(it was killed); a KL function must only compute its term, so check-grad does not "
                           f"report this audit"], [], [outcome.output])
    if not response_path.is_file():
        report = Report([], [_ended_early(target, outcome.returncode, outcome.output)])
        report.details.append(outcome.output)
        return report
    try:
        return Report.from_dict(json.loads(response_path.read_text()))
    except (ValueError, TypeError) as error:
        return Report([], [f"{target}: the audit process wrote an unreadable report ({error})"])


def _ended_early(target: Target, returncode: int, output: str) -> str:
    """The error line for a child that ended with `returncode` and `output` but no report."""
    if returncode < 0:
        name = signal.Signals(-returncode).name
        cause = " (out of memory?)" if name == "SIGKILL" else ""
        message = f"{target}: the audit process was killed by {name}{cause} before it reported"
    else:
        message = (f"{target}: the audit process ended with status {returncode} before it reported "
                   f"(does the KL code end the process, e.g. with os._exit?)")
    lines = [line for line in output.splitlines() if line.strip() and not line.startswith("progress: ")]
    return _one_line(message + (f": {lines[-1]}" if lines else ""))


def file_targets(path: str, report: Report) -> list[Target]:
    """What check-grad audits for `PATH.py`: its KL functions that can be called alone, the KL terms
    computed inline in its other functions (cut out: klaudit.audit.inline), and the helpers of other
    files whose estimators its losses and rewards hold (those the lint traces there). What cannot be
    audited goes into the report's notes, and an error when nothing can."""
    from klaudit.audit.inline import slices_of
    from klaudit.lint.query import kl_sites

    try:
        found = discover_kl_functions(path)
    except DiscoveryError as error:
        report.errors.append(str(error))
        return []
    try:
        inline, helpers = kl_sites(path)
    except (SyntaxError, OSError, RecursionError):
        inline, helpers = [], []
    slices, failures = slices_of(path, [site for site in inline if site.qualname not in found.auditable])
    sliced = {f"{path}::{piece.qualname} " for piece in slices}
    report.notes += [line for line in found.skipped if not any(line.startswith(s) for s in sliced)] + failures
    targets = [Target(path=path, qualname=qualname) for qualname in found.auditable]
    targets += dict.fromkeys(Target(path=path, qualname=piece.name, label=str(piece), source=piece.source,
                                    placement=piece.placement) for piece in slices)  # once for estimators of
    # one cut (`k3 if use_k3 else k1`: the lint reports an origin for each)
    here = str(Path(path).resolve())
    targets += _helper_targets(helpers, here, found.auditable, report)
    if not targets:
        report.errors.append(f"{path}: no KL function that can be called alone (one that takes the policy's "
                             f"log-probs or logits and returns a KL term or a loss holding one); name one with "
                             f"PATH.py::function and --bind")
    return targets


def _helper_targets(chains: Sequence[tuple[tuple[str, str], ...]], here: str, own: Sequence[str],
                    report: Report) -> list[Target]:
    """For each term the file's losses and rewards take from helpers (`chains`: the functions whose results
    carry it, outermost first), the first one that can be audited alone, where that is another file's (this
    file's auditable functions are targets already); a note where none can."""
    auditable: dict[str, list[str]] = {here: list(own)}
    targets: dict[Target, None] = {}
    for chain in chains:
        for helper_path, _ in chain:
            if helper_path not in auditable:
                try:
                    auditable[helper_path] = discover_kl_functions(helper_path).auditable
                except DiscoveryError:
                    auditable[helper_path] = []
        chosen = next(((path, name) for path, name in chain if name in auditable[path]), None)
        if chosen is None:
            outer_path, outer = chain[0]
            if outer_path != here:  # this file's own: discovery's note says why already
                report.notes.append(f"{_as_given(outer_path)}::{outer} returns a KL estimate this file uses but cannot "
                                    f"be called alone")
        elif chosen[0] != here:
            targets[Target(path=_as_given(chosen[0]), qualname=chosen[1])] = None
    return list(targets)


def _as_given(path: str) -> str:
    """A helper's file as the user would name it: relative to the working directory where it lies below it."""
    relative = os.path.relpath(path)
    return path if relative.startswith("..") else relative


def run(targets: Sequence[str], *, overrides: dict | None = None, placements: Sequence[str] | None = None,
        timeout: float = DEFAULT_TIMEOUT, memory_limit: int | None = None, model_dir: str | None = None,
        device: str = "cpu", show_progress: bool = False, monte_carlo: MonteCarlo | None = None) -> Report:
    """Audit every target in turn (files expanded by discovery) and merge the reports. Each runs in a
    child process confined to `timeout` seconds and `memory_limit` MiB (None: half the physical memory;
    0: no limit)."""
    report = Report()
    resolved: list[Target] = []
    for text in targets:
        try:
            target = parse_target(text)
        except TargetError as error:
            report.errors.append(str(error))
            continue
        if target.path is not None and target.qualname is None:
            resolved += [found for found in file_targets(target.path, report) if found not in resolved]
        else:
            resolved.append(target)
    progress = Progress(show_progress)
    try:
        for target in resolved:
            report.extend(run_isolated(target, overrides=overrides or {}, placements=placements, timeout=timeout,
                                       memory_limit=memory_limit_bytes(memory_limit),
                                       model_dir=model_dir, device=device, progress=progress,
                                       monte_carlo=monte_carlo))
    finally:
        progress.close()
    return report

