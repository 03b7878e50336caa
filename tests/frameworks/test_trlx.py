"""trlx's PPO configuration (klaudit.frameworks.trlx): a k1 reward reused over several optimizer steps, or a loss
averaged over one response at a time.

Verdicts (kl-math.md section 8): trlx folds k1 into the token rewards before GAE (row 6: right on fresh samples).
Its learn loop takes ppo_epochs x ceil(num_rollouts / batch_size) optimizer steps on one collection, the later ones
on an older policy's samples with only PPO's token ratio (row 23, KL008); a micro-batch of one response makes the
loss's token mean that response's own, weighted 1/L (row 21, KL007).
"""

from __future__ import annotations

import pytest

from klaudit.config import Settings
from klaudit.lint.engine import lint_paths

SCRIPT = """\
import trlx
from trlx.data.configs import TrainConfig, TRLConfig
from trlx.models.modeling_ppo import PPOConfig

config = TRLConfig(
    train=TrainConfig(seq_length=512, epochs=100, total_steps=1000, {train}),
    method=PPOConfig(
        name="PPOConfig",
        {method}
        chunk_size=16,
    ),
)
trlx.train(reward_fn=lambda samples, **kw: [0.0] * len(samples), config=config)
"""


def _found(tmp_path, train, method, name="train.py"):
    (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / name).write_text(SCRIPT.format(train=train, method=method))
    result = lint_paths([str(tmp_path)], settings=Settings(root=tmp_path), jobs=1)
    return [(f.path.rsplit("/", 1)[-1], f.line, f.code, f.message) for f in result.findings]


@pytest.mark.parametrize("train, method, expected", [
    # nlp-uoregon/Okapi (fresh94): 4 epochs over 128 rollouts in batches of 2, one response per backward pass
    ("batch_size=2, minibatch_size=1", "num_rollouts=128, ppo_epochs=4, init_kl_coef=0.1,",
     [(6, "KL007", "minibatch_size=1"), (9, "KL008", "256 optimizer steps per collection")]),
    # yongzx/pythia-rlhf-ppo (fresh70): 4 epochs over 64 rollouts in batches of 4
    ("batch_size=4", "num_rollouts=64, ppo_epochs=4, init_kl_coef=0.05,", [(9, "KL008", "64 optimizer steps")]),
    ("batch_size=12", "num_rollouts=128, ppo_epochs=4,", [(9, "KL008", "44 optimizer steps")]),  # a last, short batch
    ("batch_size=1", "num_rollouts=1, ppo_epochs=1,", [(6, "KL007", "batch_size=1")]),  # one step, one response
    ("batch_size=128", "num_rollouts=128, ppo_epochs=1,", []),  # one step per collection: k1 on fresh samples
    ("batch_size=2, minibatch_size=1", "num_rollouts=128, ppo_epochs=4, init_kl_coef=0,", []),  # no KL
    ("batch_size=BATCH", "num_rollouts=128, ppo_epochs=4,", [(9, "KL008", "at least 4 optimizer steps")]),
])
def test_a_trlx_ppo_configuration(tmp_path, train, method, expected):
    found = _found(tmp_path, train, method)
    assert [(line, code) for _, line, code, _ in found] == [(line, code) for line, code, _ in expected]
    for (_, _, _, message), (_, _, words) in zip(found, expected):
        assert "[trlx PPO:" in message and words in message, message


def test_trls_ppo_config_is_not_trlxs(tmp_path):
    (tmp_path / "train.py").write_text("from trl import PPOConfig\n\nconfig = PPOConfig(ppo_epochs=1, num_rollouts=1)\n")
    found = lint_paths([str(tmp_path)], settings=Settings(root=tmp_path), jobs=1).findings
    assert not any("trlx" in f.message for f in found)


def test_a_copy_of_trlx_carried_in_a_project_keeps_its_examples_to_itself(tmp_path):
    """Improbable-AI/curiosity_redteam (fresh94) carries trlx as custom_trlx/ (with its own pyproject.toml) and
    trains with scripts of its own: trlx's examples there are no runs of the project; the same configuration in a
    script of the project's is."""
    (tmp_path / ".git").mkdir()
    copy = tmp_path / "custom_trlx"
    (copy / "trlx" / "trainer").mkdir(parents=True)
    (copy / "trlx" / "trainer" / "accelerate_ppo_trainer.py").write_text("class AcceleratePPOTrainer:\n    pass\n")
    (copy / "pyproject.toml").write_text("[project]\nname = 'trlx'\n")
    method = "num_rollouts=64, ppo_epochs=4,"
    assert _found(tmp_path, "batch_size=4", method, name="custom_trlx/examples/ppo_hh.py") == []
    assert [f[:3] for f in _found(tmp_path, "batch_size=4", method, name="ppo_redteam.py")] == [
        ("ppo_redteam.py", 9, "KL008")]


def test_a_projects_subclass_of_trlxs_ppo_config_is_read_as_it(tmp_path):
    """curiosity_redteam's scripts build `RedteamPPOConfig(...)`, a class of its trainer module deriving from trlx's
    PPOConfig: 4 epochs over 128 rollouts in batches of 64 are 8 steps per collection (KL008). The same class name
    deriving from nothing of trlx's is no trlx configuration."""
    trainer = "from trlx.models.modeling_ppo import PPOConfig\n\n\nclass RedteamPPOConfig(PPOConfig):\n    bonus: float = 1.0\n"
    script = SCRIPT.replace("from trlx.models.modeling_ppo import PPOConfig", "from redteam import RedteamPPOConfig")
    script = script.replace("method=PPOConfig(", "method=RedteamPPOConfig(")
    (tmp_path / "redteam.py").write_text(trainer)
    (tmp_path / "train.py").write_text(script.format(train="batch_size=64", method="num_rollouts=128, ppo_epochs=4,"))
    found = lint_paths([str(tmp_path)], settings=Settings(root=tmp_path), jobs=1).findings
    assert [(f.line, f.code) for f in found] == [(9, "KL008")] and "8 optimizer steps" in found[0].message
    (tmp_path / "redteam.py").write_text(trainer.replace("from trlx.models.modeling_ppo import PPOConfig", "PPOConfig = object"))
    assert lint_paths([str(tmp_path)], settings=Settings(root=tmp_path), jobs=1).findings == []
