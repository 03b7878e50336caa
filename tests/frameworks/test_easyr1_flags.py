"""EasyR1's KL settings in its YAML config (hiyouga/EasyR1 and its forks, e.g. OpenVLThinker).

Expected codes come from kl-math.md §8: k1 as a loss row 1 (KL001), k2 as a loss row 2 (KL003), k3 /
low_var_kl as a loss rows 3-4 (KL002), abs as a loss row 5 (KL009), k1 in the reward row 6 (correct with
GRPO's whole-sequence return), low_var_kl in the reward row 7 (KL004), a per-sequence token mean row 21
(KL007). The semantics are EasyR1's: `use_kl_loss` puts `kl_penalty`'s estimator into the actor's loss,
else (unless `disable_kl`) into the token rewards; `kl_coef: 0` adds nothing.
"""

from __future__ import annotations

import pytest

from klaudit.frameworks import lint_config

CONFIG = """\
data:
  rollout_batch_size: 512

algorithm:
  adv_estimator: grpo
  disable_kl: {disable}
  use_kl_loss: {loss}
  kl_penalty: {penalty}
  kl_coef: {coef}

worker:
  actor:
    global_batch_size: 512
{actor}"""


def codes(loss="true", penalty="low_var_kl", disable="false", coef="1.0e-2", actor="") -> list[tuple[int, str]]:
    text = CONFIG.format(loss=loss, penalty=penalty, disable=disable, coef=coef, actor=actor)
    return sorted((f.line, f.code) for f in lint_config("examples/config.yaml", text))


@pytest.mark.parametrize("arguments, expected", [
    ({}, [(8, "KL002")]),
    ({"penalty": "kl"}, [(8, "KL001")]),
    ({"penalty": "abs"}, [(8, "KL009")]),
    ({"penalty": "mse", "actor": "    loss_avg_mode: seq\n"}, [(8, "KL003"), (14, "KL007")]),
    ({"loss": "false", "penalty": "low_var_kl"}, [(8, "KL004")]),  # in the reward
    ({"loss": "false", "penalty": "kl"}, []),  # k1 in the reward, the whole-sequence return: row 6
    ({"disable": "true"}, []),
    ({"coef": "0.0"}, []),
    ({"penalty": "full"}, []),  # a value this reader does not know decides nothing
])
def test_easyr1_settings_get_the_catalog_s_verdict(arguments, expected):
    assert codes(**arguments) == expected


@pytest.mark.parametrize("update, epochs, expected", [
    ("512", "1", [(8, "KL002")]),  # one optimizer step per rollout
    ("128", "1", [(8, "KL002"), (13, "KL008")]),  # four: rows 3-4 and 22, at the update batch size
    ("512", "2", [(8, "KL002"), (14, "KL008")]),  # two passes over the rollout: at ppo_epochs
])
def test_several_updates_per_rollout_make_the_kl_loss_off_policy(update, epochs, expected):
    text = CONFIG.format(loss="true", penalty="low_var_kl", disable="false", coef="1.0e-2",
                         actor=f"    ppo_epochs: {epochs}\n").replace("global_batch_size: 512", f"global_batch_size: {update}")
    found = lint_config("examples/config.yaml", text)
    assert sorted((f.line, f.code) for f in found) == expected
    stale = [f for f in found if f.code == "KL008"]
    assert all("global_batch_size equal to data.rollout_batch_size" in f.fix for f in stale)


@pytest.mark.parametrize("update, expected", [
    ("512", []),  # the k1 reward over one optimizer step per rollout: row 6, right
    ("128", [(13, "KL008")]),  # over four, with only PPO's token ratio: row 23, at the update batch size
])
def test_a_kl_reward_over_several_updates_per_rollout_meets_only_the_token_ratio(update, expected):
    text = CONFIG.format(loss="false", penalty="kl", disable="false", coef="1.0e-2", actor="").replace(
        "global_batch_size: 512", f"global_batch_size: {update}")
    assert sorted((f.line, f.code) for f in lint_config("examples/config.yaml", text)) == expected


def test_a_verl_config_is_not_read_as_easyr1s():
    """verl's own `algorithm.kl_penalty` (its reward estimator) without EasyR1's `disable_kl` is verl's: row 7,
    and at verl's default batch sizes (four updates per rollout) row 23."""
    text = "algorithm:\n  adv_estimator: grpo\n  kl_penalty: low_var_kl\n  use_kl_in_reward: true\n"
    assert [(f.code, "verl" in f.message) for f in lint_config("ppo_trainer.yaml", text)] == [("KL004", True),
                                                                                              ("KL008", True)]


def test_the_finding_names_the_settings_and_the_fix_keeps_the_strength():
    [finding] = lint_config("examples/config.yaml", CONFIG.format(loss="true", penalty="low_var_kl",
                                                                  disable="false", coef="1.0e-2", actor=""))
    assert "[EasyR1: use_kl_loss=true, disable_kl=false, kl_penalty=low_var_kl" in finding.message
    assert "algorithm.use_kl_loss: false" in finding.fix and "mean response length" in finding.fix


# EasyR1's first releases (Seg-Zero's fork): the KL loss switched in the actor's section, no disable_kl
EARLY_CONFIG = """\
algorithm:
  adv_estimator: grpo
  kl_coef: {reward_coef}

worker:
  actor:
    global_batch_size: 512
{actor}"""


@pytest.mark.parametrize("actor, reward_coef, expected", [
    ("    use_kl_loss: true\n    kl_loss_coef: 5.0e-3\n    kl_loss_type: low_var_kl\n", "0.0", [(10, "KL002")]),
    ("    use_kl_loss: true\n    kl_loss_type: kl\n", "0.0", [(9, "KL001")]),
    ("    kl_loss_coef: 1.0e-2\n", "0.0", [(8, "KL002")]),  # use_kl_loss and low_var_kl by default
    ("    use_kl_loss: true\n    kl_loss_coef: 0.0\n", "0.0", []),  # the loss adds nothing
    ("    use_kl_loss: false\n", "1.0e-3", []),  # k1 (the default kl_penalty) in the reward: row 6
    ("    use_kl_loss: false\n", "0.0", []),
])
def test_easyr1s_first_layout_is_read_from_the_actor_section(actor, reward_coef, expected):
    text = EARLY_CONFIG.format(actor=actor, reward_coef=reward_coef)
    found = lint_config("training_scripts/visionreasoner_7b.yaml", text)
    assert sorted((f.line, f.code) for f in found) == expected
    assert all("worker.actor.use_kl_loss: false" in f.fix for f in found)


def test_easyr1s_first_layout_with_the_kl_in_the_reward():
    text = EARLY_CONFIG.format(actor="    use_kl_loss: false\n", reward_coef="1.0e-3").replace(
        "  kl_coef: 1.0e-3\n", "  kl_coef: 1.0e-3\n  kl_penalty: low_var_kl\n")
    assert [(f.line, f.code) for f in lint_config("config.yaml", text)] == [(4, "KL004")]


LAUNCH = """\
#!/bin/bash
set -x

python3 -m verl.trainer.main \\
    config=examples/config.yaml \\
    data.train_files=hiyouga/geometry3k@train \\
{overrides}    trainer.n_gpus_per_node=8
"""


def launch_codes(tmp_path, overrides: str, update: str = "128") -> list[tuple[int, str]]:
    """(line, code) of the launch's findings, its config a low_var_kl loss over updates of `update` prompts."""
    (tmp_path / ".git").mkdir(exist_ok=True)
    (tmp_path / "examples").mkdir(exist_ok=True)
    config = CONFIG.format(loss="true", penalty="low_var_kl", disable="false", coef="1.0e-2", actor="").replace(
        "global_batch_size: 512", f"global_batch_size: {update}")
    (tmp_path / "examples" / "config.yaml").write_text(config)
    launch = tmp_path / "examples" / "run.sh"
    launch.write_text(LAUNCH.format(overrides="".join(f"    {line} \\\n" for line in overrides.split())))
    return sorted((f.line, f.code) for f in lint_config(str(launch), launch.read_text()))


@pytest.mark.parametrize("overrides, expected", [
    # the reward's k1, computed once per rollout of 512 prompts, trained over 4 updates of 128 with the token
    # ratio only (row 23: KL008), at the launch's first override of a key the verdict reads
    ("algorithm.use_kl_loss=false algorithm.kl_penalty=kl", [(7, "KL008")]),
    # one update per rollout: k1 in the reward with GRPO's whole-sequence return (row 6), right
    ("algorithm.use_kl_loss=false algorithm.kl_penalty=kl worker.actor.global_batch_size=512", []),
    ("algorithm.kl_penalty=kl", [(7, "KL001"), (7, "KL008")]),  # k1 as a loss (row 1), stale (row 22)
    ("algorithm.kl_coef=1.0e-3", []),  # the config's own configuration: its findings are the config's
    ("trainer.total_epochs=2", []),  # no key a verdict reads
    # a new batch size makes the loss on-policy: the launch's configuration differs, but its KL002 is the config's
    ("worker.actor.global_batch_size=512", []),
    ("worker.actor.global_batch_size=512 algorithm.kl_coef=2.0e-2", [(7, "KL002")]),  # its own coefficient
    ("algorithm.disable_kl=true", []),
])
def test_an_easyr1_launch_is_judged_over_the_config_it_names(tmp_path, overrides, expected):
    """Learning_from_Retrospection (seventeenth set): `algorithm.use_kl_loss=false` over config.yaml's
    rollout_batch_size 512 and global_batch_size 128 was read by no reader (1 flag miss)."""
    assert launch_codes(tmp_path, overrides) == expected


def test_a_launch_whose_config_is_missing_reports_nothing(tmp_path):
    """Its overrides alone would be an EasyR1 configuration (disable_kl, a low_var_kl loss: KL002), but what they
    override is not there to read: no verdict."""
    launch = tmp_path / "run.sh"
    overrides = "algorithm.disable_kl=false algorithm.use_kl_loss=true algorithm.kl_penalty=low_var_kl".split()
    launch.write_text(LAUNCH.format(overrides="".join(f"    {line} \\\n" for line in overrides)))
    assert lint_config(str(launch), launch.read_text()) == []


def _actor(tmp_path, body: str) -> None:
    actor = tmp_path / "verl" / "workers" / "actor"
    actor.mkdir(parents=True, exist_ok=True)
    (actor / "dp_actor.py").write_text(body)


PER_MICRO_BATCH = "for micro_batch in micro_batches:\n    loss = pg_loss / gradient_accumulation\n    loss.backward()\n"
PER_STEP = "for micro_batch in micro_batches:\n    loss = loss * torch.sum(response_mask) / total_response_tokens\n"


@pytest.mark.parametrize("actor, overrides, expected", [
    # EasyR1 0.3 (Coobiw/EasyR1-Brian): a token mean over each micro-batch; one response each: 1/L (row 21); the
    # config's low_var_kl loss over four updates (KL002, KL008) is the config's finding, which the launch repeats
    (PER_MICRO_BATCH, "worker.actor.micro_batch_size_per_device_for_update=1", [(7, "KL007")]),
    (PER_MICRO_BATCH, "worker.actor.micro_batch_size_per_device_for_update=2", []),  # the config's own verdict
    (PER_STEP, "worker.actor.micro_batch_size_per_device_for_update=1", []),  # scaled by the step's tokens
    (None, "worker.actor.micro_batch_size_per_device_for_update=1", []),  # no copy to read: no claim
])
def test_one_response_per_micro_batch_where_the_copy_averages_each_micro_batch(tmp_path, actor, overrides, expected):
    if actor is not None:
        _actor(tmp_path, actor)
    assert launch_codes(tmp_path, overrides) == expected
