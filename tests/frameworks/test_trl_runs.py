"""A TRL GRPO trainer's KL branch (`if self.beta != 0.0:`) judged by the beta values the project runs with, and its
older-samples branch (`if self.num_iterations > 1`) by the num_iterations values.

TRL's GRPOTrainer, and a project's copy or subclass of it, adds beta * k3 only when beta != 0. Where every
configuration the project builds or launches leaves beta at 0, the branch never trains; where one sets it
above 0 (or computes it), its verdicts stand (k3 differentiated as a loss: kl-math.md section 8, row 3). Its loss
takes the ratio to stored log-probs only when num_iterations > 1; at 1 the samples are the current policy's, and the
k3 loss is row 3 alone, not also row 22 (KL008).
"""

from __future__ import annotations

import pytest

from klaudit.config import Settings
from klaudit.frameworks import trl_runs
from klaudit.lint.engine import lint_paths

# a subclass of TRL's trainer whose own loss adds k3 under TRL's switch, in the shape TRL's _compute_loss has
SUBCLASS = '''import torch
from trl import GRPOTrainer


class MyTrainer(GRPOTrainer):
    def _compute_loss(self, model, inputs):
        per_token_logps = self._get_per_token_logps(model, inputs["input_ids"])
        mask = inputs["completion_mask"]
        if self.beta != 0.0:
            ref = inputs["ref_per_token_logps"]
            per_token_kl = torch.exp(ref - per_token_logps) - (ref - per_token_logps) - 1
        per_token_loss = -per_token_logps * inputs["advantages"].unsqueeze(1)
        if self.beta != 0.0:
            per_token_loss = per_token_loss + self.beta * per_token_kl
        loss = (per_token_loss * mask).sum() / mask.sum()
        return loss
'''
BUILT = '''from trl import GRPOConfig
from trainer import MyTrainer

args = GRPOConfig(output_dir="out"{keywords})
MyTrainer(model="m", args=args, train_dataset=None).train()
'''
PARSED = '''from trl import GRPOConfig, ModelConfig, TrlParser
from trainer import MyTrainer

args, model_args = TrlParser((GRPOConfig, ModelConfig)).parse_args_and_config()
MyTrainer(model=model_args.model_name_or_path, args=args).train()
'''


def _codes(tmp_path, files: dict[str, str], **settings) -> list[tuple[str, str]]:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    result = lint_paths([str(tmp_path)], settings=Settings(root=tmp_path, **settings), jobs=1)
    assert result.errors == []
    return sorted((f.path.rsplit("/", 1)[-1], f.code) for f in result.findings)


@pytest.mark.parametrize("keywords, kept", [
    ("", False),  # TRL's default from 0.19 on: 0.0
    (", beta=0.0", False),
    (", beta=0.04", True),
    (", beta=BETA", True),  # computed: unknown
    (", **overrides", True),  # may come from the mapping
])
def test_a_subclass_s_kl_branch_counts_only_where_a_configuration_turns_it_on(tmp_path, keywords, kept):
    found = _codes(tmp_path, {"trainer.py": SUBCLASS, "train.py": BUILT.format(keywords=keywords)})
    assert (("trainer.py", "KL002") in found) is kept


REDUCED = SUBCLASS.replace(
    "        loss = (per_token_loss * mask).sum() / mask.sum()\n",
    "        if self.loss_type == \"grpo\":\n"
    "            loss = ((per_token_loss * mask).sum(-1) / mask.sum(-1)).mean()\n"
    "        else:\n"
    "            loss = (per_token_loss * mask).sum() / mask.sum()\n")


def test_loss_type_stays_a_switch_of_the_trainer(tmp_path):
    """Which loss_type a trainer's user picks is that user's choice (a library's trainer, verifiers'): the per-sequence
    mean under `loss_type == "grpo"` (row 21) is reported whatever the project's own configurations pick."""
    found = _codes(tmp_path, {"trainer.py": REDUCED, "train.py": BUILT.format(keywords=', beta=0.04, loss_type="dapo"')})
    assert ("trainer.py", "KL007") in found


# TRL's GKD-style helper in the same trainer: its own `beta` interpolates a generalized JSD, not GRPOConfig's beta
JSD = SUBCLASS + '''
    @staticmethod
    def generalized_jsd_loss(student_logits, teacher_logits, beta=0.5):
        student = torch.log_softmax(student_logits, -1)
        teacher = torch.log_softmax(teacher_logits, -1)
        if beta > 0:
            jsd = (student.exp() * (student - teacher)).sum(-1)
        else:
            jsd = (teacher.exp() * (teacher - student)).sum(-1)
        return jsd.mean()
'''


def test_a_helper_s_own_beta_is_not_grpoconfig_s(tmp_path):
    found = _codes(tmp_path, {"trainer.py": JSD, "train.py": BUILT.format(keywords="")})
    assert ("trainer.py", "KL002") not in found  # the beta != 0 branch of the GRPO loss: beta 0 in every run
    assert ("trainer.py", "KL003") in found  # the exact per-step KL under the helper's own `beta > 0` (row 2)


def test_a_library_that_builds_no_configuration_keeps_its_verdicts(tmp_path):
    # nothing says what beta its users run with
    assert ("trainer.py", "KL002") in _codes(tmp_path, {"trainer.py": SUBCLASS})


@pytest.mark.parametrize("launch, kept", [
    ("accelerate launch train.py --loss_type dapo\n", False),
    ("accelerate launch train.py --beta 0.04\n", True),
    ("accelerate launch train.py --beta=0.0\n", False),
    ("accelerate launch train.py --beta $BETA\n", True),
])
def test_a_parsed_configuration_takes_the_values_its_launches_give(tmp_path, launch, kept):
    found = _codes(tmp_path, {"trainer.py": SUBCLASS, "train.py": PARSED, "run.sh": launch})
    assert (("trainer.py", "KL002") in found) is kept


def test_a_recipe_s_beta_counts(tmp_path):
    found = _codes(tmp_path, {"trainer.py": SUBCLASS, "train.py": PARSED, "recipe.yaml": "beta: 0.02\n"})
    assert ("trainer.py", "KL002") in found


def test_an_older_trl_s_default_turns_the_branch_on(tmp_path):
    # TRL up to 0.18 defaults beta to 0.04
    found = _codes(tmp_path, {"trainer.py": SUBCLASS, "train.py": BUILT.format(keywords="")},
                   frameworks={"trl": "0.18"})
    assert ("trainer.py", "KL002") in found


# an edited copy of TRL's trainer and config, in the shape of MCDwyer/GR-PSPO's grpo_wrapper.py
COPY = '''from dataclasses import dataclass, field
import torch
from transformers import Trainer, TrainingArguments


@dataclass
class GRPOConfig(TrainingArguments):
    beta: float = field(default={default})


class GRPOTrainer(Trainer):
    def __init__(self, model, args=None):
        self.beta = args.beta

    def _compute_loss(self, model, inputs):
        logps = self._get_per_token_logps(model, inputs["input_ids"])
        mask = inputs["completion_mask"]
        if self.beta != 0.0:
            ref = inputs["ref_per_token_logps"]
            per_token_kl = torch.exp(ref - logps) - (ref - logps) - 1
        per_token_loss = -logps * inputs["advantages"].unsqueeze(1)
        if self.beta != 0.0:
            per_token_loss = per_token_loss + self.beta * per_token_kl
        return (per_token_loss * mask).sum() / mask.sum()
'''
COPY_BUILT = '''from wrapper import GRPOConfig, GRPOTrainer

GRPOTrainer("m", GRPOConfig(output_dir="out"{keywords})).train()
'''


@pytest.mark.parametrize("default, keywords, kept", [
    ("0.0", "", False),  # the copy's own default
    ("0.04", "", True),
    ("0.04", ", beta=0.0", False),
    ("0.0", ", beta=0.1", True),
])
def test_an_edited_copy_takes_its_own_config_s_default(tmp_path, default, keywords, kept):
    found = _codes(tmp_path, {"wrapper.py": COPY.format(default=default),
                              "main.py": COPY_BUILT.format(keywords=keywords)})
    assert (("wrapper.py", "KL002") in found) is kept


def test_trls_own_modules_keep_their_verdicts(tmp_path):
    # TRL checked in: its trainer is what every user configures, whatever its own examples set
    found = _codes(tmp_path, {"trl/trainer/custom.py": SUBCLASS, "train.py": BUILT.format(keywords="")})
    assert ("custom.py", "KL002") in found


@pytest.mark.parametrize("text, yaml, expected", [
    ("python train.py --beta 0.04 --lr 1e-6", False, ["0.04"]),
    ('cmd = ["python", "train.py", "--beta", "0.1"]', False, ["0.1"]),
    ("trl grpo --beta=${BETA}", False, [None]),
    ("training_args.beta = 0.2\nself.beta = args.beta\nctx.beta = beta\nself.args.beta = 0.3\n", False, ["0.2", "0.3"]),
    ("beta: 0.0\nadam_beta1: 0.9\n", True, ["0.0"]),
    ("beta: 0.0\n", False, []),  # a Python or shell text has no YAML keys
    ("--beta1 0.9 --beta_schedule cosine", False, []),
])
def test_written_betas(text, yaml, expected):
    assert list(trl_runs.written_values(text, "beta", yaml=yaml)) == expected


@pytest.mark.parametrize("text, yaml, expected", [
    ("accelerate launch grpo.py --num_iterations 4", False, ["4"]),
    ("num_iterations: 2\nbeta: 0.04\n", True, ["2"]),
    ("training_args.num_iterations = 3\n", False, ["3"]),
    ("--num_iterations_per_step 2", False, []),
])
def test_written_iterations(text, yaml, expected):
    assert list(trl_runs.written_values(text, "num_iterations", yaml=yaml)) == expected


@pytest.mark.parametrize("text, expected", [
    # verl's generated configs copy the actor's key into other sections: no value of their own
    ("loss_agg_mode: ${actor_rollout_ref.actor.loss_agg_mode}\n", []),
    ("loss_agg_mode: ${oc.select:actor_rollout_ref.actor.loss_agg_mode,token-mean}\n", ["token-mean"]),
    ("loss_agg_mode: ${oc.env:AGG}\n", [None]),  # computed
    ("loss_agg_mode: ${other.mode}\n", [None]),
])
def test_a_yaml_key_copied_from_another_section_writes_no_value(text, expected):
    assert list(trl_runs.written_values(text, "loss_agg_mode", yaml=True)) == expected


@pytest.mark.parametrize("labels, betas, expected", [
    ((("beta == 0", (False,)),), ("0.0",), False),  # `if beta != 0.0:` at beta 0
    ((("beta == 0", (True,)),), ("0.0",), True),
    ((("beta == 0", (False,)),), ("0.0", "0.04"), True),
    ((("beta == 0", (False,)),), ("0.0", None), True),
    ((("beta > 0", (True,)),), ("0",), False),
    ((("beta", (True,)),), ("0.0",), False),  # `if self.beta:`
    ((("beta", ("auto",)),), ("0.0",), True),  # a string switch of that name is no test of a number
    ((("loss_type", ("grpo",)),), ("0.0",), True),
])
def test_holds_at_betas(labels, betas, expected):
    assert trl_runs.holds(labels, {"beta": betas, "num_iterations": ("1",)}) is expected


@pytest.mark.parametrize("labels, iterations, expected", [
    ((("num_iterations > 1", (True,)),), ("1",), False),  # `old = stored if num_iterations > 1 else ...` never taken
    ((("num_iterations > 1", (True,)),), ("1", "4"), True),
    ((("num_iterations > 1", (True,)),), (None,), True),  # `--num_iterations $ITERS`: unknown
    ((("num_iterations > 1", (False,)),), ("1",), True),
    ((("beta == 0", (False,)), ("num_iterations > 1", (True,))), ("2",), True),
])
def test_holds_at_iterations(labels, iterations, expected):
    assert trl_runs.holds(labels, {"beta": ("0.04",), "num_iterations": iterations}) is expected


@pytest.mark.parametrize("path, source, expected", [
    ("wrapper.py", "class GRPOTrainer(Trainer):\n    def __init__(self, args):\n        self.beta = args.beta\n", [(2, 3)]),
    # TRL's DPOTrainer reads its preference temperature the same way: not a GRPO trainer
    ("dpo.py", "class DPOTrainer(Trainer):\n    def __init__(self, args):\n        self.beta = args.beta\n", []),
    # a method with a beta of its own is left out
    ("mine.py", "class MyTrainer(GRPOTrainer):\n    def loss(self, beta):\n        pass\n\n    def step(self):\n"
                "        return self.beta\n", [(5, 6)]),
    ("vendor/trl/trainer/grpo_trainer.py", "class MyTrainer(GRPOTrainer):\n    def f(self):\n        self.beta\n", []),
])
def test_the_methods_judged_at_the_project_s_betas(path, source, expected):
    assert trl_runs.trainer_methods(path, source, frozenset({"MyTrainer"})) == expected


def test_a_module_python_rejects_configures_nothing_and_stops_nothing(tmp_path):
    # ParkSoeon/Diverse_Guidance_Adapter: `Callable[]` in a module that builds a GRPOConfig; the run reports its
    # KL000 and goes on (the reading of the project's betas must not stop the lint)
    broken = "from trl import GRPOConfig\nRewardFunc = Callable[]\nargs = GRPOConfig(beta=0.1)\n"
    found = _codes(tmp_path, {"broken.py": broken, "trainer.py": SUBCLASS})
    assert ("broken.py", "KL000") in found and ("trainer.py", "KL002") in found


# the ratio of TRL 0.16-0.18's _compute_loss: to the stored log-probs only when each generation is reused
REUSED = SUBCLASS.replace(
    '        per_token_loss = -per_token_logps * inputs["advantages"].unsqueeze(1)\n',
    '        old = inputs["old_per_token_logps"] if self.num_iterations > 1 else per_token_logps.detach()\n'
    '        ratio = torch.exp(per_token_logps - old)\n'
    '        per_token_loss = -ratio * inputs["advantages"].unsqueeze(1)\n')


@pytest.mark.parametrize("keywords, older", [
    (", beta=0.04", False),  # TRL's default num_iterations: 1
    (", beta=0.04, num_iterations=1", False),
    (", beta=0.04, num_iterations=4", True),
    (", beta=0.04, num_iterations=ITERATIONS", True),  # computed: unknown
])
def test_older_samples_count_only_where_a_configuration_reuses_them(tmp_path, keywords, older):
    found = _codes(tmp_path, {"trainer.py": REUSED, "train.py": BUILT.format(keywords=keywords)})
    assert ("trainer.py", "KL002") in found
    assert (("trainer.py", "KL008") in found) is older


def test_a_launch_s_num_iterations_counts(tmp_path):
    found = _codes(tmp_path, {"trainer.py": REUSED, "train.py": PARSED,
                              "run.sh": "accelerate launch train.py --beta 0.04 --num_iterations 2\n"})
    assert ("trainer.py", "KL008") in found


# an edited copy of the first PPOTrainer (TRL up to 0.11) that picks its estimator by self.config.kl_penalty, as
# CN-Eyetk/VLESA-ORL's (seventy-seventh set) and wangxg666/llama-recipes' (seventy-sixth) do
PPO_COPY = '''import torch


class EditedPPOTrainer:
    def __init__(self, config, model, ref_model, kl_ctl):
        self.config = config
        self.model, self.ref_model, self.kl_ctl = model, ref_model, kl_ctl

    def _kl_penalty(self, logprob, ref_logprob):
        if self.config.kl_penalty == "kl":
            return logprob - ref_logprob
        if self.config.kl_penalty == "abs":
            return (logprob - ref_logprob).abs()
        if self.config.kl_penalty == "mse":
            return 0.5 * (logprob - ref_logprob).square()
        raise NotImplementedError(self.config.kl_penalty)

    def compute_rewards(self, scores, logprobs, ref_logprobs):
        rewards = []
        for score, logprob, ref_logprob in zip(scores, logprobs, ref_logprobs):
            kl = self._kl_penalty(logprob, ref_logprob)
            reward = -self.kl_ctl.value * kl
            reward[-1] += score
            rewards.append(reward)
        return rewards
'''


@pytest.mark.parametrize("files, kept", [
    ({"train.py": 'from trl import PPOConfig\n\nc = PPOConfig(kl_penalty="kl", ppo_epochs=1)\n'}, []),
    ({"train.py": "from trl import PPOConfig\n\nc = PPOConfig(ppo_epochs=1)\n"}, []),  # TRL's default, "kl"
    ({"train.py": 'from trl import PPOConfig\n\nc = PPOConfig(kl_penalty="abs", ppo_epochs=1)\n'}, ["abs"]),
    ({"train.py": "from trl import PPOConfig\n\nc = PPOConfig(kl_penalty=args.kl, ppo_epochs=1)\n"}, ["abs", "k2"]),
    ({"train.py": "from trl import PPOConfig\n\nc = PPOConfig(ppo_epochs=1)\n", "ppo.yaml": "kl_penalty: mse\n"},
     ["k2"]),
    ({}, ["abs", "k2"]),  # no PPOConfig in the project: a library, whose users pick
])
def test_an_edited_ppo_trainer_s_estimators_count_where_a_configuration_picks_them(tmp_path, files, kept):
    (tmp_path / "ppo_copy.py").write_text(PPO_COPY)
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    found = lint_paths([str(tmp_path)], settings=Settings(root=tmp_path), jobs=1).findings
    assert sorted(f.message.split(" in the reward")[0] for f in found if f.path.endswith("ppo_copy.py")) == kept
