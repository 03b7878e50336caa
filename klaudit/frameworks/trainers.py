"""Which trainer a TRL configuration is handed to: TRL's, or one the project wrote itself.

TRL's flags (beta, loss_type, use_bias_correction_kl, ...) say what TRL's GRPOTrainer does with them. A project
that builds TRL's `GRPOConfig` but trains with a trainer class of its own (yynil/RWKVInside's `GRPOTrainer(Trainer)`
in rl_trainer.py, a MiniOneRec-style `ReReTrainer(Trainer)`) runs its own loss, which the lint reads where it is
written: the configuration then says nothing about TRL's loss, and its flags are not judged as TRL's.

A class is the project's own when the linted code defines it (outside a `trl` package) and none of its bases,
followed through the project's classes, is TRL's: a base the defining module imports from `trl`, or writes as
`trl.Name`. Read from the text alone.
"""

from __future__ import annotations

import ast
import builtins
import re
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path

from klaudit.frameworks.import_lines import imported_names
from klaudit.frameworks.python_values import binds

# `class Name(Base, metaclass=M):`: the name and its bases as written, read from the text alone
CLASS_HEADER = re.compile(r"^[ \t]*class[ \t]+(\w+)[ \t]*(?:\(([^)]*)\))?[ \t]*:", re.MULTILINE)


def own_trainers(sources: Mapping[str, str]) -> frozenset[str]:
    """The names of the classes the linted code defines whose every definition derives from no TRL class."""
    bases_of: dict[str, list[tuple[set[str], bool]]] = defaultdict(list)  # name -> (project bases, reaches TRL)
    for path, text in sources.items():
        if "class" not in text or "trl" in Path(path).parts[:-1]:
            continue
        from_trl = {local for local, (top, _) in imported_names(text).items() if top == "trl"}
        for name, bases in CLASS_HEADER.findall(text):
            written = [base.split("=")[0].strip() for base in bases.split(",") if base.strip()]
            trl = any(base.startswith("trl.") or base in from_trl for base in written)
            bases_of[name].append(({base.rsplit(".", 1)[-1] for base in written}, trl))
    own: set[str] = set()
    changed = True
    while changed:  # a class is own when each definition's bases are no TRL class and no project class that is not own
        changed = False
        for name, definitions in bases_of.items():
            if name not in own and all(not trl and all(base in own or base not in bases_of for base in bases)
                                       for bases, trl in definitions):
                own.add(name)
                changed = True
    return frozenset(own)


def package_subclasses(sources: Mapping[str, str], package: str, base: str) -> frozenset[str]:
    """The names of the classes the linted code defines (outside a `package` folder) that derive from the package's
    `base` (`class CustomGRPOTrainer(GRPOTrainer)` in a module that imports it from `trl`; `class
    RedteamPPOConfig(PPOConfig)` of trlx's), directly or through one another."""
    headers: list[tuple[str, set[str]]] = []  # (name, bases by their last name), the package's base as `<package>.`
    own = f"{package}."
    for path, text in sources.items():
        if base not in text or package in Path(path).parts[:-1]:
            continue
        imported = {local for local, (top, name) in imported_names(text).items() if top == package and name == base}
        for name, bases in CLASS_HEADER.findall(text):
            written = [entry.split("=")[0].strip() for entry in bases.split(",") if entry.strip()]
            headers.append((name, {own if entry == f"{own}{base}" or entry in imported else entry.rsplit(".", 1)[-1]
                                   for entry in written}))
    found = {own}
    grown = True
    while grown:
        grown = False
        for name, bases in headers:
            if name not in found and bases & found:
                found.add(name)
                grown = True
    return frozenset(found - {own})


def trains_with_own_trainers(source: str, own: frozenset[str]) -> bool:
    """Whether the module hands its training arguments (`args=`) only to the project's own trainer classes, and to
    at least one: `GRPOTrainer(model=..., args=training_args)` with `from rl_trainer import GRPOTrainer`."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError):
        return False
    from_trl = {local for local, (top, _) in imported_names(source).items() if top == "trl"}
    trainers = {_called_name(node.func) for node in ast.walk(tree)
                if isinstance(node, ast.Call) and any(keyword.arg == "args" for keyword in node.keywords)}
    return bool(trainers) and trainers <= own - from_trl


# The keywords TRL's GRPOTrainer takes in some release (0.14 to 1.16, read from the wheels; it takes no **kwargs)
GRPO_TRAINER_KEYWORDS = frozenset({
    "model", "reward_funcs", "args", "train_dataset", "eval_dataset", "processing_class", "reward_processing_classes",
    "callbacks", "optimizers", "peft_config", "quantization_config", "tools", "rollout_func", "environment_factory"})


# What Unsloth's patched trainers take besides: `tokenizer`, which they rename `processing_class` (any other keyword
# they hand on to TRL's constructor, which refuses it)
UNSLOTH_RENAMED = frozenset({"tokenizer"})


def trains_only_refused_grpo_trainers(source: str, unsloth: bool = False) -> bool:
    """Whether every call of TRL's GRPOTrainer in the module, and every other call it hands training arguments to
    (`args=`), is TRL's GRPOTrainer given a keyword no release takes (`GRPOTrainer(tokenizer=...)`, which
    Hcoder10/gamepulse writes; under Unsloth, which renames that one, `GRPOTrainer(beta=...)` as DonPex writes) or
    unpacking a name the module never binds (Efficient-Reasoner's `GRPOTrainer(**train_kwargs)` beside its
    `trainer_kwargs`), and there is one: each raises a TypeError or a NameError and nothing trains."""
    taken = GRPO_TRAINER_KEYWORDS | (UNSLOTH_RENAMED if unsloth else frozenset())
    local = {name for name, (top, original) in imported_names(source).items()
             if top == "trl" and original == "GRPOTrainer"}
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError):
        return False
    bound = _bound_names(tree)

    def grpo_trainer(call: ast.Call) -> bool:
        return (isinstance(call.func, ast.Name) and call.func.id in local
                or isinstance(call.func, ast.Attribute) and call.func.attr == "GRPOTrainer"
                and isinstance(call.func.value, ast.Name) and call.func.value.id == "trl")

    def refused(call: ast.Call) -> bool:
        return any(keyword.arg is not None and keyword.arg not in taken
                   or keyword.arg is None and isinstance(keyword.value, ast.Name) and bound is not None
                   and keyword.value.id not in bound
                   for keyword in call.keywords)

    handed = [node for node in ast.walk(tree) if isinstance(node, ast.Call)
              and (any(keyword.arg == "args" for keyword in node.keywords) or grpo_trainer(node))]
    return bool(handed) and all(grpo_trainer(call) and refused(call) for call in handed)


def _bound_names(tree: ast.Module) -> frozenset[str] | None:
    """Every name the module binds anywhere (`python_values.binds`, parameters, `def` and `class` names, `global`
    and `nonlocal` ones), with Python's builtins; None where it imports `*` (any name may be bound)."""
    names = set(dir(builtins))
    for node in ast.walk(tree):
        if isinstance(node, ast.alias) and node.name == "*":
            return None
        if (bound := binds(node)) is not None:
            names.add(bound)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            names.update(node.names)
    return frozenset(names)


def trains_trls_grpo_trainer(source: str) -> bool:
    """Whether the module imports TRL's GRPOTrainer and names it beyond the import (calls it, binds it to a variable,
    derives from it): a script that imports it but builds only a trainer of its own (`trainer_cls =
    KimiAudioGRPOTrainer`) does not run TRL's loss. A module Python rejects is taken at its import."""
    local = {name for name, (top, original) in imported_names(source).items()
             if top == "trl" and original == "GRPOTrainer"}
    if not local:
        return False
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError):
        return True
    return any(isinstance(node, ast.Name) and node.id in local for node in ast.walk(tree))


def _called_name(node: ast.expr) -> str | None:
    """`Trainer` of `Trainer(...)` and `rl_trainer.Trainer(...)`; None for `trl.GRPOTrainer(...)` and other callees."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and not (isinstance(node.value, ast.Name) and node.value.id == "trl"):
        return node.attr
    return None
