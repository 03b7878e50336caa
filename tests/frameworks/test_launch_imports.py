"""A launch whose copy of the framework fails on import trains nothing: its flags get no verdict
(klaudit.frameworks.imports). Shapes from the thirty-seventh set: opendilab-llm-safety/OpenRLHF's experience maker
does not compile, haoxufd/OpenRLHF's Ray actor imports a class the fork deleted."""

from __future__ import annotations

from pathlib import Path

import pytest

from klaudit.frameworks import Context, lint_config
from klaudit.frameworks.imports import import_failure
from tests.frameworks.launches import launch_codes

_PACKAGE = {
    "openrlhf/__init__.py": "",
    "openrlhf/cli/__init__.py": "",
    "openrlhf/cli/train_ppo_ray.py": "import argparse\n\nfrom openrlhf.trainer.ray import ActorGroup\n",
    "openrlhf/trainer/__init__.py": "",
    "openrlhf/trainer/ray/__init__.py": "from .actor import ActorGroup\n",
    "openrlhf/trainer/ray/actor.py": "from ..ppo_utils import ExperienceMaker\n\n\nclass ActorGroup:\n    pass\n",
    "openrlhf/trainer/ppo_utils/__init__.py": "from .maker import ExperienceMaker\n",
    "openrlhf/trainer/ppo_utils/maker.py": "class ExperienceMaker:\n    def __init__(self, actor, processor=None):\n"
                                           "        self.actor = actor\n",
}
_MODULE = "openrlhf/cli/train_ppo_ray.py"


_MAKER, _UTILS = "openrlhf/trainer/ppo_utils/maker.py", "openrlhf/trainer/ppo_utils/__init__.py"


def _copy(root: Path, changed: dict[str, str] | None = None) -> Path:
    for name, text in {**_PACKAGE, **(changed or {})}.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    (root / "version.txt").write_text("0.5.5\n")
    return root


def test_a_copy_that_imports_cleanly_has_no_failure(tmp_path):
    assert import_failure(_copy(tmp_path), _MODULE) is None


def test_a_module_of_the_chain_that_does_not_compile_stops_the_import(tmp_path):
    broken = "class ExperienceMaker:\n    def __init__(self, processor=None, actor):\n        pass\n"
    failure = import_failure(_copy(tmp_path, {_MAKER: broken}), _MODULE)
    assert failure == ("openrlhf/trainer/ppo_utils/maker.py:2 does not compile "
                       "(syntax error: non-default argument follows default argument)")


def test_a_name_the_copy_no_longer_defines_stops_the_import(tmp_path):
    failure = import_failure(_copy(tmp_path, {_UTILS: "from .maker import Maker\n", _MAKER: "class Maker:\n    pass\n"}),
                             _MODULE)
    assert failure == "openrlhf/trainer/ray/actor.py:1 imports ExperienceMaker from openrlhf.trainer.ppo_utils, " \
                      "which does not define it"


@pytest.mark.parametrize("package_init", [
    "from .maker import *\n",  # binds whatever the module has
    "try:\n    from .maker import ExperienceMaker\nexcept ImportError:\n    ExperienceMaker = None\n",  # bound either way
    "def __getattr__(name):\n    return None\n",  # a module that answers any name
])
def test_names_a_module_may_bind_are_taken_as_bound(tmp_path, package_init):
    assert import_failure(_copy(tmp_path, {_UTILS: package_init}), _MODULE) is None


def test_guarded_imports_and_imports_of_other_packages_are_not_followed(tmp_path):
    launch = ("import argparse\n\nfrom vllm import LLM\n\ntry:\n    from openrlhf.missing import Thing\nexcept ImportError:\n"
              "    Thing = None\n\n\ndef main():\n    from openrlhf.trainer.ray import Nothing\n")
    assert import_failure(_copy(tmp_path, {_MODULE: launch}), _MODULE) is None


LAUNCH = ("ray job submit --address=http://127.0.0.1:8265 -- python3 -m openrlhf.cli.train_ppo_ray \\\n"
          "    --init_kl_coef 0.01 --kl_estimator k3 --rollout_batch_size 1024 --train_batch_size 128\n")


@pytest.mark.parametrize("maker, expected", [
    # k3 in the reward (row 7), trained over 8 steps (row 23), each response's token mean up to 0.6 (row 21)
    (_PACKAGE[_MAKER], ["KL004", "KL007", "KL008"]),
    ("class ExperienceMaker:\n    def __init__(self, processor=None, actor):\n        pass\n", []),
])
def test_the_launch_of_a_copy_that_cannot_import_gets_no_verdict(tmp_path, maker, expected):
    _copy(tmp_path, {_MAKER: maker})
    assert launch_codes(tmp_path, LAUNCH) == expected


@pytest.mark.parametrize("protocol, expected", [
    ("class DataProto:\n    pass\n", True),  # k3 as a loss: row 3, KL002
    ("class Proto:\n    pass\n", False),  # `from verl import DataProto` fails: nothing trains, no finding
])
def test_a_verl_launch_of_a_copy_that_cannot_import_gets_no_verdict(tmp_path, protocol, expected):
    (tmp_path / "verl" / "trainer").mkdir(parents=True)
    (tmp_path / "verl" / "__init__.py").write_text("from .protocol import DataProto\n")
    (tmp_path / "verl" / "protocol.py").write_text(protocol)
    (tmp_path / "verl" / "trainer" / "__init__.py").write_text("")
    (tmp_path / "verl" / "trainer" / "main_ppo.py").write_text("from verl import DataProto\n")
    (tmp_path / "setup.py").write_text("")
    launch = ("python3 -m verl.trainer.main_ppo actor_rollout_ref.actor.use_kl_loss=True "
              "actor_rollout_ref.actor.kl_loss_type=low_var_kl\n")
    script = tmp_path / "run.sh"
    script.write_text(launch)
    found = lint_config(str(script), launch, Context(roots=(str(tmp_path.resolve()),)))
    assert ("KL002" in {f.code for f in found}) == expected and (expected or found == [])


@pytest.mark.parametrize("module, beside, expected", [
    ("train_ppo_ray", False, ["KL004", "KL007", "KL008"]),  # the module is there: judged as above
    ("train_ppo", False, []),  # the project's package lacks it: ModuleNotFoundError, nothing trains
    ("train_ppo", True, ["KL004", "KL008"]),  # a copy beside the scripts: an installed release may run
])
def test_a_launch_of_a_module_the_project_s_own_package_lacks_gets_no_verdict(tmp_path, module, beside, expected):
    """JYudelson1/OpenRLHF-reward-hacking (twenty-first set) and saramal/RePO (thirty-eighth) keep upstream's
    `deepspeed --module openrlhf.cli.train_ppo` example, but their `openrlhf` package, at the project's root, has
    only train_ppo_ray: run from the project, the launch stops on import."""
    root = tmp_path / "OpenRLHF" if beside else tmp_path
    _copy(root, {"openrlhf/models/utils.py": "def compute_reward(r, kl_coef, kl):\n    return r - kl_coef * kl\n"})
    (tmp_path / "setup.py").write_text("")
    assert launch_codes(tmp_path, LAUNCH.replace("train_ppo_ray", module)) == expected


_REWARDS = {"openrlhf/rewards/__init__.py": "", "openrlhf/rewards/wikisql.py": "def score(x):\n    return x\n",
            "openrlhf/rewards/wikitq.py": "def score(x):\n    return x\n"}


@pytest.mark.parametrize("imported, failure", [
    # MJinXiang/Reasoning-Table (fresh103): gsm8k imported beside the package's modules, its file left out of the
    # commit; the author's checkout has it, and the project's launches ran
    ("wikisql, wikitq, gsm8k", None),
    # one module beside it is too little to read the statement as a list of the package's modules
    ("wikisql, gsm8k", "openrlhf/cli/train_ppo_ray.py:4 imports gsm8k from openrlhf.rewards, which does not define it"),
])
def test_a_module_of_a_package_left_out_of_the_commit_does_not_stop_the_import(tmp_path, imported, failure):
    launched = _PACKAGE[_MODULE] + f"from openrlhf.rewards import {imported}\n"
    copy = _copy(tmp_path, {**_REWARDS, _MODULE: launched})
    assert import_failure(copy, _MODULE) == failure
