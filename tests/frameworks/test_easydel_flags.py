"""EasyDeL's GRPOConfig (erfanzar/EasyDeL, JAX), read without running it and judged by the catalog.

EasyDeL's GRPO adds beta * k3 of the live log-probabilities, exp(ref - logp) - (ref - logp) - 1, to every token's
loss and differentiates it: k3 as a loss (kl-math.md §8, row 3: KL002), on the policy's own samples. Up to 0.1.x the
loss is each completion's token mean, 1/L weights (row 21: KL007 as well); from 0.2 `loss_type` picks the reduction,
"dapo" by default (the batch's tokens: no KL007), "grpo" the per-completion mean again. beta=0 adds no term. The
0.1 releases' `easydel.scripts.finetune.gsm8k_grpo` takes GRPOConfig's fields as flags.
"""

from __future__ import annotations

import pytest

from klaudit.catalog import Aggregation, Config, Estimator, Sampling
from klaudit.config import Settings
from klaudit.frameworks import easydel
from klaudit.frameworks.settings import Setting, cli_flags
from klaudit.frameworks.versions import Assumed
from klaudit.lint.engine import lint_paths

MODULE = "import easydel as ed\n\n\ndef main(model, data):\n    config = {}\n    return ed.GRPOTrainer(config, model, data)\n"


def _codes(tmp_path, files):
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    found = lint_paths([str(tmp_path)], settings=Settings(root=tmp_path), jobs=1).findings
    return sorted((f.path.rsplit("/", 1)[-1], f.line, f.code) for f in found)


@pytest.mark.parametrize("call, pin, expected", [
    ("ed.GRPOConfig(beta=0.04)", None, ["KL002"]),  # 0.3: loss_type "dapo", a batch token-mean
    ("ed.GRPOConfig(num_return_sequences=8)", None, ["KL002"]),  # beta defaults to 0.04
    ('ed.GRPOConfig(beta=0.04, loss_type="grpo")', None, ["KL002", "KL007"]),
    ('ed.GRPOConfig(beta=0.04, loss_type="dr_grpo")', None, ["KL002"]),
    ("ed.GRPOConfig(beta=0.0)", None, []),
    ('ed.GRPOConfig(beta=0.04, loss_type="something_else")', None, []),  # not a reduction EasyDeL has: undecided
    ("ed.GRPOConfig(beta=0.04)", "easydel==0.1.4\n", ["KL002", "KL007"]),  # each completion's token mean
    ("ed.GRPOConfig(**settings)", None, []),
])
def test_grpo_configurations(tmp_path, call, pin, expected):
    files = {"train.py": MODULE.replace("{}", call), **({"requirements.txt": pin} if pin else {})}
    assert [code for _, _, code in _codes(tmp_path, files)] == expected


def test_a_class_imported_from_easydel_by_name_and_trls_own_are_told_apart(tmp_path):
    by_name = "from easydel import GRPOConfig\n\nconfig = GRPOConfig(beta=0.04, loss_type='grpo')\n"
    assert _codes(tmp_path, {"train.py": by_name}) == [("train.py", 3, "KL002"), ("train.py", 3, "KL007")]
    # the KL007 of a loss_type set here points at it
    found = lint_paths([str(tmp_path)], settings=Settings(root=tmp_path), jobs=1).findings
    kl007 = next(f for f in found if f.code == "KL007")
    assert by_name.splitlines()[2][kl007.column - 1:].startswith("loss_type")


LAUNCH = """\
#!/bin/bash
CMD="python -m easydel.scripts.finetune.gsm8k_grpo"
CMD+=" --repo_id meta-llama/Llama-3.2-1B-Instruct"
CMD+=" --max_completion_length 256"
{beta}CMD+=" --num_return_sequences 4"
eopod run "$CMD"
"""


@pytest.mark.parametrize("beta, expected", [
    ('CMD+=" --beta 0.04"\n', [("run.sh", 5, "KL002"), ("run.sh", 5, "KL007")]),
    ("", [("run.sh", 2, "KL002"), ("run.sh", 2, "KL007")]),  # the default 0.04, reported at the launch
    ('CMD+=" --beta 0.0"\n', []),
])
def test_a_launch_of_the_0_1_finetune_script_runs_that_release(tmp_path, beta, expected):
    # the scripts ship only up to 0.1: a launch of one runs 0.1's per-completion mean whatever release is assumed
    assert _codes(tmp_path, {"run.sh": LAUNCH.format(beta=beta)}) == expected


def test_the_catalog_configuration_of_each_release():
    anchor = Setting("0.04", 1, 1, 2)
    early, late = Assumed("0.1"), Assumed("0.3")
    assert easydel.judge({}, early, anchor).config == Config(loss=Estimator.K3, aggregation=Aggregation.SEQ_MEAN,
                                                              sampling=Sampling.ON_POLICY)
    assert easydel.judge({}, late, anchor).config.aggregation is Aggregation.BATCH_MEAN
    assert easydel.judge({"beta": Setting("0", 1, 1, 2)}, late, anchor) is None
    assert easydel.launched_release(late).version == "0.1"


def test_flags_appended_to_a_command_string_are_read():
    text = 'ARGS="--beta 0.1 --lr 1e-6"\nCMD="python train.py"\nCMD+=" --beta 0.2"\n$CMD $ARGS\n'
    assert cli_flags(text, {"beta": "beta", "lr": "lr"})["beta"].value == "0.2"  # the last one wins
    assert cli_flags(text, {"beta": "beta", "lr": "lr"})["lr"].value == "1e-6"
    assert cli_flags('CMD+=" --beta $B"\n', {"beta": "beta"}) == {}  # a value the text does not spell


@pytest.mark.parametrize("call, expected", [
    ("ed.GFPOConfig(beta=0.04)", ["KL002"]),  # GRPO's loss and defaults
    ("ed.GSPOConfig()", []),  # beta 0.0 by default
    ("ed.GSPOConfig(beta=0.04)", ["KL002", "KL007"]),  # and each completion's token mean
])
def test_the_configurations_of_the_grpo_trainers_subclasses(tmp_path, call, expected):
    assert [code for _, _, code in _codes(tmp_path, {"train.py": MODULE.replace("{}", call)})] == expected
