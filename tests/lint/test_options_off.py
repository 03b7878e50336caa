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
