"""Which KL loss and KL reward belong to one training step (checks._paired).

A KL loss and a KL reward of one step are one configuration of kl-math.md section 8 (e.g. k3 loss +
k3 reward-to-go, R-C). Terms on exclusive paths, or a REINFORCE term that is already a loss of its
own, are not such a pair: each is judged alone.
"""

from __future__ import annotations

import textwrap

import libcst as cst

from klaudit.lint.checks import check_module
from klaudit.lint.project import Project


def findings(body: str, tmp_path) -> list:
    text = "import torch\n\n\n" + textwrap.dedent(body)
    path = tmp_path / "snippet.py"
    path.write_text(text)
    found = check_module(str(path), cst.parse_module(text), Project([tmp_path]), text)
    return sorted({(f.line, f.code) for f in found if f.code != "KL100"})


def test_branches_of_a_numeric_setting_exclude_each_other(tmp_path):
    """`if rl_weight == 0:` pure distillation (ratio * sg(k1) on its own token: row 2, KL003, with a token ratio
    to the rollout policy: row 23, KL008), else a k1 loss (row 1, KL001); never one 'k1 loss + k1 reward' (KL009)."""
    body = """
    def distill_loss(logprobs, input_data, loss, mask):
        old_logp = input_data["logprobs"]
        teacher_logp = input_data["teacher_logp"]
        rl_weight = input_data.get("rl_weight", 1.0)
        if rl_weight == 0:
            gap = teacher_logp - logprobs.detach()
            weighted = torch.exp(logprobs - old_logp) * gap * mask
            loss = -weighted.sum() / mask.sum()
        else:
            penalty = ((logprobs - teacher_logp) * mask).sum() / mask.sum()
            loss = rl_weight * loss + 0.01 * penalty
        return loss
    """
    assert findings(body, tmp_path) == [(12, "KL003"), (12, "KL008"), (15, "KL001")]


def test_a_reinforce_term_of_one_loss_is_no_reward_of_another(tmp_path):
    """Two losses of one step: ratio * sg(k1) (rows 2/23) and a k1 loss (rows 1/22), each judged alone."""
    body = """
    def step(logp, old_logp, teacher_logp, mask):
        w = torch.exp(logp - old_logp)
        kd_loss = -(w * (teacher_logp - logp).detach() * mask).sum()
        kd_loss.backward()
        kl_loss = ((logp - teacher_logp) * mask).sum()
        kl_loss.backward()
    """
    assert findings(body, tmp_path) == [(7, "KL003"), (7, "KL008"), (9, "KL001"), (9, "KL008")]


_SELF_DISTILLATION = """
def self_distillation_loss(student_logps, {source}_logps, ref_logps, mask, beta):
    advantage = {source}_logps - student_logps
    per_token_loss = -advantage.detach() * student_logps
    per_token_kl = torch.exp(ref_logps - student_logps) - (ref_logps - student_logps) - 1
    per_token_loss = per_token_loss + beta * per_token_kl
    return (per_token_loss * mask).sum() / mask.sum()
"""


def test_a_distillation_term_and_a_reference_kl_are_two_objectives(tmp_path):
    """Self-distillation with beta > 0 (EasyDeL's and SDPO's trainers): sg(student - teacher) * log pi on its own
    token is a k1 reward to the teacher with the local gradient only (row 2, KL003), and the k3 loss against the
    reference follows the forward KL (row 3, KL002). Two KLs to two distributions, neither in the sum of line 9
    nor across the advantage of line 6 one 'k3 loss + k1 reward' configuration (KL009)."""
    assert findings(_SELF_DISTILLATION.format(source="teacher"), tmp_path) == [(6, "KL003"), (9, "KL002")]


def test_a_reference_reward_in_the_same_loss_is_still_paired(tmp_path):
    """The control: the same code with the reference's log-probs in the advantage is one configuration against
    one distribution, a k3 loss with a same-token k1 reward, which no row of section 8 makes unbiased (KL009)."""
    assert (9, "KL009") in findings(_SELF_DISTILLATION.format(source="reference"), tmp_path)


_DISTILLATION_STEP = """
import torch.nn.functional as F


def step(student_logits, teacher_logits, student_logps, {source}_logps, mask):
    s = F.log_softmax(student_logits, -1)
    t = F.log_softmax(teacher_logits, -1)
    reg = F.kl_div(t, s, reduction="none", log_target=True).sum(-1)
    reg_loss = (reg * mask).sum()
    rewards = {source}_logps - student_logps
    advantages = rewards.flip(-1).cumsum(-1).flip(-1)
    pg = -(advantages.detach() * student_logps * mask).sum()
    loss = pg + reg_loss
    loss.backward()
"""


def test_an_exact_teacher_kl_and_a_teacher_reward_are_one_configuration(tmp_path):
    """MiniLLM's single-step decomposition: the exact per-step KL(student || teacher), formed by F.kl_div
    from the teacher's logits and reduced later, beside a k1 reward-to-go to the same teacher: the local
    term counted twice (row 14, KL006), at the loss and again where it is summed into the step's loss."""
    assert findings(_DISTILLATION_STEP.format(source="teacher"), tmp_path) == [(12, "KL006"), (16, "KL006")]


def test_an_exact_teacher_kl_and_a_reference_reward_are_two(tmp_path):
    """The same step with the reward taken against the reference: the k1 reward-to-go is row 6 (correct),
    the exact KL to the teacher a per-token loss alone (row 2, KL003); no pair across the two."""
    assert findings(_DISTILLATION_STEP.format(source="ref"), tmp_path) == [(12, "KL003")]
