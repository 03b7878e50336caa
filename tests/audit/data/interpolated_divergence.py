"""Distillation losses that move between the forward and the reverse KL by a weight the code branches on
(a generalized Jensen-Shannon divergence): weight 0 is the forward KL(teacher || student), weight 1 the
reverse KL(student || teacher), anything between a mixture the catalog has no row for. The weight reads as
a coefficient by its name (`beta`), and the helper's inputs are log-probs over the vocabulary only at the
call, where they come out of log_softmax."""

import math

import torch
import torch.nn.functional as F


def vocabulary_divergence(student_log_probs, teacher_log_probs, alpha):
    """Per position: sum over the vocabulary of the divergence `alpha` selects."""
    if alpha == 0.0:
        per_entry = F.kl_div(student_log_probs, teacher_log_probs, reduction="none", log_target=True)
    elif alpha == 1.0:
        per_entry = F.kl_div(teacher_log_probs, student_log_probs, reduction="none", log_target=True)
    else:
        middle = torch.logsumexp(torch.stack([student_log_probs + math.log(1 - alpha),
                                              teacher_log_probs + math.log(alpha)]), dim=0)
        per_entry = alpha * F.kl_div(middle, teacher_log_probs, reduction="none", log_target=True) \
            + (1 - alpha) * F.kl_div(middle, student_log_probs, reduction="none", log_target=True)
    return per_entry.sum(-1)


def jsd_loss(student_logits, teacher_logits, mask, beta=0.5):
    """The same divergence from the logits, summed over the response: one loss per batch."""
    student = F.log_softmax(student_logits, dim=-1)
    teacher = F.log_softmax(teacher_logits, dim=-1)
    if beta == 0:
        per_entry = F.kl_div(student, teacher, reduction="none", log_target=True)
    elif beta == 1:
        per_entry = F.kl_div(teacher, student, reduction="none", log_target=True)
    else:
        middle = torch.logsumexp(torch.stack([student + math.log(1 - beta), teacher + math.log(beta)]), dim=0)
        per_entry = beta * F.kl_div(middle, teacher, reduction="none", log_target=True) \
            + (1 - beta) * F.kl_div(middle, student, reduction="none", log_target=True)
    return (per_entry.sum(-1) * mask).sum() / mask.shape[0]


class OnPolicyDistiller:
    def __init__(self, student, teacher, alpha, beta):
        self.student, self.teacher, self.alpha, self.beta = student, teacher, alpha, beta

    def divergence_step(self, prompts):
        completions, mask = self.student.generate(prompts, do_sample=True)
        student_log_probs = torch.log_softmax(self.student(completions).logits, dim=-1)
        with torch.no_grad():
            teacher_log_probs = torch.log_softmax(self.teacher(completions).logits, dim=-1)
        per_position = vocabulary_divergence(student_log_probs, teacher_log_probs, self.alpha)
        loss = (per_position * mask).sum() / mask.shape[0]
        loss.backward()

    def jsd_step(self, prompts):
        completions, mask = self.student.generate(prompts, do_sample=True)
        student_logits = self.student(completions).logits
        with torch.no_grad():
            teacher_logits = self.teacher(completions).logits
        loss = jsd_loss(student_logits, teacher_logits, mask, self.beta)
        loss.backward()
