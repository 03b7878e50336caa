"""NeMo-RL's GRPO and PPO KL settings (NVIDIA-NeMo/RL) as catalog configurations.

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

One rollout is `grpo.num_prompts_per_step` x `grpo.num_generations_per_prompt` responses (`ppo.` in a PPO
config), trained in updates of `policy.train_global_batch_size` responses, `ppo.ppo_epochs` times in PPO
(default 4): more than one optimizer step per rollout, or asynchronous training, trains the KL on samples of an
older policy. Only the sampled token is reweighted, by sg(pi / pi_gen) up to 0.6 and by pi / pi_gen from 0.7,
where `loss_fn.use_on_policy_kl_approximation` is set (rows 22-23). PPO's GAE carries a KL reward
(`use_kl_in_reward`) to every earlier token when its gamma and lambda are 1.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from klaudit.catalog import Aggregation, Config, Estimator, Returns, Sampling
from klaudit.frameworks.settings import Judged, Setting, number, shown, truthy

NAME = "nemo_rl"
LABEL = "NeMo-RL"
PENALTY, KL_TYPE = "loss_fn.reference_policy_kl_penalty", "loss_fn.reference_policy_kl_type"
INPUT_CLAMP, OUTPUT_CLAMP = "loss_fn.kl_input_clamp_value", "loss_fn.kl_output_clamp_value"
APPROXIMATION = "loss_fn.use_on_policy_kl_approximation"
TOKEN_LEVEL, IN_REWARD = "loss_fn.token_level_loss", "loss_fn.use_kl_in_reward"
UPDATE_BATCH = "policy.train_global_batch_size"
ESTIMATORS = {"k1": Estimator.K1, "k2": Estimator.K2, "k3": Estimator.K3}
VERL_CLAMPS = (20.0, 10.0)  # calculate_kl's defaults: the log-ratio to [-20, 20], the estimate to [-10, 10]
# The `loss_functions.py` of a copy of NeMo-RL, by release: the KL code there decides what the keys mean.
LOSS_MODULES = ("nemo_rl/algorithms/loss/loss_functions.py", "nemo_rl/algorithms/loss_functions.py")
UTILS_MODULE = "nemo_rl/algorithms/utils.py"


@dataclass(frozen=True)
class Algorithm:
    """The section of a GRPO or PPO config that sizes a rollout: `prompts` x `generations` responses, trained
    `epochs` times (PPO's) in updates of `policy.train_global_batch_size`, or asynchronously."""

    section: str
    advantage_default: str
    epochs_default: str | None  # None: one pass

    def key(self, name: str) -> str:
        return f"{self.section}.{name}"

    @property
    def prompts(self) -> str:
        return self.key("num_prompts_per_step")

    @property
    def generations(self) -> str:
        return self.key("num_generations_per_prompt")

    @property
    def advantage(self) -> str:
        return self.key("adv_estimator.name")

    @property
    def asynchronous(self) -> str:
        return self.key(f"async_{self.section}.enabled")

    @property
    def epochs(self) -> str | None:
        return self.key("ppo_epochs") if self.epochs_default is not None else None


GRPO, PPO = Algorithm("grpo", "grpo", None), Algorithm("ppo", "gae", "4")
DEFAULTS = {KL_TYPE: "k3", INPUT_CLAMP: "20.0", OUTPUT_CLAMP: "10.0", APPROXIMATION: "false", TOKEN_LEVEL: "true",
            IN_REWARD: "false"}

_NO_FLAG = "NeMo-RL has no setting whose KL gradient is the sequence's; in ClippedPGLossFn use "
FIXES = {"KL007": f"{TOKEN_LEVEL}: true (the batch's token mean: the same scale for a KL about as long as the responses)",
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


def algorithm(settings: Mapping[str, Setting]) -> Algorithm | None:
    """The algorithm of composed NeMo-RL settings: a `grpo` or `ppo` section beside the KL penalty; None
    when they are no NeMo-RL GRPO or PPO configuration."""
    if PENALTY not in settings:
        return None
    return next((found for found in (GRPO, PPO) if any(key.startswith(found.section + ".") for key in settings)), None)


def judge(settings: Mapping[str, Setting], code: KLCode, own: Collection[str] | None = None) -> tuple[Judged, bool] | None:
    """(the KL configuration of NeMo-RL GRPO or PPO settings, whether its estimate is clamped); None when they
    are not NeMo-RL's, the KL is off, or a deciding value is unknown here. Findings go to the keys the file
    sets itself (`own`, by default all): an inherited key is placed at the line that brings it in; a rule is
    reported only where the file sets a key that decides it (`reported`)."""
    own = settings.keys() if own is None else own
    found = algorithm(settings)
    if found is None:
        return None
    defaults = {**DEFAULTS, found.advantage: found.advantage_default, found.asynchronous: "false"}
    value = {key: settings[key].value if key in settings else defaults.get(key) for key in (PENALTY, *defaults)}
    beta = number(value[PENALTY] or "")
    flags = {key: truthy(value[key] or "") for key in (APPROXIMATION, TOKEN_LEVEL, IN_REWARD, found.asynchronous)}
    kl_type = value[KL_TYPE] if code.kl_types else "k3"
    estimator = ESTIMATORS.get((kl_type or "").strip("'\""))
    if beta is None or beta == 0 or estimator is None or None in flags.values():
        return None
    stale = _steps_per_rollout(settings, found) > 1 or bool(flags[found.asynchronous])
    in_reward = code.kl_in_reward and bool(flags[IN_REWARD])
    if in_reward:
        returns = _reward_returns(settings, found, str(value[found.advantage]))
        if returns is None:
            return None  # an estimator that adds no KL to the advantage (GRPO's), and the loss's beta is 0
        estimator, clamped = _clamped(estimator, VERL_CLAMPS)  # the advantage estimator calls calculate_kl's defaults
        config = Config(reward=estimator, returns=returns, aggregation=_aggregation(flags[TOKEN_LEVEL]),
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
    sizes = (found.prompts, found.generations, UPDATE_BATCH, found.epochs, APPROXIMATION) if stale else ()
    keys = [PENALTY, KL_TYPE if code.kl_types else None, IN_REWARD if in_reward else None, TOKEN_LEVEL, *sizes]
    named = ", ".join(shown(key.rsplit(".", 1)[-1], str(value.get(key) or settings[key].value), settings.get(key))
                      for key in keys if key is not None and (key in settings or key in defaults))
    anchors = {rule: settings[key] for rule, key in (("KL007", TOKEN_LEVEL), ("KL008", _stale_by(settings, own, found)))
               if key is not None and key in own}
    estimator_anchor = settings[next((key for key in (KL_TYPE, PENALTY, IN_REWARD, found.advantage) if key in own), PENALTY)]
    stale_help = (f"one optimizer step per rollout: {UPDATE_BATCH} equal to {found.prompts} x {found.generations}"
                  + (f", {found.epochs}: 1" if found.epochs else "") + f", {found.asynchronous}: false")
    return Judged(config, estimator_anchor, named, anchors, {"KL008": stale_help}), clamped


def reported(rule: str, own: Collection[str], settings: Mapping[str, Setting], code: KLCode) -> bool:
    """Whether a file that sets the keys `own` itself reports `rule` about `settings`: where it sets a key
    that decides the rule (the others come with its base file's findings). The advantage estimator decides
    the estimator's rules only where the code run puts the KL in the reward."""
    found = algorithm(settings) or GRPO
    in_reward = code.kl_in_reward and truthy((settings[IN_REWARD].value or "") if IN_REWARD in settings else "false")
    estimator_keys = (KL_TYPE, PENALTY, IN_REWARD, *((found.advantage,) if in_reward else ()))
    deciding = {"KL007": (TOKEN_LEVEL, PENALTY),
                "KL008": (UPDATE_BATCH, found.prompts, found.generations, found.asynchronous, found.epochs,
                          APPROXIMATION, PENALTY),
                "KL010": (INPUT_CLAMP, OUTPUT_CLAMP, *estimator_keys)}
    return any(key in own for key in deciding.get(rule, estimator_keys) if key is not None)


def fix(rule: str, row_fix: str) -> str:
    """The help of a finding: the flag that fixes it, else the catalog's code fix (at the config's scale)."""
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


def _steps_per_rollout(settings: Mapping[str, Setting], found: Algorithm) -> float:
    """Optimizer steps per rollout: prompts x generations / the update batch, in responses, times PPO's
    epochs; 1 where a size is left out or computed."""
    sizes = [number(settings[key].value or "") if key in settings else None
             for key in (found.prompts, found.generations, UPDATE_BATCH)]
    given = settings.get(found.epochs) if found.epochs is not None else None
    epochs = number((given.value or "") if given is not None else (found.epochs_default or "1"))
    if any(size is None for size in sizes) or not sizes[2] or epochs is None:
        return 1.0
    prompts, generations, update = (float(size or 0) for size in sizes)
    return epochs * max(prompts * generations / update, 1.0)


def _reward_returns(settings: Mapping[str, Setting], found: Algorithm, advantage: str) -> Returns | None:
    """How the advantage estimator carries a KL reward: Reinforce++ puts each token's own on its advantage;
    PPO's GAE with gamma = lambda = 1 sums the later ones (reward-to-go); None for any other estimator (GRPO's
    ignores it; a GAE that discounts is no row of the table)."""
    if advantage == "reinforce_plus_plus":
        return Returns.LOCAL
    if found is PPO and advantage == "gae" and all(
            number((settings[found.key(f"adv_estimator.{key}")].value or "") if found.key(f"adv_estimator.{key}") in settings
                   else "") == 1.0 for key in ("gae_gamma", "gae_lambda")):
        return Returns.TO_GO
    return None


def _stale_by(settings: Mapping[str, Setting], own: Collection[str], found: Algorithm) -> str | None:
    """The key to change for stale samples, among those the file sets: async training when on, else PPO's
    epochs when more than one, else the update batch, else the rollout's."""
    if found.asynchronous in own and truthy(settings[found.asynchronous].value or ""):
        return found.asynchronous
    if found.epochs is not None and found.epochs in own and (number(settings[found.epochs].value or "") or 1) > 1:
        return found.epochs
    return next((key for key in (UPDATE_BATCH, found.prompts, found.generations) if key in own), None)
