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
    global_batch_size: 128
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


def test_a_verl_config_is_not_read_as_easyr1s():
    """verl's own `algorithm.kl_penalty` (its reward estimator) without EasyR1's `disable_kl` is verl's."""
    text = "algorithm:\n  adv_estimator: grpo\n  kl_penalty: low_var_kl\n  use_kl_in_reward: true\n"
    assert [(f.code, "verl" in f.message) for f in lint_config("ppo_trainer.yaml", text)] == [("KL004", True)]


def test_the_finding_names_the_settings_and_the_fix_keeps_the_strength():
    [finding] = lint_config("examples/config.yaml", CONFIG.format(loss="true", penalty="low_var_kl",
                                                                  disable="false", coef="1.0e-2", actor=""))
    assert "[EasyR1: use_kl_loss=true, disable_kl=false, kl_penalty=low_var_kl" in finding.message
    assert "algorithm.use_kl_loss: false" in finding.fix and "mean response length" in finding.fix
