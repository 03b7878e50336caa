"""An exact KL over the vocabulary as a loss at the labelled positions of a module that samples nothing is a
distillation objective on teacher-forced data, whose use the lint cannot decide (KL100), not a KL003; so is any KL
estimate over a preference dataset's chosen and rejected responses, save a clamp (KL010)."""

import libcst as cst
import pytest

from klaudit.lint.teacher_forcing import masks_by_labels, samples_nowhere
from tests.lint.snippets import module_codes

LOSS = '''
import torch.nn.functional as F


def reverse_kl_loss(student_logits, teacher_logits, labels):
    student_log_probs = F.log_softmax(student_logits, dim=-1)
    teacher_log_probs = F.log_softmax(teacher_logits, dim=-1)
    per_position = (student_log_probs.exp() * (student_log_probs - teacher_log_probs)).sum(-1)
    keep = (labels != -100).float()
    return (per_position * keep).sum() / keep.sum()
'''

ON_POLICY_TRAINER = LOSS + '''

class OnPolicyDistiller:
    def step(self, prompts):
        sequences = self.student.generate(prompts)
        return sequences
'''

MASK_PASSED_IN = LOSS.replace("labels", "mask").replace("(mask != -100).float()", "mask")


def test_labelled_positions_in_a_module_that_samples_nothing_are_undetermined(tmp_path):
    assert module_codes(LOSS, tmp_path) == [(8, "KL100")]


def test_the_same_loss_beside_generation_is_an_on_policy_kl003(tmp_path):
    assert module_codes(ON_POLICY_TRAINER, tmp_path) == [(10, "KL003")]


def test_a_mask_not_read_off_labels_keeps_kl003(tmp_path):
    assert module_codes(MASK_PASSED_IN, tmp_path) == [(10, "KL003")]


def _function(source: str) -> cst.FunctionDef:
    statement = cst.parse_module(source).body[0]
    assert isinstance(statement, cst.FunctionDef)
    return statement


def test_masks_by_labels_reads_equality_tests_of_labels_or_against_an_ignore_index():
    assert masks_by_labels(_function("def f(labels):\n    return labels[:, 1:] == -100\n"))
    assert masks_by_labels(_function("def f(batch):\n    return batch.shift_labels != self.ignore_index\n"))
    assert masks_by_labels(_function("def f(target):\n    return target != ignore_index\n"))
    assert masks_by_labels(_function("def f(y):\n    return y == -100\n"))
    assert not masks_by_labels(_function("def f(labels):\n    return labels > 0\n"))
    assert not masks_by_labels(_function("def f(ids, pad):\n    return ids != pad\n"))


def test_samples_nowhere_reads_names_not_prose():
    assert samples_nowhere('"""Never on the student\'s own samples or rollouts."""\nloss = 1  # completions\n')
    assert not samples_nowhere("out = model.generate(prompts)\n")
    assert not samples_nowhere("def f(completion_mask):\n    pass\n")
    assert not samples_nowhere("def broken(:\n")


CALLER_COMBINES = '''
import torch.nn.functional as F


def reverse_kl_loss(student_logits, teacher_logits, labels):
    student_log_probs = F.log_softmax(student_logits, dim=-1)
    teacher_log_probs = F.log_softmax(teacher_logits, dim=-1)
    per_position = F.kl_div(teacher_log_probs, student_log_probs, reduction="none", log_target=True).sum(-1)
    keep = (labels != -100).float()
    return (per_position * keep).sum() / keep.sum()


class Distiller:
    def compute_loss(self, batch):
        out = self.student(batch["input_ids"], labels=batch["labels"])
        teacher_logits = self.teacher(batch["input_ids"]).logits.detach()
        loss = 0.5 * out.loss + 0.5 * reverse_kl_loss(out.logits, teacher_logits, batch["labels"])
        return loss
'''


def test_a_term_formed_at_labelled_positions_stays_undetermined_where_a_caller_adds_it(tmp_path):
    """The caller that adds the distillation term to the task loss reads no labels itself: the function that
    formed the term does, and the module samples nothing, so no KL003 is reported at the caller; beside generation
    the same code is the on-policy KL003."""
    assert module_codes(CALLER_COMBINES, tmp_path) == [(8, "KL100")]
    sampled = CALLER_COMBINES + "\n    def rollout(self, prompts):\n        return self.student.generate(prompts)\n"
    assert module_codes(sampled, tmp_path) == [(10, "KL003")]


FORWARD_ON_SAMPLES = '''
import torch.nn.functional as F


class Trainer:
    def rollout(self, prompts):
        return self.policy.generate(prompts)

    def loss(self, logits, {other}_logits, mask, pg_loss{rewards}):
        s_logp = F.log_softmax(logits, dim=-1)
        t_logp = F.log_softmax({other}_logits, dim=-1)
        per_token = (t_logp.exp() * (t_logp - s_logp)).sum(-1)
        return pg_loss + (per_token * mask).sum() / mask.sum()
'''


def test_the_forward_kl_to_a_teacher_is_distillation_and_to_the_reference_is_kl002(tmp_path):
    """Both are the exact forward KL on the policy's own samples; toward a teacher it is forward-KL distillation, an
    objective of its own (GKD's beta = 0), told by the names where it is formed even when an abbreviation (`t_logp`)
    reads as the reference's; toward the reference it is row 3b's per-token forward KL where the loss trains on
    rewards, and undetermined in a loss that names none (an SFT anchor, a Fisher estimate)."""
    teacher = FORWARD_ON_SAMPLES.format(other="teacher", rewards=", advantages")
    assert [code for _, code in module_codes(teacher, tmp_path)] == ["KL100"]
    assert module_codes(FORWARD_ON_SAMPLES.format(other="ref", rewards=", advantages"), tmp_path) == [(13, "KL002")]
    assert [code for _, code in module_codes(FORWARD_ON_SAMPLES.format(other="ref", rewards=""), tmp_path)] == ["KL100"]


PREFERENCE_LOSS = '''
import torch


def pair_loss(model, ref_model, inputs, beta):
    ids, rejected_ids, mask = inputs["chosen_input_ids"], inputs["rejected_input_ids"], inputs["mask"]
    logp = model(ids).logits.log_softmax(-1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    rejected = model(rejected_ids).logits.log_softmax(-1).gather(-1, rejected_ids.unsqueeze(-1)).squeeze(-1)
    with torch.no_grad():
        ref_logp = ref_model(ids).logits.log_softmax(-1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    log_ratio = LOG_RATIO
    kl = (0.5 * log_ratio ** 2 * mask).sum(-1) / mask.sum(-1)
    loss = -(logp.sum(-1) - rejected.sum(-1)).mean() + beta * kl.mean()
    loss.backward()
'''


@pytest.mark.parametrize("log_ratio, codes", [
    ("logp - ref_logp", [(12, "KL100")]),  # no verdict about samples holds on the data's fixed sequences
    ("torch.clamp(logp - ref_logp, -3.0, 3.0)", [(13, "KL010")]),  # a clamp flattens the data's term too
])
def test_a_kl_on_a_preference_datasets_pairs_keeps_only_the_clamp(tmp_path, log_ratio, codes):
    """zmisource/RLHF_code (fresh70) fits a k2 of the chosen and rejected responses of a preference set, per
    sequence token-mean: its KL003/KL007 spoke of samples it never draws; its clamp was rightly KL010."""
    assert module_codes(PREFERENCE_LOSS.replace("LOG_RATIO", log_ratio), tmp_path) == codes


def test_the_same_pairs_generated_by_the_module_keep_their_verdicts(tmp_path):
    """Online preference training samples its pairs: `model.generate` in the module makes them the policy's own."""
    source = PREFERENCE_LOSS.replace("LOG_RATIO", "logp - ref_logp") + (
        "\n\ndef make_pairs(model, prompts):\n    return model.generate(prompts)\n")
    assert {code for _, code in module_codes(source, tmp_path)} == {"KL003", "KL007"}


def test_the_clamp_on_a_preference_datasets_pairs_says_where_it_is(tmp_path):
    """The configuration a finding names is the data's, not the policy's samples (no "on-policy")."""
    from klaudit.lint.engine import lint_paths

    (tmp_path / "pairs.py").write_text(PREFERENCE_LOSS.replace("LOG_RATIO", "torch.clamp(logp - ref_logp, -3.0, 3.0)"))
    [finding] = lint_paths([str(tmp_path / "pairs.py")], jobs=1).findings
    assert finding.code == "KL010"
    assert "on a preference dataset's sequences" in finding.message and "on-policy" not in finding.message
