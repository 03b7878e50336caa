"""A KL coefficient that reaches the loss through a chain of calls, every link of which gives it 0.

Shape of wtergan/my-grpo (seventy-fourth fresh set): train.py imports the loss module under an alias
(`import grpo_core as gc`) and calls `gc.grpo_step(..., kl_beta=train_cfg.get("kl_beta", 0.0))` with the only YAML
configuration giving `training.kl_beta: 0.0`; grpo_step hands its own `kl_beta` on to the loss helper, which adds
`kl_beta * k3` of the live log-probabilities. No run trains that term, so nothing is reported. Where the
configuration sets the coefficient above 0, the k3 term is a loss again (kl-math.md row 3, KL002).
"""

from __future__ import annotations

LOSS_MODULE = """\
import torch


def token_loss(logp, old_logp, ref_logp, advantages, mask, kl_beta: float = 0.0):
    ratio = torch.exp(logp - old_logp)
    surrogate = ratio * advantages.unsqueeze(-1)
    if kl_beta == 0.0:
        return -(surrogate * mask).sum() / mask.sum()
    delta = ref_logp - logp
    kl = torch.exp(delta) - delta - 1
    per_token = surrogate - kl_beta * kl * mask
    return -(per_token * mask).sum() / mask.sum()


def train_step(policy, batch, kl_beta: float = 0.0):
    logp = policy(batch.ids)
    return token_loss(logp, logp.detach(), batch.ref_logp, batch.advantages, batch.mask, kl_beta=kl_beta)
"""

TRAIN_SCRIPT = """\
import yaml

import loss_core as lc


def main(train_cfg, policy, batches, optimizer):
    for batch in batches:
        loss = lc.train_step(policy, batch, kl_beta=train_cfg.get("kl_beta", 0.0))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()


if __name__ == "__main__":
    config = yaml.safe_load(open("config.yaml"))
    main(config["training"], None, [], None)
"""


def _findings(tmp_path, config: str, script: str = TRAIN_SCRIPT):
    from klaudit.config import Settings
    from klaudit.lint.engine import lint_paths

    (tmp_path / "loss_core.py").write_text(LOSS_MODULE)
    (tmp_path / "train.py").write_text(script)
    (tmp_path / "config.yaml").write_text(config)
    found = lint_paths([str(tmp_path)], settings=Settings(root=tmp_path), jobs=1).findings
    return {(f.path.replace(str(tmp_path) + "/", ""), f.code) for f in found}


def test_a_coefficient_every_link_of_the_call_chain_gives_zero_trains_nothing(tmp_path):
    assert _findings(tmp_path, "training:\n  kl_beta: 0.0\n  lr: 1.0e-6\n") == set()


def test_the_same_chain_with_a_configured_coefficient_trains_k3_as_a_loss(tmp_path):
    assert ("loss_core.py", "KL002") in _findings(tmp_path, "training:\n  kl_beta: 0.04\n  lr: 1.0e-6\n")


def test_a_caller_that_hands_on_another_value_pins_nothing(tmp_path):
    script = TRAIN_SCRIPT.replace('train_cfg.get("kl_beta", 0.0)', "train_cfg.beta")
    assert ("loss_core.py", "KL002") in _findings(tmp_path, "training:\n  kl_beta: 0.0\n", script)


def test_a_module_aliased_call_with_no_value_for_the_coefficient_leaves_its_zero_default(tmp_path):
    script = TRAIN_SCRIPT.replace(', kl_beta=train_cfg.get("kl_beta", 0.0)', "")
    assert _findings(tmp_path, "training:\n  lr: 1.0e-6\n", script) == set()


UNIT_TEST = """\
import loss_core


def test_the_kl_branch_on_a_dummy_model(dummy):
    with_kl = loss_core.train_step(dummy.policy, dummy.batch, kl_beta=0.5)
    without = loss_core.train_step(dummy.policy, dummy.batch, kl_beta=0.0)
    assert with_kl > without
"""


def test_a_unit_tests_made_up_coefficient_is_not_a_run(tmp_path):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_loss.py").write_text(UNIT_TEST)
    assert _findings(tmp_path, "training:\n  kl_beta: 0.0\n") == set()
    # the same call in a training script is a run that trains the term
    (tmp_path / "tests" / "test_loss.py").write_text(UNIT_TEST.replace("def test_the", "def run_the"))
    assert ("loss_core.py", "KL002") in _findings(tmp_path, "training:\n  kl_beta: 0.0\n")
