"""Shapes of KL code met in the ninety-fifth fresh set.

homzer/Q-RM's rollout buffer holds the policy's and the reference's log-probs of each sampled token as its own
attributes and subtracts `kl_coef * np.abs(self.action_logprobs - self.ref_action_logprobs)` from the token rewards
(|log-ratio| in the reward, row 9: KL004). `self.x` was read only as a setting the class fixes once, so the
log-probs an object holds were no log-probs at all and the reward was silent.
"""

from __future__ import annotations

import pytest
from snippets import module_codes

BUFFER = """\
import numpy as np


class RolloutBuffer:
    def __init__(self, kl_coef):
        self.kl_coef = kl_coef

    def finish(self):
        self.rewards += - self.kl_coef * self.compute_kl_penalty()

    def compute_kl_penalty(self):
        return {penalty}
"""


@pytest.mark.parametrize("penalty, codes", [
    ("np.abs(self.action_logprobs - self.ref_action_logprobs)", [(9, "KL004")]),  # |log-ratio|: row 9
    ("self.action_logprobs - self.ref_action_logprobs", []),  # k1 in the reward: unbiased
    ("np.abs(self.config.logprobs - self.config.ref_logprobs)", []),  # a nested object's fields are not read so
])
def test_the_log_probs_an_object_holds_are_read_by_their_names(tmp_path, penalty, codes):
    assert module_codes(BUFFER.format(penalty=penalty), tmp_path) == codes
