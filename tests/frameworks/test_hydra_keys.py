"""The keys a Hydra config composes from its defaults lists, and the overrides Hydra refuses
(klaudit.frameworks.hydra_keys). The expected key sets are written out by hand from Hydra's rules: a group
entry places its option's keys at its package, a plain name merges a config of the same folder, `${group}`
stands for the option chosen for that group, `_self_` is the file's own keys."""

from __future__ import annotations

from pathlib import Path

import pytest

from klaudit.frameworks import hydra_keys
from klaudit.frameworks.settings import shell_assignment

MAIN = '''\
import hydra


@hydra.main(config_path="config", config_name="ppo_trainer", version_base=None)
def main(config):
    pass
'''

FILES = {
    "ppo_trainer.yaml": """\
defaults:
  - engine: dp
  - actor@actor_rollout_ref.actor: ${engine}_actor
  - data@data: legacy_data
  - reward@reward: null
  - optional extra@extra: missing
  - _self_
actor_rollout_ref:
  model:
    path: ~/models/x
    override_config: {}
trainer:
  total_epochs: 30
""",
    "engine/dp.yaml": "name: dp\n",
    "engine/megatron.yaml": "name: megatron\n",
    "actor/actor.yaml": "use_kl_loss: false\nkl_loss_type: low_var_kl\n",
    "actor/dp_actor.yaml": "defaults:\n  - ../optim@optim: fsdp\n  - actor\n  - _self_\nstrategy: fsdp\n",
    "actor/megatron_actor.yaml": "defaults:\n  - actor\nmegatron:\n  tensor_model_parallel_size: 1\n",
    "optim/fsdp.yaml": "lr: 1.0e-6\n",
    "data/legacy_data.yaml": "train_files: ~/data/train.parquet\nval_files: null\n",
}


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    """A copy of a framework: its trainer module and the config folder beside it."""
    trainer = tmp_path / "verl" / "trainer"
    for name, text in FILES.items():
        (trainer / "config" / name).parent.mkdir(parents=True, exist_ok=True)
        (trainer / "config" / name).write_text(text)
    (trainer / "main_ppo.py").write_text(MAIN)
    return trainer


def _sections(*names: str) -> set[str]:
    return {key for name in names for key in (name, name + ".")}


def test_the_keys_of_a_composition_with_groups_packages_and_a_chosen_option(copy):
    keys = hydra_keys.composed_keys(copy / "config", "ppo_trainer")
    assert keys == {
        *_sections("engine", "actor_rollout_ref", "actor_rollout_ref.actor", "actor_rollout_ref.actor.optim",
                   "actor_rollout_ref.model", "actor_rollout_ref.model.override_config", "data", "trainer"),
        "engine.name", "actor_rollout_ref.actor.use_kl_loss", "actor_rollout_ref.actor.kl_loss_type",
        "actor_rollout_ref.actor.strategy", "actor_rollout_ref.actor.optim.lr", "actor_rollout_ref.model.path",
        "data.train_files", "data.val_files", "data.val_files?", "trainer.total_epochs",
    }
    chosen = hydra_keys.composed_keys(copy / "config", "ppo_trainer.yaml", (("engine", "megatron"),))
    assert "actor_rollout_ref.actor.megatron.tensor_model_parallel_size" in chosen
    assert "actor_rollout_ref.actor.strategy" not in chosen


def test_a_defaults_list_that_cannot_be_followed_gives_no_keys(copy):
    (copy / "config" / "data" / "legacy_data.yaml").unlink()
    assert hydra_keys.composed_keys(copy / "config", "ppo_trainer") is None
    (copy / "config" / "other.yaml").write_text("defaults:\n  - actor@a: ${unknown}\n")
    assert hydra_keys.composed_keys(copy / "config", "other") is None


@pytest.mark.parametrize("command, refused", [
    ("data.val_files=x actor_rollout_ref.actor.use_kl_loss=True", None),
    ("data.val_files_test=x", "data.val_files_test"),  # a key the copy renamed
    ("actor_rollout_ref.model.override_config.attn=eager", "actor_rollout_ref.model.override_config.attn"),
    ("+actor_rollout_ref.model.override_config.attn=eager ++data.new=1 ~trainer.total_epochs", None),
    # `+` appends: a key the config has already is refused (SoundMind's `+trainer.val_before_train`, fresh91)
    ("+trainer.total_epochs=3", "trainer.total_epochs"),
    ("++trainer.total_epochs=3", None),
    ("+data.val_files=x", None),  # left null: Hydra appends there (verl's megatron examples' override_transformer_config)
    ("+actor_rollout_ref.model.override_config={}", None),  # a section: merged
    ("custom.section.key=1", None),  # no section of it is known: not decided here
    ("data.train_files.part=1", None),  # under a value, not a section
    ("hydra.run.dir=/tmp", None),
    ("'data.val_files_test=x'", "data.val_files_test"),
    ("engine=megatron actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2", None),
    ("actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2", "actor_rollout_ref.actor.megatron.tensor_model_parallel_size"),
    ("+reward=rm reward.path=x", None),  # a config group added: its keys are not known here
    ("--config-path=/elsewhere data.val_files_test=x", None),
    ("--config-path config --config-name 'ppo_trainer.yaml' data.val_files_test=x", "data.val_files_test"),
    ("--config-name=other data.val_files_test=x", None),  # no such config: nothing known
])
def test_an_override_of_a_key_the_config_lacks_is_refused(copy, command, refused):
    assert hydra_keys.refused_launch(command, copy / "main_ppo.py") == refused


# SoundMind's curriculum.sh (fresh91): the overrides held in a variable, a word a line, the command `eval`ed
OVERRIDES_IN_A_VARIABLE = """\
BASE_CONFIG="\\
    actor_rollout_ref.actor.use_kl_loss=True \\
    {key}=False \\
    trainer.total_epochs=1"
COMMAND="python3 -m verl.trainer.main_ppo ${{BASE_CONFIG}} data.val_files=x"
eval $COMMAND
"""


@pytest.mark.parametrize("key, refused", [
    ("data.val_files_test", "data.val_files_test"),
    ("data.val_files", None),
])
def test_the_overrides_a_variable_holds_are_read(copy, key, refused):
    script = OVERRIDES_IN_A_VARIABLE.format(key=key)
    assert hydra_keys.refused_launch("${BASE_CONFIG} data.val_files=x", copy / "main_ppo.py", script) == refused


def test_a_quoted_shell_value_over_several_lines():
    script = OVERRIDES_IN_A_VARIABLE.format(key="a.b")
    assert shell_assignment(script, "BASE_CONFIG") == "actor_rollout_ref.actor.use_kl_loss=True a.b=False trainer.total_epochs=1"
    assert shell_assignment('A="x y"\nB=\'never closed\n', "B") is None


def test_no_hydra_main_no_answer(copy):
    (copy / "main_ppo.py").write_text("def main():\n    pass\n")
    assert hydra_keys.refused_launch("data.val_files_test=x", copy / "main_ppo.py") is None
