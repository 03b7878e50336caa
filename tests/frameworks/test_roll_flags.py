"""ROLL's KL settings in a pipeline's YAML config (alibaba/ROLL), with the defaults and code of the project's
copy of `roll/` where it carries one.

Expected codes come from kl-math.md §8: ROLL's KL loss is k3 clamped to [-10, 10] (low_var_kl) as a loss,
row 4 (KL002); each sequence's token mean row 21 (KL007); a KL loss on an older policy's samples row 22 and a
KL reward reweighed by the token ratio only row 23 (KL008); k1 in the reward with returns to go row 6 (right),
k2 (`mse`) in the reward row 8 (KL004). A token sum per sequence (main branch's seq-mean-token-sum) or the
batch's token mean carry no 1/L weight.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from klaudit.frameworks import lint_config

CONFIG = """\
rollout_batch_size: 64
num_return_sequences_in_group: 8
ppo_epochs: {epochs}
adv_estimator: "reinforce"
{kl}
actor_train:
  training_args:
    per_device_train_batch_size: {per_device}
    gradient_accumulation_steps: 4
  strategy_args:
    strategy_name: megatron_train
    strategy_config:
      tensor_model_parallel_size: 2
  device_mapping: list(range(0,8))
actor_infer:
  generating_args:
    num_return_sequences: ${{num_return_sequences_in_group}}
"""
# 64 x 8 = 512 samples over 8 GPUs / TP 2 = 4 data-parallel ranks: 128 per rank; a step takes per_device x 4


def codes(kl: str, epochs: str = "1", per_device: str = "32", path: str = "examples/rlvr.yaml") -> list[tuple[int, str]]:
    """(line, code) of the findings of a config whose KL lines (from line 5) are `kl`."""
    text = CONFIG.format(kl=kl.strip(), epochs=epochs, per_device=per_device)
    return sorted((f.line, f.code) for f in lint_config(path, text))


@pytest.mark.parametrize("kl, expected", [
    ("use_kl_loss: true\nkl_loss_coef: 0.01", [(5, "KL002"), (5, "KL007")]),  # main's seq-mean-token-mean
    ("use_kl_loss: true\nkl_loss_coef: 0.01\nloss_agg_mode: token-mean", [(5, "KL002")]),
    ("use_kl_loss: true\nkl_loss_coef: 0.01\nloss_agg_mode: seq-mean-token-sum", [(5, "KL002")]),  # a token sum
    ("use_kl_loss: true\nkl_loss_coef: 0.0", []),  # the loss times 0
    ("use_kl_loss: false\nkl_loss_coef: 0.01\ninit_kl_coef: 0.0", []),
    ("add_token_level_kl: true\ninit_kl_coef: 0.05\nloss_agg_mode: token-mean", []),  # row 6
    ("add_token_level_kl: true\ninit_kl_coef: 0.05\nkl_penalty: mse\nloss_agg_mode: token-mean", [(7, "KL004")]),
    ("add_token_level_kl: true\ninit_kl_coef: 0.05", [(5, "KL007")]),  # the policy loss's 1/L on the KL reward
    ("add_token_level_kl: true\ninit_kl_coef: 0.05\ngamma: 0.99", []),  # discounted returns: no catalog row
    ("add_token_level_kl: false\nuse_kl_loss: false", []),  # init_kl_coef's 0.2 is only logged
])
def test_roll_configs_get_the_catalog_s_verdict(kl, expected):
    assert codes(kl) == expected


def test_several_optimizer_steps_per_rollout_make_the_kl_stale():
    """128 samples per rank in steps of 8 x 4: four steps (KL008 at rollout_batch_size); one step of 32 x 4 but
    two epochs: KL008 at ppo_epochs; the KL reward is then reweighed by the token ratio only (row 23)."""
    loss = "use_kl_loss: true\nkl_loss_coef: 0.01\nloss_agg_mode: token-mean"
    assert codes(loss, per_device="8") == [(1, "KL008"), (5, "KL002")]
    assert codes(loss, epochs="2") == [(3, "KL008"), (5, "KL002")]
    reward = "add_token_level_kl: true\ninit_kl_coef: 0.05\nloss_agg_mode: token-mean"
    assert codes(reward, per_device="8") == [(1, "KL008")]


def test_a_device_mapping_it_cannot_count_leaves_only_the_epochs():
    text = CONFIG.format(kl="use_kl_loss: true\nkl_loss_coef: 0.01\nloss_agg_mode: token-mean", epochs="1",
                         per_device="8").replace("list(range(0,8))", "${gpus}")
    assert sorted((f.line, f.code) for f in lint_config("examples/rlvr.yaml", text)) == [(5, "KL002")]


def test_a_copy_of_roll_gives_its_defaults_and_its_token_sum(tmp_path: Path):
    """A copy whose seq-mean-token-sum is each sequence's token mean (ROLL before August 2025) and whose config
    class defaults to it: KL007 without loss_agg_mode in the file, and with seq-mean-token-sum named."""
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'game-rl'\n")
    functionals = tmp_path / "roll" / "utils" / "functionals.py"
    functionals.parent.mkdir(parents=True)
    functionals.write_text('def agg_loss(loss_mat, loss_mask, loss_agg_mode):\n'
                           '    if loss_agg_mode == "seq-mean-token-sum":\n'
                           '        seq_losses = masked_mean(loss_mat, loss_mask, dim=-1)\n')
    rlvr = tmp_path / "roll" / "pipeline" / "rlvr" / "rlvr_config.py"
    rlvr.parent.mkdir(parents=True)
    rlvr.write_text('class RLVRConfig:\n    loss_agg_mode: Literal["token-mean", "seq-mean-token-sum"] = (\n'
                    '        field(default="seq-mean-token-sum", metadata={"help": "Loss aggregation mode"})\n    )\n')
    config = tmp_path / "examples" / "rlvr.yaml"
    config.parent.mkdir()
    for kl, at in (("use_kl_loss: true\nkl_loss_coef: 0.01", 5),
                   ("use_kl_loss: true\nkl_loss_coef: 0.01\nloss_agg_mode: seq-mean-token-sum", 7)):
        text = CONFIG.format(kl=kl, epochs="1", per_device="32")
        findings = lint_config(str(config), text)
        assert sorted((f.line, f.code) for f in findings) == [(5, "KL002"), (at, "KL007")]
        assert "each sequence's token mean in this copy" in findings[0].message


def test_only_a_roll_pipeline_config_is_read():
    """The same keys at the top of a file without ROLL's worker sections are not ROLL's."""
    assert lint_config("conf.yaml", "use_kl_loss: true\nkl_loss_coef: 0.01\n") == []
