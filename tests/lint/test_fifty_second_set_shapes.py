"""Shapes of code met in the fifty-second blind set that the lint misread.

- `torch.square(v - returns)`, a critic's squared error against returns that hold a detached KL reward, was read as
  a detached k2 added to the loss, while `(v - returns) ** 2` was not. Every spelling of a square now takes one
  path, which leaves the cross terms of a value the analysis does not follow (the critic's prediction) out.
- ReFT's rollout takes GAE with SciPy's lfilter over a reversed NumPy row, in a utilities module with no KL words,
  and writes it into the advantages row by row (`adv[i][:-1] = ...`): the call was not followed, the row store was
  not read as a store into `adv`, and the KL reward never reached the PPO loss."""

from __future__ import annotations

import pytest

from klaudit.lint.engine import lint_paths
from tests.lint.snippets import K3_STEP

# DylanJoo/retrisound's PPO, reduced: a ranking policy's log-prob per step (a sum over the items it ranks), the
# first step's log-prob as the reference, a k1 penalty in the rewards, and a critic's prediction the analysis does
# not follow, regressed on the returns.
CRITIC = """\
import torch


def train(policy, value_model, batch, args, steps):
    logprobs, ref_logprobs = [], []
    with torch.no_grad():
        for n in range(steps):
            logprob = sequence_log_prob(policy, batch, n)
            if n == 0:
                ref_logprob = logprob.clone()
            logprobs.append(logprob)
            ref_logprobs.append(ref_logprob)
        logprobs = torch.stack(logprobs, 1)
        ref_logprobs = torch.stack(ref_logprobs, 1)
        kl = logprobs - ref_logprobs
        rewards = -args.kl_coef * kl + batch.scores
        returns = rewards + batch.values
    for epoch in range(4):
        for idx in batch.minibatches:
            mb_return = returns[idx]
            vpred = predict(value_model, batch.states[idx])
            vf_losses1 = {square}


def sequence_log_prob(policy, batch, n):
    return policy(batch, n).logits.log_softmax(-1).gather(-1, batch.actions[n]).sum(-1)
"""

# the square of a detached log-ratio itself, added to a trained loss: k2 without its gradient (row 1c)
DETACHED = """\
import torch


def step(policy, ref, batch, beta, optimizer):
    logp = policy(batch.input_ids).logits.log_softmax(-1).gather(-1, batch.actions).squeeze(-1)
    with torch.no_grad():
        ref_logp = ref(batch.input_ids).logits.log_softmax(-1).gather(-1, batch.actions).squeeze(-1)
        kl = logp - ref_logp
    pg_loss = -(logp * batch.advantages).mean()
    loss = pg_loss + beta * 0.5 * ({square}).mean()
    loss.backward()
    optimizer.step()
"""


def _codes(tmp_path, source):
    (tmp_path / "ppo.py").write_text(source)
    result = lint_paths([str(tmp_path)], jobs=1)
    assert result.errors == []
    return sorted({finding.code for finding in result.findings})


@pytest.mark.parametrize("square", ["torch.square({})", "({}).square()", "({}) ** 2", "torch.pow({}, 2)",
                                    "({0}) * ({0})"])
def test_a_critics_squared_error_against_kl_shaped_returns_is_no_detached_k2(tmp_path, square):
    assert "KL001" not in _codes(tmp_path, CRITIC.format(square=square.format("vpred - mb_return")))


@pytest.mark.parametrize("square", ["torch.square({})", "({}).square()", "({}) ** 2", "torch.pow({}, 2)",
                                    "({0}) * ({0})"])
def test_the_square_of_a_detached_log_ratio_added_to_a_loss_is_still_a_detached_k2(tmp_path, square):
    assert "KL001" in _codes(tmp_path, DETACHED.format(square=square.format("kl")))


# ReFT's PPO rollout (lqtrung1998/mwp_ReFT, vendored by WNQzhu/CARFT in the fifty-second set), reduced: a detached k1
# written into a NumPy reward array, GAE as the SpinningUp-style `discount_cumsum` (SciPy's lfilter over the reversed
# row, reversed back) from a utilities module with no KL words, written row by row into an array (adv[i][:-1] = ...),
# then two PPO epochs on the rollout (row 23: KL008), each response's surrogate divided by its length (row 21: KL007).
ROLLOUT = """\
import numpy as np
import torch
from trl.core import logprobs_from_logits
from {helpers} import discount_cumsum


def rollout(model, ref_model, ids, scores, kl_coef, gamma, lam):
    with torch.no_grad():
        lm_logits, _, values = model(input_ids=ids)
        old_logprob = logprobs_from_logits(lm_logits[:, :-1, :], labels=ids[:, 1:])
        ref_logits, _, _ = ref_model(input_ids=ids)
        ref_logprob = logprobs_from_logits(ref_logits[:, :-1, :], labels=ids[:, 1:])
    mask = torch.ones_like(ids, dtype=torch.bool)
    task_rew = np.zeros(mask.shape)
    task_rew[:, -2] = np.array(scores)
    kl = old_logprob - ref_logprob
    kl = (kl.float() * mask[:, :-1]).cpu().numpy()
    kl_rew = np.zeros(mask.shape)
    kl_rew[:, :-1] = -kl
    rew = task_rew + kl_coef * kl_rew
    val = (values.float() * mask).cpu().numpy()
    adv = np.zeros_like(rew)
    for i in range(len(rew)):
        delta = -val[i][:-1] + rew[i][:-1] + gamma * val[i][1:]
        adv[i][:-1] = discount_cumsum(delta, gamma * lam)
    return ids, mask, torch.tensor(adv, device=mask.device) * mask, old_logprob


def train(model, ref_model, batches, optimizer, kl_coef, gamma, lam, mini_batch_size):
    for batch in batches:
        ids, mask, adv, old_logprob = rollout(model, ref_model, batch.ids, batch.scores, kl_coef, gamma, lam)
        for _ in range(2):
            perms = torch.randperm(len(ids))
            for start in range(0, len(perms), mini_batch_size):
                idx = perms[start:start + mini_batch_size]
                lm_logits, _, _ = model(input_ids=ids[idx])
                logprob = logprobs_from_logits(lm_logits[:, :-1, :], labels=ids[idx][:, 1:])
                ratio = torch.exp(logprob - old_logprob[idx])
                pg_losses = -adv[idx][:, :-1] * ratio
                pg_losses2 = -adv[idx][:, :-1] * torch.clamp(ratio, 0.8, 1.2)
                lengths = torch.clamp(torch.sum(mask[idx], dim=1), min=1.0)
                loss = ((torch.max(pg_losses, pg_losses2) * mask[idx][:, :-1]).sum(dim=-1) / lengths).mean()
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
"""

HELPERS = """\
import scipy.signal


def discount_cumsum(rewards, discount):
    return scipy.signal.lfilter([1], [1, -discount], x={signal})[::-1]
"""


def _messages(tmp_path, helpers, signal):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "__init__.py").write_text("")
    (tmp_path / "src" / "utils.py").write_text(HELPERS.format(signal=signal))
    (tmp_path / "train.py").write_text(ROLLOUT.format(helpers=helpers))
    result = lint_paths([str(tmp_path)], jobs=1)
    assert result.errors == []
    return sorted((finding.code, finding.message.split(":")[0]) for finding in result.findings)


def test_a_discounted_cumsum_of_the_reversed_rewards_is_a_reward_to_go(tmp_path):
    # each response's surrogate divided by its own length (row 21), the rollout trained twice (row 23)
    reading = "k1 in the reward (reward-to-go), seq-token-mean, token-is"
    assert _messages(tmp_path, "src.utils", "rewards[::-1]") == [("KL007", reading), ("KL008", reading)]


def test_a_running_sum_of_the_rewards_in_their_own_order_is_no_reward_to_go(tmp_path):
    # lfilter over the row as it is sums each token's past rewards: the same-token reading stays (KL003 beside KL008)
    codes = {code for code, _ in _messages(tmp_path, "src.utils", "rewards")}
    assert "KL003" in codes


# Brian-Konr/d2qplus, reduced: two training scripts import reward classes that the reward module beside them does not
# define (it was rewritten); Python stops at that import, so their KL code never trains.
REWARDS = """\
class BaseReward:
    pass


class FormatReward(BaseReward):
    pass
"""

SCRIPT = "import torch\nfrom {module} import {name}\n" + K3_STEP + """

if __name__ == "__main__":
    step(*{name}.arguments())
"""


def _reported(tmp_path, module, name, package=False, named=False, elsewhere=False):
    folder = tmp_path / "src"
    folder.mkdir()
    (folder / "reward.py").write_text(REWARDS)
    if elsewhere:  # another reward module of the project, which a path set up at run time may reach first
        (tmp_path / "lib").mkdir()
        (tmp_path / "lib" / "reward.py").write_text(REWARDS + "\n\nclass CoverageRewardModel(BaseReward):\n    pass\n")
    (folder / "train.py").write_text(SCRIPT.format(module=module, name=name))
    if package:
        (folder / "__init__.py").write_text("")
    result = lint_paths([str(folder / "train.py") if named else str(tmp_path)], jobs=1)
    return sorted({finding.code for finding in result.findings})


@pytest.mark.parametrize("module", ["reward", ".reward"])
def test_a_script_importing_a_name_its_neighbour_lacks_never_trains(tmp_path, module):
    assert _reported(tmp_path, module, "CoverageRewardModel") == []


@pytest.mark.parametrize("module, name, package, named, elsewhere", [
    ("reward", "FormatReward", False, False, False),  # the neighbour has it
    ("reward", "CoverageRewardModel", True, False, False),  # a package's module imports `reward` from the path
    ("reward", "CoverageRewardModel", False, True, False),  # a file named on the command line is always linted
    ("torch.nn", "CoverageRewardModel", False, False, False),  # a module outside the project
    ("reward", "CoverageRewardModel", False, False, True),  # another reward.py of the project has it
])
def test_an_import_the_project_may_satisfy_leaves_the_script_linted(tmp_path, module, name, package, named, elsewhere):
    assert _reported(tmp_path, module, name, package, named, elsewhere) == ["KL002"]


@pytest.mark.parametrize("mention", [
    'print("[CoverageRewardModel] rewritten")\n',  # in a string: mentioned, not bound
    "# CoverageRewardModel was here\n",  # in a comment
])
@pytest.mark.parametrize("module", ["reward", "src.reward"])
def test_a_name_only_mentioned_by_its_module_is_still_missing(tmp_path, mention, module):
    """martinjingyu/Multi-Turn-Jailbreaker (seventy-second set): `trainer/grpo_vllm_one.py`, the project's old entry
    point, imports `from trainer.gen_worker import gen_worker`, a dotted path from the project's root (the script's
    folder is no package), and `trainer/gen_worker.py` no longer defines it: it only prints `[gen_worker]` in its
    messages. The import fails, so the script's KL code never trains."""
    folder = tmp_path / "src"
    folder.mkdir()
    (folder / "reward.py").write_text(REWARDS + mention)
    (folder / "train.py").write_text(SCRIPT.format(module=module, name="CoverageRewardModel"))
    assert lint_paths([str(tmp_path)], jobs=1).findings == []
    (folder / "reward.py").write_text(REWARDS + mention + "CoverageRewardModel = FormatReward\n")  # bound: it trains
    assert {finding.code for finding in lint_paths([str(tmp_path)], jobs=1).findings} == {"KL002"}
