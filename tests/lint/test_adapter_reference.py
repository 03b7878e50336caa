"""The reference as the policy's base model, and per-turn log-probs gathered in lists.

JosephLi2023/CS224R (seventy-first set) trains a LoRA policy and takes the reference from the same model with the
adapter off: `with torch.no_grad(), self.policy.model.disable_adapter(): logits = self.policy.model(...)`, in one
helper whose `use_ref` flag picks the branch. Each turn's log-probs are appended to lists (`all_ref_lp.append(
ref_lps[k])`) and concatenated for the loss, which adds `kl_coef * k3.mean()` (row 3 of kl-math.md section 8,
KL002). Before, the forward inside the block read as the policy's, so `ref - new` was no log-ratio, and a list of
the trained policy's log-probs lost what it held.
"""

from __future__ import annotations

import pytest
from snippets import module_codes

TRAINER = """\
import torch
import torch.nn.functional as F


class Trainer:
    def _logprobs(self, batches, use_ref):
        out = [torch.zeros(0) for _ in range(len(batches))]
        for index, ids in enumerate(batches):
            if use_ref:
                with torch.no_grad(), self.policy.model.disable_adapter():
                    logits = self.policy.model(ids).logits
            else:
                logits = self.policy.model(ids).logits
            lp = F.log_softmax(logits[:, :-1], dim=-1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
            out[index] = lp.detach() if use_ref else lp
        return out

    def compute_loss(self, batches, advantages):
        firsts = self._logprobs(batches, use_ref=False)
        seconds = self._logprobs(batches, use_ref=True)
        gathered, against = [], []
        for k in range(len(batches)):
            gathered.append(firsts[k])
            against.append(seconds[k])
        a = torch.cat(gathered)
        b = torch.cat(against)
        log_ratio = b - a
        kl_per_tok = torch.exp(log_ratio) - 1.0 - log_ratio
        total = -(advantages * a).mean() + self.kl_coef * kl_per_tok.mean()
        return total

    def train_step(self, batches, advantages):
        loss = self.compute_loss(batches, advantages)
        loss.backward()
        self.optimizer.step()
"""


def test_the_base_model_under_a_disabled_adapter_is_the_reference(tmp_path):
    assert module_codes(TRAINER, tmp_path) == [(30, "KL002")]


@pytest.mark.parametrize("context", ["torch.no_grad()", "torch.no_grad(), self.policy.model.enable_adapter()"])
def test_a_forward_in_another_context_is_still_the_policy(tmp_path, context):
    """Without the adapter disabled both sides are the policy: `ref - new` is no log-ratio to a reference."""
    source = TRAINER.replace("torch.no_grad(), self.policy.model.disable_adapter()", context)
    assert module_codes(source, tmp_path) == []


def test_the_reference_context_reaches_a_helper_called_inside_it(tmp_path):
    """TRL's spelling: `with self.null_ref_context(): ref = self._get_per_token_logps(self.model, ...)`, a helper
    of the policy's forward called inside the block."""
    source = TRAINER.replace(
        "            if use_ref:\n"
        "                with torch.no_grad(), self.policy.model.disable_adapter():\n"
        "                    logits = self.policy.model(ids).logits\n"
        "            else:\n"
        "                logits = self.policy.model(ids).logits\n"
        "            lp = F.log_softmax(logits[:, :-1], dim=-1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)\n",
        "            if use_ref:\n"
        "                with torch.no_grad(), self.null_ref_context():\n"
        "                    lp = self._token_logps(ids)\n"
        "            else:\n"
        "                lp = self._token_logps(ids)\n",
    ).replace("    def compute_loss", "    def _token_logps(self, ids):\n"
                                    "        logits = self.policy.model(ids).logits\n"
                                    "        return F.log_softmax(logits[:, :-1], dim=-1).gather(-1, ids[:, 1:].unsqueeze(-1)"
                                    ").squeeze(-1)\n\n    def compute_loss")
    assert [code for _, code in module_codes(source, tmp_path)] == ["KL002"]


def test_a_list_of_the_trained_policys_log_probs_keeps_them(tmp_path):
    """Appending `new_lps[k]` turn by turn and concatenating gives the policy's log-probs back: with them in both
    lists there is no reference, whatever the second list's name (`ref_lp_t`) says, and nothing to say."""
    assert module_codes(TRAINER.replace("against.append(seconds[k])", "against.append(firsts[k])"),
                        tmp_path) == []


def test_a_loss_returned_with_its_statistics_is_reported_once(tmp_path):
    """JosephLi2023's `compute_loss` returns `total, stats` and its caller unpacks `loss, stats = ...` before
    `loss.backward()`: one term, reported where it leaves the loss function, not again at the call."""
    source = TRAINER.replace("        return total\n", "        return total, {\"kl\": kl_per_tok.mean().item()}\n") \
        .replace("        loss = self.compute_loss(batches, advantages)\n",
                 "        loss, stats = self.compute_loss(batches, advantages)\n")
    assert module_codes(source, tmp_path) == [(30, "KL002")]

