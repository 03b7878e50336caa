"""TRL's PPO KL settings (`PPOConfig`) as catalog configurations: the estimator its trainer subtracts
from the token rewards before GAE (the reward placement with returns to go).

The keywords a configuration sets name the API it targets (the first PPOConfig's own fields, `model_name` or
`log_with`, name the first); one that names neither's targets the API of the TRL release the project states
(0.12's from 0.12), else nobody knows which. From 0.29 only `trl.experimental.ppo` holds PPOConfig: imported from
`trl` under such a release, it fails before anything trains.

- `kl_penalty` (TRL up to 0.11, the first PPOTrainer): "kl" is k1 = logp - ref (row 6, unbiased),
  "abs" |logp - ref| (row 9), "mse" 0.5 (logp - ref)^2, k2 (row 8), "full" the exact per-step KL over
  the vocabulary, detached (row 10); `init_kl_coef` 0 adds none;
- `kl_estimator` (from 0.17, the rewritten PPOTrainer): "k1" (the default) or "k3" =
  exp(ref - logp) - 1 - (ref - logp) (row 7); `kl_coef` 0 adds none.

A configuration that sets neither keeps k1, which is right on fresh samples. Both APIs train one batch of
rollouts over several optimizer steps: `ppo_epochs` (default 4) x `batch_size` (128) over `mini_batch_size`
(128) x `gradient_accumulation_steps` (1) before 0.12 (256 over 1 up to 0.7.10, where the project names such a
release), `num_ppo_epochs` (default 4) x `num_mini_batches` (1) since. The KL reward, computed once per batch,
then meets only the PPO token ratio on the later steps (row 23, KL008), whatever the estimator; one step per batch
is on-policy. Every epoch takes a step at least, so epochs the lint reads bound the steps from below when a batch
count is computed (LLaMA-Factory's `batch_size=backward_batch_size * finetuning_args.ppo_buffer_size`); epochs it
cannot read decide nothing. The policy loss is a token mean over each backward pass's responses; a pass of one
response (`per_device_train_batch_size=1`, `mini_batch_size=1` before 0.12, its default up to 0.7.10) divides it
by that response's length (row 21, KL007). A call that sets fields of both APIs (`output_dir` beside
`init_kl_coef`) raises a TypeError under every release and trains nothing; so does a call setting the rewritten API's fields (`kl_coef`) in a module that
drives the first PPOTrainer (`ppo_trainer.step(...)`), and the other way round. A script that reads PPOConfig from its command line, run with no flags by any launch of the project, trains at
the defaults: the finding is reported at its `PPOTrainer(...)` call.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from klaudit.catalog import Aggregation, Config, Estimator, Returns, Sampling
from klaudit.frameworks.settings import Judged, Setting, more_responses_per_micro_batch, number, shown
from klaudit.frameworks.versions import Assumed, at_least, names_at_least

NAME = "TRL PPO"
CLASSES = ("PPOConfig",)
LEGACY, ESTIMATOR = "kl_penalty", "kl_estimator"
COEFFICIENTS = {LEGACY: "init_kl_coef", ESTIMATOR: "kl_coef"}
# how many optimizer steps one batch of rollouts feeds, by API (`_steps`), with the defaults of each
LEGACY_STEPS = {"ppo_epochs": "4", "batch_size": "128", "mini_batch_size": "128"}
# the first PPOTrainer's defaults up to 0.7.10: 256 rollouts a batch, optimized one response at a time
EARLY_STEPS, EARLY_UNTIL = {"ppo_epochs": "4", "batch_size": "256", "mini_batch_size": "1"}, "0.7.11"
ACCUMULATION = "gradient_accumulation_steps"  # the legacy update batch is mini_batch_size x this
STEPS = {"num_ppo_epochs": "4", "num_mini_batches": "1"}
# the responses of one backward pass, whose tokens the policy loss averages (`masked_mean` over the micro-batch):
# one response makes that a per-response token mean, 1/L on the KL reward its advantages carry (row 21)
MICRO_BATCH = {LEGACY: "mini_batch_size", ESTIMATOR: "per_device_train_batch_size"}
# fields only the first PPOConfig has (TRL up to 0.11): a call setting one targets that API
LEGACY_ONLY = ("model_name", "log_with", "query_dataset", "tracker_project_name", "adap_kl_ctrl", "target_kl",
               "forward_batch_size", "early_stopping", "use_score_scaling", "use_score_norm")
API_KEYS = {LEGACY: (LEGACY, COEFFICIENTS[LEGACY], *LEGACY_STEPS, *LEGACY_ONLY),
            ESTIMATOR: (ESTIMATOR, COEFFICIENTS[ESTIMATOR], *STEPS)}
KEYS = (LEGACY, ESTIMATOR, *COEFFICIENTS.values(), *LEGACY_STEPS, ACCUMULATION, *STEPS, MICRO_BATCH[ESTIMATOR],
        *LEGACY_ONLY)
ESTIMATORS = {LEGACY: {"kl": Estimator.K1, "abs": Estimator.ABS, "mse": Estimator.K2, "full": Estimator.FULL},
              ESTIMATOR: {"k1": Estimator.K1, "k3": Estimator.K3}}
FIXES = {"KL004": "the k1 estimate in the rewards (kl_estimator=\"k1\", or kl_penalty=\"kl\" before TRL 0.12): "
                  "unbiased, at the same scale",
         "KL008": "one optimizer step per batch of rollouts (num_ppo_epochs=1 with num_mini_batches=1; before TRL "
                  "0.12 ppo_epochs=1 with mini_batch_size x gradient_accumulation_steps = batch_size), or the KL out "
                  "of the reward, into the loss with per-decision importance weights: "
                  "klaudit.estimators.kl_penalty(log_probs, ref_log_probs, mask, old_logprobs=...).loss (R-F)"}
# fields of the first PPOConfig (up to TRL 0.11) that the rewritten one, a TrainingArguments from 0.12, lacks, and fields
# of the rewritten one the first lacks: a call setting one of each raises a TypeError under every release (code written
# against both APIs at once)
_FIRST_ONLY = (LEGACY, COEFFICIENTS[LEGACY], "ppo_epochs", "target", "horizon", *LEGACY_ONLY)
_REWRITTEN_ONLY = (ESTIMATOR, COEFFICIENTS[ESTIMATOR], *STEPS, "output_dir", "per_device_train_batch_size",
                   "num_train_epochs")
_ONLY_IN = {LEGACY: _FIRST_ONLY, ESTIMATOR: _REWRITTEN_ONLY}
# What a module does with its PPOTrainer names the trainer's API: the first one's `step` and `generate` methods, which
# the rewritten one (a transformers Trainer) lacks, or the rewritten one's keywords, which the first one's
# constructor lacks (`tokenizer` names neither: 0.13 and 0.14 take it for `processing_class`)
_BUILT = re.compile(r"^[ \t]*(\w+)[ \t]*=[ \t]*(?:trl\.)?PPOTrainer\s*\(", re.MULTILINE)
_REWRITTEN_KEYWORDS = re.compile(r"\bPPOTrainer\s*\((?:[^()]|\([^()]*\))*?\b(?:processing_class|train_dataset|reward_model"
                                 r"|value_model)\s*=(?!=)")
NO_FLAG_FIX = "the estimator keyword is not set to a literal here: set it to k1 by hand"
# A script that parses PPOConfig from its command line (`HfArgumentParser((ScriptArguments, PPOConfig,
# ModelConfig))`, TRL's examples/scripts/ppo/ppo.py and its copies) and that no launch of the project passes
# flags: run as written, the configuration is the release's defaults (4 PPO epochs of one mini-batch each)
COMMAND_LINE = "PPOConfig from the command line, at its defaults (num_ppo_epochs=4, num_mini_batches=1)"


def judge(settings: Mapping[str, Setting], where: Setting, api: str | None = None,
          defaults: str = "the defaults", release_api: str | None = None,
          trainer_api: str | None = None, first_defaults: Mapping[str, str] = LEGACY_STEPS,
          micro_default: str | None = None) -> Judged | None:
    """The KL configuration a PPOConfig call at `where` sets, None when it turns the KL off or is undecidable;
    `api`: the API the configuration is known to target where its keys do not say (ESTIMATOR for one read from
    the command line by a script written for the rewritten PPOTrainer); `release_api`: the API of the TRL release
    the project states (`api_of`), for a call that names no key of either; `defaults`: how the finding names the
    configuration where it sets no key; `trainer_api`: the API of the PPOTrainer the module drives (`trainer_api`);
    `first_defaults`: the first API's step counts in the release the project states (`first_defaults`);
    `micro_default`: the rewritten API's responses per backward pass where a wrapper changes TRL's default
    (ms-swift's 1).
    A call no release accepts (`_FIRST_ONLY` and `_REWRITTEN_ONLY` keys together), or none that also has the
    module's PPOTrainer, builds nothing."""
    if any(key in settings for key in _FIRST_ONLY) and any(key in settings for key in _REWRITTEN_ONLY):
        return None
    if trainer_api is not None and any(key in settings for key in _ONLY_IN[ESTIMATOR if trainer_api == LEGACY else LEGACY]):
        return None
    api = api or next((api for api in (ESTIMATOR, LEGACY) if any(key in settings for key in API_KEYS[api])),
                      release_api)
    if api is None:
        return None  # a call naming no key of either API: which release it targets is unknown
    key = api if api is not None and api in settings else None
    value = settings[key].value if key is not None else ("kl" if api == LEGACY else "k1")
    coefficient = settings.get(COEFFICIENTS[api])
    estimator = ESTIMATORS[api].get(value or "")
    if estimator is None or (coefficient is not None and number(coefficient.value or "") == 0.0):
        return None
    steps, at_least = _steps(settings, api, first_defaults)
    micro = settings.get(MICRO_BATCH[api])  # a 1 at the call, or the default of the option it is set to
    default_micro = first_defaults["mini_batch_size"] if api == LEGACY else micro_default
    per_response = number((micro.value if micro is not None else default_micro) or "") == 1
    config = Config(reward=estimator, returns=Returns.TO_GO, sampling=Sampling.TOKEN_IS if steps > 1 else
                    Sampling.ON_POLICY, aggregation=Aggregation.SEQ_MEAN if per_response else Aggregation.SUM)
    if estimator is Estimator.K1 and steps <= 1 and not per_response:
        return None  # k1 in the reward, on fresh samples: right
    named = [(key, value or "", settings[key])] if key is not None else []
    if coefficient is not None and coefficient.value is not None:
        named.append((COEFFICIENTS[api], coefficient.value, coefficient))
    counts = [name for name in (*LEGACY_STEPS, ACCUMULATION, *STEPS) if name in settings]
    named += [(name, settings[name].value or "?", settings[name]) for name in counts]
    flags = ", ".join(shown(*item) for item in named) or defaults
    if steps > 1:
        flags += f", {'at least ' if at_least else ''}{steps:g} optimizer steps per batch"
    if per_response:
        default = "" if micro is not None else f" by default before TRL {EARLY_UNTIL}" if api == LEGACY \
            else " by default"
        flags += f", {MICRO_BATCH[api]}=1{default} (the policy loss's token mean over one response)"
    epoch_keys = ("ppo_epochs", "num_ppo_epochs")
    one_epoch = {name for name in epoch_keys if name in settings
                 and number(settings[name].value or "") == 1}
    stale_by = next((settings[name] for name in counts if name not in one_epoch  # what makes the steps
                     and (name in epoch_keys or not at_least)), where)
    anchor = settings[key] if key is not None else where
    anchors = {"KL004": anchor, "KL008": stale_by}  # the fixer edits the anchors named
    helps = {}
    if per_response:
        anchors["KL007"] = micro or where
        helps["KL007"] = more_responses_per_micro_batch(MICRO_BATCH[api])
    return Judged(config, anchor, flags, anchors, helps)


# From 0.29 only `trl.experimental.ppo` holds PPOConfig: `from trl import PPOConfig` (deprecated since 0.26) fails
MOVED_TO_EXPERIMENTAL = "0.29"
_FROM_TRL = re.compile(r"^[ \t]*from[ \t]+trl(?:\.trainer[\w.]*)?[ \t]+import[ \t]+(?:\([^)]*?|[^\n]*?)\bPPOConfig\b"
                       r"|\btrl\.PPOConfig\b", re.MULTILINE)


def import_fails(source: str, release: Assumed) -> bool:
    """Whether a module imports PPOConfig from `trl` itself (or `trl.trainer`) under a release the project states
    that no longer has it there: the import raises before anything trains."""
    return release.stated and at_least(release, MOVED_TO_EXPERIMENTAL) and _FROM_TRL.search(source) is not None


def trainer_api(source: str) -> str | None:
    """The API of the PPOTrainer a module drives, where its text says: LEGACY where the object it builds takes
    `.step(...)` or `.generate(...)`, ESTIMATOR where it is built with the rewritten trainer's keywords."""
    first = any(re.search(rf"\b{re.escape(name)}\.(?:step|generate)\s*\(", source) for name in _BUILT.findall(source))
    rewritten = _REWRITTEN_KEYWORDS.search(source) is not None
    return LEGACY if first and not rewritten else ESTIMATOR if rewritten and not first else None


def api_of(release: Assumed) -> str | None:
    """The PPOConfig API of a TRL release the project states (a pin, a checkout's version): the rewritten
    PPOTrainer's from 0.12, the first one's before; None for the release klaudit assumes, which says nothing of
    the code's age."""
    if not release.stated:
        return None
    return ESTIMATOR if names_at_least(release, "0.12") else LEGACY


def first_defaults(release: Assumed) -> Mapping[str, str]:
    """The first PPOTrainer's step counts by default in `release`: 4 epochs of 256 rollouts one response at a time
    up to 0.7.10 (where the project states such a release), 4 epochs of one mini-batch of 128 after."""
    return EARLY_STEPS if release.stated and not names_at_least(release, EARLY_UNTIL) else LEGACY_STEPS


def _steps(settings: Mapping[str, Setting], api: str, defaults: Mapping[str, str]) -> tuple[float, bool]:
    """Optimizer steps per batch of rollouts, and whether that is a lower bound: epochs x mini-batches from
    TRL 0.12, epochs x batch_size over mini_batch_size x gradient_accumulation_steps before (4 epochs of one
    mini-batch by default in both). Each epoch takes at least one step, so where the epochs are read but a
    batch count is not (`batch_size=backward_batch_size * args.ppo_buffer_size`), the epochs are the bound;
    where the epochs are not read, one step (it decides nothing)."""
    if api == ESTIMATOR:
        epochs, batches = (_count(settings, key, default) for key, default in STEPS.items())
        if epochs is None:
            return 1.0, False
        return (epochs * batches, False) if batches is not None else (epochs, True)
    epochs, batch, mini, accumulation = (_count(settings, key, default)
                                         for key, default in {**defaults, ACCUMULATION: "1"}.items())
    if epochs is None:
        return 1.0, False
    if batch is None or not mini or not accumulation:
        return epochs, True
    return epochs * max(batch / (mini * accumulation), 1.0), False


def _count(settings: Mapping[str, Setting], key: str, default: str) -> float | None:
    return number(settings[key].value or "") if key in settings else number(default)


def flag_fixes(settings: Mapping[str, Setting]) -> dict[str, tuple[str, str]]:
    """KL004's fix is the k1 value of the keyword the configuration uses."""
    return {"KL004": (ESTIMATOR, "k1")} if ESTIMATOR in settings else {"KL004": (LEGACY, "kl")}


def fix(rule: str, row_fix: str = "") -> str:
    return FIXES.get(rule, row_fix)
