"""A KL estimate added to a loss without its gradient (kl-math.md section 8, row 1c: KL001).

The KL is computed from log-probs taken under torch.no_grad(), detached, or turned into a number with .item(),
then added to a loss whose policy-gradient part does carry a gradient: back-propagation trains that part and
never reaches the KL, so the penalty regularises nothing (allenai/open-instruct #530 was this bug). A detached
estimate is right where it multiplies a score (a reward); a critic's squared error against returns that hold
the KL reward is a regression target, not a KL term; and a loss with no gradient anywhere (an evaluation under
no_grad, a total built for the log) is not a training loss to judge.
"""

from __future__ import annotations

import textwrap

import pytest
from snippets import module_codes

POLICY = """\
    import torch


    def token_logprobs(model, batch):
        logits = model(batch["input_ids"]).logits
        return torch.log_softmax(logits, -1).gather(-1, batch["labels"].unsqueeze(-1)).squeeze(-1)


"""

NO_GRAD_KL = POLICY + """\
    def train_step(policy, ref_model, batch, optimizer, beta=0.05):
        logp = token_logprobs(policy, batch)
        with torch.no_grad():
            ref_logp = token_logprobs(ref_model, batch)
            log_ratio = ref_logp - logp
            kl = (torch.exp(log_ratio) - 1 - log_ratio).mean()
        pg_loss = -(batch["advantages"] * logp).mean()
        loss = pg_loss + beta * kl
        loss.backward()
        optimizer.step()
"""

DETACHED_KL = POLICY + """\
    def train_step(policy, ref_model, batch, optimizer, beta=0.05):
        logp = token_logprobs(policy, batch)
        with torch.no_grad():
            ref_logp = token_logprobs(ref_model, batch)
        kl = (logp - ref_logp).detach()
        pg_loss = -(batch["advantages"] * logp).mean()
        loss = pg_loss + beta * 0.5 * (kl ** 2).mean()
        loss.backward()
        optimizer.step()
"""

ITEM_KL = POLICY + """\
    def train_step(policy, ref_model, batch, optimizer, beta=0.05):
        logp = token_logprobs(policy, batch)
        with torch.no_grad():
            ref_logp = token_logprobs(ref_model, batch)
        kl = (logp - ref_logp).mean().item()
        loss = -(batch["advantages"] * logp).mean() + beta * kl
        loss.backward()
        optimizer.step()
"""


@pytest.mark.parametrize("source, line", [(NO_GRAD_KL, 16), (DETACHED_KL, 15), (ITEM_KL, 14)],
                         ids=["no_grad", "detach", "item"])
def test_a_kl_without_gradient_in_a_trained_loss_is_kl001(source, line, tmp_path):
    assert module_codes(source, tmp_path) == [(line, "KL001")]


def test_the_finding_says_the_gradient_is_missing(tmp_path):
    from klaudit.lint.engine import lint_paths

    (tmp_path / "step.py").write_text(textwrap.dedent(NO_GRAD_KL))
    (finding,) = lint_paths([str(tmp_path)]).findings
    assert "k3 added to the loss without its gradient" in finding.message
    assert "exactly zero" in finding.message


KL_IN_REWARD = POLICY + """\
    def train_step(policy, ref_model, batch, optimizer, beta=0.05):
        logp = token_logprobs(policy, batch)
        with torch.no_grad():
            ref_logp = token_logprobs(ref_model, batch)
            rewards = batch["rewards"] - beta * (logp - ref_logp)
            returns = rewards.flip(-1).cumsum(-1).flip(-1)
        loss = -(returns * logp).mean()
        loss.backward()
        optimizer.step()
"""

EVALUATION = POLICY + """\
    @torch.no_grad()
    def evaluate(policy, ref_model, batch, beta=0.05):
        logp = token_logprobs(policy, batch)
        ref_logp = token_logprobs(ref_model, batch)
        log_ratio = ref_logp - logp
        loss = -(batch["advantages"] * logp).mean() + beta * (torch.exp(log_ratio) - 1 - log_ratio).mean()
        return loss
"""

SCORE_WEIGHTED = POLICY + """\
    def train_step(policy, ref_model, batch, optimizer, beta=0.05):
        logp = token_logprobs(policy, batch)
        with torch.no_grad():
            ref_logp = token_logprobs(ref_model, batch)
        kl = (logp - ref_logp).detach()
        returns = kl.flip(-1).cumsum(-1).flip(-1)
        loss = -(batch["advantages"] * logp).mean() + beta * (logp * returns).mean()
        loss.backward()
        optimizer.step()
"""


CRITIC_TARGET = """\
    import torch


    def ppo_step(policy, critic, old_logp, ref_logp, scores, mask, input_ids, optimizer, beta=0.05):
        with torch.no_grad():
            rewards = scores - beta * (old_logp - ref_logp)
            returns = rewards.flip(-1).cumsum(-1).flip(-1)
            advantages = masked_whiten(returns, mask)
        logp = policy(input_ids)
        ratio = torch.exp(logp - old_logp)
        pg_loss = (-advantages * ratio * mask).sum() / mask.sum()
        vpred = critic(input_ids)
        vf_losses = torch.square(vpred - returns)
        vf_loss = 0.5 * (vf_losses * mask).sum() / mask.sum()
        loss = pg_loss + 0.1 * vf_loss
        loss.backward()
        optimizer.step()
"""


@pytest.mark.parametrize("source", [KL_IN_REWARD, EVALUATION, SCORE_WEIGHTED, CRITIC_TARGET],
                         ids=["reward", "no_grad-evaluation", "score-weighted", "critic-target"])
def test_a_detached_kl_where_it_belongs_or_outside_training_is_not_flagged(source, tmp_path):
    assert "KL001" not in {code for _, code in module_codes(source, tmp_path)}  # the PPO step is KL008 (row 23)


def test_a_detached_value_beside_its_own_score_term_keeps_the_rewards_verdict(tmp_path):
    """k3 values with reward-to-go through the score (row 7: KL004), their value also added as it is: the verdict
    is the reward's, not row 1c's (the term reaches a score)."""
    source = """\
        import torch


        def loss_fn(logprobs, ref_logprobs, mask, beta=0.1):
            lr = (ref_logprobs - logprobs).detach()
            k3 = torch.exp(lr) - 1 - lr
            returns = k3.flip(-1).cumsum(-1).flip(-1)
            return (beta * k3 * mask).sum() + (logprobs * returns * mask).sum()
    """
    assert module_codes(source, tmp_path) == [(7, "KL004")]


REINFORCE = """\
    import torch


    def train_step(logp, ref_logp, advantages, optimizer, beta=0.1):
        with torch.no_grad():
            log_ratio = logp - ref_logp
            kl = (torch.exp(-log_ratio) - 1 + log_ratio).sum(-1)
        loss = -(advantages * logp.sum(-1)).mean() + beta * kl.mean()
        loss.backward()
        optimizer.step()
"""


def test_beside_a_term_the_analysis_does_not_follow_the_cut_kl_is_still_found(tmp_path):
    """`advantages * logp` is a policy-gradient term the algebra sets aside: the loss still trains, and its KL
    term, cut under no_grad, has no gradient (zu-zi/LLM-RL's GRPO and DAPO trainers, with their names)."""
    assert module_codes(REINFORCE, tmp_path) == [(8, "KL001")]


EVALUATING_GIVEN_LOGPROBS = """\
    import torch


    @torch.no_grad()
    def evaluate(logp, ref_logp, advantages, beta=0.1):
        log_ratio = logp - ref_logp
        kl = (torch.exp(-log_ratio) - 1 + log_ratio).sum(-1)
        loss = -(advantages * logp.sum(-1)).mean() + beta * kl.mean()
        return loss
"""

LOGGED_TOTAL = """\
    import torch


    class Trainer:
        def step(self, logp, ref_logp, advantages, optimizer, beta=0.1):
            log_ratio = ref_logp - logp
            kl = torch.exp(log_ratio) - 1 - log_ratio
            loss = -(advantages * logp).mean() + beta * kl.mean()
            loss.backward()
            optimizer.step()
            self.running_loss += loss.item()
"""


@pytest.mark.parametrize("source, codes", [(EVALUATING_GIVEN_LOGPROBS, []), (LOGGED_TOTAL, [(8, "KL002")])],
                         ids=["evaluation-under-no_grad", "logged-total"])
def test_a_cut_copy_outside_training_is_not_row_1c(source, codes, tmp_path):
    """The same shape under no_grad (an evaluation given log-probs with a gradient), and a trained loss's
    value accumulated for the log: neither is a KL term added without its gradient."""
    assert module_codes(source, tmp_path) == codes


LOGGED_INTO_METRICS = """\
    import torch


    def update(micro_batches, optimizer, metrics, kl_loss_type, use_kl_loss=True, beta=0.1):
        for logp, ref_logp, advantages in micro_batches:
            loss = -(advantages * logp).mean()
            if use_kl_loss:
                if kl_loss_type == "k1":
                    kld = logp - ref_logp
                else:
                    kld = 0.5 * (logp - ref_logp) ** 2
                kl_loss = kld.mean()
                loss = loss + beta * kl_loss
                metrics["actor/kl_loss"] += kl_loss.detach().item()
            loss.backward()
        optimizer.step()
"""


def test_a_cut_copy_of_a_trained_kl_term_logged_into_metrics_is_not_row_1c(tmp_path):
    """verl's actors log `metrics["actor/kl_loss"] += kl_loss.detach().item()` after adding the same term, with its
    gradient, to the loss (AgentCombo/DEEP-GRPO): the copy is for the log; the trained term keeps its verdict."""
    assert module_codes(LOGGED_INTO_METRICS, tmp_path) == [(12, "KL001"), (12, "KL003")]  # rows 1 and 2


NUMBER_TOTALS = POLICY + """\
    def group_loss(policy, ref_model, batch, kl_coef):
        logp = token_logprobs(policy, batch)
        with torch.no_grad():
            ref_logp = token_logprobs(ref_model, batch)
        pg = -(batch["advantages"] * logp).sum()
        return pg + kl_coef * (logp - ref_logp).sum()


    def train(policy, ref_model, groups, optimizer, kl_coef=0.05):
        total_loss_val = 0.0
        q_loss_val: float = 0.0
        for batch in groups:
            if batch["solve"]:
                loss = group_loss(policy, ref_model, batch, kl_coef)
                loss.backward()
                total_loss_val += loss.item()
                q_loss_val += loss.item()
            else:
                group = group_loss(policy, ref_model, batch, kl_coef)
                group.backward()
                total_loss_val += group.item()
            optimizer.step()
        return total_loss_val / len(groups), q_loss_val
"""


def test_a_loss_summed_into_a_python_number_for_the_log_is_not_row_1c(tmp_path):
    """Prem01-cyber/finetune_qwen backpropagates each group's loss, then sums `loss.item()` into `total_loss_val =
    0.0` from two branches: a Python number, which holds no gradient, kept for the log (six false KL001 before).
    The trained term keeps its verdict (k1 as a loss, row 1); a number added to a trained loss is still row 1c."""
    assert module_codes(NUMBER_TOTALS, tmp_path) == [(14, "KL001")]
    number_in_a_loss = POLICY + """\
    def train_step(policy, ref_model, batch, optimizer, beta=0.05):
        logp = token_logprobs(policy, batch)
        with torch.no_grad():
            ref_logp = token_logprobs(ref_model, batch)
        kl_loss_val = 0.0
        kl_loss_val += (logp - ref_logp).mean().item()
        loss = -(batch["advantages"] * logp).mean() + beta * kl_loss_val
        loss.backward()
        optimizer.step()
"""
    assert module_codes(number_in_a_loss, tmp_path) == [(15, "KL001")]  # at the loss it is added to
