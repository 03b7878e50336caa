"""The policy's log-prob helper run on the reference model returns the reference's log-probs.

upul/grpo-from-scratch (twenty-first set) computes its reference as the policy with the LoRA adapter disabled,
`rlogp = ref_logps(policy, ...)`, a helper that calls the policy's `per_token_logps`; hand-written trainers
write `ref_lp = logps(ref_model, seq)` or `rl, _ = logps(ref, seq)`. The helper's body sees only `model(...)`:
its result is the reference's where the helper is named for the reference's log-probs or is given the reference
model (and none of the policy's log-probs). With that, the k3 added to the loss is KL002 (kl-math.md section 8,
row 3), not an expression of the policy alone.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from snippets import module_codes

from klaudit.lint import roles

HELPER = """\
    import torch


    def logps(model, seq):
        logits = model(seq).logits
        return torch.log_softmax(logits, -1).gather(-1, seq.unsqueeze(-1)).squeeze(-1)


    def ref_logps(policy, seq):
        with torch.no_grad(), policy.disable_adapter():
            return logps(policy, seq)


"""

TRAIN = """\
    def train(policy, {reference}, opt, seq, adv, beta):
        with torch.no_grad():
            r = {call}
        new = logps(policy, seq)
        kl = torch.exp(r - new) - (r - new) - 1
        loss = -(adv * new).mean() + beta * kl.mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
"""


def codes(tmp_path: Path, source: str) -> list[str]:
    return sorted({code for _, code in module_codes(source, tmp_path, "train.py")})


@pytest.mark.parametrize("reference, call", [
    ("ref_model", "logps(ref_model, seq)"),
    ("ref", "logps(ref, seq)"),
    ("trainer", "logps(trainer.ref_model, seq)"),
    ("unused", "ref_logps(policy, seq)"),
])
def test_the_policys_helper_on_the_reference_gives_the_reference_log_probs(tmp_path, reference, call):
    assert codes(tmp_path, HELPER + TRAIN.format(reference=reference, call=call)) == ["KL002"]


def test_a_helper_given_the_policys_log_probs_is_not_read_as_the_reference(tmp_path):
    """`pick(new, ref)` returns the policy's log-probs it was given: the k1 made of them is a loss (row 1)."""
    source = HELPER + """\
    def pick(logp, ref):
        return logp


    def train(policy, ref, seq):
        new = logps(policy, seq)
        kl = pick(new, ref) - ref
        loss = kl.mean()
        loss.backward()
"""
    assert codes(tmp_path, source) == ["KL001"]


def test_the_policy_helper_on_the_policy_stays_the_policy(tmp_path):
    assert codes(tmp_path, HELPER + TRAIN.format(reference="ref_model", call="logps(policy, seq)")) == []


def test_a_preference_pairs_reference_side_is_no_kl_penalty(tmp_path):
    """DPO (TheYellowDuck/RLHF-pipeline): the reference's summed log-probs of the chosen and rejected responses
    (the reference model's, or the policy's with its adapter off) are bound to a preference loss's
    `ref_chosen_logps`, whose IPO form squares the log-ratio margin: no KL penalty of the table."""
    source = """\
    import torch


    def preference_loss(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps, beta=0.1):
        margin = (policy_chosen_logps - policy_rejected_logps) - (ref_chosen_logps - ref_rejected_logps)
        losses = (margin - 1 / (2 * beta)) ** 2
        chosen_reward = beta * (policy_chosen_logps - ref_chosen_logps).detach()
        return losses.mean(), chosen_reward


    class Trainer:
        def _seq_logps(self, model, ids, mask):
            logits = model(input_ids=ids).logits
            per_token = torch.log_softmax(logits, -1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
            return (per_token * mask).sum(dim=-1)

        def _pair_logps(self, model, batch):
            chosen = self._seq_logps(model, batch["chosen"], batch["mask"])
            rejected = self._seq_logps(model, batch["rejected"], batch["mask"])
            return chosen, rejected

        def _ref_logps(self, batch):
            if self.ref_model is not None:
                with torch.no_grad():
                    return self._pair_logps(self.ref_model, batch)
            with torch.no_grad(), self.model.disable_adapter():
                return self._pair_logps(self.model, batch)

        def step(self, batch):
            ref_c, ref_r = self._ref_logps(batch)
            pol_c, pol_r = self._pair_logps(self.model, batch)
            loss, chosen_reward = preference_loss(pol_c, pol_r, ref_c, ref_r, beta=0.1)
            loss.backward()
            return chosen_reward
"""
    assert codes(tmp_path, source) == []


@pytest.mark.parametrize("name, pair", [
    ("ref_chosen_lp", True), ("policy_rejected_lps", True), ("ref_chosen_logps", True), ("chosen_help", False),
    ("chosen_ids", False), ("ref_lp", False),
])
def test_lp_names_a_preference_sides_log_probs(name, pair):
    """`ref_chosen_lp` (kartikmunjal's DPO) is a preference pair's side, as `ref_chosen_logps` is."""
    assert roles.names_pair_logprobs(name) is pair


def test_a_helper_of_raw_logits_run_on_the_reference_is_not_read_as_log_probs(tmp_path):
    """FTPO (Goekdeniz-Guelmez/mlx-lm-lora): a squared difference of the last position's raw logits to the
    reference's, on a preference objective, is a logit MSE, no KL estimate."""
    source = """\
    import torch


    def _last_logits(model, prompts, lengths):
        logits = model(prompts)
        index = (lengths - 1)[:, None, None].expand(-1, 1, logits.shape[-1])
        return torch.take_along_dim(logits, index, dim=1).squeeze(1)


    def train(model, ref_model, prompts, lengths, chosen_ids, opt, weight):
        policy_logits = _last_logits(model, prompts, lengths)
        with torch.no_grad():
            reference_logits = _last_logits(ref_model, prompts, lengths)
        preference = -torch.take_along_dim(policy_logits, chosen_ids, dim=-1).mean()
        diff = policy_logits - reference_logits
        loss = preference + weight * (diff * diff).mean()
        loss.backward()
        opt.step()
"""
    assert codes(tmp_path, source) == []


@pytest.mark.parametrize("name, pair", [("lp_chosen", False), ("logp_chosen_tok", True), ("rejected_seq_lps", True)])
def test_lp_before_the_side_is_the_sampled_tokens_log_prob(name, pair):
    """ZIYUANLI-star/TriUTest's helper returns `lp_chosen`, the log-probs of the tokens it chose (sampled): no
    preference pair, and its KL loss keeps KL001 and KL010 (fifteenth set). The long words keep both orders."""
    from klaudit.lint.roles import names_pair_logprobs

    assert names_pair_logprobs(name) is pair


LOGITS_HELPER = """\
    import torch


    def model_all_logits(model, seqs, micro_batch):
        logits = model(seqs).logits
        return logits.float()


    def token_logprobs_from_logits(logits, seqs):
        logp = torch.log_softmax(logits[:, :-1], dim=-1)
        return logp.gather(-1, seqs[:, 1:].unsqueeze(-1)).squeeze(-1)


    class Trainer:
        def step(self, seqs, mask):
            lp_a = token_logprobs_from_logits(model_all_logits(self.actor, seqs, 4), seqs)
            with torch.no_grad():
                lp_r = token_logprobs_from_logits(model_all_logits(self.ref, seqs, 4), seqs)
            lr = lp_r - lp_a
            k3 = torch.exp(lr) - lr - 1
            loss = (k3 * mask).sum() / mask.sum()
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()
"""


def test_a_helper_of_the_whole_logits_run_on_the_reference_gives_the_references_logits(tmp_path):
    """zu-zi/LLM-RL's `model_all_logits(self.ref, seqs)`, then log-probs taken by another helper. Before, a helper
    named for logits was never read as the reference's: lp_r - lp_a read as the policy against itself, silent. Now
    the k3 between the two is a loss (row 3). (zu-zi's own helper puts micro-batches' logits in a list, which the
    lint does not hold: its two sites stay missed.)"""
    assert module_codes(LOGITS_HELPER, tmp_path) == [(21, "KL002")]

