"""Shapes of code met in the fifty-seventh blind set that the lint misread.

- deepakvijaykee/minilab scores a sequence longer than the model's context position by position: for each `pos` it
  runs the model on the window ending there and writes the log-prob of its last logits into `token_logp[active,
  pos]`. Read as the last token's alone, the k1 reward made of them looked like a KL at the final token only (three
  false KL005); the loop writes every position in turn.
- The same trainer adds the task score at the last token with `shaped[b, last] = shaped[b, last] + rewards[b]`; the
  place read back on the right was taken for a second, last-token KL term (`+=` was already read right).
"""

from __future__ import annotations

import pytest

from klaudit.lint.engine import lint_paths

PPO_ROLLOUT = """\
import torch
import torch.nn.functional as F


def token_logp(model, ids, labels):
    out = torch.zeros(labels.shape)
    for {index} in range(ids.size(1)):
        logits = model(ids[:, : {index} + 1])
        out[:, {index}] = F.log_softmax(logits[:, -1], dim=-1).gather(-1, labels[:, {index}, None]).squeeze(-1)
    return out


def train(policy, ref_model, optimizer, ids, labels, mask, scores, kl_coef):
    with torch.no_grad():
        old_logp = token_logp(policy, ids, labels)
        ref_logp = token_logp(ref_model, ids, labels)
    shaped = -kl_coef * (old_logp - ref_logp) * mask
{score}
    returns = shaped.flip(-1).cumsum(-1).flip(-1)
    logp = token_logp(policy, ids, labels)
    loss = -(logp * returns * mask).sum()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""

SCORE_ADDED = "    shaped[:, -1] = shaped[:, -1] + scores"


@pytest.mark.parametrize("index, score, expected", [
    ("pos", SCORE_ADDED, []),  # k1 at every token with reward-to-go, on-policy: row 6, right
    ("pos", "    shaped[:, -1] += scores", []),
    ("pos", "    for b in range(ids.size(0)):\n        shaped[b, -1] = shaped[b, -1] + scores[b]", []),
    ("t", SCORE_ADDED, []),  # a loop variable spelled as a position
    # the KL kept at the last token alone: a KL reward at the final token (KL005)
    ("pos", "    shaped = torch.zeros_like(shaped)\n    shaped[:, -1] = -kl_coef * (old_logp - ref_logp)[:, -1] + scores",
     [(20, "KL005")]),
])
def test_a_log_prob_written_position_by_position_is_every_tokens(tmp_path, index, score, expected):
    (tmp_path / "ppo.py").write_text(PPO_ROLLOUT.format(index=index, score=score))
    found = [(finding.line, finding.code) for finding in lint_paths([str(tmp_path)], jobs=1).findings]
    assert found == expected
