"""Shapes of KL code met in the ninth review (the eighth fresh set: MindSpeed-RL, ...).

Verdicts (kl-math.md section 8): k2, |log-ratio| or clamped k3 values in a reward are no KL reward
(rows 7-9, KL004); the k1 value there is row 6, correct.
"""

from __future__ import annotations

import pytest
from snippets import module_codes

# MindSpeed-RL's apply_kl_penalty (a Ray task): the token rewards with the KL subtracted, put back into
# the data queue through helpers the analysis does not see
REWARD_SENT_ON_OUT_OF_SIGHT = """\
    import torch


    def kl_penalty(logprob, ref_logprob, kind="kl"):
        if kind == "kl":
            return logprob - ref_logprob
        if kind == "mse":
            return 0.5 * (logprob - ref_logprob).square()
        raise NotImplementedError


    def apply_kl_penalty(dock, kl_ctrl, penalty="kl"):
        batch = dock.get_experience()
        kld = kl_penalty(batch["old_log_prob"], batch["ref_log_prob"], kind=penalty)
        token_level_rewards = batch["scores"] - kl_ctrl.value * kld
        {send}
"""


@pytest.mark.parametrize("send", [
    'dock.put_experience.remote(data_dict={"token_level_rewards": token_level_rewards})',
    'dock.put_experience(token_level_rewards)',
    'return truncate_rows(token_level_rewards, batch["response_length"])',
])
def test_a_reward_handed_to_code_out_of_sight_is_used_as_one(tmp_path, send):
    assert module_codes(REWARD_SENT_ON_OUT_OF_SIGHT.format(send=send), tmp_path) == [(15, "KL004")]


def test_a_reward_handed_to_a_logger_is_not_one(tmp_path):
    source = REWARD_SENT_ON_OUT_OF_SIGHT.format(send='logger.log({"rewards": token_level_rewards})')
    assert module_codes(source, tmp_path) == []
