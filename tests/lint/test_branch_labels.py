"""A threshold test (`if pp_size > 1:`) labels its two branches as a `== n` test does, and a function defined
inside a branch (a loss closure handed to a pipeline) runs under that branch's labels: the KL terms of the
two branches are judged apart, never paired (ColossalChat's pipeline and non-pipeline paths)."""

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
