"""verl's KL flags in launch scripts and YAML files: read where the user set them, judged by the catalog.

Expected codes come from kl-math.md §8: k1 as a loss row 1 (KL001), k2 as a loss row 2 (KL003),
k3 / low_var_kl as a loss rows 3-4 (KL002), abs as a loss row 5 (KL009), k1 in the reward row 6
(correct, with reward-to-go or the whole-sequence return), k3 in the reward row 7 (KL004), a loss on
top of a full k1 reward row 14 (KL006), a per-sequence token-mean row 21 (KL007).
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from klaudit.config import Settings
from klaudit.frameworks import Context, lint_config
from klaudit.frameworks.settings import shell_overrides, yaml_settings
from klaudit.frameworks.versions import Assumed
from klaudit.lint.engine import lint_paths

LAUNCH = """\
#!/bin/bash
set -x
python3 -m verl.trainer.main_ppo \\
    algorithm.adv_estimator=grpo \\
    data.train_batch_size=1024 \\
    actor_rollout_ref.actor.ppo_mini_batch_size=1024 \\
{flags}
    trainer.total_epochs=15 $@
"""


def codes(*flags: str) -> list[str]:
    text = LAUNCH.format(flags="".join(f"    {flag} \\\n" for flag in flags))
    return sorted(f.code for f in lint_config("run.sh", text))


@pytest.mark.parametrize("flags, expected", [
    (["actor_rollout_ref.actor.use_kl_loss=True"], ["KL002"]),  # default kl_loss_type=low_var_kl
    (["actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.actor.kl_loss_type=kl"], ["KL001"]),
    (["actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.actor.kl_loss_type=mse"], ["KL003"]),
    (["actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.actor.kl_loss_type=abs"], ["KL009"]),
    (["actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.actor.kl_loss_type=k2",
      "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean"], ["KL003", "KL007"]),
    (["algorithm.use_kl_in_reward=True"], []),  # k1 in the reward, GRPO's whole-sequence return
    (["algorithm.use_kl_in_reward=True", "algorithm.adv_estimator=gae"], []),  # reward-to-go
    (["algorithm.use_kl_in_reward=True", "algorithm.kl_penalty=low_var_kl"], ["KL004"]),
    (["algorithm.use_kl_in_reward=True", "actor_rollout_ref.actor.use_kl_loss=True",
      "actor_rollout_ref.actor.kl_loss_type=k3"], ["KL006"]),
    (["actor_rollout_ref.actor.use_kl_loss=False", "actor_rollout_ref.actor.kl_loss_type=k3"], []),  # off
    (["actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.actor.kl_loss_type=k3+"], ["KL003"]),  # k2's gradient
    (["actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.actor.kl_loss_type=abs+"], ["KL003"]),
    (["algorithm.use_kl_in_reward=True", "algorithm.kl_penalty=k3+"], ["KL004"]),  # the reward keeps the value
    (["algorithm.use_kl_in_reward=True", "algorithm.kl_penalty=k1+"], []),
    (["algorithm.use_kl_in_reward=True", "algorithm.kl_penalty=full+"], []),  # 0.9.1 raises NotImplementedError
    (["actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.actor.kl_loss_type=$KL_TYPE"], []),
    # a zero coefficient: that part adds nothing to the gradient (verl-tool's evaluation scripts)
    (["actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.actor.kl_loss_coef=0.0"], []),
    (["actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.actor.kl_loss_coef=0.001"], ["KL002"]),
    (["algorithm.use_kl_in_reward=True", "algorithm.kl_penalty=low_var_kl", "algorithm.kl_ctrl.kl_coef=0"], []),
    (["algorithm.use_kl_in_reward=True", "actor_rollout_ref.actor.use_kl_loss=True", "algorithm.kl_ctrl.kl_coef=0",
      "actor_rollout_ref.actor.kl_loss_type=k3"], ["KL002"]),  # the loss alone: no double count (KL006)
    ([], []),
])
def test_flags_get_the_catalog_s_verdict(flags, expected):
    assert codes(*flags) == expected


@pytest.mark.parametrize("flags, expected", [
    ([], ["KL002"]),  # the template's one step per rollout
    (["actor_rollout_ref.actor.ppo_mini_batch_size=256"], ["KL002", "KL008"]),  # four steps: rows 3-4 and 22
    (["actor_rollout_ref.actor.ppo_epochs=2"], ["KL002", "KL008"]),  # two passes over the rollout
    (["actor_rollout_ref.actor.ppo_mini_batch_size=2048"], ["KL002"]),  # one step, however large the mini-batch
    (["actor_rollout_ref.actor.ppo_mini_batch_size=$MINI"], ["KL002"]),  # computed: decides nothing
    (["algorithm.use_kl_in_reward=True", "algorithm.kl_penalty=low_var_kl",  # the reward: the PPO ratio only (row 23)
      "actor_rollout_ref.actor.use_kl_loss=False", "actor_rollout_ref.actor.ppo_mini_batch_size=256"], ["KL004", "KL008"]),
    (["algorithm.use_kl_in_reward=True", "actor_rollout_ref.actor.use_kl_loss=False",  # even the k1 reward
      "actor_rollout_ref.actor.ppo_mini_batch_size=256"], ["KL008"]),
    (["algorithm.use_kl_in_reward=True", "actor_rollout_ref.actor.use_kl_loss=False",  # one step: row 6, right
      "actor_rollout_ref.actor.ppo_mini_batch_size=1024"], []),
    # Search-R1's copies repeat each prompt n_agent times after the rollout; the mini-batch counts prompts x n
    (["actor_rollout_ref.rollout.n_agent=5"], ["KL002", "KL008"]),  # 1024 x 5 responses / 1024: five steps
    (["actor_rollout_ref.rollout.n_agent=5", "actor_rollout_ref.rollout.n=5"], ["KL002"]),  # as many as it counts
    (["actor_rollout_ref.rollout.n_agent=1"], ["KL002"]),
    (["actor_rollout_ref.rollout.n_agent=$N_AGENT"], ["KL002"]),  # computed: decides nothing
])
def test_a_kl_loss_over_several_optimizer_steps_per_rollout_is_off_policy(flags, expected):
    assert codes("actor_rollout_ref.actor.use_kl_loss=True", *flags) == expected


def test_kl008_points_at_the_flag_that_makes_the_steps():
    text = LAUNCH.format(flags="    actor_rollout_ref.actor.use_kl_loss=True \\\n    actor_rollout_ref.actor.ppo_epochs=2 \\\n")
    stale = next(f for f in lint_config("run.sh", text) if f.code == "KL008")
    assert text.splitlines()[stale.line - 1].strip().startswith("actor_rollout_ref.actor.ppo_epochs=2")


def test_verls_default_batch_sizes_take_four_steps_per_rollout():
    text = "python3 -m verl.trainer.main_ppo actor_rollout_ref.actor.use_kl_loss=True\n"
    found = lint_config("run.sh", text)
    assert sorted(f.code for f in found) == ["KL002", "KL008"]
    stale = next(f for f in found if f.code == "KL008")
    assert (stale.line, stale.column) == (found[0].line, found[0].column)  # no batch flag here: at the KL flag
    assert "ppo_epochs=1 (default), train_batch_size=1024 (default), ppo_mini_batch_size=256 (default)" in stale.message
    assert "ppo_mini_batch_size equal to data.train_batch_size" in stale.fix and "old_logprobs=" in stale.fix


def test_the_finding_points_at_the_flag_and_gives_a_flag_change_with_the_beta_conversion():
    text = LAUNCH.format(flags="    actor_rollout_ref.actor.use_kl_loss=True \\\n"
                               "    actor_rollout_ref.actor.kl_loss_type=low_var_kl \\\n")
    [finding] = lint_config("run.sh", text)
    assert (finding.line, finding.column) == (8, 5)
    assert text.splitlines()[7][finding.column - 1:finding.end_column - 1] == "actor_rollout_ref.actor.kl_loss_type=low_var_kl"
    assert finding.message.startswith("low_var_kl differentiated as a loss, batch-token-mean")
    assert "loss_agg_mode=token-mean (default)" in finding.message
    assert "algorithm.kl_penalty=kl" in finding.fix and "kl_loss_coef / (mean response length)" in finding.fix


def test_shell_variables_are_resolved_and_the_assignment_is_reported():
    text = textwrap.dedent("""\
        use_kl_loss=True
        kl_loss_type="k2"   # the estimator
        python3 -m verl.trainer.main_ppo \\
            actor_rollout_ref.actor.use_kl_loss=${use_kl_loss} \\
            actor_rollout_ref.actor.kl_loss_type=$kl_loss_type
        """)
    settings = shell_overrides(text)
    assert settings["actor_rollout_ref.actor.kl_loss_type"].value == "k2"
    assert settings["actor_rollout_ref.actor.kl_loss_type"].line == 2
    # verl's default batch sizes: four optimizer steps per rollout, so KL008 too, at the estimator's line
    assert [(f.code, f.line) for f in lint_config("run.sh", text)] == [("KL003", 2), ("KL008", 2)]


def test_a_variable_defaulted_from_the_environment_takes_its_default():
    """`ADV_ESTIMATOR=${ADV_ESTIMATOR:-gae}` (RPG's verl fork): the script runs with gae unless the
    environment says otherwise; with a k1 reward beside the low_var_kl loss that is row 14 (KL006)."""
    text = textwrap.dedent("""\
        ADV_ESTIMATOR=${ADV_ESTIMATOR:-gae}
        KL_TYPE="${KL_TYPE:-}"
        python3 -m verl.trainer.main_ppo \\
            algorithm.adv_estimator=${ADV_ESTIMATOR} \\
            algorithm.use_kl_in_reward=True \\
            actor_rollout_ref.actor.use_kl_loss=True \\
            actor_rollout_ref.actor.kl_loss_type=low_var_kl \\
            critic.kl_type=$KL_TYPE
        """)
    settings = shell_overrides(text)
    assert (settings["algorithm.adv_estimator"].value, settings["algorithm.adv_estimator"].line) == ("gae", 1)
    assert settings["critic.kl_type"].value is None  # an empty default says nothing
    assert [f.code for f in lint_config("run.sh", text)] == ["KL006", "KL008"]  # verl's default batch sizes


def test_a_variable_defaulted_from_a_positional_argument_takes_its_default():
    """`ALGO=${1:-grpo}` (an agent project's verl-agent launch, fresh41): the script runs with grpo when launched
    without arguments, so the advantage estimator is known and the low_var_kl loss is row 4 (KL002); the
    positional parameter had been left unknown, and with it the whole verdict."""
    text = textwrap.dedent("""\
        ALGO=${1:-grpo}
        python3 -m verl.trainer.main_ppo \\
            algorithm.adv_estimator=${ALGO} \\
            actor_rollout_ref.actor.use_kl_loss=True \\
            actor_rollout_ref.actor.kl_loss_type=low_var_kl \\
            data.train_batch_size=32 actor_rollout_ref.actor.ppo_mini_batch_size=32
        """)
    assert (shell_overrides(text)["algorithm.adv_estimator"].value) == "grpo"
    assert [f.code for f in lint_config("run.sh", text)] == ["KL002"]


@pytest.mark.parametrize("mini, value", [
    ("${PPO_MINI:-$TRAIN_BATCH}", "4"),
    ('"${PPO_MINI:-${TRAIN_BATCH}}"', "4"),
    ("${PPO_MINI:-$UNSET}", None),  # a variable the script never assigns: unknown
])
def test_a_variable_defaulted_to_another_variable_takes_that_variables_value(mini, value):
    """`PPO_MINI_BATCH="${PPO_MINI_BATCH:-$TRAIN_BATCH}"` (shopagent-rl, fresh97): unless the environment says
    otherwise the mini-batch is the whole batch. Left unknown, the project's runs were not known to take one
    optimizer step per rollout, and its verl copy's KL loss was judged on older samples (a KL008 false positive)."""
    text = textwrap.dedent(f"""\
        TRAIN_BATCH="${{TRAIN_BATCH:-4}}"
        PPO_MINI={mini}
        python3 -m verl.trainer.main_ppo data.train_batch_size="$TRAIN_BATCH" \\
            actor_rollout_ref.actor.ppo_mini_batch_size="$PPO_MINI"
        """)
    assert shell_overrides(text)["actor_rollout_ref.actor.ppo_mini_batch_size"].value == value


def test_an_override_defaulted_from_the_environment_takes_its_default():
    """`kl_loss_type="${POLAR_ACTOR_KL_LOSS_TYPE:-low_var_kl}"` (a search agent's verl launch): the run takes
    low_var_kl unless the environment sets the name, so the clamped k3 loss is row 4 (KL002); a name the script
    assigns itself takes that value, and the finding points at the assignment."""
    text = textwrap.dedent("""\
        python3 -m verl.trainer.main_ppo \\
            actor_rollout_ref.actor.use_kl_loss="${USE_KL:-True}" \\
            actor_rollout_ref.actor.kl_loss_type="${KL_TYPE:-low_var_kl}" \\
            data.train_batch_size=${BSZ:-32} actor_rollout_ref.actor.ppo_mini_batch_size=32
        """)
    settings = shell_overrides(text)
    assert (settings["actor_rollout_ref.actor.kl_loss_type"].value, settings["actor_rollout_ref.actor.kl_loss_type"].line) \
        == ("low_var_kl", 3)
    assert [(f.code, f.line) for f in lint_config("run.sh", text)] == [("KL002", 3)]  # 32 / 32: one step
    assigned = "KL_TYPE=mse\n" + text
    assert shell_overrides(assigned)["actor_rollout_ref.actor.kl_loss_type"].line == 1
    assert [f.code for f in lint_config("run.sh", assigned)] == ["KL003"]  # k2 as a loss, at the assignment


def test_a_colon_default_assigns_a_name_the_script_left_unset():
    """`: "${KL_LOSS_TYPE:=low_var_kl}"` (StreamOPD's launchers, fresh64): the no-op `:` assigns the default unless
    the name is set already, so the run takes the clamped k3 loss (row 4, KL002), reported at the default; a name
    assigned on a line before keeps that value, and a default that is not a literal leaves the value unknown."""
    launch = textwrap.dedent("""\
        {before}: "${{KL_LOSS_TYPE:=low_var_kl}}" ${{BSZ:=32}}
        : "${{ROOT:=$HOME/ckpt}}"
        python3 -m verl.trainer.main_ppo \\
            actor_rollout_ref.actor.use_kl_loss=True \\
            actor_rollout_ref.actor.kl_loss_type="${{KL_LOSS_TYPE}}" \\
            trainer.default_local_dir=$ROOT \\
            data.train_batch_size=$BSZ actor_rollout_ref.actor.ppo_mini_batch_size=32
        """)
    text = launch.format(before="")
    settings = shell_overrides(text)
    loss_type = settings["actor_rollout_ref.actor.kl_loss_type"]
    assert (loss_type.value, loss_type.line, loss_type.column) == ("low_var_kl", 1, 6)
    assert settings["data.train_batch_size"].value == "32" and settings["trainer.default_local_dir"].value is None
    assert [(f.code, f.line) for f in lint_config("run.sh", text)] == [("KL002", 1)]  # 32 / 32: one step
    assigned = launch.format(before="KL_LOSS_TYPE=mse\n")
    assert shell_overrides(assigned)["actor_rollout_ref.actor.kl_loss_type"].value == "mse"
    assert [f.code for f in lint_config("run.sh", assigned)] == ["KL003"]  # k2 as a loss


def test_shell_arithmetic_over_known_variables_gives_the_batch_sizes():
    """verl's own e2e script: `train_prompt_bsz=$((train_prompt_mini_bsz * 2))`: two optimizer steps per
    rollout of the k3 loss (row 22), KL008 at the mini-batch's assignment. An unknown name, or an operator
    other than + - * / %, leaves the value unknown."""
    text = textwrap.dedent("""\
        NUM_GPUS=${NUM_GPUS:-8}
        micro=$((2 * NUM_GPUS))
        mini=$(( (micro + 0) * 4 / 2 ))
        bsz=$((mini * 2))
        odd=$((mini * UNSET))
        shift=$((mini << 1))
        python3 -m verl.trainer.main_ppo \\
            data.train_batch_size=${bsz} \\
            actor_rollout_ref.actor.ppo_mini_batch_size=${mini} \\
            actor_rollout_ref.actor.use_kl_loss=True \\
            critic.a.b=$odd critic.c.d=$shift
        """)
    settings = shell_overrides(text)
    assert settings["data.train_batch_size"].value == "64" and settings["data.train_batch_size"].line == 4
    assert settings["actor_rollout_ref.actor.ppo_mini_batch_size"].value == "32"
    assert settings["critic.a.b"].value is None and settings["critic.c.d"].value is None
    assert [(f.code, f.line) for f in lint_config("run.sh", text)] == [("KL002", 10), ("KL008", 3)]
    assert [f.code for f in lint_config("run.sh", text.replace("bsz=$((mini * 2))", "bsz=$((mini))"))] == ["KL002"]


def test_bash_bracket_arithmetic_gives_the_batch_sizes():
    """Tree-GRPO (fresh102), like Search-R1's launches, computes its batch sizes with bash's older arithmetic,
    `train_batch_size=$[$n_gpus_per_node * 64]`: 512 prompts a rollout over mini-batches of 64 are eight optimizer
    steps (row 22), KL008 at the mini-batch's assignment. Before, the value ended at its first space and was unknown,
    and the launch was read as one step a rollout."""
    text = textwrap.dedent("""\
        n_gpus_per_node=8
        train_batch_size=$[$n_gpus_per_node * 64]
        actor_ppo_mini_batch_size=$[$n_gpus_per_node * 8]
        unknown=$[$n_gpus_per_node * $UNSET]
        python3 -m verl.trainer.main_ppo \\
            data.train_batch_size=$train_batch_size \\
            actor_rollout_ref.actor.ppo_mini_batch_size=$actor_ppo_mini_batch_size \\
            actor_rollout_ref.actor.use_kl_loss=true \\
            critic.a.b=$unknown
        """)
    settings = shell_overrides(text)
    assert settings["data.train_batch_size"].value == "512" and settings["data.train_batch_size"].line == 2
    assert settings["actor_rollout_ref.actor.ppo_mini_batch_size"].value == "64"
    assert settings["critic.a.b"].value is None
    assert [(f.code, f.line) for f in lint_config("run.sh", text)] == [("KL002", 8), ("KL008", 3)]


@pytest.mark.parametrize("defaults, batch", [
    ("TRAIN_BATCH_SIZE=${TRAIN_BATCH_SIZE:-2}\nROLLOUT_N=4\n", "2"),  # 8 rows already split over 8 GPUs
    ("TRAIN_BATCH_SIZE=${TRAIN_BATCH_SIZE:-3}\nROLLOUT_N=4\n", "4"),  # raised once, to 16 rows
    ("TRAIN_BATCH_SIZE=${TRAIN_BATCH_SIZE:-3}\nROLLOUT_N=$1\n", None),  # the test reads an unknown: unknown
])
def test_a_while_loop_on_arithmetic_is_run_to_the_value_it_leaves(defaults, batch):
    """Luzhenyan/verl_memagent (hundred-and-sixth set) raises its batch until the rollout splits evenly over the
    GPUs, `while [[ $(( (TRAIN_BATCH_SIZE * ROLLOUT_N) % N_GPUS )) != 0 ]]; do TRAIN_BATCH_SIZE=$((TRAIN_BATCH_SIZE +
    1)); done`. Before, the body's assignment was read as run once (3 where the loop never turns): a mini-batch of 2
    against a batch of 3 was two optimizer steps a rollout, a KL008 the launch's one step does not have."""
    text = defaults + textwrap.dedent("""\
        N_GPUS=8
        while [[ $(( (TRAIN_BATCH_SIZE * ROLLOUT_N) % N_GPUS )) != 0 ]]; do
          TRAIN_BATCH_SIZE=$((TRAIN_BATCH_SIZE + 1))
        done
        python3 -m verl.trainer.main_ppo data.train_batch_size=$TRAIN_BATCH_SIZE
        """)
    assert shell_overrides(text)["data.train_batch_size"].value == batch


def test_a_name_counted_up_in_another_loop_is_unknown_after_it():
    """A loop the reader does not run (its test is no arithmetic) leaves each name its body counts up unknown, and
    a name it assigns a literal keeps that literal."""
    text = textwrap.dedent("""\
        STEPS=1
        MODEL=a
        for seed in 1 2 3; do
          STEPS=$((STEPS * 2))
          MODEL=b
        done
        python3 -m verl.trainer.main_ppo trainer.total_training_steps=$STEPS actor_rollout_ref.model.path=$MODEL
        """)
    settings = shell_overrides(text)
    assert settings["trainer.total_training_steps"].value is None
    assert settings["actor_rollout_ref.model.path"].value == "b"


def test_a_reference_escaped_for_an_eval_takes_the_value_the_eval_sees():
    """siiRL (fresh89) writes its command as a bash array of words like `use_kl_loss=\\$USE_KL_LOSS` and runs it
    later, in a function, as `eval "${CMD[@]}"`: the escaped `$` expands when eval runs, with the variables the
    whole script has assigned by then (here the mini-batch computed only after the array). Before, such a value
    ended the override: the KL loss was read as off (no KL002) and the batch sizes as verl's defaults."""
    text = textwrap.dedent("""\
        export USE_KL_LOSS=True
        export MINI_PER_NODE=64
        TRAIN_BATCH_SIZE=128
        CMD=(
            python3 -m verl.trainer.main_ppo
            data.train_batch_size=\\$TRAIN_BATCH_SIZE
            actor_rollout_ref.actor.use_kl_loss=\\$USE_KL_LOSS
            actor_rollout_ref.actor.ppo_mini_batch_size=\\${PPO_MINI_BATCH_SIZE}
        )
        main() {
            export PPO_MINI_BATCH_SIZE=$(($MINI_PER_NODE * 1))
            eval "${CMD[@]}"
        }
        main
        """)
    settings = shell_overrides(text)
    assert settings["actor_rollout_ref.actor.use_kl_loss"].value == "True"
    assert settings["data.train_batch_size"].value == "128"
    assert settings["actor_rollout_ref.actor.ppo_mini_batch_size"].value == "64"
    assert [(f.code, f.line) for f in lint_config("run.sh", text)] == [("KL002", 1), ("KL008", 11)]


def test_comments_and_unknown_values_decide_nothing():
    text = "# actor_rollout_ref.actor.use_kl_loss=True\npython3 x.py actor_rollout_ref.actor.kl_loss_type=${oc.env:T}\n"
    settings = shell_overrides(text)
    assert "actor_rollout_ref.actor.use_kl_loss" not in settings
    assert settings["actor_rollout_ref.actor.kl_loss_type"].value is None


def test_yaml_nested_keys_and_run_blocks():
    config = textwrap.dedent("""\
        actor_rollout_ref:
          actor:
            use_kl_loss: true
            kl_loss_type: k3
        algorithm:
          adv_estimator: gae
        """)
    settings = yaml_settings(config)
    assert settings["actor_rollout_ref.actor.kl_loss_type"].value == "k3"
    assert settings["actor_rollout_ref.actor.kl_loss_type"].line == 4
    assert [(f.code, f.line) for f in lint_config("c.yaml", config)] == [("KL002", 4), ("KL008", 4)]
    task = "run: |\n  python -m verl.trainer.main_ppo actor_rollout_ref.actor.use_kl_loss=True\n"
    assert [(f.code, f.line) for f in lint_config("task.yaml", task)] == [("KL002", 2), ("KL008", 2)]
    assert lint_config("broken.yaml", "a: [\n") == []


@pytest.mark.parametrize("loader", ["SafeLoader", "CSafeLoader"])
def test_yaml_nested_past_the_parsers_recursion(monkeypatch, loader):
    yaml = pytest.importorskip("yaml")
    if not hasattr(yaml, loader):
        pytest.skip("this PyYAML was built without libyaml")
    monkeypatch.setattr("klaudit.frameworks.settings.yaml_loader", lambda: getattr(yaml, loader))
    deep = "actor_rollout_ref.actor.use_kl_loss: true\na: " + "[" * 5000 + "]" * 5000 + "\n"
    # the pure-Python composer recurses once per level: past Python's limit the file is read as unreadable, no
    # traceback; libyaml's composer, in C, reads it whole where its build does not refuse the depth
    keys = set(yaml_settings(deep))
    assert keys == set() if loader == "SafeLoader" else keys <= {"actor_rollout_ref.actor.use_kl_loss"}


def test_the_lint_reads_launch_scripts_and_yaml_and_honours_noqa(tmp_path):
    (tmp_path / "run.sh").write_text(LAUNCH.format(flags="    actor_rollout_ref.actor.use_kl_loss=True \\\n"))
    (tmp_path / "quiet.sh").write_text("python3 -m verl.trainer.main_ppo actor_rollout_ref.actor.use_kl_loss=True  "
                                       "# noqa: KL002, KL008\n")
    (tmp_path / "other.sh").write_text("echo training\n")
    (tmp_path / "c.yml").write_text("actor_rollout_ref:\n  actor:\n    use_kl_loss: true\n    kl_loss_type: kl\n")
    result = lint_paths([str(tmp_path)], settings=Settings(root=tmp_path), jobs=1)
    assert result.errors == []
    assert sorted((f.path.rsplit("/", 1)[-1], f.line, f.code) for f in result.findings) == [
        ("c.yml", 4, "KL001"), ("c.yml", 4, "KL008"), ("run.sh", 7, "KL002")]
    assert result.files_checked == 4


FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "bad"


def _codes_by_switch_value(path: Path, switch: str) -> dict[str, set[str]]:
    """{value of `switch`: the codes the lint reports for it} from the findings' switch labels."""
    by_value: dict[str, set[str]] = {}
    for finding in lint_paths([str(path)], settings=Settings(root=path.parent), jobs=1).findings:
        labels = re.search(rf'{switch}=((?:"[^"]+"\|?)+)', finding.message)
        for value in re.findall(r'"([^"]+)"', labels.group(1)) if labels else ():
            by_value.setdefault(value, set()).add(finding.code)
    return by_value


@pytest.mark.parametrize("fixture, switch, flags", [
    ("verl_dp_actor.py", "kl_loss_type", "actor_rollout_ref.actor.use_kl_loss=True actor_rollout_ref.actor.kl_loss_type={}"),
    ("verl_ray_trainer.py", "kl_penalty_type", "algorithm.use_kl_in_reward=True algorithm.adv_estimator=gae "
                                               "algorithm.kl_penalty={}"),
])
def test_the_flag_table_agrees_with_the_lint_of_verl_shaped_code(fixture, switch, flags):
    """The same switch value gets the same codes whether the lint reads verl's code or the user's flag."""
    from_code = _codes_by_switch_value(FIXTURES / fixture, switch)
    assert len(from_code) >= 3
    for value, codes_in_code in from_code.items():
        one_step = "data.train_batch_size=256 "  # one optimizer step per rollout, as the fixtures' steps take
        from_flag = {f.code for f in lint_config("run.sh", "python3 -m verl.trainer.main_ppo " + one_step
                                                 + flags.format(value))}
        assert from_flag == codes_in_code, value


def test_a_defaults_list_brings_in_a_sibling_config_at_its_entry(tmp_path):
    """Hydra composes `defaults: [base, _self_]`: base.yaml's keys first, the file's own over them. A key
    from base.yaml is reported at the entry that brings it in."""
    (tmp_path / "base.yaml").write_text("actor_rollout_ref:\n  actor:\n    use_kl_loss: true\n    kl_loss_type: mse\n")
    run = tmp_path / "run.yaml"
    run.write_text("defaults:\n  - ppo_trainer\n  - base\n  - _self_\n\nactor_rollout_ref:\n  actor:\n    kl_loss_type: k3\n")
    # verl's default batch sizes take four steps per rollout: KL008 beside each verdict
    assert [(f.code, f.line) for f in lint_config(str(run), run.read_text())] == [("KL002", 8), ("KL008", 8)]
    run.write_text("defaults:\n  - ppo_trainer\n  - base\n")
    assert [(f.code, f.line) for f in lint_config(str(run), run.read_text())] == [("KL003", 3), ("KL008", 3)]
    run.write_text("defaults:\n  - _self_\n  - base\nactor_rollout_ref:\n  actor:\n    kl_loss_type: k3\n")
    assert [(f.code, f.line) for f in lint_config(str(run), run.read_text())] == [("KL003", 3), ("KL008", 3)]
    (tmp_path / "base.yaml").write_text("defaults:\n  - run\n")  # a cycle is followed a bounded number of times
    lint_config(str(run), run.read_text())  # terminates


def test_an_override_inside_a_quoted_shell_variable_ends_at_the_quote():
    # RAGEN's train_all.sh keeps its overrides in variables: USE_GRPO="... actor.use_kl_loss=True"
    script = 'USE_GRPO="algorithm.adv_estimator=grpo actor_rollout_ref.actor.use_kl_loss=True"\n'
    assert shell_overrides(script)["actor_rollout_ref.actor.use_kl_loss"].value == "True"


def test_a_launch_scripts_config_name_brings_in_the_users_hydra_config(tmp_path):
    """`python train.py --config-name sokoban ... use_kl_loss=True` composes config/sokoban.yaml (defaults:
    [base]); its kl_loss_type, not verl's default (low_var_kl, row 3: KL002), decides the verdict: k1 as
    a loss is row 1 (KL001), reported at the --config-name option, which no flag fix edits."""
    config = tmp_path / "config"
    config.mkdir()
    (config / "base.yaml").write_text("actor_rollout_ref:\n  actor:\n    use_kl_loss: false\n    kl_loss_type: kl\n")
    (config / "sokoban.yaml").write_text("defaults:\n  - base\n")
    (tmp_path / "scripts").mkdir()
    script = tmp_path / "scripts" / "run.sh"
    script.write_text("python train.py --config-name=sokoban actor_rollout_ref.actor.use_kl_loss=True "
                      "actor_rollout_ref.actor.ppo_epochs=1 data.train_batch_size=8 actor_rollout_ref.actor.ppo_mini_batch_size=8\n")
    found = lint_config(str(script), script.read_text())
    assert [(f.code, f.line, f.column) for f in found] == [("KL001", 1, 17)]
    assert found[0].autofix is None
    # two commands whose configs disagree on the estimator: its value is unknown, no verdict
    (config / "other.yaml").write_text("actor_rollout_ref:\n  actor:\n    kl_loss_type: mse\n")
    script.write_text(script.read_text() + "python train.py --config-name other actor_rollout_ref.actor.use_kl_loss=True\n")
    assert lint_config(str(script), script.read_text()) == []
    # a config the script names that is not the user's (verl's own ppo_trainer): verl's defaults apply
    script.write_text("python -m verl.trainer.main_ppo --config-name ppo_trainer actor_rollout_ref.actor.use_kl_loss=True\n")
    assert [f.code for f in lint_config(str(script), script.read_text())] == ["KL002", "KL008"]


def test_a_config_path_on_another_line_of_the_command_names_the_configs_folder(tmp_path):
    """KG_GRPO's jobs: `--config-path="$PWD/configs_verl" \\` on one line, `--config-name=grpo_cwq_7b \\`
    on the next. The config's ppo_mini_batch_size 16 against the command's train_batch_size 128 is eight
    optimizer steps per rollout for the k3 loss (row 22: KL008), reported at the --config-name option.
    A --config-path of another command does not lead this one's --config-name to a folder."""
    (tmp_path / "configs_verl").mkdir()
    (tmp_path / "configs_verl" / "grpo_cwq_7b.yaml").write_text(
        "actor_rollout_ref:\n  actor:\n    ppo_mini_batch_size: 16\n")
    (tmp_path / "scripts").mkdir()
    script = tmp_path / "scripts" / "run.job"
    command = ("python -m verl.trainer.main_ppo \\\n"
               "    --config-path=\"$PWD/configs_verl\" \\\n"
               "    --config-name=grpo_cwq_7b \\\n"
               "    actor_rollout_ref.actor.use_kl_loss=true \\\n"
               "    data.train_batch_size=128\n")
    script.write_text(command)
    assert [(f.code, f.line, f.column) for f in lint_config(str(script), command)] == [
        ("KL002", 4, 5), ("KL008", 3, 5)]
    other = "python prepare.py --config-path=$PWD/configs_verl\n" + command.replace(
        '    --config-path=\"$PWD/configs_verl\" \\\n', "")
    script.write_text(other)
    # the config is not found: verl's default ppo_mini_batch_size (256) takes the whole rollout in one step
    assert [f.code for f in lint_config(str(script), other)] == ["KL002"]


def test_a_script_of_several_runs_keeps_its_verdict_when_one_run_sets_a_zero_coefficient():
    """RAGEN's train_all.sh: GRPO runs with kl_loss_coef=0.001, then a "nokl" run with 0.000; one file, one
    configuration, read as its last values: the zero of one run does not switch the others' KL off."""
    run = ("python3 -m verl.trainer.main_ppo actor_rollout_ref.actor.use_kl_loss=True "
           "actor_rollout_ref.actor.kl_loss_type=kl actor_rollout_ref.actor.kl_loss_coef={coef} &\n")
    assert [f.code for f in lint_config("all.sh", run.format(coef="0.001") + run.format(coef="0.000"))] == [
        "KL001", "KL008"]  # verl's default batch sizes: four steps per rollout
    assert [f.code for f in lint_config("nokl.sh", run.format(coef="0.000"))] == []


@pytest.mark.parametrize("flags, expected", [
    # verl's on-policy distillation (0.8 on), the teacher in the reference's place: the loss on the
    # student's samples is judged as the KL loss is (rows 1, 2, 4; low_var_kl is verl's k3 with clamps)
    (["distillation.enabled=True"], ["KL002"]),  # default loss_mode=k3
    (["distillation.enabled=True", "distillation.distillation_loss.loss_mode=k1"], ["KL001"]),
    (["distillation.enabled=True", "distillation.distillation_loss.loss_mode=k2"], ["KL003"]),
    # with use_policy_gradient each token's advantage is its own negated value: k1 gives the local
    # gradient only (row 2), other values are no k1 (rows 7, 8); a clamp of the values is KL010
    (["distillation.enabled=True", "distillation.distillation_loss.loss_mode=k1",
      "distillation.distillation_loss.use_policy_gradient=True"], ["KL003"]),
    (["distillation.enabled=True", "distillation.distillation_loss.loss_mode=k1",
      "distillation.distillation_loss.use_policy_gradient=True",
      "distillation.distillation_loss.loss_max_clamp=10.0"], ["KL003", "KL010"]),
    (["distillation.enabled=True", "distillation.distillation_loss.use_policy_gradient=True"], ["KL004"]),
    (["distillation.enabled=True", "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean"], ["KL002", "KL007"]),
    # off, or a top-k mode no estimator of the table describes: no verdict
    (["distillation.distillation_loss.loss_mode=k1"], []),
    (["distillation.enabled=True", "distillation.distillation_loss.loss_mode=forward_kl_topk"], []),
])
def test_distillation_flags_are_judged_with_the_teacher_as_the_reference(flags, expected):
    assert codes(*flags) == expected


def test_a_clamped_distillation_reward_is_reported_at_the_clamp():
    """KL010 is the clamp's doing: it points at `loss_max_clamp`, the line a user edits, and the k1 same-token
    reward (row 2, KL003) at the loss mode."""
    flags = ["distillation.enabled=True", "distillation.distillation_loss.loss_mode=k1",
             "distillation.distillation_loss.use_policy_gradient=True", "distillation.distillation_loss.loss_max_clamp=10"]
    text = LAUNCH.format(flags="".join(f"    {flag} \\\n" for flag in flags))
    lines = text.splitlines()
    found = {f.code: lines[f.line - 1].strip() for f in lint_config("run.sh", text)}
    assert found == {"KL003": flags[1] + " \\", "KL010": flags[3] + " \\"}


VERL_05 = Context(versions={**Context().versions, "verl": Assumed("0.7", "pinned")})  # a release before 0.8


def codes_on(context: Context, *flags: str) -> list[str]:
    text = LAUNCH.format(flags="".join(f"    {flag} \\\n" for flag in flags))
    return sorted(f.code for f in lint_config("run.sh", text, context))


@pytest.mark.parametrize("flags, expected", [
    # one response per micro-batch: the token-mean divides each response by its own length (row 21)
    (["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1"], ["KL002", "KL007"]),
    (["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1", "algorithm.use_kl_in_reward=True",
      "actor_rollout_ref.actor.use_kl_loss=False", "algorithm.adv_estimator=gae"], ["KL007"]),  # the PG loss carries it
    (["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4"], ["KL002"]),  # several responses: no row-21 verdict
    (["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1", "actor_rollout_ref.actor.use_dynamic_bsz=True"],
     ["KL002"]),  # micro-batches packed by tokens
    (["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1", "trainer.use_legacy_worker_impl=disable"],
     ["KL002"]),  # the model engine's token-mean counts the mini-batch
    (["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
      "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum-norm"], ["KL002"]),  # a constant divisor
    (["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=$MICRO"], ["KL002"]),  # computed: decides nothing
    # the older key counts the micro-batch of all the GPUs, which each worker divides by their number (Manto/chess-
    # reasoning-zero: 2 over trainer.n_gpus_per_node=2 is one response per GPU)
    (["actor_rollout_ref.actor.ppo_micro_batch_size=2", "trainer.n_gpus_per_node=2"], ["KL002", "KL007"]),
    (["actor_rollout_ref.actor.ppo_micro_batch_size=8"], ["KL002", "KL007"]),  # over the default of 8 GPUs
    (["actor_rollout_ref.actor.ppo_micro_batch_size=8", "trainer.n_gpus_per_node=4"], ["KL002"]),  # two per GPU
    (["actor_rollout_ref.actor.ppo_micro_batch_size=4", "trainer.n_gpus_per_node=2", "trainer.nnodes=2"],
     ["KL002", "KL007"]),
    (["actor_rollout_ref.actor.ppo_micro_batch_size=2", "trainer.n_gpus_per_node=4",
      "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2"], ["KL002", "KL007"]),  # a pair of GPUs per sequence
    (["actor_rollout_ref.actor.ppo_micro_batch_size=2", "trainer.n_gpus_per_node=$GPUS"], ["KL002"]),
])
def test_a_token_mean_over_micro_batches_of_one_response_is_a_per_sequence_mean(flags, expected):
    assert codes_on(VERL_05, "actor_rollout_ref.actor.use_kl_loss=True", *flags) == expected


VERL_01 = Context(versions={**Context().versions, "verl": Assumed("0.7", "0.1 in verl/version/version", older=True)})


@pytest.mark.parametrize("samples, expected", [("1", ["KL002", "KL007"]), ("5", ["KL002"])])
def test_before_0_2_the_older_micro_batch_key_counted_prompts(samples, expected):
    """verl 0.1 (TinyZero's copies) multiplied each GPU's share of ppo_micro_batch_size by rollout.n: 8 over 8 GPUs
    with rollout.n=5 is five responses a micro-batch there, one in 0.2 and later. A release older than the oldest
    known is judged only where both readings agree (guanning03/TinyZero-PRM's train_1.sh: no KL007)."""
    assert codes_on(VERL_01, "actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.actor.ppo_micro_batch_size=8",
                    "trainer.n_gpus_per_node=8", f"actor_rollout_ref.rollout.n={samples}") == expected


def test_verl_09s_engine_averages_over_the_mini_batch_so_one_response_per_micro_batch_is_fine():
    assert codes("actor_rollout_ref.actor.use_kl_loss=True",
                 "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1") == ["KL002"]


VERL_08 = Context(versions={**Context().versions, "verl": Assumed("0.8", "pinned")})


def test_verl_080_has_only_the_model_engine_and_takes_straight_through_values():
    """The verl 0.8.0 wheel has no `fsdp_workers.py` (its only workers are the model engine's, whose token-mean
    divides by the mini-batch's token count) and its kl_penalty strips a `+` suffix as 0.9's does; 0.7.1's
    legacy workers are the default (`use_legacy_worker_impl: auto`) and it rejects `k3+`."""
    one_response = ("actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1")
    assert codes_on(VERL_08, *one_response) == ["KL002"]
    assert codes_on(VERL_05, *one_response) == ["KL002", "KL007"]
    straight_through = ("actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.actor.kl_loss_type=k3+")
    assert codes_on(VERL_08, *straight_through) == ["KL003"]
    assert codes_on(VERL_05, *straight_through) == []


def test_the_micro_batch_kl007_points_at_the_micro_batch_and_offers_no_flag_edit():
    text = LAUNCH.format(flags="    actor_rollout_ref.actor.use_kl_loss=True \\\n"
                               "    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1 \\\n")
    found = {f.code: f for f in lint_config("run.sh", text, VERL_05)}
    length = found["KL007"]
    assert text.splitlines()[length.line - 1].strip().startswith("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1")
    assert "ppo_micro_batch_size_per_gpu=1 (a token-mean over each micro-batch before verl 0.8)" in length.message
    assert "seq-mean-token-sum-norm" in length.fix and length.autofix is None
    assert "a flag other than the one reported" in length.no_autofix


def _project_with_verl(tmp_path: Path, version: str, legacy: str | None, workers: bool = True) -> Path:
    """A project carrying a copy of verl (its version file, ppo_trainer.yaml and, with `workers`, the legacy
    workers' module) and a launch script in examples/ that runs it with one response per micro-batch."""
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "my-rl"\n')
    (tmp_path / "verl" / "version").mkdir(parents=True)
    (tmp_path / "verl" / "version" / "version").write_text(version + "\n")
    if workers:
        (tmp_path / "verl" / "workers").mkdir(parents=True)
        (tmp_path / "verl" / "workers" / "fsdp_workers.py").write_text("class ActorRolloutRefWorker:\n    pass\n")
    config = tmp_path / "verl" / "trainer" / "config"
    config.mkdir(parents=True)
    (config / "ppo_trainer.yaml").write_text("trainer:\n  total_epochs: 30\n" + (
        f"  use_legacy_worker_impl: {legacy}\n" if legacy is not None else ""))
    (tmp_path / "examples").mkdir()
    script = tmp_path / "examples" / "run.sh"
    script.write_text(LAUNCH.format(flags="    actor_rollout_ref.actor.use_kl_loss=True \\\n"
                                          "    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1 \\\n"))
    return script


@pytest.mark.parametrize("version, legacy, workers, expected", [
    ("0.5.0", None, True, ["KL002", "KL007"]),  # legacy workers, the only ones then
    ("0.7.1", "auto", True, ["KL002", "KL007"]),
    ("0.8.0.dev", "disable", True, ["KL002"]),  # a snapshot whose default is the model engine
    ("0.8.0.dev", "auto", True, ["KL002", "KL007"]),  # one whose default is still the legacy workers
    ("0.8.0", None, False, ["KL002"]),  # the release: the model engine's workers only
    ("0.9.1", None, False, ["KL002"]),
])
def test_the_copy_of_verl_a_script_runs_says_which_workers_are_the_default(tmp_path, version, legacy, workers,
                                                                          expected):
    script = _project_with_verl(tmp_path, version, legacy, workers)
    for linted in (tmp_path, script):  # the whole project, or the script alone: the copy is found from it
        result = lint_paths([str(linted)], settings=Settings(root=tmp_path), jobs=1)
        assert sorted(f.code for f in result.findings if f.path.endswith("run.sh")) == expected


@pytest.mark.parametrize("module, expected", [("verl.trainer.main_ppo", ["KL004", "KL008"]),
                                              ("recipe.prime.main_prime", [])])
def test_prime_builds_its_rewards_without_the_kl_reward_flags(module, expected):
    text = (f"python3 -m {module} algorithm.use_kl_in_reward=True algorithm.kl_penalty=low_var_kl "
            "algorithm.kl_ctrl.kl_coef=0.001 actor_rollout_ref.actor.use_kl_loss=False\n")
    assert sorted(f.code for f in lint_config("run.sh", text)) == expected


def test_the_copy_holding_the_launched_module_says_the_release(tmp_path):
    """AgentGym-RL: the scripts in examples/ `cd` into a sibling folder and run its copy of verl (0.2.0.post2) by
    its own trainer module; nothing above the scripts states a release, so the copy's does."""
    copy = tmp_path / "AgentGym-RL" / "verl"
    (copy / "version").mkdir(parents=True)
    (copy / "version" / "version").write_text("0.2.0.post2\n")
    (copy / "agent_trainer").mkdir()
    (copy / "agent_trainer" / "main_ppo.py").write_text("def main():\n    pass\n")
    (tmp_path / "examples").mkdir()
    (tmp_path / "examples" / "run.sh").write_text(
        "cd AgentGym-RL\npython3 -m verl.agent_trainer.main_ppo actor_rollout_ref.actor.use_kl_loss=True "
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1 data.train_batch_size=8 "
        "actor_rollout_ref.actor.ppo_mini_batch_size=8\n")
    result = lint_paths([str(tmp_path)], settings=Settings(root=tmp_path), jobs=1)
    found = {f.code: f for f in result.findings if f.path.endswith("run.sh")}
    assert sorted(found) == ["KL002", "KL007"]
    assert ("verl 0.7 (0.2.0.post2 in AgentGym-RL/verl/version/version; older than 0.7, judged by 0.7's flags)"
            in found["KL007"].message)


def test_a_launch_hydra_refuses_has_no_verdict(tmp_path):
    """MTSQL-R1, AR-Lopti: an upstream example kept in a fork overrides a key the fork's config no longer has;
    Hydra stops at `Could not override`, before the first step. A `+` adds the key: that launch trains."""
    trainer = tmp_path / "verl" / "trainer"
    (trainer / "config").mkdir(parents=True)
    (trainer / "main_ppo.py").write_text(
        '@hydra.main(config_path="config", config_name="ppo_trainer", version_base=None)\ndef main(config):\n    pass\n')
    (trainer / "config" / "ppo_trainer.yaml").write_text(
        "data:\n  val_files_testN: null\nactor_rollout_ref:\n  actor:\n    use_kl_loss: false\n")
    launch = "python3 -m verl.trainer.main_ppo \\\n    {key}=test.parquet \\\n    actor_rollout_ref.actor.use_kl_loss=True\n"
    for key, expected in (("data.val_files", []), ("+data.val_files", ["KL002", "KL008"]),
                          ("data.val_files_testN", ["KL002", "KL008"])):
        (tmp_path / "run.sh").write_text(launch.format(key=key))
        result = lint_paths([str(tmp_path)], settings=Settings(root=tmp_path), jobs=1)
        assert sorted(f.code for f in result.findings if f.path.endswith("run.sh")) == expected, key
    # the module on the line after `-m` (no continuation): read as before, not a crash
    (tmp_path / "run.sh").write_text("python3 -m\nverl.trainer.main_ppo actor_rollout_ref.actor.use_kl_loss=True\n")
    result = lint_paths([str(tmp_path)], settings=Settings(root=tmp_path), jobs=1)
    assert sorted(f.code for f in result.findings if f.path.endswith("run.sh")) == ["KL002", "KL008"]
    assert result.errors == []



def test_a_launch_of_the_projects_own_trainer_that_hydra_refuses_has_no_verdict(tmp_path):
    """rlorigro/verl-tool (eighty-eighth set): `python3 -m verl_tool.trainer.main_ppo`, the project's own trainer
    over an installed verl, composes verl_tool/trainer/config/ppo_trainer.yaml, which has no
    actor_rollout_ref.agent.num_gpus: Hydra stops at that override. A server module launched before it (no
    `@hydra.main`) is not the trainer."""
    trainer = tmp_path / "my_tool" / "trainer"
    (trainer / "config").mkdir(parents=True)
    (tmp_path / "my_tool" / "servers").mkdir()
    (tmp_path / "my_tool" / "servers" / "serve.py").write_text("def main():\n    pass\n")
    (trainer / "main_ppo.py").write_text(
        '@hydra.main(config_path="config", config_name="ppo_trainer", version_base=None)\ndef main(config):\n    pass\n')
    (trainer / "config" / "ppo_trainer.yaml").write_text(
        "actor_rollout_ref:\n  agent:\n    max_turns: 1\n  actor:\n    use_kl_loss: false\n")
    launch = ("python -m my_tool.servers.serve --port 5000 &\n"
              "python3 -m my_tool.trainer.main_ppo \\\n    {key}=8 \\\n    actor_rollout_ref.actor.use_kl_loss=True\n")
    for key, expected in (("actor_rollout_ref.agent.num_gpus", []), ("+actor_rollout_ref.agent.num_gpus", ["KL002", "KL008"]),
                          ("actor_rollout_ref.agent.max_turns", ["KL002", "KL008"])):
        (tmp_path / "run.sh").write_text(launch.format(key=key))
        result = lint_paths([str(tmp_path)], settings=Settings(root=tmp_path), jobs=1)
        assert sorted(f.code for f in result.findings if f.path.endswith("run.sh")) == expected, key

FORK_MAIN = '''\
import hydra
import ray


@hydra.main(config_path="config", config_name="ppo_trainer", version_base=None)
def main(config):
    run_ppo(config)


def run_ppo(config):
    if not ray.is_initialized():
        ray.init(num_cpus=config.ray_init.num_cpus)
    runner = TaskRunner.remote()
    ray.get(runner.run.remote(config))


class TaskRunner:
    def run(self, config):
        {write}
        path = config.actor_rollout_ref.model.path
        tools = config.actor_rollout_ref.env.get("tool_manager", "qwen3")
        flag = config.trainer.get("use_tools") and config.trainer.tool_budget
        reward = RewardManager(output_dir=config.output_context_dir)
        trainer = RayPPOTrainer(config, reward)
        trainer.fit()
        print(config.after_training)
'''


@pytest.mark.parametrize("write, words, expected", [
    # the stock config has no actor_rollout_ref.env: the module's first read of it stops the run
    ("pass", "", []),
    # the launch adds the keys the fork's module reads
    ("pass", "+actor_rollout_ref.env.tool_manager=qwen3 +output_context_dir=out", ["KL002", "KL008"]),
    # only one of them: the run still stops at the other
    ("pass", "+actor_rollout_ref.env.tool_manager=qwen3", []),
    # the module writes into its config first: the reads after that are not counted
    ("config.actor_rollout_ref.env = {{}}", "", ["KL002", "KL008"]),
])
def test_a_launch_whose_trainer_module_reads_a_key_its_config_lacks_has_no_verdict(tmp_path, write, words, expected):
    """RL-Factory and s3 (fresh89), forks of verl whose main_ppo reads `config.actor_rollout_ref.env` or
    `config.output_context_dir` before `trainer.fit()`, keys only their own YAML (or a `+key=` of their own
    launches) gives: the upstream examples they keep, launched on the stock ppo_trainer config, stop with
    OmegaConf's ConfigAttributeError before the first step. Reads in a branch (`ray_init` under `if`), after
    `and`, through `.get` on the read key's section, or after training are not needed to start."""
    trainer = tmp_path / "verl" / "trainer"
    (trainer / "config").mkdir(parents=True)
    (trainer / "main_ppo.py").write_text(FORK_MAIN.format(write=write))
    (trainer / "config" / "ppo_trainer.yaml").write_text(
        "actor_rollout_ref:\n  model:\n    path: null\n  actor:\n    use_kl_loss: false\ntrainer:\n  nnodes: 1\n")
    (tmp_path / "run.sh").write_text(
        f"python3 -m verl.trainer.main_ppo actor_rollout_ref.actor.use_kl_loss=True {words}\n")
    result = lint_paths([str(tmp_path)], settings=Settings(root=tmp_path), jobs=1)
    assert sorted(f.code for f in result.findings if f.path.endswith("run.sh")) == expected



TWO_RUNS = """\
#!/bin/bash
MICRO=1
train_challenger() {
    python3 -m verl.trainer.main_ppo \\
        actor_rollout_ref.actor.use_kl_loss=True \\
        actor_rollout_ref.actor.kl_loss_type=low_var_kl \\
        actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=$MICRO \\
        data.train_batch_size=64 actor_rollout_ref.actor.ppo_mini_batch_size=64
}
train_solver() {
    python3 -m verl.trainer.main_ppo \\
        actor_rollout_ref.actor.use_kl_loss=False \\
        algorithm.use_kl_in_reward=True algorithm.kl_penalty=mse \\
        actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=$MICRO
}
python3 -m verl.model_merger merge --backend fsdp
"""


def test_a_script_that_runs_verl_twice_is_judged_launch_by_launch():
    """SCOPE trains a challenger, then a solver: the flags of the last launch were read as the whole script's,
    so the first launch's k3 loss went unreported. Each launch is judged with the others' lines left out; the
    micro-batch both take from one variable is one finding there."""
    found = sorted((f.line, f.code) for f in lint_config("run.sh", TWO_RUNS, VERL_05))
    assert found == [(2, "KL007"), (6, "KL002"), (13, "KL004"), (13, "KL008")]


FULLY_ASYNC = """\
staleness_threshold={staleness}
trigger_parameter_sync_step={sync}
python -m verl.experimental.fully_async_policy.fully_async_main \\
    data.train_batch_size=0 \\
    actor_rollout_ref.actor.ppo_mini_batch_size=32 \\
    actor_rollout_ref.actor.use_kl_loss=True \\
    actor_rollout_ref.actor.kl_loss_type=low_var_kl \\
    async_training.staleness_threshold="${{staleness_threshold}}" \\
    async_training.trigger_parameter_sync_step="${{trigger_parameter_sync_step}}"
"""


@pytest.mark.parametrize("staleness, sync, expected", [
    ("0.1", "4", [(2, "KL008"), (7, "KL002")]),  # weights reach the rollout every 4 steps: rows 3-4 and 22
    ("0", "4", [(2, "KL008"), (7, "KL002")]),
    ("0.5", "1", [(1, "KL008"), (7, "KL002")]),  # samples past a sync are kept
    ("0", "1", [(7, "KL002")]),  # in step with the trainer: on-policy
])
def test_the_fully_asynchronous_trainer_trains_the_kl_on_samples_of_older_policies(staleness, sync, expected):
    """VESPO's copy of verl (fifteenth set): the fully asynchronous recipe's launches set train_batch_size=0, so
    the batch sizes say nothing; the rollout's weights lag the trainer's by up to trigger_parameter_sync_step
    steps, and staleness_threshold keeps older samples still."""
    text = FULLY_ASYNC.format(staleness=staleness, sync=sync)
    assert sorted((f.line, f.code) for f in lint_config("run.sh", text)) == expected
    plain = text.replace("experimental.fully_async_policy.fully_async_main", "trainer.main_ppo")
    assert sorted((f.line, f.code) for f in lint_config("run.sh", plain)) == [(7, "KL002")]


@pytest.mark.parametrize("strategy, expected", [
    ("", []),  # the FSDP actor, rewritten without the KL loss: the flag does nothing
    ("    actor_rollout_ref.actor.strategy=megatron \\\n", ["KL002", "KL007"]),  # Megatron's still reads it
])
def test_a_copy_whose_actor_never_reads_use_kl_loss_ignores_the_flag(tmp_path, strategy, expected):
    """LMOps' context-distillation copies of verl (second set) rewrote dp_actor.update_policy around a KL to the
    experience-conditioned model and dropped use_kl_loss, which only their Megatron actor still reads: every
    upstream FSDP example inside them reported a KL loss that never runs."""
    script = _project_with_verl(tmp_path, "0.5.0", None)
    actor = tmp_path / "verl" / "workers" / "actor"
    actor.mkdir(parents=True, exist_ok=True)
    (actor / "dp_actor.py").write_text("def update_policy(self, data):\n    return self.distill(data)\n")
    (actor / "megatron_actor.py").write_text("def update_policy(self, data):\n    if self.config.use_kl_loss:\n"
                                             "        pass\n")
    script.write_text(script.read_text().replace("python3 -m verl.trainer.main_ppo \\\n",
                                                 "python3 -m verl.trainer.main_ppo \\\n" + strategy))
    result = lint_paths([str(tmp_path)], settings=Settings(root=tmp_path), jobs=1)
    assert sorted(f.code for f in result.findings if f.path.endswith("run.sh")) == expected


@pytest.mark.parametrize("ending, expected", [
    ("trainer.total_epochs=15", ["KL002"]),
    ("trainer.total_epochs=0", []),  # MTSQL-R1's evaluation and rollout-generation launches
    ("trainer.total_epochs=15 trainer.val_only=True", []),
    ("trainer.total_epochs=15 trainer.val_only=False", ["KL002"]),
])
def test_a_launch_that_trains_nothing_has_no_kl_verdict(ending, expected):
    """verl's trainer runs `for epoch in range(total_epochs)` and returns after validation under `val_only`: with
    0 epochs or val_only=True no optimizer step is taken, so the clamped k3 loss the flags set (rows 3-4) trains
    nothing there."""
    text = LAUNCH.replace("trainer.total_epochs=15", ending).format(
        flags="    actor_rollout_ref.actor.use_kl_loss=True \\\n")
    assert sorted(f.code for f in lint_config("run.sh", text)) == expected


@pytest.mark.parametrize("sizes, expected", [
    # 2 prompts x 5 responses over 8 GPUs: 1 response a GPU, less than a micro-batch of 2 (Reasoning-Table's 7b
    # launch): the workers assert, or an old copy divides each micro-batch's loss by a gradient accumulation of 0
    ("ppo_mini_batch_size=2 rollout.n=5 ppo_micro_batch_size_per_gpu=2 trainer.n_gpus_per_node=8", []),
    # the node count computed (`trainer.nnodes=$NNODES`): at least one node, so at most 1 response a GPU still
    ("ppo_mini_batch_size=2 rollout.n=5 ppo_micro_batch_size_per_gpu=2 trainer.n_gpus_per_node=8 "
     "trainer.nnodes=$NNODES", []),
    ("ppo_mini_batch_size=2 rollout.n=5 ppo_micro_batch_size_per_gpu=2 trainer.n_gpus_per_node=1", ["KL002"]),
    ("ppo_mini_batch_size=2 rollout.n=8 ppo_micro_batch_size_per_gpu=2 trainer.n_gpus_per_node=8", ["KL002"]),
    ("ppo_mini_batch_size=2 rollout.n=5 ppo_micro_batch_size_per_gpu=2 trainer.n_gpus_per_node=8 "
     "actor.strategy=fsdp2", []),  # FSDP2's workers share a mini-batch out as FSDP's do
    # dynamic batching packs micro-batches by tokens, whatever their size in responses
    ("ppo_mini_batch_size=2 rollout.n=5 ppo_micro_batch_size_per_gpu=2 trainer.n_gpus_per_node=8 "
     "actor.use_dynamic_bsz=True", ["KL002"]),
])
def test_a_gpus_share_of_a_mini_batch_below_its_micro_batch_trains_nothing(sizes, expected):
    prefixes = {"ppo_": "actor_rollout_ref.actor.", "rollout.": "actor_rollout_ref.", "actor.": "actor_rollout_ref."}
    flags = ["actor_rollout_ref.actor.use_kl_loss=True"] + [
        next((prefix + flag for start, prefix in prefixes.items() if flag.startswith(start)), flag)
        for flag in sizes.split()]
    text = LAUNCH.replace("    actor_rollout_ref.actor.ppo_mini_batch_size=1024 \\\n", "").replace(
        "train_batch_size=1024", "train_batch_size=2").format(
        flags="".join(f"    {flag} \\\n" for flag in flags))
    assert sorted(f.code for f in lint_config("run.sh", text)) == expected
    # Megatron's workers split a mini-batch over the data-parallel ranks, not over every GPU (verl's Moonlight example)
    megatron = text.replace("main_ppo \\\n", "main_ppo --config-name=ppo_megatron_trainer \\\n")
    assert "strategy" in sizes or sorted(f.code for f in lint_config("run.sh", megatron)) == ["KL002"]


VERL_WITH_HF_ROLLOUT = Context(versions={**Context().versions, "verl": Assumed("0.5", "pinned")})


@pytest.mark.parametrize("context, rollout, expected", [
    (Context(), "hf", []),  # TinyZero_QWen3.5's HF launches on verl 0.7.1: the workers stop at start-up
    (Context(), "vllm", ["KL002"]),
    (VERL_WITH_HF_ROLLOUT, "hf", ["KL002"]),  # 0.5 still builds its HFRollout
])
def test_a_launch_of_the_hf_rollout_on_a_release_without_one_trains_nothing(context, rollout, expected):
    """From 0.6 verl's workers take the rollout class from a registry of vLLM and SGLang engines (TensorRT-LLM from
    0.8) and assert on any other name: `actor_rollout_ref.rollout.name=hf` stops the run before its first update."""
    assert codes_on(context, "actor_rollout_ref.actor.use_kl_loss=True",
                    f"actor_rollout_ref.rollout.name={rollout}") == expected


# verl's constant schedule before and after it was rewritten: min(1, step / max(1, warmup)) is 0 at step 0
# even with no warmup; the later form is 1 once the warmup (0 steps here) is over
_RAMP_FROM_ZERO = "    def lr_lambda(current_step):\n        return min(1, float(current_step) / float(max(1, num_warmup_steps)))\n"
_ONE_AFTER_WARMUP = ("    def lr_lambda(current_step):\n        if current_step < num_warmup_steps:\n"
                     "            return float(current_step) / float(max(1.0, num_warmup_steps))\n        return 1.0\n")


@pytest.mark.parametrize("schedule, ending, expected", [
    (_RAMP_FROM_ZERO, "trainer.total_training_steps=1", []),  # the one update at learning rate 0
    (_RAMP_FROM_ZERO, "trainer.total_training_steps=2", ["KL002"]),  # the second update trains
    (_RAMP_FROM_ZERO, "trainer.total_training_steps=1 actor_rollout_ref.actor.optim.warmup_style=cosine", ["KL002"]),
    (_RAMP_FROM_ZERO, "trainer.total_training_steps=1 actor_rollout_ref.actor.strategy=megatron", ["KL002"]),
    (_ONE_AFTER_WARMUP, "trainer.total_training_steps=1", ["KL002"]),  # the later schedule: lr 1e-6 from step 0
])
def test_one_update_at_a_learning_rate_of_zero_trains_nothing(tmp_path, schedule, ending, expected):
    """TinyZero's verl 0.1 and copies of that age schedule the FSDP actor with get_constant_schedule_with_warmup,
    whose factor min(1, step / max(1, warmup)) is 0 at step 0, and step the schedule after each rollout's
    update: a CI smoke test with total_training_steps=1 takes its mini-batch steps at learning rate 0, so the
    clamped k3 loss (rows 3-4) it configures changes no weight. The cosine schedule starts at 1, Megatron's
    actor has no such schedule, and later copies return 1 once the warmup is over."""
    script = _project_with_verl(tmp_path, "0.1", None)
    (tmp_path / "verl" / "utils").mkdir()
    (tmp_path / "verl" / "utils" / "torch_functional.py").write_text(
        "from torch.optim.lr_scheduler import LambdaLR\n\n\ndef get_constant_schedule_with_warmup(optimizer, "
        "num_warmup_steps, last_epoch=-1):\n" + schedule + "    return LambdaLR(optimizer, lr_lambda, last_epoch)\n")
    (tmp_path / "verl" / "workers").mkdir(exist_ok=True)
    (tmp_path / "verl" / "workers" / "fsdp_workers.py").write_text(
        "from verl.utils.torch_functional import get_constant_schedule_with_warmup\n\n\ndef build(optimizer, steps):\n"
        "    actor_lr_scheduler = get_constant_schedule_with_warmup(optimizer=optimizer, num_warmup_steps=steps)\n"
        "    return actor_lr_scheduler\n")
    script.write_text(LAUNCH.replace("trainer.total_epochs=15", ending).format(
        flags="    actor_rollout_ref.actor.use_kl_loss=True \\\n"))
    result = lint_paths([str(tmp_path)], settings=Settings(root=tmp_path), jobs=1)
    assert sorted(f.code for f in result.findings if f.path.endswith("run.sh")) == expected


# HuuBar/edge_model (fifty-ninth set): a Python launcher builds verl's command line as a list and runs it
PYTHON_LAUNCHER = '''\
import subprocess
import sys


def main(args):
    cmd = [
        sys.executable,
        "-m",
        "verl.trainer.main_ppo",
        "algorithm.adv_estimator=grpo",
        f"data.train_batch_size={args.train_batch_size}",
        "data.train_batch_size=64",
        "actor_rollout_ref.actor.ppo_mini_batch_size=64",
{flags}
    ]
    subprocess.run(cmd, check=True)
'''


@pytest.mark.parametrize("flags, expected", [
    (['"actor_rollout_ref.actor.use_kl_loss=True"', '"algorithm.use_kl_in_reward=False"'],
     [(14, "KL002")]),  # verl's default low_var_kl as a loss: k3 clamped (rows 3-4)
    (['"actor_rollout_ref.actor.use_kl_loss=True"', '"actor_rollout_ref.actor.kl_loss_type=mse"'],
     [(15, "KL003")]),  # k2 as a loss (row 2)
    (['"actor_rollout_ref.actor.use_kl_loss=False"', '"algorithm.use_kl_in_reward=False"'], []),  # no KL term
    (['# "actor_rollout_ref.actor.use_kl_loss=True"', '"algorithm.use_kl_in_reward=False"'], []),  # commented out
])
def test_a_launch_built_as_a_python_argument_list_is_judged_as_its_flags(tmp_path, flags, expected):
    (tmp_path / "launch.py").write_text(PYTHON_LAUNCHER.replace("{flags}", "".join(f"        {flag},\n" for flag in flags)))
    result = lint_paths([str(tmp_path)], settings=Settings(root=tmp_path, frameworks={"verl": "0.6"}), jobs=1)
    assert sorted((f.line, f.code) for f in result.findings) == expected


# ChanTinPing/LLM_RL_basic (seventy-fifth set): the list's values are read from the YAML file the launcher loads,
# `f"actor_rollout_ref.actor.use_kl_loss={cfg['use_kl']}"`
@pytest.mark.parametrize("configured, expected", [
    ("use_kl: true\nkl_type: mse\n", [(15, "KL003")]),  # k2 as a loss, its type read from the YAML file too
    ("use_kl: false\nkl_type: mse\n", []),  # the YAML file turns the loss off
    ("use_kl: true\nkl_type: mse\n---\nuse_kl: false\n", []),  # two values for one key: none is known
])
def test_a_listed_placeholder_takes_the_value_the_yaml_files_give_its_key(tmp_path, configured, expected):
    flags = ['f"actor_rollout_ref.actor.use_kl_loss={cfg[\'use_kl\']}"',
             'f"actor_rollout_ref.actor.kl_loss_type={cfg[\'kl_type\']}"']
    (tmp_path / "launch.py").write_text(PYTHON_LAUNCHER.replace("{flags}", "".join(f"        {flag},\n" for flag in flags)))
    (tmp_path / "grpo.yaml").write_text(configured)
    result = lint_paths([str(tmp_path)], settings=Settings(root=tmp_path, frameworks={"verl": "0.6"}), jobs=1)
    assert sorted((f.line, f.code) for f in result.findings) == expected


def test_the_reads_counted_are_those_every_run_makes_before_it_trains(tmp_path):
    from klaudit.frameworks.config_reads import reads_before_training

    main = tmp_path / "main_ppo.py"
    main.write_text(FORK_MAIN.format(write="pass"))
    assert [key for key, _ in reads_before_training(main)] == [
        "actor_rollout_ref.model.path", "actor_rollout_ref.env", "trainer", "output_context_dir"]


@pytest.mark.parametrize("words, expected", [
    ("", []),
    ("+actor_rollout_ref.env.tool_manager=qwen3 +output_context_dir=out", ["KL002", "KL008"]),
])
def test_a_config_path_named_by_shell_variables_and_its_search_path_are_composed(tmp_path, words, expected):
    """RL-Factory (fresh89) keeps verl's multi-turn examples: `PROJECT_DIR="$(pwd)"`,
    `--config-path="$PROJECT_DIR/examples/multiturn/config"`, whose config finds ppo_trainer through
    `hydra.searchpath: [file://verl/trainer/config]`, below the folder the run starts in. Before, a `--config-path`
    starting with `$` (and a defaults entry found only on the search path) left the composition unknown, so the
    keys the fork's main_ppo reads were never checked."""
    trainer = tmp_path / "verl" / "trainer"
    (trainer / "config").mkdir(parents=True)
    (trainer / "main_ppo.py").write_text(FORK_MAIN.format(write="pass"))
    (trainer / "config" / "ppo_trainer.yaml").write_text(
        "actor_rollout_ref:\n  model:\n    path: null\n  actor:\n    use_kl_loss: false\ntrainer:\n  nnodes: 1\n")
    (tmp_path / "examples" / "multiturn" / "config").mkdir(parents=True)
    (tmp_path / "examples" / "multiturn" / "config" / "multiturn.yaml").write_text(
        "hydra:\n  searchpath:\n    - file://verl/trainer/config\ndefaults:\n  - ppo_trainer\n  - _self_\n")
    (tmp_path / "run.sh").write_text(
        'PROJECT_DIR="$(pwd)"\nCONFIG_PATH="$PROJECT_DIR/examples/multiturn/config"\n'
        f'python3 -m verl.trainer.main_ppo --config-path="$CONFIG_PATH" --config-name=multiturn \\\n'
        f"    actor_rollout_ref.actor.use_kl_loss=True {words}\n")
    result = lint_paths([str(tmp_path)], settings=Settings(root=tmp_path), jobs=1)
    assert sorted(f.code for f in result.findings if f.path.endswith("run.sh")) == expected


@pytest.mark.parametrize("name, own, reported, folder", [
    ("ppo_trainer", False, True, "config"),  # a config every release ships
    ("'ppo_trainer-lm4dc.yaml'", False, False, "config"),  # no release ships it, nor the project: Hydra stops
    ("ppo_trainer-lm4dc", True, True, "config"),  # the project has it (a config folder of its own)
    ("gsm8k_multiturn_grpo", False, True, '"$PROJECT_DIR/examples/sglang_multiturn/config"'),  # a folder elsewhere
])
def test_a_config_name_no_release_nor_the_project_has_stops_the_launch(tmp_path, name, own, reported, folder):
    """codingwatching/LLM4Decompile (fresh105) runs verl as installed with `--config-name='ppo_trainer-lm4dc.yaml'`,
    a config no release of verl ships (klaudit/frameworks/fields/verl_configs.txt) and the project lacks. Astera-org/
    memupdate (fresh106) names one of verl's example configs in a `--config-path` of a checkout outside the project
    (`$PROJECT_DIR/...`): that folder may hold it, so the launch is its run."""
    (tmp_path / "setup.py").write_text("from setuptools import setup\n\nsetup(name='app')\n")
    if own:
        (tmp_path / "config").mkdir()
        (tmp_path / "config" / "ppo_trainer-lm4dc.yaml").write_text("actor_rollout_ref:\n  actor:\n    use_kl_loss: true\n")
    (tmp_path / "run.sh").write_text(f"python3 -m verl.trainer.main_ppo --config-path={folder} \\\n"
                                     f"    --config-name={name} \\\n"
                                     "    actor_rollout_ref.actor.use_kl_loss=True \\\n"
                                     "    actor_rollout_ref.actor.kl_loss_type=low_var_kl\n")
    found = lint_paths([str(tmp_path)], settings=Settings(root=tmp_path), jobs=1).findings
    assert any(f.code == "KL002" for f in found) is reported
