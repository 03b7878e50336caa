"""A module that imports a submodule its project's package lacks fails at import, and its KL code never trains.

xclovehsy/passformer (hundred-and-sixth set): src/grpo/train.py opens with `from src.rl.llvm_wrapper import
llvm_wrapper`, but the project's `src/` package (it has an `__init__.py`) holds no `rl`: the module moved to
`src/grpo/`. Run from the root (`python -m src.grpo.train`), the project's own `src` is found and the import fails,
so the k3 loss below it never trains (reviewed fp). A module that sets up the path itself may find another `src`.
"""

from __future__ import annotations

import pytest

from klaudit.config import Settings
from klaudit.lint.engine import lint_paths
from klaudit.lint.unimportable import imports_a_missing_submodule

TRAIN = """\
import torch
{setup}from src.{module} import helper


def grpo_loss(logp, ref_logp, advantages, beta=0.04):
    k3 = torch.exp(ref_logp - logp) - (ref_logp - logp) - 1
    return (-(advantages * logp) + beta * k3).mean()
"""


def _project(root, module, setup=""):
    for folder in ("src", "src/grpo", "src/utils"):
        (root / folder).mkdir(parents=True, exist_ok=True)
        (root / folder / "__init__.py").write_text("")
    (root / "src" / "utils" / "tools.py").write_text("def helper():\n    return 1\n")
    train = root / "src" / "grpo" / "train.py"
    train.write_text(TRAIN.format(module=module, setup=setup))
    return train


@pytest.mark.parametrize("module, setup, missing", [
    ("rl.llvm_wrapper", "", True),  # no src/rl: the import fails
    ("utils.tools", "", False),  # the project has it
    ("utils._version", "", False),  # a module a build writes
    ("rl.llvm_wrapper", "import sys\nsys.path.insert(0, '/home/me/Compiler')\n", False),  # another src may come first
])
def test_an_import_of_a_submodule_the_projects_package_lacks_fails(tmp_path, module, setup, missing):
    train = _project(tmp_path, module, setup)
    assert imports_a_missing_submodule(str(train), train.read_text()) is missing


def test_the_kl_loss_of_a_module_that_cannot_be_imported_is_not_reported(tmp_path):
    _project(tmp_path, "rl.llvm_wrapper")
    assert not [f for f in lint_paths([str(tmp_path)], settings=Settings(root=tmp_path), jobs=1).findings
                if f.code.startswith("KL0") and f.code != "KL000"]
    (tmp_path / "src" / "rl").mkdir()
    (tmp_path / "src" / "rl" / "llvm_wrapper.py").write_text("def helper():\n    return 1\n")
    assert "KL002" in {f.code for f in lint_paths([str(tmp_path)], settings=Settings(root=tmp_path), jobs=1).findings}
