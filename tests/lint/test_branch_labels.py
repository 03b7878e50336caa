"""A threshold test (`if pp_size > 1:`) labels its two branches as a `== n` test does, and a function defined
inside a branch (a loss closure handed to a pipeline) runs under that branch's labels: the KL terms of the
two branches are judged apart, never paired (ColossalChat's pipeline and non-pipeline paths)."""

import pytest

from klaudit.lint.engine import lint_paths
from tests.lint.snippets import module_codes

TWO_PATHS = '''
import torch


class Consumer:
    def step(self, log_probs, ref_log_probs, old_log_probs, advantages, mask):
        per_token_kl = torch.exp(ref_log_probs - log_probs) - (ref_log_probs - log_probs) - 1
        ratio = torch.exp(log_probs - old_log_probs)
        if self.pp_size > 1:
            def criterion(outputs, inputs):
                inputs["advantages"] = inputs["advantages"] - self.beta * per_token_kl
                loss = (-ratio * inputs["advantages"] * mask).sum() / mask.sum()
                return loss
            self.pipeline.run(criterion)
        else:
            loss = (-ratio * advantages + self.beta * per_token_kl) * mask
            loss = loss.sum() / mask.sum()
            loss.backward()
'''


def test_each_branch_is_judged_on_its_own(tmp_path):
    # the pipeline path: ratio * (advantages - beta * k3), the score-weighted k3 (KL003) on older samples
    # (KL008); the other path: a k3 loss on older samples (KL002, KL008). Unlabelled, the two shared one
    # origin and switch values, and the second path's verdict was lost to the first's.
    assert module_codes(TWO_PATHS, tmp_path) == [(11, "KL003"), (11, "KL008"), (16, "KL002"), (16, "KL008")]


def test_the_findings_name_the_side_of_the_threshold(tmp_path):
    path = tmp_path / "consumer.py"
    path.write_text(TWO_PATHS)
    messages = {f.code: f.message for f in lint_paths([str(path)]).findings}
    assert "[pp_size > 1]" in messages["KL003"] and "pp_size <= 1" in messages["KL002"]


EMPTY_BATCH_GUARD = '''
import torch


def grpo_loss(log_probs, ref_log_probs, advantages, responses, mask, beta):
    if len(responses) == 0:
        return torch.tensor(0.0)
    d = ref_log_probs - log_probs
    loss = ((-advantages * log_probs + beta * (torch.exp(d) - d - 1)) * mask).sum() / mask.sum()
    return loss
'''


def test_a_test_on_a_computed_value_names_no_switch(tmp_path):
    """`if len(responses) == 0:` (MLX-GRPO) is no setting: the k3 loss (row 3, KL002) is reported with no
    switch value, where it was labelled `[ != 0]`, a comparison with no name."""
    path = tmp_path / "loss.py"
    path.write_text(EMPTY_BATCH_GUARD)
    [finding] = lint_paths([str(path)]).findings
    assert finding.code == "KL002" and "!= 0" not in finding.message and "== 0" not in finding.message


KEY_GUARD = '''
import torch


def rewards_of(data, kl_penalty="kl", beta=0.1):
    scores = data["scores"]
    if "ref_log_prob" not in data.batch.keys():
        return scores
    log_ratio = data["old_log_probs"] - data["ref_log_prob"]
    if kl_penalty == "k3":
        kl = torch.exp(-log_ratio) - 1 + log_ratio
    else:
        kl = log_ratio
    token_level_rewards = scores - beta * kl
    return token_level_rewards
'''


@pytest.mark.parametrize("container, shown", [("data.batch.keys()", '"ref_log_prob" in data.batch.keys()'),
                                               ("data", '"ref_log_prob" in data')])
def test_a_key_membership_test_is_named_as_written(tmp_path, container, shown):
    """`if "ref_log_prob" in data.batch.keys():` (an EasyR1 copy's apply_kl_penalty) tests whether a container
    holds a key: the finding names the test, where it showed `[="ref_log_prob"]` (a switch with no name) or
    `[data="ref_log_prob"]` (as if `data` were a string equal to the key)."""
    path = tmp_path / "rewards.py"
    path.write_text(KEY_GUARD.replace("data.batch.keys()", container))
    [finding] = lint_paths([str(path)]).findings
    assert finding.code == "KL004" and f'[{shown}, kl_penalty="k3"]' in finding.message


JSD_ENDPOINTS = '''
import torch.nn.functional as F


def generalized_jsd(student_logits, teacher_logits, mask, beta):
    student = F.log_softmax(student_logits, dim=-1)
    teacher = F.log_softmax(teacher_logits, dim=-1)
    if beta == 0:
        per_position = F.kl_div(student, teacher, reduction="none", log_target=True)
        return (per_position.sum(-1) * mask).sum() / mask.sum()
    if beta == 1:
        per_position = F.kl_div(teacher, student, reduction="none", log_target=True)
        return (per_position.sum(-1) * mask).sum() / mask.sum()
    return None


class Distiller:
    def train_step(self, prompts):
        sequences, mask = self.student.generate(prompts, do_sample=True)
        student_logits = self.student(sequences).logits
        teacher_logits = self.teacher(sequences).logits.detach()
        loss = generalized_jsd(student_logits, teacher_logits, mask, self.beta)
        loss.backward()
'''


def test_an_equality_hides_the_inequality_it_implies(tmp_path):
    """Past `if beta == 0: return`, the branch `if beta == 1:` needs no `beta != 0` beside it (GKD copies
    showed `[beta != 0, beta == 1]` on 100-odd findings): the reverse KL's switch is `beta == 1` alone."""
    path = tmp_path / "jsd.py"
    path.write_text(JSD_ENDPOINTS)
    messages = [f.message for f in lint_paths([str(path)]).findings if "beta == 1" in f.message]
    assert messages and all("beta != 0" not in m for m in messages)


MEASURED_GUARDS = '''
import torch


def token_logprobs(model, input_ids):
    batch_size, sequence_length = input_ids.shape
    if sequence_length <= 1:
        return torch.zeros(batch_size, sequence_length)
    return model(input_ids).logits.log_softmax(-1)[:, :-1].gather(-1, input_ids[:, 1:, None]).squeeze(-1)


def step(model, ref_log_probs, micro_batches, beta):
    total_tokens = 0
    loss = 0.0
    for batch in micro_batches:
        log_probs = token_logprobs(model, batch["input_ids"])
        d = ref_log_probs - log_probs
        total_tokens += batch["mask"].sum()
        if total_tokens > 0:
            loss = loss + beta * ((torch.exp(d) - d - 1) * batch["mask"]).sum()
    loss.backward()
'''


def test_a_measure_of_the_data_is_no_switch(tmp_path):
    """`if sequence_length <= 1: return` after `batch_size, sequence_length = input_ids.shape` (nanorlhf) and
    `if total_tokens > 0:` on a counter (an RWKV trainer, 133 findings) compare values computed from the data:
    the k3 loss is reported without `[sequence_length > 1]` or `[total_tokens > 0]`, as if they were settings."""
    path = tmp_path / "step.py"
    path.write_text(MEASURED_GUARDS)
    findings = lint_paths([str(path)]).findings
    assert {f.code for f in findings} >= {"KL002"}
    assert all("sequence_length" not in f.message and "total_tokens" not in f.message for f in findings)


MATCHED_ESTIMATOR = '''
import torch


def kl_loss(logp, ref_logp, mask, estimator):
    match estimator:
        case "low_var_kl" | "k3":
            d = ref_logp - logp
            kl = torch.exp(d) - d - 1
        case _:
            kl = logp - ref_logp
    return (kl * mask).sum() / mask.sum()
'''


def test_a_catch_all_case_holds_the_values_no_case_above_takes(tmp_path):
    """`case _:` after `case "low_var_kl" | "k3":` runs for every other estimator: its k1 loss (row 1, KL001) is
    labelled with the values excluded, as an `else:` is, and check-grad gets a value that selects it ('other');
    before, the case was unlabelled and no switch value reached it."""
    from klaudit.lint.query import switch_values

    path = tmp_path / "loss.py"
    path.write_text(MATCHED_ESTIMATOR)
    messages = {f.code: f.message for f in lint_paths([str(path)]).findings}
    assert set(messages) == {"KL001", "KL002"}
    assert '[estimator!="low_var_kl"|"k3"]' in messages["KL001"]
    assert '[estimator="low_var_kl"|"k3"]' in messages["KL002"]
    assert switch_values(str(path), "kl_loss") == {"estimator": ["low_var_kl", "k3", "other"]}


BOTH_SETTINGS = '''
import torch


def kl_loss(log_probs, ref_log_probs, mask, estimator, mode, beta):
    delta = log_probs - ref_log_probs
    penalty = delta.mean()
    if estimator == "k2" and mode == "theta_over_ref":
        penalty = (0.5 * delta ** 2).mean()
    return beta * penalty
'''


def test_a_conjunction_of_two_settings_labels_both(tmp_path):
    """`if estimator == "k2" and mode == "theta_over_ref":` (prorl's penalty) holds both values in its body: the
    k2 loss (row 2, KL003) names them and check-grad is given the values that form it; before, the body had no
    label and neither switch reached check-grad. Where the test is false nothing can be said of either switch,
    so the k1 loss (row 1, KL001) beside it keeps no label of them."""
    from klaudit.lint.query import switch_values

    path = tmp_path / "loss.py"
    path.write_text(BOTH_SETTINGS)
    messages = {f.code: f.message for f in lint_paths([str(path)]).findings}
    assert set(messages) == {"KL001", "KL003"}
    assert '[estimator="k2", mode="theta_over_ref"]' in messages["KL003"]
    assert "estimator=" not in messages["KL001"] and "mode=" not in messages["KL001"]
    values = switch_values(str(path), "kl_loss")
    assert "k2" in values["estimator"] and "theta_over_ref" in values["mode"]


def test_a_conjunction_with_a_side_known_false_is_not_taken(tmp_path):
    """`if use_k2 and estimator == "k2":` where the function has set `use_k2 = False` never runs its body: only
    the k1 loss (row 1, KL001) is left, where both were reported; set True, the body is labelled by the other
    side only. A conditional expression reads its test the
    same way."""
    source = BOTH_SETTINGS.replace('    if estimator == "k2" and mode == "theta_over_ref":\n',
                                   '    use_k2 = False\n    if use_k2 and estimator == "k2":\n')
    assert source != BOTH_SETTINGS and module_codes(source, tmp_path) == [(11, "KL001")]
    path = tmp_path / "known_true.py"
    path.write_text(source.replace("use_k2 = False", "use_k2 = True"))
    messages = {f.code: f.message for f in lint_paths([str(path)]).findings}
    assert set(messages) == {"KL001", "KL003"} and '[estimator="k2"]' in messages["KL003"]  # the side left open
    ternary = BOTH_SETTINGS.replace(
        '    penalty = delta.mean()\n    if estimator == "k2" and mode == "theta_over_ref":\n'
        '        penalty = (0.5 * delta ** 2).mean()\n',
        '    use_k2 = False\n    penalty = (0.5 * delta ** 2).mean() if use_k2 and estimator == "k2" else delta.mean()\n')
    assert ternary != BOTH_SETTINGS and module_codes(ternary, tmp_path) == [(9, "KL001")]
