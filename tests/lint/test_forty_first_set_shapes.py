"""Shapes of the forty-first blind set that the lint misread."""

from __future__ import annotations

import textwrap

import pytest

from klaudit.lint.engine import lint_paths

TRAINER = """\
import torch


class Trainer:
    def loss(self, logp, ref_logp, mask, pg_loss):
        kl = torch.exp(ref_logp - logp) - (ref_logp - logp) - 1
        return pg_loss + 0.04 * (kl * mask).sum() / mask.sum()
"""

LAUNCHED = """\
from trl import GRPOConfig, GRPOTrainer, TrlParser
from src.open_r1.trainer import Trainer

if __name__ == "__main__":
    parser = TrlParser((GRPOConfig,))
    (training_args,) = parser.parse_args_and_config()
    GRPOTrainer(model=None, args=training_args).train()
"""

LAUNCH = """\
accelerate launch src/open_r1/grpo.py --beta 0.04 --num_generations 8 --per_device_train_batch_size 8
"""


def _project(root, init: str):
    package = root / "src" / "open_r1" / "trainer"
    package.mkdir(parents=True)
    (root / "src" / "__init__.py").write_text("")
    (root / "src" / "open_r1" / "__init__.py").write_text("")
    (package / "__init__.py").write_text(init)
    (package / "grpo_trainer.py").write_text(TRAINER)
    (root / "src" / "open_r1" / "grpo.py").write_text(LAUNCHED)
    (root / "train.sh").write_text(LAUNCH)


def _found(root, *paths):
    result = lint_paths([str(root / path) for path in paths] or [str(root)], jobs=1)
    return sorted((finding.path.rsplit("/", 1)[-1], finding.code) for finding in result.findings)


@pytest.mark.parametrize("init, importable", [
    ("from .grpo_trainer import Trainer\n", True),
    # jzhws/VisualQualityAssessment-RL-Trainer: a hyphen is no module name, so the package cannot be imported
    ("from .grpo_trainer import Trainer\nfrom .grpo_trainer_refine-iqa import Refine\n", False),
])
def test_a_package_python_cannot_import_trains_nothing(tmp_path, init, importable):
    """A module of a package whose `__init__.py` Python rejects never runs, nor does a launch of a script that
    imports that package: only the KL000 of the `__init__.py` is reported. Importable, the trainer's k3 loss
    (KL002) and the launch's TRL flags are."""
    _project(tmp_path, init)
    found = _found(tmp_path)
    if importable:
        assert ("grpo_trainer.py", "KL002") in found and any(path == "train.sh" for path, _ in found)
    else:
        assert found == [("__init__.py", "KL000")]


def test_a_module_of_an_unimportable_package_named_on_the_command_line_is_linted(tmp_path):
    """The user who names the file asks for it: it is analysed whatever its package says."""
    _project(tmp_path, "from .grpo_trainer_refine-iqa import Refine\n")
    assert _found(tmp_path, "src/open_r1/trainer/grpo_trainer.py") == [("grpo_trainer.py", "KL002")]


def test_a_script_inside_an_unimportable_package_is_still_analysed(tmp_path):
    """`python src/open_r1/trainer/run.py` runs the script by its path, which imports no package around it."""
    _project(tmp_path, "from .grpo_trainer_refine-iqa import Refine\n")
    script = textwrap.dedent(TRAINER) + "\n\nif __name__ == '__main__':\n    Trainer()\n"
    (tmp_path / "src" / "open_r1" / "trainer" / "run.py").write_text(script)
    assert ("run.py", "KL002") in _found(tmp_path)
