"""ms-swift's GRPO KL flags as catalog configurations, read from the command line of `swift rlhf --rlhf_type
grpo` or `megatron rlhf --rlhf_type grpo` (ModelScope's trainer, modelscope/ms-swift: `swift/arguments/
rlhf_args.py` and the GRPO trainers of `swift/rlhf_trainers/` and `swift/megatron/trainers/` at 4.6.0.dev0;
the 3.x releases build the same loss on TRL's GRPOTrainer).

- `--beta` (GRPO's default 0.04; 0 drops the reference model) times k3 = exp(ref - logp) - (ref - logp) - 1
  is added to each token's loss and differentiated: k3 as a loss (kl-math.md §8, row 3; the 4.x releases clamp
  it to [-10, 10] as verl's low_var_kl, row 4, the same rule);
- with `--kl_in_reward true` (the default of `--advantage_estimator` rloo and reinforce_plus_plus, false with
  grpo, the default) there is no KL loss: beta times the response's summed k1 of the sampling policy to the
  reference is taken from its scalar reward, the whole-sequence return (row 6);
- `--loss_type` grpo (the default) and sapo take each response's token mean (row 21); bnpo, dapo, cispo and
  real the batch's tokens; dr_grpo divides by a constant;
- `--rlhf_type ppo` trains with TRL's rewritten PPOTrainer (klaudit.frameworks.trl_ppo): k1 times `--kl_coef`
  (default 0.05) in the token rewards, `--num_ppo_epochs` (4) x `--num_mini_batches` (1) optimizer steps per
  batch of rollouts (row 23 beyond one), and a policy loss averaged over each backward pass's responses, ms-swift's
  `--per_device_train_batch_size` of 1 by default: one response's token mean (row 21);
- a generation feeds several optimizer steps where `--num_iterations` > 1 or `--steps_per_generation` (the
  micro-steps one generation serves; by default `--gradient_accumulation_steps`, whose GRPO default is 1)
  spans more than one step, and `--async_generate true` samples with the weights of the step before: the
  KL is then trained on an older policy's samples, the loss with no weight (row 22), the reward with the
  token ratio of the policy loss (row 23).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping

from klaudit.catalog import Aggregation, Config, Estimator, Returns, Sampling
from klaudit.frameworks import trl_ppo
from klaudit.frameworks.settings import Judged, Setting, generation_spans_steps, number, shown, truthy

NAME = "ms-swift"
# `swift rlhf ...`, `megatron rlhf ...` (the command found by the shell: `"$(which swift)" rlhf`), or the module those
# commands run (`python swift/cli/rlhf.py ...`, or by the installed package's path:
# `torchrun $(python -c "import swift; print(swift.__path__[0])")/cli/rlhf.py ...`)
LAUNCH = re.compile(r"(?<![\w./-])(?:swift|megatron)(?:\)\"?)?[ \t]+rlhf(?![\w-])"
                    r"|(?<![\w-])swift/cli/(?:_megatron/)?rlhf\.py\b"
                    r"|\bswift\.__path__\[0\][)\"' ]*/cli/(?:_megatron/)?rlhf\.py\b")
RLHF_TYPE, BETA, IN_REWARD, ESTIMATOR, LOSS_TYPE = "rlhf_type", "beta", "kl_in_reward", "advantage_estimator", "loss_type"
ITERATIONS, STEPS, ACCUMULATION, ASYNC = ("num_iterations", "steps_per_generation", "gradient_accumulation_steps",
                                          "async_generate")
# PPO's: TRL's rewritten PPOConfig fields, which ms-swift's command line takes as they are
PPO_KEYS = (trl_ppo.COEFFICIENTS[trl_ppo.ESTIMATOR], *trl_ppo.STEPS, trl_ppo.MICRO_BATCH[trl_ppo.ESTIMATOR])
PPO_MICRO_BATCH = "1"  # ms-swift's per_device_train_batch_size by default (TRL's is 8)
KEYS = (RLHF_TYPE, BETA, IN_REWARD, ESTIMATOR, LOSS_TYPE, ITERATIONS, STEPS, ACCUMULATION, ASYNC, *PPO_KEYS)
FLAGS = {key: key for key in KEYS}  # spelled as on the command line, without the dashes
SWITCHES = (IN_REWARD, ASYNC)  # booleans, given alone (`--async_generate`) or with a value
DECIDING = (BETA, IN_REWARD, ESTIMATOR, LOSS_TYPE, ITERATIONS, ASYNC)  # a computed value of one leaves no verdict
DEFAULTS = {BETA: "0.04", ESTIMATOR: "grpo", LOSS_TYPE: "grpo", ITERATIONS: "1", ACCUMULATION: "1", ASYNC: "false"}
REWARD_BY_DEFAULT = ("rloo", "reinforce_plus_plus")  # the estimators that put the KL in the reward unless told
AGGREGATIONS = {"grpo": Aggregation.SEQ_MEAN, "sapo": Aggregation.SEQ_MEAN, "bnpo": Aggregation.BATCH_MEAN,
                "dapo": Aggregation.BATCH_MEAN, "cispo": Aggregation.BATCH_MEAN, "real": Aggregation.BATCH_MEAN,
                "dr_grpo": Aggregation.CONSTANT}

_TO_REWARD = (f"--{IN_REWARD} true: beta times the response's summed k1 taken from its reward, unbiased on fresh "
              "samples; the reward sums the KL over the tokens where the loss averaged it, so divide beta by "
              f"about the mean response length (or --{BETA} 0 to drop the KL)")
ONE_STEP = (f"one optimizer step per generation (--{ITERATIONS} 1, --{STEPS} equal to --{ACCUMULATION}, "
            f"--{ASYNC} false)")
FIXES = {"KL002": _TO_REWARD, "KL007": f"--{LOSS_TYPE} dapo (the batch's token mean: about the same scale for a KL "
         "as long as the responses)", "KL008": f"{ONE_STEP}; or {_TO_REWARD}"}
STALE_REWARD_FIX = (f"{ONE_STEP}; or the KL out of the reward, into a loss of your own with per-decision importance "
                    "weights: klaudit.estimators.kl_penalty(log_probs, ref_log_probs, mask, old_logprobs=...).loss (R-F)")


def judge(settings: Mapping[str, Setting], launch: Setting) -> Judged | None:
    """The KL configuration a `swift rlhf` launch's `settings` select (`launch`: where the command is); None
    unless it trains GRPO with a KL, or when a deciding flag is not a literal (a computed batch size decides
    nothing)."""
    kind = settings.get(RLHF_TYPE)
    if kind is not None and kind.value == "ppo":
        return _ppo(settings, kind)
    if kind is None or kind.value != "grpo":
        return None  # DPO, the default, and the other preference losses: their beta is no KL penalty
    if any(settings[key].value is None for key in DECIDING if key in settings):
        return None
    given = {key: settings[key].value if key in settings else DEFAULTS.get(key) for key in KEYS}
    beta, iterations, asynchronous = number(given[BETA] or ""), number(given[ITERATIONS] or ""), truthy(given[ASYNC] or "")
    in_reward = truthy(given[IN_REWARD]) if IN_REWARD in settings else given[ESTIMATOR] in REWARD_BY_DEFAULT
    aggregation = AGGREGATIONS.get(given[LOSS_TYPE] or "")
    if not beta or iterations is None or asynchronous is None or in_reward is None or aggregation is None:
        return None
    reuses = {ITERATIONS: iterations > 1, STEPS: generation_spans_steps(given[STEPS], given[ACCUMULATION]),
              ASYNC: asynchronous}
    stale = any(reuses.values())
    if in_reward:
        config = Config(reward=Estimator.K1, returns=Returns.SEQUENCE, aggregation=aggregation,
                        sampling=Sampling.TOKEN_IS if stale else Sampling.ON_POLICY)
        helps = {"KL008": STALE_REWARD_FIX}
    else:
        config = Config(loss=Estimator.K3, aggregation=aggregation,
                        sampling=Sampling.OFF_POLICY if stale else Sampling.ON_POLICY)
        helps = {}
    values = {**{key: value or "" for key, value in given.items()}, IN_REWARD: str(in_reward).lower()}
    flags = ", ".join(shown(key, values[key], settings.get(key)) for key in (BETA, ESTIMATOR, IN_REWARD, LOSS_TYPE))
    if stale:
        flags += ", " + ", ".join(f"{key}={given[key]}" for key in (ITERATIONS, STEPS, ACCUMULATION, ASYNC)
                                  if key in settings)
    anchors = {"KL007": settings.get(LOSS_TYPE, kind)}
    stale_at = next((settings[key] for key, reused in reuses.items() if reused and key in settings), None)
    if stale_at is not None:
        anchors["KL008"] = stale_at
    return Judged(config, settings.get(BETA, kind), flags, anchors, helps)


def _ppo(settings: Mapping[str, Setting], kind: Setting) -> Judged | None:
    """The KL configuration of a `swift rlhf --rlhf_type ppo` launch: TRL's PPOTrainer with ms-swift's defaults."""
    ppo = {key: settings[key] for key in PPO_KEYS if key in settings}
    if any(setting.value is None for setting in ppo.values()):
        return None
    judged = trl_ppo.judge(ppo, kind, api=trl_ppo.ESTIMATOR, micro_default=PPO_MICRO_BATCH,
                           defaults="ms-swift's PPO defaults (kl_coef=0.05, num_ppo_epochs=4, num_mini_batches=1)")
    if judged is None:
        return None
    return dataclasses.replace(judged, helps={"KL008": trl_ppo.FIXES["KL008"], **judged.helps})
