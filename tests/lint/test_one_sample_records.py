"""A loop over the records of single samples (`for traj in trajectories:`) reads one sequence from each key:
a mean over it is that sequence's token mean, a 1/L weight when lengths vary (kl-math.md section 8, row 21,
KL007). A batch's record (`for batch in loader:`) holds every sequence's rows: its mean is a token-mean over the
batch."""

from __future__ import annotations

from snippets import module_codes

from klaudit.lint.roles import names_one_sample

TRAINER = """\
import torch


class Distiller:
    def train(self, {records}):
        for {record} in {records}:
            teacher_lp = torch.tensor({record}["teacher_logprobs"])
            student_lp = self.student_logprobs({record}["prompt"], {record}["text"])
            rewards = -(student_lp - teacher_lp)
            loss = -(rewards.detach() * student_lp).mean()
            loss.backward()
        self.optimizer.step()
"""


def test_a_mean_over_one_samples_record_is_its_token_mean(tmp_path):
    codes = module_codes(TRAINER.format(records="trajectories", record="traj"), tmp_path)
    assert (9, "KL007") in codes


def test_a_mean_over_a_batch_record_is_no_per_sequence_mean(tmp_path):
    codes = module_codes(TRAINER.format(records="loader", record="batch"), tmp_path)
    assert codes and all(code != "KL007" for _, code in codes)


def test_names_of_one_sample():
    assert all(names_one_sample(name) for name in ("traj", "sample", "episode", "example_1", "completion"))
    assert not any(names_one_sample(name) for name in ("batch", "samples", "mb", "experience", "trajs"))
