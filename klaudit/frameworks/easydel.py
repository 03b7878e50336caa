"""EasyDeL's GRPO KL settings (erfanzar/EasyDeL, JAX) as catalog configurations (read from the 0.1.0 to 0.3.0 wheels).

`GRPOConfig` (`easydel.GRPOConfig`, usually `ed.GRPOConfig`; from 0.2 also GFPOConfig, RLVRConfig,
AgenticMoshPitConfig and GSPOConfig, whose trainers run the same loss) weights the k3 estimate of the live log-probabilities,
exp(ref - logp) - (ref - logp) - 1, by `beta` (default 0.04; 0 adds nothing) and adds it to every token's loss, where
it is differentiated: k3 as a loss. The rollout is generated for each step and the old log-probabilities are the
current ones under a stop-gradient, so the samples are the policy's own (`num_iterations` is declared but never
read).

- Up to 0.1.4.1 the per-token loss is reduced per completion over its own length, then averaged: each completion
  weighted by 1/L.
- From 0.2.0 `loss_type` (default "dapo") picks the reduction: "grpo" per completion as before; "bnpo" over the
  batch's tokens; "dapo" and "cispo" over the tokens of the whole batch (`num_items_in_batch`); "dr_grpo" by a
  constant, the batch size times the completion length. GSPOConfig defaults beta to 0.0 and loss_type to "grpo".

The command-line scripts of 0.1.x (`python -m easydel.scripts.finetune.gsm8k_grpo --beta 0.04`, and
numinamath_grpo) parse GRPOConfig's fields as flags; 0.2.0 removed them, so a launch of one runs 0.1.x.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from klaudit.catalog import Aggregation, Config, Estimator, Sampling
from klaudit.frameworks.settings import Judged, Setting, number, shown
from klaudit.frameworks.versions import Assumed, at_least

NAME = "easydel"
BETA, LOSS_TYPE = "beta", "loss_type"
KEYS = (BETA, LOSS_TYPE)
# GRPOConfig and the configurations of its trainer's subclasses (0.2+), which run the same loss, with the defaults each
# changes: GSPO weighs no KL by default and reduces per completion
CLASSES: dict[str, dict[str, str]] = {"GRPOConfig": {}, "GFPOConfig": {}, "RLVRConfig": {}, "AgenticMoshPitConfig": {},
                                      "GSPOConfig": {BETA: "0.0", LOSS_TYPE: "grpo"}}
LOSS_TYPES_FROM = "0.2"  # the release that brought `loss_type`; before it the reduction was per completion
LAST_WITH_SCRIPTS = "0.1"  # the last release (of KNOWN) that ships easydel.scripts.finetune
# `python -m easydel.scripts.finetune.gsm8k_grpo`, also written into a command string (`CMD="python -m ..."`)
LAUNCH = re.compile(r"\beasydel[./]scripts[./]finetune[./]\w*grpo\b")
AGGREGATIONS = {"grpo": Aggregation.SEQ_MEAN, "bnpo": Aggregation.BATCH_MEAN, "dapo": Aggregation.BATCH_MEAN,
                "cispo": Aggregation.BATCH_MEAN, "dr_grpo": Aggregation.CONSTANT}

_OWN_LOSS = ("EasyDeL's GRPO has no setting for an unbiased KL gradient: set beta=0.0 and subclass GRPOTrainer with a "
             "loss whose KL term is k1 weighted by the stop-gradient sum of the later tokens' k1 (R-A of "
             "docs/kl-math.md)")
FIXES = {"KL007": 'loss_type="dapo" (EasyDeL 0.2+): the batch token-mean keeps the scale'}
FLAG_FIXES = {"KL007": (LOSS_TYPE, "dapo")}
NO_FLAG_FIX = "EasyDeL has no setting for an unbiased KL gradient: the fix is code of your own (see the help)"


def defaults(assumed: Assumed, name: str = "GRPOConfig") -> dict[str, str]:
    """The defaults of the configuration class `name` in the release `assumed`; no `loss_type` ("") before 0.2.0."""
    return {BETA: "0.04", LOSS_TYPE: "dapo" if at_least(assumed, LOSS_TYPES_FROM) else "", **CLASSES.get(name, {})}


def judge(settings: Mapping[str, Setting], assumed: Assumed, anchor: Setting, name: str = "GRPOConfig") -> Judged | None:
    """The KL configuration a configuration class `name` with `settings` selects over the defaults of the release
    `assumed`; None where the KL is off or a deciding value is not known. `anchor` is where to report when `beta` is
    not set."""
    values = {key: settings[key].value if key in settings else default
              for key, default in defaults(assumed, name).items()}
    given = {key: value for key, value in values.items() if value is not None}
    if len(given) < len(values):
        return None  # a deciding key set to a computed value
    beta = number(given[BETA])
    aggregation = AGGREGATIONS.get(given[LOSS_TYPE]) if given[LOSS_TYPE] else Aggregation.SEQ_MEAN
    if beta is None or beta <= 0 or aggregation is None:
        return None
    config = Config(loss=Estimator.K3, aggregation=aggregation, sampling=Sampling.ON_POLICY)
    deciding = (BETA, LOSS_TYPE) if given[LOSS_TYPE] else (BETA,)
    flags = ", ".join(shown(key, given[key], settings.get(key)) for key in deciding)
    if not given[LOSS_TYPE]:
        flags += ", each completion's token mean (no loss_type before 0.2)"
    where = {"KL007": settings[LOSS_TYPE]} if LOSS_TYPE in settings else {}
    return Judged(config, settings.get(BETA, anchor), flags, where)


def launched_release(assumed: Assumed) -> Assumed:
    """The release a launch of a finetune script runs: the one assumed, where it still ships the scripts; else 0.1."""
    if at_least(assumed, LOSS_TYPES_FROM):
        return Assumed(LAST_WITH_SCRIPTS, "the finetune scripts ship up to 0.1")
    return assumed


def fix(rule: str, _row_fix: str = "") -> str:
    return FIXES.get(rule, _OWN_LOSS)
