"""Framework code that computes a KL reward and hands it to an actor the lint does not follow.

verl's `RayPPOTrainer` (and EasyR1's, its fork) computes the KL reward once per rollout, in
`apply_kl_penalty`, from the rollout's own log-probs, and hands the batch to the actor worker
(`update_actor`), which trains it in updates of `ppo_mini_batch_size` prompts (EasyR1:
`global_batch_size`), `ppo_epochs` times, reducing the policy loss that carries it by `loss_agg_mode`.
ROLL's reward functions (`apply_kl_penalty`, `compute_token_reward` in `roll/utils/functionals.py`) feed
actor workers whose policy loss is reduced by `loss_agg_mode`, each sequence's token mean by default.
OpenRLHF's experience maker subtracts the KL from the token rewards (`compute_reward`) once per rollout,
and its trainer takes `max_epochs` x rollout batch x samples per prompt / `train_batch_size` optimizer
steps on them (1 x 1024 x 1 / 128 by default); up to 0.6 its policy loss is each response's token mean, then
the mean (later releases average over a micro-batch's or a step's tokens, which the launch decides).
slime computes its advantages and returns (`compute_advantages_and_returns`, with the KL in the token
rewards of ppo and reinforce_plus_plus, and the on-policy distillation term) in the module that defines the
policy loss, which reduces them by `sum_of_sample_mean`: each sample's token mean unless
`--calculate-per-token-loss` (off by default); the advantages travel between the two in the rollout's dict.

SkyRL's trainer (`skyrl/train/trainer.py`) subtracts the KL from the rewards in `apply_reward_kl_penalty`, once
per rollout, and its policy worker trains them in `update_epochs_per_batch` x `train_batch_size` /
`policy_mini_batch_size` optimizer steps (1 x 1024 / 256 by default, read from the copy's config dataclasses).

The module alone looks on-policy and says nothing of the reduction. This says what the copy's own defaults
make of its reward: with more than one optimizer step per rollout, every step after the first trains the
reward of an older policy, which the PPO ratio corrects token by token but not over the prefix
(kl-math.md section 8, row 23); a per-sequence token mean weighs each sequence's reward by 1/L (row 21).
So its reward code is judged as the launches that leave those settings alone run it.

A verl copy's defaults are read from its `ppo_trainer.yaml` where it is there to read, a ROLL copy's from its
config classes, else the framework's; EasyR1's are its release's (they live in dataclasses and the launch's
YAML). ROLL's steps per rollout depend on the GPUs a launch maps, and slime's on batch sizes it has no
default for: they are left undecided here.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path

from klaudit.catalog import Aggregation
from klaudit.frameworks import easyr1, openrlhf, roll, slime, verl
from klaudit.frameworks.settings import Setting, listed, number, steps_per_rollout, truthy, yaml_settings
from klaudit.frameworks.versions import UNSTATED, at_least, vendored
from klaudit.text import read_text

_STORES_KL_REWARD = "def apply_kl_penalty"  # verl's driver: the KL reward, stored into the batch's token rewards
_UPDATES_ACTOR = "update_actor("  # the batch handed to the actor worker's training loop
_VERL_CONFIG = "actor_rollout_ref"  # verl's config section of the actor
_EASYR1_CONFIG = "config.worker."  # EasyR1's (`config.worker.actor`, `config.worker.rollout`)
_ROLL_REWARDS = ("def apply_kl_penalty", "def compute_token_reward")
# slime's advantages, KL reward included, and the policy loss that reduces them, in one module (miles's
# `miles/backends/training_utils/loss.py`)
_SLIME_LOSS = re.compile(rf"(?:^|/)({'|'.join(slime.FORKS)})/backends/\w+_utils/loss\.py$")
_SLIME_REWARD, _SLIME_REDUCER = "def compute_advantages_and_returns", "sum_of_sample_mean"
# OpenRLHF's experience maker, or a fork's copy of it in another folder of its package
# (`openrlhf/reasoning_utils/ppo_utils/experience_maker.py`), run by the same trainer loop
_OPENRLHF_MAKER = re.compile(r"(?:^|/)(openrlhf/(?:(?!openrlhf/)\w+/)*ppo_utils/experience_maker\.py)$")
_OPENRLHF_REWARD = "compute_reward("
# a package of OpenRLHF's layout under another name (nanorl's `nanorl/trainer/ppo_utils/experience_maker.py`),
# judged as OpenRLHF where its own command line `<package>/cli/train_ppo*.py` is one
_RENAMED_MAKER = "/ppo_utils/experience_maker.py"
# the policy loss of a copy that takes each response's token mean (OpenRLHF's before 0.7)
_PER_RESPONSE_MEAN = re.compile(r"^\s*loss\s*=\s*masked_mean\(\s*loss\s*,\s*\w+\s*,\s*dim\s*=\s*-1\s*\)\.mean\(\)",
                                re.MULTILINE)
_SKYRL_TRAINER, _SKYRL_REWARD = "skyrl/train/trainer.py", "def apply_reward_kl_penalty"
_SKYRL_CONFIG = "skyrl/train/config/config.py"  # beside the trainer: the dataclasses that hold SkyRL's defaults
# SkyRL's steps per rollout (its `trainer` section): epochs x train batch / mini-batch, in prompts
_SKYRL_STEPS = {"trainer.update_epochs_per_batch": "1", "trainer.train_batch_size": "1024",
                "trainer.policy_mini_batch_size": "256"}
# OpenRLHF's steps per rollout: epochs x (rollout batch x samples per prompt) / train batch, at the defaults of the
# copy's own command line (`openrlhf/cli/train_ppo_ray.py`, ...) where it carries one
_OPENRLHF_STEP_KEYS = (openrlhf.EPOCHS, openrlhf.ROLLOUT_BATCH, openrlhf.SAMPLES, openrlhf.TRAIN_BATCH)
_OPENRLHF_CLIS = ("openrlhf/cli/train_ppo_ray.py", "openrlhf/cli/train_ppo.py", "examples/train_ppo_ray.py",
                  "examples/train_ppo.py", "train_ppo_ray.py", "train_ppo.py")  # the layouts before openrlhf/cli


SEVERAL_STEPS = 2.0  # more than one optimizer step per rollout, how many not known (a loop of several rounds)


@dataclass(frozen=True)
class RewardTraining:
    """How a framework's actor trains the KL reward a module computes, at the copy's defaults."""

    steps: float  # optimizer steps per rollout; 1 where that is one or not known, SEVERAL_STEPS: more than one
    aggregation: Aggregation | None  # how the policy loss carrying the reward is reduced; None: not known
    flags: str  # the settings that decide both, as the findings name them


def reward_training(path: str, source: str) -> RewardTraining | None:
    """How the actor of the framework a module belongs to trains the KL reward the module computes; None for a
    module of no framework trainer the lint knows."""
    posix = path.replace("\\", "/")
    if posix.endswith(roll.FUNCTIONALS) and any(name in source for name in _ROLL_REWARDS):
        return _roll(Path(path))
    maker = _OPENRLHF_MAKER.search(posix)
    if maker is not None and _OPENRLHF_REWARD in source:
        return _openrlhf(path, maker.group(1))
    if posix.endswith(_RENAMED_MAKER) and _OPENRLHF_REWARD in source:
        return _renamed_openrlhf(Path(path))
    slime_loss = _SLIME_LOSS.search(posix)
    if slime_loss is not None and _SLIME_REWARD in source and _SLIME_REDUCER in source:
        return _slime(slime_loss.group(1))
    if posix.endswith(_SKYRL_TRAINER) and _SKYRL_REWARD in source:
        return _skyrl(Path(path))
    if _STORES_KL_REWARD not in source or _UPDATES_ACTOR not in source:
        return None
    if _EASYR1_CONFIG not in source and _VERL_CONFIG in source:  # EasyR1 names its worker group actor_rollout_ref too
        return _verl(_verl_copy(Path(path)))
    if _EASYR1_CONFIG in source:
        aggregation = easyr1.AGGREGATIONS[easyr1.DEFAULTS[easyr1.LOSS_AVG_MODE]]
        return _trained(easyr1.NAME, {}, easyr1.STEP_DEFAULTS, aggregation, easyr1.STEP_DEFAULTS)
    return None


def _trained(name: str, settings: dict[str, Setting], steps_defaults: dict[str, str], aggregation: Aggregation | None,
             named: dict[str, str]) -> RewardTraining:
    """The steps per rollout that `settings` over `steps_defaults` give, with the keys of `named` (their defaults)
    as the findings name them."""
    steps = steps_per_rollout(settings, steps_defaults)
    return RewardTraining(steps, aggregation, _shown(name, listed(settings, named).removeprefix(", "), steps))


def _shown(name: str, counts: str, steps: float) -> str:
    return f"{name}'s actor at its defaults: {counts}, {steps:g} optimizer step{'s' if steps != 1 else ''} per rollout"


def _verl(root: Path | None) -> RewardTraining:
    settings = _verl_settings(root)
    named = {verl.LOSS_AGG_MODE: verl.DEFAULTS[verl.LOSS_AGG_MODE], **verl.STEP_DEFAULTS}
    mode = settings[verl.LOSS_AGG_MODE].value if verl.LOSS_AGG_MODE in settings else named[verl.LOSS_AGG_MODE]
    return _trained(verl.NAME, settings, verl.STEP_DEFAULTS, verl.AGGREGATIONS.get(mode or ""), named)


def _verl_copy(module: Path) -> Path | None:
    """The folder holding the copy of verl a trainer module belongs to (where `verl/trainer/config/` is)."""
    for folder in module.resolve().parents:
        if (folder / verl.DEFAULTS_FILE).is_file():
            return folder
    return None


@functools.lru_cache(maxsize=64)  # asked for each trainer module of a copy
def _verl_settings(root: Path | None) -> dict[str, Setting]:
    """The batch-size and aggregation keys the copy's `ppo_trainer.yaml` sets (those its defaults list brings from
    other files keep the framework's defaults)."""
    text = read_text(root / verl.DEFAULTS_FILE) if root is not None else None
    found = yaml_settings(text) if text is not None else {}
    return {key: found[key] for key in (*verl.STEP_DEFAULTS, verl.LOSS_AGG_MODE) if key in found}


def _roll(module: Path) -> RewardTraining:
    copy = roll.read_copy(module.resolve().parents[len(Path(roll.FUNCTIONALS).parts) - 1], "rlvr")
    mode = copy.defaults[roll.AGGREGATION]
    return RewardTraining(1.0, roll.aggregation_of(mode, copy),
                          f"{roll.NAME}'s actor at this copy's defaults: {roll.AGGREGATION}={mode}")


def _openrlhf(path: str, module: str) -> RewardTraining:
    """OpenRLHF's trainer at the defaults of the copy's command line (OpenRLHF's own where it has none); a copy
    that states a release before 0.7 takes each response's token mean (row 21), a later or unstated one a
    reduction its launch decides (not decided here)."""
    copy = vendored(path, openrlhf.NAME, module)
    early = copy is not None and copy is not UNSTATED and not at_least(copy, "0.7")
    defaults = _openrlhf_defaults(Path(path).resolve().parents[len(Path(module).parts) - 1])
    return _openrlhf_trained("OpenRLHF", defaults, copy.label(openrlhf.NAME) if early and copy is not None else "")


def _openrlhf_trained(name: str, defaults: dict[str, str], per_response: str) -> RewardTraining:
    """OpenRLHF's trainer (or a copy's, `name`) at the step counts `defaults` give: epochs x rollout batch x samples
    per prompt / train batch optimizer steps per rollout, and each response's token mean where `per_response` says
    what makes it one (row 21)."""
    epochs, rollout, samples, train = (float(defaults[key]) for key in _OPENRLHF_STEP_KEYS)
    steps = epochs * rollout * samples / train
    counts = (f"max_epochs={defaults[openrlhf.EPOCHS]} x rollout_batch_size={defaults[openrlhf.ROLLOUT_BATCH]} x "
              f"n_samples_per_prompt={defaults[openrlhf.SAMPLES]} / train_batch_size={defaults[openrlhf.TRAIN_BATCH]}")
    counts += f", the policy loss each response's token mean ({per_response})" if per_response else ""
    return RewardTraining(steps, Aggregation.SEQ_MEAN if per_response else None, _shown(name, counts, steps))


def _renamed_openrlhf(maker: Path) -> RewardTraining | None:
    """A package of OpenRLHF's layout under another name, the nearest folder above `maker` (its
    `ppo_utils/experience_maker.py`) with a command line of OpenRLHF's (`<package>/cli/train_ppo.py`): its trainer at
    that command line's defaults, and each response's token mean where its PolicyLoss takes one
    (`<package>/models/loss.py`); None where no folder up to three above has one (a module of that name elsewhere)."""
    found = ((folder, defaults) for folder in maker.resolve().parents[1:5]
             if (defaults := _openrlhf_defaults(folder.parent, folder.name, fallback=False)))
    package, defaults = next(found, (None, {}))
    if package is None:
        return None
    per_response = _PER_RESPONSE_MEAN.search(read_text(package / "models" / "loss.py") or "") is not None
    return _openrlhf_trained(f"{package.name} (OpenRLHF's layout)", defaults,
                             f"{package.name}/models/loss.py" if per_response else "")


def _openrlhf_defaults(root: Path, package: str = "openrlhf", fallback: bool = True) -> dict[str, str]:
    """The step counts' defaults of the command line of the OpenRLHF copy at `root` (its package named `package`),
    OpenRLHF's own where it gives none or none that is a positive number, if `fallback`; else none."""
    for cli in _OPENRLHF_CLIS:
        parser = openrlhf.copy_parser(root / cli.replace("openrlhf/", f"{package}/", 1))
        if parser is not None:
            given = parser.defaults_of()
            if all((number(given.get(key) or "") or 0) > 0 for key in _OPENRLHF_STEP_KEYS):
                return {key: given[key] for key in _OPENRLHF_STEP_KEYS}
    return {key: openrlhf.DEFAULTS[key] for key in _OPENRLHF_STEP_KEYS} if fallback else {}


def _slime(name: str) -> RewardTraining:
    """slime's (or its fork `name`'s) policy loss at its defaults: `sum_of_sample_mean` is each sample's token mean
    (row 21) unless `--calculate-per-token-loss`, the batch's tokens."""
    per_token = truthy(slime.DEFAULTS[slime.PER_TOKEN])
    aggregation = Aggregation.BATCH_MEAN if per_token else Aggregation.SEQ_MEAN
    reduction = "the batch's token mean" if per_token else "each sample's token mean (sum_of_sample_mean)"
    return RewardTraining(1.0, aggregation, f"{name}'s actor at its defaults: "
                                            f"{slime.PER_TOKEN}={slime.DEFAULTS[slime.PER_TOKEN]}, {reduction}")


def _skyrl(trainer: Path) -> RewardTraining:
    """SkyRL's policy training at the defaults of the copy's config dataclasses (`update_epochs_per_batch: int = 1`),
    else SkyRL's own; the reduction of its policy loss is the launch's (not decided here)."""
    copy = trainer.resolve().parents[len(Path(_SKYRL_TRAINER).parts) - 1]
    text = read_text(copy / _SKYRL_CONFIG) or ""
    settings = {}
    for key in _SKYRL_STEPS:
        found = re.search(rf"^\s+{key.rsplit('.', 1)[-1]}:\s*int\s*=\s*(\d+)\s*$", text, re.MULTILINE)
        if found is not None:
            settings[key] = Setting(found.group(1), 0, 0, 0)
    return _trained("SkyRL", settings, _SKYRL_STEPS, None, _SKYRL_STEPS)
