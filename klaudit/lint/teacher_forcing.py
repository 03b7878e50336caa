"""Distillation and supervised KL losses, told apart from a KL penalty on the policy's own samples.

Teacher forcing: an exact per-position KL on a dataset's sequences rather than on the policy's samples.

Distillation code (a student fitted to a teacher) often sums KL_t(student || teacher) over the vocabulary
at each position of fixed training sequences, the positions chosen by the supervised-target convention
(`labels != ignore_index`). The prefixes of such sequences do not depend on the student, so the gradient of
each position's KL is the whole gradient of that objective: no later-token term is missing (KL003's
"When this is fine"). On the student's own samples the same code is an on-policy KL loss that misses
that term. A loss module alone does not say which: where the function masks by labels and nothing in
its module samples, the term's use is undetermined (KL100), not a KL003 defect.

The exact forward KL(teacher || student) is forward-KL distillation, an objective of its own choosing, and in a
loss that names no reward, return or advantage it is a supervised loss (an SFT anchor, a Fisher estimate): only
a forward KL to the reference in an RL loss is row 3b's KL002 (klaudit.lint.checks asks `speaks_of_a_teacher` and
`trains_on_rewards`).
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Sequence

import libcst as cst

from klaudit.lint import roles
from klaudit.lint.syntax import int_literal, last_name, python_ast, text_of, walk

# Words of code that samples from the policy it trains, or that works on such samples; a model's generation
# config (`set_generation_config(model)`, fixed before saving an SFT model) samples nothing: `generate` would.
_SAMPLING = re.compile(r"generat|sampl|rollout|completion|response|reward|advantage|policy|vllm", re.IGNORECASE)
_GENERATION_CONFIG = re.compile(r"generation_?config", re.IGNORECASE)
_TARGETS = re.compile(r"^(\w*_)?(labels?|targets?)$", re.IGNORECASE)


class FunctionIndex:
    """Which of a module's functions holds a node (where a KL term was formed), indexed at the first question."""

    def __init__(self, functions: Sequence[tuple[cst.FunctionDef, object]]):
        self.functions = functions
        self._owner: dict[int, cst.FunctionDef] | None = None

    def of(self, node: cst.CSTNode | None) -> cst.FunctionDef | None:
        if node is None:
            return None
        if self._owner is None:
            self._owner = {}
            for function, _ in reversed(self.functions):  # the first function holding a node wins, as in a search
                self._owner.update((id(inner), function) for inner in walk(function))
        return self._owner.get(id(node))


def teacher_forced(function: cst.FunctionDef, origin: cst.CSTNode | None, index: FunctionIndex, source: str) -> bool:
    """Whether a KL term that `function` puts into a loss may be on a dataset's sequences: the module samples
    nothing, and `function` or the module's function that formed the term (a `distillation_loss` its caller
    adds to the task loss) picks positions by labels."""
    labelled = masks_by_labels(function)
    if not labelled:
        formed = index.of(origin)
        labelled = formed is not None and formed is not function and masks_by_labels(formed)
    return labelled and samples_nowhere(source)


def speaks_of_a_teacher(function: cst.FunctionDef | None) -> bool:
    """Whether the names of `function` speak of a distillation teacher (`t_logp = log_softmax(teacher_logits)`) and
    none of them of the reference: the distribution a KL term formed there is taken against."""
    if function is None:
        return False
    names = {node.value for node in walk(function) if type(node) is cst.Name}
    return any(roles.names_teacher(name) for name in names) and not any(roles.names_the_reference(name) for name in names)


_REWARD_WORD = re.compile(r"(?<![a-z0-9])(rewards?|returns?|scores?)(?![a-z])", re.IGNORECASE)


def trains_on_rewards(function: cst.FunctionDef) -> bool:
    """Whether `function` names rewards, returns or advantages (`loss = -(logp * batch["advantages"]).mean() + kl`): the
    loss it builds is an RL objective, not a supervised one (an SFT anchor, a distillation or Fisher loss on a
    dataset)."""
    for node in walk(function):
        word = (node.value if type(node) is cst.Name else node.attr.value if type(node) is cst.Attribute
                else text_of(node) if type(node) is cst.SimpleString else None)
        if word and (_REWARD_WORD.search(word) or roles.names_advantage(word)):
            return True
    return False


# Words of code that generates sequences itself (`model.generate`, a vLLM engine, rollouts, `torch.multinomial`); a
# data sampler (`DistributedSampler`) or a count of consumed samples generates nothing.
_GENERATING = re.compile(r"generat|rollout|vllm|multinomial|^sample$", re.IGNORECASE)
_CHOSEN = re.compile(r"chosen", re.IGNORECASE)
_REJECTED = re.compile(r"reject", re.IGNORECASE)


def on_preference_pairs(function: cst.FunctionDef, origin: cst.CSTNode | None, index: FunctionIndex,
                        source: str) -> bool:
    """Whether a KL term `function` puts into a loss is on a preference dataset's fixed sequences: `function`, or
    the function that formed the term, reads chosen and rejected responses (`inputs["chosen_input_ids"]`,
    `chosen_ids, c_mask, reject_ids, ... = data`), and nothing in the module generates. The sampled estimators'
    verdicts are about the policy's own samples; on fixed data the term is a regularizer of the data's
    log-ratios, whose gradient no row of the table describes (a clamp or a wrong sign is still wrong: catalog's
    SAMPLE_FREE_RULES)."""
    formed = index.of(origin)
    readers = [function] if formed is None or formed is function else [function, formed]
    return any(_reads_chosen_and_rejected(reader) for reader in readers) and generates_nowhere(source)


def _reads_chosen_and_rejected(function: cst.FunctionDef) -> bool:
    words = [node.value for node in walk(function) if isinstance(node, (cst.Name, cst.SimpleString))]
    return any(_CHOSEN.search(word) for word in words) and any(_REJECTED.search(word) for word in words)


def masks_by_labels(function: cst.FunctionDef) -> bool:
    """Whether `function` picks positions the supervised way: an (in)equality test of its labels or
    targets (`labels != pad`), or of anything against an ignore index (`target != self.ignore_index`,
    `y == -100`); or fits the same positions to their labels by cross-entropy (`F.cross_entropy(logits,
    hard_targets)` beside the KL: the sequences have ground-truth next tokens, a dataset's)."""
    for node in walk(function):
        if type(node) is cst.Call and last_name(node.func) in _SUPERVISED_LOSSES and any(
                type(inner) is cst.Name and _TARGETS.match(inner.value) for arg in node.args for inner in walk(arg)):
            return True
        if type(node) is not cst.Comparison:
            continue
        for target in node.comparisons:
            if type(target.operator) in (cst.NotEqual, cst.Equal) and (
                    _TARGETS.match(last_name(node.left) or "") or _is_ignore_index(target.comparator)):
                return True
    return False


_SUPERVISED_LOSSES = frozenset({"cross_entropy", "nll_loss"})


def _is_ignore_index(node: cst.BaseExpression) -> bool:
    """`ignore_index`, `self.ignore_index`, `IGNORE_INDEX` or -100 (the cross-entropy default)."""
    return int_literal(node) == -100 or "ignore_index" in (last_name(node) or "").lower()


def samples_nowhere(source: str) -> bool:
    """Whether no name the module's code uses or defines is a word of sampling (generation, rollouts,
    completions, rewards); its docstrings and comments may say anything."""
    names = _module_identifiers(source)
    return names is not None and not any(_SAMPLING.search(_GENERATION_CONFIG.sub("", name)) for name in names)


def generates_nowhere(source: str) -> bool:
    """Whether no name the module's code uses or defines is a word of generating sequences (`_GENERATING`)."""
    names = _module_identifiers(source)
    return names is not None and not any(_GENERATING.search(name) for name in names)


@functools.lru_cache(maxsize=8)
def _module_identifiers(source: str) -> frozenset[str] | None:
    """The names a module's code uses or defines; None for a module Python cannot parse."""
    try:
        return frozenset(_identifiers(python_ast(source)))  # the tree is shared with the syntax check
    except (SyntaxError, ValueError, RecursionError):
        return None


def _identifiers(tree: ast.Module) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.keyword) and node.arg is not None:
            names.add(node.arg)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
    return names
