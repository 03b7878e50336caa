"""A `trl grpo --config` recipe that leaves beta out runs with the pinned release's default: 0.04 up to
TRL 0.18 (k3 as a loss, kl-math.md section 8 row 3, KL002), 0.0 from 0.19 (no KL term). Open-R1's recipes
are written this way (recipes/<model>/grpo/config_demo.yaml with trl==0.18.0 in setup.py)."""

from __future__ import annotations

import pytest

from klaudit.config import Settings
from klaudit.lint.engine import lint_paths

RECIPE = "model_name_or_path: m\ndataset_name: d\nlearning_rate: 1.0e-06\nnum_generations: 16\nuse_vllm: true\n"


def findings(tmp_path, pin: str, files: dict[str, str]) -> list[tuple[str, int, str]]:
    (tmp_path / "setup.py").write_text(f'from setuptools import setup\n\nsetup(\n    install_requires=[\n        "trl=={pin}",\n    ],\n)\n')
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    result = lint_paths([str(tmp_path)], settings=Settings(root=tmp_path), jobs=1)
    assert result.errors == []
    return sorted((f.path.rsplit("/", 2)[-2] + "/" + f.path.rsplit("/", 1)[-1], f.line, f.code) for f in result.findings)


def test_a_grpo_recipe_without_beta_has_the_pinned_releases_k3_loss(tmp_path):
    assert findings(tmp_path, "0.18.0", {"recipes/grpo/config.yaml": RECIPE}) == [("grpo/config.yaml", 4, "KL002")]


@pytest.mark.parametrize("pin, name, text", [
    ("0.19.0", "recipes/grpo/config.yaml", RECIPE),  # beta defaults to 0.0 from 0.19: no KL term
    ("0.18.0", "recipes/grpo/config.yaml", RECIPE + "beta: 0.0\n"),  # switched off
    ("0.18.0", "recipes/filtering/config.yaml", RECIPE),  # generation only: num_generations, not a GRPO path
    ("0.18.0", "recipes/grpo/sft.yaml", "model_name_or_path: m\ndataset_name: d\n"),  # no GRPO key
])
def test_recipes_that_train_no_default_kl_stay_silent(tmp_path, pin, name, text):
    assert findings(tmp_path, pin, {name: text}) == []


def test_the_clones_folder_name_does_not_make_a_recipe_grpo(tmp_path):
    """open-r1-cv-grpo (eleventh set): its dataset-filtering configs (num_generations for sampling only) lie in
    a clone whose folder says grpo; only the path inside the linted folder says what the file is."""
    clone = tmp_path / "open-r1-cv-grpo"
    clone.mkdir()
    assert findings(clone, "0.18.0", {"recipes/filtering/config.yaml": RECIPE}) == []
    assert findings(clone, "0.18.0", {"recipes/grpo/config.yaml": RECIPE}) == [("grpo/config.yaml", 4, "KL002")]


GRPO_SCRIPT = ("from trl import GRPOConfig, GRPOTrainer, ModelConfig, TrlParser\n\n"
               "parser = TrlParser((GRPOConfig, ModelConfig))\n"
               "training_args, model_args = parser.parse_args_and_config()\n"
               "GRPOTrainer(model=model_args.model_name_or_path, args=training_args).train()\n")


def test_a_config_a_grpo_launch_passes_is_a_recipe_and_so_are_its_neighbours(tmp_path):
    """rlpvr-open-r1 (the nineteenth set): run_test.sh launches src/open_r1/grpo.py with
    `--config recipes/exp_configs/qwen.yaml`; the other experiment configs beside it are run the same way."""
    launch = "accelerate launch --config_file recipes/zero2.yaml src/open_r1/grpo.py \\\n  --config recipes/exp/qwen.yaml\n"
    files = {"src/open_r1/grpo.py": GRPO_SCRIPT, "run.sh": launch, "recipes/exp/qwen.yaml": RECIPE,
             "recipes/exp/llama.yaml": RECIPE, "recipes/filtering/config.yaml": RECIPE}
    assert findings(tmp_path, "0.18.0", files) == [("exp/llama.yaml", 4, "KL002"), ("exp/qwen.yaml", 4, "KL002")]


def test_a_config_passed_to_a_script_that_is_not_trls_grpo_is_no_recipe(tmp_path):
    launch = "python src/generate.py --config recipes/exp/qwen.yaml\n"
    files = {"src/generate.py": "import vllm\n", "run.sh": launch, "recipes/exp/qwen.yaml": RECIPE}
    assert findings(tmp_path, "0.18.0", files) == []


OWN_TRAINER_SCRIPT = ("from trl import ModelConfig, TrlParser\n"
                      "from arguments import GRPOTrainingArguments\n"
                      "from grpo_trainer import GRPOTrainer\n\n"
                      "parser = TrlParser((GRPOTrainingArguments, ModelConfig))\n"
                      "training_args, model_args = parser.parse_args_and_config()\n"
                      "GRPOTrainer(model=model_args.model_name_or_path, args=training_args).train()\n")


@pytest.mark.parametrize("script, expected", [
    (OWN_TRAINER_SCRIPT, []),  # the project's own arguments and trainer read the keys: its loss is linted as code
    (GRPO_SCRIPT, [("configs/grpo_config.yaml", 4, "KL002")]),  # TRL's GRPOConfig and trainer: a recipe
    # a script that builds TRL's GRPOConfig from the YAML it loads: still TRL's configuration
    ("import yaml\nfrom trl import GRPOConfig\n\nargs = GRPOConfig(**yaml.safe_load(open('c.yaml')))\n",
     [("configs/grpo_config.yaml", 4, "KL002")]),
])
def test_a_grpo_named_config_a_launch_hands_to_the_projects_own_trainer_is_no_recipe(tmp_path, script, expected):
    """yflyzhang/simpleR1 (fifty-eighth set): configs/grpo_config.yaml, whose path says grpo, is passed by every
    launch to src/run_grpo.py, which parses it into the project's own GRPOTrainingArguments (a TrainingArguments)
    for its own GRPOTrainer; its beta is not TRL's, and the loss it sets is reported where the trainer computes it."""
    files = {"src/run_grpo.py": script, "scripts/train.sh": "accelerate launch src/run_grpo.py \\\n"
             "    --config configs/grpo_config.yaml\n", "configs/grpo_config.yaml": RECIPE}
    assert findings(tmp_path, "0.18.0", files) == expected


# schwallergroup/mist (sixtieth set): a batch job launches the GRPO script with the recipe its arguments name, and
# the recipes give no model (the job passes `--model_name_or_path=$MODEL`)
JOB = ("#!/bin/bash\n#SBATCH --nodes=1\nTASK=$1\nCONFIG_FILE=recipes/$TASK.yaml\n"
       "accelerate launch src/open_r1/grpo.py --config $CONFIG_FILE \\\n    --model_name_or_path=$MODEL\n")
BARE_RECIPE = "learning_rate: 1.0e-06\nbeta: 0.001\nnum_generations: 8\n"


@pytest.mark.parametrize("job, expected", [
    ("launch.slurm", [("recipes/rxn.yaml", 2, "KL002"), ("recipes/smiles.yaml", 2, "KL002")]),
    ("launch.sh", [("recipes/rxn.yaml", 2, "KL002"), ("recipes/smiles.yaml", 2, "KL002")]),
    (None, []),  # nothing says these keys are GRPOConfig's: no model, no dataset, no launch
])
def test_recipes_a_batch_job_picks_by_its_argument_are_grpo_recipes(tmp_path, job, expected):
    files = {"src/open_r1/grpo.py": GRPO_SCRIPT, "recipes/rxn.yaml": BARE_RECIPE, "recipes/smiles.yaml": BARE_RECIPE}
    if job is not None:
        files[job] = JOB
    assert findings(tmp_path, "0.18.0", files) == expected
