"""What names, containers and calls mean in RL trainer code: the one table of naming conventions.

The linter never imports the code it reads, so the meaning of a tensor comes from evidence:
its name (patterns.md section 1), where it was read from (a rollout container holds data, not
graph), the call that produced it (`log_softmax(...).gather`, `selective_log_softmax`, ...)
and context (no_grad blocks). Every rule relies on this module, so a new framework shape is
taught here once.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable

from klaudit.lint.algebra import (
    LOGITS,
    OLD,
    OLD_PROB,
    POLICY,
    PROB,
    REF,
    REF_LOGITS,
    REF_PROB,
    SEQUENCE,
    VOCAB_POLICY,
    VOCAB_REF,
    Atom,
    AtomKind,
    Poly,
)
from klaudit.lint.kinds import SinkKind

# ---- the cheap pre-filter ----------------------------------------------------------------

# A finding needs a KL term, and a KL term needs either a name that says KL (`kl`, `kld`,
# `kl_loss`, `use_kl_loss`, `compute_approx_kl`) or a reference/teacher log-prob or logits name
# (or a bare `ref`).
# Both are matched as parts of identifiers, so prose like "quickly" or "weakly" does not count.
_KL_VOCABULARY_PATTERN = (
    r"(?<![a-z0-9])(kl|kld|kls|ref)(?![a-z0-9])|_kl(?![a-z0-9])|(?<![a-z0-9])kl_"
    r"|(ref|reference|base|init|teacher)_\w*(log_?prob|logp|logit)"
    r"|log_?probs?_(ref|reference|base|init|teacher)|reference_policy"
)
# The letters a match can start with (tests/lint/test_cost.py derives them from the pattern): looking
# ahead for one first lets the search skip most positions, three times faster on real trees.
_KL_VOCABULARY_STARTS = "krbitl_"
_KL_VOCABULARY = re.compile(rf"(?=[{_KL_VOCABULARY_STARTS}])(?:{_KL_VOCABULARY_PATTERN})", re.IGNORECASE)
# Every match holds one of these words (tests/lint/test_cost.py derives it from the pattern), and none
# spans a line break: the pattern is tried only on the lines where one of them occurs.
_KL_VOCABULARY_WORDS = ("kl", "ref", "log")


# Aggregation helpers read by their name and their signature's default axis (klaudit.lint.reductions),
# whichever module of the tree defines them
NAMED_AGGREGATIONS = frozenset({"masked_mean", "masked_sum", "agg_loss", "aggregate_loss", "masked_aggregator",
                                "sum_of_sample_mean"})


_CAMEL_BOUNDARY = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")


_LOG_SUM_EXP = re.compile(r"(^|_)(logsumexp|lse)s?(_|$)", re.IGNORECASE)


def names_log_sum_exp(name: str) -> bool:
    """A name for the log-softmax's normaliser: `logsumexp`, `lse`, `logits_lse`."""
    return _LOG_SUM_EXP.search(name) is not None


@functools.lru_cache(maxsize=4096)  # a pure function of the name, asked at every call of a class
def snake_words(name: str) -> str:
    """A CamelCase name with its words joined by "_" (`KLEstimator` -> `KL_Estimator`), so that the
    vocabulary test reads a class name's words."""
    return _CAMEL_BOUNDARY.sub("_", name)


_KL_NAME = re.compile(r"(?<![a-z0-9])(kl|kld|kl_div|kl_divergence)(?![a-z0-9])|_kl(?![a-z0-9])|(?<![a-z0-9])kl_",
                      re.IGNORECASE)


@functools.lru_cache(maxsize=4096)  # a pure function of the name, asked for the same names again and again
def names_kl(name: str) -> bool:
    """A variable named as a KL (`kl`, `kld`, `per_token_kl`, `kl_penalty`), not as its coefficient."""
    return _KL_NAME.search(name) is not None and not is_coefficient_name(name) and _COEF.search(name) is None


def might_contain_kl(source_text: str) -> bool:
    """False when the text has no KL or log-prob vocabulary, so it cannot hold a finding.

    The pattern is tried on the lines that hold one of its words, found by `str.find` in the lowered
    text (a few times faster over a file than the pattern itself, which most files pass without a
    match). Under IGNORECASE a letter of those words matches only characters whose lower case is
    that letter (U+212A KELVIN SIGN is a `k`), so no line with a match is skipped; where lowering
    changes the text's length (U+0130), its positions are not the text's, and the whole text is searched."""
    lowered = source_text.lower()
    if len(lowered) != len(source_text):
        return _KL_VOCABULARY.search(source_text) is not None
    for word in _KL_VOCABULARY_WORDS:
        found = lowered.find(word)
        while found >= 0:
            start = lowered.rfind("\n", 0, found) + 1
            end = lowered.find("\n", found)
            end = len(lowered) if end < 0 else end
            if _KL_VOCABULARY.search(source_text, start, end) is not None:
                return True
            found = lowered.find(word, end)
    return False


# ---- names of log-probability tensors (patterns.md section 1) ------------------------------

_LOGP = r"(log_?probs?|logps?|logprobs?|log_?prob_?s?|per_token_logps|logp_?s?|lnp|lnprobs?)"  # ln: natural log
_REF_PATTERN = re.compile(
    r"^(.*_)?(ref|reference|base|init|sft|teacher|pretrained|t)(_.*)?_?" + _LOGP + r"(_.*)?$"
    r"|^(.*_)?" + _LOGP + r"_(ref|reference|base|init|sft|teacher|pretrained)(_.*)?$"
    r"|^ref(erence)?$|^(mb_)?ref_logps$|^teacher_.*logp.*$",
    re.IGNORECASE,
)
_OLD_PATTERN = re.compile(
    r"^(.*_)?(old|prev|previous|generation|gen|rollout|inference|vllm|sampling|sampled|behaviou?r|prox|mb"
    r"|traj|trajs|trajectory|trajectories)_"
    r".*" + _LOGP + r".*$|^(.*_)?" + _LOGP + r"_old$",
    re.IGNORECASE,
)
_POLICY_PATTERN = re.compile(
    r"^(new_|curr_|cur_|current_|policy_|pi_|trainer_|action_|student_|per_token_|token_|response_|resp_|completion_|actor_|model_|local_|batch_)*"
    r"(log_?probs?|logps?|logprobs?|log_prob|logp|per_token_logps|new_logps|logprob|lnp|lnprobs?)"
    r"(_unfiltered|_on_labels|_curr|_new|_policy|_pi)?$",
    re.IGNORECASE,
)
# `lp` alone is too short to mean log-probs; with a side word before or after it (`ref_lp`, `old_lp`,
# `curr_lp`, `lp_new`, and with a stage after that: rlhf_eval_lab's `lp_new_pre`) it is the common abbreviation.
_LP = r"((token|tok|seq)_)?lps?"  # and with what it is of between (superGPT's old_token_lps)
_STAGE = r"(_[a-z]+)?"
_REF_LP = re.compile(r"^(.*_)?(ref|reference|base|init|sft|teacher|pretrained)_" + _LP + r"$|^" + _LP + r"_ref" + _STAGE + "$",
                     re.IGNORECASE)
_OLD_LP = re.compile(r"^(.*_)?(old|prev|previous|rollout|inference|inf|vllm|sampling|behaviou?r|prox)_" + _LP
                     + r"$|^" + _LP + r"_old" + _STAGE + "$", re.IGNORECASE)
_POLICY_LP = re.compile(r"^(.*_)?(new|curr|cur|current|policy|pi|trainer|student|actor)_" + _LP
                        + r"$|^" + _LP + r"_(new|curr|cur|policy|pi)" + _STAGE + "$", re.IGNORECASE)
# `ref_logits`, `teacher_chunk_logits`, and with the model after (`logits_ref`, `logits_q`, `logits_r`: q is the
# reference's distribution where p is the policy's)
_REF_LOGITS = re.compile(r"^(ref|reference|base|init|sft|teacher|pretrained|t)_(.*_)?logits$"
                         r"|^logits_(ref|reference|base|init|sft|teacher|r|q)$", re.IGNORECASE)
# A shape suffix in capitals (`new_logprobs_BT`, `ref_logits_BTV`) or the common `_bt`: not part of the meaning.
# a shape (`logp_BT`) or a per-token marker (dLLM-RL's `logp_old_tok`) after the name
_SHAPE_SUFFIX = re.compile(r"_([BTVLSNGKHD]{1,4}|bt|btv|toks?|tokens?)$")
# An optional value named so (legacy TRL's `ref_logits_or_none`, returned only when asked for): the same tensor.
_OPTIONAL_SUFFIX = re.compile(r"_or_none$", re.IGNORECASE)
# Which data the log-probs were taken on (`model_logprobs_ref_data`): the model is named before it.
_DATA_SUFFIX = re.compile(r"_(model|ref|reference|policy|chosen|rejected|sampled|generated)_data(_\w+)?$", re.IGNORECASE)
# A model whose outputs are the reference's: `self.ref_model(...)`, `ref_outputs`, `teacher(...)`, `sft_policy`.
_REFERENCE_MODEL = re.compile(r"^_*(ref|reference|init|initial|sft|teacher|frozen)(_\w*)?$|^\w*_(ref|reference|teacher)$",
                              re.IGNORECASE)
# `logits`, `new_logits`, and with the model or a part after (`logits_policy`, `logits_p`, `logits_a`, `logits_chunk`)
_POLICY_LOGITS = re.compile(r"^(.*_)?logits(_(policy|actor|student|model|new|cur|current|pi|theta|p|a|chunk|mb|all|full|next|shifted))?$",
                            re.IGNORECASE)
_MASK = re.compile(r"mask", re.IGNORECASE)
# per-token weights a loss is multiplied by (xtuner's `loss_weights`: the mask over a token count)
_TOKEN_WEIGHTS = re.compile(r"^_*(loss|token|tok)_weights?$", re.IGNORECASE)

# Names of the containers rollout data is read from: reading them gives data, not graph.
DATA_CONTAINERS = re.compile(
    r"^(data|batch|mini_?batch|micro_?batch|mb|inputs|model_inputs|experience|exp|"
    r"rollouts?(_(data|results?|outputs?|batch|buffer))?|"
    r"input_data|batch_data|samples?|buffer|grpo_batch|train_data|features|payload|item|b)$",
    re.IGNORECASE,
)


# The log-probs of one side of a preference pair (`policy_chosen_logps`, `ref_rejected_logps`,
# `teacher_reject_logps`, `chosen_logits`, safe-rlhf's `better_log_probs` / `worse_log_probs`): taken on
# responses a dataset or a judge picked, not on samples of the policy, so no KL estimate is made of them (what is
# computed from them, `chosen_rewards`, follows from its inputs). Not `winner`: the best of the policy's own
# samples (wordle-GRPO-modal's KL penalty on `log_probs_policy_winner`, fifty-second set) is a sample still.
_SIDES = r"chosen|rejected|reject|better|worse|preferred|dispreferred"
_PREFERENCE_SIDE = re.compile(rf"(?<![a-z0-9])({_SIDES})(?![a-z0-9])", re.IGNORECASE)
_LOGPROBS = r"log_?probs?|logps?|(?<![a-z])lps?(?![a-z])"  # `ref_logps`, `sequence_log_probs`, `chosen_lp`
_LOGPROBS_WORD = re.compile(_LOGPROBS, re.IGNORECASE)
_LONG_LOGPROB_WORD = re.compile(r"log_?probs?|logps?|logits|log_?ratios?", re.IGNORECASE)
_SIDE_THEN_LP = re.compile(rf"(?<![a-z0-9])({_SIDES})_(\w*_)?lps?(?![a-z0-9])", re.IGNORECASE)


def speaks_of_logprobs(name: str) -> bool:
    """`per_token_logps`, `_sequence_log_probs`, `logps_ent`: a name of log-probs (not of raw logits)."""
    return _LOGPROBS_WORD.search(name) is not None and "logit" not in name.lower()


@functools.lru_cache(maxsize=4096)  # a pure function of the name, asked at every assignment
def names_pair_logprobs(name: str) -> bool:
    """A name for the log-probs (or logits) of the chosen or rejected response of a preference pair. The short
    `lp` counts after the side only (`ref_chosen_lp`): `lp_chosen` is the log-prob of the token chosen (sampled)."""
    if _PREFERENCE_SIDE.search(name) is None:
        return False
    return _LONG_LOGPROB_WORD.search(name) is not None or _SIDE_THEN_LP.search(name) is not None


# A tensor's `_t` after a name with its side word (JosephLi2023/CS224R's new_lp_t, old_lp_t, ref_lp_t, concatenated
# from per-turn lists); alone (`logp_t` beside `logp_s`) it may name the teacher, and no role is read from it
_SIDED_TENSOR_SUFFIX = re.compile(r"^((\w+_)?(new|cur|curr|current|old|ref|reference|prev|policy)_\w+)_t$", re.IGNORECASE)


# The side word inside the log-probs' name (nanoR1Zero's log_ref_probs, log_cur_probs, log_gen_probs): read as the
# side first (ref_logprobs)
_SIDE_INSIDE = re.compile(r"^log_([a-z]+)_probs?$", re.IGNORECASE)


@functools.lru_cache(maxsize=4096)  # a pure function of the name, asked for the same names again and again
def tensor_role(name: str) -> AtomKind | None:
    """The atom kind a name denotes (policy / reference / old log-probs, logits), or None."""
    name = _SIDED_TENSOR_SUFFIX.sub(r"\1", name)
    bare = _DATA_SUFFIX.sub("", _SHAPE_SUFFIX.sub("", _OPTIONAL_SUFFIX.sub("", name.lstrip("_"))))
    bare = _SIDE_INSIDE.sub(r"\1_logprobs", bare)
    if names_pair_logprobs(bare):
        return None
    if _REF_PATTERN.match(bare) or _REF_LP.match(bare):
        return REF
    if _OLD_PATTERN.match(bare) or _OLD_LP.match(bare):
        return OLD
    if _POLICY_PATTERN.match(bare) or _POLICY_LP.match(bare):
        return POLICY
    if _REF_LOGITS.match(bare):
        return REF_LOGITS
    if _POLICY_LOGITS.match(bare):
        return LOGITS
    return None


# A teacher's log-probs (on-policy or self-distillation): a KL to that teacher, whatever else the step has.
_TEACHER = re.compile(r"(?<![a-z0-9])(teacher|distill|distillation)(?![a-z])", re.IGNORECASE)


def names_teacher(name: str) -> bool:
    """`teacher_logps`, `chunk_teacher_log_probs`, `distill_target`: a distillation teacher, not the reference."""
    return _TEACHER.search(name) is not None


def is_reference_model(path: str) -> bool:
    """`self.ref_model(...)`, `ref_outputs`, `teacher_model(...)`: a dotted path that names the reference model."""
    return any(_REFERENCE_MODEL.match(part) for part in path.replace("()", "").split("."))


# a model that scores what the policy wrote (a reward model, a critic, a classifier), not one that wrote it
_SCORING_MODEL = re.compile(r"^_*(\w+_)?(reward|rm|critic|value|judge|verifier|scorer|classifier|prm|orm|cost)"
                            r"(_(model|net|network|head|lm))?(_?\d+)?$", re.IGNORECASE)


def is_scoring_model(path: str) -> bool:
    """`reward_model(...)`, `self.critic(...)`, `sentiment_classifier(...)`: a dotted path that names a model whose
    outputs score samples (its `.logits` are a score, no policy's or reference's logits)."""
    return any(_SCORING_MODEL.match(part) for part in path.replace("()", "").split("."))


# the network a critic's estimate comes from, called by its own name: `self.value(prompts)`, `critic(h)`, `v_head(x)`
_CRITIC = re.compile(r"^_*(critic|value|v)(_(model|net|network|head|fn|function))?_?\d*$", re.IGNORECASE)


def calls_a_critic(path: str) -> bool:
    """`self.value(...)`, `self.critic_model(...)`: a call whose callee's own name is a value network's (not
    `get_value`, `config.value_of`: a lookup)."""
    return _CRITIC.match(path.rsplit(".", 1)[-1]) is not None


# A call that may draw new samples (model.generate, collect_rollouts, make_experience, env_step ...) and an
# optimizer (`optimizer`, `self.optim`, `opt_actor`): what klaudit.lint.update_loops reads a loop by.
_DRAWS_SAMPLES = re.compile(r"generat|rollout|collect|experience|^sample_|_sample$|^sample$|play|episode|env_step",
                            re.IGNORECASE)
_OPTIMIZER = re.compile(r"(^|_)(optim|optimizer|optimiser|opt)(_|$|\d)|optimizer$", re.IGNORECASE)


def draws_samples(call_name: str) -> bool:
    """A function or method named like one that generates or collects new samples."""
    return _DRAWS_SAMPLES.search(call_name) is not None


def names_optimizer(name: str) -> bool:
    """A name that holds an optimizer (whose `.step()` is an update of the policy)."""
    return _OPTIMIZER.search(name) is not None


# a torch.distributions object over the next token, named for its side: `prior_dist`, `ref_distribution`,
# `actor.get_dist(batch)`; a lagging copy's (`old_dist`) is neither side of a KL to the reference
_DISTRIBUTION = re.compile(r"(^|_)(dist|dists|distribution|distributions)(_|$)|^get_dist$", re.IGNORECASE)
_REFERENCE_WORDS = "ref|reference|prior"  # the reference itself, not a distillation teacher
_REFERENCE_WORD = re.compile(rf"(?<![a-z0-9])({_REFERENCE_WORDS})(?![a-z])", re.IGNORECASE)
_REFERENCE_SIDE = re.compile(rf"(?<![a-z])({_REFERENCE_WORDS}|init|initial|sft|teacher|frozen|base)(?![a-z])",
                             re.IGNORECASE)
_LAGGING_SIDE = re.compile(r"(?<![a-z])(old|prev|previous|behaviou?r|rollout|target)(?![a-z])", re.IGNORECASE)


def distribution_side(path: str) -> str | None:
    """"reference" or "policy" for the dotted path of a distribution object (`prior_dist`,
    `actor_training.get_dist`); None for anything that names no distribution, or a lagging copy's."""
    parts = path.split(".")
    if not any(_DISTRIBUTION.search(part) for part in parts):
        return None
    if any(_LAGGING_SIDE.search(part) for part in parts):
        return None
    return "reference" if any(_REFERENCE_SIDE.search(part) for part in parts) else "policy"


def names_the_reference(name: str) -> bool:
    """`ref_logits`, `prior_likelihood`, `reference`: a name with a word for the reference (not for a teacher)."""
    return _REFERENCE_WORD.search(name) is not None


_SETTINGS = re.compile(r"^_*(args|config|cfg|conf|hparams|hyperparams|settings|opts?|training_args|train_args)$"
                       r"|_(config|cfg|args)$", re.IGNORECASE)


def names_settings(name: str) -> bool:
    """`args`, `config`, `cfg`, `trainer_config`: an object of settings, read by attribute (`config.kl_coef`)."""
    return bool(_SETTINGS.search(name))


# the record of one sample, as a loop over a list of them names it (`for traj in trajectories:`); a batch's record
# (`batch`, `experience`, `mb`) holds every sequence's rows
_ONE_SAMPLE = re.compile(r"^_*(traj|trajectory|sample|example|ex|episode|record|rollout|response|completion|"
                         r"conversation|dialog|dialogue|instance|datum|item)(_?\d+)?$", re.IGNORECASE)


def names_one_sample(name: str) -> bool:
    """`traj`, `sample`, `episode`: a variable that holds one sample's record."""
    return _ONE_SAMPLE.match(name) is not None


# one of the policy's drawn samples (not a dataset's `example` or `item`, which no policy drew)
_DRAWN_SAMPLE = re.compile(r"^_*(sample|traj|trajectory|episode|ep|rollout|response|resp|completion|generation)(_?\d+)?$",
                           re.IGNORECASE)


def names_drawn_sample(name: str) -> bool:
    """`sample`, `traj`, `ep`, `completion`: a variable that holds one sample the policy drew."""
    return _DRAWN_SAMPLE.match(name) is not None


# a list of the policy's drawn samples, one per entry (`episodes`, `trajectories`, `sampled_completions`,
# `rollout_results`, `all_rollouts_flat`; not `samples`, which is as often a dataset's)
_DRAWN_SAMPLES = re.compile(r"^_*(\w+_)?(trajs|trajectories|episodes|rollouts|responses|completions|generations"
                            r"|(traj|trajectory|episode|rollout|completion|generation)_(results|outputs|list|records))"
                            r"(_(flat|flattened|all))?$", re.IGNORECASE)


def names_drawn_samples(name: str) -> bool:
    """`episodes`, `trajectories`: a list whose entries are the samples the policy drew, one each."""
    return _DRAWN_SAMPLES.match(name) is not None


# a Python list of each sequence's own log-probs (`new_log_probs_list`, `ref_logps_list`): sequences of different
# lengths are kept apart, not stacked into one padded tensor, so each entry holds one sequence's tokens
_SEQUENCE_LOGPROBS_LIST = re.compile(r"^_*(\w+_)?(log_?probs?|logps?|lps)_(list|lst)$", re.IGNORECASE)


def names_sequence_logprobs_list(name: str) -> bool:
    """`new_log_probs_list`, `ref_logps_list`: a list of log-prob tensors, one per sequence."""
    return _SEQUENCE_LOGPROBS_LIST.match(name) is not None


# one text, not a list of them: `prompt`, `prompt_text`, `question`, `full_text` (not `prompts`, `texts`, `batch`)
_ONE_TEXT = re.compile(r"^_*(\w+_)?(prompt|text|question|query|problem|instruction|conversation)(_(text|str|string))?$",
                       re.IGNORECASE)


def names_one_text(name: str) -> bool:
    """`prompt`, `prompt_text`, `question`: a variable that holds one text (encoded alone, a batch of one)."""
    return _ONE_TEXT.match(name) is not None


def names_reference_outputs(name: str) -> bool:
    """`ref_logps`, `teacher_log_probs`, `ref_logits`: the reference's (or a teacher's) log-probs or logits."""
    return tensor_role(name) in (REF, REF_LOGITS)


# a lagging copy of the policy that samples (`model_old`, `self.old_policy`, `actor_old`), not its log-probs
_OLD_MODEL = re.compile(r"^_*(old|prev|previous|behaviou?r)_(model|policy|actor|net|lm)$|^_*(model|policy|actor|net|lm)_old$",
                        re.IGNORECASE)


def is_old_policy_model(path: str) -> bool:
    """`model_old`, `self.old_policy`: a dotted path whose last part names a copy of the policy kept for sampling."""
    return _OLD_MODEL.match(path.replace("()", "").split(".")[-1]) is not None


def names_policy_model(name: str) -> bool:
    """`model`, `policy`, `actor_model`: a name for the policy model itself (not a copy of it, nor its log-probs)."""
    return _POLICY_MODEL.match(name) is not None


_POLICY_MODEL = re.compile(r"^(model|policy|actor|policy_model|actor_model|llm)$")


def logprobs_method_role(method: str, model: str) -> AtomKind | None:
    """What a model's method named for log-probs gives (`model.log_probs(ids, targets)`, minGPT's; `self.ref_model
    .get_logprobs(batch)`): each sampled token's log-prob under the reference, the policy's lagging copy or the policy,
    as `model` (the last name of the receiver) is named; None for a method of a sequence's total (`seq_log_probs`)
    or a receiver named otherwise (a distribution's `dist.log_prob(action)`)."""
    if not speaks_of_logprobs(method) or _SUMMED.search(method.replace("_", " ")):
        return None
    if names_reference_model(model):
        return REF
    if is_old_policy_model(model):
        return OLD
    return POLICY if names_policy_model(model) else None


def names_reference_model(name: str) -> bool:
    """`ref_model`, `reference_policy`, `teacher`: a reference model, not its log-probs (`ref_logprobs`) nor a KL or
    loss measured against it (`kl_ref = kl_ref_penalty.detach()`, logged in minimind's PPO epochs)."""
    return is_reference_model(name) and tensor_role(name) is None and _MEASURED_AGAINST.search(name) is None


_MEASURED_AGAINST = re.compile(r"(^|_)(kl|kld|div|loss|penalty)(_|$)", re.IGNORECASE)


# `new` / `old` / `current` alone are log-probs only in a function that speaks of ratios, log-probs or KL
# (a bare `ref` is the reference's everywhere: tensor_role).
_BARE_ROLES: dict[str, AtomKind] = {"new": POLICY, "old": OLD, "current": POLICY, "curr": POLICY, "cur": POLICY}
_LOGPROB_CONTEXT = re.compile(r"ratio|log_?probs?|logps?|kl", re.IGNORECASE)


def bare_parameter_role(name: str, other_names: Iterable[str]) -> AtomKind | None:
    """The role of a parameter named `new`, `old` or `current` when the function's other names are about
    log-probs (`def masked_kl(current, ref, mask)`)."""
    kind = _BARE_ROLES.get(name)
    if kind is None or not any(_LOGPROB_CONTEXT.search(other) for other in other_names):
        return None
    return kind


_CURRENT_POLICY = re.compile(r"^_*(new|curr|cur|current|trainer|student)_", re.IGNORECASE)


def is_current_policy_name(name: str) -> bool:
    """`trainer_logprobs`, `new_logprobs`: the policy being trained, differentiable even when a loss
    function reads them from its inputs object."""
    return _CURRENT_POLICY.match(name) is not None and tensor_role(name) == POLICY


# The sampled tokens' ids (`input_ids`, `comp_ids`, `labels`, `actions`, or one per row: `next_tok`), also kept in
# range or moved (`gen_ids_clamped`, `labels_safe`, `target_ids_long`), or a list of each sample's
# (`motion_vocab_ids_list`): an index by them over the vocabulary axis picks each token's entry, as a gather does.
_TOKEN_IDS = re.compile(r"^(.*_)?(ids|tokens|labels|actions|targets|tok|token|token_id|action)"
                        r"(_(clamped|clipped|safe|valid|long|device|dev|gpu|cuda|list|lst))?$", re.IGNORECASE)


def names_token_ids(name: str) -> bool:
    return _TOKEN_IDS.match(name) is not None


# Each sequence's own length (`rollout_lens`, `response_lengths`, `seq_lens`): plural, so that a scalar
# (`max_len`, `seq_len`: a constant divisor) is not one; packed offsets (`cu_seqlens`) are not lengths.
_LENGTHS = re.compile(r"^(?!cu_)(.*_)?(lens|lengths|seqlens)$", re.IGNORECASE)


def names_lengths(name: str) -> bool:
    """A name for the per-sequence token counts a per-sequence mean divides by."""
    return _LENGTHS.match(name) is not None


# What a loop over the tokens counts to (`range(T)`, `range(seq_len)`, `range(len(rewards))`, `enumerate(tokens)`):
# positions or per-token values, whose index picks a token, not a sequence.
_POSITIONS = re.compile(r"^[tl]$|len|step|time|token|(^|_)pos(ition)?s?(_|$)|horizon|new_tokens|reward|value|return"
                        r"|adv|delta|logp|logprob|(^|_)probs?$|logit|kl|mask|action|word|char", re.IGNORECASE)


# ... or counts other parts than sequences (`range(num_chunks)`, `for layer_idx in ...`, micro-batches, epochs)
_OTHER_PARTS = re.compile(r"chunk|block|layer|head|epoch|iter|micro|mini|shard|rank|turn|round|part|split|window"
                          r"|node|device|gpu|worker|groups|batches", re.IGNORECASE)


def counts_positions(name: str) -> bool:
    """A name a loop over the positions of a sequence, or over parts other than sequences, is spelled with."""
    return _POSITIONS.search(name) is not None or _OTHER_PARTS.search(name) is not None


@functools.lru_cache(maxsize=4096)  # a pure function of the name, asked at every attribute and parameter
def is_mask_name(name: str) -> bool:
    """A mask over the response tokens, or per-token loss weights (the mask scaled by a normaliser)."""
    return (_MASK.search(name) is not None and "logit" not in name.lower()) or _TOKEN_WEIGHTS.match(name) is not None


# The behaviour policy's log-probs summed over the response (`old_seq_logp`, `old_logp_sum`): the other
# side of a sequence-level ratio exp(sum_t logp_t - old_seq_logp) to the samples' policy.
_SUMMED = re.compile(r"(?<![a-z])(seq|sequence|sum|summed)(?![a-z])", re.IGNORECASE)


# Log-probs of each position's k most likely tokens (`student_topk_logprobs`, `teacher_topk_lp`): a slice of the
# vocabulary axis, [.., k], which a distillation loss sums over as it would over the whole vocabulary.
_TOP_K = re.compile(r"(?<![a-z0-9])top_?k(?![a-z])", re.IGNORECASE)


_STUDENT = re.compile(r"(?<![a-z0-9])(student|policy|actor|new|curr|current)(?![a-z])", re.IGNORECASE)


def names_top_k(name: str) -> bool:
    """`top_k_indices`, `topk_ids`, `torch.topk`: the k most likely tokens of each position, or their ids."""
    return _TOP_K.search(name) is not None


def _top_k_logprobs(name: str) -> AtomKind | None:
    """The vocabulary-level log-probs a top-k name denotes, of the side it names: the teacher's or reference's,
    or the student's or policy's (a bare `topk_logprobs` names neither)."""
    if _TOP_K.search(name) is None or not speaks_of_logprobs(name):
        return None
    if names_teacher(name) or tensor_role(name) == REF:
        return VOCAB_REF
    return VOCAB_POLICY if _STUDENT.search(name) else None


# The probability of the sampled token, not of the vocabulary (`taken_prob_ref`, `token_probs_old`,
# `action_prob`): exp of that token's log-prob, by the side the name gives it.
_TAKEN_PROBABILITY = re.compile(r"(?<![a-z0-9])(taken|token|action|selected|sampled)_probs?(?![a-z])"
                                r"|(?<![a-z0-9])probs?_(taken|token|action|selected|sampled)(?![a-z])", re.IGNORECASE)


def _taken_probability(name: str) -> AtomKind | None:
    """The probability a name gives the sampled token: the reference's, the behaviour policy's, or the policy's."""
    if _TAKEN_PROBABILITY.search(name) is None:
        return None
    return REF_PROB if _REFERENCE_SIDE.search(name) else OLD_PROB if _LAGGING_SIDE.search(name) else PROB


@functools.lru_cache(maxsize=4096)  # a pure function of its arguments (a polynomial is an immutable value)
def named_tensor(name: str, grad: bool) -> Poly | None:
    """The symbolic tensor a name denotes; reference and old log-probs and probabilities never carry gradient."""
    vocabulary = _top_k_logprobs(name)
    if vocabulary is not None:
        return Poly.atom(Atom(vocabulary, grad and vocabulary == VOCAB_POLICY))
    probability = _taken_probability(name)
    if probability is not None:
        return Poly.atom(Atom(probability, grad and probability == PROB))
    kind = tensor_role(name)
    if kind is None:
        return None
    if kind == OLD and _SUMMED.search(name.replace("_", " ")):
        return Poly.atom(Atom(kind, False, SEQUENCE))
    return Poly.atom(Atom(kind, grad and kind in (POLICY, LOGITS)))


# ---- producing calls --------------------------------------------------------------------

# Calls that turn logits (their first argument) into per-token log-probs of the sampled tokens.
LOGPROB_PRODUCERS = re.compile(
    r"^(selective_log_softmax|log_probs_from_logits|logprobs_from_logits|logprobs_of_labels|"
    r"gather_log_probs|log_prob_from_logits|gather_logprobs|token_log_probs)$"
)

# ---- sinks -------------------------------------------------------------------------------

_COEF = re.compile(r"coef|beta|weight|ctl|ctrl|scale|clip|eps|_fn$|type|mode|^num_|metric|stat", re.IGNORECASE)
_LOSS = re.compile(r"loss", re.IGNORECASE)
_ESTIMATOR_NAME = re.compile(r"(?<![a-z0-9])k[123](?![0-9])", re.IGNORECASE)  # k1, k2, k3 in a name
_REWARD = re.compile(r"^(.*_)?(rewards?|rews?|returns?)(_with_kl(_penalty|_penalties)?|_tensor)?$", re.IGNORECASE)
# the advantages the policy gradient is weighted by, also once a term is folded in (`adjusted_advantages`)
_ADVANTAGE = re.compile(r"^((token_level|final|adjusted|shaped|penalized|penalised|modified|combined)_)?"
                        r"(advantages?|advs?)$", re.IGNORECASE)
_ADVANTAGE_WORD = re.compile(r"(?<![a-z])advs?(?![a-z])|advantage", re.IGNORECASE)  # anywhere in a name
# An implicit reward, beta * log(pi_rm / ref), is what a DPO-style or PRIME reward model outputs: the score
# of that model, not a KL penalty on the policy being trained.
_IMPLICIT = re.compile(r"(?<![a-z0-9])implicit(?![a-z0-9])", re.IGNORECASE)


def names_advantage(name: str) -> bool:
    """`advantages`, `mb_adv`, `weighted_adv`, `token_level_advantages`: an advantage, a policy-gradient weight."""
    return _ADVANTAGE_WORD.search(name) is not None


def names_implicit_reward(name: str) -> bool:
    """`implicit_rewards`, `compute_implicit_reward`: a reward model's log-ratio, not the policy's KL."""
    return _IMPLICIT.search(name) is not None


# A cost (safe RLHF's constrained objective): minimised, its advantages subtracted from the reward's, so a
# KL term in it is judged where the two are combined, not where the cost is named
_COST = re.compile(r"(?<![a-z])costs?(?![a-z])", re.IGNORECASE)


@functools.lru_cache(maxsize=4096)  # a pure function of the name, asked for the same names again and again
def sink_of_name(name: str) -> SinkKind | None:
    """'loss', 'reward' or 'advantage' when a variable of that name is where a KL ends up."""
    bare = name.lstrip("_")
    if _COEF.search(bare) or _COST.search(bare):
        return None
    if _REWARD.match(bare) and not names_implicit_reward(bare):
        return "reward"
    if _ADVANTAGE.match(bare):
        return "advantage"
    if _LOSS.search(bare):
        return "loss"
    return None


# Containers and calls that only record statistics: a value stored or passed there is logged, not trained on.
_METRICS = re.compile(r"metric|stat(s|istics)?(?![a-z])|(?<![a-z])(log|logs|info|infos|summary|record|records|wandb|tb|"
                      r"tensorboard|report|logger|writer|tracker)(?![a-z])|^log_|gather_for_metrics|^print$",
                      re.IGNORECASE)
# Calls outside the linted tree that turn rewards into returns or advantages (GAE, RLOO, GRPO, whitening).
_RETURN_COMPUTATION = re.compile(r"advantage|returns?(?![a-z])|gae|rloo|grpo|reinforce|discount|whiten|baseline",
                                 re.IGNORECASE)


# A variable holding a mean or a baseline that a value is centred by (`mean`, `adv_mean`, `mu`, `baseline`)
_BASELINE = re.compile(r"(?<![a-z])(mean|means|avg|average|mu|baseline|baselines)(?![a-z])", re.IGNORECASE)


def names_baseline(name: str) -> bool:
    """`mean`, `mean_adv`, `group_baseline`: a name for the mean or baseline that a value is centred by."""
    return _BASELINE.search(name.lstrip("_")) is not None


@functools.lru_cache(maxsize=4096)  # a pure function of the name, asked for the same names again and again
def is_metrics_name(name: str) -> bool:
    """A container or call that only records statistics (`metrics`, `stats`, `log_dict`, `gather_for_metrics`)."""
    return _METRICS.search(name.lstrip("_")) is not None


_WHITENING = re.compile(r"whiten", re.IGNORECASE)


def names_whitening(name: str) -> bool:
    """`masked_whiten`, `whiten_advantages`: centring by the batch mean and scaling by the batch's deviation."""
    return _WHITENING.search(name) is not None


@functools.lru_cache(maxsize=4096)  # a pure function of the name, asked at every call the analysis does not follow
def is_return_computation(name: str) -> bool:
    """A call that turns token-level rewards into returns or advantages (`compute_gae_advantage_return`)."""
    return _RETURN_COMPUTATION.search(name.lstrip("_")) is not None


def is_loss_function(name: str) -> bool:
    """A function whose return value is a loss to be minimised. `def loss_fn(...)` is one (the `_fn` that marks a
    name holding a function says nothing of a function defined under it), but not `def k3_loss_fn(...)`: a KL
    estimate's helper, judged where the loss that calls it uses the estimate."""
    stem = name.removesuffix("_fn")
    if stem != name and (names_kl(stem) or _ESTIMATOR_NAME.search(stem)):
        return False
    return _LOSS.search(name) is not None and _COEF.search(stem) is None


# ---- names check-grad binds (the runtime audit reads them; the lint's sinks above are unchanged) ----

# The coefficient of the KL term: beta, kl_coef, init_kl_coef, kl_ctl (an adaptive controller whose
# `.value` is the coefficient), kl_loss_weight ... Not `alpha`: that is a mixing weight (TRL's JSD).
_KL_COEFFICIENT = re.compile(
    r"^(kl_)?beta(_kl)?$|^(\w+_)?kl_(\w+_)?(coef|coeff|coefficient|weight|scale|beta|ctl|ctrl|controller)$",
    re.IGNORECASE,
)
# Sequence-level task scores of a reward model ([B]): zeroed like a reward, but not a lint sink.
_TASK_SCORE = re.compile(r"^((rm|reward|task|sequence|seq)_)?scores?$", re.IGNORECASE)
# The sampled token ids of the responses (what log-probs are gathered at), as a trainer's argument names them
# (`sampled_token_ids`, `generated_ids`: the tokens drawn, after the prompt).
_SAMPLED_TOKEN_IDS = re.compile(
    r"^((sampled|generated)_)?(input_ids|response_ids|responses|response_tokens|token_ids|tokens|completion_ids|"
    r"output_ids|labels)$|^(sampled|generated)_ids$",
    re.IGNORECASE,
)
# A function that returns a reward to be maximised (a KL penalty enters it with a minus sign).
_REWARD_FUNCTION = re.compile(
    r"^(compute|get|calc|calculate|make|build|shape)?_?"
    r"((token_level|per_token|sequence_level|shaped|total|final|penalized|penalised)_)*rewards?(_with_\w+)?$",
    re.IGNORECASE,
)


def is_coefficient_name(name: str) -> bool:
    """A name that holds the KL coefficient beta (check-grad sets it to 1)."""
    return _KL_COEFFICIENT.match(name.lstrip("_")) is not None


# The coefficient of an entropy bonus (`entropy_weight`, `ent_coef`, `entropy_bonus`): another regulariser
# of the same loss, which check-grad switches off so that only the KL term is measured.
_ENTROPY_COEFFICIENT = re.compile(r"(?<![a-z])(entropy|ent)(?![a-z]).*(coef|coeff|weight|bonus|beta|scale|lambda)|"
                                  r"^entropy_bonus$", re.IGNORECASE)


def is_entropy_coefficient_name(name: str) -> bool:
    """A name that holds the coefficient of an entropy bonus (check-grad sets it to 0)."""
    return _ENTROPY_COEFFICIENT.search(name.lstrip("_")) is not None


def is_task_score_name(name: str) -> bool:
    """A sequence-level task score (`scores`, `rm_scores`): a reward the KL audit zeroes."""
    return _TASK_SCORE.match(name.lstrip("_")) is not None


def is_token_ids_name(name: str) -> bool:
    """The sampled token ids (`input_ids`, `responses`, `completion_ids`)."""
    return _SAMPLED_TOKEN_IDS.match(name.lstrip("_")) is not None


def is_reward_function(name: str) -> bool:
    """A function whose return value is a reward to be maximised (`compute_rewards`)."""
    return _REWARD_FUNCTION.match(name.lstrip("_")) is not None and not is_loss_function(name)


# Modules whose functions are array operations, as code spells them: torch, NumPy, and the JAX and MLX
# array libraries (`jnp.exp`, `jax.lax.stop_gradient`, `mx.take_along_axis`), read as torch's.
ARRAY_MODULES = frozenset({"torch", "F", "torch.nn.functional", "nn.functional", "np", "numpy", "math",
                           "jax", "jnp", "jax.numpy", "jax.nn", "jax.lax", "mx", "mlx.core"})

BACKWARD_CALLS = re.compile(r"^(backward|manual_backward)$")
NO_GRAD_CONTEXTS = re.compile(r"^(no_grad|inference_mode|disable_grad)$")
LOGGING_METHODS = re.compile(r"^(item|tolist|numpy|cpu)$")
