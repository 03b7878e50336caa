"""A tree built on an installed verl, which it imports but does not hold (RAGEN, agent trainers): klaudit's
model of verl's KL code (klaudit/lint/installed) stands in for it, so the KL term is followed as in verl.

Verdicts (kl-math.md section 8): k1 as a loss is row 1 (KL001), k2 as a loss row 2 (KL003), clamped k3 as
a loss rows 3-4 (KL002), |log-ratio| as a loss row 5 (KL009); a loss in the PPO epochs beside the ratio to
the rollout's log-probs is on older samples (KL008). In the reward, detached k1 is row 6 (correct); k2, k3
and |d| values are rows 7-9 (KL004).
"""

from __future__ import annotations

import textwrap

import libcst as cst
import pytest

from klaudit.lint.checks import check_module
from klaudit.lint.project import Project

ACTOR = """\
    from verl.trainer.ppo.core_algos import agg_loss, kl_penalty


    def update_policy(self, data, log_prob, old_log_prob, advantages, response_mask):
        ratio = (log_prob - old_log_prob).exp()
        pg_loss = agg_loss(loss_mat=-advantages * ratio, loss_mask=response_mask, loss_agg_mode="token-mean")
        kld = kl_penalty(logprob=log_prob, ref_logprob=data["ref_log_prob"], kl_penalty={kind})
        kl_loss = agg_loss(loss_mat=kld, loss_mask=response_mask, loss_agg_mode="token-mean")
        policy_loss = pg_loss + kl_loss * self.config.kl_loss_coef
        policy_loss.backward()
    """

TRAINER = """\
    from verl.trainer.ppo.ray_trainer import apply_kl_penalty


    def fit(self, batch):
        batch, kl_metrics = apply_kl_penalty(batch, kl_ctrl=self.kl_ctrl_in_reward, kl_penalty={kind})
        return batch
    """


def findings(tmp_path, source: str, **modules: str):
    for name, text in modules.items():
        path = tmp_path.joinpath(*name.split(".")).with_suffix(".py")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    path = tmp_path / "actor.py"
    text = textwrap.dedent(source)
    path.write_text(text)
    return check_module(str(path), cst.parse_module(text), Project([tmp_path]), text)


@pytest.mark.parametrize("kind, codes", [
    ('"kl"', ["KL001", "KL008"]),
    ('"low_var_kl"', ["KL002", "KL008"]),
    ('"mse"', ["KL003", "KL008"]),
    ('"abs"', ["KL008", "KL009"]),
    ('"k3+"', ["KL003", "KL008"]),  # k3's value with k2's gradient
    ("self.config.kl_loss_type", ["KL001", "KL002", "KL003", "KL008", "KL009"]),  # every value verl takes
])
def test_the_kl_loss_of_an_installed_verl_is_followed_into_klaudits_model_of_it(tmp_path, kind, codes):
    found = findings(tmp_path, ACTOR.format(kind=kind))
    assert sorted({f.code for f in found}) == codes
    assert {f.line for f in found} == {8}  # where the KL term enters a loss (kl_loss)
    assert all("computed by the installed verl.trainer.ppo.core_algos" in f.message for f in found)


@pytest.mark.parametrize("kind, codes", [('"kl"', []), ('"low_var_kl"', ["KL004"]), ('"mse"', ["KL004"]),
                                         ("self.config.algorithm.kl_penalty", ["KL004"])])
def test_the_kl_reward_of_an_installed_verl_is_reported_at_the_call(tmp_path, kind, codes):
    found = findings(tmp_path, TRAINER.format(kind=kind))
    assert sorted({f.code for f in found}) == codes
    assert {f.line for f in found} <= {5}
    assert all(f.autofix is None for f in found)  # nothing to edit in the user's file: the estimate is verl's


def test_a_tree_that_holds_its_own_verl_is_read_as_it_is(tmp_path):
    # a vendored verl whose kl_penalty is k1 whatever the value: the tree's code, not klaudit's model, decides
    vendored = "def kl_penalty(logprob, ref_logprob, kl_penalty):\n    return logprob - ref_logprob\n"
    found = findings(tmp_path, ACTOR.format(kind='"low_var_kl"'), **{"verl.trainer.ppo.core_algos": vendored})
    assert sorted({f.code for f in found}) == ["KL001", "KL008"]


def test_a_verdict_reached_under_several_values_of_one_switch_names_them_all(tmp_path):
    # abs and abs+ both put |log-ratio| values in the reward (rows 7-9): one finding naming both values; k1
    # and k1+ put k1 values there (row 6, no finding), so the values named are not all the switch has
    found = findings(tmp_path, TRAINER.format(kind="self.config.algorithm.kl_penalty"))
    switches = sorted(f.message[f.message.index("["):f.message.index("]") + 1] for f in found)
    assert switches == ['[kl_penalty="abs"|"abs+"]', '[kl_penalty="low_var_kl"|"k3"|"low_var_kl+"|"k3+"]',
                        '[kl_penalty="mse"|"k2"|"mse+"|"k2+"]']


LIGER = """\
    from liger_kernel.chunked_loss.grpo_loss import LigerFusedLinearGRPOLoss


    def grpo_step(model, hidden, ref_hidden, ids, mask, advantages, optimizer):
        fused = LigerFusedLinearGRPOLoss({options})
        loss, _ = fused(hidden, model.lm_head.weight, ids, mask, advantages,
                        ref_input=ref_hidden, ref_weight=model.ref_head.weight)
        loss.backward()
        optimizer.step()
    """


@pytest.mark.parametrize("options, codes", [
    ("beta=0.04", ["KL002"]),  # k3 in the loss (row 3), the batch's tokens summed over their count (the default)
    ("beta=0.04, loss_type='bnpo'", ["KL002"]),
    ("beta=0.04, loss_type='grpo'", ["KL002", "KL007"]),  # each sequence over its own length: 1/L weights
    ("beta=0.0, loss_type='grpo'", []),  # no KL term at all
    ("loss_type='grpo'", ["KL002", "KL007"]),  # Liger's own beta is 0.04
])
def test_the_fused_grpo_loss_of_an_installed_liger_kernel_adds_k3_to_the_loss(tmp_path, options, codes):
    found = findings(tmp_path, LIGER.format(options=options))
    assert sorted({f.code for f in found}) == codes
    assert {f.line for f in found} <= {5}  # where the loss object is built: its beta and loss_type decide
    assert all("computed by the installed liger_kernel.chunked_loss.grpo_loss" in f.message for f in found)


LIGER_HELD = """\
    from liger_kernel.chunked_loss.grpo_loss import LigerFusedLinearGRPOLoss


    class Trainer:
        def __init__(self):
            self.fused = LigerFusedLinearGRPOLoss(beta=0.04, loss_type="grpo")

        def step(self, model, hidden, ref_hidden, ids, mask, advantages):
            loss, _ = self.fused(hidden, model.lm_head.weight, ids, mask, advantages,
                                 ref_input=ref_hidden, ref_weight=model.ref_head.weight)
            loss.backward()
    """


def test_a_fused_grpo_loss_held_by_a_trainer_is_followed_into_its_method(tmp_path):
    found = findings(tmp_path, LIGER_HELD)
    assert sorted({f.code for f in found}) == ["KL002", "KL007"]
    assert {f.line for f in found} == {9}  # built in another method: reported at the call
