"""Shapes of code met after the forty-fourth blind set that the lint misread: loss helpers whose callers live in
other modules, and arguments that are another argument detached."""

from __future__ import annotations

import pytest

from klaudit.lint.engine import lint_paths
from klaudit.lint.project import Project

# A loss helper of a package (Wang-Zhongwei/RLHF_from_scatch's rlhf/grpo.py): a PPO ratio to `old_logprobs` and a k3
# loss to the reference; nothing in its own module calls it.
HELPER = """\
import torch


def grpo_loss(new_logprobs, old_logprobs, advantages, ref_logprobs=None, kl_coef=0.0):
    ratio = torch.exp(new_logprobs - old_logprobs)
    policy_loss = -(ratio * advantages).mean()
    kl = torch.zeros(())
    if ref_logprobs is not None and kl_coef != 0.0:
        r = ref_logprobs - new_logprobs
        kl = (r.exp() - r - 1).mean()
    return {"policy_loss": policy_loss, "kl": kl, "loss": policy_loss + kl_coef * kl}
"""

# A script in a sibling folder: `{body}` is its loop's body, indented by eight spaces.
SCRIPT = """\
import torch
from rlhf.grpo import grpo_loss


def sample_group(model, prompt):
    return model.generate(prompt, do_sample=True)


def train(model, ref_model, prompts, opt):
    for prompt in prompts:
{body}
"""

ONE_STEP = """\
        seqs = sample_group(model, prompt)
        new_lp = model.logprobs(seqs)
        with torch.no_grad():
            ref_lp = ref_model.logprobs(seqs)
        loss = grpo_loss(new_lp, new_lp.detach(), seqs.rewards, ref_lp, kl_coef=0.1)["loss"]
        opt.zero_grad()
        loss.backward()
        opt.step()"""
# four optimizer steps on one group: every step after the first trains on an older policy's samples
FOUR_EPOCHS = """\
        seqs = sample_group(model, prompt)
        with torch.no_grad():
            old_lp = model.logprobs(seqs)
            ref_lp = ref_model.logprobs(seqs)
        for epoch in range(4):
            new_lp = model.logprobs(seqs)
            loss = grpo_loss(new_lp, old_lp, seqs.rewards, ref_lp, kl_coef=0.1)["loss"]
            opt.zero_grad()
            loss.backward()
            opt.step()"""

# A unit test of the helper on made-up tensors, the old log-probs the new ones detached: a ratio of 1.
UNIT_TEST = """\
import torch
from rlhf.grpo import grpo_loss


def test_grpo_loss_runs():
    lp = torch.randn(4, requires_grad=True)
    out = grpo_loss(lp, lp.detach(), torch.randn(4), ref_logprobs=torch.randn(4), kl_coef=0.1)
    out["loss"].backward()
    assert lp.grad is not None
"""


def _found(root):
    result = lint_paths([str(root)], jobs=1)
    return sorted((finding.path.split(str(root) + "/", 1)[-1], finding.code) for finding in result.findings)


def _package(root, **modules):
    (root / "rlhf").mkdir()
    (root / "rlhf" / "__init__.py").write_text("")
    (root / "rlhf" / "grpo.py").write_text(HELPER)
    for path, text in modules.items():
        (root / path).mkdir(exist_ok=True)
        (root / path / "run.py").write_text(text)


@pytest.mark.parametrize("body, stale", [(ONE_STEP, False), (FOUR_EPOCHS, True)])
def test_a_loss_helper_called_from_another_folder_follows_its_callers_steps(tmp_path, body, stale):
    """A helper that nothing in its module calls, called by a script of a sibling folder that steps once per group
    it samples, is trained on the policy that drew the group: its ratio to the old log-probs is 1 there and its
    own report says on-policy (KL002, no KL008). A script that takes four steps per group is off-policy."""
    _package(tmp_path, experiments=SCRIPT.format(body=body))
    found = _found(tmp_path)
    assert ("rlhf/grpo.py", "KL002") in found
    assert (("rlhf/grpo.py", "KL008") in found) is stale


def test_a_helper_deeper_in_the_tree_follows_a_script_of_a_top_folder(tmp_path):
    """The helper two folders down (`src/rlhf/grpo.py`), its one caller a script of the root's `scripts/` folder
    (yuxuanliang1/IEMS_490_Assignment3): found there, and on-policy where that script steps once per draw."""
    (tmp_path / "src" / "rlhf").mkdir(parents=True)
    (tmp_path / "src" / "rlhf" / "grpo.py").write_text(HELPER)
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "train.py").write_text(SCRIPT.format(body=ONE_STEP).replace("rlhf.grpo", "src.rlhf.grpo"))
    found = _found(tmp_path)
    assert ("src/rlhf/grpo.py", "KL002") in found and ("src/rlhf/grpo.py", "KL008") not in found


def test_a_helper_no_module_calls_keeps_reading_its_ratio_as_older_samples(tmp_path):
    """With no caller near it, the helper's parameters are all the lint knows: `old_logprobs` in a ratio is the
    behaviour policy's, whose samples are older (KL008)."""
    _package(tmp_path)
    assert ("rlhf/grpo.py", "KL008") in _found(tmp_path)


def test_a_unit_test_that_passes_the_log_probs_detached_is_on_policy(tmp_path):
    """`grpo_loss(lp, lp.detach(), ...)` in a test whose `lp` names nothing the lint knows: the old log-probs are
    the new ones without gradient (exp(logp - sg logp)), not an older policy's; and a test that takes no optimizer
    step trains the helper on no older samples either. The term is reported once, in the helper that returns it in
    its dict of losses, not again where the test reads `out["loss"]`."""
    _package(tmp_path, tests=UNIT_TEST)
    found = _found(tmp_path)
    assert ("rlhf/grpo.py", "KL002") in found and ("tests/run.py", "KL002") not in found
    assert not [site for site in found if site[1] == "KL008"]


def test_a_test_beside_a_script_that_reuses_its_samples_does_not_clear_the_helper(tmp_path):
    """A test that takes no step is left out of the callers' verdict, not counted for it: the script's four epochs
    still make the helper off-policy."""
    _package(tmp_path, tests=UNIT_TEST, experiments=SCRIPT.format(body=FOUR_EPOCHS))
    assert ("rlhf/grpo.py", "KL008") in _found(tmp_path)


def test_a_loop_of_symbolic_links_has_a_key(tmp_path):
    """A file that is a loop of symbolic links (`loop.py -> loop.py`) beside a linted module: its key is its path,
    not a crash of the lint."""
    (tmp_path / "loop.py").symlink_to(tmp_path / "loop.py")
    assert Project([tmp_path]).key(tmp_path / "loop.py") == str(tmp_path / "loop.py")


# A copy of a framework's trainer kept in a package of the project (juzizi44/GRPO4CodeGen_v2's
# grpo/trl_grpo_trainer.py): TRL's own relative imports, which this tree cannot satisfy, and a k3 loss.
TRAINER_COPY = """\
import torch

from ..data_utils import apply_chat_template
from .grpo_config import GRPOConfig


class GRPOTrainer:
    def compute_loss(self, per_token_logps, ref_per_token_logps, advantages, mask):
        per_token_kl = torch.exp(ref_per_token_logps - per_token_logps) - (ref_per_token_logps - per_token_logps) - 1
        per_token_loss = -(per_token_logps * advantages.unsqueeze(1)) + 0.04 * per_token_kl
        return (per_token_loss * mask).sum() / mask.sum()
"""
# the project's own trainer: a subclass of the installed TRL's
OWN_TRAINER = "from trl import GRPOTrainer\n\n\nclass CodeTrainer(GRPOTrainer):\n    pass\n"


@pytest.mark.parametrize("readme, data_utils, reported", [
    ("Train with train.py.\n", False, False),
    # an instruction to copy it over the installed framework's module: the copy runs there
    ("cp grpo/trl_grpo_trainer.py $TRL/trainer/grpo_trainer.py\n", False, True),
    # its relative imports resolve in this tree: a module like any other
    ("Train with train.py.\n", True, True),
])
def test_a_framework_copy_whose_imports_the_tree_lacks_is_stranded(tmp_path, readme, data_utils, reported):
    """A module whose relative imports name modules its package lacks fails at import however it is reached; where
    no other file names it, it is a stranded copy whose KL code never runs (no finding). Named by the README's
    instruction to copy it into the installed framework, or with its imports satisfied, it is linted."""
    (tmp_path / "grpo").mkdir()
    (tmp_path / "grpo" / "__init__.py").write_text("")
    (tmp_path / "grpo" / "trl_grpo_trainer.py").write_text(TRAINER_COPY)
    (tmp_path / "grpo" / "train.py").write_text(OWN_TRAINER)
    (tmp_path / "README.md").write_text(readme)
    if data_utils:
        (tmp_path / "data_utils.py").write_text("def apply_chat_template(x):\n    return x\n")
        (tmp_path / "grpo" / "grpo_config.py").write_text("class GRPOConfig:\n    pass\n")
    assert bool([site for site in _found(tmp_path) if site[0] == "grpo/trl_grpo_trainer.py"]) is reported


# Zzzft/GRPO-from-scratch's shape: a loss helper whose parameters are named so that nothing says what they hold
# (`prob_per_token_reference`), and a training script of another module that hands it the reference's log-probs.
NAMELESS_HELPER = """\
import torch


def get_per_token_log_probs(model, input_ids):
    logits = model(input_ids=input_ids).logits[:, :-1, :]
    log_probs = torch.nn.functional.log_softmax(logits, dim=-1)
    return log_probs.gather(dim=-1, index=input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)


def get_grpo_loss(model, ids, mask, advantage, old_per_token_logps, prob_per_token_reference, beta):
    prob_per_token_policy = get_per_token_log_probs(model, ids)
    coef = (prob_per_token_policy - old_per_token_logps).exp()
    kl = (prob_per_token_policy - prob_per_token_reference).exp() - (prob_per_token_policy - prob_per_token_reference) - 1
    return ((-coef * advantage.unsqueeze(1) + beta * kl) * mask).sum() / mask.sum()
"""
# `{reference}` computes the reference's log-probs under no_grad, indented by twelve spaces
NAMELESS_SCRIPT = """\
import torch
from grpo_utils import get_per_token_log_probs, get_grpo_loss


def train(model_policy, model_reference, batches, optimizer):
    for ids, mask, advantage in batches:
        with torch.no_grad():
{reference}
        loss = get_grpo_loss(model_policy, ids, mask, advantage, prob_per_token_old, prob_per_token_reference, 0.04)
        loss.backward()
        optimizer.step()
"""
AT_ONCE = """\
            prob_per_token_old = get_per_token_log_probs(model_policy, ids)
            prob_ref = get_per_token_log_probs(model_reference, ids)
            prob_per_token_reference = prob_ref"""
IN_CHUNKS = """\
            prob_per_token_old = get_per_token_log_probs(model_policy, ids)
            prob_per_token_reference = []
            for i in range(0, len(ids), 4):
                prob_ref_batch = get_per_token_log_probs(model_reference, ids[i:i + 4])
                prob_per_token_reference.append(prob_ref_batch)
            prob_per_token_reference = torch.cat(prob_per_token_reference, dim=0)"""


@pytest.mark.parametrize("reference", [AT_ONCE, IN_CHUNKS])
def test_a_term_a_helper_forms_from_arguments_its_names_do_not_explain_is_reported_at_the_call(tmp_path, reference):
    """The helper alone cannot tell what `prob_per_token_reference` holds, so its own lint sinks no KL; given the
    reference's log-probs and the rollout's by the script (at once, or the reference's gathered chunk by chunk into
    a list joined by torch.cat, which holds no positions to pick), it forms exp(logp - ref) - (logp - ref) - 1, k3 with
    the ratio reversed (row 5b, KL009) beside a PPO ratio of 1: reported at the call, the caller's lint being its
    only report."""
    (tmp_path / "grpo_utils.py").write_text(NAMELESS_HELPER)
    (tmp_path / "main.py").write_text(NAMELESS_SCRIPT.format(reference=reference))
    assert ("main.py", "KL009") in _found(tmp_path)
    assert not [site for site in _found(tmp_path) if site[0] == "grpo_utils.py"]


def test_a_helper_its_own_lint_reads_is_not_reported_again_at_the_call(tmp_path):
    """Where the helper's names do say what its parameters hold, its own lint reports the term and the call adds
    no second report of it."""
    (tmp_path / "grpo_utils.py").write_text(NAMELESS_HELPER.replace("prob_per_token_reference", "ref_per_token_logps"))
    (tmp_path / "main.py").write_text(NAMELESS_SCRIPT.format(reference=AT_ONCE))
    found = _found(tmp_path)
    assert ("grpo_utils.py", "KL009") in found and ("main.py", "KL009") not in found


def test_a_stranded_copy_at_the_root_of_a_tree_linted_as_dot_is_found(tmp_path, monkeypatch):
    """trotsky1997/self-refine-grpo keeps TRL's trainer at its root (`raw_grpo_trainer.py`, `from ..data_utils import
    ...`): linted as `klaudit lint .`, the folder above `./raw_grpo_trainer.py` is the one above the working folder,
    which holds no `data_utils` either."""
    root = tmp_path / "project"
    root.mkdir()
    (root / "raw_grpo_trainer.py").write_text(TRAINER_COPY)
    (root / "train.py").write_text(OWN_TRAINER)
    monkeypatch.chdir(root)
    assert [finding for finding in lint_paths(["."], jobs=1).findings if "raw_grpo_trainer" in finding.path] == []


# JohanesSetiawan/arithmetic-rl's shape (forty-sixth set): the loss is a module's forward, called through the object a
# trainer of another module builds from it.
LOSS_MODULE = """\
import torch
from torch import nn


class GRPOLoss(nn.Module):
    def __init__(self, kl_weight=0.01):
        super().__init__()
        self.kl_weight = kl_weight

    def forward(self, log_probs, old_log_probs, ref_log_probs, advantages, action_mask):
        ratio = torch.exp(log_probs - old_log_probs)
        log_ratio = ref_log_probs - log_probs
        kl = log_ratio.exp() - log_ratio - 1
        loss = -ratio * advantages.unsqueeze(1) + self.kl_weight * kl
        return ((loss * action_mask).sum(1) / action_mask.sum(1)).mean()
"""
# `{body}` is the update after a rollout, indented by eight spaces
LOSS_MODULE_TRAINER = """\
import torch
from .grpo_loss import GRPOLoss


class Trainer:
    def __init__(self, model, optimizer):
        self.model, self.optimizer = model, optimizer
        self.objective = GRPOLoss(kl_weight=0.04)

    def train_step(self, prompts):
        with torch.no_grad():
            batch = self.rollout(prompts)
{body}

    def rollout(self, prompts):
        return self.model.generate(prompts, do_sample=True)
"""
ONE_UPDATE = """\
        loss = self.objective(self.model.logprobs(batch), batch.old_log_probs, batch.ref_log_probs, batch.advantages,
                              batch.action_mask)
        loss.backward()
        self.optimizer.step()"""
FOUR_UPDATES = """\
        for epoch in range(4):
            loss = self.objective(self.model.logprobs(batch), batch.old_log_probs, batch.ref_log_probs,
                                  batch.advantages, batch.action_mask)
            loss.backward()
            self.optimizer.step()"""


@pytest.mark.parametrize("body, stale", [(ONE_UPDATE, False), (FOUR_UPDATES, True)])
def test_a_loss_modules_forward_follows_the_trainer_that_calls_its_object(tmp_path, body, stale):
    """`GRPOLoss.forward` is never called by its name: the trainer calls the object it built (`self.objective(...)`).
    One optimizer step per rollout makes the ratio to the rollout's log-probs 1, and the k3 loss on-policy (KL002, no
    KL008); four steps per rollout do not."""
    (tmp_path / "rl").mkdir()
    (tmp_path / "rl" / "__init__.py").write_text("")
    (tmp_path / "rl" / "grpo_loss.py").write_text(LOSS_MODULE)
    (tmp_path / "rl" / "trainer.py").write_text(LOSS_MODULE_TRAINER.format(body=body))
    found = _found(tmp_path)
    assert ("rl/grpo_loss.py", "KL002") in found
    assert (("rl/grpo_loss.py", "KL008") in found) is stale


# TRL's GRPOTrainer shape: one helper gathers the log-probs of whichever model it is given, chunk by chunk into a
# list, for the policy (with gradient), the rollout (under no_grad) and the reference (under no_grad).
CHUNKED_HELPER_TRAINER = """\
import torch


class Trainer:
    def _get_per_token_logps(self, model, input_ids, batch_size=4):
        all_logps = []
        for start in range(0, input_ids.size(0), batch_size):
            outputs = model(input_ids=input_ids[start:start + batch_size])
            all_logps.append(outputs.log_probs)
        return torch.cat(all_logps, dim=0)

    def _generate(self, inputs):
        with torch.no_grad():
            inputs["old_per_token_logps"] = self._get_per_token_logps(self.model, inputs["ids"])
            inputs["ref_per_token_logps"] = self._get_per_token_logps(self.ref_model, inputs["ids"])
        return inputs

    def compute_loss(self, model, inputs):
        per_token_logps = self._get_per_token_logps(model, inputs["ids"])
        ref = inputs["ref_per_token_logps"]
        per_token_kl = torch.exp(ref - per_token_logps) - (ref - per_token_logps) - 1
        ratio = torch.exp(per_token_logps - inputs["old_per_token_logps"])
        loss = -(ratio * inputs["advantages"].unsqueeze(1)) + 0.04 * per_token_kl
        return (loss * inputs["mask"]).sum() / inputs["mask"].sum()
"""


def test_a_helpers_list_of_the_policys_log_probs_is_read_by_the_caller_that_knows_the_model(tmp_path):
    """The helper's list holds the policy's log-probs of whatever model it ran: which model (the reference, the
    rollout's policy) is its caller's to say, so the list does not fix them as a rollout's; the k3 loss beside the
    PPO ratio is read as before (KL002, KL008)."""
    (tmp_path / "trainer.py").write_text(CHUNKED_HELPER_TRAINER)
    assert {code for _, code in _found(tmp_path)} == {"KL002", "KL008"}
