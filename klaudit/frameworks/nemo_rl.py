"""NeMo-RL's GRPO KL settings (NVIDIA-NeMo/RL) as catalog configurations.

A NeMo-RL run is configured by a YAML file (`examples/configs/grpo_math_1B.yaml`) that may inherit another
one (`defaults: grpo_math_1B.yaml`), and by dotted overrides on the command line of its `run_grpo*.py`
script. With `loss_fn.reference_policy_kl_penalty` beta != 0, `ClippedPGLossFn` adds beta times
`calculate_kl(logprobs, ref_logprobs, loss_fn.reference_policy_kl_type)` to the loss, per token, averaged over
the batch's tokens (`loss_fn.token_level_loss: true`) or over each response's tokens first (false: row 21).
What that KL term is changed between releases, and the code a project carries decides over the release:

- up to 0.3 an unclamped k3 differentiated as a loss (row 3); 0.4 clamps its log-ratio to [-20, 20];
- 0.5 reads `reference_policy_kl_type` (k1, k2, k3) and clamps the log-ratio to `kl_input_clamp_value` and
  the estimate to `kl_output_clamp_value` (20 and 10, verl's low_var_kl clamps for k3; null: no clamp);
- 0.6 adds `loss_fn.use_kl_in_reward`: with `grpo.adv_estimator.name: reinforce_plus_plus` the detached
  estimate is subtracted from each token's own advantage instead (no reward-to-go), and the loss has none;
- from 0.7 the loss term is multiplied by exp(logp - sg(logp)), whose value is 1: the gradient of the
  score-weighted estimate, E[k grad log pi + grad k] per token. For k3 that is the per-token reverse KL's
  gradient without the later tokens' share, as is a k1 reward on its own token for k1 (both row 2); for k2
  a k2 loss beside a k2 reward on its own token (KL009).

One rollout is `grpo.num_prompts_per_step` x `grpo.num_generations_per_prompt` responses, trained in updates
of `policy.train_global_batch_size` responses: more than one optimizer step per rollout, or
`grpo.async_grpo.enabled`, trains the KL on samples of an older policy. Only the sampled token is
reweighted, by sg(pi / pi_gen) up to 0.6 and by pi / pi_gen from 0.7, where
`loss_fn.use_on_policy_kl_approximation` is set (rows 22-23).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from klaudit.catalog import Aggregation, Config, Estimator, Returns, Sampling
from klaudit.frameworks.settings import Judged, Setting, number, shown, truthy
from klaudit.frameworks.versions import Assumed

NAME = "nemo_rl"
LABEL = "NeMo-RL"
PENALTY, KL_TYPE = "loss_fn.reference_policy_kl_penalty", "loss_fn.reference_policy_kl_type"
INPUT_CLAMP, OUTPUT_CLAMP = "loss_fn.kl_input_clamp_value", "loss_fn.kl_output_clamp_value"
APPROXIMATION = "loss_fn.use_on_policy_kl_approximation"
TOKEN_LEVEL, IN_REWARD = "loss_fn.token_level_loss", "loss_fn.use_kl_in_reward"
ADVANTAGE = "grpo.adv_estimator.name"
PROMPTS, GENERATIONS = "grpo.num_prompts_per_step", "grpo.num_generations_per_prompt"
UPDATE_BATCH, ASYNC = "policy.train_global_batch_size", "grpo.async_grpo.enabled"
DEFAULTS = {KL_TYPE: "k3", INPUT_CLAMP: "20.0", OUTPUT_CLAMP: "10.0", APPROXIMATION: "false", TOKEN_LEVEL: "true",
            IN_REWARD: "false", ADVANTAGE: "grpo", ASYNC: "false"}
ESTIMATORS = {"k1": Estimator.K1, "k2": Estimator.K2, "k3": Estimator.K3}
VERL_CLAMPS = (20.0, 10.0)  # calculate_kl's defaults: the log-ratio to [-20, 20], the estimate to [-10, 10]
# The `loss_functions.py` of a copy of NeMo-RL, by release: the KL code there decides what the keys mean.
LOSS_MODULES = ("nemo_rl/algorithms/loss/loss_functions.py", "nemo_rl/algorithms/loss_functions.py")
UTILS_MODULE = "nemo_rl/algorithms/utils.py"

# the keys whose values decide each rule: a config reports a rule only where it sets one of them itself (a
# file inheriting every KL key from its base leaves the verdict to the base's own findings)
_ESTIMATOR_KEYS = (KL_TYPE, PENALTY, IN_REWARD, ADVANTAGE)
DECIDING = {"KL007": (TOKEN_LEVEL, PENALTY),
            "KL008": (UPDATE_BATCH, PROMPTS, GENERATIONS, ASYNC, APPROXIMATION, PENALTY),
            "KL010": (INPUT_CLAMP, OUTPUT_CLAMP, *_ESTIMATOR_KEYS)}

_NO_FLAG = "NeMo-RL has no setting whose KL gradient is the sequence's; in ClippedPGLossFn use "
FIXES = {"KL007": f"{TOKEN_LEVEL}: true (the batch's token mean: the same scale for a KL about as long as the responses)",
         "KL008": f"one optimizer step per rollout: {UPDATE_BATCH} equal to {PROMPTS} x {GENERATIONS}, "
                  f"{ASYNC}: false",
         "KL010": f"{INPUT_CLAMP}: null and {OUTPUT_CLAMP}: null (no clamp on the estimate)"}
FLAG_FIXES = {"KL007": (TOKEN_LEVEL, "true")}
NO_FLAG_FIX = "NeMo-RL has no single setting that fixes this: change the config by hand"


@dataclass(frozen=True)
class KLCode:
    """What the NeMo-RL code run does with the KL keys."""

    kl_types: bool  # reads reference_policy_kl_type (else k3)
    clamp_keys: bool  # clamps by kl_input_clamp_value / kl_output_clamp_value
    fixed_clamp: bool  # clamps the log-ratio to [-20, 20] whatever the config says
    kl_in_reward: bool  # reads use_kl_in_reward
    score_weighted: bool  # multiplies the loss term by exp(logp - sg(logp)) (or by pi / pi_gen)


RELEASES = {"0.3": KLCode(False, False, False, False, False), "0.4": KLCode(False, False, True, False, False),
            "0.5": KLCode(True, True, False, False, False), "0.6": KLCode(True, True, False, True, False),
            "0.7": KLCode(True, True, False, True, True)}
_SCORE_WEIGHT = re.compile(r"\bexp\(\s*([\w.]+)\s*-\s*\1\.detach\(\)\s*\)")
_FIXED_CLAMP = re.compile(r"def calculate_kl_penalty_joschu2020\((?:[^)]|\)\s*->)*?clamp_value", re.DOTALL)


def code_of_copy(loss_source: str, utils_source: str) -> KLCode:
    """The KL code of a copy of NeMo-RL, read from its loss module and its algorithms' utils."""
    clamp_keys = "kl_input_clamp_value" in loss_source
    return KLCode(kl_types="reference_policy_kl_type" in loss_source, clamp_keys=clamp_keys,
                  fixed_clamp=not clamp_keys and _FIXED_CLAMP.search(utils_source) is not None,
                  kl_in_reward="use_kl_in_reward" in loss_source,
                  score_weighted=_SCORE_WEIGHT.search(loss_source) is not None)


def code_of_release(assumed: Assumed) -> KLCode:
    return RELEASES[assumed.version]


def is_config(settings: Mapping[str, Setting]) -> bool:
    """Whether composed settings are a NeMo-RL GRPO configuration: its KL penalty beside a `grpo` section."""
    return PENALTY in settings and any(key.startswith("grpo.") for key in settings)


def judge(settings: Mapping[str, Setting], code: KLCode, own: Collection[str] | None = None) -> tuple[Judged, bool] | None:
    """(the KL configuration of NeMo-RL GRPO settings, whether its estimate is clamped); None when they are
    not NeMo-RL's, the KL is off, or a deciding value is unknown here. Findings go to the keys the file sets
    itself (`own`, by default all): an inherited key is placed at the line that brings it in."""
    own = settings.keys() if own is None else own
    if not is_config(settings):
        return None
    value = {key: settings[key].value if key in settings else DEFAULTS.get(key) for key in (PENALTY, *DEFAULTS)}
    beta = number(value[PENALTY] or "")
    flags = {key: truthy(value[key] or "") for key in (APPROXIMATION, TOKEN_LEVEL, IN_REWARD, ASYNC)}
    kl_type = value[KL_TYPE] if code.kl_types else "k3"
    estimator = ESTIMATORS.get((kl_type or "").strip("'\""))
    if beta is None or beta == 0 or estimator is None or None in flags.values():
        return None
    stale = _steps_per_rollout(settings) > 1 or bool(flags[ASYNC])
    if code.kl_in_reward and flags[IN_REWARD]:
        if value[ADVANTAGE] != "reinforce_plus_plus":
            return None  # the GRPO estimator adds no KL to the advantage, and the loss's beta is 0
        estimator, clamped = _clamped(estimator, VERL_CLAMPS)  # the advantage estimator calls calculate_kl's defaults
        config = Config(reward=estimator, returns=Returns.LOCAL, aggregation=_aggregation(flags[TOKEN_LEVEL]),
                        sampling=Sampling.TOKEN_IS if stale else Sampling.ON_POLICY)
    else:
        sampling = (Sampling.TOKEN_IS if flags[APPROXIMATION] else Sampling.OFF_POLICY) if stale else Sampling.ON_POLICY
        clamps = (number(value[INPUT_CLAMP] or "") or 0.0, number(value[OUTPUT_CLAMP] or "") or 0.0) if code.clamp_keys else (
            (20.0, 0.0) if code.fixed_clamp else (0.0, 0.0))
        if not code.score_weighted:
            estimator, clamped = _clamped(estimator, clamps)
        else:
            clamped = any(clamps)
        config = _loss(estimator, code.score_weighted, _aggregation(flags[TOKEN_LEVEL]), sampling)
    keys = [PENALTY, KL_TYPE if code.kl_types else None, IN_REWARD if code.kl_in_reward and flags[IN_REWARD] else None,
            TOKEN_LEVEL, *((PROMPTS, GENERATIONS, UPDATE_BATCH, APPROXIMATION) if stale else ())]
    named = ", ".join(shown(key.rsplit(".", 1)[-1], str(value.get(key) or settings[key].value), settings.get(key))
                      for key in keys if key is not None and (key in settings or key in DEFAULTS))
    anchors = {rule: settings[key] for rule, key in (("KL007", TOKEN_LEVEL), ("KL008", _stale_by(settings, own)))
               if key is not None and key in own}
    estimator_anchor = settings[next((key for key in (KL_TYPE, PENALTY, IN_REWARD, ADVANTAGE) if key in own), PENALTY)]
    return Judged(config, estimator_anchor, named, anchors), clamped


def reported(rule: str, own: Collection[str]) -> bool:
    """Whether a file that sets the keys `own` itself reports `rule` (the others come with its base's findings)."""
    return any(key in own for key in DECIDING.get(rule, _ESTIMATOR_KEYS))


def fix(rule: str, row_fix: str) -> str:
    return FIXES.get(rule) or (_NO_FLAG + row_fix if row_fix else "")


def _loss(estimator: Estimator, score_weighted: bool, aggregation: Aggregation, sampling: Sampling) -> Config:
    """The KL term of ClippedPGLossFn: the estimate differentiated as a loss, or its score-weighted form,
    whose gradient k grad log pi + grad k is a same-token reward of k beside the loss k (for k3, ratio*k3)."""
    if not score_weighted:
        return Config(loss=estimator, aggregation=aggregation, sampling=sampling)
    if estimator is Estimator.K3:
        return Config(loss=Estimator.RATIO_K3, aggregation=aggregation, sampling=sampling)
    loss = None if estimator is Estimator.K1 else estimator  # grad k1 = grad log pi: zero in expectation
    return Config(loss=loss, reward=estimator, returns=Returns.LOCAL, aggregation=aggregation, sampling=sampling)


def _clamped(estimator: Estimator, clamps: tuple[float, float]) -> tuple[Estimator, bool]:
    """(the estimator, whether a clamp is a defect of its own): k3 with the log-ratio clamped to [-20, 20] and
    the value to [-10, 10] is verl's low_var_kl, whose rows name the clamps; any other clamp is KL010's."""
    if estimator is Estimator.K3 and clamps == VERL_CLAMPS:
        return Estimator.LOW_VAR_KL, False
    return estimator, any(clamps)


def _aggregation(token_level: bool | None) -> Aggregation:
    return Aggregation.BATCH_MEAN if token_level else Aggregation.SEQ_MEAN


def _steps_per_rollout(settings: Mapping[str, Setting]) -> float:
    """Optimizer steps per rollout: prompts x generations / the update batch, in responses; 1 where one of
    them is left out or computed."""
    sizes = [number(settings[key].value or "") if key in settings else None for key in (PROMPTS, GENERATIONS, UPDATE_BATCH)]
    if any(size is None for size in sizes) or not sizes[2]:
        return 1.0
    prompts, generations, update = (float(size or 0) for size in sizes)
    return prompts * generations / update


def _stale_by(settings: Mapping[str, Setting], own: Collection[str]) -> str | None:
    """The key to change for stale samples, among those the file sets: async training when on, else the
    update batch, else the rollout's."""
    if ASYNC in own and truthy(settings[ASYNC].value or ""):
        return ASYNC
    return next((key for key in (UPDATE_BATCH, PROMPTS, GENERATIONS) if key in own), None)
