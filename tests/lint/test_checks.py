"""The rules end to end on small trainer snippets: code, line, column, switch values, flows.

Expected codes are the verdicts of kl-math.md section 8 for the configuration each snippet
spells (e.g. k3 differentiated as a loss is row 3, KL002); correct configurations (rows 6, 11,
12, 13, 15, 17, 20) must give nothing.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import libcst as cst
import pytest

from klaudit.lint.checks import check_module
from klaudit.lint.project import Project


def lint(source: str, tmp_path: Path, name: str = "snippet.py"):
    path = tmp_path / name
    text = textwrap.dedent(source)
    path.write_text(text)
    return check_module(str(path), cst.parse_module(text), Project([tmp_path]), text)


def codes(source: str, tmp_path: Path) -> list:
    return sorted((f.line, f.code) for f in lint(source, tmp_path))


HEADER = "import torch\nimport torch.nn.functional as F\n\n\n"


@pytest.mark.parametrize("kl, code", [
    ("logp - ref_logp", "KL001"),
    ("0.5 * (logp - ref_logp) ** 2", "KL003"),
    ("torch.exp(ref_logp - logp) - (ref_logp - logp) - 1", "KL002"),
    ("torch.expm1(ref_logp - logp) + logp - ref_logp", "KL002"),
    ("(logp - ref_logp).abs()", "KL009"),
    ("torch.clamp(torch.exp(torch.clamp(ref_logp - logp, -20, 20)) - (ref_logp - logp) - 1, -10, 10)", "KL002"),
])
def test_each_estimator_differentiated_as_a_loss(kl, code, tmp_path):
    source = HEADER + f"""
def compute_loss(logp, ref_logp, mask, pg_loss, beta):
    kl = {kl}
    loss = pg_loss + beta * (kl * mask).sum(-1).mean()
    return loss
"""
    findings = lint(source, tmp_path)
    assert [(f.line, f.code) for f in findings] == [(8, code)]
    assert findings[0].column == 5  # the statement that stores the term into the loss
    assert findings[0].origin_line == 7
    assert findings[0].fix


@pytest.mark.parametrize("kl, code", [
    ("torch.exp(ref_logp - logp) - (ref_logp - logp) - 1", "KL004"),
    ("0.5 * (logp - ref_logp) ** 2", "KL004"),
    ("(logp - ref_logp).abs()", "KL004"),
    ("logp - ref_logp", None),
])
def test_each_estimator_in_the_reward(kl, code, tmp_path):
    source = HEADER + f"""
@torch.no_grad()
def apply_kl_penalty(logp, ref_logp, scores, beta):
    kl = {kl}
    token_level_rewards = scores - beta * kl
    return token_level_rewards
"""
    assert codes(source, tmp_path) == ([] if code is None else [(9, code)])


@pytest.mark.parametrize("body", [
    # R-B: k2 loss plus the future-only k1 return
    """
    d = (logp - ref_logp).detach() * mask
    later = d.flip(-1).cumsum(-1).flip(-1) - d
    loss = (0.5 * ((logp - ref_logp) * mask) ** 2 + logp * later).sum(-1).mean()
    """,
    # R-C: k3 loss plus k3 reward-to-go
    """
    k3 = (torch.exp(ref_logp - logp) - 1 + (logp - ref_logp)) * mask
    loss = (k3 + logp * k3.detach().flip(-1).cumsum(-1).flip(-1)).sum(-1).mean()
    """,
    # R-D: Rao-Blackwellized with the exact per-step KL
    """
    lp = F.log_softmax(logits, dim=-1)
    lq = F.log_softmax(ref_logits, dim=-1)
    kl = (lp.exp() * (lp - lq)).sum(-1) * mask
    later = kl.detach().flip(-1).cumsum(-1).flip(-1) - kl.detach()
    loss = (kl + logp * later).sum(-1).mean()
    """,
    # R-E: the sequence-level 0.5 * D^2
    """
    d = ((logp - ref_logp) * mask).sum(-1)
    loss = (0.5 * d ** 2).mean()
    """,
    # KL computed for logging only
    """
    kl = torch.exp(ref_logp - logp) - (ref_logp - logp) - 1
    stats = {"kl": (kl * mask).sum().item()}
    loss = pg_loss
    """,
])
def test_correct_configurations_give_nothing(body, tmp_path):
    source = HEADER + "def compute_loss(logp, ref_logp, mask, logits, ref_logits, pg_loss):\n" + textwrap.indent(
        textwrap.dedent(body), "    ") + "    return loss\n"
    assert codes(source, tmp_path) == []


def test_string_switch_gives_one_finding_per_unsafe_branch_naming_the_value(tmp_path):
    source = HEADER + """
def kl_penalty(logprob, ref_logprob, kl_penalty):
    if kl_penalty in ("kl", "k1"):
        return logprob - ref_logprob
    if kl_penalty in ("mse", "k2"):
        return 0.5 * (logprob - ref_logprob).square()
    if kl_penalty in ("low_var_kl", "k3"):
        kl = ref_logprob - logprob
        return torch.exp(kl) - kl - 1
    raise NotImplementedError(kl_penalty)


class Actor:
    def update(self, data):
        log_prob = self.forward(data)
        kld = kl_penalty(log_prob, data["ref_log_prob"], kl_penalty=self.config.kl_loss_type)
        kl_loss = (kld * data["response_mask"]).sum(-1).mean()
        loss = self.pg_loss(data) + kl_loss * self.config.kl_loss_coef
        loss.backward()
"""
    findings = lint(source, tmp_path)
    assert sorted((f.line, f.code) for f in findings) == [(21, "KL001"), (21, "KL002"), (21, "KL003")]
    by_code = {f.code: f.message for f in findings}
    assert 'kl_loss_type="low_var_kl"|"k3"' in by_code["KL002"]
    assert 'kl_loss_type="kl"|"k1"' in by_code["KL001"]


def test_known_switch_value_selects_one_branch(tmp_path):
    source = HEADER + """
def approx_kl(log_probs, log_probs_base, kl_estimator="k1"):
    log_ratio = log_probs - log_probs_base
    if kl_estimator == "k3":
        log_ratio = -log_ratio
        log_ratio = log_ratio.exp() - 1 - log_ratio
    return log_ratio


def train_step(log_probs, ref_log_probs, mask, actor_loss):
    kl = approx_kl(log_probs, ref_log_probs, kl_estimator="k3")
    kl_loss = (kl * mask).sum() / mask.sum()
    return actor_loss + kl_loss
"""
    assert codes(source, tmp_path) == [(16, "KL002")]


def test_boolean_flag_branches(tmp_path):
    source = HEADER + """
class Trainer:
    def compute_kl(self, log_probs, ref_log_probs):
        kl = log_probs - ref_log_probs
        if self.cfg.use_kl_estimator_k3:
            kl = torch.exp(-kl) - 1 + kl
        return kl

    def step(self, log_probs, ref_log_probs, mask, pg_loss):
        kl_loss = (self.compute_kl(log_probs, ref_log_probs) * mask).sum(-1).mean()
        return pg_loss + kl_loss
"""
    assert codes(source, tmp_path) == [(14, "KL001"), (14, "KL002")]


def test_reward_helper_is_reported_at_the_call_site(tmp_path):
    source = HEADER + """
def compute_reward(r, kl_coef, kl, action_mask):
    kl_reward = -kl_coef * kl
    return kl_reward


@torch.no_grad()
def make_experience(action_log_probs, base_action_log_probs, r, action_mask, kl_coef):
    log_ratio = -(action_log_probs - base_action_log_probs)
    kl = log_ratio.exp() - 1 - log_ratio
    reward = compute_reward(r, kl_coef, kl, action_mask)
    return reward
"""
    assert codes(source, tmp_path) == [(15, "KL004")]


def test_wrong_sign_last_token_and_length_normalisation(tmp_path):
    source = HEADER + """
@torch.no_grad()
def bonus(logprobs, ref_logprobs, scores, coef):
    kl = (logprobs - ref_logprobs).sum(1)
    rewards = scores + coef * kl
    return rewards


@torch.no_grad()
def last_only(logprobs, ref_logprobs, scores, coef):
    rewards = scores - coef * (logprobs - ref_logprobs)[:, -1]
    return rewards


@torch.no_grad()
def per_length(logprobs, ref_logprobs, scores, coef, mask):
    kl = ((logprobs - ref_logprobs) * mask).sum(-1) / mask.sum(-1)
    rewards = scores - coef * kl
    return rewards
"""
    assert codes(source, tmp_path) == [(9, "KL011"), (15, "KL005"), (22, "KL007")]


def test_loss_and_reward_of_one_step_are_one_configuration(tmp_path):
    source = HEADER + """
def step(logps, ref_logps, scores, mask, beta):
    with torch.no_grad():
        seq_kl = ((logps - ref_logps) * mask).sum(-1)
        rewards = scores - beta * seq_kl
    ratio = torch.exp(logps - logps.detach())
    kl = torch.exp(ref_logps - logps) - (ref_logps - logps) - 1
    per_token_loss = -ratio * rewards.unsqueeze(-1) + beta * kl
    return (per_token_loss * mask).sum(-1).mean()
"""
    assert codes(source, tmp_path) == [(12, "KL006")]


def test_hard_negatives(tmp_path):
    source = HEADER + """
def dpo_loss(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps, beta):
    logits = (policy_chosen_logps - ref_chosen_logps) - (policy_rejected_logps - ref_rejected_logps)
    loss = -F.logsigmoid(beta * logits).mean()
    return loss


def rejection_mask(old_log_probs, rollout_log_probs, response_mask, threshold):
    log_ratio = rollout_log_probs - old_log_probs
    k3 = torch.exp(log_ratio) - 1 - log_ratio
    return response_mask * (k3 < threshold).float()


def trust_region_loss(logp, old_logp, mask):
    loss = (0.5 * (logp - old_logp) ** 2 * mask).sum()
    return loss
"""
    assert codes(source, tmp_path) == []


def test_imports_between_modules_of_the_linted_tree(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "estimators.py").write_text(textwrap.dedent("""
        import torch


        def k3(logp, ref_logp):
            return torch.exp(ref_logp - logp) - (ref_logp - logp) - 1
    """))
    trainer = textwrap.dedent("""
        from pkg.estimators import k3
        from . import estimators


        def compute_loss(logp, ref_logp, mask):
            loss = (k3(logp, ref_logp) * mask).sum(-1).mean()
            return loss


        def other_loss(logp, ref_logp, mask):
            loss = (estimators.k3(logp, ref_logp) * mask).sum(-1).mean()
            return loss
    """)
    (package / "trainer.py").write_text(trainer)
    project = Project([tmp_path])
    findings = check_module(str(package / "trainer.py"), cst.parse_module(trainer), project, trainer)
    assert sorted((f.line, f.code) for f in findings) == [(7, "KL002"), (12, "KL002")]
    assert "estimators.py:6" in findings[0].message


def test_a_repository_with_two_copies_of_a_package_imports_each_copys_own(tmp_path):
    """CriticCoT vendors verl three times (one_shot_rlvr/verl, sweswe-main/verl, ...): a module of one copy that
    imports `verl.core_algos` runs with its own copy on Python's path, even from a recipe folder below it that is
    a namespace package (no __init__.py). Here copy `a` computes k1 and copy `b` k3 under the same name."""
    estimators = {"a": "    return logp - ref_logp\n",
                  "b": "    return torch.exp(ref_logp - logp) - (ref_logp - logp) - 1\n"}
    trainer = textwrap.dedent("""
        from verl.core_algos import kl_penalty


        def compute_loss(logp, ref_logp, mask):
            loss = (kl_penalty(logp, ref_logp) * mask).sum(-1).mean()
            return loss
    """)
    for copy, body in estimators.items():
        (tmp_path / copy / "verl").mkdir(parents=True)
        (tmp_path / copy / "verl" / "__init__.py").write_text("")
        (tmp_path / copy / "verl" / "core_algos.py").write_text("import torch\n\n\ndef kl_penalty(logp, ref_logp):\n" + body)
        (tmp_path / copy / "recipe" / "sppo").mkdir(parents=True)
        (tmp_path / copy / "recipe" / "sppo" / "__init__.py").write_text("")
        (tmp_path / copy / "recipe" / "sppo" / "actor.py").write_text(trainer)
    project = Project([tmp_path])
    found = {copy: check_module(str(tmp_path / copy / "recipe" / "sppo" / "actor.py"), cst.parse_module(trainer),
                                project, trainer) for copy in estimators}
    assert {copy: [(f.code, f.related[0][0]) for f in findings] for copy, findings in found.items()} == {
        "a": [("KL001", str(tmp_path / "a" / "verl" / "core_algos.py"))],
        "b": [("KL002", str(tmp_path / "b" / "verl" / "core_algos.py"))]}


def test_unparsable_import_resolves_to_nothing(tmp_path):
    (tmp_path / "broken.py").write_text("def (:\n")
    source = "from broken import k3\n\ndef compute_loss(logp, ref_logp):\n    loss = k3(logp, ref_logp)\n    return loss\n"
    assert lint(source, tmp_path, "user.py") == []


def test_forward_output_keeps_its_gradient_and_unpacked_names_keep_their_roles(tmp_path):
    source = HEADER + """
def ppo_loss(model_output, data, kl_coef):
    log_prob = model_output["log_probs"]
    action_log_probs, aux = model_output["pair"]
    kl_loss = (torch.exp(data["ref_log_prob"] - log_prob) - (data["ref_log_prob"] - log_prob) - 1).mean()
    k1_loss = (action_log_probs - data["ref_log_prob"]).mean()
    return kl_coef * (kl_loss + k1_loss)
"""
    assert codes(source, tmp_path) == [(9, "KL002"), (10, "KL001")]


def test_not_kl_sinks_and_forward_distillation(tmp_path):
    source = HEADER + """
def weights(teacher_logprobs, rollout_logprobs):
    a_opd = (teacher_logprobs - rollout_logprobs).detach()
    abs_advantages = a_opd.abs()
    return abs_advantages


def kl_divergence(log_q, log_p):
    p = log_p.exp()
    kld = p * (log_p - log_q)
    return kld.sum(-1)


def distill_loss(student_topk_log_probs, teacher_topk_log_probs):
    loss = kl_divergence(log_q=student_topk_log_probs, log_p=teacher_topk_log_probs).mean()
    return loss
"""
    # the forward KL(teacher || student) over the top-k is forward-KL distillation, no KL penalty to the reference:
    # only the informational KL100 (off by default)
    assert codes(source, tmp_path) == [(15, "KL100")]


def test_one_finding_per_verdict_whatever_unrelated_flags_select(tmp_path):
    source = HEADER + """
class Trainer:
    def logps(self, logits, ids):
        if self.cfg.squeeze:
            logits = logits.squeeze(0)
        return F.log_softmax(logits, dim=-1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)

    def loss(self, logits, ids, ref_logps):
        student_logps = self.logps(logits, ids)
        per_token_loss = (student_logps - ref_logps).detach() * student_logps
        return per_token_loss.sum()
"""
    assert codes(source, tmp_path) == [(14, "KL003")]


def test_a_kl_stored_on_an_object_reaches_the_reward_in_another_method(tmp_path):
    """OpenRLHF's shape: the rollout stores `samples.kl`, a later method reads `experience.kl` into the
    reward. k3 values in the reward are row 7 (KL004); k1 values are row 6 (nothing). The reader comes
    first in the file: what a module stores does not depend on the order its functions are read in."""
    source = HEADER + textwrap.dedent("""
    class ExperienceMaker:
        def compute_advantages(self, experiences, scores):
            for experience, score in zip(experiences, scores):
                rewards = score - self.kl_coef * experience.kl
                experience.rewards = rewards

        def make_experience(self, samples_list, action_log_probs_list, base_action_log_probs_list):
            for samples, action_log_probs, base_action_log_probs in zip(
                samples_list, action_log_probs_list, base_action_log_probs_list
            ):
                log_ratio = base_action_log_probs - action_log_probs
                samples.kl = log_ratio.exp() - 1 - log_ratio
    """)
    assert codes(source, tmp_path) == [(9, "KL004")]
    assert codes(source.replace("log_ratio.exp() - 1 - log_ratio", "-log_ratio"), tmp_path) == []


def test_loop_variables_take_their_roles_from_their_names(tmp_path):
    source = HEADER + textwrap.dedent("""
    def kl_losses(logprobs_list, ref_logprobs_list):
        losses = []
        for logprobs, ref_logprobs in zip(logprobs_list, ref_logprobs_list):
            kl_loss = (logprobs - ref_logprobs).mean()
            losses.append(kl_loss)
        return losses
    """)
    assert codes(source, tmp_path) == [(9, "KL001")]


STRAIGHT_THROUGH = '''
import torch


def kl_penalty(logprob, ref_logprob, kl_penalty):
    forward_score = kl_penalty_forward(logprob, ref_logprob, kl_penalty)
    if not kl_penalty.endswith("+") or kl_penalty in ("mse", "k2"):
        return forward_score
    backward_score = 0.5 * (logprob - ref_logprob).square()
    return backward_score - backward_score.detach() + forward_score.detach()


def kl_penalty_forward(logprob, ref_logprob, kl_penalty):
    if kl_penalty in ("kl", "k1"):
        return logprob - ref_logprob
    if kl_penalty in ACCEPTED_K3:
        kl = ref_logprob - logprob
        return torch.exp(kl) - kl - 1
    raise NotImplementedError


def update(policy_loss, log_prob, ref_log_prob, config):
    kld = kl_penalty(log_prob, ref_log_prob, kl_penalty=config.kl_loss_type)
    kl_loss = kld.sum()
    policy_loss = policy_loss + kl_loss * config.kl_loss_coef
    return policy_loss
'''


@pytest.mark.parametrize("accepted, straight_through", [
    ('("low_var_kl", "k3")', False),  # a "+" value raises: no straight-through estimator exists
    ('("low_var_kl", "k3", "k3+")', True),  # this release takes "k3+" to k3's value with k2's gradient
])
def test_straight_through_is_read_from_the_code_s_own_branches(accepted, straight_through, tmp_path):
    found = lint(STRAIGHT_THROUGH.replace("ACCEPTED_K3", accepted), tmp_path)
    assert sorted(f.code for f in found) == ["KL001", "KL002"] + (["KL003"] if straight_through else [])
    straight = [f.message for f in found if "+" in f.message.split()[0]]  # "kl" never ends with "+": no k1+
    assert straight == ([m for m in straight if m.startswith("k3+") and '[kl_loss_type="k3+"]' in m]
                        if straight_through else [])


def test_every_independent_defect_of_one_term_is_reported(tmp_path):
    source = HEADER + '''
def compute_loss(logp, ref_logp, mask, pg_loss, beta):
    kl = torch.exp(ref_logp - logp) - (ref_logp - logp) - 1
    per_seq = (kl * mask).sum(-1) / mask.sum(-1)
    return pg_loss - beta * per_seq.mean()
'''
    assert codes(source, tmp_path) == [(9, "KL002"), (9, "KL007"), (9, "KL011")]


def test_the_estimator_s_place_is_a_related_location(tmp_path):
    source = HEADER + '''
def compute_loss(logp, ref_logp, mask, pg_loss, beta):
    kl = torch.exp(ref_logp - logp) - (ref_logp - logp) - 1
    kl_loss = (kl * mask).sum()
    return pg_loss + beta * kl_loss
'''
    [found] = lint(source, tmp_path)
    assert (found.line, found.code) == (8, "KL002")
    assert found.related == ((str(tmp_path / "snippet.py"), 7, 5, "estimator computed here"),)


def test_new_and_old_parameters_of_a_log_prob_function_take_roles(tmp_path):
    """`def kl(new, ref, ...)`: k3 of `new` against the reference as a loss is row 3 (KL002)."""
    source = HEADER + textwrap.dedent("""
    def kl_term(new, ref, mask):
        log_ratio = ref - new
        kl_loss = ((log_ratio.exp() - 1 - log_ratio) * mask).sum(-1).mean()
        return kl_loss
    """)
    assert codes(source, tmp_path) == [(8, "KL002")]


# ---- a value named *_rewards is a reward sink only when it is used as one -------------------

PREFERENCE = HEADER + textwrap.dedent("""
def preference_loss(policy_logps, ref_logps, beta):
    margins = policy_logps[0] - policy_logps[1]
    losses = -F.logsigmoid(beta * margins)
    chosen_rewards = beta * (policy_logps - ref_logps)
    return losses.mean(), chosen_rewards


def train_step(policy_logps, ref_logps, beta, stats):
    loss, chosen_rewards = preference_loss(policy_logps, ref_logps, beta)
    stats["rewards/chosen"] = chosen_rewards.mean().item()
    USE
    return loss
""")


@pytest.mark.parametrize("use, expected", [
    ("pass", []),  # only statistics: the implicit reward of a preference loss is no KL bonus
    ("pg_loss = -(policy_logps * chosen_rewards.detach()).sum()", [(9, "KL011")]),  # a bonus in a loss
    ("batch.rewards = chosen_rewards", [(9, "KL011")]),  # stored for later use: a reward
    ("advantages = compute_gae_advantages(chosen_rewards)", [(9, "KL011")]),  # handed to GAE outside the tree
])
def test_a_reward_named_value_is_a_sink_only_where_it_is_used_as_one(tmp_path, use, expected):
    assert codes(PREFERENCE.replace("USE", use), tmp_path) == expected


@pytest.mark.parametrize("penalty, found", [
    ("-1 * coef * kl", []),  # tril's `-1 * self.kl_controller.kl_coeff * kl_div`: a penalty
    ("-coef * kl", []),
    ("1 * coef * kl", [(9, "KL011")]),  # a bonus
    ("-1 * -coef * kl", [(9, "KL011")]),  # minus minus: a bonus
])
def test_a_literal_minus_one_times_an_unexplained_coefficient_is_a_negative_coefficient(tmp_path, penalty, found):
    """Cornell-RL/tril (hundred-and-seventh set) writes its KL reward `kl_rewards = -1 * kl_coeff * kl_div` and
    adds it to the rewards. A number times a value the analysis does not follow was dropped, sign and all, so the
    penalty was read as `+kl` and reported as a bonus (KL011, 3 fp)."""
    source = HEADER + f"""
@torch.no_grad()
def shaped(logprobs, ref_logprobs, scores, coef):
    kl = logprobs - ref_logprobs
    rewards = scores + {penalty}
    return rewards
"""
    assert codes(source, tmp_path) == found


def test_the_sign_of_a_reward_counts_where_the_reward_is_final(tmp_path):
    """`kl_reward = beta * kl` is a penalty's size; `rewards = scores - kl_reward` is the reward (row 6)."""
    source = HEADER + textwrap.dedent("""
    def rewards_of(logprobs, ref_logprobs, scores, beta):
        kl = (logprobs - ref_logprobs).detach()
        kl_reward = beta * kl
        rewards = scores - kl_reward
        return rewards.flip(-1).cumsum(-1).flip(-1)
    """)
    assert codes(source, tmp_path) == []
    assert codes(source.replace("scores - kl_reward", "scores + kl_reward"), tmp_path) == [(8, "KL011")]


def test_a_kl_term_weighted_by_a_squashed_log_ratio_is_no_estimator(tmp_path):
    """gate * (q - p) with gate = sigmoid(beta * (q - sg p)): a per-token weight that varies with the
    log-ratio is no positive constant, so the product matches no catalog row (the same term scaled by
    a coefficient is a k1 loss, KL001, whatever its sign). What the lint did not
    understand is said by the informational KL100, at the log-ratio the gate is made of."""
    source = HEADER + textwrap.dedent("""
    def gated_distillation_loss(student_log_probs, teacher_log_probs, mask, beta):
        delta = teacher_log_probs - student_log_probs.detach()
        gate = torch.sigmoid(beta * delta).detach()
        loss = (gate * (teacher_log_probs - student_log_probs) * mask).sum()
        return loss
    """)
    assert codes(source, tmp_path) == [(7, "KL100")]
    assert codes(source.replace("(gate * (", "(beta * ("), tmp_path) == [(7, "KL100"), (9, "KL001")]


def test_kl100_once_per_term_whose_use_the_analysis_cannot_follow(tmp_path):
    """Stored twice where no analysed code reads it: one KL100 where it is formed. A logged statistic
    and a returned term have known uses."""
    source = HEADER + textwrap.dedent("""
    def step(data, logprobs, ref_logprobs, mask, stats):
        kl = (logprobs - ref_logprobs) * mask
        data.batch["kl"] = kl
        data.extra["kl"] = kl
        shown = (logprobs - ref_logprobs).sum(-1)
        stats["kl"] = shown.mean().item()
        returned = logprobs - ref_logprobs
        return returned
    """)
    assert codes(source, tmp_path) == [(7, "KL100")]


def test_a_loss_carried_on_through_a_helper_is_reported_where_the_kl_entered(tmp_path):
    """ms-swift's shape: the k3 loss (row 3) enters `per_token_loss`, is reduced into `loss`, and a
    helper of the file adds another term to it. The later losses carry the same term: one finding,
    where the KL entered the loss."""
    source = HEADER + textwrap.dedent("""
    def mixed_loss(grpo_loss, aux):
        return grpo_loss + 0.1 * aux


    def policy_loss(logp, ref_logp, mask, aux):
        per_token_loss = (torch.exp(ref_logp - logp) - (ref_logp - logp) - 1) * mask
        loss = per_token_loss.sum(-1).mean()
        loss = mixed_loss(grpo_loss=loss, aux=aux)
        return loss
    """)
    assert codes(source, tmp_path) == [(11, "KL002")]


def test_an_aggregation_mode_read_from_the_config_is_judged_for_every_mode(tmp_path):
    """verl's agg_loss outside the linted tree with `loss_agg_mode=config.loss_agg_mode`: every mode
    is possible, and seq-mean-token-mean adds the 1/L weights of row 21 (KL007) to the k3 loss of
    row 3 (KL002), under that switch value; a literal mode decides alone."""
    source = HEADER + textwrap.dedent("""
    from verl.trainer.ppo.core_algos import agg_loss


    def update(log_prob, ref_log_prob, response_mask, pg_loss, config):
        kl = ref_log_prob - log_prob
        kld = torch.exp(kl) - kl - 1
        kl_loss = agg_loss(loss_mat=kld, loss_mask=response_mask, loss_agg_mode=config.loss_agg_mode)
        loss = pg_loss + kl_loss * config.kl_loss_coef
        loss.backward()
    """)
    found = lint(source, tmp_path)
    assert sorted(f.code for f in found) == ["KL002", "KL007"]
    assert '[loss_agg_mode="seq-mean-token-mean"]' in next(f.message for f in found if f.code == "KL007")
    literal = source.replace("config.loss_agg_mode", '"token-mean"')
    assert [f.code for f in lint(literal, tmp_path)] == ["KL002"]
