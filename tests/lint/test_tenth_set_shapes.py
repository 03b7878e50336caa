"""Shapes of KL code met in the tenth review (the held-out set's gaps: RLinf's reduction chosen by a setting).

Verdicts (kl-math.md section 8): k3 differentiated as a loss follows the per-token forward KL (row 3,
KL002) however it is reduced; the per-sequence token mean adds 1/L weights (row 21, KL007), a token mean
over the batch or a per-sequence token sum does not.
"""

from __future__ import annotations

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
