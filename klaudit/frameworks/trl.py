"""TRL's GRPO KL flags as catalog configurations (read from TRL 1.16's GRPOConfig and GRPOTrainer).

- `beta` (default 0.0): the KL is off at 0; otherwise `_compute_loss` adds `beta * k3` to the
  per-token loss, where k3 = exp(ref - logp) - (ref - logp) - 1 is differentiated;
- `use_bias_correction_kl` (default True) multiplies k3 by coef_1 = exp(logp - old_logp), which on
  fresh samples is exp(logp - sg logp): the score-weighted k3 (`ratio*k3`);
- `num_iterations` > 1 reuses each generation for several updates: the samples come from an older
  policy, with at most the token-level ratio;
- `loss_type` aggregates the per-token loss: grpo/sapo per-sequence token-mean, bnpo and
  dapo/cispo/vespo over the batch's tokens, dr_grpo by a constant, luspo a per-sequence sum;
- `importance_sampling_level="sequence"` weighs k3 by a per-sequence ratio, which no catalog row
  describes: no verdict.
"""

from __future__ import annotations

from collections.abc import Mapping

from klaudit.catalog import Aggregation, Config, Estimator, Sampling
from klaudit.frameworks.settings import Judged, Setting

NAME = "trl"
VERSION = "1.16"
CONFIG_CLASSES = ("GRPOConfig",)
BETA, CORRECTION, ITERATIONS, LOSS_TYPE, LEVEL = (
    "beta", "use_bias_correction_kl", "num_iterations", "loss_type", "importance_sampling_level")
KEYS = (BETA, CORRECTION, ITERATIONS, LOSS_TYPE, LEVEL)
DEFAULTS = {BETA: "0.0", CORRECTION: "True", ITERATIONS: "1", LOSS_TYPE: "dapo", LEVEL: "token"}
AGGREGATIONS = {"grpo": Aggregation.SEQ_MEAN, "sapo": Aggregation.SEQ_MEAN, "bnpo": Aggregation.BATCH_MEAN,
                "dapo": Aggregation.BATCH_MEAN, "cispo": Aggregation.BATCH_MEAN, "vespo": Aggregation.BATCH_MEAN,
                "dr_grpo": Aggregation.CONSTANT, "luspo": Aggregation.SUM}

_OWN_LOSS = ("TRL has no flag for an unbiased KL gradient: keep beta and override GRPOTrainer._compute_loss "
             "with klaudit.estimators.kl_penalty(per_token_logps, ref_per_token_logps, mask).loss in place of "
             "the k3 term (R-A), or set beta=0.0")
FIXES = {"KL007": 'loss_type="dapo" (or "bnpo"): the batch token-mean keeps the scale'}
FLAG_FIXES = {"KL007": (LOSS_TYPE, "dapo")}  # the fixes that are one keyword's value
NO_FLAG_FIX = "TRL has no flag for an unbiased KL gradient: the fix is code of your own (see the help)"


def _number(value: str) -> float | None:
    try:
        return float(value)
    except ValueError:
        return None


def judge(settings: Mapping[str, Setting]) -> Judged | None:
    """The KL configuration a GRPOConfig's keywords select; None when the KL is off or undecidable."""
    given = {key: settings[key].value if key in settings else default for key, default in DEFAULTS.items()}
    value = {key: v for key, v in given.items() if v is not None}
    if len(value) < len(given):
        return None  # a keyword set to a computed value
    beta, iterations = _number(value[BETA]), _number(value[ITERATIONS])
    correction = {"True": True, "False": False}.get(value[CORRECTION])
    aggregation = AGGREGATIONS.get(value[LOSS_TYPE])
    if beta is None or beta <= 0 or iterations is None or correction is None or aggregation is None:
        return None
    if value[LEVEL] != "token":
        return None
    if iterations > 1:  # coef_1 = pi / pi_old is then also a token-level importance ratio
        sampling = Sampling.TOKEN_IS if correction else Sampling.OFF_POLICY
    else:
        sampling = Sampling.ON_POLICY
    estimator = Estimator.RATIO_K3 if correction else Estimator.K3
    config = Config(loss=estimator, aggregation=aggregation, sampling=sampling)
    anchor = settings[BETA]  # set, since the KL is on only for beta > 0
    flags = ", ".join(f"{key}={value[key]}" + ("" if key in settings else " (default)") for key in KEYS)
    return Judged(config, anchor, flags, {"KL007": settings[LOSS_TYPE]} if LOSS_TYPE in settings else {})


def fix(rule: str) -> str:
    return FIXES.get(rule, _OWN_LOSS)
