"""Launch scripts that `source` a shared file: its variables and the bash arrays the script expands decide the run.

StreamOPD's launchers (fresh64) each `source "$(dirname "${BASH_SOURCE[0]}")/common.sh"`, whose COMMON_ARGS array
holds the batch sizes and TEACHER_ARGS the distillation flags. Expected codes come from kl-math.md §8: the clamped
k3 loss is row 4 (KL002), a step per rollout leaves no off-policy row (no KL008, row 22 needs several), k2 as a
loss is row 2 (KL003), a same-token k1 reward row 2 too (KL003), its clamp KL010.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

from klaudit.config import Settings
from klaudit.frameworks import lint_config
from klaudit.frameworks.settings import shell_overrides
from klaudit.frameworks.sourcing import sourced_files
from klaudit.lint.engine import lint_paths

COMMON = textwrap.dedent("""\
    : "${TRAIN_BATCH_SIZE:=32}"
    KL_TYPE=mse
    build_common_args() {
        COMMON_ARGS=(
            algorithm.adv_estimator=grpo
            data.train_batch_size="${TRAIN_BATCH_SIZE}"
            actor_rollout_ref.actor.ppo_mini_batch_size=32
        )
    }
    build_teacher_args() {
        TEACHER_ARGS=(
            distillation.enabled=True
            distillation.distillation_loss.loss_mode=k1
            distillation.distillation_loss.use_policy_gradient=True
            distillation.distillation_loss.loss_max_clamp=10.0
        )
    }
    """)

GRPO = textwrap.dedent("""\
    : "${KL_LOSS_TYPE:=low_var_kl}"
    source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
    build_common_args
    exec $PYTHON -m verl.trainer.main_ppo "${COMMON_ARGS[@]}" \\
        actor_rollout_ref.actor.use_kl_loss=True \\
        actor_rollout_ref.actor.kl_loss_type="${KL_LOSS_TYPE}" \\
        "$@"
    """)


def _project(tmp_path: Path, launchers: dict[str, str]) -> Path:
    folder = tmp_path / "scripts" / "train"
    folder.mkdir(parents=True)
    (folder / "common.sh").write_text(COMMON)
    for name, text in launchers.items():
        (folder / name).write_text(text)
    return folder


def test_the_sourced_arrays_the_launch_expands_give_its_batch_sizes(tmp_path):
    """COMMON_ARGS sets 32 prompts a rollout and 32 a mini-batch: one optimizer step per rollout, so the k3 loss is
    row 4 alone; without the sourced file verl's defaults (1024 / 256, four steps) would add KL008. TEACHER_ARGS,
    which this launcher never expands, turns no distillation on."""
    folder = _project(tmp_path, {"grpo.sh": GRPO})
    script = str(folder / "grpo.sh")
    sourced = sourced_files(script, GRPO)
    assert list(sourced) == [2] and sourced[2].name == "common.sh"
    settings = shell_overrides(GRPO, sourced)
    size = settings["data.train_batch_size"]
    assert (size.value, size.line, size.column, size.origin) == ("32", 2, 1, "common.sh:1")
    assert "distillation.enabled" not in settings
    assert [(f.code, f.line) for f in lint_config(script, GRPO)] == [("KL002", 1)]
    alone = tmp_path / "alone.sh"  # the same launch with no common.sh beside it
    alone.write_text(GRPO)
    assert sorted(f.code for f in lint_config(str(alone), GRPO)) == ["KL002", "KL008"]


def test_a_variable_of_the_sourced_file_is_reported_at_the_source_line(tmp_path):
    """`kl_loss_type=$KL_TYPE` with `KL_TYPE=mse` in common.sh: k2 as a loss (row 2, KL003), at the `source` line of
    the launcher, whose message names where in common.sh the value is set."""
    launch = GRPO.replace('"${KL_LOSS_TYPE}"', "$KL_TYPE")
    folder = _project(tmp_path, {"grpo.sh": launch})
    [finding] = lint_config(str(folder / "grpo.sh"), launch)
    assert (finding.code, finding.line, finding.column) == ("KL003", 2, 1)
    assert "kl_loss_type=mse (common.sh:2)" in finding.message


def test_a_configuration_the_sourced_file_reports_itself_is_not_repeated_by_each_launcher(tmp_path):
    """Two distillation launchers expand TEACHER_ARGS: common.sh reports the same-token k1 reward and its clamp at
    the lines that set them, once, and neither launcher repeats them at its `source` line."""
    launcher = ('source "$(dirname "$0")/common.sh"\nbuild_common_args\nbuild_teacher_args\n'
                'python3 -m verl.trainer.main_ppo "${COMMON_ARGS[@]}" "${TEACHER_ARGS[@]}"\n')
    _project(tmp_path, {"opd.sh": launcher, "vzero.sh": launcher})
    result = lint_paths([str(tmp_path)], settings=Settings(root=tmp_path), jobs=1)
    assert sorted((Path(f.path).name, f.line, f.code) for f in result.findings) == [
        ("common.sh", 13, "KL003"), ("common.sh", 15, "KL010")]


def test_a_source_the_text_does_not_settle_is_not_followed(tmp_path):
    """`source ~/.bashrc`, `source $ENV_DIR/env.sh`, a file that is not there, and the script sourcing itself:
    nothing is read in, and the launch is judged on its own flags (verl's defaults: KL002 and KL008)."""
    text = ("source ~/.bashrc\nsource $ENV_DIR/env.sh\n. ./missing.sh\nsource \"$(dirname \"$0\")/run.sh\"\n"
            "python3 -m verl.trainer.main_ppo actor_rollout_ref.actor.use_kl_loss=True "
            "actor_rollout_ref.actor.kl_loss_type=low_var_kl\n")
    script = tmp_path / "run.sh"
    script.write_text(text)
    assert sourced_files(str(script), text) == {}
    assert sorted(f.code for f in lint_config(str(script), text)) == ["KL002", "KL008"]


def test_a_folder_variable_names_the_sourced_file(tmp_path):
    """`SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"` then `. "${SCRIPT_DIR}/common.sh"`."""
    text = ('SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"\n. "${SCRIPT_DIR}/common.sh"\n'
            'python3 -m verl.trainer.main_ppo "${COMMON_ARGS[@]}"\n')
    folder = _project(tmp_path, {"run.sh": text})
    [(line, sourced)] = sourced_files(str(folder / "run.sh"), text).items()
    assert (line, sourced.column, sourced.end_column, sourced.name) == (2, 1, 2, "common.sh")
