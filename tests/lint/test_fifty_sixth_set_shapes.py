"""Shapes of code met in the fifty-sixth blind set that the lint misread.

- almeidava93/grpo-explained's mini_grpo.py counts its PPO passes by a constant at the top of the script
  (`mu_iterations = 1`): a count the lint could not read was taken for several rounds, so its one step per fresh
  group, whose ratio to the just-copied old policy is 1, was read as training an older policy's samples (a false
  KL008).
"""

from __future__ import annotations

import pytest

from klaudit.lint.engine import lint_paths

SCRIPT = """\
import copy

import torch

mu_iterations = {passes}
beta = 0.05


def logps(model, ids):
    return torch.log_softmax(model(ids).logits, -1).gather(-1, ids[..., None]).squeeze(-1)


for step in range(50):
    old_model = copy.deepcopy(model)
    ids = old_model.generate(prompt)
    advantages = score(ids)
    for mu in range(mu_iterations):
        new_logps = logps(model, ids)
        with torch.no_grad():
            old_logps = logps(old_model, ids)
            ref_logps = logps(ref_model, ids)
        ratio = torch.exp(new_logps - old_logps)
        kl = torch.exp(ref_logps - new_logps) - (ref_logps - new_logps) - 1
        loss = (-ratio * advantages + beta * kl).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
"""


@pytest.mark.parametrize("passes, rebound, stale", [
    (1, "", False),  # one pass per fresh group: the ratio to the copy just made is 1 (row 3 only)
    (2, "", True),  # the second pass trains the same samples on a policy one step older (row 22)
    (1, "mu_iterations = int(sys.argv[1])\n", True),  # bound twice: the count is not the literal
])
def test_a_pass_count_a_script_binds_once_at_its_top_is_that_number(tmp_path, passes, rebound, stale):
    (tmp_path / "mini_grpo.py").write_text(SCRIPT.format(passes=passes).replace("beta = 0.05\n", "beta = 0.05\n"
                                                                                 + rebound))
    codes = {finding.code for finding in lint_paths([str(tmp_path)], jobs=1).findings}
    assert "KL002" in codes
    assert ("KL008" in codes) is stale
