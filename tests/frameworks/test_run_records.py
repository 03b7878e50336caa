"""The copy of a configuration a launch keeps beside a run's outputs is no configuration of its own.

Double-wk/shopagent-rl (fresh97) starts each verl run with `cp "$ROOT/configs/grpo.yaml"
"$VERSION_DIR/config/grpo_base.yaml"` and commits the copies under `outputs/`: the same flags, judged at the file
the launch reads, were reported again at every copy (6 false positives).
"""

from __future__ import annotations

import pytest

from klaudit.config import Settings
from klaudit.lint.engine import lint_paths

CONFIG = "actor_rollout_ref:\n  actor:\n    use_kl_loss: true\n    kl_loss_type: low_var_kl\n    kl_loss_coef: 0.001\n"
LAUNCH = "python3 -m verl.trainer.main_ppo --config-path configs --config-name grpo trainer.total_epochs=1\n"
RECORD = 'ROOT=/workspace/app\nOUT="$ROOT/outputs/grpo/v2"\nmkdir -p "$OUT/config"\n{copy}\nbash scripts/run.sh\n'


COPY = "outputs/grpo/v2/config/grpo_base.yaml"


def _reported_files(root, record: str) -> set[str]:
    """The files of a project holding a launch, its configuration, a record script and a copy where KL002 is reported."""
    files = {"configs/grpo.yaml": CONFIG, "scripts/run.sh": LAUNCH, "scripts/record.sh": record, COPY: CONFIG}
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    findings = lint_paths([str(root)], settings=Settings(root=root), jobs=1).findings
    return {f.path.replace(str(root) + "/", "") for f in findings if f.code == "KL002"}


@pytest.mark.parametrize("copy", [
    'cp "$ROOT/configs/grpo.yaml" "$OUT/config/grpo_base.yaml"',
    'cp -f configs/grpo.yaml ${OUT}/config/grpo_base.yaml  # keep what ran',
    'rsync -a "$ROOT/configs/grpo.yaml" "$OUT/config/grpo_base.yaml"',
])
def test_a_copy_a_launch_writes_beside_its_outputs_is_a_record(tmp_path, copy):
    reported = _reported_files(tmp_path, RECORD.format(copy=copy))
    assert "configs/grpo.yaml" in reported and COPY not in reported


@pytest.mark.parametrize("record", [
    # a copy no script writes
    RECORD.format(copy="echo keep"),
    # the copy is then the configuration a launch reads
    RECORD.format(copy='cp configs/grpo.yaml "$OUT/config/grpo_base.yaml"')
    + "python3 -m verl.trainer.main_ppo --config-path $OUT/config --config-name grpo_base\n",
    # a destination naming no folder says too little to pick a file
    RECORD.format(copy='cp configs/grpo.yaml "$OUT"grpo_base.yaml'),
])
def test_other_configurations_keep_their_findings(tmp_path, record):
    assert {"configs/grpo.yaml", COPY} <= _reported_files(tmp_path, record)
