"""Shapes of KL code met in the tenth review (the held-out set's gaps: RLinf's reduction chosen by a setting).

Verdicts (kl-math.md section 8): k3 differentiated as a loss follows the per-token forward KL (row 3,
KL002) however it is reduced; the per-sequence token mean adds 1/L weights (row 21, KL007), a token mean
over the batch or a per-sequence token sum does not.
"""

from __future__ import annotations

import pytest
from snippets import module_codes

REDUCTIONS = """\
def masked_mean(x, mask):
    return (x * mask).sum() / mask.sum()


def seq_mean_token_sum(x, mask):
    return (x * mask).sum(-1).mean()


def seq_mean_token_mean(x, mask):
    return ((x * mask).sum(-1) / mask.sum(-1)).mean()
"""

# RLinf's workers: `__init__` stores the reduction the configuration names as `self.loss_agg_func`, in an
# if/elif chain whose last branch is the per-sequence token mean; the KL loss calls it in another method
CHOOSE = """\
    def __init__(self, cfg):
        self.kl_beta = cfg.algorithm.kl_beta
        if cfg.algorithm.loss_agg_func == "token-mean":
            self.loss_agg_func = masked_mean
        elif cfg.algorithm.loss_agg_func == "seq-mean-token-sum":
            self.loss_agg_func = seq_mean_token_sum
        elif cfg.algorithm.loss_agg_func == "seq-mean-token-mean":
            self.loss_agg_func = seq_mean_token_mean
        else:
            raise NotImplementedError(cfg.algorithm.loss_agg_func)
"""

KL_STEP = """\
    def kl_step(self, logprobs, ref_logprobs, mask, pg_loss):
        log_ratio = ref_logprobs - logprobs
        kld = torch.exp(log_ratio) - log_ratio - 1
        kl_loss = self.loss_agg_func(kld, mask)
        loss = pg_loss + self.kl_beta * kl_loss
        loss.backward()
"""

IMPORTS = "import torch\nfrom reductions import masked_mean, seq_mean_token_mean, seq_mean_token_sum\n\n\n"


def test_each_reduction_a_setting_may_choose_is_judged(tmp_path):
    """The class that chooses the reduction also computes the loss: the per-sequence mean among the
    choices gives KL007, beside the KL002 every choice has."""
    source = IMPORTS + "class Worker:\n" + CHOOSE + "\n" + KL_STEP
    assert module_codes(source, tmp_path, reductions=REDUCTIONS) == [(20, "KL002"), (20, "KL007")]


def test_a_reduction_chosen_in_a_base_class_is_followed(tmp_path):
    """The actor derives from the worker of another module (RLinf's MegatronActor(MegatronWorker)), whose
    functions are imported there: the base's `self.loss_agg_func` is each function it may hold."""
    worker = IMPORTS + "class Worker:\n" + CHOOSE
    actor = "import torch\nfrom worker import Worker\n\n\nclass Actor(Worker):\n" + KL_STEP
    assert module_codes(actor, tmp_path, worker=worker, reductions=REDUCTIONS) == [(9, "KL002"), (9, "KL007")]


def test_an_entry_points_none_default_leaves_both_reductions(tmp_path):
    """TRL's distillation `_reduce_divergence_loss`: `if num_items is not None: return sum / num_items`,
    else a per-sequence mean. `compute_loss`'s own `num_items=None` may be None or not, so both paths run
    (KL002 for each; KL007 for the per-sequence mean), not only the first return."""
    source = """\
    import torch


    class Trainer:
        @staticmethod
        def reduce(kl, mask, num_items=None):
            if num_items is not None:
                return (kl * mask).sum() / num_items
            return ((kl * mask).sum(-1) / mask.sum(-1)).mean()

        def compute_loss(self, logp, ref_logp, mask, num_items=None):
            kl = torch.exp(ref_logp - logp) - (ref_logp - logp) - 1
            loss = self.reduce(kl, mask, num_items=num_items)
            loss.backward()
    """
    assert module_codes(source, tmp_path) == [(13, "KL002"), (13, "KL007")]


def test_a_reducer_from_an_unfollowed_factory_is_read_by_its_name(tmp_path):
    """slime's `sum_of_sample_mean = get_sum_of_sample_mean(...)`: a factory imported from a module without
    KL words, called with no KL argument, is not followed (its closure sums Python lists the analysis cannot
    read); the reducer keeps the meaning of its name, a per-sequence mean (row 21, KL007, beside KL002)."""
    helpers = """\
    def get_sum_of_sample_mean(lengths, masks):
        def reducer(x):
            return sum([(part * m).sum() / m.sum() for part, m in zip(x.split(lengths), masks)])
        return reducer
    """
    source = """\
    import torch
    from helpers import get_sum_of_sample_mean


    def loss_function(logp, ref_logp, lengths, masks, pg_loss, coef):
        sum_of_sample_mean = get_sum_of_sample_mean(lengths, masks)
        kl = torch.exp(ref_logp - logp) - (ref_logp - logp) - 1
        kl_loss = sum_of_sample_mean(kl)
        loss = pg_loss + coef * kl_loss
        loss.backward()
    """
    assert module_codes(source, tmp_path, helpers=helpers) == [(8, "KL002"), (8, "KL007")]


def test_a_handler_that_zeroes_the_kl_runs_instead_of_the_body_not_after_it(tmp_path):
    """rl-text2sql's GRPO step: the k3 loss is computed in a `try:` whose `except` sets kl to 0. The handler
    runs where the body failed, so after the statement kl is the k3 term or 0: the k3 loss (row 3, KL002)."""
    source = """\
    import torch


    def step(logp, ref_logp, mask, pg_loss, coef):
        try:
            token_kl = torch.exp(ref_logp - logp) - (ref_logp - logp) - 1
            kl = (token_kl * mask).sum() / mask.sum()
        except Exception:
            kl = torch.tensor(0.0)
        loss = pg_loss + coef * kl
        loss.backward()
    """
    assert module_codes(source, tmp_path) == [(10, "KL002")]


# k3 written with pi / ref where ref / pi belongs (minChatGPT's reward, mlx-grpo's loss, the RLHF book's kl3):
# exp(logp - ref) - 1 - (logp - ref). As a loss its gradient is half that of the per-token chi-square
# (row 5b, KL009); in the reward its values are no k1 (row 9b, KL004).
def test_k3_with_the_ratio_reversed_is_recognised(tmp_path):
    loss = """\
    import torch


    def grpo_loss(logp, ref_logp, advantages, mask, beta):
        log_ratio = logp - ref_logp
        kl = torch.exp(log_ratio) - 1 - log_ratio
        per_token = -torch.exp(logp - logp.detach()) * advantages + beta * kl
        loss = (per_token * mask).sum() / mask.sum()
        loss.backward()
    """
    reward = """\
    import torch


    @torch.no_grad()
    def penalized_rewards(scores, logp, ref_logp, mask, beta):
        ratio = logp - ref_logp
        estimated_kl = ((torch.exp(ratio) - 1) - ratio) * mask
        rewards = scores - beta * estimated_kl.sum(-1)
        return rewards
    """
    assert module_codes(loss, tmp_path) == [(8, "KL009")]
    assert module_codes(reward, tmp_path, name="rewards.py") == [(8, "KL004")]


def test_a_ratio_to_the_reference_times_advantages_is_no_part_of_an_estimator(tmp_path):
    """nips-grpo-dynamics (fifth set): the clipped surrogate's ratio is taken to the reference,
    `-exp(logp - ref) * advantages`, and a k1 loss is added to it. The surrogate is no KL term: the sum
    is not the (negated) reversed k3 R - 1 - d; the k1 loss alone is row 1 (KL001)."""
    source = """\
    import torch


    def balanced_loss(logprobs, ref_logprobs, advantages, mask, coef):
        ratio = torch.exp(logprobs - ref_logprobs)
        pg_loss = (-ratio * advantages.unsqueeze(-1) * mask).sum() / mask.sum()
        kl = logprobs - ref_logprobs
        kl_loss = (kl * mask).sum() / mask.sum()
        loss = pg_loss + coef * kl_loss
        return {"loss": loss}
    """
    assert module_codes(source, tmp_path) == [(8, "KL001")]


@pytest.mark.parametrize("clamp", ["torch.where(kl < 0, 0, kl)", "torch.where(kl >= 0, kl, 0.0)",
                                   "torch.where(0 > kl, 0, kl)"])
def test_a_clamp_written_with_where_is_a_clamp(tmp_path, clamp):
    """InstructLLaMA's scale_kl: the negative log-ratios set to 0 with torch.where before the k1 reward:
    a clamp at 0 of the estimate (KL010), as `kl.clamp(min=0)` is; the k1 reward-to-go itself is row 6."""
    source = f"""\
    import torch


    @torch.no_grad()
    def kl_rewards(logprobs, ref_logprobs, scores, mask, kl_coef):
        kl = logprobs - ref_logprobs
        kl = {clamp}
        rewards = -kl_coef * kl * mask
        rewards[:, -1] += scores
        return rewards.flip(-1).cumsum(-1).flip(-1)
    """
    assert module_codes(source, tmp_path) == [(8, "KL010")]


def test_a_mask_chosen_by_where_is_no_clamp(tmp_path):
    """torch.where(mask, kl, 0) keeps the estimate on the response tokens: no clamp, row 6, silent."""
    source = """\
    import torch


    @torch.no_grad()
    def kl_rewards(logprobs, ref_logprobs, scores, mask, kl_coef):
        kl = torch.where(mask > 0, logprobs - ref_logprobs, 0.0)
        rewards = -kl_coef * kl
        rewards[:, -1] += scores
        return rewards.flip(-1).cumsum(-1).flip(-1)
    """
    assert module_codes(source, tmp_path) == []


def test_a_policy_gradient_term_weighted_by_advantages_is_no_kl_term(tmp_path):
    """mlx-grpo's aligned trainer: `(-log_ratio * advantages + beta * (exp(log_ratio) - 1 - log_ratio)) * mask`
    with the log-ratio to the reference. The first term is a policy gradient weighted by the advantages, not
    part of the KL estimate: the KL term is k3 with the ratio reversed as a loss (row 5b, KL009), summed per
    sequence and divided by its length (row 21, KL007)."""
    source = """\
    import torch


    def grpo_loss(logp, ref_logp, advantages, mask, beta):
        log_ratio = logp - ref_logp
        kl = torch.exp(log_ratio) - 1 - log_ratio
        per_token_loss = (-log_ratio * advantages + beta * kl) * mask
        loss = (per_token_loss.sum(-1) / mask.sum(-1)).mean()
        loss.backward()
    """
    assert module_codes(source, tmp_path) == [(7, "KL007"), (7, "KL009")]
