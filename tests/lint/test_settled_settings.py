"""A count the trainer's settings class leaves at 1 settles both its loop and its tests.

A GRPO trainer in the style of many tutorials keeps its settings as plain class attributes (`num_iterations = 1`),
runs `for _ in range(self.args.num_iterations)` over each batch of rollouts, and forms its PPO ratio against
`old = inputs["old_logps"] if self.args.num_iterations > 1 else logps.detach()`. With the count at 1 the loop is one
round and the ratio's old log-probs are the live ones detached: every step is the first on its samples, so a k3 loss
there is on-policy (row 3 of kl-math.md section 8: KL002, not KL008). Set to 2 (in the class or in a linted YAML
file) the same code takes a second step on the same rollouts, which is row 23 (KL008).
"""

from __future__ import annotations

import pytest
from snippets import module_codes

TRAINER = """\
import torch


class Settings:
    beta = 0.04
    num_iterations = 1
    lr = 1e-6


class Trainer:
    def __init__(self, model, ref, args):
        self.model, self.ref, self.args = model, ref, args
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)

    def logps(self, model, ids):
        return model(ids).logits.log_softmax(-1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)

    def loss(self, inputs):
        logps = self.logps(self.model, inputs["ids"])
        old = inputs["old_logps"] if self.args.num_iterations > 1 else logps.detach()
        ratio = torch.exp(logps - old)
        delta = inputs["ref_logps"] - logps
        kl = torch.exp(delta) - delta - 1
        per_token = -(ratio * inputs["advantages"].unsqueeze(1) - self.args.beta * kl)
        return (per_token * inputs["mask"]).sum() / inputs["mask"].sum()

    def train(self, loader):
        for batch in loader:
            ids = self.model.generate(batch["prompt_ids"], do_sample=True)
            with torch.no_grad():
                inputs = {"ids": ids, "old_logps": self.logps(self.model, ids),
                          "ref_logps": self.logps(self.ref, ids), "advantages": batch["advantages"],
                          "mask": batch["mask"]}
            for _ in range(self.args.num_iterations):
                loss = self.loss(inputs)
                loss.backward()
                self.optimizer.step()
                self.optimizer.zero_grad()


if __name__ == "__main__":
    Trainer(None, None, Settings()).train([])
"""


@pytest.mark.parametrize("count, codes", [
    (1, [(25, "KL002")]),  # one round, a ratio of 1: on-policy
    (2, [(25, "KL002"), (25, "KL008")]),  # the second step trains on the first step's samples
])
def test_a_class_attribute_count_settles_the_loop_and_the_ratio(tmp_path, count, codes):
    source = TRAINER.replace("num_iterations = 1", f"num_iterations = {count}")
    assert module_codes(source, tmp_path) == codes


@pytest.mark.parametrize("configured, codes", [("4", ["KL002", "KL008"]), ("1", ["KL002"])])
def test_a_yaml_file_that_sets_more_rounds_unsettles_the_count(tmp_path, configured, codes):
    from klaudit.config import Settings
    from klaudit.lint.engine import lint_paths

    (tmp_path / "grpo.py").write_text(TRAINER)
    (tmp_path / "grpo.yaml").write_text(f"num_iterations: {configured}\nbeta: 0.04\n")
    found = lint_paths([str(tmp_path)], settings=Settings(root=tmp_path), jobs=1).findings
    assert [(f.line, f.code) for f in found] == [(25, code) for code in codes]


def test_a_threshold_label_holds_or_not_at_a_value():
    from klaudit.lint.conditions import threshold_holds, threshold_setting

    assert threshold_setting("num_iterations > 1") == "num_iterations"
    assert threshold_setting("kl_type") is None
    assert threshold_holds(("num_iterations > 1", (True,)), 1) is False
    assert threshold_holds(("num_iterations > 1", (False,)), 1) is True
    assert threshold_holds(("num_iterations > 1", (True,)), 3) is True
    assert threshold_holds(("beta == 0", (False,)), 0.04) is True
    assert threshold_holds(("ppo_epochs <= 2", (True,)), 2) is True
    assert threshold_holds(("kl_type", ("k3",)), 1) is None


@pytest.mark.parametrize("given, codes", [
    ("cfg.train.mu", ["KL002", "KL008"]),  # computed (eth-lre/PedagogicalRL: `mu: 2` in its YAML): may be more
    ("1", ["KL002"]),  # the default again: still one round
])
def test_a_launch_that_passes_the_count_by_keyword_unsettles_it(tmp_path, given, codes):
    from klaudit.config import Settings
    from klaudit.lint.engine import lint_paths

    fields = "@dataclass\nclass Settings:\n    beta: float = 0.04\n    num_iterations: int = 1\n    lr: float = 1e-6\n"
    trainer = "from dataclasses import dataclass\n" + TRAINER.replace(
        "class Settings:\n    beta = 0.04\n    num_iterations = 1\n    lr = 1e-6\n", fields)
    (tmp_path / "grpo.py").write_text(trainer)
    (tmp_path / "train.py").write_text(
        "from grpo import Settings, Trainer\n\n\ndef main(cfg, model, ref, loader):\n"
        f"    Trainer(model, ref, Settings(num_iterations={given})).train(loader)\n")
    found = lint_paths([str(tmp_path)], settings=Settings(root=tmp_path), jobs=1).findings
    assert [(f.path.rsplit("/", 1)[-1], f.line, f.code) for f in found] == [("grpo.py", 27, code) for code in codes]


@pytest.mark.parametrize("text, passed", [
    ("Config(beta=0.04, num_iterations=cfg.train.mu)", True),  # computed, and no option or YAML key to read it from
    ("settings.Config(\n    num_iterations = 2,\n)", True),
    ("Config(num_iterations=1)", False),
    ("Other(num_iterations=3)", False),  # another class's field of the same name
    ("self.num_iterations = args.num_iterations", False),  # an assignment, not a keyword
    ("def f(n=4):\n    return Config(num_iterations=n)", True),  # a parameter handed on, with its default
    ("def f(n=1):\n    return Config(num_iterations=n)", False),
    ("def f(n):\n    return Config(num_iterations=n)", True),  # no default: its callers' value, unknown here
    ("Config(num_iterations=", False),  # a module Python rejects passes nothing
])
def test_a_field_passed_by_keyword(text, passed):
    from klaudit.lint.passed_settings import passes_field

    assert passes_field(text, "num_iterations", {"Config"}) is passed


def test_an_option_read_with_a_default_of_one_leaves_the_count_settled():
    # pmukeshreddy/distributed-reasoning-loop: `num_epochs=args.epochs` of `--epochs` (default 1)
    from klaudit.frameworks.options import option_defaults
    from klaudit.lint.passed_settings import passes_field

    script = ('import argparse\nparser = argparse.ArgumentParser()\nparser.add_argument("--epochs", type=int, '
              'default={default})\nargs = parser.parse_args()\nConfig(num_epochs=args.epochs)\n')
    for default, passed in (("1", False), ("3", True)):
        text = script.format(default=default)
        assert passes_field(text, "num_epochs", {"Config"}, option_defaults({"train.py": text}), "train.py") is passed
