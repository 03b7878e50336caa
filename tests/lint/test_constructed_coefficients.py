"""A trainer's KL coefficient copied from its constructor's argument (`self.beta = args.beta`) holds what the code
that builds the trainer passes. git-disl/Rebellion (fifty-second set) vendors a GRPO trainer whose k3 loss is
weighted by `self.beta = args.beta`, and its only launch builds `GRPOConfig(..., beta=0)` and hands it over: the
KL term never acts, yet KL002 and KL007 were reported. Each case below changes one thing the pinning needs, and
the findings come back."""

from __future__ import annotations

import pytest

from klaudit.lint.engine import lint_paths

TRAINER = """\
import torch


class KLTrainer:
    def __init__(self, model, ref_model, args=None, beta=0.04):
        if args is None:
            args = make_default_config()
        self.model = model
        self.ref_model = ref_model
        self.beta = {source}

    def compute_loss(self, input_ids, mask, advantages):
        logits = self.model(input_ids).logits
        logps = torch.log_softmax(logits, -1).gather(-1, input_ids[..., None]).squeeze(-1)
        with torch.inference_mode():
            ref_logits = self.ref_model(input_ids).logits
            ref = torch.log_softmax(ref_logits, -1).gather(-1, input_ids[..., None]).squeeze(-1)
        per_token_kl = torch.exp(ref - logps) - (ref - logps) - 1
        per_token_loss = -torch.exp(logps - logps.detach()) * advantages[:, None]
        per_token_loss = per_token_loss + self.beta * per_token_kl
        return ((per_token_loss * mask).sum(1) / mask.sum(1)).mean()
"""

LAUNCH = """\
from trl import GRPOConfig

from trainer import KLTrainer


def main(data):
    training_args = GRPOConfig(output_dir="out", num_generations=8, {keyword})
{after}    trainer = KLTrainer(data.model, data.ref_model, {passed})
    trainer.train()


if __name__ == "__main__":
    main(load())
"""


def _codes(tmp_path, source="args.beta", keyword="beta=0", passed="args=training_args", after="", extra=None):
    (tmp_path / "trainer.py").write_text(TRAINER.format(source=source))
    (tmp_path / "train.py").write_text(LAUNCH.format(keyword=keyword, passed=passed, after=after))
    for name, text in (extra or {}).items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    result = lint_paths([str(tmp_path)], jobs=1)
    assert result.errors == []
    return sorted({finding.code for finding in result.findings})


@pytest.mark.parametrize(("source", "passed"), [
    ("args.beta", "args=training_args"),
    ("args.beta", "training_args"),
    ("args.beta", "args=GRPOConfig(output_dir='x', beta=0.0)"),
    ("beta", "args=training_args, beta=0"),
])
def test_a_coefficient_every_construction_sets_to_zero_switches_the_kl_term_off(tmp_path, source, passed):
    assert _codes(tmp_path, source=source, passed=passed) == []


@pytest.mark.parametrize(("changed", "why"), [
    ({"keyword": "beta=0.04"}, "a weight that is not zero"),
    ({"keyword": "max_steps=10"}, "the framework's default, which the text does not spell"),
    ({"after": "    training_args.beta = 0.1\n"}, "the config changed after it is built"),
    ({"passed": "**kwargs"}, "a splat"),
    ({"source": "beta"}, "the parameter's default, 0.04"),
    ({"extra": {"sweep.py": "from trainer import KLTrainer\n\n\ndef run(m, r, cfg):\n"
                            "    return KLTrainer(m, r, args=cfg)\n"}}, "a second construction with a config it does not spell"),
    ({"extra": {"experiments/sweeps/large/run.py": "from trl import GRPOConfig\nfrom trainer import KLTrainer\n\n\n"
                "def run(m, r):\n    return KLTrainer(m, r, args=GRPOConfig(output_dir='x', beta=0.1))\n"}},
     "a construction in a folder far from the trainer's, with another coefficient"),
    ({"extra": {"sub.py": "from trainer import KLTrainer\n\n\nclass Sub(KLTrainer):\n    pass\n"}}, "a derived class"),
    ({"extra": {"reg.py": "from trainer import KLTrainer\n\nTRAINERS = {'kl': KLTrainer}\n"}}, "the class handed on"),
])
def test_the_kl_term_is_judged_where_a_construction_leaves_the_coefficient_open(tmp_path, changed, why):
    assert _codes(tmp_path, **changed) == ["KL002", "KL007"], why


def test_a_framework_trainer_of_the_same_name_is_not_a_construction_of_the_projects(tmp_path):
    other = "from trl import GRPOConfig, KLTrainer\n\n\ndef run(m, r):\n" \
            "    return KLTrainer(m, r, args=GRPOConfig(output_dir='x', beta=0.1))\n"
    assert "KL002" not in _codes(tmp_path, extra={"other.py": other})  # TRL's own trainer is judged at its flags


# ViviqwerAsd/HINT (seventy-fourth fresh set): the trainer's class default is beta=0.04, but its one construction,
# in the entry script, passes `beta=args.beta` from a sub-parser whose `--beta` defaults to 0.0, and no launch sets
# it: every run trains with the KL weight 0. A `--beta` default of 0.04, or a launch that passes `--beta 0.04`,
# brings the k3-as-a-loss finding back.
OPTION_LAUNCH = """\
import argparse

from trainer import KLTrainer


def run(args, data):
    trainer = KLTrainer(data.model, data.ref_model, beta=args.beta)
    trainer.train()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command")
    train = sub.add_parser("train")
    train.add_argument("--beta", type=float, default={default})
    run(parser.parse_args(), None)
"""


@pytest.mark.parametrize(("default", "launch", "expected"), [
    ("0.0", None, []),
    ("0.04", None, ["KL002", "KL007"]),
    ("0.0", "python train.py train --beta 0.04\n", ["KL002", "KL007"]),
])
def test_a_constructor_argument_read_from_an_option_holds_the_options_value(tmp_path, default, launch, expected):
    extra = {"train.py": OPTION_LAUNCH.format(default=default), **({"run.sh": launch} if launch else {})}
    assert _codes(tmp_path, source="beta", extra=extra) == expected
