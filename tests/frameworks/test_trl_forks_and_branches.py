"""TRL's GRPOConfig as groundlight/r1_vlm (the ninety-ninth fresh set) builds it.

Its scripts set `beta=1e-5 if peft_config is not None else 0.001`: a conditional whose every branch adds TRL's KL
term, judged as each branch and reported where all agree. They also pass `epsilon_low=0.2`, a keyword no
TRL release takes, which would raise a TypeError; but the project installs TRL from a folder of its own machine (uv's
lock entry `source = { editable = "../trl" }`), a fork that takes it, so the configuration trains.
"""

from __future__ import annotations

import pytest

from klaudit.config import Settings
from klaudit.frameworks.versions import installed_from_a_folder
from klaudit.lint.engine import lint_paths

SCRIPT = """\
from trl import GRPOConfig, GRPOTrainer

args = GRPOConfig(
    output_dir="out",
    per_device_train_batch_size=8,
    num_generations=8,
    loss_type="dapo",
    beta={beta},{extra}
)
GRPOTrainer(model="Qwen/Qwen2.5-0.5B", reward_funcs=[], args=args).train()
"""

LOCK = """\
[[package]]
name = "trl"
version = "0.15.0.dev0"
source = {{ {how} = "../trl" }}
"""


def _codes(tmp_path, files):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    result = lint_paths([str(tmp_path)], settings=Settings(root=tmp_path), jobs=1)
    return sorted((f.path.rsplit("/", 1)[-1], f.line, f.code) for f in result.findings)


@pytest.mark.parametrize("beta, codes", [
    # TRL 1.16's ratio * k3 (row 2, KL003)
    ("1e-5 if peft_config is not None else 0.001", [("train.py", 8, "KL003")]),  # every branch adds the term
    ("0.0 if peft_config is not None else 0.04", []),  # one branch has no KL term: no verdict for the call
    ("0.04", [("train.py", 8, "KL003")]),
])
def test_a_conditional_of_literals_is_judged_by_every_branch(tmp_path, beta, codes):
    (tmp_path / "requirements.txt").write_text("trl==1.16.0\n")
    assert _codes(tmp_path, {"train.py": SCRIPT.format(beta=beta, extra="")}) == codes


@pytest.mark.parametrize("how, codes", [
    ("editable", [("train.py", 8, "KL002")]),  # a fork in a folder beside the project: it takes epsilon_low
    ("registry", []),  # TRL's own release refuses epsilon_low: a TypeError, nothing trains
])
def test_a_keyword_no_release_takes_trains_with_a_fork_installed_from_a_folder(tmp_path, how, codes):
    (tmp_path / "uv.lock").write_text(LOCK.format(how=how))
    script = SCRIPT.format(beta="0.04", extra="\n    epsilon_low=0.2,")
    assert _codes(tmp_path, {"train.py": script}) == codes


@pytest.mark.parametrize("file, text, found", [
    ("pyproject.toml", '[tool.uv.sources]\ntrl = { path = "../trl", editable = true }\n', True),
    ("requirements.txt", "-e ../trl\n", True),
    ("requirements.txt", "-e git+https://github.com/huggingface/trl.git#egg=trl\n", False),  # a checkout, no folder
    ("requirements.txt", "trl==0.15.2\n", False),
    ("pyproject.toml", '[project]\ndependencies = ["trl>=0.15"]\n', False),
])
def test_the_ways_a_project_installs_a_dependency_from_a_folder(tmp_path, file, text, found):
    (tmp_path / file).write_text(text)
    (tmp_path / "src").mkdir()
    assert installed_from_a_folder("trl", str(tmp_path / "src")) is found


SUBCLASS = '''\
from dataclasses import dataclass

from trl import GRPOConfig as TRLGRPOConfig


@dataclass
class GRPOConfig(TRLGRPOConfig):
    loss_type: str = "grpo"
'''

OPEN_R1_SCRIPT = '''\
from {module} import GRPOConfig
from trl import GRPOTrainer

args = GRPOConfig(
    output_dir="out",
    beta=0.04,
)
GRPOTrainer(model="Qwen/Qwen2.5-0.5B", reward_funcs=[], args=args).train()
'''


@pytest.mark.parametrize("module, codes", [
    # open-r1's GRPOConfig, TRL's defaults: 1.16's ratio * k3 (row 2), a token mean over the batch
    ("open_r1.configs", [("train.py", 6, "KL003")]),
    # the project's subclass, with loss_type "grpo": each completion's token mean besides (row 21)
    ("src.training.config", [("train.py", 6, "KL003"), ("train.py", 6, "KL007")]),
])
def test_a_class_imported_from_another_module_is_not_the_projects_own(tmp_path, module, codes):
    """whn09/RAIDEN-R1 (the hundredth fresh set) imports GRPOConfig from open-r1 beside a class of its own of that
    name: the script's configuration was read with the project's class's fields as its defaults."""
    (tmp_path / "requirements.txt").write_text("trl==1.16.0\n")
    (tmp_path / "src" / "training").mkdir(parents=True)
    (tmp_path / "src" / "training" / "config.py").write_text(SUBCLASS)
    assert _codes(tmp_path, {"train.py": OPEN_R1_SCRIPT.format(module=module)}) == codes


@pytest.mark.parametrize("where, reported", [
    ("trl-copy/tests/test_grpo_trainer.py", False),  # upstream's tests in a checkout of TRL's repository
    ("trl-copy/examples/scripts/grpo.py", False),
    ("scripts/train.py", True),  # the project's own run
])
def test_a_checkout_of_trls_repository_keeps_upstreams_tests_and_examples(tmp_path, where, reported):
    """NVlabs/GDPO (fresh104) carries TRL's repository in `trl-GDPO/trl-0.18.0-gdpo/`: its tests and examples build
    GRPOConfig and PPOConfig by the dozen, none a run of the project."""
    (tmp_path / "setup.py").write_text("from setuptools import setup\n\nsetup(name='app')\n")
    (tmp_path / "trl-copy" / "trl" / "trainer").mkdir(parents=True)
    (tmp_path / "trl-copy" / "setup.py").write_text("from setuptools import setup\n\nsetup(name='trl')\n")
    (tmp_path / "trl-copy" / "trl" / "trainer" / "__init__.py").write_text("")
    script = tmp_path / where
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(SCRIPT.format(beta="0.04", extra=""))
    found = lint_paths([str(tmp_path)], settings=Settings(root=tmp_path), jobs=1).findings
    assert any(f.path.endswith(where.rsplit("/", 1)[-1]) for f in found) is reported
