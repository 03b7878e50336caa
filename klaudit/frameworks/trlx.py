"""trlx's PPO (CarperAI): how many optimizer steps one collection of rollouts feeds, and over how many responses
each step's loss averages.

trlx's AcceleratePPOTrainer subtracts `kl_ctl.value * (logprobs - ref_logprobs)` from each token's reward, k1
before GAE (row 6: right on fresh samples), with `method.init_kl_coef` its coefficient (0 adds none). Its `learn`
loop walks the store of `method.num_rollouts` rollouts `method.ppo_epochs` times in batches of `train.batch_size`,
one optimizer step a batch (the last one short), before `post_epoch_callback` collects new ones: ppo_epochs x
ceil(num_rollouts / batch_size) steps per collection, all but the first on samples of an older policy, which only
PPO's token ratio corrects (row 23, KL008). Each backward pass averages the loss over the tokens of a micro-batch of `train.minibatch_size`
responses (the batch where unset): a micro-batch of one response divides it by that response's length (row 21,
KL007).

Read from the module's calls of the classes trlx names `PPOConfig` (its method) and `TrainConfig`, which must be
imported from trlx; the TrainConfig is paired with the PPOConfig only where the module builds one of each. The
fields have no defaults in trlx: one the lint cannot read decides nothing (a step count then counts the epochs
alone, a lower bound). A copy of trlx carried inside a project keeps trlx's examples, tests and the package's
default configurations (`default_ppo_config()`), which are no runs of the project: its own scripts build the
configurations it trains with (Improbable-AI/curiosity_redteam's custom_trlx/). trlx's own repository keeps them as
a library's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from klaudit.catalog import Aggregation, Config, Estimator, Returns, Sampling
from klaudit.frameworks.settings import Judged, Setting, more_responses_per_micro_batch, number, shown

NAME = "trlx PPO"
TRAINER = "trlx/trainer/accelerate_ppo_trainer.py"  # what a copy of trlx carried in a project holds
UPSTREAM_FOLDERS = ("examples", "tests", "trlx")  # a copy's launches and default configurations, not the project's
METHOD, TRAIN = "PPOConfig", "TrainConfig"
METHOD_KEYS = ("ppo_epochs", "num_rollouts", "init_kl_coef")
TRAIN_KEYS = ("batch_size", "minibatch_size")
FIXES = {"KL008": "one optimizer step per collection of rollouts (method.ppo_epochs=1 with train.batch_size = "
                  "method.num_rollouts), or the KL out of the reward, into the loss with per-decision importance "
                  "weights: klaudit.estimators.kl_penalty(log_probs, ref_log_probs, mask, old_logprobs=...).loss (R-F)",
         "KL007": more_responses_per_micro_batch("train.minibatch_size")}


def judge(method: Mapping[str, Setting], train: Mapping[str, Setting], where: Setting) -> Judged | None:
    """The KL configuration of a trlx PPO run whose PPOConfig (at `where`) sets `method` and whose TrainConfig sets
    `train` ({} where unknown); None where its KL is off or right (one step per collection, several responses per
    backward pass)."""
    coefficient = method.get("init_kl_coef")
    if coefficient is not None and number(coefficient.value or "") == 0:
        return None
    epochs, rollouts, batch = (_read(settings, key) for settings, key in (
        (method, "ppo_epochs"), (method, "num_rollouts"), (train, "batch_size")))
    steps = (epochs or 1.0) * (math.ceil(rollouts / batch) if rollouts and batch else 1.0)
    micro_key = "minibatch_size" if "minibatch_size" in train else "batch_size"
    per_response = micro_key in train and _read(train, micro_key) == 1
    if steps <= 1 and not per_response:
        return None
    config = Config(reward=Estimator.K1, returns=Returns.TO_GO,
                    sampling=Sampling.TOKEN_IS if steps > 1 else Sampling.ON_POLICY,
                    aggregation=Aggregation.SEQ_MEAN if per_response else Aggregation.SUM)
    named = [(key, settings[key]) for settings, keys in ((method, METHOD_KEYS), (train, TRAIN_KEYS))
             for key in keys if key in settings and settings[key].value is not None]
    flags = ", ".join(shown(key, setting.value or "", setting) for key, setting in named)
    if steps > 1:
        bound = epochs is None or not (rollouts and batch)  # a count left unread: each epoch takes a step at least
        flags += f", {'at least ' if bound else ''}{steps:g} optimizer steps per collection"
    if per_response:
        flags += f", {micro_key}=1 (the loss's token mean over one response)"
    anchors = {"KL008": method.get("ppo_epochs") or where}
    if per_response:
        anchors["KL007"] = train[micro_key]
    return Judged(config, where, flags, anchors)


def _read(settings: Mapping[str, Setting], key: str) -> float | None:
    setting = settings.get(key)
    return number(setting.value or "") if setting is not None else None


def fix(rule: str, row_fix: str = "") -> str:
    return FIXES.get(rule, row_fix)
