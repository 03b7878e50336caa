"""ms-swift's GRPO and PPO flags on the command line of `swift rlhf` (and `megatron rlhf`).

Expected codes come from kl-math.md §8: k3 as a loss row 3 (KL002), each response's token mean (loss_type grpo,
ms-swift's default) row 21 (KL007), a KL loss on an older policy's samples row 22 and a KL reward reweighed by
the token ratio only row 23 (KL008); the summed k1 of the response taken from its reward (`--kl_in_reward`) is
the whole-sequence return of row 6, right on fresh samples. PPO (TRL's PPOTrainer under ms-swift's defaults) puts
k1 in the token rewards: right on fresh samples (row 6), reweighed by the token ratio only over its 4 epochs a
batch (row 23, KL008), and averaged over each backward pass's one response (row 21, KL007).
"""

from __future__ import annotations

import pytest

from klaudit.frameworks import lint_config

LAUNCH = """\
#!/bin/bash
NPROC_PER_NODE=8 \\
swift rlhf \\
    --rlhf_type {kind} \\
    --model Qwen/Qwen2.5-7B-Instruct \\
{flags}    --output_dir output
"""


def codes(flags: str = "", kind: str = "grpo", text: str | None = None) -> list[tuple[int, str]]:
    """(line, code) of the findings of a launch given `flags` (one flag and its value per line, from line 6)."""
    body = "".join(f"    {line.strip()} \\\n" for line in flags.strip().splitlines())
    text = text if text is not None else LAUNCH.format(kind=kind, flags=body)
    return sorted((f.line, f.code) for f in lint_config("scripts/train_grpo.sh", text))


@pytest.mark.parametrize("flags, expected", [
    ("", [(4, "KL002"), (4, "KL007")]),  # beta 0.04 and loss_type grpo, both defaults: reported at --rlhf_type
    ("--beta 0.001", [(4, "KL007"), (6, "KL002")]),
    ("--beta 0.001\n--loss_type dapo", [(6, "KL002")]),  # the batch's token mean: no 1/L weights
    ("--beta 0.001\n--loss_type bnpo", [(6, "KL002")]),
    ("--beta 0.001\n--loss_type sapo", [(6, "KL002"), (7, "KL007")]),  # sapo reduces as grpo does
    ("--beta 0.0", []),  # no reference model, no KL
    ("--beta $BETA", []),  # not a literal: no verdict on the default
    ("--beta 0.001\n--kl_in_reward=$IN_REWARD", []),  # the KL's placement unknown: no verdict
    ("--beta 0.001\n--loss_type dapo\n--kl_in_reward true", []),  # row 6, on fresh samples
    ("--advantage_estimator rloo\n--loss_type dapo", []),  # rloo puts the KL in the reward by default
    ("--advantage_estimator reinforce_plus_plus", [(4, "KL007")]),  # the reward's advantage over 1/L
    ("--advantage_estimator reinforce_plus_plus\n--kl_in_reward false\n--loss_type dapo", [(4, "KL002")]),
])
def test_swift_grpo_flags_get_the_catalog_s_verdict(flags, expected):
    assert codes(flags) == expected


@pytest.mark.parametrize("flags, expected", [
    ("--beta 0.001\n--loss_type dapo\n--num_iterations 2", [(6, "KL002"), (8, "KL008")]),
    # 8 micro-steps per generation, 4 per optimizer step: two steps per generation
    ("--loss_type dapo\n--gradient_accumulation_steps 4\n--steps_per_generation 8", [(4, "KL002"), (8, "KL008")]),
    # a generation every 2 micro-steps of a 4-micro-step update: every sample is the current policy's
    ("--loss_type dapo\n--gradient_accumulation_steps 4\n--steps_per_generation 2", [(4, "KL002")]),
    ("--loss_type dapo\n--async_generate true", [(4, "KL002"), (7, "KL008")]),
    ("--loss_type dapo\n--async_generate", [(4, "KL002"), (7, "KL008")]),  # a bare switch is true
    ("--loss_type dapo\n--async_generate false", [(4, "KL002")]),
    # a computed steps_per_generation decides nothing: the loss is judged, not its staleness
    ("--loss_type dapo\n--gradient_accumulation_steps 4\n--steps_per_generation $SPG", [(4, "KL002")]),
    # the reward's KL trained on an older policy's samples with PPO's token ratio only (row 23)
    ("--advantage_estimator rloo\n--loss_type dapo\n--num_iterations 4", [(8, "KL008")]),
])
def test_several_steps_per_generation_make_the_kl_stale(flags, expected):
    assert codes(flags) == expected


@pytest.mark.parametrize("flags, expected", [
    ("", [(4, "KL007"), (4, "KL008")]),  # 4 epochs of one mini-batch, one response per pass: ms-swift's defaults
    ("--per_device_train_batch_size 1", [(4, "KL008"), (6, "KL007")]),
    ("--per_device_train_batch_size 4", [(4, "KL008")]),  # the token mean of four responses: no 1/L weights
    ("--per_device_train_batch_size 4\n--num_ppo_epochs 1", []),  # k1 in the reward on fresh samples: right
    ("--per_device_train_batch_size 4\n--num_ppo_epochs 1\n--num_mini_batches 2", [(8, "KL008")]),
    ("--kl_coef 0", []),  # no KL
    ("--num_ppo_epochs $EPOCHS", []),  # not a literal: no verdict
])
def test_swift_ppo_flags_are_trl_s_ppo_trainer_with_ms_swift_s_defaults(flags, expected):
    assert codes(flags, kind="ppo") == expected


def test_the_ppo_finding_names_ms_swift_s_defaults_and_the_ppo_fix():
    finding = next(f for f in lint_config("run.sh", LAUNCH.format(kind="ppo", flags="")) if f.code == "KL008")
    assert "[ms-swift: ms-swift's PPO defaults (kl_coef=0.05, num_ppo_epochs=4" in finding.message
    assert "num_ppo_epochs=1" in finding.fix


def test_preference_losses_are_not_read():
    """DPO's beta (the default rlhf_type) is a preference temperature, not a KL penalty's coefficient."""
    assert codes("--beta 0.1", kind="dpo") == []
    assert codes(text="swift rlhf --model m --beta 0.1 --dataset d\n") == []


def test_each_command_is_judged_with_its_own_flags():
    """An SFT run before the GRPO run: its gradient_accumulation_steps 16 would make the generation of 8
    micro-steps part of one update; the GRPO command keeps its own default of 1: eight steps per generation."""
    text = ("swift sft --model m --gradient_accumulation_steps 16 --dataset d\n"
            "swift rlhf --rlhf_type grpo --loss_type dapo --steps_per_generation 8 --model m\n"
            "# swift rlhf --rlhf_type grpo --num_iterations 4\n")
    assert codes(text=text) == [(2, "KL002"), (2, "KL008")]


def test_megatron_counts_optimizer_steps_per_generation():
    """`megatron rlhf`'s steps_per_generation counts global batches: any value above 1 reuses a generation."""
    text = "megatron rlhf \\\n    --rlhf_type grpo \\\n    --beta 0.001 \\\n    --steps_per_generation 4\n"
    assert codes(text=text) == [(2, "KL007"), (3, "KL002"), (4, "KL008")]


def test_the_finding_names_ms_swift_and_the_deciding_flags():
    finding = next(f for f in lint_config("run.sh", LAUNCH.format(kind="grpo", flags="")) if f.code == "KL002")
    assert "[ms-swift: beta=0.04 (default), advantage_estimator=grpo (default)" in finding.message
    assert "--kl_in_reward true" in finding.fix


def test_a_command_built_as_a_bash_array_is_judged_with_its_elements():
    """mervekarakas/grpo_bt_rm's launch: the command found by the shell (`"$(which swift)" rlhf`) and one argument a
    line in a bash array the script then runs: every element is a flag of that command, and no flag of a command
    after the array's closing parenthesis is (an SFT run's)."""
    text = ('MODEL="${MODEL:-Qwen/Qwen2.5-1.5B}"\n'
            "cmd=(\n"
            '  "$(which swift)" rlhf\n'
            "  --rlhf_type grpo\n"
            '  --model "$MODEL"\n'
            ")\n"
            'torchrun --nproc_per_node 2 "${cmd[@]}"\n'
            "swift sft --model m --beta 0 --num_iterations 4\n")
    assert codes(text=text) == [(4, "KL002"), (4, "KL007")]


def test_the_rlhf_module_run_by_the_installed_packages_path_is_a_launch():
    """UEC-InabaLab/IncrementalRLForSpokenDST (forty-sixth set) runs ms-swift's module by the path of the installed
    package, `torchrun $(uv run python -c "import swift; print(swift.__path__[0])")/cli/rlhf.py`: its flags are
    ms-swift's (k3 as a loss at beta 0.02, each response's 1/L under loss_type grpo, two iterations per generation)."""
    text = ('torchrun --nproc_per_node 1 \\\n'
            '    $(uv run python -c "import swift; print(swift.__path__[0])")/cli/rlhf.py \\\n'
            "    --rlhf_type grpo \\\n"
            "    --beta 0.02 \\\n"
            "    --num_iterations 2\n")
    assert codes(text=text) == [(3, "KL007"), (4, "KL002"), (5, "KL008")]
    assert codes(text=text.replace("swift.__path__[0]", "other.__path__[0]")) == []


def test_an_array_in_a_function_and_a_command_after_an_array_are_told_apart():
    """An array built inside a function (its opening line indented too) holds the launch; a launch written after an
    array that was closed is a command of its own, its flags its own."""
    inside = ("run() {\n"
              "  cmd=(\n"
              "    swift rlhf\n"
              "    --rlhf_type grpo\n"
              "  )\n"
              '  "${cmd[@]}"\n'
              "}\n")
    assert codes(text=inside) == [(4, "KL002"), (4, "KL007")]
    after = ("extra=(\n"
             "  --beta 0\n"
             ")\n"
             "swift rlhf --rlhf_type grpo --loss_type dapo\n")
    assert codes(text=after) == [(4, "KL002")]
    # an array closed on its last element's line, a subshell's lone `)` later: the unindented launch is no element
    closed_inline = ("extra=(\n"
                     "  --num_iterations 4)\n"
                     "swift rlhf --rlhf_type grpo --loss_type dapo\n"
                     "(\n"
                     "  echo done\n"
                     ")\n")
    assert codes(text=closed_inline) == [(3, "KL002")]




def test_the_arrays_a_command_expands_give_its_flags():
    """oneal2000/Judge-R1 (fresh105) keeps the flags of its main run in a bash array, `COMMON_ARGS=(` a flag a line
    `)`, which `swift rlhf "${COMMON_ARGS[@]}"` expands after other commands: they are that launch's flags, and so
    are those an append (`COMMON_ARGS+=(`) adds. An array the command does not expand gives it none."""
    text = ("COMMON_ARGS=(\n"
            "  --rlhf_type grpo\n"
            "  --beta 0.05\n"
            ")\n"
            "COMMON_ARGS+=(\n"
            "  --num_iterations 2\n"
            ")\n"
            "OTHER=(\n"
            "  --loss_type dapo\n"
            ")\n"
            'echo "training"\n'
            'swift rlhf \\\n  "${COMMON_ARGS[@]}"\n')
    assert codes(text=text) == [(2, "KL007"), (3, "KL002"), (6, "KL008")]
    assert codes(text=text.replace("${COMMON_ARGS[@]}", "${OTHER[@]}")) == []


@pytest.mark.parametrize("plugins, found", [
    ("train/reward/accuracy.py", True),  # the plugin is a file of the project: the command trains
    ("train/accuracy.py train/reward/accuracy.py", False),  # one is no file: ms-swift's import fails first
    ("project/train/reward/accuracy.py", True),  # below the authors' name for the repository's folder: found
    ("$PLUGIN_DIR/accuracy.py", True),  # computed: not known here
])
def test_a_launch_whose_plugin_file_is_missing_trains_nothing(tmp_path, plugins, found):
    """EmbodiedCity/Embodied-R.code (fresh95) passes `--external_plugins train/consistency_reward_API.py ...` in its
    8-GPU launch, but the files sit in train/reward/: that command stops at the import."""
    (tmp_path / ".git").mkdir()
    (tmp_path / "train" / "reward").mkdir(parents=True)
    (tmp_path / "train" / "reward" / "accuracy.py").write_text("")
    body = f"    --external_plugins {plugins} \\\n    --beta 0.001 \\\n"
    launcher = tmp_path / "train" / "train.sh"
    findings = lint_config(str(launcher), LAUNCH.format(kind="grpo", flags=body))
    assert bool(findings) is found
