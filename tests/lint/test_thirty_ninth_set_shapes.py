"""Shapes of the thirty-ninth blind set that the lint misread."""

from __future__ import annotations

import pytest
from snippets import module_codes

EPOCHS_OPTION = """\
import argparse

import torch


def train(policy, ref_model, optimizer, prompts, args):
    for step in range(args.num_steps):
        ids, old_logp = policy.generate(prompts)
        with torch.no_grad():
            ref_logp = ref_model(ids)
        for ppo_epoch in range(args.num_ppo_epochs):
            logp = policy(ids)
            ratio = torch.exp(logp - old_logp)
            kl = torch.exp(ref_logp - logp) - (ref_logp - logp) - 1
            loss = (-ratio * args.advantages + 0.04 * kl).mean()
            loss.backward()
            optimizer.step()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--num-ppo-epochs", type=int, default=DEFAULT)
    train(None, None, None, None, parser.parse_args())
"""


@pytest.mark.parametrize("default, codes", [
    ("1", [(15, "KL002")]),  # one round per rollout: the ratio is 1, on-policy (row 3)
    ("2", [(15, "KL002"), (15, "KL008")]),  # the second round trains on the first's policy (row 22)
    ("args.epochs", [(15, "KL002"), (15, "KL008")]),  # a default that is no literal: not known to be one round
])
def test_an_update_loop_counted_by_an_option_that_defaults_to_one_is_one_round(tmp_path, default, codes):
    """konnase/light-grpo runs `for ppo_epoch in range(args.num_ppo_epochs)` with `--num_ppo_epochs` defaulting to 1
    in its argparse and set by no launch: a count read from a setting the module defaults to 1 is one round, as a
    dataclass field's or a constructor's default already was; the command line's default was not read."""
    source = EPOCHS_OPTION.replace("DEFAULT", default)
    assert module_codes(source, tmp_path) == codes
