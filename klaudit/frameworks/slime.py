"""slime's KL flags as catalog configurations, read from the command line of a launch script that runs its
`train.py` or `train_async.py` (THUDM/slime: `slime/utils/arguments.py`, `slime/utils/ppo_utils.py` and
`slime/backends/megatron_utils/loss.py` at 624b824, and the copies of earlier releases that forks carry), and of
radixark/miles, a fork of slime that keeps these flags and their defaults (`miles/utils/arguments.py`).

- `--use-kl-loss` with `--kl-loss-coef` (default 0: no term) adds coef * k to the loss, k chosen by
  `--kl-loss-type`: k1 (the default; spelled `kl` in the first releases), k2, k3, or low_var_kl (k3 clamped to
  [-10, 10]). `--use-unbiased-kl` (later releases) multiplies k by exp(logp - old_logp): with k3 that is, on
  fresh samples, the score-weighted k3 (kl-math.md §8, row 2); with the other types no catalog row;
- the losses of each sample, the KL's and the policy's (which carries a KL reward), are its token mean, summed
  over the samples (`sum_of_sample_mean`: each sequence weighed by 1/L, row 21) unless
  `--calculate-per-token-loss` (the batch's tokens);
- `--kl-coef` (default 0) subtracts the same estimate, detached, from the token rewards of
  `--advantage-estimator` ppo (GAE) and reinforce_plus_plus (returns to go, gamma = lambda = 1 by default);
  grpo (the default), gspo and cispo compute it and leave it out of their returns: the KL is only logged;
- `--use-opd` (on-policy distillation, later releases) subtracts `--opd-kl-coef` (default 1) x (logp - teacher
  logp) from each token's advantage, whatever `--advantage-estimator` computed: a k1 to the teacher that reaches
  its own token's score only (row 2's same-token reward: the later tokens' KL is missing), reduced as the policy
  loss is. Where the launch also trains a KL loss, that term is the one judged;
- one rollout feeds several optimizer steps when `--rollout-batch-size` x `--n-samples-per-prompt` exceeds
  `--global-batch-size` (or `--num-steps-per-rollout` > 1), and `train_async.py` generates the next rollout
  while it trains on the last: the later steps train on an older policy's samples (rows 22-23).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from klaudit.catalog import Aggregation, Config, Estimator, Returns, Sampling
from klaudit.frameworks.settings import Judged, Setting, number, truthy

NAME = "slime"
FORKS = (NAME, "miles")  # the packages that read these flags: slime's, and miles (radixark/miles)
# a project carrying one of these packages runs it
ARGUMENTS_MODULES = {package: f"{package}/utils/arguments.py" for package in FORKS}
# `python3 train.py ...` or `train_async.py`, the entry points whose arguments these are
LAUNCH = re.compile(r"(?<![\w.-])(train|train_async)\.py(?![\w.])")
USE_LOSS, LOSS_COEF, LOSS_TYPE, UNBIASED = "use-kl-loss", "kl-loss-coef", "kl-loss-type", "use-unbiased-kl"
REWARD_COEF, ADVANTAGE, PER_TOKEN = "kl-coef", "advantage-estimator", "calculate-per-token-loss"
USE_OPD, OPD_COEF = "use-opd", "opd-kl-coef"
ROLLOUT_BATCH, SAMPLES, GLOBAL_BATCH, STEPS = ("rollout-batch-size", "n-samples-per-prompt", "global-batch-size",
                                               "num-steps-per-rollout")
KL_KEYS = (USE_LOSS, LOSS_COEF, LOSS_TYPE, UNBIASED, REWARD_COEF, USE_OPD, OPD_COEF)
KEYS = (*KL_KEYS, ADVANTAGE, PER_TOKEN, ROLLOUT_BATCH, SAMPLES, GLOBAL_BATCH, STEPS)
FLAGS = {key: key for key in KEYS}  # spelled as on the command line, without the dashes
SWITCHES = (USE_LOSS, UNBIASED, PER_TOKEN, USE_OPD)
DEFAULTS = {USE_LOSS: "False", LOSS_COEF: "0.0", LOSS_TYPE: "k1", UNBIASED: "False", REWARD_COEF: "0.0",
            ADVANTAGE: "grpo", PER_TOKEN: "False", SAMPLES: "1", USE_OPD: "False", OPD_COEF: "1.0"}
ESTIMATORS = {"k1": Estimator.K1, "kl": Estimator.K1, "k2": Estimator.K2, "k3": Estimator.K3,
              "low_var_kl": Estimator.LOW_VAR_KL}
REWARD_RETURNS = ("ppo", "reinforce_plus_plus")  # token rewards, then returns to go
LOGGED_ONLY = ("grpo", "gspo", "cispo")  # the KL reward is computed and left out of the returns

_TO_REWARD = (f"drop --{USE_LOSS} (or --{LOSS_COEF} 0) and set --{REWARD_COEF} with --{LOSS_TYPE} k1 and "
              f"--{ADVANTAGE} reinforce_plus_plus or ppo (grpo leaves a KL reward out of its returns): k1 in the "
              f"reward, unbiased; the reward sums the KL over the tokens where the loss averaged it, so divide the "
              "coefficient by about the mean response length")
ONE_STEP = (f"one optimizer step per rollout (--{GLOBAL_BATCH} equal to --{ROLLOUT_BATCH} x --{SAMPLES}, or "
            f"--{STEPS} 1) with train.py, not train_async.py")
FIXES = {"KL001": _TO_REWARD, "KL002": _TO_REWARD, "KL003": _TO_REWARD, "KL009": _TO_REWARD,
         "KL004": f"--{LOSS_TYPE} k1 (the reward's estimator too: k1 values in the reward are unbiased)",
         "KL007": f"--{PER_TOKEN} (the batch's token mean: about the same scale for a KL as long as the responses)",
         "KL008": f"{_TO_REWARD}; or {ONE_STEP}"}
OPD_FIX = ("slime has no flag for an unbiased on-policy distillation gradient: in a custom advantage function "
           "(--custom-advantage-function-path), give each token the sum of -(logp - teacher logp) over it and the "
           "tokens after it (a reward to go: klaudit.estimators.kl_reward with the teacher's log-probs in place of "
           "the reference's), and drop --use-opd")
STALE_REWARD_FIX = (f"{ONE_STEP}; or the KL out of the reward, into a loss of your own with per-decision importance "
                    "weights: klaudit.estimators.kl_penalty(log_probs, ref_log_probs, mask, old_logprobs=...).loss (R-F)")


def judge(settings: Mapping[str, Setting], asynchronous: Setting | None = None) -> Judged | None:
    """The KL configuration a slime launch's `settings` select (`asynchronous`: where it runs train_async.py);
    None when the launch sets no KL flag, the KL is off or only logged, or a deciding flag is not a literal."""
    if not any(key in settings for key in KL_KEYS):
        return None
    given = {key: settings[key].value if key in settings else DEFAULTS.get(key) for key in KEYS}
    loss_coef, reward_coef = number(given[LOSS_COEF] or ""), number(given[REWARD_COEF] or "")
    use_loss, unbiased = truthy(given[USE_LOSS] or ""), truthy(given[UNBIASED] or "")
    use_opd, opd_coef = truthy(given[USE_OPD] or ""), number(given[OPD_COEF] or "")
    estimator = ESTIMATORS.get(given[LOSS_TYPE] or "")
    if None in (loss_coef, reward_coef, use_loss, unbiased, use_opd, opd_coef) or estimator is None:
        return None
    steps, per_token = _steps_per_rollout(given), truthy(given[PER_TOKEN] or "")
    stale = asynchronous is not None or (steps or 1) > 1
    if per_token is None:
        return None
    aggregation = Aggregation.BATCH_MEAN if per_token else Aggregation.SEQ_MEAN  # the loss's, and the rewards' with it
    if use_loss and loss_coef:
        if unbiased and estimator is not Estimator.K3:
            return None  # the ratio times k1, k2 or a clamped k3: no catalog row
        loss = Estimator.RATIO_K3 if unbiased else estimator
        older = Sampling.TOKEN_IS if unbiased else Sampling.OFF_POLICY
        config = Config(loss=loss, aggregation=aggregation, sampling=older if stale else Sampling.ON_POLICY)
        anchor = next(settings[key] for key in (LOSS_TYPE, USE_LOSS, LOSS_COEF, UNBIASED) if key in settings)
        shown: tuple[str, ...] = (USE_LOSS, LOSS_COEF, LOSS_TYPE, UNBIASED, PER_TOKEN)
        helps: dict[str, str] = {}
    elif reward_coef and given[ADVANTAGE] in REWARD_RETURNS:
        config = Config(reward=estimator, returns=Returns.TO_GO, aggregation=aggregation,
                        sampling=Sampling.TOKEN_IS if stale else Sampling.ON_POLICY)
        anchor = next(settings[key] for key in (LOSS_TYPE, REWARD_COEF, ADVANTAGE) if key in settings)
        shown, helps = (REWARD_COEF, LOSS_TYPE, ADVANTAGE, PER_TOKEN), {"KL008": STALE_REWARD_FIX}
    elif use_opd and opd_coef:
        config = Config(reward=Estimator.K1, returns=Returns.LOCAL, aggregation=aggregation,
                        sampling=Sampling.TOKEN_IS if stale else Sampling.ON_POLICY)
        anchor = next(settings[key] for key in (USE_OPD, OPD_COEF) if key in settings)
        shown = (USE_OPD, OPD_COEF, PER_TOKEN)
        helps = {"KL003": OPD_FIX, "KL008": f"{ONE_STEP}; or {OPD_FIX}"}
    else:
        return None  # no KL term, or a KL reward grpo, gspo or cispo leaves out of the returns
    flags = ", ".join(f"{key}={given[key]}" + ("" if key in settings else " (default)") for key in shown)
    if stale:
        flags += ", " + ("train_async.py" if asynchronous is not None else
                         ", ".join(f"{key}={given[key]}" for key in (ROLLOUT_BATCH, SAMPLES, GLOBAL_BATCH, STEPS)
                                   if key in settings))
    # the loss's reduction is set beside --use-kl-loss; OPD's, which rides on the policy loss, at --use-opd
    anchors = {"KL007": anchor if config.returns is Returns.LOCAL else settings.get(USE_LOSS, anchor)}
    stale_at = asynchronous or next((settings[key] for key in (STEPS, GLOBAL_BATCH, ROLLOUT_BATCH) if key in settings),
                                    None)
    if stale_at is not None:
        anchors["KL008"] = stale_at
    return Judged(config, anchor, flags, anchors, helps)


def _steps_per_rollout(given: Mapping[str, str | None]) -> float | None:
    """Optimizer steps per rollout: `--num-steps-per-rollout`, else the rollout's samples over the global batch;
    None when a size is not a literal or the global batch is left to Megatron (micro-batch x data parallel)."""
    if given[STEPS] is not None:
        return number(given[STEPS] or "")
    rollout, samples, batch = (number(given[key] or "") for key in (ROLLOUT_BATCH, SAMPLES, GLOBAL_BATCH))
    if rollout is None or samples is None or not batch:
        return None
    return rollout * samples / batch
