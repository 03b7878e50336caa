"""slime's KL flags on the command line of a launch script (THUDM/slime's train.py and train_async.py).

Expected codes come from kl-math.md §8: k1 as a loss row 1 (KL001), k2 as a loss row 2 (KL003), the
score-weighted k3 (`--use-unbiased-kl` with k3) row 2 (KL003), low_var_kl as a loss row 4 (KL002), k1 in the
reward with returns to go row 6 (right), low_var_kl in the reward row 7 (KL004), each sample's token mean
(slime's sum_of_sample_mean) row 21 (KL007), a KL loss on an older policy's samples row 22 and a KL reward
reweighed by the token ratio only row 23 (KL008). grpo leaves a KL reward out of its returns: nothing to judge.
On-policy distillation (`--use-opd`) puts the k1 to the teacher on each token's own advantage: row 2 (KL003).
"""

from __future__ import annotations

import pytest

from klaudit.frameworks import lint_config

LAUNCH = """\
#!/bin/bash
cd /root/slime
ROLLOUT_ARGS=(
   --rollout-batch-size 32
   --n-samples-per-prompt 8
   --global-batch-size {batch}
)
GRPO_ARGS=(
{grpo})
ray job submit -- python3 {entry} "${{ROLLOUT_ARGS[@]}}" "${{GRPO_ARGS[@]}}"
"""


def codes(grpo: str, batch: str = "256", entry: str = "train.py", text: str | None = None) -> list[tuple[int, str]]:
    """(line, code) of the findings of a launch whose GRPO_ARGS are `grpo` (one flag and its value per line)."""
    body = "".join(f"   {line.strip()}\n" for line in grpo.strip().splitlines())
    text = text if text is not None else LAUNCH.format(batch=batch, grpo=body, entry=entry)
    return sorted((f.line, f.code) for f in lint_config("scripts/run.sh", text))


@pytest.mark.parametrize("grpo, expected", [
    ("--use-kl-loss\n--kl-loss-coef 0.001\n--kl-loss-type low_var_kl", [(9, "KL007"), (11, "KL002")]),
    ("--use-kl-loss\n--kl-loss-coef 0.001\n--kl-loss-type low_var_kl\n--calculate-per-token-loss", [(11, "KL002")]),
    ("--use-kl-loss\n--kl-loss-coef 0.001", [(9, "KL001")]),  # k1, the default type: 1/L of a zero mean is zero
    ("--use-kl-loss\n--kl-loss-coef 0.001\n--kl-loss-type kl\n--calculate-per-token-loss", [(11, "KL001")]),
    ("--use-kl-loss\n--kl-loss-coef 0.001\n--kl-loss-type k2\n--calculate-per-token-loss", [(11, "KL003")]),
    ("--use-kl-loss\n--kl-loss-coef 0.001\n--kl-loss-type k3\n--use-unbiased-kl\n--calculate-per-token-loss",
     [(11, "KL003")]),
    ("--use-kl-loss\n--kl-loss-coef 0.001\n--kl-loss-type low_var_kl\n--use-unbiased-kl", []),  # no catalog row
    ("--use-kl-loss\n--kl-loss-coef 0.00\n--kl-loss-type low_var_kl", []),  # the loss times 0
    ("--kl-coef 0.01\n--kl-loss-type low_var_kl", []),  # grpo, the default: the KL reward is only logged
    ("--advantage-estimator reinforce_plus_plus\n--kl-coef 0.01\n--calculate-per-token-loss", []),  # row 6
    ("--advantage-estimator ppo\n--kl-coef 0.01\n--kl-loss-type low_var_kl\n--calculate-per-token-loss",
     [(11, "KL004")]),
    ("--advantage-estimator reinforce_plus_plus\n--kl-coef 0.01", [(10, "KL007")]),  # 1/L on the KL reward
    # on-policy distillation: -(logp - teacher logp) on each token's own advantage, the same-token k1 of row 2
    # (KL003), each sample's token mean (KL007); slime's own example keeps a KL loss at coefficient 0 beside it
    ("--use-opd\n--opd-type sglang\n--opd-kl-coef 1.0", [(9, "KL003"), (9, "KL007")]),
    ("--use-opd\n--opd-type sglang\n--calculate-per-token-loss", [(9, "KL003")]),  # the default coefficient, 1
    ("--use-opd\n--opd-kl-coef 1.0\n--use-kl-loss\n--kl-loss-coef 0.00\n--kl-loss-type low_var_kl",
     [(9, "KL003"), (9, "KL007")]),
    ("--use-opd\n--opd-kl-coef 0.0", []),  # the term times 0
])
def test_slime_flags_get_the_catalog_s_verdict(grpo, expected):
    assert codes(grpo) == expected


def test_several_steps_per_rollout_or_async_training_make_the_kl_stale():
    """32 x 8 samples over global batches of 64: four optimizer steps per rollout (KL008 at the batch size, line 6);
    train_async.py trains on the rollout generated while the last update ran (KL008 at the entry point)."""
    loss = "--use-kl-loss\n--kl-loss-coef 0.001\n--kl-loss-type low_var_kl\n--calculate-per-token-loss"
    assert codes(loss, batch="64") == [(6, "KL008"), (11, "KL002")]
    assert codes(loss, entry="train_async.py") == [(11, "KL002"), (14, "KL008")]
    reward = "--advantage-estimator ppo\n--kl-coef 0.01\n--calculate-per-token-loss"
    assert codes(reward, batch="64") == [(6, "KL008")]  # k1 reward, PPO's token ratio only (row 23)
    opd = "--use-opd\n--opd-kl-coef 1.0\n--calculate-per-token-loss"
    assert codes(opd, batch="64") == [(6, "KL008"), (9, "KL003")]


def test_only_a_launch_of_slime_is_read():
    """`train.py` with slime's flag names, in a script that names no slime and a project without its package:
    another project's own argument parser, not read."""
    text = LAUNCH.format(batch="256", grpo="   --use-kl-loss\n   --kl-loss-coef 0.001\n", entry="train.py")
    assert codes("", text=text.replace("cd /root/slime\n", "")) == []
    commented = text.replace("ray job submit", "# ray job submit")
    assert codes("", text=commented) == []


def test_a_launch_of_miles_is_read_as_slime_and_named_miles(tmp_path):
    """radixark/miles, a fork of slime, keeps its KL flags and defaults: a launch of a project that carries
    `miles/utils/arguments.py`, or one that names miles, gets slime's verdict under miles's name."""
    grpo = "   --use-kl-loss\n   --kl-loss-coef 0.001\n   --kl-loss-type low_var_kl\n"
    text = LAUNCH.format(batch="256", grpo=grpo, entry="train.py")
    named = text.replace("cd /root/slime", "cd /root/miles")
    found = lint_config("scripts/run.sh", named)
    assert sorted((f.line, f.code) for f in found) == [(9, "KL007"), (11, "KL002")]
    assert all("[miles: " in f.message for f in found)
    (tmp_path / "pyproject.toml").write_text("")
    (tmp_path / "miles" / "utils").mkdir(parents=True)
    (tmp_path / "miles" / "utils" / "arguments.py").write_text("")
    script = tmp_path / "examples" / "run.sh"
    script.parent.mkdir()
    unnamed = text.replace("cd /root/slime\n", "")
    script.write_text(unnamed)
    assert sorted(f.code for f in lint_config(str(script), unnamed)) == ["KL002", "KL007"]
