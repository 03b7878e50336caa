"""TRL's PPOConfig: the estimator its trainer subtracts from the token rewards before GAE (klaudit.frameworks.trl_ppo).

Verdicts (kl-math.md section 8): k1 in the reward with returns to go is unbiased (row 6); k3 in the reward
(row 7), k2 (row 8), |log-ratio| (row 9) and the detached exact per-step KL (row 10) are KL004.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from klaudit.config import Settings
from klaudit.lint.engine import lint_paths
from klaudit.lint.fixing import applicabilities, fix_findings


def _findings(tmp_path, source):
    (tmp_path / "train.py").write_text(source)
    return lint_paths([str(tmp_path)], settings=Settings(root=tmp_path), jobs=1).findings


@pytest.mark.parametrize("imported, call, expected", [
    ("from trl import PPOConfig", 'PPOConfig(model_name="gpt2", kl_penalty="full", ppo_epochs=1)', ["KL004"]),  # row 10
    ("from trl import PPOConfig", 'PPOConfig(kl_penalty="mse", ppo_epochs=1)', ["KL004"]),  # row 8
    ("from trl import PPOConfig", 'PPOConfig(kl_penalty="abs", ppo_epochs=1)', ["KL004"]),  # row 9
    ("from trl import PPOConfig", 'PPOConfig(kl_penalty="kl", ppo_epochs=1)', []),  # row 6
    ("from trl import PPOConfig", 'PPOConfig(kl_penalty="abs", init_kl_coef=0.0)', []),  # no KL
    ("from trl.experimental.ppo import PPOConfig", 'PPOConfig(kl_estimator="k3", num_ppo_epochs=1)', ["KL004"]),  # row 7
    ("import trl", 'trl.PPOConfig(kl_estimator="k3", kl_coef=0.05, num_ppo_epochs=1)', ["KL004"]),
    ("from trl import PPOConfig", 'PPOConfig(kl_estimator="k1", num_ppo_epochs=1)', []),
    ("from trl import PPOConfig", "PPOConfig(learning_rate=1e-5)", []),  # names no KL or batch key: not read
    ("from trl import PPOConfig", 'PPOConfig(kl_estimator="k3", kl_coef=0)', []),
    ("from tunix.rl.ppo.ppo_learner import PPOConfig", 'PPOConfig(kl_method="kl")', []),  # tunix's class: k1
    ("from mylib import PPOConfig", 'PPOConfig(kl_penalty="full")', []),  # another library's class of that name
    # several optimizer steps per batch: the k1 reward, computed once, meets only the PPO token ratio (row 23)
    ("from trl import PPOConfig", 'PPOConfig(kl_penalty="kl")', ["KL008"]),  # 4 epochs by default
    ("from trl import PPOConfig", "PPOConfig(batch_size=64, mini_batch_size=16, ppo_epochs=1)", ["KL008"]),
    ("from trl import PPOConfig", "PPOConfig(batch_size=4, mini_batch_size=2, gradient_accumulation_steps=2, "
                                  "ppo_epochs=1)", []),  # one update of the whole batch
    ("from trl import PPOConfig", "PPOConfig(ppo_epochs=args.ppo_epochs)", []),  # a count it cannot read
    # every epoch takes a step: two epochs make two steps whatever the batch counts (LLaMA-Factory's call)
    ("from trl import PPOConfig", "PPOConfig(mini_batch_size=args.per_device_train_batch_size, "
                                  "batch_size=backward * args.ppo_buffer_size, ppo_epochs=2)", ["KL008"]),
    ("from trl import PPOConfig", "PPOConfig(batch_size=backward * buffer, ppo_epochs=1)", []),
    ("from trl import PPOConfig", "PPOConfig(kl_coef=0.05, num_mini_batches=args.n)", ["KL008"]),  # 4 epochs
    ("from trl import PPOConfig", "PPOConfig(kl_coef=0.05, num_mini_batches=args.n, num_ppo_epochs=1)", []),
    ("from trl import PPOConfig", "PPOConfig(kl_coef=0.05, num_mini_batches=2, num_ppo_epochs=1)", ["KL008"]),
    ("from trl import PPOConfig", 'PPOConfig(kl_estimator="k3")', ["KL004", "KL008"]),
    # a micro-batch of one response: the policy loss's token mean is per response, 1/L on the KL reward (row 21)
    ("from trl import PPOConfig", "PPOConfig(kl_coef=0.05, num_ppo_epochs=1, per_device_train_batch_size=1)",
     ["KL007"]),
    ("from trl import PPOConfig", "PPOConfig(kl_coef=0.05, per_device_train_batch_size=1)", ["KL007", "KL008"]),
    ("from trl import PPOConfig", "PPOConfig(kl_coef=0.05, num_ppo_epochs=1, per_device_train_batch_size=4)", []),
    ("from trl import PPOConfig", "PPOConfig(kl_coef=0.05, num_ppo_epochs=1, per_device_train_batch_size=args.bs)",
     []),
    ("from trl import PPOConfig", 'PPOConfig(kl_penalty="kl", ppo_epochs=1, batch_size=1, mini_batch_size=1)',
     ["KL007"]),  # before TRL 0.12: the mini-batch is the backward pass
    # both APIs at once (HyperKuvid-Labs' ppo.py, forty-ninth set): the first PPOConfig has no output_dir, the rewritten
    # one no init_kl_coef, target or horizon; each release raises a TypeError, so nothing trains
    ("from trl import PPOConfig", 'PPOConfig(output_dir="out", init_kl_coef=0.2, target=6, horizon=10000)', []),
    ("from trl import PPOConfig", 'PPOConfig(kl_coef=0.05, ppo_epochs=4)', []),
    ("from trl import PPOConfig", 'PPOConfig(output_dir="out", kl_coef=0.05)', ["KL008"]),  # the rewritten one alone
])
def test_the_estimator_of_the_kl_reward(tmp_path, imported, call, expected):
    assert sorted(f.code for f in _findings(tmp_path, f"{imported}\n\nconfig = {call}\n")) == expected


# a config of one API handed to the other API's trainer (abhinav30219/MedLogicTrace, fifty-second set: kl_coef, which
# only the rewritten PPOConfig has, with the first PPOTrainer's step loop): no release runs both, so nothing trains
DRIVEN = """\
from trl import PPOConfig, PPOTrainer

config = PPOConfig({keys})
ppo_trainer = PPOTrainer({trainer_keys})
{loop}
"""
FIRST_LOOP = "for batch in data:\n    stats = ppo_trainer.step(batch.queries, batch.responses, batch.rewards)"
REWRITTEN_RUN = "ppo_trainer.train()"


@pytest.mark.parametrize("keys, trainer_keys, loop, expected", [
    ("kl_coef=0.05, batch_size=16", "config=config, model=model, tokenizer=tok", FIRST_LOOP, []),
    ("kl_coef=0.05, batch_size=16", "args=config, processing_class=tok, model=model, ref_model=ref, "
                                    "reward_model=rm, train_dataset=data", REWRITTEN_RUN, ["KL008"]),
    ('kl_penalty="abs", init_kl_coef=0.2, ppo_epochs=1', "config, model, ref, tok, dataset=data", FIRST_LOOP, ["KL004"]),
    ('kl_penalty="abs", init_kl_coef=0.2, ppo_epochs=1', "args=config, processing_class=tok, model=model, "
                                                          "ref_model=ref, reward_model=rm, train_dataset=data",
     REWRITTEN_RUN, []),
    # `tokenizer` names neither API (0.13 and 0.14 take it for processing_class); a loop that calls both names neither
    ("kl_coef=0.05, batch_size=16", "config=config, model=model, tokenizer=tok", REWRITTEN_RUN, ["KL008"]),
    ("kl_coef=0.05, batch_size=16", "config=config, model=model, train_dataset=data", FIRST_LOOP, ["KL008"]),
])
def test_a_config_of_one_api_driven_by_the_other_apis_trainer_trains_nothing(tmp_path, keys, trainer_keys, loop,
                                                                             expected):
    source = DRIVEN.format(keys=keys, trainer_keys=trainer_keys, loop=loop)
    assert sorted(f.code for f in _findings(tmp_path, source)) == expected


def test_the_finding_is_at_the_estimator_and_its_fix_sets_k1(tmp_path):
    source = 'from trl import PPOConfig\n\nconfig = PPOConfig(kl_estimator="k3", kl_coef=0.1, num_ppo_epochs=1)\n'
    [finding] = _findings(tmp_path, source)
    assert (finding.line, finding.column) == (3, 20)
    assert "[TRL PPO: kl_estimator=k3, kl_coef=0.1, num_ppo_epochs=1]" in finding.message
    run = fix_findings([finding], applicabilities(unsafe=True), write=True)
    text = (tmp_path / "train.py").read_text()
    ast.parse(text)
    assert 'kl_estimator="k1"' in text and run.fixed == [finding]
    assert _findings(tmp_path, text) == []


def test_a_kl_reward_over_several_steps_is_reported_at_the_count(tmp_path):
    """The legacy defaults (4 epochs) where the call sets only the estimator; the epochs where they are set."""
    [default] = _findings(tmp_path, 'from trl import PPOConfig\n\nconfig = PPOConfig(kl_penalty="kl")\n')
    [counted] = _findings(tmp_path, "from trl import PPOConfig\n\nconfig = PPOConfig(\n    ppo_epochs=2)\n")
    assert (default.code, default.line) == ("KL008", 3) and "4 optimizer steps per batch" in default.message
    assert (counted.code, counted.line, counted.column) == ("KL008", 4, 5) and "ppo_epochs=2" in counted.message


def test_epochs_bound_the_steps_where_the_batch_counts_are_computed(tmp_path):
    """LLaMA-Factory builds the legacy PPOConfig from its own options: the epochs come from a dataclass
    default (4), the batch size from a product the lint does not evaluate. The steps are at least the epochs,
    and the finding is at the epochs."""
    (tmp_path / "args.py").write_text("from dataclasses import dataclass, field\n\n\n@dataclass\n"
                                      "class FinetuningArguments:\n    ppo_epochs: int = field(\n"
                                      "        default=4, metadata={})\n")
    [finding] = _findings(tmp_path, "from trl import PPOConfig\n\nconfig = PPOConfig(\n"
                                    "    batch_size=backward * finetuning_args.ppo_buffer_size,\n"
                                    "    ppo_epochs=finetuning_args.ppo_epochs,\n)\n")
    assert (finding.code, finding.line, finding.column) == ("KL008", 5, 5)
    assert "at least 4 optimizer steps per batch" in finding.message


COMMAND_LINE_SCRIPT = '''\
from transformers import HfArgumentParser
from trl import ModelConfig, PPOConfig, PPOTrainer, ScriptArguments

if __name__ == "__main__":
    parser = HfArgumentParser((ScriptArguments, PPOConfig, ModelConfig))
    script_args, training_args, model_args = parser.parse_args_into_dataclasses()
    trainer = PPOTrainer(
        args=training_args,
        processing_class=tokenizer,
        model=policy,
        ref_model=ref_policy,
        reward_model=reward_model,
    )
    trainer.train()
'''


@pytest.mark.parametrize("launch, expected", [
    (None, [("KL008", 7)]),  # run as written: PPOConfig's defaults, 4 PPO epochs per batch (row 23)
    ("python ppo.py --learning_rate 3e-6 --missing_eos_penalty 1.0\n", [("KL008", 7)]),  # still the defaults
    ("python ppo.py --num_ppo_epochs 1 --num_mini_batches 1\n", []),  # the launch decides, not the defaults
])
def test_a_ppo_config_read_from_the_command_line_trains_at_its_defaults(tmp_path, launch, expected):
    """TRL's examples/scripts/ppo/ppo_tldr.py and its copies (TPNxl/592rli-llm-project, twenty-fifth set) parse
    PPOConfig with HfArgumentParser: where no launch of the project sets its KL or step keys, the trainer takes 4
    PPO epochs of one mini-batch per batch of rollouts, and the k1 reward computed once per batch meets only the
    token ratio on the later ones (row 23, KL008), reported at the PPOTrainer call."""
    (tmp_path / "ppo.py").write_text(COMMAND_LINE_SCRIPT)
    if launch is not None:
        (tmp_path / "run.sh").write_text(launch)
    found = lint_paths([str(tmp_path)], settings=Settings(root=tmp_path), jobs=1).findings
    assert [(f.code, f.line) for f in found] == expected
    assert all("PPOConfig from the command line" in f.message for f in found)


@pytest.mark.parametrize("config, expected", [
    ("num_ppo_epochs: 1\nnum_mini_batches: 1\nkl_coef: 0.02\n", []),  # the config file decides, not the defaults
    ("learning_rate: 1.0e-5\n", [("KL008", 7)]),  # a config file that leaves the keys: still the defaults
])
def test_a_ppo_config_read_from_a_config_file_is_left_to_it(tmp_path, config, expected):
    """HollyRiver/SurvLLM (seventy-first set) parses PPOConfig with TrlParser and runs `python PPO.py --config
    config/PPO_config_v1.1.2.12H.yaml`; each of its PPO configs sets `num_ppo_epochs: 1`: the YAML decides, and
    the defaults' 4 epochs (a false KL008) are not the run's."""
    (tmp_path / "ppo.py").write_text(COMMAND_LINE_SCRIPT.replace("HfArgumentParser", "TrlParser").replace(
        "parse_args_into_dataclasses()", "parse_args_and_config()"))
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "ppo.yaml").write_text(config)
    found = lint_paths([str(tmp_path)], settings=Settings(root=tmp_path), jobs=1).findings
    assert [(f.code, f.line) for f in found] == expected


LEGACY_SCRIPT = '''\
from transformers import HfArgumentParser
from trl import PPOConfig, PPOTrainer

parser = HfArgumentParser((ScriptArguments, PPOConfig))
args, ppo_config = parser.parse_args_into_dataclasses()
ppo_trainer = PPOTrainer(ppo_config, model, ref_model, tokenizer, dataset=dataset)
'''
LEGACY_LAUNCH = '''\
# python /home/someone/project/train_code/ppo_train.py --num_ppo_epochs 1
python /home/someone/project/train_code/ppo_train.py \\
    --batch_size 1 \\
    --mini_batch_size 1 \\
    --learning_rate 3e-6 \\
    --ppo_epochs {epochs} \\
    --log_with=wandb
'''


@pytest.mark.parametrize("epochs, expected", [(3, [("KL007", 4), ("KL008", 6)]), (1, [("KL007", 4)])])
def test_a_shell_launch_of_a_script_that_reads_ppo_config_from_its_command_line_is_judged(tmp_path, epochs, expected):
    """SsmallSong/TRL_FT (thirty-fifth set) runs its copy of TRL's first PPO example, which parses PPOConfig with
    HfArgumentParser, as `python /home/.../train_code/ppo_train.py --batch_size 1 --mini_batch_size 1 --ppo_epochs
    3`: three optimizer steps on each batch, the k1 reward stale on the later two (row 23, KL008 at the count), and
    each backward pass one response, whose token mean weighs it by 1/L (row 21, KL007). The command passes the
    first API's keys; the commented command above it runs nothing."""
    (tmp_path / "train_code").mkdir()
    (tmp_path / "train_code" / "ppo_train.py").write_text(LEGACY_SCRIPT)
    (tmp_path / "train_ppo.sh").write_text(LEGACY_LAUNCH.format(epochs=epochs))
    found = lint_paths([str(tmp_path)], settings=Settings(root=tmp_path), jobs=1).findings
    assert [(Path(f.path).name, f.code, f.line) for f in found] == [("train_ppo.sh", *item) for item in expected]
    assert all(f.message.count("[TRL PPO: ") == 1 for f in found)


@pytest.mark.parametrize("pin, imported, call, expected", [
    ("", "from trl import PPOConfig", "PPOConfig(per_device_train_batch_size=4)", []),  # which API is unknown
    # a stated release decides the API of a call that names neither's keys: 0.12's, four epochs by default
    ("trl==0.17.0", "from trl import PPOConfig", "PPOConfig(per_device_train_batch_size=4)", ["KL008"]),
    ("trl==0.17.0", "from trl import PPOConfig", "PPOConfig(per_device_train_batch_size=4, num_ppo_epochs=1)", []),
    # fields only the first PPOConfig has name its API: ppo_epochs 4 by default
    ("", "from trl import PPOConfig", 'PPOConfig(model_name="gpt2", learning_rate=1e-5, log_with="wandb")',
     ["KL008"]),
    # from 0.29 `trl` no longer exports PPOConfig (trl.experimental.ppo does): the import fails first
    ("trl==0.29.0", "from trl import PPOConfig", 'PPOConfig(kl_estimator="k3")', []),
    ("trl==0.29.0", "from trl.experimental.ppo import PPOConfig", 'PPOConfig(kl_estimator="k3")', ["KL004", "KL008"]),
    ("trl==0.28.0", "from trl import PPOConfig", 'PPOConfig(kl_estimator="k3")', ["KL004", "KL008"]),  # deprecated
])
def test_the_release_a_project_states_decides_the_ppo_config_api(tmp_path, pin, imported, call, expected):
    """TRL's own test_ppo_trainer.py (in the 0.16 and 0.17 checkouts of the thirty-second and thirty-fourth sets)
    trains `PPOConfig(output_dir=..., per_device_train_batch_size=4, ...)` at 0.12's defaults, four PPO epochs over
    each batch: its k1 reward is stale on the later three (row 23); the notebooks written for the first PPOTrainer
    set only its fields (`model_name`, `log_with`) and train at its four `ppo_epochs`."""
    if pin:
        (tmp_path / "requirements.txt").write_text(pin + "\n")
    found = _findings(tmp_path, f"{imported}\n\nconfig = {call}\n")
    assert sorted(f.code for f in found) == expected


ONE_RESPONSE_BY_DEFAULT = '''\
import argparse
from trl import PPOConfig, PPOTrainer

parser = argparse.ArgumentParser()
parser.add_argument("--mini_batch_size", type=int, default=1)
args = parser.parse_args()
config = PPOConfig(model_name="gpt2", batch_size=4, mini_batch_size=args.mini_batch_size, ppo_epochs=1)
trainer = PPOTrainer(config=config, model=None, ref_model=None, tokenizer=None)
trainer.step([], [], [])
'''


@pytest.mark.parametrize("launch, expected", [
    (None, ["KL007", "KL008"]),  # run as written: one response a backward pass, four steps a batch of four
    ("python train.py --mini_batch_size 4\n", []),  # the launch's value: one step, four responses a pass
])
def test_a_mini_batch_of_one_from_an_option_default_is_a_per_response_mean(tmp_path, launch, expected):
    """Tankiit/PPO_Learning_to_rank (fresh64): `PPOConfig(mini_batch_size=args.mini_batch_size)` with the option's
    default 1 trains the first PPOTrainer on one response per backward pass, its token mean a 1/L weight on the k1
    reward its advantages carry (row 21, KL007, at the keyword), and batch_size 4 over mini-batches of 1 takes four
    steps per batch (row 23, KL008). A launch that passes 4 trains what it passes."""
    if launch is not None:
        (tmp_path / "run.sh").write_text(launch)
    found = _findings(tmp_path, ONE_RESPONSE_BY_DEFAULT)
    assert sorted(f.code for f in found) == expected
    assert all(f.line == 7 for f in found)


@pytest.mark.parametrize("pin, call, expected", [
    # XanderJC/attention-based-credit (fresh94) pins trl==0.7.4, whose PPOConfig optimizes one response at a time
    # (mini_batch_size=1) by default: the loss is each response's token mean (row 21) over 4 x 16 steps (row 23)
    ("trl==0.7.4", "PPOConfig(ppo_epochs=4, batch_size=16)", [("KL007", "64 optimizer steps"), ("KL008", "64")]),
    ("trl==0.7.11", "PPOConfig(ppo_epochs=4, batch_size=16)", [("KL008", "4 optimizer steps")]),  # 128 a mini-batch
    ("trl==0.7.4", "PPOConfig(ppo_epochs=4, batch_size=16, mini_batch_size=16)", [("KL008", "4 optimizer steps")]),
    ("", "PPOConfig(ppo_epochs=4, batch_size=16)", [("KL008", "4 optimizer steps")]),  # no release named
])
def test_the_first_ppo_configs_defaults_follow_the_release_the_project_names(tmp_path, pin, call, expected):
    (tmp_path / "requirements.txt").write_text(f"torch\n{pin}\n")
    found = _findings(tmp_path, f"from trl import PPOConfig\n\nconfig = {call}\n")
    assert [(f.code, words) for f in found for code, words in expected
            if f.code == code and words in f.message] == expected, [f.message for f in found]
    assert len(found) == len(expected)


def test_a_pin_older_than_every_known_trl_release_targets_the_first_api():
    """trl==0.7.4 is judged by the oldest release klaudit knows, but a PPOConfig that names no key of either API is
    the first PPOTrainer's there: the rewritten one came in 0.12."""
    from klaudit.frameworks.trl_ppo import LEGACY, api_of
    from klaudit.frameworks.versions import Assumed

    assert api_of(Assumed("0.14", "0.7.4 in requirements.txt", older=True, named="0.7.4")) == LEGACY
