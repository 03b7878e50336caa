"""ROLL's KL settings (alibaba/ROLL) as catalog configurations, read from the YAML config a pipeline starts
from (`examples/start_rlvr_pipeline.py --config_name X`, `start_agentic_pipeline.py`), with the defaults and
the code of the project's copy of `roll/` where it carries one (ROLL is not on the package index: its users
work in a copy), else those of ROLL's main branch (read at 8eb27cc, 2026-08; copies taken since its first releases differ only
where said below).

- `use_kl_loss` with `kl_loss_coef` (default 0: no term) adds coef * k3 to the loss: every actor worker calls
  `compute_approx_kl(..., kl_penalty="k3")`, ref / pi - 1 - log(ref / pi) clamped to [-10, 10], aggregated as
  the policy loss is, by `loss_agg_mode`;
- `add_token_level_kl` (default false) subtracts `init_kl_coef` (default 0.2, adapted towards `target_kl`
  where set) times the `kl_penalty` estimate (kl: k1, abs: |log-ratio|, mse: k2, full: the exact KL), detached,
  from the token rewards, which every advantage estimator (gae, reinforce, grpo) turns into returns to go
  with `gamma` (default 1);
- `loss_agg_mode`: token-mean (over the batch's tokens), seq-mean-token-mean (each sequence's token mean:
  1/L), seq-mean-token-sum (each sequence's token sum; copies taken before August 2025, ahead of v0.1.0, take
  a token mean there, `masked_mean`: the copy's code decides), seq-mean-token-sum-norm (the sum over the padded length);
- one rollout of `rollout_batch_size` x `num_return_sequences_in_group` samples is split over the
  data-parallel ranks (the GPUs of `actor_train.device_mapping` over tensor x pipeline x context parallel for
  Megatron, over the Ulysses size for FSDP2) into optimizer steps of `per_device_train_batch_size` x
  `gradient_accumulation_steps` (the Hugging Face defaults 8 and 1; the agentic pipeline pads a rollout that does
  not fill its last step, unless `batch_adjust_mode` says otherwise), `ppo_epochs` times: a second step trains
  the KL of the later ones on an older policy's samples (rows 22-23), as does `async_generation_ratio` above 0
  (the next rollouts generated while the policy trains on the last).
"""

from __future__ import annotations

import ast
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from klaudit.catalog import Aggregation, Config, Estimator, Returns, Sampling
from klaudit.frameworks.settings import Judged, Setting, number, shown, truthy
from klaudit.text import file_text

NAME = "ROLL"
FUNCTIONALS = "roll/utils/functionals.py"  # a project carrying ROLL's package holds it
CONFIG_FILES = {"agentic": ("roll/pipeline/agentic/agentic_config.py", "roll/configs/base_config.py"),
                "rlvr": ("roll/pipeline/rlvr/rlvr_config.py", "roll/configs/base_config.py")}
USE_LOSS, LOSS_COEF, TOKEN_KL, REWARD_COEF, PENALTY = (
    "use_kl_loss", "kl_loss_coef", "add_token_level_kl", "init_kl_coef", "kl_penalty")
AGGREGATION, EPOCHS, GAMMA, ROLLOUT_BATCH, GROUP = (
    "loss_agg_mode", "ppo_epochs", "gamma", "rollout_batch_size", "num_return_sequences_in_group")
KL_KEYS = (USE_LOSS, LOSS_COEF, TOKEN_KL)
PADDING = "batch_adjust_mode"  # the agentic pipeline's: "copy" (its default) pads a rollout to whole steps
AHEAD = "async_generation_ratio"  # above 0: the next rollouts are generated while the policy trains on the last
RETURNED = "actor_infer.generating_args.num_return_sequences"  # the agentic configs' group size
DEVICES, STRATEGY = "actor_train.device_mapping", "actor_train.strategy_args.strategy_name"
PARALLEL = tuple(f"actor_train.strategy_args.strategy_config.{kind}_model_parallel_size"
                 for kind in ("tensor", "pipeline")) + ("actor_train.strategy_args.strategy_config.context_parallel_size",)
ULYSSES = "actor_train.model_args.ulysses_size"
PER_DEVICE, ACCUMULATION = ("actor_train.training_args.per_device_train_batch_size",
                            "actor_train.training_args.gradient_accumulation_steps")
TRAINING_DEFAULTS = {PER_DEVICE: "8", ACCUMULATION: "1", GROUP: "1", RETURNED: "1"}  # Hugging Face's, ROLL's
MAIN_DEFAULTS = {USE_LOSS: "False", LOSS_COEF: "0", TOKEN_KL: "False", REWARD_COEF: "0.2", PENALTY: "kl",
                 AGGREGATION: "seq-mean-token-mean", EPOCHS: "1", GAMMA: "1"}
ESTIMATORS = {"kl": Estimator.K1, "abs": Estimator.ABS, "mse": Estimator.K2, "full": Estimator.FULL}
AGGREGATIONS = {"token-mean": Aggregation.BATCH_MEAN, "seq-mean-token-mean": Aggregation.SEQ_MEAN,
                "seq-mean-token-sum-norm": Aggregation.CONSTANT}
TOKEN_SUM = "seq-mean-token-sum"  # a token sum per sequence (SUM), or a token mean in the early copies

_TO_REWARD = (f"{USE_LOSS}: false with {TOKEN_KL}: true, {PENALTY}: kl and {AGGREGATION}: token-mean (k1 in the "
              f"reward, unbiased); the reward sums the KL over the tokens where the loss averaged it: set "
              f"{REWARD_COEF} to {LOSS_COEF} over about the mean response length")
ONE_STEP = (f"one optimizer step per rollout: {EPOCHS}: 1 and {ROLLOUT_BATCH} x {GROUP} equal to the data-parallel "
            f"size x {PER_DEVICE.rsplit('.', 1)[-1]} x {ACCUMULATION.rsplit('.', 1)[-1]}, with {AHEAD}: 0")
FIXES = {"KL001": _TO_REWARD, "KL002": _TO_REWARD, "KL003": _TO_REWARD, "KL009": _TO_REWARD, "KL010": _TO_REWARD,
         "KL004": f"{PENALTY}: kl (k1 values in the reward, unbiased)",
         "KL007": f"{AGGREGATION}: token-mean (the same scale for a KL about as long as the responses)",
         "KL008": ONE_STEP}


@dataclass(frozen=True)
class Copy:
    """What a project's copy of ROLL decides: its config classes' defaults, and whether its
    seq-mean-token-sum takes each sequence's token sum (the main branch) or its token mean."""

    defaults: Mapping[str, str]
    token_sum: bool = True


MAIN = Copy(MAIN_DEFAULTS)


def is_config(settings: Mapping[str, Setting]) -> bool:
    """A ROLL pipeline config: its workers' sections (`actor_train`, `actor_infer`) and a KL key of its own."""
    return (any(key in settings for key in KL_KEYS) and any(key.startswith("actor_train.") for key in settings)
            and any(key.startswith("actor_infer.") for key in settings))


def pipeline(settings: Mapping[str, Setting]) -> str:
    """The config class a file is read into: the agentic pipeline's (it names environments) or RLVR's."""
    return "agentic" if any(key.startswith(("custom_envs.", "train_env_manager.")) for key in settings) else "rlvr"


def read_copy(folder: Path | None, kind: str) -> Copy:
    """The defaults and the token-sum aggregation of the copy of ROLL in `folder` (None: the main branch's)."""
    if folder is None:
        return MAIN
    defaults: dict[str, str] = {}
    for relative in CONFIG_FILES[kind]:  # the pipeline's class, then its base; a default in parentheses too
        text = _read(folder / relative)  # (`loss_agg_mode: Literal[...] = (\n field(default=...))`, which
        for key in MAIN_DEFAULTS:  # klaudit.frameworks.options does not read)
            found = re.search(rf"^[ \t]*{key}[ \t]*:[^=\n]*=\s*\(?\s*field\(\s*default\s*=\s*([^,)\s]+)", text, re.MULTILINE)
            if found and key not in defaults:
                defaults[key] = found.group(1).strip("\"'")
    branch = re.search(rf"==\s*[\"']{TOKEN_SUM}[\"']\s*:\s*\n\s*\w+\s*=\s*(masked_\w+)", _read(folder / FUNCTIONALS))
    return Copy({**MAIN_DEFAULTS, **defaults}, token_sum=branch is None or branch.group(1) != "masked_mean")


def _read(path: Path) -> str:
    try:
        return file_text(path)
    except OSError:
        return ""


def aggregation_of(mode: str, copy: Copy) -> Aggregation | None:
    """What `loss_agg_mode` `mode` does to the policy loss in `copy` (seq-mean-token-sum: each sequence's token
    sum, or its token mean in the early copies); None for a mode of no catalog aggregation."""
    if mode == TOKEN_SUM:
        return Aggregation.SUM if copy.token_sum else Aggregation.SEQ_MEAN
    return AGGREGATIONS.get(mode)


def judge(settings: Mapping[str, Setting], copy: Copy = MAIN) -> Judged | None:
    """The KL configuration a ROLL config selects; None when the KL is off or only logged, or when a deciding
    value is not a literal (an interpolation)."""
    given = {key: settings[key].value if key in settings else copy.defaults.get(key) for key in MAIN_DEFAULTS}
    use_loss, token_kl = truthy(given[USE_LOSS] or ""), truthy(given[TOKEN_KL] or "")
    loss_coef, reward_coef, gamma = (number(given[key] or "") for key in (LOSS_COEF, REWARD_COEF, GAMMA))
    mode = given[AGGREGATION] or ""
    aggregation = aggregation_of(mode, copy)
    if None in (use_loss, token_kl, loss_coef, reward_coef) or aggregation is None:
        return None
    steps = _steps_per_rollout(settings, given)
    ahead = AHEAD in settings and (number(settings[AHEAD].value or "") or 0) > 0
    stale = ahead or steps is not None and steps > 1
    loss = Estimator.LOW_VAR_KL if use_loss and loss_coef else None
    reward = ESTIMATORS.get(given[PENALTY] or "") if token_kl and reward_coef else None
    if (token_kl and reward_coef and (reward is None or gamma != 1)) or (loss is None and reward is None):
        return None  # no KL term, a KL computed for the logs only, or discounted returns (no catalog row)
    config = Config(loss=loss, reward=reward, returns=Returns.TO_GO, aggregation=aggregation,
                    sampling=(Sampling.OFF_POLICY if loss is not None else Sampling.TOKEN_IS) if stale
                    else Sampling.ON_POLICY)  # a KL reward meets the PPO token ratio only
    named = (([USE_LOSS, LOSS_COEF] if loss is not None else []) + ([TOKEN_KL, REWARD_COEF, PENALTY] if reward is not None
                                                                   else []) + [AGGREGATION])
    anchor = (settings.get(USE_LOSS) or settings[LOSS_COEF] if loss is not None
              else settings.get(PENALTY) or settings.get(TOKEN_KL) or settings[REWARD_COEF])
    flags = ", ".join(shown(key, given[key] or "", settings.get(key)) for key in named)
    if mode == TOKEN_SUM:
        flags += " (each sequence's token " + ("sum" if copy.token_sum else "mean in this copy") + ")"
    anchors = {"KL007": settings.get(AGGREGATION, anchor), "KL004": settings.get(PENALTY, settings.get(TOKEN_KL, anchor))}
    if steps is not None and steps > 1:
        flags += f", {steps:g} optimizer steps per rollout"
        anchors["KL008"] = settings.get(EPOCHS, anchor) if number(given[EPOCHS] or "") != 1 else settings.get(ROLLOUT_BATCH, anchor)
    if ahead:
        flags += f", {AHEAD}={settings[AHEAD].value}"
        anchors.setdefault("KL008", settings[AHEAD])
    return Judged(config, anchor, flags, anchors)


def _steps_per_rollout(settings: Mapping[str, Setting], given: Mapping[str, str | None]) -> float | None:
    """Optimizer steps per rollout: epochs x the samples of a data-parallel rank over the samples of a step;
    the epochs alone when a size is not known (not a literal, or no device mapping read)."""
    epochs = number(given[EPOCHS] or "")
    if epochs is None:
        return None
    sizes = {key: number(settings[key].value or "") if key in settings else number(default)
             for key, default in TRAINING_DEFAULTS.items()}
    rollout = number(settings[ROLLOUT_BATCH].value or "") if ROLLOUT_BATCH in settings else None
    ranks, group = _data_parallel(settings), sizes[GROUP] if GROUP in settings else sizes[RETURNED]
    per_device, accumulation = sizes[PER_DEVICE], sizes[ACCUMULATION]
    if rollout is None or ranks is None or group is None or not per_device or not accumulation:
        return epochs
    steps = rollout * group / ranks / (per_device * accumulation)
    padded = pipeline(settings) == "agentic" and (settings[PADDING].value if PADDING in settings else "copy") == "copy"
    return epochs * max(math.ceil(steps) if padded else math.floor(steps), 1)


_RANGE = re.compile(r"^\s*list\(\s*range\(\s*(\d+)\s*(?:,\s*(\d+)\s*)?(?:,\s*(\d+)\s*)?\)\s*\)\s*$")
_LIST = re.compile(r"^\s*\[\s*\d+(?:\s*,\s*\d+)*\s*,?\s*\]\s*$")


def _data_parallel(settings: Mapping[str, Setting]) -> float | None:
    """The actor's data-parallel size: its GPUs (`list(range(0, 8))` or `[0, 1, ...]`) over its model
    parallelism; None when the mapping is not one of those literals."""
    mapping = settings[DEVICES].value or "" if DEVICES in settings else ""
    ranged = _RANGE.match(mapping)
    if ranged:
        devices = len(range(*(int(bound) for bound in ranged.groups() if bound is not None)))
    elif _LIST.match(mapping):
        devices = len(ast.literal_eval(mapping))
    else:
        return None
    strategy = settings[STRATEGY].value if STRATEGY in settings else None
    split = (list(PARALLEL) if strategy == "megatron_train" else
             [ULYSSES] if strategy in ("fsdp2_train", "fsdp2_infer") else [])
    divisor = 1.0
    for key in split:
        size = number(settings[key].value or "") if key in settings else 1.0
        if size is None:
            return None
        divisor *= size
    return devices / divisor if devices >= divisor else None
