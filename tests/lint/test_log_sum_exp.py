"""Log-probs spelled as logits minus their log-sum-exp (the log-softmax's normaliser).

RL2 and its forks (the eleventh set's tokenbender/infinite, the fourteenth's jsbyun121/exploring-paths-llm) make
the policy's log-probs as a tensor-parallel gather of the sampled tokens' logits minus a log-sum-exp, both from
helpers in a module that names no KL; hand-written exact-KL code subtracts `logits.logsumexp(-1, keepdim=True)`.
Verdicts (kl-math.md section 8): k1 as a loss, row 1 (KL001); k2 as a loss and the exact per-token KL as a loss,
row 2 (KL003).
"""

from __future__ import annotations

from pathlib import Path

from snippets import module_codes

TP_FUNCTIONS = """\
import torch


def compute_logsumexp(logits, device_mesh):
    return torch.logsumexp(logits, -1)


def gather_action_logits(logits, actions, device_mesh):
    return torch.gather(logits, -1, actions.unsqueeze(-1)).squeeze(-1)
"""

ACTOR = """\
import torch
from functions import compute_logsumexp, gather_action_logits


def compute_approx_kl(logps, ref_logps, estimator):
    log_ratio = logps - ref_logps
    if estimator == "k1":
        return log_ratio
    return log_ratio.pow(2) / 2


class Actor:
    def forward(self, minibatch):
        logits = self.model(input_ids=minibatch["states"]).logits.float()
        logsumexp = compute_logsumexp(logits, self.device_mesh["tp"])
        action_logits = gather_action_logits(logits, minibatch["actions"], self.device_mesh["tp"])
        return (action_logits - logsumexp) * minibatch["action_mask"]

    def update(self, minibatch, total_actions):
        logps = self.forward(minibatch)
        loss = self.policy_loss(logps, minibatch)
        kl = compute_approx_kl(logps, minibatch["ref_logps"], self.config.kl.loss_estimator)
        {use}
        loss.backward()
"""


def codes(source: str, tmp_path: Path) -> list[tuple[int, str]]:
    return module_codes(source, tmp_path, "actor.py", functions=TP_FUNCTIONS)


def test_gathered_logits_minus_a_helpers_log_sum_exp_are_the_policys_log_probs(tmp_path):
    use = "loss = loss + self.config.kl.coef * kl.sum() / total_actions"
    assert codes(ACTOR.format(use=use), tmp_path) == [(23, "KL001"), (23, "KL003")]


def test_the_same_log_probs_in_a_logged_kl_stay_silent(tmp_path):
    use = "self.metrics['kl'] = kl.mean().item()"
    assert codes(ACTOR.format(use=use), tmp_path) == []


def test_logits_minus_their_kept_log_sum_exp_are_vocabulary_log_probs(tmp_path):
    assert module_codes("""\
        import torch


        def exact_kl_loss(model, ref_model, input_ids, mask):
            logits = model(input_ids).logits
            with torch.no_grad():
                ref_logits = ref_model(input_ids).logits
            logp = logits - logits.logsumexp(-1, keepdim=True)
            ref_logp = ref_logits - torch.logsumexp(ref_logits, dim=-1, keepdim=True)
            kl = (logp.exp() * (logp - ref_logp)).sum(-1)
            loss = (kl * mask).sum() / mask.sum()
            loss.backward()
        """, tmp_path) == [(11, "KL003")]


def test_a_gathered_logit_minus_its_positions_log_sum_exp_is_a_log_prob(tmp_path):
    assert module_codes("""\
        import torch


        def k2_loss(model, ref_model, input_ids, actions, mask):
            logits = model(input_ids).logits
            with torch.no_grad():
                ref_logits = ref_model(input_ids).logits
            picked = logits.gather(-1, actions.unsqueeze(-1)).squeeze(-1)
            ref_picked = ref_logits.gather(-1, actions.unsqueeze(-1)).squeeze(-1)
            logp = picked - torch.logsumexp(logits, -1)
            ref_logp = ref_picked - torch.logsumexp(ref_logits, -1)
            loss = (((logp - ref_logp) ** 2 / 2) * mask).sum() / mask.sum()
            loss.backward()
        """, tmp_path) == [(12, "KL003")]
