"""Import the user's module where some of its dependencies do not import, with those replaced by stubs.

A trainer module imports far more than its KL code uses (peft, flash_attn, deepspeed, ray, vllm, a
transformers submodule of another version ...). In the child process only, `import_with_stubs` retries
the import and, each time a third-party module fails to import, serves that module from `StubFinder`
instead: a module whose every attribute is a `Stub`. While the user's module executes, stubs let
module-level code through (decorators return what they decorate, base classes drop out, feature
tests read False); once it is imported, any use of a stub raises `StubbedDependencyError`, which
names the stubbed module. The user's own package, torch and klaudit are never stubbed (but a part of
torch that needs a package missing here, torch.utils.tensorboard, is).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import inspect
import re
import sys
import types
from collections.abc import Callable, Collection

NEVER_STUBBED = ("torch", "klaudit")
# Parts of torch that need a package of their own (tensorboard): stubbed when it is missing here, since no
# KL term computes with them (a trainer imports SummaryWriter at the top of the module that holds its loss)
OPTIONAL_TORCH_PARTS = ("torch.utils.tensorboard",)


class StubbedDependencyError(ImportError):
    """The audited code used something from a module that did not import here and was stubbed."""


class StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves the modules in `reasons` (and their submodules) as stub modules; `importing` is True while
    the user's module executes, when stubs tolerate module-level use."""

    def __init__(self) -> None:
        self.reasons: dict[str, str] = {}  # stubbed module -> why it did not import
        self.importing = True

    def stubbed_root(self, fullname: str) -> str | None:
        return next((name for name in self.reasons if fullname == name or fullname.startswith(name + ".")), None)

    def find_spec(self, fullname, path=None, target=None):
        if self.stubbed_root(fullname) is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        return StubModule(spec.name, self)

    def exec_module(self, module) -> None:
        module.__path__ = []

    def add(self, name: str, reason: str) -> None:
        """Stub `name` from now on, forgetting what of it was imported (its parent keeps no attribute)."""
        self.reasons[name] = reason
        for loaded in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
            del sys.modules[loaded]
        parent, _, child = name.rpartition(".")
        if parent in sys.modules and hasattr(sys.modules[parent], child):
            try:
                delattr(sys.modules[parent], child)
            except AttributeError:
                pass

    def used(self, name: str) -> StubbedDependencyError:
        root = self.stubbed_root(name) or name
        return StubbedDependencyError(
            f"the KL code uses {name}, but {root} does not import here ({self.reasons.get(root, 'missing')}) and "
            f"was stubbed: install {root.split('.')[0]} to audit this code")


class StubModule(types.ModuleType):
    """A stubbed module: every public attribute is a Stub."""

    def __init__(self, name: str, finder: StubFinder) -> None:
        super().__init__(name)
        self.__finder = finder
        self.__version__ = "0.0.0"  # version checks at import read the stubbed package as too old to use

    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return Stub(f"{self.__name__}.{attr}", self.__finder)

    def __mro_entries__(self, bases):
        if not self.__finder.importing:
            raise self.__finder.used(self.__name__)
        return ()  # `class PPOTrainer(BaseTrainer)` with BaseTrainer stubbed as a name its package lacks


class Stub:
    """Something imported from a stubbed module: tolerated by module-level code, an error once used."""

    def __init__(self, name: str, finder: StubFinder) -> None:
        self._name = name
        self._finder = finder

    def __repr__(self) -> str:
        return f"<stub of {self._name}>"

    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return Stub(f"{self._name}.{attr}", self._finder)

    def _tolerated(self) -> None:
        if not self._finder.importing:
            raise self._finder.used(self._name)

    def __call__(self, *args, **kwargs):
        self._tolerated()
        if len(args) == 1 and not kwargs and (inspect.isfunction(args[0]) or inspect.isclass(args[0])):
            return args[0]  # a decorator: the decorated function stays the user's own
        return Stub(f"{self._name}()", self._finder)

    def __mro_entries__(self, bases):
        self._tolerated()
        return ()  # `class Actor(StubbedBase)`: the class is built without it

    def __getitem__(self, key):
        self._tolerated()
        return Stub(f"{self._name}[...]", self._finder)

    def __or__(self, other):
        self._tolerated()
        return self

    __ror__ = __or__

    def __bool__(self) -> bool:
        self._tolerated()
        return False  # `if flash_attn_available:` at import: the stubbed feature is absent

    def __iter__(self):
        raise self._finder.used(self._name)

    def _refuse(self, *args, **kwargs):
        raise self._finder.used(self._name)

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __rtruediv__ = _refuse
    __lt__ = __le__ = __gt__ = __ge__ = __neg__ = __len__ = __float__ = __int__ = __index__ = _refuse


def import_with_stubs(do_import: Callable[[], types.ModuleType], own: Collection[str], audited: str = "",
                      attempts: int = 40) -> tuple[types.ModuleType, dict[str, str]]:
    """`do_import()`, retried with each third-party module that fails to import stubbed; returns the
    module and {stubbed module: why it did not import}. `own`: top-level packages not stubbed (the
    user's), except, where the audited module's dotted name `audited` is given, a module of theirs that is
    neither it nor a package holding it (NeMo-RL's policy package asserts a transformers release at import;
    the loss utilities that import it do not need it). A finder that stubbed something stays installed, so
    that a lazy import in the KL code meets the stub too."""
    finder = StubFinder()
    sys.meta_path.insert(0, finder)
    try:
        for _ in range(attempts):
            try:
                return do_import(), dict(finder.reasons)
            except Exception as error:  # noqa: BLE001 - any failure of a dependency's import is one to stub
                name = failing_dependency(error, own, audited)
                if name in sys.modules and audited and not isinstance(error, ImportError):
                    # it had imported, and a call into it raised (a config fetched from the Hub in a class body):
                    # the user's module that made the call is stubbed, unless it is the audited one
                    name = _last_protected(error, own)
                    name = None if name is None or _holds(name, audited) else name
                if name is None or name in finder.reasons:
                    raise
                finder.add(name, f"{type(error).__name__}: {' '.join(str(error).split())}"[:160])
        return do_import(), dict(finder.reasons)
    finally:
        finder.importing = False
        if not finder.reasons:
            sys.meta_path.remove(finder)


def failing_dependency(error: BaseException, protected: Collection[str], audited: str = "") -> str | None:
    """The third-party module whose import raised `error`: the missing module of a ModuleNotFoundError,
    the module a name was not found in, or else the first module the traceback enters after the last
    frame of a protected package, or else what the error's cause names (a lazy module that re-raises);
    None when that is protected, torch, klaudit or the standard library. With `audited` given, a protected
    module that raised (the last of its frames) or was missing is returned too, unless it is `audited` or a
    package holding it."""
    name = getattr(error, "name", None) if isinstance(error, ImportError) else None
    if name is None:
        name = _entered_after_protected(error, protected)
    cause = error.__cause__ or error.__context__
    if (name is None or name.split(".")[0] in protected) and isinstance(cause, Exception):
        found = failing_dependency(cause, protected, audited)  # a lazy module re-raises the ImportError as its own
        if found is not None:
            return found
    if name is None and audited:
        name = _last_protected(error, protected)
    top = name.split(".")[0] if name else None
    if name is not None and top in protected and audited and not _holds(name, audited):
        return name
    missing = _MISSING_NAME.match(str(error)) if isinstance(error, ImportError) else None
    if name is not None and top in protected and missing is not None:
        return f"{name}.{missing.group(1)}"  # `from . import BaseTrainer`, which the package it holds lacks
    if top is None or top in protected or top in sys.stdlib_module_names:
        return None
    if top in NEVER_STUBBED:
        return name if name in OPTIONAL_TORCH_PARTS else None
    return name


_MISSING_NAME = re.compile(r"cannot import name '(\w+)' from")


def _holds(name: str, audited: str) -> bool:
    """Whether module `name` is the audited module or a package it is in."""
    return audited == name or audited.startswith(name + ".")


def _last_protected(error: BaseException, protected: Collection[str]) -> str | None:
    """The module of the last traceback frame in a protected package: the user's module that raised."""
    tb, found = error.__traceback__, None
    while tb is not None:
        module = tb.tb_frame.f_globals.get("__name__", "")
        found = module if module.split(".")[0] in protected else found
        tb = tb.tb_next
    return found


def _entered_after_protected(error: BaseException, protected: Collection[str]) -> str | None:
    modules = []
    tb = error.__traceback__
    while tb is not None:
        modules.append(tb.tb_frame.f_globals.get("__name__", ""))
        tb = tb.tb_next
    last_own = max((i for i, m in enumerate(modules) if m.split(".")[0] in protected), default=None)
    if last_own is None:
        return None
    for module in modules[last_own + 1:]:
        if not module.startswith(("importlib", "_frozen_importlib")):
            return module  # the module whose own code failed (a submodule alone where only it fails)
    return None
