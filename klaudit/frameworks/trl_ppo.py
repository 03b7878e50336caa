"""TRL's PPO KL settings (`PPOConfig`) as catalog configurations: the estimator its trainer subtracts
from the token rewards before GAE (the reward placement with returns to go).

The keyword a configuration sets names the API it targets:

- `kl_penalty` (TRL up to 0.11, the first PPOTrainer): "kl" is k1 = logp - ref (row 6, unbiased),
  "abs" |logp - ref| (row 9), "mse" 0.5 (logp - ref)^2, k2 (row 8), "full" the exact per-step KL over
  the vocabulary, detached (row 10); `init_kl_coef` 0 adds none;
- `kl_estimator` (from 0.17, the rewritten PPOTrainer): "k1" (the default) or "k3" =
  exp(ref - logp) - 1 - (ref - logp) (row 7); `kl_coef` 0 adds none.

A configuration that sets neither keeps k1, which is right: only a biased estimator is reported. The
several PPO epochs over one rollout pass the KL reward through the PPO ratio like the task reward, judged
on-policy as the lint of TRL's code judges it.
"""

from __future__ import annotations

from collections.abc import Mapping

from klaudit.catalog import Config, Estimator, Returns
from klaudit.frameworks.settings import Judged, Setting, number, shown

NAME = "TRL PPO"
CLASSES = ("PPOConfig",)
LEGACY, ESTIMATOR = "kl_penalty", "kl_estimator"
COEFFICIENTS = {LEGACY: "init_kl_coef", ESTIMATOR: "kl_coef"}
KEYS = (LEGACY, ESTIMATOR, *COEFFICIENTS.values())
ESTIMATORS = {LEGACY: {"kl": Estimator.K1, "abs": Estimator.ABS, "mse": Estimator.K2, "full": Estimator.FULL},
              ESTIMATOR: {"k1": Estimator.K1, "k3": Estimator.K3}}
FIXES = {"KL004": "the k1 estimate in the rewards (kl_estimator=\"k1\", or kl_penalty=\"kl\" before TRL 0.12): "
                  "unbiased, at the same scale"}
NO_FLAG_FIX = "the estimator keyword is not set to a literal here: set it to k1 by hand"


def judge(settings: Mapping[str, Setting]) -> Judged | None:
    """The KL configuration a PPOConfig call sets, None when it keeps k1, turns the KL off, or is undecidable."""
    key = next((key for key in (ESTIMATOR, LEGACY) if key in settings), None)
    value = settings[key].value if key is not None else None
    if key is None or value is None:
        return None
    estimator = ESTIMATORS[key].get(value)
    coefficient = settings.get(COEFFICIENTS[key])
    if estimator is None or (coefficient is not None and number(coefficient.value or "") == 0.0):
        return None
    config = Config(reward=estimator, returns=Returns.TO_GO)
    named = [(key, value, settings[key])]
    if coefficient is not None and coefficient.value is not None:
        named.append((COEFFICIENTS[key], coefficient.value, coefficient))
    flags = ", ".join(shown(*item) for item in named)
    return Judged(config, settings[key], flags, {"KL004": settings[key]})


def flag_fixes(settings: Mapping[str, Setting]) -> dict[str, tuple[str, str]]:
    """KL004's fix is the k1 value of the keyword the configuration uses."""
    return {"KL004": (ESTIMATOR, "k1")} if ESTIMATOR in settings else {"KL004": (LEGACY, "kl")}


def fix(rule: str, row_fix: str = "") -> str:
    return FIXES.get(rule, row_fix)
