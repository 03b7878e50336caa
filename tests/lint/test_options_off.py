"""A coefficient that every run sets to 0 switches its KL term off: the code that forms the term trains nothing.

shard-stream-8/rg_obfuscation (seventy-second set) loads `config = Config(yaml.safe_load(f))` and trains
`-((advantage - config.kl_coefficient * kl.detach()) * logp).mean()`, while each of its three YAML configs sets
`kl_coefficient: 0.0`: the forward KL it folds into the advantage (KL004, KL007) never reaches a gradient.
"""

from __future__ import annotations

import pytest

from klaudit.lint.engine import lint_paths

TRAINER = """\
import torch
import torch.nn.functional as F


def train(config, policy, ref, batches, optimizer):
    for batch in batches:
        logits = policy(batch.ids).logits
        with torch.no_grad():
            ref_logits = ref(batch.ids).logits
        log_probs = F.log_softmax(logits, -1)
        kl = F.kl_div(log_probs, F.log_softmax(ref_logits, -1), log_target=True, reduction="none").sum(-1)
        logp = log_probs.gather(-1, batch.ids.unsqueeze(-1)).squeeze(-1).sum(-1)
        loss = -((batch.advantage - {coefficient} * kl.mean(-1).detach()) * logp).mean()
        loss.backward()
        optimizer.step()
"""

LOADER = "import sys\nimport yaml\nfrom trainer import train\n\ntrain(yaml.safe_load(open(sys.argv[1])), *build())\n"
ARGPARSE = ("import argparse\nfrom trainer import train\n\nparser = argparse.ArgumentParser()\n"
            "parser.add_argument('--kl_coefficient', type=float, default={default})\ntrain(parser.parse_args(), *build())\n")


def _codes(tmp_path, coefficient: str, files: dict[str, str]) -> set[str]:
    (tmp_path / "trainer.py").write_text(TRAINER.format(coefficient=coefficient))
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return {finding.code for finding in lint_paths([str(tmp_path)], jobs=1).findings
            if finding.path.endswith("trainer.py")}


@pytest.mark.parametrize("coefficient, configs, off", [
    ("config.kl_coefficient", ["kl_coefficient: 0.0\n", "kl_coefficient: 0\n"], True),  # every config: 0
    ("config.kl_coefficient", ["kl_coefficient: 0.0\n", "kl_coefficient: 0.05\n"], False),  # one run trains it
    ("config.kl_coefficient", ["lr: 1.0e-6\n"], False),  # no config sets it: unknown
    ("cfg.training.kl_coef", ["training:\n  kl_coef: 0.0\n"], True),  # a nested key, looked up dotted
    ("cfg.training.kl_coef", ["model:\n  kl_coef: 0.0\ntraining:\n  kl_coef: 0.1\n"], False),  # another section's
])
def test_a_coefficient_every_yaml_config_sets_to_zero_trains_nothing(tmp_path, coefficient, configs, off):
    files = {f"configs/run{index}.yaml": text for index, text in enumerate(configs)} | {"train.py": LOADER}
    codes = _codes(tmp_path, coefficient, files)
    assert codes.isdisjoint({"KL004", "KL007"}) is off
    if not off:
        assert "KL004" in codes


@pytest.mark.parametrize("default, launch, off", [
    ("0.0", None, True),  # the option's default, which no launch changes
    ("0.05", None, False),
    ("0.0", "python train.py --kl_coefficient 0.05\n", False),  # the launch trains with the term
    ("0.0", "python train.py --kl_coefficient 0\n", True),
])
def test_an_option_whose_default_and_launches_give_zero_trains_nothing(tmp_path, default, launch, off):
    files = {"train.py": ARGPARSE.format(default=default)} | ({"run.sh": launch} if launch else {})
    codes = _codes(tmp_path, "args.kl_coefficient", files)
    assert ("KL004" not in codes) is off


def test_a_zero_in_yaml_does_not_override_the_option_a_script_declares(tmp_path):
    """A Python option of the same name decides: its default of 0.05 trains the term, whatever a YAML file says."""
    files = {"train.py": ARGPARSE.format(default="0.05"), "configs/other.yaml": "kl_coefficient: 0.0\n"}
    assert "KL004" in _codes(tmp_path, "args.kl_coefficient", files)


DATACLASS = """\
from dataclasses import dataclass
from trainer import train


@dataclass
class Config:
    kl_coefficient: float = 0.0
    lr: float = 1e-2

{presets}
train(Config(), *build())
"""


@pytest.mark.parametrize("presets, off", [
    ("", True),
    ('PRESETS = {"full": Config(lr=1e-3, kl_coefficient=1e-3)}', False),  # a preset trains the term
    ('PRESETS = {"smoke": Config(kl_coefficient=0.0)}', True),
])
def test_a_dataclass_field_of_zero_is_off_unless_code_sets_it(tmp_path, presets, off):
    """wassname/grpo_proj2 (sixty-eighth set) declares `beta: float = 0.0` but its `full` preset builds
    `Config(..., beta=1e-3)`: the k3 loss that preset trains is still reported."""
    codes = _codes(tmp_path, "config.kl_coefficient", {"train.py": DATACLASS.format(presets=presets)})
    assert ("KL004" not in codes) is off


# MingxuanZhangPurdue/miniRL (seventy-ninth set): the only code that sets the coefficient is a unit test of the loss
UNIT_TEST = """\
from train import Config
from trainer import train


def test_the_kl_term_moves_the_loss():
    config = Config(kl_coefficient=0.1)
    {body}
"""


@pytest.mark.parametrize("name, body, off", [
    ("tests/test_trainer.py", "assert config.kl_coefficient > 0", True),  # a test's value is no run
    ("tests/check_trainer.py", "assert config.kl_coefficient > 0", False),  # not a pytest module: a script may run
])
def test_a_unit_test_that_sets_the_coefficient_is_no_run(tmp_path, name, body, off):
    files = {"train.py": DATACLASS.format(presets=""), name: UNIT_TEST.format(body=body)}
    assert ("KL004" not in _codes(tmp_path, "config.kl_coefficient", files)) is off


KL_LOSS = """\
from dataclasses import dataclass


@dataclass
class LossConfig:
    use_kl_loss: bool = False
    kl_loss_coef: float = 0.0


def policy_loss(logprobs, old_logprobs, ref_logprobs, advantages, cfg):
    ratio = (logprobs - old_logprobs).exp()
    loss = -ratio * advantages
    if cfg.use_kl_loss:
        d = ref_logprobs - logprobs
        loss = loss + cfg.kl_loss_coef * (d.exp() - d - 1)
    return loss.mean()
"""

KL_TEST = """\
import torch
from kl_loss import LossConfig, policy_loss


def test_kl_penalty_raises_loss():
    lp = torch.zeros(1, 2, requires_grad=True)
    adv, ref = torch.ones(1, 2), torch.full((1, 2), -1.0)
    loss = policy_loss(lp, torch.zeros(1, 2), ref, adv, LossConfig(use_kl_loss=True, kl_loss_coef=0.1))
    {check}
"""


@pytest.mark.parametrize("check, codes", [
    ("assert loss > 0", []),  # the value checked: no gradient is taken, nothing is trained
    ("loss.backward()", [("test_kl_loss.py", 8, "KL002")]),
])
def test_a_unit_test_reports_only_what_it_differentiates(tmp_path, check, codes):
    """miniRL's test of its loss turns the switched-off k3 term on (`kl_loss_coef=0.1`): checking the loss's value
    follows no gradient of it, so nothing is reported there; a test that backpropagates it is judged as training."""
    (tmp_path / "kl_loss.py").write_text(KL_LOSS)
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_kl_loss.py").write_text(KL_TEST.format(check=check))
    found = lint_paths([str(tmp_path)], jobs=1).findings
    assert [(f.path.rsplit("/", 1)[-1], f.line, f.code) for f in found] == codes


@pytest.mark.parametrize("source, evaluated", [
    ("def test_value():\n    assert loss(x) > 0\n", True),
    ("def test_gradient():\n    loss(x).backward()\n", False),
    ("def test_grad():\n    torch.autograd.grad(loss(x), x)\n", False),
    ("def test_training():\n    trainer.train()\n", False),
    ("def check_value():\n    assert loss(x) > 0\n", False),  # not a unit test
])
def test_only_evaluated(source, evaluated):
    import libcst as cst

    from klaudit.lint.syntax import only_evaluated

    assert only_evaluated(cst.parse_module(source).body[0]) is evaluated


# yonseivnl/vlm-rlaif (eighty-sixth set): `kl_approximator: str = field(default="k1")`, and the one launch script runs
# the trainer without setting it: the trainer's `elif self.args.kl_approximator == "k3":` branch (k3 in the reward,
# KL004) never runs. Without a launch (a library's option, TRL's `kl_estimator`; minimind's README choice of
# `--loss_type`) the value is the user's to choose, and each branch is judged.
SWITCHED = """\
from dataclasses import dataclass, field

import torch


@dataclass
class Arguments:
    kl_approximator: str = field(default="k1")
    kl_coef: float = 0.1


class Trainer:
    def shape_rewards(self, scores, logprobs, ref_logprobs):
        if {read} == "k1":
            kl = logprobs - ref_logprobs
        elif {read} == "k3":
            log_r = ref_logprobs - logprobs
            kl = torch.exp(log_r) - 1.0 - log_r
        else:
            raise ValueError("unknown estimator")
        rewards = -self.args.kl_coef * kl
        rewards[:, -1] += scores
        return rewards
"""
LAUNCH = {"run.sh": "torchrun --nproc-per-node 8 trainer.py --kl_coef 0.1\n"}


@pytest.mark.parametrize("read, files, k3", [
    ("self.args.kl_approximator", LAUNCH, False),  # the default's branch only
    ("args.kl_approximator", LAUNCH, False),
    ("self.args.kl_approximator", {}, True),  # no launch: the user's choice
    ("self.args.kl_approximator", {"run.sh": "python trainer.py --kl_approximator k3\n"}, True),  # a launch selects it
    ("self.args.kl_approximator", LAUNCH | {"configs/a.yaml": "kl_approximator: k3\n"}, True),  # a config may set it
    ("self.args.kl_approximator", LAUNCH | {"sweep.py": "from trainer import Arguments\nArguments(kl_approximator='k3')\n"},
     True),
    ("self.kl_approximator", LAUNCH, True),  # the instance's own attribute, not the option
])
def test_a_branch_on_an_option_value_no_run_gives_never_runs(tmp_path, read, files, k3):
    text = SWITCHED.format(read=read)
    if read == "args.kl_approximator":
        text = text.replace("    def shape_rewards(self, ", "    def shape_rewards(self, args, ")
    codes = _codes(tmp_path, "0", files | {"trainer.py": text})
    assert ("KL004" in codes) is k3


@pytest.mark.parametrize("launch, k3", [
    # PR1 (fresh89): the launch runs the training script below a variable naming the project's folder, and the
    # options are a dataclass of another module the script imports: the default's branch only
    ("torchrun ${PR1_PATH}/src/train.py --kl_coef 0.1\n", False),
    ("torchrun $ROOT/src/train.py --kl_coef 0.1\n", False),
    # a script that does not import the options' module: its parser may not read them, so both branches stay
    ("torchrun ${PR1_PATH}/src/other.py --kl_coef 0.1\n", True),
])
def test_an_option_declared_in_a_module_the_launched_script_imports(tmp_path, launch, k3):
    arguments, trainer = SWITCHED.split("\n\nclass Trainer:")
    files = {"src/arguments.py": arguments, "src/trainer.py": "import torch\n\n\nclass Trainer:" + trainer.format(
        read="self.args.kl_approximator"),
        "src/train.py": "from arguments import Arguments\nfrom trainer import Trainer\n",
        "src/other.py": "from trainer import Trainer\n", "run.sh": launch}
    codes = _codes(tmp_path, "0", files)
    assert ("KL004" in codes) is k3


# Corleno/KEPO (fresh93): the trainer copies the option in __init__ (`self.beta_rl = args.beta_rl`), the project's
# configuration class gives it 0.0, and no launch of the module that parses it (`torchrun -m src.rl.train`) sets it:
# the k3 term it scales is 0 in every run. With no launch the option is its users' to set, as a library's is.
COPIED = """\
import torch


class Trainer:
    def __init__(self, model, args):
        self.model = model
        self.beta_rl = args.beta_rl

    def loss(self, logps, ref_logps, advantages, mask):
        kl = torch.exp(ref_logps - logps) - (ref_logps - logps) - 1
        per_token = -(torch.exp(logps - logps.detach()) * advantages.unsqueeze(1) - self.beta_rl * kl)
        return ((per_token * mask).sum(dim=1) / mask.sum(dim=1)).mean()
"""
COPIED_CONFIG = "from dataclasses import dataclass\n\n\n@dataclass\nclass Arguments:\n    beta_rl: float = 0.0 \n"
COPIED_ENTRY = ("from transformers import HfArgumentParser\n\nfrom .config import Arguments\nfrom .trainer import Trainer\n\n"
                "args = HfArgumentParser(Arguments).parse_args_into_dataclasses()[0]\nTrainer(None, args)\n")


@pytest.mark.parametrize("launch, off", [
    ("torchrun --nproc_per_node=4 -m src.rl.train --lr 1e-6\n", True),
    ("torchrun --nproc_per_node=4 -m src.rl.train --beta_rl 0.01\n", False),  # a run that trains the term
    (None, False),  # no launch: the users' choice
])
def test_a_coefficient_copied_from_an_option_no_launch_sets_trains_nothing(tmp_path, launch, off):
    files = {"src/rl/trainer.py": COPIED, "src/rl/config.py": COPIED_CONFIG, "src/rl/train.py": COPIED_ENTRY,
             "src/rl/__init__.py": ""} | ({"scripts/run.sh": launch} if launch else {})
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    codes = {f.code for f in lint_paths([str(tmp_path)], jobs=1).findings}
    assert ("KL002" not in codes) is off, codes
