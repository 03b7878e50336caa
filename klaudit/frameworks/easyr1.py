"""EasyR1's KL settings (hiyouga/EasyR1, a verl fork with a config of its own) as catalog configurations.

Its YAML config's `algorithm` section decides the KL for both places: with `use_kl_loss` the actor
differentiates `compute_kl(log_probs, ref_log_probs, kl_penalty)` as a loss, averaged by
`worker.actor.loss_avg_mode` ("token": over the batch's tokens, "seq": per sequence, then over
sequences); without it, and unless `disable_kl`, the trainer subtracts the same estimator, detached, from
the token rewards (`apply_kl_penalty`). `kl_coef` scales either; 0 adds nothing. The estimators are
verl's: kl -> k1, mse -> k2, abs -> |log-ratio|, low_var_kl -> k3 clamped to [-10, 10].

As in verl, one rollout of `data.rollout_batch_size` prompts (default 512) is split into updates of
`worker.actor.global_batch_size` prompts (default 256), `worker.actor.ppo_epochs` times (default 1): more
than one optimizer step per rollout trains the KL loss of the later ones on samples of an older policy
(row 22), and the KL reward, computed once per rollout, meets only the PPO token ratio there (row 23).

Only a file that says it is EasyR1's is read: one that sets `algorithm.disable_kl`, a key verl does not have.
EasyR1's first releases (forks such as Seg-Zero keep them) had the loss switch in the actor's section
instead: `worker.actor.use_kl_loss` (default true) differentiates `worker.actor.kl_loss_type`
(low_var_kl) scaled by `worker.actor.kl_loss_coef`, averaged over the batch's tokens; without it the
trainer subtracts `algorithm.kl_penalty` (kl) from the rewards, scaled by `algorithm.kl_coef`. A file that
sets one of those `worker.actor` keys is read that way.

Copies whose actor divides each micro-batch's loss by the gradient accumulation steps, not by the step's token
count (`loss = pg_loss / gradient_accumulation`, EasyR1 0.3 and the forks that keep it), average over each
micro-batch's tokens: with `worker.actor.micro_batch_size_per_device_for_update=1` a micro-batch is one
response, divided by its own length (row 21); later releases scale by `total_response_tokens`.

A launch, `python3 -m verl.trainer.main config=examples/config.yaml algorithm.use_kl_loss=false ...`, is read as
its overrides over the config it names (klaudit.frameworks.lint_config).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Collection, Mapping
from pathlib import Path

from klaudit.catalog import Aggregation, Config, Returns, Sampling
from klaudit.frameworks import verl
from klaudit.frameworks.settings import (
    Judged,
    Setting,
    listed,
    more_responses_per_micro_batch,
    number,
    steps_per_rollout,
    truthy,
)
from klaudit.text import read_text

NAME = "EasyR1"
USE_KL_LOSS, DISABLE_KL, KL_PENALTY, KL_COEF, ADV_ESTIMATOR = (
    "algorithm.use_kl_loss", "algorithm.disable_kl", "algorithm.kl_penalty", "algorithm.kl_coef",
    "algorithm.adv_estimator")
LOSS_AVG_MODE = "worker.actor.loss_avg_mode"
KEYS = (USE_KL_LOSS, DISABLE_KL, KL_PENALTY, KL_COEF, ADV_ESTIMATOR, LOSS_AVG_MODE)
DEFAULTS = {USE_KL_LOSS: "false", DISABLE_KL: "false", KL_PENALTY: "kl", KL_COEF: "1e-3", ADV_ESTIMATOR: "grpo",
            LOSS_AVG_MODE: "token"}
# the first releases' actor keys
EARLY_USE_KL_LOSS, EARLY_KL_LOSS_TYPE, EARLY_KL_LOSS_COEF = (
    "worker.actor.use_kl_loss", "worker.actor.kl_loss_type", "worker.actor.kl_loss_coef")
EARLY_ACTOR_KEYS = (EARLY_USE_KL_LOSS, EARLY_KL_LOSS_TYPE, EARLY_KL_LOSS_COEF)  # a file setting one is in that layout
EARLY_DEFAULTS = {EARLY_USE_KL_LOSS: "true", EARLY_KL_LOSS_TYPE: "low_var_kl", EARLY_KL_LOSS_COEF: "1e-3",
                  KL_PENALTY: "kl", KL_COEF: "1e-3", ADV_ESTIMATOR: "grpo"}
AGGREGATIONS = {"token": Aggregation.BATCH_MEAN, "seq": Aggregation.SEQ_MEAN}
# how many optimizer steps one rollout feeds: epochs x rollout batch / update batch, in prompts
ROLLOUT_BATCH, UPDATE_BATCH, EPOCHS = ("data.rollout_batch_size", "worker.actor.global_batch_size",
                                       "worker.actor.ppo_epochs")
STEP_DEFAULTS = {EPOCHS: "1", ROLLOUT_BATCH: "512", UPDATE_BATCH: "256"}
MICRO_BATCH = "worker.actor.micro_batch_size_per_device_for_update"
KEYS_READ = (*KEYS, *EARLY_ACTOR_KEYS, *STEP_DEFAULTS, MICRO_BATCH)  # every key a verdict reads, in either layout
ACTOR = "verl/workers/actor/dp_actor.py"
# the launch scripts EasyR1's own repository has kept in examples/ (its history to 2026-12), and the config they
# name (`config=examples/config.yaml`): a copy's examples/ launch of another name is the fork's own run
UPSTREAM_LAUNCHES = frozenset({
    "config.yaml",
    "qwen2_5_7b_math.sh", "qwen2_5_7b_math_grpo.sh", "qwen2_5_vl_32b_geo3k_grpo.sh", "qwen2_5_vl_3b_android_gui_grpo.sh",
    "qwen2_5_vl_3b_clevr.sh", "qwen2_5_vl_3b_geo3k.sh", "qwen2_5_vl_3b_geo3k_grpo.sh", "qwen2_5_vl_3b_geoqa8k.sh",
    "qwen2_5_vl_7b_geo3k_cispo.sh", "qwen2_5_vl_7b_geo3k_dapo.sh", "qwen2_5_vl_7b_geo3k_grpo.sh",
    "qwen2_5_vl_7b_geo3k_gspo.sh", "qwen2_5_vl_7b_geo3k_reinforce.sh", "qwen2_5_vl_7b_geo3k_sapo.sh",
    "qwen2_5_vl_7b_geo3k_swanlab.sh", "qwen2_5_vl_7b_multi_image.sh", "qwen3_14b_dapo17k_dapo.sh",
    "qwen3_4b_math_grpo.sh", "qwen3_4b_math_grpo_lora.sh", "qwen3_vl_30b_geo3k_grpo.sh", "qwen3_vl_4b_geo3k_grpo.sh",
    "qwen3_vl_4b_geo3k_grpo_lora.sh", "run_qwen2_5_7b_math.sh", "run_qwen2_5_7b_math_swanlab.sh",
    "run_qwen2_5_7b_remax_math.sh", "run_qwen2_5_7b_remax_math_swanlab.sh", "run_qwen2_5_vl_2b_clevr.sh",
    "run_qwen2_5_vl_3b_clevr.sh", "run_qwen2_5_vl_3b_geo.sh", "run_qwen2_5_vl_3b_geoqa8k.sh",
    "run_qwen2_5_vl_3b_remax_geo.sh", "run_qwen2_5_vl_7b_geo.sh", "run_qwen2_5_vl_7b_geo_swanlab.sh",
    "run_qwen2_5_vl_7b_remax_geo.sh", "run_qwen2_5_vl_7b_remax_geo_swanlab.sh"})
_PER_MICRO_BATCH = re.compile(r"^[ \t]*loss = \w+ / gradient_accumulation\b", re.MULTILINE)
MICRO_BATCH_FIX = (f"{more_responses_per_micro_batch(MICRO_BATCH)}, or an EasyR1 whose actor scales each micro-batch "
                   "by the step's token count")

_TO_REWARD = (f"{USE_KL_LOSS}: false with {KL_PENALTY}: kl (k1 in the reward, unbiased); the reward sums the KL "
              f"over the tokens where the token-mean loss averaged it: divide {KL_COEF} by about the mean response length")
FIXES = {"KL001": _TO_REWARD, "KL002": _TO_REWARD, "KL003": _TO_REWARD, "KL009": _TO_REWARD, "KL010": _TO_REWARD,
         "KL004": f"{KL_PENALTY}: kl (k1 values in the reward, unbiased)",
         "KL007": f"{LOSS_AVG_MODE}: token (the same scale for a KL about as long as the responses)",
         "KL008": f"one optimizer step per rollout: {UPDATE_BATCH} equal to {ROLLOUT_BATCH}, with {EPOCHS}: 1"}
_EARLY_TO_REWARD = (f"{EARLY_USE_KL_LOSS}: false with {KL_PENALTY}: kl (k1 in the reward, unbiased); the reward sums "
                    f"the KL over the tokens where the token-mean loss averaged it: set {KL_COEF} to about "
                    f"{EARLY_KL_LOSS_COEF} / (mean response length)")
EARLY_FIXES = {**{rule: _EARLY_TO_REWARD for rule in ("KL001", "KL002", "KL003", "KL009", "KL010")},
               "KL004": FIXES["KL004"], "KL008": FIXES["KL008"]}


def fixes(settings: Mapping[str, Setting]) -> Mapping[str, str]:
    """The fix texts for a config, in the key layout it uses."""
    return FIXES if DISABLE_KL in settings else EARLY_FIXES


# The keys that decide a rule's verdict at a launch over a config (the KL's estimator, placement and coefficient
# decide every rule); a launch that sets none of a rule's keys repeats the config's verdict, reported there.
_KL_KEYS = frozenset({USE_KL_LOSS, DISABLE_KL, KL_PENALTY, KL_COEF, *EARLY_ACTOR_KEYS})
_DECIDING = {"KL007": _KL_KEYS | {LOSS_AVG_MODE, MICRO_BATCH}, "KL008": _KL_KEYS | set(STEP_DEFAULTS)}


def decided_at_launch(rule: str, own: Collection[str], reward: bool) -> bool:
    """Whether a launch setting the keys `own` decides `rule` (for a KL in the reward the advantage estimator,
    which makes its returns, decides too)."""
    keys = _DECIDING.get(rule, _KL_KEYS)
    return any(key in keys or reward and key == ADV_ESTIMATOR for key in own)


@functools.lru_cache(maxsize=64)  # asked for each config of a project
def averages_per_micro_batch(copy: Path | None) -> bool:
    """Whether the actor of the project's copy of EasyR1 averages each micro-batch's loss over its own tokens
    (`loss = pg_loss / gradient_accumulation`); False where the copy is not there to read."""
    text = read_text(copy / ACTOR) if copy is not None else None
    return text is not None and _PER_MICRO_BATCH.search(text) is not None


def _one_response(settings: Mapping[str, Setting], per_micro_batch: bool, aggregation: Aggregation) -> bool:
    """A token mean over micro-batches of one response each: the copy averages per micro-batch and the config
    sets one response per micro-batch."""
    return per_micro_batch and aggregation is Aggregation.BATCH_MEAN and number(_value(settings, MICRO_BATCH)) == 1


def judge(settings: Mapping[str, Setting], per_micro_batch: bool = False) -> Judged | None:
    """The KL configuration of an EasyR1 config, None when it is not EasyR1's, the KL is off, or a deciding
    value is not a literal EasyR1 knows. `per_micro_batch`: whether the copy run averages each micro-batch's
    loss over its own tokens (`averages_per_micro_batch`)."""
    if DISABLE_KL not in settings:
        return (_judge_early(settings, per_micro_batch) if any(key in settings for key in EARLY_ACTOR_KEYS)
                else None)
    value = _values(settings, DEFAULTS)
    if value is None:
        return None
    use_loss, disabled = truthy(str(value[USE_KL_LOSS])), truthy(str(value[DISABLE_KL]))
    estimator = verl.ESTIMATORS.get(str(value[KL_PENALTY]))
    aggregation = AGGREGATIONS.get(str(value[LOSS_AVG_MODE]))
    if use_loss is None or disabled is None or estimator is None or aggregation is None:
        return None
    if disabled or number(str(value[KL_COEF])) == 0.0:
        return None
    one_response = _one_response(settings, per_micro_batch, aggregation)
    config = _config(value, estimator, use_loss, Aggregation.SEQ_MEAN if one_response else aggregation, settings)
    anchor = next(settings[key] for key in (KL_PENALTY, USE_KL_LOSS, DISABLE_KL) if key in settings)
    flags = _shown(settings, value, [key for key in KEYS if key in settings or key in (KL_PENALTY, LOSS_AVG_MODE)])
    anchors = {rule: settings[key] for rule, key in (("KL007", LOSS_AVG_MODE), ("KL004", KL_PENALTY)) if key in settings}
    return _judged(config, anchor, _with_steps(flags, config, settings), {**anchors, **_stale_anchor(settings)},
                   settings, one_response)


def weighs_no_kl(settings: Mapping[str, Setting]) -> bool:
    """Whether a run of these settings trains no KL term: `disable_kl`, or the coefficient of the place its KL goes (the
    loss or the reward) a literal 0 (shuffle-r1's launches, `algorithm.kl_coef=0.0` over a config with a KL loss)."""
    early = DISABLE_KL not in settings and any(key in settings for key in EARLY_ACTOR_KEYS)
    value = _values(settings, EARLY_DEFAULTS if early else DEFAULTS)
    if value is None:
        return False
    if early:
        use_loss = truthy(str(value[EARLY_USE_KL_LOSS]))
        return use_loss is not None and number(str(value[EARLY_KL_LOSS_COEF] if use_loss else value[KL_COEF])) == 0.0
    return truthy(str(value[DISABLE_KL])) is True or number(str(value[KL_COEF])) == 0.0


def _judged(config: Config, anchor: Setting, flags: str, anchors: dict, settings: Mapping[str, Setting],
            one_response: bool) -> Judged:
    """The verdict, where one response per micro-batch makes the mean per sequence: said, placed and helped."""
    if not one_response:
        return Judged(config, anchor, flags, anchors)
    flags += f", {MICRO_BATCH.rsplit('.', 1)[-1]}=1 (this copy's actor averages over each micro-batch's tokens)"
    return Judged(config, anchor, flags, {**anchors, "KL007": settings[MICRO_BATCH]}, {"KL007": MICRO_BATCH_FIX})


def _judge_early(settings: Mapping[str, Setting], per_micro_batch: bool = False) -> Judged | None:
    """A config of EasyR1's first releases: the KL loss switched in `worker.actor`, else the reward's KL."""
    value = _values(settings, EARLY_DEFAULTS)
    if value is None:
        return None
    use_loss = truthy(str(value[EARLY_USE_KL_LOSS]))
    if use_loss is None:
        return None
    estimator = verl.ESTIMATORS.get(str(value[EARLY_KL_LOSS_TYPE] if use_loss else value[KL_PENALTY]))
    if estimator is None or number(str(value[EARLY_KL_LOSS_COEF] if use_loss else value[KL_COEF])) == 0.0:
        return None
    one_response = _one_response(settings, per_micro_batch, Aggregation.BATCH_MEAN)
    config = _config(value, estimator, use_loss, Aggregation.SEQ_MEAN if one_response else Aggregation.BATCH_MEAN,
                     settings)
    deciding = (EARLY_KL_LOSS_TYPE, EARLY_USE_KL_LOSS) if use_loss else (KL_PENALTY, EARLY_USE_KL_LOSS)
    anchor = next((settings[key] for key in deciding if key in settings),
                  next(settings[key] for key in EARLY_ACTOR_KEYS if key in settings))
    flags = _shown(settings, value, (EARLY_USE_KL_LOSS, EARLY_KL_LOSS_TYPE if use_loss else KL_PENALTY))
    anchors = {"KL004": settings[KL_PENALTY]} if KL_PENALTY in settings and not use_loss else {}
    return _judged(config, anchor, _with_steps(flags, config, settings), {**anchors, **_stale_anchor(settings)},
                   settings, one_response)


def _values(settings: Mapping[str, Setting], defaults: Mapping[str, str]) -> dict[str, str] | None:
    """Each key's value, set or default; None when one is set to a value computed at run time."""
    value = {key: settings[key].value if key in settings else default for key, default in defaults.items()}
    known = {key: v for key, v in value.items() if v is not None}
    return known if len(known) == len(value) else None


def _config(value: Mapping[str, str], estimator, use_loss: bool, aggregation: Aggregation,
            settings: Mapping[str, Setting]) -> Config:
    """The estimator in the loss (aggregated so) or in the rewards, whose returns the advantage decides;
    over several steps per rollout off-policy, the reward reweighed by the PPO token ratio only (row 23)."""
    returns = Returns.TO_GO if value[ADV_ESTIMATOR] in verl.TOKEN_RETURNS else Returns.SEQUENCE
    older = Sampling.OFF_POLICY if use_loss else Sampling.TOKEN_IS
    stale = steps_per_rollout(settings, STEP_DEFAULTS) > 1
    return Config(loss=estimator if use_loss else None, reward=None if use_loss else estimator, returns=returns,
                  aggregation=aggregation, sampling=older if stale else Sampling.ON_POLICY)


def _with_steps(flags: str, config: Config, settings: Mapping[str, Setting]) -> str:
    """The flags a finding names, with the batch sizes when they make the KL off-policy."""
    return flags + listed(settings, STEP_DEFAULTS) if config.sampling is not Sampling.ON_POLICY else flags


def _stale_anchor(settings: Mapping[str, Setting]) -> dict[str, Setting]:
    """Where KL008 goes: the epochs when more than one, else the update batch size, else the rollout's,
    where the file sets one."""
    order = (EPOCHS, UPDATE_BATCH, ROLLOUT_BATCH) if (number(_value(settings, EPOCHS)) or 1) > 1 else (
        UPDATE_BATCH, ROLLOUT_BATCH)
    found = next((settings[key] for key in order if key in settings), None)
    return {"KL008": found} if found is not None else {}


def _value(settings: Mapping[str, Setting], key: str) -> str:
    return (settings[key].value if key in settings else None) or ""


def _shown(settings: Mapping[str, Setting], value: Mapping[str, str], keys) -> str:
    """`use_kl_loss=true, kl_penalty=kl (default)`: the deciding settings as a finding names them."""
    return ", ".join(f"{key.rsplit('.', 1)[-1]}={value[key]}" + ("" if key in settings else " (default)")
                     for key in keys)
