"""Shapes of KL code met in the ninety-second fresh set. tianyitan040116/motion-agent-grpo picks each sample's
log-probs from its log-softmax by an index of its token ids taken from a list of every sample's (`mvids =
motion_vocab_ids_list[idx].to(device)`, then `log_probs_all[torch.arange(m_len), mvids]`).

Verdict (kl-math.md section 8): the k3 of those log-probs against the reference's, differentiated as a loss, is
row 3 (KL002). Before, the index's name (`mvids`, an element of `..._ids_list`) hid the gather, and the trainer
went unreported. The loss then takes each sample's log-probs from a list of them (`new_lp = new_log_probs_list[i]`)
and averages its k3 over that sample's own tokens (`sft_kl.mean()`): each sequence weighed by 1/L, row 21 beside
row 3 (KL007). A list keeps sequences of different lengths apart; a padded tensor's row (`new_log_probs[i]`) would
be averaged over the padded length, a constant.

shreyvishen/cost-aware-visual-search computes each episode's loss in its loss module (`grpo.episode_loss`, which
nothing in that module calls) and its training script calls it once per episode, `for ep, adv, ok in zip(eps,
advs, used)`: the `.mean()` of that episode's k3 is over its own tokens, 1/L again (row 21 beside row 3).
"""

from __future__ import annotations

import pytest
from snippets import module_codes

PER_SAMPLE_PICK = """\
    import torch


    class Trainer:
        def log_probs(self, captions, motions, use_ref_model=False):
            motion_vocab_ids_list = [m + self.offset for m in motions]
            out = []
            for idx, caption in enumerate(captions):
                log_probs_all = torch.log_softmax(self.model(caption).logits, -1)
                {pick}
                out.append(log_probs_all[torch.arange(len(mvids)), mvids])
            return out

        def loss(self, captions, motions, advantages, ref_log_probs_list):
            new_log_probs_list = self.log_probs(captions, motions)
            total = 0.0
            for i in range(len(captions)):
                ref_lp, new_lp = ref_log_probs_list[i], new_log_probs_list[i]
                sft_kl = torch.exp(ref_lp - new_lp) - (ref_lp - new_lp) - 1.0
                total = total - (new_lp * advantages[i]).mean() + self.beta * sft_kl.mean()
            total.backward()
            self.optimizer.step()
    """


@pytest.mark.parametrize("pick, codes", [
    ("mvids = motion_vocab_ids_list[idx].to(self.device)", [(21, "KL002"), (21, "KL007")]),
    ("mvids = motion_vocab_ids_list[idx]", [(21, "KL002"), (21, "KL007")]),
    ("mvids = self.positions[idx]", []),  # not token ids: no gather, no KL estimate
])
def test_an_element_of_a_list_of_token_ids_picks_the_sampled_tokens(tmp_path, pick, codes):
    assert module_codes(PER_SAMPLE_PICK.format(pick=pick), tmp_path) == codes


@pytest.mark.parametrize("pick, codes", [
    ("ref_lp, new_lp = ref_log_probs_list[i], new_log_probs_list[i]", [(11, "KL002"), (11, "KL007")]),
    ("new_lp = new_log_probs_list[i]\n        ref_lp = ref_log_probs_list[i]", [(12, "KL002"), (12, "KL007")]),
    # rows of padded tensors: each averaged over the padded length, a constant
    ("ref_lp, new_lp = ref_log_probs[i], new_log_probs[i]", [(11, "KL002")]),
])
def test_each_sequences_log_probs_from_a_list_are_averaged_over_its_own_tokens(tmp_path, pick, codes):
    source = PER_SEQUENCE_MEAN.replace("{pick}", pick)
    assert module_codes(source, tmp_path) == codes


PER_SEQUENCE_MEAN = """\
import torch


def loss(new_log_probs_list, ref_log_probs_list, new_log_probs, ref_log_probs, beta, optimizer):
    n = len(new_log_probs_list)
    total = torch.tensor(0.0)
    for i in range(n):
        {pick}
        kl = torch.exp(ref_lp - new_lp) - (ref_lp - new_lp) - 1.0
        total = total + beta * kl.mean() / n
    total.backward()
    optimizer.step()
"""


# shreyvishen/cost-aware-visual-search: a loss module's per-episode loss, called by the training script in its loop
# over the episodes, one at a time; the k3 of that one episode's tokens averaged with `.mean()` (1/L, row 21)
EPISODE_LOSS = """\
import torch


def episode_loss(model, ref_model, conv, advantage, kl_coef):
    ids = torch.tensor(conv.ids).unsqueeze(0)
    logits = model(input_ids=ids).logits[:, :-1]
    logp = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    with torch.no_grad():
        ref_logits = ref_model(input_ids=ids).logits[:, :-1]
        ref = torch.log_softmax(ref_logits, -1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    d = ref - logp
    kl = (d.exp() - d - 1.0).mean()
    pg = -(logp * advantage).mean()
    return pg + kl_coef * kl
"""
TRAIN = """\
import grpo


def train_step(model, ref_model, opt, eps, advs):
    for {loop}:
        loss = grpo.episode_loss(model, ref_model, ep.conv, adv, 0.01)
        (loss / len(eps)).backward()
    opt.step()
"""


@pytest.mark.parametrize("loop, codes", [
    ("ep, adv in zip(eps, advs)", [(14, "KL002"), (14, "KL007")]),
    ("episode, adv in zip(episodes, advs)", [(14, "KL002"), (14, "KL007")]),
    ("i, adv in enumerate(advs)", [(14, "KL002")]),  # not one episode at a time: a batch constant
])
def test_a_loss_another_module_calls_once_per_episode_averages_over_its_tokens(tmp_path, loop, codes):
    train = TRAIN.format(loop=loop).replace("ep.conv", loop.split(",")[0] + ".conv").replace("i.conv", "eps[i].conv")
    assert module_codes(EPISODE_LOSS, tmp_path, "grpo.py", train=train) == codes
