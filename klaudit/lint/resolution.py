"""Which function or class of the linted tree a call names: by name in its module, through its imports
(`from x import f`, `from x import *`, a package's re-export) and through a class's bases."""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from klaudit.lint import roles
from klaudit.lint.project import installed_model
from klaudit.lint.syntax import dotted

if TYPE_CHECKING:
    from pathlib import Path

    from klaudit.lint.modules import Module
    from klaudit.lint.project import Project


class NameResolution:
    """The lookups of klaudit.lint.modules.Analyzer: what a call's target is, parsing another module
    only when its text may define the name looked up (parsing is the costly part)."""

    project: Project

    def module_at(self, path: Path) -> Module | None:
        raise NotImplementedError  # the Analyzer's: a module parsed once per worker

    def resolve_class(self, module: Module, func_node: cst.CSTNode, imports: bool = True, base: bool = False):
        """(module, class definition) for a class of the linted tree called by name, or None.

        With `imports` False only classes of `module` itself are considered, and those klaudit has a model of
        (Liger's fused GRPO loss); `base`: the class is a base of one of `module`'s, looked up in any module
        (parsing one that has no KL words)."""
        if not isinstance(func_node, cst.Name):
            return None
        name = func_node.value
        if name in module.classes:
            return module, module.classes[name][0]
        if name in module.imports and (imports or installed_model(module.imports[name][0]) is not None):
            source, attr, level = module.imports[name]
            return self._exported_class(self._import(module, source, level, attr, base), attr, base) if attr else None
        elif imports:
            target = self._star_source(module, name)
            if target is not None and name in target.classes:
                return target, target.classes[name][0]
        return None

    def method_of(self, module: Module, cls: str, name: str, depth: int = 3):
        """(module, method, class) for `self.name` in class `cls`, looked up in its bases when it does not define it."""
        classdef, methods = module.classes.get(cls, (None, {}))
        if name in methods:
            return module, methods[name], cls
        if classdef is None or depth <= 0:
            return None
        for base in classdef.bases:
            # a base class is looked up whatever its module's words: its methods run on this class's values
            found = self.resolve_class(module, base.value, base=True)
            if found is not None:
                hit = self.method_of(found[0], found[1].name.value, name, depth - 1)
                if hit is not None:
                    return hit
        return None

    def bases_elsewhere(self, module: Module, cls: str, depth: int = 3) -> list[tuple[Module, str]]:
        """(module, class name) of each base class of `cls`, and of theirs, that another module of the linted tree
        defines, nearest first (`class PPOTrainer(RLTrainer)` with RLTrainer imported from rl_trainer.py)."""
        classdef = module.classes.get(cls, (None, {}))[0]
        found: list[tuple[Module, str]] = []
        for base in classdef.bases if classdef is not None and depth > 0 else ():
            hit = self.resolve_class(module, base.value, base=True)
            if hit is not None and hit[0] is not module:
                found.append((hit[0], hit[1].name.value))
            if hit is not None:
                found += self.bases_elsewhere(hit[0], hit[1].name.value, depth - 1)
        return found

    def resolve(self, module: Module, func_node: cst.CSTNode, cls: str | None, imports: bool = True):
        """(module, function, class) for a call target inside the linted tree, or None.

        With `imports` False only functions of `module` itself are considered."""
        if type(func_node) is cst.Name:  # type(): see klaudit.lint.syntax
            name = func_node.value
            if name in module.functions:
                return module, module.functions[name], None
            if name in module.imports and imports:
                source, attr, level = module.imports[name]
                if attr is None:
                    return None
                return self._exported(self._import(module, source, level, attr), attr)
            if imports:
                return self._star_imported(module, name)
            return None
        if type(func_node) is cst.Attribute:
            attr = func_node.attr.value
            base = func_node.value
            if type(base) is cst.Name and base.value in ("self", "cls") and cls is not None:
                return self.method_of(module, cls, attr)
            named = type(base) is cst.Name and (base.value in module.classes or base.value in module.imports)
            found = self.resolve_class(module, base, imports) if named else None  # `GRPOLoss.compute(...)`
            if found is not None:
                target, classdef = found
                methods = target.classes[classdef.name.value][1]
                if attr in methods:
                    return target, methods[attr], classdef.name.value
            if type(base) is cst.Name and base.value not in ("self", "cls") and not named:
                own = self.method_of_a_local(module, attr)
                if own is not None:
                    return own
            if type(base) is cst.Attribute and imports:  # `self.policy.compute_kl(...)`: an object the instance holds
                held = self.method_of_a_local(module, attr) or self.method_of_an_imported_class(module, attr)
                if held is not None:
                    return held
            base_name = dotted(base)
            head = base_name.split(".")[0]
            if head in module.imports and imports:
                imp_dotted, imp_attr, level = module.imports[head]
                full = imp_dotted if imp_attr is None else (f"{imp_dotted}.{imp_attr}" if imp_dotted else imp_attr)
                rest = base_name.split(".")[1:]
                target = self._import(module, ".".join([full] + rest), level, attr)
                if target is not None and attr in target.functions:
                    return target, target.functions[attr], None
        return None

    @staticmethod
    def method_of_a_local(module: Module, attr: str):
        """(module, method, class) for `lm.seq_logprob(...)` on a local object, where one class of `module` alone
        defines a method of that name and the name speaks of log-probs, KL or a loss (a from-scratch trainer's
        own model class: `policy.seq_logprob(x)`, `ref.seq_logprob(x)`); else None."""
        owners = module.method_owners.get(attr, ())
        if len(owners) != 1 or not (roles.speaks_of_logprobs(attr) or roles.might_contain_kl(attr)
                                    or "loss" in attr.lower()):
            return None
        return module, module.classes[owners[0]][1][attr], owners[0]

    def method_of_an_imported_class(self, module: Module, attr: str):
        """(module, method, class) for `self.policy.compute_kl_divergence(...)`, where exactly one class that
        `module` imports by name defines a method `attr` whose name speaks of log-probs, KL or a loss, and none of
        `module`'s own classes does (a trainer calling its policy class's KL helper); else None."""
        if module.method_owners.get(attr) or not (roles.speaks_of_logprobs(attr) or roles.might_contain_kl(attr)
                                                  or "loss" in attr.lower()):
            return None
        found = []
        for name, (source, imported, level) in module.imports.items():
            if imported is None or not name[:1].isupper():
                continue  # a class is imported by its (capitalised) name
            hit = self._exported_class(self._import(module, source, level, imported), imported, False)
            if hit is not None and attr in hit[0].classes[hit[1].name.value][1]:
                found.append((hit[0], hit[0].classes[hit[1].name.value][1][attr], hit[1].name.value))
        return found[0] if len(found) == 1 else None

    def _star_imported(self, module: Module, name: str):
        """(module, function, None) for `name` brought in by a `from x import *` of `module`, else None."""
        target = self._star_source(module, name)
        return self._exported(target, name) if target is not None else None

    def _star_source(self, module: Module, name: str) -> Module | None:
        """The module a `from x import *` of `module` brings `name` from: the last such import whose module
        defines it as a function or class wins, as in Python."""
        for source, level in reversed(module.star_imports):
            target = self._import(module, source, level, name)
            if target is not None and (name in target.functions or name in target.classes):
                return target
        return None

    def _exported(self, target: Module | None, name: str, hops: int = 2):
        """(module, function, None) for `name` defined in `target`, or re-exported there from another
        module of the tree (`from .loss import aggregate_loss` in a package's __init__), else None."""
        if target is None:
            return None
        if name in target.functions:
            return target, target.functions[name], None
        source, attr, level = target.imports.get(name, ("", None, 0))
        if attr is None or hops <= 0:
            return None
        return self._exported(self._import(target, source, level, attr), attr, hops - 1)

    def _exported_class(self, target: Module | None, name: str, any_text: bool, hops: int = 2):
        """(module, class definition) for class `name` defined in `target` or re-exported there from another
        module of the tree (`from .rl_trainer import RLTrainer` in a package's __init__), else None."""
        if target is None:
            return None
        if name in target.classes:
            return target, target.classes[name][0]
        source, attr, level = target.imports.get(name, ("", None, 0))
        if attr is None or hops <= 0:
            return None
        return self._exported_class(self._import(target, source, level, attr, any_text), attr, any_text, hops - 1)

    def _import(self, module: Module, name: str, level: int, wanted: str, any_text: bool = False) -> Module | None:
        """The module `name` imported by `module`, parsed only if its text may define `wanted` (the
        function or class looked up in it, or a package's __init__ re-exports it): parsing other
        modules is the costly part. `any_text`: whatever its vocabulary."""
        path = self.project.module_path(name, module.path, level)
        if path is None or not self.project.may_define(path, wanted, any_text):
            return None
        return self.module_at(path)
