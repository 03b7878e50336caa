"""Shapes of the forty-second blind set that the lint misread."""

from __future__ import annotations

import pytest

from klaudit.lint.engine import lint_paths

TRAINER = """\
import torch


class Trainer:
    def loss(self, logp, ref_logp, mask, pg_loss):
        kl = torch.exp(ref_logp - logp) - (ref_logp - logp) - 1
        return pg_loss + 0.04 * (kl * mask).sum() / mask.sum()
"""


def _found(root, *paths):
    result = lint_paths([str(root / path) for path in paths] or [str(root)], jobs=1)
    return sorted((finding.path.rsplit("/", 1)[-1], finding.code) for finding in result.findings)


@pytest.mark.parametrize("init, siblings, importable", [
    # xavierliu34/GUI-AiF: `Dbeta.py` was never committed; only its compiled copy sits in __pycache__
    ("from .grpo_trainer import Trainer\nfrom .Dbeta import DynamicBetaManager\n", ["__pycache__/Dbeta.cpython-310.pyc"],
     False),
    ("from .grpo_trainer import Trainer\nfrom .Dbeta import DynamicBetaManager\n", ["Dbeta.py"], True),
    ("from .grpo_trainer import Trainer\nfrom .beta import Manager\n", ["beta/__init__.py"], True),
    # a module the package has, without the name imported from it
    ("from .grpo_trainer import Trainer\nfrom .Dbeta import BetaScheduler\n", ["Dbeta.py"], False),
    ("from .grpo_trainer import Trainer\nfrom .fused import kernel\n", ["fused.cpython-311-x86_64-linux-gnu.so"], True),
    # written by the build (setuptools-scm, protoc), absent from every checkout
    ("from .grpo_trainer import Trainer\nfrom ._version import version\n", [], True),
    ("from .grpo_trainer import Trainer\nfrom .messages_pb2 import Request\n", [], True),
    # an import the package expects may fail
    ("from .grpo_trainer import Trainer\ntry:\n    from .Dbeta import DynamicBetaManager\nexcept ImportError:\n    pass\n",
     [], True),
])
def test_a_package_importing_a_module_it_lacks_trains_nothing(tmp_path, init, siblings, importable):
    """`import package.module` runs the package's `__init__.py` first; one that imports a module of its own folder
    the project lacks raises ImportError there, so no module of the package trains. A source, a package folder or a
    compiled extension of that name is the module; a generated module or a guarded import is not taken as missing."""
    package = tmp_path / "trainer"
    package.mkdir()
    (package / "__init__.py").write_text(init)
    (package / "grpo_trainer.py").write_text(TRAINER)
    for sibling in siblings:
        (package / sibling).parent.mkdir(exist_ok=True)
        (package / sibling).write_text("DynamicBetaManager = Manager = None\n")
    expected = [("grpo_trainer.py", "KL002")] if importable else []
    assert _found(tmp_path) == expected
    assert _found(tmp_path, "trainer/grpo_trainer.py") == [("grpo_trainer.py", "KL002")]  # named: always linted


SCRIPT = TRAINER + """

if __name__ == "__main__":
    Trainer()
"""


@pytest.mark.parametrize("folder, named_by, backup", [
    # Spi1er/Clipping-Aware-Policy-Optimization-Comparison-Suite keeps its trainers from before a rewrite
    ("backup_before_wandb", None, True),
    ("old", None, True),
    ("deprecated-v1", None, True),
    ("backup_before_wandb", "README.md", False),  # the documentation tells users to run it
    ("backup_before_wandb", "run.sh", False),
    ("experiments", None, False),  # no name of a backup
])
def test_a_folder_of_backups_of_the_scripts_beside_it_is_not_analysed(tmp_path, folder, named_by, backup):
    """`trainer/backup_before_wandb/train_grpo.py` repeats `trainer/train_grpo.py` by its file name, in a folder
    named as a backup that no file outside it names: the superseded copies never run, scripts included."""
    live = tmp_path / "trainer"
    (live / folder).mkdir(parents=True)
    (live / "train_grpo.py").write_text(SCRIPT)
    (live / folder / "train_grpo.py").write_text(SCRIPT)
    (live / folder / "helpers.py").write_text(TRAINER)
    if named_by is not None:
        (tmp_path / named_by).write_text(f"python trainer/{folder}/train_grpo.py\n")
    found = _found(tmp_path)
    assert found.count(("train_grpo.py", "KL002")) == (1 if backup else 2)
    assert (("helpers.py", "KL002") in found) is not backup
    assert _found(tmp_path, f"trainer/{folder}/train_grpo.py") == [("train_grpo.py", "KL002")]


def test_a_backup_folder_repeating_no_module_above_it_is_analysed(tmp_path):
    """`old/` holding modules of its own (no file name shared with the folder above) is code like any other."""
    (tmp_path / "old").mkdir()
    (tmp_path / "train.py").write_text(SCRIPT)
    (tmp_path / "old" / "loss.py").write_text(TRAINER)
    assert _found(tmp_path) == [("loss.py", "KL002"), ("train.py", "KL002")]


REINFORCE = """\
import torch


def update(policy, ref_policy, batch, kl_coeff, optimizer):
    logprob = policy.log_probs(batch)
    with torch.no_grad():
        ref_logprob = ref_policy.log_probs(batch)
    kl_return = batch.returns - kl_coeff * ({kl})
    loss = ({multiplier} * kl_return).sum()
    loss.backward()
    optimizer.step()
"""


@pytest.mark.parametrize("kl, multiplier, codes", [
    # navidmdn/LLM_RL: the k1 keeps its gradient in each token's return: logp * k1 as a loss (row 13d)
    ("logprob - ref_logprob", "-logprob", ["KL009"]),
    # detached, it is a k1 reward on its own token only (row 2)
    ("(logprob - ref_logprob).detach()", "-logprob", ["KL003"]),
    # a sequence's summed log-prob times its undetached summed log-ratio: the sequence form, row 13e (gargrohin/
    # reinforce, seventy-first set, whose penalty is the log-ratio's mean over a fixed number of new tokens)
    ("(logprob - ref_logprob).sum(-1)", "-logprob.sum(-1)", ["KL009"]),
    # detached, the sequence's k1 with its whole-sequence return: unbiased (row 6), nothing to say
    ("(logprob - ref_logprob).sum(-1).detach()", "-logprob.sum(-1)", []),
    # a token's log-prob times the sequence's summed log-ratio: neither form, no catalog row, nothing said
    ("(logprob - ref_logprob).sum(-1, keepdim=True)", "-logprob", []),
])
def test_an_undetached_k1_in_a_return_that_multiplies_the_log_prob(tmp_path, kl, multiplier, codes):
    (tmp_path / "reinforce.py").write_text(REINFORCE.format(kl=kl, multiplier=multiplier))
    assert [code for _, code in _found(tmp_path)] == codes


REPLAY = """\
import torch
from tqdm import tqdm


class Trainer:
    def update_policy(self, num_update_steps):
        for i in tqdm(range(num_update_steps)):
            batch = self.{source}
            logp = self.policy.log_probs(batch)
            ref_logp = self.ref_policy.log_probs(batch).detach()
            kl = torch.exp(ref_logp - logp) - (ref_logp - logp) - 1
            loss = -(logp * batch.advantages).mean() + 0.04 * kl.mean()
            loss.backward()
            self.optimizer.step()
"""


@pytest.mark.parametrize("source, stale", [
    ("buffer.sample(32)", True),  # a replay buffer of earlier rollouts: every step after the first is off-policy
    ("generate_rollouts(32)", False),  # a fresh rollout before each step
])
def test_steps_on_draws_from_a_replay_buffer_train_on_older_samples(tmp_path, source, stale):
    """`for i in tqdm(range(n))` is n rounds; a draw from a buffer is no new rollout of the current policy."""
    (tmp_path / "trainer.py").write_text(REPLAY.format(source=source))
    codes = [code for _, code in _found(tmp_path)]
    assert "KL002" in codes and ("KL008" in codes) is stale


SQUARED = """\
import torch


def k2_loss(log_probs, batch, ref_model, mask):
    if ref_model is not None:
        with torch.no_grad():
            ref_log_probs = ref_model(batch)
    else:
        ref_log_probs = torch.zeros_like(log_probs)
    log_ratio = log_probs - ref_log_probs
    k2 = 0.5 * {square}
    return (k2 * mask).sum() / mask.sum()
"""


@pytest.mark.parametrize("square", ["log_ratio**2", "log_ratio.pow(2)", "log_ratio * log_ratio", "(log_ratio * log_ratio)"])
def test_a_square_multiplies_each_value_by_itself(tmp_path, square):
    """The log-ratio is d with a reference and the log-prob alone without one (ellanorai/ThinkRL, one-covenant/grail):
    its square is d^2 (k2, KL003) or logp^2 (no KL), never the cross product logp * d of two paths, which read as
    row 13d (KL009)."""
    (tmp_path / "loss.py").write_text(SQUARED.format(square=square))
    assert [code for _, code in _found(tmp_path)] == ["KL003"]


CALLEE_DRAWS = """\
import torch


def grpo_step(policy, ref_policy, prompts, samples):
{draw}    logp = policy.log_probs(prompts, samples)
    with torch.no_grad():
        ref_logp = ref_policy.log_probs(prompts, samples)
    kl = torch.exp(ref_logp - logp) - (ref_logp - logp) - 1
    return -(logp * samples.advantages).mean() + 0.04 * kl.mean()


def train(policy, ref_policy, prompts, optimizer, samples):
    for step in range(100):
        loss = grpo_step(policy, ref_policy, prompts, samples)
        loss.backward()
        optimizer.step()
"""
DRAW = """\
    probs = torch.softmax(policy(prompts)[:, -1], dim=-1)
    samples = torch.multinomial(probs, 1)
"""


@pytest.mark.parametrize("draw, stale", [(DRAW, False), ("", True)])
def test_a_step_function_that_samples_draws_new_samples(tmp_path, draw, stale):
    """viralcode/superGPT: the loop steps once per `grpo_step(...)`, which samples its completions with
    torch.multinomial itself: each step is on fresh samples. Reading a loop's draws into the functions it calls
    ends that false KL008; a step function handed the same samples at every step trains on older ones."""
    (tmp_path / "grpo.py").write_text(CALLEE_DRAWS.format(draw=draw))
    codes = [code for _, code in _found(tmp_path)]
    assert "KL002" in codes and ("KL008" in codes) is stale
