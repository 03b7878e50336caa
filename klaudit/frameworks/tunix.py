"""tunix's KL settings (google/tunix, JAX) as catalog configurations, from its algorithm configurations.

GRPO (`GRPOConfig` of `tunix.rl.grpo.grpo_learner`, alias `GrpoConfig`; the agentic learner's
`GRPOConfig`, exported as `AgenticGRPOConfig`; `DrGRPOConfig`, `DAPOConfig`) adds `beta` times a
per-token KL estimate, differentiated, to the loss:

- `kl_loss_mode` (from 0.1.7; default "kl") picks the estimator: "kl" is k1 = logp - ref, "mse_kl"
  k2 = 0.5 (logp - ref)^2, "low_var_kl" k3 = exp(ref - logp) - (ref - logp) - 1 (no clamp of its own).
  Before 0.1.7 the term was always k3. `beta` 0 (or None, DAPO's default) adds none;
- `loss_agg_mode` (from 0.1.4) aggregates it with the policy loss: "token-mean" over the batch's
  tokens, "sequence-mean-token-mean" (the default; DAPO's is "token-mean") per sequence over its own
  length, "sequence-mean-token-scale" (Dr. GRPO's default) by the longest length, "seq-mean-token-sum"
  and "sequence-mean-token-sum-norm" by a constant. Before 0.1.4, `loss_algo="grpo"` (the default) took
  the batch's token-mean and "gspo-token" the per-sequence one;
- `num_iterations` > 1 reuses each rollout for several updates, and the agentic learner's
  `off_policy_steps` > 0 trains on rollouts of an older policy: the KL term has no importance weight;
- `kl_clamp_value` (from 0.1.7; default None) clips the per-token estimate.

tunix's command line (`python -m tunix.cli.grpo_main base_config.yaml [override.yaml] key=value ...`) fills
GRPOConfig from the `grpo_config` section of its YAML configs and overrides, the agentic learner's from
`agentic_grpo_config`.

PPO (`PPOConfig`, alias `PpoConfig`) subtracts `beta` times the estimate `kl_method` names (default
"low_var_kl", the same three) from the token rewards, then takes GAE: the reward placement with
returns to go. Its loss has no KL term.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from klaudit.catalog import Aggregation, Config, Estimator, Returns, Sampling
from klaudit.frameworks.settings import Judged, Setting, number, shown
from klaudit.frameworks.versions import Assumed, at_least

NAME = "tunix"
BETA, MODE, AGGREGATION, ITERATIONS, ALGORITHM, CLAMP, OFF_POLICY_STEPS, METHOD = (
    "beta", "kl_loss_mode", "loss_agg_mode", "num_iterations", "loss_algo", "kl_clamp_value", "off_policy_steps",
    "kl_method")
KEYS = (BETA, MODE, AGGREGATION, ITERATIONS, ALGORITHM, CLAMP, OFF_POLICY_STEPS, METHOD)
# The configuration classes, by the name tunix gives them, and the learner each configures.
CLASSES = {"GRPOConfig": "grpo", "GrpoConfig": "grpo", "AgenticGRPOConfig": "grpo", "DrGRPOConfig": "drgrpo",
           "DAPOConfig": "dapo", "PPOConfig": "ppo", "PpoConfig": "ppo"}
CLI_SECTIONS = {"grpo_config": "grpo", "agentic_grpo_config": "grpo"}
LAUNCH = re.compile(r"\btunix[./]cli[./]grpo_main\b")
ESTIMATORS = {"kl": Estimator.K1, "mse_kl": Estimator.K2, "low_var_kl": Estimator.K3}
AGGREGATIONS = {"token-mean": Aggregation.BATCH_MEAN, "sequence-mean-token-mean": Aggregation.SEQ_MEAN,
                "sequence-mean-token-scale": Aggregation.CONSTANT, "seq-mean-token-sum": Aggregation.SUM,
                "sequence-mean-token-sum-norm": Aggregation.SUM}
_EARLY_AGGREGATIONS = {"grpo": Aggregation.BATCH_MEAN, "gspo-token": Aggregation.SEQ_MEAN}  # before 0.1.4

_OWN_LOSS = ("tunix's GRPO has no setting for an unbiased KL gradient: set beta=0.0 and register a policy loss of "
             "your own (tunix.rl.function_registry) whose KL term is k1 weighted by the stop-gradient sum of the "
             "later tokens' k1 (R-A of docs/kl-math.md), or train with PPOConfig(kl_method=\"kl\"), which puts "
             "k1 in the rewards")
FIXES = {"KL004": 'kl_method="kl": the k1 values in the rewards, unbiased at the same scale',
         "KL007": 'loss_agg_mode="token-mean": the batch token-mean keeps the scale'}
FLAG_FIXES = {"KL004": (METHOD, "kl"), "KL007": (AGGREGATION, "token-mean")}
NO_FLAG_FIX = "tunix has no setting for an unbiased KL gradient in GRPO's loss: the fix is code of your own (see the help)"


def defaults(learner: str, assumed: Assumed) -> dict[str, str]:
    """The configuration class's defaults in the release `assumed`; a key the release lacks has its fixed
    behaviour ("low_var_kl" before kl_loss_mode existed)."""
    if learner == "ppo":
        return {BETA: "0.04", METHOD: "low_var_kl", CLAMP: "None"}
    aggregation = {"drgrpo": "sequence-mean-token-scale", "dapo": "token-mean"}.get(learner, "sequence-mean-token-mean")
    return {BETA: "None" if learner == "dapo" else "0.04", MODE: "kl" if at_least(assumed, "0.1.7") else "low_var_kl",
            AGGREGATION: aggregation if at_least(assumed, "0.1.4") else "", ITERATIONS: "1", ALGORITHM: "grpo",
            CLAMP: "None", OFF_POLICY_STEPS: "0"}


def judge(learner: str, settings: Mapping[str, Setting], assumed: Assumed, anchor: Setting) -> tuple[Judged, bool] | None:
    """The KL configuration a tunix configuration of `learner` selects with `settings` over the defaults of
    the release `assumed`, and whether the estimate is clamped; None when the KL is off or undecidable.
    `anchor` is where to report when `beta` is not set here."""
    fallback = defaults(learner, assumed)
    given = {key: settings[key].value if key in settings else default for key, default in fallback.items()}
    value = {key: v for key, v in given.items() if v is not None}
    if len(value) < len(given):
        return None  # a deciding key set to a computed value
    beta = number(value[BETA]) if value[BETA] != "None" else 0.0
    estimator = ESTIMATORS.get(value[METHOD if learner == "ppo" else MODE])
    if beta is None or beta <= 0 or estimator is None:
        return None
    clamped = value[CLAMP] != "None"
    if learner == "ppo":
        config = Config(reward=estimator, returns=Returns.TO_GO)
        deciding, anchors = (BETA, METHOD), {"KL004": settings.get(METHOD)}
    else:
        aggregation = (AGGREGATIONS.get(value[AGGREGATION]) if value[AGGREGATION]
                       else _EARLY_AGGREGATIONS.get(value[ALGORITHM]))
        iterations, steps = number(value[ITERATIONS]), number(value[OFF_POLICY_STEPS])
        if aggregation is None or iterations is None or steps is None:
            return None
        stale = iterations > 1 or steps > 0
        config = Config(loss=estimator, aggregation=aggregation,
                        sampling=Sampling.OFF_POLICY if stale else Sampling.ON_POLICY)
        reuse = ITERATIONS if iterations > 1 or OFF_POLICY_STEPS not in settings else OFF_POLICY_STEPS
        deciding = (BETA, MODE, AGGREGATION if value[AGGREGATION] else ALGORITHM, ITERATIONS,
                    *((OFF_POLICY_STEPS,) if OFF_POLICY_STEPS in settings else ()))
        anchors = {"KL007": settings.get(AGGREGATION), "KL008": settings.get(reuse)}
    flags = ", ".join(_shown(key, value[key], settings.get(key), assumed)
                      for key in (*deciding, *((CLAMP,) if clamped else ())))
    where = {rule: setting for rule, setting in anchors.items() if setting is not None}
    return Judged(config, settings.get(BETA, anchor), flags, where), clamped


def _shown(key: str, value: str, setting: Setting | None, assumed: Assumed) -> str:
    """A deciding key as a finding names it; one the release does not have yet is its fixed behaviour."""
    if setting is None and key == MODE and not at_least(assumed, "0.1.7"):
        return f"{key}={value} (fixed before 0.1.7)"
    return shown(key, value, setting)


def fix(rule: str, _row_fix: str = "") -> str:
    return FIXES.get(rule, _OWN_LOSS)
