"""A trainer class whose one use is commented out, or that its package exports beside the class the project builds,
is built by no run (klaudit.lint.overrides.never_built).

Forks of a multimodal GRPO project (HumanMLLM/R1-Omni, HarryHsing/EchoInk, fresh89) keep the upstream trainers
exported from their package beside the one their entry script builds; the line that chose between them is a comment.
Others drop the line (chenqiu1024/Seg-R1, zzzhhzzz/Ground-R1, fresh91): the entry imports the upstream trainer and
builds its own. Their k3 KL terms (row 3, KL002) never train anything. A class nothing names at all, in a package
the project builds nothing from, is a library's and stays judged (farming1604/GRPO_custom, fresh65: a trainer with
no launcher, built by whoever imports the package). So is the class an entry picks by TRL's `use_vllm` where none
of the entry's launches selects it (klaudit.lint.flag_choices): kokolerk/TON (fresh92) launches with `--use_vllm
true`, so the entry's `Qwen2VLGRPOTrainer if not training_args.use_vllm else ...` never builds that trainer.
NVlabs/GDPO (fresh104) carries a checkout of TRL's repository (`trl-GDPO/trl-0.18.0-gdpo/`, its own setup.py) and
trains its GRPO trainer: the checkout's GKD, Nash-MD and PPO trainers are built only by upstream's tests, examples
and documentation there, no run of the project.
"""

from __future__ import annotations

import pytest
from test_forty_seventh_set_shapes import BASE

from klaudit.lint.engine import lint_paths
from klaudit.lint.update_loops import named_beyond_declarations

TRAINER = BASE.replace("BaseTrainer", "{name}")  # k3 as a loss in compute_loss (row 3, KL002)
PACKAGE_INIT = """\
from .grpo_trainer import Qwen2VLGRPOTrainer
from .omni_trainer import OmniGRPOTrainer

__all__ = ["Qwen2VLGRPOTrainer", "OmniGRPOTrainer"]
"""
ENTRY = """\
from trainer import Qwen2VLGRPOTrainer, OmniGRPOTrainer


def main(args):
{choice}
    trainer = trainer_cls(args)
    trainer.train()


if __name__ == "__main__":
    main(None)
"""
COMMENTED_OUT = "    # trainer_cls = Qwen2VLGRPOTrainer if not args.use_vllm else None\n    trainer_cls = OmniGRPOTrainer"


def _project(root, choice=COMMENTED_OUT, extra=None):
    (root / "setup.py").write_text("from setuptools import setup\n\nsetup(name='fork')\n")
    package = root / "trainer"
    package.mkdir()
    (package / "__init__.py").write_text(PACKAGE_INIT)
    (package / "grpo_trainer.py").write_text(TRAINER.format(name="Qwen2VLGRPOTrainer"))
    (package / "omni_trainer.py").write_text(TRAINER.format(name="OmniGRPOTrainer"))
    (root / "grpo.py").write_text(ENTRY.format(choice=choice))
    for path, text in (extra or {}).items():
        (root / path).write_text(text)


def _found(*paths):
    result = lint_paths([str(path) for path in paths], jobs=1)
    assert result.errors == []
    return sorted((finding.path.rsplit("/", 1)[-1], finding.code) for finding in result.findings)


@pytest.mark.parametrize("choice", [
    COMMENTED_OUT,
    # the entry builds the package's other export; nothing builds this one
    "    trainer_cls = OmniGRPOTrainer",
    # ... or a class of its own derived from it (Seg-R1's SegR1Trainer)
    "    class Own(OmniGRPOTrainer):\n        pass\n    trainer_cls = Own",
])
def test_a_trainer_no_run_builds_is_left_out(tmp_path, choice):
    _project(tmp_path, choice)
    assert _found(tmp_path) == [("omni_trainer.py", "KL002")]


def test_a_library_package_nothing_builds_from_is_judged(tmp_path):
    """No code of the project builds either export (a trainer package with no launcher): a user builds them."""
    _project(tmp_path, "    trainer_cls = None")
    assert _found(tmp_path) == [("grpo_trainer.py", "KL002"), ("omni_trainer.py", "KL002")]


@pytest.mark.parametrize("choice, extra", [
    # prose about it is no use of it, and the project builds nothing from the package
    ("    # the loss is the same as in Qwen2VLGRPOTrainer\n    trainer_cls = None", None),
    # the choice is live
    ("    trainer_cls = Qwen2VLGRPOTrainer if not args.use_vllm else OmniGRPOTrainer", None),
    # the README shows how to build it
    (COMMENTED_OUT, {"README.md": "trainer = Qwen2VLGRPOTrainer(model, args)\n"}),
    # the entry builds it under another name (TimeZero, fresh90: `import Qwen2VLGRPOTrainer_Video as Qwen2VLGRPOTrainer`)
    ("", {"grpo.py": "from trainer import OmniGRPOTrainer, Qwen2VLGRPOTrainer as Video\n\n\n"
                     "def main(args):\n    trainer_cls = Video if args.video else OmniGRPOTrainer\n"
                     "    trainer_cls(args).train()\n"}),
    # a subclass inherits its loss
    (COMMENTED_OUT, {"sub.py": "from trainer.grpo_trainer import Qwen2VLGRPOTrainer\n\n\n"
                               "class Sub(Qwen2VLGRPOTrainer):\n    pass\n"}),
])
def test_a_trainer_some_run_may_build_is_judged(tmp_path, choice, extra):
    _project(tmp_path, choice, extra)
    assert ("grpo_trainer.py", "KL002") in _found(tmp_path)


def test_a_folder_below_the_projects_root_cannot_tell(tmp_path):
    """`klaudit lint trainer/` in the repository: the code that builds the class may lie outside what is linted."""
    _project(tmp_path)
    assert ("grpo_trainer.py", "KL002") in _found(tmp_path / "trainer")


def test_an_export_list_of_several_names_is_a_declaration_of_each():
    """`__all__ = ["A", "B", "C"]` names A only to export it, whatever the other strings on the line (the blanked
    strings between two commas once read as something else)."""
    exports = 'from .a import A\nfrom .b import B\nfrom .c import C\n\n__all__ = ["A", "B", "C"]\n'
    assert not named_beyond_declarations(exports, "A")
    assert named_beyond_declarations(exports + "TRAINERS = [A]\n", "A")


def test_a_lazy_packages_import_structure_is_a_declaration():
    """TRL's and transformers' `_import_structure = {"gkd_trainer": ["GKDTrainer"], ...}` exports, it uses nothing."""
    structure = '_import_structure = {\n    "gkd_trainer": ["GKDTrainer"],\n    "ppo_trainer": ["PPOTrainer", "PPOConfig"],\n}\n'
    assert not named_beyond_declarations(structure, "GKDTrainer")
    assert not named_beyond_declarations(structure, "PPOConfig")
    assert named_beyond_declarations(structure + "TRAINERS = {'gkd': GKDTrainer}\n", "GKDTrainer")


@pytest.mark.parametrize("user, found", [
    ("tests/test_trainer.py", []),  # upstream's test of it, in the checkout: no run of the project
    ("examples/train.py", []),
    ("../train.py", [("grpo_trainer.py", "KL002")]),  # the project's own script builds it
])
def test_a_carried_checkouts_class_only_its_own_tests_build_is_built_by_no_run(tmp_path, user, found):
    (tmp_path / "setup.py").write_text("from setuptools import setup\n\nsetup(name='app')\n")
    checkout = tmp_path / "lib-copy"
    (checkout / "trainer").mkdir(parents=True)
    (checkout / "setup.py").write_text("from setuptools import setup\n\nsetup(name='lib')\n")
    (checkout / "trainer" / "__init__.py").write_text("from .grpo_trainer import Qwen2VLGRPOTrainer\n")
    (checkout / "trainer" / "grpo_trainer.py").write_text(TRAINER.format(name="Qwen2VLGRPOTrainer"))
    script = checkout / user
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text("from trainer import Qwen2VLGRPOTrainer\n\nQwen2VLGRPOTrainer(None).train()\n")
    assert _found(tmp_path) == found


CHOSEN_BY_FLAG = "    trainer_cls = Qwen2VLGRPOTrainer if not args.use_vllm else OmniGRPOTrainer"
LAUNCH = "torchrun --nproc_per_node=8 \\\n    ./grpo.py \\\n    --output_dir out \\\n{flag}    --beta 0.04\n"


@pytest.mark.parametrize("flag, found", [
    ("    --use_vllm true \\\n", [("omni_trainer.py", "KL002")]),  # every launch picks the other trainer
    ("    --use_vllm \\\n", [("omni_trainer.py", "KL002")]),  # a bare flag turns it on
    ("    --use_vllm false \\\n", [("grpo_trainer.py", "KL002")]),  # the vLLM-side trainer is never built
])
def test_a_trainer_picked_by_a_flag_no_launch_gives_is_left_out(tmp_path, flag, found):
    _project(tmp_path, CHOSEN_BY_FLAG, {"run.sh": LAUNCH.format(flag=flag)})
    assert _found(tmp_path) == found


@pytest.mark.parametrize("extra", [
    {},  # no launch of the entry: a user may run it either way
    {"run.sh": LAUNCH.format(flag="")},  # a launch that leaves the flag out: its users may add it (SpaceR, fresh90)
    {"run.sh": LAUNCH.format(flag="    --use_vllm $VLLM \\\n")},  # computed
    {"run.sh": LAUNCH.format(flag="    --use_vllm true \\\n"),  # another launch may give the other value
     "run_hf.sh": LAUNCH.format(flag="")},
    {"run.sh": LAUNCH.format(flag=""),  # the project's own configuration turns the flag on by default
     "config.py": "from dataclasses import dataclass\n\n\n@dataclass\nclass Config:\n    use_vllm: bool = True\n"},
])
def test_a_trainer_some_launch_may_pick_by_the_flag_is_judged(tmp_path, extra):
    _project(tmp_path, CHOSEN_BY_FLAG, extra)
    assert _found(tmp_path) == [("grpo_trainer.py", "KL002"), ("omni_trainer.py", "KL002")]


@pytest.mark.parametrize("launch", [
    "torchrun --nproc_per_node=8 -m grpo --use_vllm true\n",  # the entry run as a module
    "cd code && torchrun --nproc_per_node=8 grpo.py --use_vllm true\n",  # from the folder the launch changes to
    "cd code\ntorchrun --nproc_per_node=8 -m grpo --use_vllm true\n",
])
def test_a_launch_by_module_or_from_another_folder_picks_by_the_flag_too(tmp_path, launch):
    """Corleno/KEPO (fresh93) runs `cd src/r1-v` and then `torchrun ... -m src.open_r1.grpo_vqa_nothink`: the
    launches of the entry are found as `klaudit.frameworks.settings.launched_scripts` finds them."""
    (tmp_path / "code").mkdir()
    _project(tmp_path / "code", CHOSEN_BY_FLAG)
    folder = tmp_path if launch.startswith("cd") else tmp_path / "code"
    (folder / "run.sh").write_text(launch)
    assert _found(tmp_path) == [("omni_trainer.py", "KL002")]


def test_a_folder_of_projects_side_by_side_carries_none_of_them(tmp_path):
    """A folder that only holds several checkouts (no packaging, no README of its own: `klaudit lint ~/src`) is no
    project carrying them: each is a library whose tests build its trainer, and stays judged."""
    checkout = tmp_path / "lib-copy"
    (checkout / "trainer").mkdir(parents=True)
    (checkout / "setup.py").write_text("from setuptools import setup\n\nsetup(name='lib')\n")
    (checkout / "trainer" / "__init__.py").write_text("from .grpo_trainer import Qwen2VLGRPOTrainer\n")
    (checkout / "trainer" / "grpo_trainer.py").write_text(TRAINER.format(name="Qwen2VLGRPOTrainer"))
    (checkout / "tests").mkdir()
    (checkout / "tests" / "test_trainer.py").write_text(
        "from trainer import Qwen2VLGRPOTrainer\n\nQwen2VLGRPOTrainer(None).train()\n")
    assert _found(tmp_path) == [("grpo_trainer.py", "KL002")]
