"""A trainer's KL coefficient read from a configuration section that every run sets to 0 scales nothing.

xclovehsy/passformer (hundred-and-sixth set) keeps `self.kl_coeff = float(rl.get("kl_coeff", 0.0))` in its REINFORCE
trainer and adds `self.kl_coeff * k3` to the loss, and every YAML file of the project says `kl_coeff: 0.0`: the KL
term never trains (reviewed fp, KL002 and KL008). A file that turns it on (0.05) makes it a k3 loss again.
"""

from __future__ import annotations

import pytest

from klaudit.config import Settings
from klaudit.lint.engine import lint_paths

TRAINER = """\
import torch


class Trainer:
    def __init__(self, config, model, optimizer):
        rl = config["rl"]
        self.model, self.optimizer = model, optimizer
        self.kl_coeff = float(rl.get("kl_coeff", 0.0))

    def step(self, batch):
        logp = self.model(batch["input_ids"])
        ref_logp = batch["ref_logp"]
        k3 = torch.exp(ref_logp - logp) - (ref_logp - logp) - 1
        loss = -(batch["advantages"] * logp).mean() + self.kl_coeff * k3.mean()
        loss.backward()
        self.optimizer.step()
"""


@pytest.mark.parametrize("coefficients, reported", [
    (["0.0", "0.0"], False),  # every configuration turns the KL off
    (["0.0", "0.05"], True),  # one turns it on: a k3 loss trains there
])
def test_a_coefficient_every_configuration_sets_to_zero_scales_nothing(tmp_path, coefficients, reported):
    (tmp_path / "trainer.py").write_text(TRAINER)
    (tmp_path / "configs").mkdir()
    for index, value in enumerate(coefficients):
        (tmp_path / "configs" / f"run{index}.yaml").write_text(f"rl:\n  kl_coeff: {value}\n  gamma: 0.99\n")
    found = lint_paths([str(tmp_path)], settings=Settings(root=tmp_path), jobs=1).findings
    assert ("KL002" in {f.code for f in found}) is reported
