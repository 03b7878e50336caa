"""Shapes of KL code met on held-out trainers (tests/ecosystem/heldout): a loss module of another file
held as an attribute, a masked mean whose default axis is the token axis, and the log-probs of a
preference pair's chosen and rejected responses.

A k3 loss is row 3 of kl-math.md section 8 (KL002), divided by each sequence's own length row 21
(KL007); a preference pair's log-ratios form no KL estimate, so DPO/SPPO statistics stay silent.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from snippets import module_codes

from klaudit.lint.project import Project, integer_default
from klaudit.lint.roles import sink_of_name, tensor_role

LEARNER = """\
    import torch
    from clipped import ClippedLoss


    class Learner:
        def __init__(self, settings):
            self.loss_fn = ClippedLoss(beta=settings.get("beta", 0.02))

        def learn(self, logp, ref_logp, old_logp, advantages, mask):
            log_ratio = ref_logp - logp
            per_token_kl = torch.exp(log_ratio) - log_ratio - 1
            loss, _ = self.loss_fn(logp, old_logp, advantages, per_token_kl, mask)
            loss.backward()
    """


def codes(tmp_path: Path, main: str, **modules: str) -> list[tuple[int, str]]:
    """(line, code) of the findings in `main` (written as learner.py beside `modules`)."""
    return module_codes(main, tmp_path, "learner.py", **modules)


def clipped_loss(reduction: str) -> str:
    return f"""\
        import torch
        from torch import nn


        def per_sequence_mean(values, mask):
            return (values * mask).sum(-1) / mask.sum(-1)


        class ClippedLoss(nn.Module):
            def __init__(self, beta=0.02):
                super().__init__()
                self.beta = beta

            def forward(self, logp, old_logp, advantages, per_token_kl, mask):
                ratio = torch.exp(logp - old_logp)
                loss = -ratio * advantages + self.beta * per_token_kl
                loss = {reduction}
                return loss, ratio.max()
        """


def test_a_loss_module_of_another_file_is_reported_where_its_loss_comes_back(tmp_path):
    # the KL enters the loss inside ClippedLoss.forward (through a helper of its module), whose module's
    # own lint never sees this estimator
    per_sequence = clipped_loss("per_sequence_mean(loss, mask).mean()")
    assert codes(tmp_path, LEARNER, clipped=per_sequence) == [(12, "KL002"), (12, "KL007"), (12, "KL008")]


def test_the_same_loss_with_a_batch_token_mean_is_only_the_k3_loss(tmp_path):
    batch_mean = clipped_loss("(loss * mask).sum() / mask.sum()")
    assert codes(tmp_path, LEARNER, clipped=batch_mean) == [(12, "KL002"), (12, "KL008")]


@pytest.mark.parametrize("default, per_sequence", [("dim=1", True), ("dim=-1", True), ("axis=None", False),
                                                   ("dim=0", False)])
def test_an_imported_masked_mean_reduces_over_its_own_default_axis(tmp_path, default, per_sequence):
    # a helper module without KL words is not followed: its signature says which mean it takes
    helper = f"""\
        def masked_mean(values, mask, {default}):
            return (values * mask).sum({default.split("=")[0]}={default.split("=")[1]}) / mask.sum()
        """
    loss = clipped_loss("masked_mean(loss, mask).mean()").replace(
        "from torch import nn\n", "from torch import nn\n        from helpers import masked_mean\n")
    found = codes(tmp_path, LEARNER, clipped=loss, helpers=helper)
    assert ((12, "KL007") in found) is per_sequence
    assert (12, "KL002") in found


def test_integer_default_reads_a_signature_without_interpreting_it(tmp_path):
    path = tmp_path / "reduce.py"
    path.write_text("def masked_mean(x, mask, dim=-1):\n    pass\n\n"
                    "def masked_sum(x, mask, *, axis=None):\n    pass\n\n"
                    "def total(x, mask, dim='tokens'):\n    pass\n")
    project = Project([tmp_path])

    def default(name: str, parameters: tuple[str, ...]) -> int | None:
        definition = project.module_function(path, name)
        return None if definition is None else integer_default(definition, parameters)

    assert default("masked_mean", ("dim", "axis")) == -1
    assert default("masked_sum", ("dim", "axis")) is None
    assert default("total", ("dim",)) is None
    assert default("absent", ("dim",)) is None


@pytest.mark.parametrize("name", ["policy_chosen_logps", "ref_rejected_logps", "reference_chosen_logps",
                                  "chosen_ref_logprobs", "rejected_logps"])
def test_a_preference_pairs_log_probs_have_no_role(name):
    assert tensor_role(name) is None


def test_an_implicit_reward_is_no_reward_sink():
    assert sink_of_name("implicit_rewards") is None
    assert sink_of_name("token_level_rewards") == "reward"
    assert sink_of_name("chosen_rewards") == "reward"  # what it holds decides (made of a pair's log-probs: no KL)


PAIR_STATISTICS = """\
    import torch


    def pair_logps(model, batch):
        logits = model(batch["input_ids"]).logits
        return torch.gather(logits.log_softmax(-1), 2, batch["labels"].unsqueeze(2)).squeeze(2).sum(-1)


    def evaluate(model, ref_model, batch, beta, half):
        logps = pair_logps(model, batch)
        with torch.no_grad():
            ref_logps = pair_logps(ref_model, batch)
        chosen_logps, rejected_logps = logps[:half], logps[half:]
        {rewards}
        return rewards.mean().item()
    """


def test_a_pairs_implicit_reward_is_silent_and_the_same_log_ratio_of_samples_is_not(tmp_path):
    # added to a score: a reward whose sign is known (a log-ratio returned alone is its caller's to sign)
    pair = "rewards = batch['scores'] + beta * (chosen_logps - ref_logps[:half]).detach()"
    sampled = "rewards = batch['scores'] + beta * (logps - ref_logps).detach()"
    assert codes(tmp_path, PAIR_STATISTICS.format(rewards=pair)) == []
    assert codes(tmp_path, PAIR_STATISTICS.format(rewards=sampled)) == [(14, "KL011")]


KL_DIV_LOSS = """\
    import torch
    import torch.nn.functional as F


    def conditioned_loss(policy, ref_policy, batch, kl_coef):
        logits = policy(batch["queries"]).logits
        with torch.no_grad():
            ref_logits = ref_policy(batch["queries"]).logits
        kl_per_token = {kl_div}.sum(dim=-1)
        loss = (kl_per_token * kl_coef).mean()
        return loss
    """


@pytest.mark.parametrize("probabilities, log_probabilities", [
    # KL(pi || ref): torch's kl_div(input, target) is target * (log target - input)
    ('F.kl_div(F.log_softmax(ref_logits, -1), F.softmax(logits, -1), reduction="none")',
     'F.kl_div(F.log_softmax(ref_logits, -1), F.log_softmax(logits, -1), reduction="none", log_target=True)'),
    # KL(ref || pi), the other direction
    ('F.kl_div(F.log_softmax(logits, -1), F.softmax(ref_logits, -1), reduction="none")',
     'F.kl_div(F.log_softmax(logits, -1), F.log_softmax(ref_logits, -1), reduction="none", log_target=True)'),
])
def test_kl_div_of_softmax_probabilities_reads_as_its_log_target_spelling(tmp_path, probabilities, log_probabilities):
    assert codes(tmp_path, KL_DIV_LOSS.format(kl_div=probabilities)) == \
        codes(tmp_path, KL_DIV_LOSS.format(kl_div=log_probabilities))


def test_the_exact_reverse_kl_as_a_loss_is_the_local_term(tmp_path):
    # Quark's spelling: the exact KL_t(pi || ref) differentiated per token gives PART (row 2, KL003)
    reverse = 'F.kl_div(F.log_softmax(ref_logits, -1), F.softmax(logits, -1), reduction="none")'
    assert codes(tmp_path, KL_DIV_LOSS.format(kl_div=reverse)) == [(10, "KL003")]


def test_a_floor_under_probabilities_before_their_log_is_no_clamp_of_the_kl(tmp_path):
    # log(p.clamp_min(eps)) changes only tokens with p < eps, whose p * log p is about 0: a safe log
    safe_log = ('F.kl_div(F.log_softmax(ref_logits, -1), torch.log(F.softmax(logits, -1).clamp_min(1e-8)),'
                ' reduction="none", log_target=True)')
    assert codes(tmp_path, KL_DIV_LOSS.format(kl_div=safe_log)) == [(10, "KL003")]
