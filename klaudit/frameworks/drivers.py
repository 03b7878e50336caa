"""Framework trainers that compute a KL reward and hand it to a worker the lint does not follow.

verl's `RayPPOTrainer` (and EasyR1's, its fork) computes the KL reward once per rollout, in
`apply_kl_penalty`, from the rollout's own log-probs, and hands the batch to the actor worker
(`update_actor`), which trains it in updates of `ppo_mini_batch_size` prompts (EasyR1:
`global_batch_size`), `ppo_epochs` times. With more than one optimizer step per rollout, every step after
the first trains the reward of an older policy, which the PPO ratio corrects token by token but not
over the prefix (kl-math.md section 8, row 23). The trainer's module alone looks on-policy; this says how
many steps the copy's own defaults take, so that its reward code is judged as the launches that leave
the batch sizes alone run it.

A copy's defaults are read from its `ppo_trainer.yaml` (verl) where it is there to read, else the
framework's; EasyR1's from its release's defaults (they live in dataclasses and the launch's YAML).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

from klaudit.frameworks import easyr1, verl
from klaudit.frameworks.settings import listed, steps_per_rollout, yaml_settings
from klaudit.frameworks.versions import read_text

_STORES_KL_REWARD = "def apply_kl_penalty"  # the driver's KL reward, stored into the batch's token rewards
_UPDATES_ACTOR = "update_actor("  # the batch handed to the actor worker's training loop
_VERL_CONFIG = "actor_rollout_ref"  # verl's config section of the actor; EasyR1's is `worker.actor`
_EASYR1_CONFIG = "worker.actor"


@dataclass(frozen=True)
class RewardReuse:
    """Optimizer steps one rollout's KL reward is trained over, and the settings that make them."""

    steps: float
    flags: str  # `verl defaults: ppo_epochs=1, train_batch_size=1024, ppo_mini_batch_size=256`


def reward_reuse(path: str, source: str) -> RewardReuse | None:
    """How many optimizer steps the KL reward a framework trainer module computes is trained over, where that
    is more than one; None for any other module."""
    if _STORES_KL_REWARD not in source or _UPDATES_ACTOR not in source:
        return None
    if _VERL_CONFIG in source:
        name, defaults, settings = verl.NAME, verl.STEP_DEFAULTS, _copy_settings(_copy_root(Path(path)))
    elif _EASYR1_CONFIG in source:
        name, defaults, settings = easyr1.NAME, easyr1.STEP_DEFAULTS, {}
    else:
        return None
    steps = steps_per_rollout(settings, defaults)
    if steps <= 1:
        return None
    counts = listed(settings, defaults).removeprefix(", ")
    return RewardReuse(steps, f"{name}'s update of this reward: {counts}, {steps:g} optimizer steps per rollout")


def _copy_root(module: Path) -> Path | None:
    """The folder holding the copy of verl a trainer module belongs to (where `verl/trainer/config/` is)."""
    for folder in module.resolve().parents:
        if (folder / verl.DEFAULTS_FILE).is_file():
            return folder
    return None


@functools.lru_cache(maxsize=64)  # asked for each trainer module of a copy
def _copy_settings(root: Path | None) -> dict:
    """The batch-size keys the copy's `ppo_trainer.yaml` sets (those its defaults list brings from other files
    keep the framework's defaults)."""
    text = read_text(root / verl.DEFAULTS_FILE) if root is not None else None
    found = yaml_settings(text) if text is not None else {}
    return {key: found[key] for key in verl.STEP_DEFAULTS if key in found}
