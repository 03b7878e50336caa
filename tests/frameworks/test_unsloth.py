"""Which modules get Unsloth's TRL classes (klaudit.frameworks.unsloth): the process imports Unsloth before them.

Unsloth's GRPOConfig defaults loss_type to "bnpo" (TRL 1.16's is "dapo") and its loss (up to 2026.9.2, the release
these projects pin) adds a plain k3 whatever `use_bias_correction_kl` says, so whether a module's `GRPOConfig(...)`
is Unsloth's decides its verdict: with
beta 0.04 and one completion a micro-batch, Unsloth's is a plain k3 loss (kl-math.md §8 row 3, KL002) averaged over
each completion's own tokens (row 21, KL007); TRL 1.16's is the bias-corrected k3 (row 2, KL003) over the batch's.
"""

from __future__ import annotations

from pathlib import Path

from klaudit.config import Settings
from klaudit.frameworks.unsloth import imported_after_unsloth
from klaudit.lint.engine import lint_paths

_TRAINER = ("from trl import GRPOConfig\n\n\ndef make(config):\n    return GRPOConfig(\n"
            "        per_device_train_batch_size=config.training.per_device_train_batch_size,\n"
            "        gradient_accumulation_steps=config.training.gradient_accumulation_steps,\n"
            "        num_generations=config.training.num_generations,\n        beta=config.training.beta,\n    )\n")
_YAML = ("training:\n  per_device_train_batch_size: 1\n  gradient_accumulation_steps: 4\n  num_generations: 4\n"
         "  beta: 0.04\n")


def _project(tmp_path: Path, entry: str) -> Path:
    """Pratham-26/grpo_loss_trainer's layout (sixty-eighth set): src/model.py imports unsloth, src/trainer.py builds
    the GRPOConfig from configs/default.yaml, and scripts/train.py (`entry`) imports both."""
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "__init__.py").write_text("")
    (tmp_path / "src" / "model.py").write_text("from unsloth import FastLanguageModel\n")
    (tmp_path / "requirements.txt").write_text("unsloth==2026.9.2\n")
    (tmp_path / "src" / "trainer.py").write_text(_TRAINER)
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "default.yaml").write_text(_YAML)
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "train.py").write_text(entry)
    return tmp_path


def _trainer_findings(root: Path) -> list[tuple[int, str, bool]]:
    """(line, code, whether the message names Unsloth's loss) of the findings in src/trainer.py."""
    result = lint_paths([str(root)], settings=Settings(root=root), jobs=1)
    return sorted((f.line, f.code, "GRPO loss: a plain k3" in f.message) for f in result.findings
                  if f.path.endswith("trainer.py"))


def test_a_trainer_imported_after_the_module_that_imports_unsloth_is_unsloths(tmp_path):
    """scripts/train.py imports src.model (and with it unsloth) first: src.trainer's GRPOConfig is Unsloth's, bnpo
    over a micro-batch of the YAML's one completion, 1 x 4 a multiple of 4 so Unsloth keeps it."""
    root = _project(tmp_path, "from src.model import FastLanguageModel\nfrom src.trainer import make\n")
    assert _trainer_findings(root) == [(6, "KL007", True), (9, "KL002", True)]


def test_a_trainer_imported_before_unsloth_keeps_trls_classes(tmp_path):
    """The other order: src.trainer binds TRL's own GRPOConfig before Unsloth patches it (TRL 1.16: the corrected
    k3, dapo over the batch's tokens)."""
    root = _project(tmp_path, "from src.trainer import make\nfrom src.model import FastLanguageModel\n")
    assert _trainer_findings(root) == [(9, "KL003", False)]


def test_one_importer_without_unsloth_leaves_the_module_trls(tmp_path):
    """A second script imports the trainer without Unsloth: the module runs with TRL's classes there, and the lint
    does not take Unsloth's."""
    root = _project(tmp_path, "from src.model import FastLanguageModel\nfrom src.trainer import make\n")
    (root / "scripts" / "plain.py").write_text("from src.trainer import make\n")
    assert _trainer_findings(root) == [(9, "KL003", False)]


def test_imports_after_unsloth_reach_through_relative_imports_and_the_modules_imported_later(tmp_path):
    """`from . import model` loads Unsloth in pkg/run.py; `from .trainer import make` after it is patched, and so is
    what pkg/trainer.py imports in turn (pkg/helpers.py); pkg/early.py, imported first, is not."""
    files = {
        "pkg/__init__.py": "",
        "pkg/model.py": "import unsloth\n",
        "pkg/early.py": "x = 1\n",
        "pkg/helpers.py": "y = 2\n",
        "pkg/trainer.py": "from pkg.helpers import y\n",
        "pkg/run.py": "from .early import x\nfrom . import model\nfrom .trainer import make\n",
        "pkg/odd.py": "from " + "." * 60 + " import nothing\n",  # more dots than folders: no module, no error
    }
    sources = {str(tmp_path / name): text for name, text in files.items()}
    for path, text in sources.items():
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(text)
    patched = {Path(path).relative_to(tmp_path.resolve()).as_posix() for path in imported_after_unsloth(sources)}
    assert patched == {"pkg/trainer.py", "pkg/helpers.py"}


# menloresearch/ReZero and dCaples/AutoDidact (ninety-sixth set) carry Unsloth's generated trainer as a module of their
# own: its `grpo_compute_loss` adds beta * k3, and its UnslothGRPOConfig takes beta = 0.04 in its `__init__`.
_COPIED_TRAINER = """\
from trl.trainer.grpo_trainer import GRPOConfig, Trainer


def grpo_compute_loss(old_logits, new_logits, input_ids, mask, beta, advantages):
    return beta


class UnslothGRPOConfig(GRPOConfig):
    def __init__(self, output_dir=None, beta=0.04, **kwargs):
        super().__init__(output_dir=output_dir, beta=beta, **kwargs)


class _UnslothGRPOTrainer(Trainer):
    def __init__(self, model, args=None):
        self.beta = args.beta


class UnslothGRPOTrainer(_UnslothGRPOTrainer):
    def __init__(self, model, args=None):
        if args is None: args = UnslothGRPOConfig()
        super().__init__(model, args)
"""


def test_a_copy_of_unsloths_trainer_runs_its_own_plain_k3_whatever_the_release(tmp_path):
    # no pin: the newest Unsloth, whose own loss follows TRL's bias correction, is not what this project runs
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "app"\ndependencies = ["unsloth", "trl"]\n')
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "UnslothGRPOTrainerTemp.py").write_text(_COPIED_TRAINER)
    (tmp_path / "train.py").write_text("from unsloth import FastLanguageModel\n"
                                       "import src.UnslothGRPOTrainerTemp as Temp\n\n"
                                       'args = Temp.UnslothGRPOConfig(output_dir="out")\n')
    found = lint_paths([str(tmp_path)], settings=Settings(root=tmp_path), jobs=1).findings
    assert [(f.path.rsplit("/", 1)[-1], f.line, f.code) for f in found] == [("train.py", 4, "KL002")]
    assert "src/UnslothGRPOTrainerTemp.py: a plain k3" in found[0].message
    assert "beta=0.04 (default)" in found[0].message
