"""Shapes of KL code met in the twelfth review (the held-out set's misses, the tenth fresh set).

Verdicts (kl-math.md section 8): k3 differentiated as a loss follows the forward KL (row 3, KL002); a
per-sequence token-mean of it gives 1/L weights (row 21, KL007).
"""

from __future__ import annotations

import pytest
from snippets import module_codes

# ColossalChat's GRPO consumer: one algorithm moves the k3 into the advantages and zeroes the loss
# term, the others keep it in the loss. The entry `inputs["advantages"]` is set on one path only.
ONE_PATH_ENTRY = """\
import torch


def step(policy, inputs, adv, beta):
    log_probs = policy(inputs["input_ids"])
    log_ratio = inputs["ref_log_probs"] - log_probs
    per_token_kl = torch.exp(log_ratio) - log_ratio - 1
    if adv == "REINFORCE_PPB":
        inputs["advantages"] = inputs["advantages"] - beta * per_token_kl
        per_token_kl = 0.0
    loss = -inputs["advantages"] * log_probs + beta * per_token_kl
    loss = ((loss * inputs["mask"]).sum() / inputs["mask"].sum())
    loss.backward()
"""


def test_an_entry_set_on_one_path_keeps_its_unknown_value_on_the_other(tmp_path):
    """Where `adv != "REINFORCE_PPB"`, `inputs["advantages"]` holds what it held before (a value the
    analysis cannot explain), not the k3-laden advantages of the other path: the k3 loss of that path
    is still judged (row 3, KL002)."""
    assert module_codes(ONE_PATH_ENTRY, tmp_path) == [(11, "KL002")]


def test_a_name_first_set_on_one_path_gains_no_unknown_value(tmp_path):
    """A plain name set only in a branch did not exist on the other path: its value is that branch's,
    and the k3 loss it feeds is judged as it is (row 3)."""
    source = """\
    import torch


    def step(policy, inputs, use_kl, beta):
        log_probs = policy(inputs["input_ids"])
        log_ratio = inputs["ref_log_probs"] - log_probs
        if use_kl:
            kl_term = torch.exp(log_ratio) - log_ratio - 1
        loss = (-inputs["advantages"] * log_probs + beta * kl_term).sum() / inputs["mask"].sum()
        loss.backward()
    """
    assert module_codes(source, tmp_path) == [(9, "KL002")]


LOGGED_ONLY = """\
def distillation_loss(student_log_probs, teacher_log_probs, mask):
    losses = 0.5 * (student_log_probs - teacher_log_probs) ** 2
    k1_losses = student_log_probs - teacher_log_probs
    metrics = {"k1": Metric("mean", k1_losses[mask].mean()), "k1_now": k1_losses.mean().item()}
    return losses, metrics


def step(log_probs, ref_log_probs, mask, pg_loss):
    kl_loss = (log_probs - ref_log_probs).sum() / mask.sum()
    wandb.log({"kl": kl_loss.item()})
    loss = pg_loss + kl_loss
    loss.backward()


def policy_loss(log_probs, ref_log_probs, mask, pg_loss):
    unreduced_loss = pg_loss + 0.1 * ((log_probs - ref_log_probs) * mask).sum()
    return LossOutput(primary_loss=WeightedMetric(unreduced_loss, mask.sum()))
"""


def test_a_loss_named_value_that_is_only_logged_is_no_loss(tmp_path):
    """A verl fork's distillation loss logs `k1_losses` through `Metric(...)` and `.item()` and never
    returns it: no k1 loss there. The k2 loss it returns is judged (row 2, KL003), and a loss-named k1
    that is logged *and* added to the loss still is (row 1, KL001), as is one wrapped in a metrics-named
    type that is returned as the loss (tunix's `LossOutput(primary_loss=WeightedMetric(loss, n))`)."""
    assert module_codes(LOGGED_ONLY, tmp_path) == [(2, "KL003"), (9, "KL001"), (16, "KL001")]


def test_a_loss_named_value_logged_then_deleted_is_no_loss(tmp_path):
    """EM_TBA frees its per-batch tensors with `del ..., pg_loss, ...` after recording them: a `del` reads
    nothing, so a value whose other reads all record a statistic stays a logged value, not a loss (row 1 needs
    the k1 to reach the loss). Added to the loss before the `del`, it is one (KL001)."""
    logged = """\
def train_step(model, ref_model, batch, optimizer, stats):
    logp = model(batch)
    with torch.no_grad():
        ref_logp = ref_model(batch)
    kl_loss = (logp - ref_logp).mean()
    stats["kl"] = kl_loss.item()
    pg_loss = -(batch["adv"] * logp).mean()
    pg_loss.backward()
    optimizer.step()
    del kl_loss, pg_loss
"""
    assert module_codes(logged, tmp_path) == []
    trained = logged.replace("pg_loss.backward()", "(pg_loss + kl_loss).backward()")
    assert module_codes(trained, tmp_path) == [(5, "KL001")]


def test_a_script_in_a_package_folder_finds_the_modules_beside_it(tmp_path):
    """microRLHF keeps train_ppo.py in rlhf/ (which has an __init__.py) and runs it as a script, so
    `from rl_utils import exact_kl` finds rlhf/rl_utils.py. Linted from the repository root, the
    exact per-token KL it returns, used as a loss, is judged (row 2, KL003)."""
    import libcst as cst

    from klaudit.lint.checks import check_module
    from klaudit.lint.project import Project

    package = tmp_path / "rlhf"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "rl_utils.py").write_text(
        "import torch.nn.functional as F\n\n\n"
        "def exact_kl(logits, ref_logits):\n"
        "    logp = F.log_softmax(logits, dim=-1)\n"
        "    ref_logp = F.log_softmax(ref_logits, dim=-1)\n"
        "    return (logp.exp() * (logp - ref_logp)).sum(-1)\n")
    script = ("from rl_utils import exact_kl\n\n\n"
              "def train_step(policy, ref_model, batch, beta):\n"
              "    kl = exact_kl(policy(batch), ref_model(batch).detach())\n"
              "    loss = beta * kl.sum() / batch.numel()\n"
              "    loss.backward()\n")
    (package / "train_ppo.py").write_text(script)
    findings = check_module(str(package / "train_ppo.py"), cst.parse_module(script), Project([tmp_path]), script)
    assert [(f.line, f.code) for f in findings] == [(6, "KL003")]


def test_a_gather_across_processes_keeps_every_token_of_the_kl(tmp_path):
    """vemz/rloo: `kl = gather((k1 * mask).sum(-1))` is accelerate's gather across processes, not
    torch.gather at some positions: the summed k1 is a whole-sequence return (row 6), no last-token
    KL (KL005). torch.gather at the last position still is one (row 19)."""
    source = """\
    from accelerate.utils import gather


    def rewards_with_kl(rewards, old_per_token_logps, ref_per_token_logps, completion_mask, beta, {extra}):
        per_token_kl = old_per_token_logps - ref_per_token_logps
        kl = {gathered}
        rewards = rewards - beta * kl
        advantages = rewards - rewards.mean()
        return advantages
    """
    across = source.format(extra="last", gathered="gather((per_token_kl * completion_mask).sum(-1))")
    assert module_codes(across, tmp_path) == []
    last = source.format(extra="last", gathered="per_token_kl.gather(-1, last.unsqueeze(-1)).squeeze(-1)")
    assert module_codes(last, tmp_path) == [(7, "KL005")]


REGISTRY = """\
import torch

LOSSES = {}
POLICY_LOSSES: dict = {}


def register_loss(names):
    def decorator(func):
        for name in names:
            LOSSES[name] = func
        return func
    return decorator


def register_policy_loss(name):
    def decorator(func):
        POLICY_LOSSES[name] = func
        return func
    return decorator


@register_loss(["k1"])
def k1_loss(student_log_probs, teacher_log_probs):
    losses = student_log_probs - teacher_log_probs
    return losses


@register_loss(["k2"])
def k2_loss(student_log_probs, teacher_log_probs):
    losses = 0.5 * (student_log_probs - teacher_log_probs) ** 2
    return losses


@register_policy_loss("vanilla")
def vanilla(old_log_prob, log_prob, advantages, mask):
    ratio = torch.exp(log_prob - old_log_prob)
    pg_losses = -advantages * ratio
    return (pg_losses * mask).sum() / mask.sum()


def get_loss_fn(name):
    return LOSSES[name]


def get_policy_loss_fn(name):
    return POLICY_LOSSES[name]


def distill(config, log_prob, old_log_prob, teacher_log_probs, mask):
    losses = get_loss_fn(config.loss_mode)(log_prob, teacher_log_probs)
    if config.use_policy_gradient:
        policy_loss_fn = get_policy_loss_fn(config.policy_loss_mode)
        loss = policy_loss_fn(old_log_prob=old_log_prob, log_prob=log_prob, advantages=-losses.detach(), mask=mask)
    else:
        loss = (losses * mask).sum() / mask.sum()
    return loss
"""


def test_a_registry_filled_by_decorators_dispatches_on_its_names(tmp_path):
    """verl's distillation (released 0.9.1 and its forks): the loss is looked up in a dict its decorators
    fill, and with use_policy_gradient its per-token value is passed as the advantages of a registered
    policy loss. The k1 there weighs only its own token (row 2, KL003), the k2 values are no k1 (row 8,
    KL004), both reported where they enter the advantages; as a loss, k1 has no gradient (row 1, KL001)
    and k2 the local one only (row 2, KL003). Only the policy-gradient path compares the policy with
    the behaviour policy: the loss path is judged on-policy (no KL008 there)."""
    codes = module_codes(REGISTRY, tmp_path)
    assert (53, "KL003") in codes and (53, "KL004") in codes
    assert {code for line, code in codes if line != 53} == {"KL001", "KL003"}
    assert (53, "KL008") in codes and all(code != "KL008" for line, code in codes if line != 53)


def test_a_kl_passed_as_the_advantages_of_code_out_of_sight_enters_the_advantages(tmp_path):
    """`compute_policy_loss(..., advantages=-k1.detach())` of an installed library: whatever that code
    does, each token's policy gradient is weighed by its own k1 alone (row 2, KL003)."""
    source = """\
    from somewhere import compute_policy_loss


    def distill_step(log_prob, old_log_prob, teacher_log_prob, mask):
        k1 = log_prob - teacher_log_prob
        loss = compute_policy_loss(old_log_prob=old_log_prob, log_prob=log_prob, advantages=-k1.detach(), mask=mask)
        loss.backward()
    """
    assert module_codes(source, tmp_path) == [(6, "KL003")]


# OpenRLHF-style helpers whose estimator switch the callers leave at its default: `compute_approx_kl(
# logp, base, action_mask=mask)` with kl_estimator="k1" (an OpenRLHF fork), or use_kl_estimator_k3=False
# (Open-Reasoner-Zero's spelling).
DEFAULTED = """\
def compute_approx_kl(log_probs, log_probs_base, action_mask=None, {parameter}):
    log_ratio = log_probs - log_probs_base
    if {test}:
        log_ratio = (-log_ratio).exp() - 1 + log_ratio
    return log_ratio


def compute_reward(r, kl_coef, log_probs, log_probs_base, action_mask, options):
    kl = compute_approx_kl(log_probs, log_probs_base, action_mask=action_mask{extra})
    rewards = -kl_coef * kl
    rewards[:, -1] += r
    return rewards
"""


@pytest.mark.parametrize("parameter, test, passed", [
    ('kl_estimator="k1"', 'kl_estimator == "k3"', ', kl_estimator="k3"'),
    ("use_kl_estimator_k3=False", "use_kl_estimator_k3", ", use_kl_estimator_k3=True"),
])
def test_a_default_the_caller_leaves_selects_its_branch(tmp_path, parameter, test, passed):
    """A string or boolean default no caller passes is that value: only the k1 branch runs, a k1 reward
    (row 6, silent). A caller that passes the k3 value gets the k3 reward (row 7, KL004), and so does one
    that spreads a dict (`**options`), which may set the switch: both branches are judged."""
    def codes(extra: str) -> list:
        return module_codes(DEFAULTED.format(parameter=parameter, test=test, extra=extra), tmp_path)

    assert codes("") == []
    assert codes(passed) == [(10, "KL004")]
    assert codes(", **options") == [(10, "KL004")]
