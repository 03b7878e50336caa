"""Shapes of the fortieth blind set that the lint misread."""

from __future__ import annotations

import pytest
from snippets import module_codes

from klaudit.lint.engine import lint_paths

HELPERS = """\
import torch


def get_per_token_logps(model, input_ids, attention_mask):
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
    log_probs = torch.log_softmax(logits[:, :-1, :], dim=-1)
    return log_probs.gather(2, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
"""
NO_GRAD_LOGITS = """\
    with torch.no_grad():
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
"""

K1_PENALTY = """\
from helpers import get_per_token_logps


def kl_penalty(comp_logps, ref_model, ids, mask):
    ref_logps = get_per_token_logps(ref_model, ids, mask)
    kl = comp_logps - ref_logps
    return ((kl * mask).sum(dim=1) / mask.sum(dim=1)).mean()


def train_step(model, ref_model, ids, mask, advantages, optimizer):
    logits = model(ids).logits
    logps = logits.log_softmax(-1).gather(2, ids.unsqueeze(-1)).squeeze(-1)
    policy_loss = -(advantages * logps.sum(1)).mean()
    loss = policy_loss + 0.05 * kl_penalty(logps, ref_model, ids, mask)
    loss.backward()
    optimizer.step()
"""


@pytest.mark.parametrize("no_grad", [False, True])
def test_a_no_grad_helper_run_on_the_reference_returns_the_references_log_probs(tmp_path, no_grad):
    """karinazad/nano-rlvr's `get_per_token_logps(ref_model, ...)` computes its logits under `torch.no_grad()`:
    what a no_grad function returns was read as the rollout's (old) log-probs before the caller could say it
    ran on the reference model, so the k1 loss `logp - ref_logp` was no KL at all; with or without the block it
    is row 1b, a per-sequence token mean of k1 as a loss."""
    helpers = HELPERS.replace(HELPERS.splitlines(keepends=True)[4], NO_GRAD_LOGITS) if no_grad else HELPERS
    assert module_codes(K1_PENALTY, tmp_path, helpers=helpers) == [(14, "KL001")]


SEQUENCE_K3 = """\
import torch
import torch.nn.functional as F


def get_loss(model, batch, output_ids, kl_coeff):
    logits = model(batch["ids"]).logits
    LOG_PROBS
    pg_loss = -torch.mean(torch.sum(log_probs, dim=-1) * batch["rewards"])
    pretrained_log_probs = batch["pretrained_log_probs"]
    log_ratio = pretrained_log_probs.sum(axis=1) - log_probs.sum(axis=1)
    kl_loss = torch.mean(torch.exp(log_ratio) - log_ratio - 1)
    loss = pg_loss + kl_coeff * kl_loss
    return loss
"""


@pytest.mark.parametrize("log_probs", [
    "log_probs = F.log_softmax(logits, -1).gather(2, output_ids.unsqueeze(-1)).squeeze(-1)",
    # the sampled tokens' probabilities, then their log: log pi(y_t) as well
    "probs = torch.gather(F.softmax(logits, dim=-1), 2, output_ids.unsqueeze(-1)).squeeze(-1); log_probs = probs.log()",
    "probs = F.softmax(logits, dim=-1)[:, :, output_ids]; log_probs = torch.log(probs + 1e-10)",
])
def test_the_pretrained_models_log_probs_are_the_reference_and_a_log_of_picked_probabilities_a_log_prob(
        tmp_path, log_probs):
    """katiekang1998/SimpleGRPO names its reference `pretrained_model` and stores its log-probs under
    `pretrained_log_probs`, and its REINFORCE takes `softmax`, gathers the sampled tokens and then `.log()`:
    the k3 of the summed log-ratio as a loss is row 18 (KL002, the forward KL), which neither name nor the
    log of a picked probability let the lint see."""
    source = SEQUENCE_K3.replace("LOG_PROBS", log_probs.replace("; ", "\n    "))
    line = 12 if ";" in log_probs else 11
    assert module_codes(source, tmp_path) == [(line, "KL002")]


BINARY_KL = """\
import torch


def binary_kd_loss(student_log_probs, teacher_log_probs, target_ids):
    student_p = torch.exp(student_log_probs.gather(1, target_ids.unsqueeze(1)).squeeze(1))
    teacher_p = torch.exp(teacher_log_probs.gather(1, target_ids.unsqueeze(1)).squeeze(1))
    teacher_bin = torch.stack([teacher_p, 1.0 - teacher_p], dim=-1)
    student_bin = torch.stack([student_p, 1.0 - student_p], dim=-1)
    kl_bin = (teacher_bin * (torch.log(teacher_bin) - torch.log(student_bin))).sum(dim=-1)
    loss = kl_bin.mean()
    loss.backward()
"""


def test_the_log_of_probabilities_stacked_with_their_complement_is_no_log_prob(tmp_path):
    """almogtavor/SE-KD3x's AT-KD stacks each target token's probability with its complement, `[p, 1 - p]`, and
    takes a binary KL to the teacher's: once a picked probability's log became its log-prob, the stack's log read
    as the student's log-probs alone, and the binary forward KL as a k1 bonus. The log of pieces of which one has
    no meaning has none as a whole."""
    assert module_codes(BINARY_KL, tmp_path) == []


LIVE_ACTOR = """\
import torch


class Actor:
    def update(self, logp, ref_logp, mask, pg_loss):
        kl = torch.exp(ref_logp - logp) - (ref_logp - logp) - 1
        loss = pg_loss + 0.1 * (kl * mask).sum() / mask.sum()
        loss.backward()
"""


def _write_project(root, copy_name="dp_actor_old.py", trainer="from dp_actor import Actor\n"):
    (root / "dp_actor.py").write_text(LIVE_ACTOR)
    (root / copy_name).write_text(LIVE_ACTOR)
    (root / "train.py").write_text(trainer + "\nif __name__ == '__main__':\n    Actor()\n")


def _lines(result):
    return sorted((finding.path.rsplit("/", 1)[-1], finding.code) for finding in result.findings)


def test_a_backup_copy_nothing_names_is_not_analysed(tmp_path):
    """Computer-use-agents/dart-gui keeps `dp_actor_merged.py` beside `dp_actor.py`, the same DataParallelPPOActor
    again, and xiaomi-research/r1-aqa a `grpo_trainer_new.py` beside `grpo_trainer.py`: no file of either project
    imports, launches or names them, so their KL code never runs. Only the live module is reported."""
    _write_project(tmp_path)
    assert _lines(lint_paths([str(tmp_path)], jobs=1)) == [("dp_actor.py", "KL002")]


def test_a_copy_named_anywhere_or_on_the_command_line_is_analysed(tmp_path):
    """A copy that a file names (a registry's string, a launch, the README) may run, and one the user names on the
    command line is linted whatever the project says."""
    _write_project(tmp_path)
    (tmp_path / "README.md").write_text("Try `python -c 'import dp_actor_old'` for the previous version.\n")
    assert _lines(lint_paths([str(tmp_path)], jobs=1)) == [("dp_actor.py", "KL002"), ("dp_actor_old.py", "KL002")]
    (tmp_path / "README.md").unlink()
    named = lint_paths([str(tmp_path), str(tmp_path / "dp_actor_old.py")], jobs=1)
    assert _lines(named) == [("dp_actor.py", "KL002"), ("dp_actor_old.py", "KL002")]


def test_two_modules_with_one_class_that_nothing_names_are_both_analysed(tmp_path):
    """A library whose users import it from outside names neither module: neither is taken for the other's copy."""
    _write_project(tmp_path, trainer="")
    assert _lines(lint_paths([str(tmp_path)], jobs=1)) == [("dp_actor.py", "KL002"), ("dp_actor_old.py", "KL002")]



def test_a_notebook_beside_a_variant_of_it_is_run_by_itself(tmp_path):
    """Grinta-Protocol/qwen-rl-shanghai (eighty-seventh set) keeps `train_grpo_continue.ipynb`, a later 200-step run,
    beside `train_grpo.ipynb`, the two defining one class; a config names only the first. A notebook is opened and run
    by itself, never imported by name: the second is no backup copy of the first."""
    import json

    def notebook(source):
        cell = {"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [], "source": source}
        return json.dumps({"cells": [cell], "metadata": {}, "nbformat": 4, "nbformat_minor": 5})

    (tmp_path / "train_grpo.ipynb").write_text(notebook(LIVE_ACTOR))
    (tmp_path / "train_grpo_continue.ipynb").write_text(notebook(LIVE_ACTOR))
    (tmp_path / "config.py").write_text("# Training hyperparameters (for train_grpo.ipynb)\nBETA = 0.1\n")
    assert _lines(lint_paths([str(tmp_path)], jobs=1)) == [("train_grpo.ipynb", "KL002"),
                                                           ("train_grpo_continue.ipynb", "KL002")]


OWN_TRAINER = """\
import torch
from transformers import Trainer


class GRPOTrainer(Trainer):
    def compute_loss(self, model, inputs):
        logits = model(inputs["input_ids"]).logits
        per_token_logps = logits.log_softmax(-1).gather(2, inputs["completion_ids"].unsqueeze(-1)).squeeze(-1)
        ref_per_token_logps = inputs["ref_per_token_logps"]
        per_token_kl = torch.exp(ref_per_token_logps - per_token_logps) - (ref_per_token_logps - per_token_logps) - 1
        return (self.beta * per_token_kl).sum()
"""

TRAIN_SCRIPT = """\
from trl import GRPOConfig
from TRAINER_MODULE import GRPOTrainer

training_args = GRPOConfig(output_dir="out", beta=0.1, num_generations=4)
trainer = GRPOTrainer(model=None, args=training_args, train_dataset=None)
trainer.train()
"""


@pytest.mark.parametrize("trainer_module, flagged", [("rl_trainer", False), ("trl", True)])
def test_trls_config_handed_to_the_projects_own_trainer_is_not_judged_as_trls(tmp_path, trainer_module, flagged):
    """yynil/RWKVInside's rl/train_rl.py builds TRL's `GRPOConfig(beta=0.1)` and hands it to `GRPOTrainer` from its
    own rl_trainer.py, a transformers Trainer with a loss of its own (reported there, KL002): the flags were judged
    as if TRL's GRPOTrainer ran. Handed to TRL's GRPOTrainer, they are."""
    (tmp_path / "rl_trainer.py").write_text(OWN_TRAINER)
    (tmp_path / "train_rl.py").write_text(TRAIN_SCRIPT.replace("TRAINER_MODULE", trainer_module))
    found = {(finding.path.rsplit("/", 1)[-1], finding.code) for finding in lint_paths([str(tmp_path)], jobs=1).findings}
    assert ("rl_trainer.py", "KL002") in found
    assert any(path == "train_rl.py" for path, _ in found) is flagged


@pytest.mark.parametrize("live, other", [
    ("trainer.py", "trainer_old.py"),  # a one-word name under eight letters: too common to tell a variant by
    ("dp_actor.py", "ppo_loss.py"),  # one class name, but no name inside the other's: two modules, not a copy
])
def test_modules_that_only_share_a_class_or_a_common_word_are_both_analysed(tmp_path, live, other):
    """An example folder's independent scripts define one `Actor` each, and `trainer_old.py` beside `trainer.py`
    may be any module whose name holds a word as common as `trainer`: neither is read as a backup copy."""
    (tmp_path / live).write_text(LIVE_ACTOR)
    (tmp_path / other).write_text(LIVE_ACTOR)
    stem = live.removesuffix(".py")
    (tmp_path / "train.py").write_text(f"from {stem} import Actor\n\nif __name__ == '__main__':\n    Actor()\n")
    assert _lines(lint_paths([str(tmp_path)], jobs=1)) == sorted([(live, "KL002"), (other, "KL002")])
