"""OpenRLHF's KL flags as catalog configurations (read from openrlhf.cli.train_ppo_ray and the code it
runs, releases 0.6 to 0.11.2).

- `--algo.kl.init_coef` (`--init_kl_coef` before 0.10.4; default 0.01) is the KL's coefficient; at 0
  or below no reference model is built and the KL is off;
- `--algo.kl.use_loss` (`--use_kl_loss`) differentiates `compute_approx_kl(logp, ref, estimator)` as
  a loss in the actor's training step, averaged over the batch's tokens (each sequence's token-mean,
  then the mean, up to 0.6); without it the detached estimate is subtracted from the token rewards,
  which every advantage estimator (GAE with the default gamma = lambda = 1, REINFORCE and its
  group baselines) turns into the reward-to-go;
- `--algo.kl.estimator` (`--kl_estimator`; default k1): k1 = log-ratio, k2 = log-ratio^2 / 2,
  k3 = exp(-log-ratio) - 1 + log-ratio. From 0.8.6 every estimate is clamped to [-10, 10]: k3 is then
  clamped like verl's low_var_kl, and the clamp of k1 and k2 is a defect of its own (KL010). Up to
  0.6.0 the switch `--use_kl_estimator_k3` chose k3 (k1 without it);
- `--algo.kl.unbiased_gradient` (0.11.1) keeps the estimator's value but backpropagates
  w * (log-ratio^2 / 2) with w = sg(pi / pi_old) clamped at 10: k2's gradient, the local term only
  (kl-math.md §8, row 2), token-weighted when the samples are stale (row 23);
- the KL loss is trained on stale samples when one rollout feeds several updates:
  `--train.max_epochs` x rollout batch x samples per prompt / `--train.batch_size` > 1, or
  `--train.async_enable` (rows 22-23). So is the KL reward, computed once per rollout from the rollout's
  log-probs: PPO's token ratio reweighs each sampled token but not its prefix (row 23);
- up to 0.6, `--packing_samples` with `--use_kl_loss` builds the KL loss from
  `torch.tensor([kl.mean() for kl in ...])`, which copies the values and not the graph: the loss
  trains nothing (the KL is off in effect, whatever the logs say): row 1c, KL001;
- `--actor.loss_agg_mode` (0.11.2) aggregates the policy loss, and with it the KL reward:
  seq-mean-token-mean weighs each sequence by 1/L (row 21); `--actor.policy_loss_type gspo` weighs
  the advantages by a per-sequence ratio, which no catalog row describes for a KL reward. Up to 0.6
  the policy loss is each response's token mean, then the mean (1/L again), unless `--packing_samples`
  puts the micro-batch's responses in one row, whose mean is over all of their tokens. From 0.7 to 0.10
  the policy loss and the KL loss are token means over each micro-batch: with `--micro_train_batch_size 1`
  (and no `--use_dynamic_batch`) a micro-batch is one response, divided by its own length (row 21); 0.11
  divides by the step's token count.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from klaudit.catalog import Aggregation, Config, Estimator, Returns, Sampling
from klaudit.frameworks.calls import last_name
from klaudit.frameworks.settings import Judged, Setting, more_responses_per_micro_batch, number, truthy
from klaudit.frameworks.versions import Assumed, at_least, release_fields
from klaudit.text import file_text

NAME = "openrlhf"
CLAMPED_FROM = "0.8.6"  # compute_approx_kl clamps every estimate to [-10, 10] (read in the 0.8.0-0.8.9 wheels)
# A launch of OpenRLHF's PPO-family trainer (the module or its file), which the flags configure.
LAUNCH = re.compile(r"openrlhf[./]cli[./]train_(?:ppo|grpo|reinforce)\w*")
# the entry point of OpenRLHF's PPO trainer in a copy
PPO_ENTRY = "openrlhf/cli/train_ppo_ray.py"
# `python3 -m train_ncp`, `deepspeed --module train_ppo`: a launch of any module (the project's own, where it imports
# OpenRLHF)
MODULE_LAUNCH = re.compile(r"(?:-m|--module)\s+([A-Za-z_]\w*(?:\.\w+)*)")
MODULE_VARIABLE = re.compile(r"(?:-m|--module)\s+\$\{?([A-Za-z_]\w*)\}?")  # the command held in a variable
USE_LOSS, ESTIMATOR, COEF, UNBIASED = "algo.kl.use_loss", "algo.kl.estimator", "algo.kl.init_coef", "algo.kl.unbiased_gradient"
ADVANTAGE, AGGREGATION, POLICY_LOSS = "algo.advantage.estimator", "actor.loss_agg_mode", "actor.policy_loss_type"
EPOCHS, ROLLOUT_BATCH, SAMPLES, TRAIN_BATCH, ASYNC = (
    "train.max_epochs", "rollout.batch_size", "rollout.n_samples_per_prompt", "train.batch_size", "train.async_enable")
PACKING = "packing_samples"  # read for releases up to 0.6 only, which spell it so
# 0.7 to 0.10 average the policy loss and the KL loss over each micro-batch's tokens (0.11 over the step's)
MICRO_BATCH, DYNAMIC_BATCH = "train.micro_batch_size", "train.dynamic_batch_enable"
K3_SWITCH = "use_kl_estimator_k3"  # up to 0.6.0, before --kl_estimator
KL_KEYS = (USE_LOSS, ESTIMATOR, COEF, UNBIASED, K3_SWITCH)
KEYS = (*KL_KEYS, ADVANTAGE, AGGREGATION, POLICY_LOSS, EPOCHS, ROLLOUT_BATCH, SAMPLES, TRAIN_BATCH, ASYNC, PACKING,
        MICRO_BATCH, DYNAMIC_BATCH)
SWITCHES = (USE_LOSS, UNBIASED, ASYNC, PACKING, K3_SWITCH)
# Each key under its 0.11 name and its flat name of 0.6-0.10.
FLAGS = {**{key: key for key in KEYS}, "use_kl_loss": USE_LOSS, "kl_estimator": ESTIMATOR, "init_kl_coef": COEF,
         "advantage_estimator": ADVANTAGE, "policy_loss_type": POLICY_LOSS, "max_epochs": EPOCHS,
         "rollout_batch_size": ROLLOUT_BATCH, "n_samples_per_prompt": SAMPLES, "train_batch_size": TRAIN_BATCH,
         "async_train": ASYNC, "micro_train_batch_size": MICRO_BATCH, "use_dynamic_batch": DYNAMIC_BATCH}
DEFAULTS = {USE_LOSS: "False", ESTIMATOR: "k1", COEF: "0.01", UNBIASED: "False", ADVANTAGE: "gae",
            AGGREGATION: "token-mean", POLICY_LOSS: "ppo", EPOCHS: "1", ROLLOUT_BATCH: "1024", SAMPLES: "1",
            TRAIN_BATCH: "128", ASYNC: "False", PACKING: "False", K3_SWITCH: "False", MICRO_BATCH: "8",
            DYNAMIC_BATCH: "False"}
ADVANTAGES = ("gae", "reinforce", "rloo", "reinforce_baseline", "group_norm", "dr_grpo", "flash_reinforce")
POLICY_AGGREGATIONS = {"token-mean": Aggregation.BATCH_MEAN, "seq-mean-token-mean": Aggregation.SEQ_MEAN}

# where OpenRLHF's repository keeps its own launches (`train_ppo_llama_ray.sh`): in a checkout a project carries,
# upstream's examples, not the project's runs (concise-reasoning keeps its own in `examples/script/`)
UPSTREAM_FOLDERS = ("examples/scripts", "tests")
OPEN = "*"  # in fields/openrlhf_options.txt, the option of a module that some release's parser leaves open
FLAT = {key: flat for flat, key in FLAGS.items() if flat != key}  # the 0.6-0.10 spelling of a key


def spelled(flat: bool) -> dict[str, str]:
    """Each key as a launch script writes it: `--algo.kl.use_loss` (0.10.4+) or `--use_kl_loss`."""
    return {key: "--" + (FLAT.get(key, key) if flat else key) for key in KEYS}


def fixes(flat: bool, assumed: Assumed, k3_switch: bool) -> dict[str, str]:
    """The flag change that fixes each rule (kl-math.md §8.5: k1 in the reward is R-A's reward form); `k3_switch`:
    the script chooses k3 by the switch of releases up to 0.6.0, which have no estimator option (k1 without it)."""
    name = spelled(flat)
    k1 = f"leave out {name[K3_SWITCH]}" if k3_switch else f"set {name[ESTIMATOR]} k1"
    unbiased = "unbiased, up to OpenRLHF's clamp at |k1| > 10, KL010" if at_least(assumed, CLAMPED_FROM) else "unbiased"
    to_reward = (f"drop {name[USE_LOSS]} and {k1}: the KL as a k1 reward with reward-to-go "
                 f"({unbiased}); keep {name[COEF]} divided by about the "
                 "mean response length: the reward sums the KL over the tokens where the token-mean loss averaged it")
    return {
        "KL001": to_reward, "KL002": to_reward, "KL003": to_reward, "KL009": to_reward,
        "KL004": f"{name[ESTIMATOR]} k1 (k1 values in the reward, unbiased with every advantage estimator)",
        "KL007": f"{name[AGGREGATION]} token-mean (the batch's token-mean keeps about the same scale)"
                 if at_least(assumed, "0.7") else
                 f"{name[PACKING]} with the KL in the reward: up to 0.6 no flag names the policy loss's reduction, and a "
                 "packed micro-batch is one row, averaged over all of its tokens (a packed KL loss trains nothing "
                 "up to 0.6)",
        "KL008": f"{to_reward}; or {_one_update(name)}",
        "KL010": "OpenRLHF clamps every KL estimate to [-10, 10] in compute_approx_kl and no flag turns that off; "
                 "it only acts on tokens with |log pi - log ref| > 10. To remove it, put "
                 "klaudit.estimators.kl_reward(action_log_probs, base_action_log_probs, action_mask) in the "
                 "reward in place of compute_approx_kl's estimate",
    }


def _one_update(name: Mapping[str, str]) -> str:
    return (f"one update per rollout ({name[EPOCHS]} 1 and {name[TRAIN_BATCH]} equal to the rollout batch times the "
            "samples per prompt, no async training)")


def stale_reward_fix(flat: bool) -> str:
    """KL008's help for a KL reward reused over several updates (row 23): its own flags are not the cause."""
    return (f"{_one_update(spelled(flat))}; or the KL out of the reward, into a loss of your own with per-decision "
            "importance weights: klaudit.estimators.kl_penalty(action_log_probs, base_action_log_probs, action_mask, "
            "old_logprobs=old_action_log_probs).loss (R-F)")


def _estimator(name: str, assumed: Assumed) -> Estimator | None:
    clamped = at_least(assumed, CLAMPED_FROM)
    return {"k1": Estimator.K1, "k2": Estimator.K2,
            "k3": Estimator.LOW_VAR_KL if clamped else Estimator.K3}.get(name)


def _stale(value: Mapping[str, str]) -> bool | None:
    """Whether one rollout feeds more than one update (or the trainer runs ahead of it); None: unknown."""
    epochs, rollout, samples, train = (number(value[key]) for key in (EPOCHS, ROLLOUT_BATCH, SAMPLES, TRAIN_BATCH))
    asynchronous = truthy(value[ASYNC])
    if None in (epochs, rollout, samples, train, asynchronous) or not train:
        return None
    return bool(asynchronous) or epochs * rollout * samples / train > 1  # type: ignore[operator]


@dataclass(frozen=True)
class CopyParser:
    """The command line of a launched OpenRLHF module, read from its `add_argument`s: a project's copy's, or the
    options some published release accepts (`released`)."""

    options: frozenset[str]  # every option string it adds, without the dashes (`kl_estimator`, `algo.kl.estimator`)
    defaults: Mapping[str, str]  # an option's literal default, as klaudit.frameworks.calls reads a literal
    closed: bool  # `parse_args` on options all added in this file: an option it lacks stops the launch
    merged: bool = False  # the options of several releases: which abbreviations one release accepts is unknown

    def refuses(self, flags: Iterable[str]) -> str | None:
        """The first of `flags` (spelled without dashes) that argparse rejects: no option of that name, nor one
        alone that it abbreviates (for `merged` options: none that it abbreviates). None where all are accepted
        or the parser is not `closed`."""
        if not self.closed:
            return None
        for flag in flags:
            abbreviated = len([option for option in self.options if option.startswith(flag)])
            if flag not in self.options and (abbreviated == 0 if self.merged else abbreviated != 1):
                return flag
        return None

    def defaults_of(self) -> dict[str, str]:
        """DEFAULTS with the copy's own defaults where it gives one (a fork's `--kl_estimator` default of k3)."""
        given = {key: self.defaults[flat] for flat, key in FLAGS.items() if flat in self.defaults}
        return {**DEFAULTS, **given}


@functools.lru_cache(maxsize=64)  # asked for each launch script of a project
def copy_parser(module: Path) -> CopyParser | None:
    """The command line of the module file `module` (a copy's `openrlhf/cli/train_ppo_ray.py`); None where it
    cannot be read."""
    try:
        return parser_of(file_text(module))
    except (OSError, SyntaxError, ValueError):
        return None


def parser_of(source: str) -> CopyParser:
    """The command line a module's source builds with argparse (SyntaxError where it does not parse)."""
    tree = ast.parse(source)
    options: set[str] = set()
    defaults: dict[str, str] = {}
    parsers = {target.id for node in ast.walk(tree) if isinstance(node, ast.Assign)
               and isinstance(node.value, ast.Call) and last_name(node.value.func) == "ArgumentParser"
               for target in node.targets if isinstance(target, ast.Name)}
    handed_on = False  # the parser given to a function that may add options of its own, or names computed
    loops = _literal_loops(tree)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        if last_name(node.func) == "add_argument":
            spelled = [_spelled(arg, loops.get(node, {})) for arg in node.args]
            names = [name[2:] for spellings in spelled for name in spellings or () if name.startswith("--")]
            handed_on = handed_on or None in spelled  # f"--{prefix}.lr" with a prefix from elsewhere
            options.update(names)
            default = _default(node)
            defaults.update({name.replace("-", "_"): default for name in names if default is not None})
        elif any(isinstance(arg, ast.Name) and arg.id in parsers for arg in [*node.args, *(k.value for k in node.keywords)]):
            handed_on = True
    calls = {last_name(node.func) for node in ast.walk(tree) if isinstance(node, ast.Call)}
    closed = bool(parsers) and "parse_args" in calls and "parse_known_args" not in calls and not handed_on
    return CopyParser(frozenset(options), defaults, closed)


def _literal_loops(tree: ast.AST) -> dict[ast.AST, dict[str, tuple[str, ...]]]:
    """For each node inside `for name in ("actor", "critic"):` loops, the strings each such loop variable takes."""
    loops: dict[ast.AST, dict[str, tuple[str, ...]]] = {}
    for loop in ast.walk(tree):
        if (isinstance(loop, ast.For) and isinstance(loop.target, ast.Name) and isinstance(loop.iter, (ast.Tuple, ast.List))
                and all(isinstance(item, ast.Constant) and isinstance(item.value, str) for item in loop.iter.elts)):
            values = tuple(item.value for item in loop.iter.elts)  # type: ignore[attr-defined]
            for statement in loop.body:
                for node in ast.walk(statement):
                    loops.setdefault(node, {})[loop.target.id] = values
    return loops


def _spelled(arg: ast.expr, loops: Mapping[str, tuple[str, ...]]) -> list[str] | None:
    """The strings an argument spells: a literal's, or an f-string's over the loop variables `loops` gives, one for
    each of their values; None where it is computed otherwise."""
    if isinstance(arg, ast.Constant):
        return [arg.value] if isinstance(arg.value, str) else []
    if not isinstance(arg, ast.JoinedStr):
        return None
    spellings = [""]
    for part in arg.values:
        if isinstance(part, ast.Constant):
            spellings = [spelling + str(part.value) for spelling in spellings]
        elif (isinstance(part, ast.FormattedValue) and isinstance(part.value, ast.Name) and part.value.id in loops
              and part.conversion == -1 and part.format_spec is None):
            spellings = [spelling + value for spelling in spellings for value in loops[part.value.id]]
        else:
            return None
    return spellings


@functools.cache
def released_parser(module: str) -> CopyParser | None:
    """The options that some published release's `module` (`openrlhf/cli/train_ppo_ray.py`) accepts, closed where
    every release's parser is: klaudit/frameworks/fields/openrlhf_options.txt, written by scripts/config_fields.py
    from the wheels. An option in none of them stops the launch under any release. None: no release has `module`."""
    rows = [line.split() for line in release_fields("openrlhf_options.txt")]
    options = frozenset(option for name, option in rows if name == module and option != OPEN)
    closed = [module, OPEN] not in rows
    return CopyParser(options, {}, closed, merged=True) if options else None


def _default(call: ast.Call) -> str | None:
    """An `add_argument`'s default as a launch flag's value reads: its literal, or False for a `store_true`."""
    keywords = {keyword.arg: keyword.value for keyword in call.keywords if keyword.arg}
    default = keywords.get("default")
    if default is None:
        action = keywords.get("action")
        return "False" if isinstance(action, ast.Constant) and action.value == "store_true" else None
    if isinstance(default, ast.Constant) and isinstance(default.value, (str, int, float, bool)):
        return str(default.value)
    return None


REWARD_MODULE = "openrlhf/models/utils.py"  # compute_reward, which subtracts kl_coef * kl from the token rewards


@functools.lru_cache(maxsize=64)  # asked for each launch script of a project
def reward_reads_kl(copy: Path | None) -> bool:
    """Whether the `compute_reward` of the copy of OpenRLHF a script runs uses its `kl` argument: a fork that
    rewrote it to the task reward alone (Distributional-Matching-Tuning) drops the KL reward. True where the
    copy, or a function of that name, is not there to read."""
    if copy is None:
        return True
    try:
        tree = ast.parse(file_text(copy / REWARD_MODULE))
    except (OSError, SyntaxError, ValueError):
        return True
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == "compute_reward":
            used = {name.id for statement in node.body for name in ast.walk(statement) if isinstance(name, ast.Name)}
            return bool(used & {"kl", "kl_coef"})
    return True


MAKER_MODULE = "openrlhf/trainer/ppo_utils/experience_maker.py"  # make_experience_list, which calls compute_reward


@functools.lru_cache(maxsize=64)
def estimators_without_kl_reward(copy: Path | None) -> frozenset[str]:
    """The advantage estimators whose branch of an `if` in the copy's experience maker reads no KL where another
    branch calls `compute_reward`: MCGEP's 0.5 fork normalises the task rewards of `group_norm` and only logs the
    KL. Releases call it before choosing the estimator, so none is found there."""
    if copy is None:
        return frozenset()
    try:
        tree = ast.parse(file_text(copy / MAKER_MODULE))
    except (OSError, SyntaxError, ValueError):
        return frozenset()
    skipped: set[str] = set()
    chained: set[int] = set()  # the `elif`s of a chain already read from its head
    for node in ast.walk(tree):
        if not isinstance(node, ast.If) or id(node) in chained:
            continue
        branches: list[tuple[tuple[str, ...] | None, list[ast.stmt]]] = []  # (the estimators taking it, its body)
        branch: ast.stmt | None = node
        while isinstance(branch, ast.If):
            chained.add(id(branch))
            branches.append((_estimators_tested(branch.test), branch.body))
            orelse = branch.orelse
            branch = orelse[0] if len(orelse) == 1 and isinstance(orelse[0], ast.If) else None
            if branch is None and orelse:
                branches.append(((), orelse))  # `else:` the other estimators
        if all(values is not None for values, _ in branches) and any(_calls_compute_reward(body) for _, body in branches):
            skipped.update(value for values, body in branches if not _reads_kl(body) for value in values or ())
    return frozenset(skipped)


def _estimators_tested(test: ast.expr) -> tuple[str, ...] | None:
    """The strings `advantage_estimator == "x"` or `advantage_estimator in ("x", "y")` takes; None for another test."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], (ast.Eq, ast.In))
            and last_name(test.left) == "advantage_estimator"):
        return None
    right = test.comparators[0]
    items = right.elts if isinstance(right, (ast.Tuple, ast.List, ast.Set)) else [right]
    values = tuple(item.value for item in items if isinstance(item, ast.Constant) and isinstance(item.value, str))
    return values if len(values) == len(items) else None


def _calls_compute_reward(body: list[ast.stmt]) -> bool:
    return any(isinstance(node, ast.Call) and last_name(node.func) == "compute_reward"
               for statement in body for node in ast.walk(statement))


def _reads_kl(body: list[ast.stmt]) -> bool:
    """Whether statements call `compute_reward` or read a KL for a reward of their own (`experience.kl`,
    `self.kl_ctl`: LMM-R1's `compute_uniform_reward(reward, self.kl_ctl.value, experience.kl)`)."""
    return _calls_compute_reward(body) or any(isinstance(node, ast.Attribute) and node.attr in ("kl", "kl_ctl")
                                              for statement in body for node in ast.walk(statement))


def judge(settings: Mapping[str, Setting], assumed: Assumed, flat: bool = False,
          kl_reward_applied: bool = True, defaults: Mapping[str, str] = DEFAULTS,
          without_kl_reward: Collection[str] = ()) -> tuple[Judged, bool] | None:
    """(the KL configuration of an OpenRLHF PPO launch with `settings`, whether its estimate is clamped);
    None when the launch sets no KL flag, the KL is off, or a deciding flag is not a literal.
    `kl_reward_applied`: whether the copy run puts the KL in the rewards (see `reward_reads_kl`); `defaults`:
    the options' defaults in the command line of the copy run (`CopyParser.defaults_of`); `without_kl_reward`:
    the advantage estimators for which it does not (`estimators_without_kl_reward`)."""
    if not any(key in settings for key in KL_KEYS):
        return None
    given = {key: settings[key].value if key in settings else default for key, default in defaults.items()}
    value = {key: v for key, v in given.items() if v is not None}
    deciding = (COEF, USE_LOSS, ESTIMATOR) + ((UNBIASED,) if at_least(assumed, "0.11") else ())
    if any(key not in value for key in deciding):
        return None  # a deciding flag set to a variable: its value is unknown here
    coef, use_loss = number(value[COEF]), truthy(value[USE_LOSS])
    k3_switch = ESTIMATOR not in settings and truthy(value[K3_SWITCH])
    estimator = _estimator("k3" if k3_switch else value[ESTIMATOR], assumed)
    if coef is None or coef <= 0 or use_loss is None or estimator is None:
        return None
    clamped = at_least(assumed, CLAMPED_FROM) and estimator is not Estimator.LOW_VAR_KL  # low_var_kl's rows name their clamps
    packed_loss = use_loss and not at_least(assumed, "0.7") and truthy(value[PACKING])
    stale = _stale(value)
    per_response = _one_response_per_micro_batch(value, assumed)
    if packed_loss:
        # up to 0.6 the packed KL loss is rebuilt by torch.tensor: its values without their graph (row 1c)
        config = Config(reward=estimator, returns=Returns.NOWHERE)
        clamped = False
    elif use_loss:
        unbiased = truthy(value[UNBIASED]) if at_least(assumed, "0.11") else False
        if unbiased is None or stale is None:
            return None
        config = _loss_config(estimator, unbiased, stale, assumed, per_response)
        clamped = clamped and not unbiased  # unbiased_gradient detaches the clamped value; w * k2 is not clamped
    else:
        if not kl_reward_applied or value.get(ADVANTAGE) in without_kl_reward:
            return None
        aggregation = POLICY_AGGREGATIONS.get(value.get(AGGREGATION, "")) if at_least(assumed, "0.7") else (
            Aggregation.BATCH_MEAN if truthy(value[PACKING]) else Aggregation.SEQ_MEAN)
        if aggregation is None or value.get(POLICY_LOSS) != "ppo" or value.get(ADVANTAGE) not in ADVANTAGES:
            return None  # an unknown mode, or GSPO's per-sequence ratio, which no catalog row describes
        if per_response:
            aggregation = Aggregation.SEQ_MEAN
        config = Config(reward=estimator, aggregation=aggregation,  # unknown batch sizes: no claim on staleness
                        sampling=Sampling.TOKEN_IS if stale else Sampling.ON_POLICY)
    anchor = next(settings[key] for key in (ESTIMATOR, K3_SWITCH, USE_LOSS, COEF, UNBIASED) if key in settings)
    shown, name = [key for key in KEYS if key in settings or key in (USE_LOSS, ESTIMATOR, COEF)], spelled(flat)
    if k3_switch:
        shown.remove(ESTIMATOR)
    flags = ", ".join(f"{name[key][2:]}={given[key]}" + ("" if key in settings else " (default)") for key in shown)
    if per_response:
        flags += " (a token mean over each micro-batch, one response, before 0.11)"
    # a token mean per response up to 0.6 comes with the KL reward's own coefficient: no flag names the mode
    aggregation_by = MICRO_BATCH if per_response else AGGREGATION if AGGREGATION in settings or use_loss else COEF
    anchors = {rule: settings[key] for rule, key in (("KL007", aggregation_by), ("KL008", _stale_by(value, settings)))
               if key in settings}
    helps = {"KL008": stale_reward_fix(flat)} if config.reward is not None else {}
    if per_response:
        helps["KL007"] = (f"{more_responses_per_micro_batch(name[MICRO_BATCH])}, {name[DYNAMIC_BATCH]}, or OpenRLHF "
                          "0.11, which divides by the step's token count")
    return Judged(config, anchor, flags, anchors, helps), clamped


def _stale_by(value: Mapping[str, str], settings: Mapping[str, Setting]) -> str:
    """The flag to change for stale samples: more than one epoch, async training, else the batch sizes."""
    if EPOCHS in settings and (number(value[EPOCHS]) or 0) > 1:
        return EPOCHS
    if ASYNC in settings and truthy(value[ASYNC]):
        return ASYNC
    return next((key for key in (TRAIN_BATCH, ROLLOUT_BATCH, SAMPLES) if key in settings), EPOCHS)


def _one_response_per_micro_batch(value: Mapping[str, str], assumed: Assumed) -> bool:
    """Whether 0.7 to 0.10 average over micro-batches of one response: `micro_train_batch_size` 1, no dynamic
    batching (a value the script computes decides nothing)."""
    return (at_least(assumed, "0.7") and not at_least(assumed, "0.11") and number(value.get(MICRO_BATCH, "")) == 1
            and truthy(value.get(DYNAMIC_BATCH, "")) is False)


def _loss_config(estimator: Estimator, unbiased: bool, stale: bool, assumed: Assumed,
                 per_response: bool = False) -> Config:
    """The KL loss of the actor's training step (`per_response`: a token mean over one response's tokens)."""
    aggregation = Aggregation.BATCH_MEAN if at_least(assumed, "0.7") and not per_response else Aggregation.SEQ_MEAN
    if unbiased:  # w * k2 with w = sg(pi / pi_old): k2's gradient, token-weighted on stale samples
        return Config(loss=Estimator.K2, aggregation=aggregation,
                      sampling=Sampling.TOKEN_IS if stale else Sampling.ON_POLICY)
    return Config(loss=estimator, aggregation=aggregation,
                  sampling=Sampling.OFF_POLICY if stale else Sampling.ON_POLICY)




# The names a branch of OpenRLHF's code on one of its KL switches carries (`self.args.kl_estimator`), with the key a
# launch sets each by: a copy's branches no launch of the project selects never run (klaudit.frameworks.verl_runs.
# choice_holds reads them). Not 0.11's `args.algo.kl.estimator`: a branch named `estimator` may as well be on
# `args.algo.advantage.estimator`, another switch
RUN_SWITCHES = {"kl_estimator": ESTIMATOR, "use_kl_loss": USE_LOSS}


def run_choices(launched: Iterable[Mapping[str, Setting]]) -> dict[str, frozenset[str]]:
    """For each KL switch of RUN_SWITCHES, the values the `launched` settings give it (OpenRLHF's default where a
    launch leaves it); a switch some launch computes is left out, and with no launch every switch is."""
    launches = list(launched)
    choices: dict[str, frozenset[str]] = {}
    for name, key in RUN_SWITCHES.items() if launches else ():
        values = [settings[key].value if key in settings else DEFAULTS[key] for settings in launches]
        if None not in values:
            choices[name] = frozenset(value for value in values if value is not None)
    return choices
