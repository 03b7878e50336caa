"""`klaudit.watch.patch` and KLAUDIT_WATCH on the real KL functions of the released verl 0.9.1 and OpenRLHF 0.11.2.

The packages do not import here without their GPU dependencies (ray, deepspeed, flash_attn, vllm ...), so
their modules are imported with those stubbed (klaudit.audit.stubs, as check-grad does), in a child
process: it starts with KLAUDIT_WATCH set and klaudit-watch.pth processed, imports the framework modules
afterwards (the patches land on import), calls each site as the framework does, and the test reads the
JSON-lines log.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from klaudit.watch import Reporter, patch, unpatch  # noqa: E402
from klaudit.watch.environment import settings  # noqa: E402
from klaudit.watch.patches import FRAMEWORKS  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def trees(released_trees) -> dict[str, Path]:
    return {"verl": released_trees["verl"],
            "openrlhf": released_trees["openrlhf"] / "openrlhf-0.11.2.data" / "purelib"}


CHILD = textwrap.dedent("""
    import importlib, json, site, sys, types
    site.addsitedir(sys.argv[1])  # processes klaudit-watch.pth: KLAUDIT_WATCH patches what it names
    sys.path[:0] = sys.argv[2:4]
    import torch
    from klaudit.audit.stubs import import_with_stubs
    names = ("verl.workers.utils.losses", "verl.trainer.ppo.core_algos", "openrlhf.trainer.ray.ppo_actor",
             "openrlhf.trainer.ppo_utils.experience_maker", "openrlhf.models.utils")
    import_with_stubs(lambda: [importlib.import_module(name) for name in names], own=("verl", "openrlhf"))
    losses, core, actor, maker, utils = (sys.modules[name] for name in names)
    torch.manual_seed(0)
    logprobs = torch.randn(4, 7, requires_grad=True)
    old, ref = logprobs.detach().clone(), torch.randn(4, 7)

    def ppo_loss(config):  # verl.workers.utils.losses.ppo_loss calls kl_penalty with its ActorConfig at hand
        return losses.kl_penalty(logprob=logprobs, ref_logprob=ref, kl_penalty=config.kl_loss_type)

    ppo_loss(types.SimpleNamespace(kl_loss_type="low_var_kl", loss_agg_mode="token-mean"))
    core.kl_penalty(old, ref, kl_penalty="kl")          # apply_kl_penalty: old log-probs, detached: a reward
    core.kl_penalty(old, ref, kl_penalty="low_var_kl")

    class Actor:  # openrlhf's PolicyLoss caller: self.args.actor.loss_agg_mode
        args = types.SimpleNamespace(actor=types.SimpleNamespace(loss_agg_mode="seq-mean-token-mean"))

        def training_step(self):
            return actor.compute_approx_kl(logprobs, ref, log_probs_old=old, kl_estimator="k3")

    Actor().training_step()
    maker.compute_approx_kl(old, ref, kl_estimator="k2")
    print(json.dumps({"same_function": getattr(utils.compute_approx_kl, "__wrapped__", None) is
                      getattr(actor.compute_approx_kl, "__wrapped__", 1)}))
""")


def test_klaudit_watch_env_patches_the_real_frameworks_on_import(trees, tmp_path):
    from klaudit.watch.__main__ import main

    assert main(["install", "--dir", str(tmp_path)]) == 0
    log = tmp_path / "watch.jsonl"
    environment = {**os.environ, "KLAUDIT_WATCH": "verl,openrlhf", "KLAUDIT_WATCH_MODE": "log",
                   "KLAUDIT_WATCH_LOG": str(log), "KLAUDIT_WATCH_EVERY": "1"}
    done = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path), str(trees["verl"]), str(trees["openrlhf"])],
                          env=environment, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.splitlines()[-1]) == {"same_function": True}
    records = {(r["site"].split(":")[0], r["function"]): r for r in map(json.loads, log.read_text().splitlines())}

    loss = records["verl.workers.utils.losses.kl_penalty", "kl_penalty(kl_penalty='low_var_kl')"]
    assert loss["placement"] == "loss"
    # no token of this batch reaches low_var_kl's clamps: on it the term is k3, with the same verdict (KL002)
    assert loss["configuration"] == "k3 differentiated as a loss, batch-token-mean, on-policy"
    assert loss["rules"] == ["KL002"] and "use_kl_in_reward=True" in loss["fixes"][0]  # verl's own flags
    reward_k1 = records["verl.trainer.ppo.core_algos.kl_penalty", "kl_penalty(kl_penalty='kl')"]
    assert reward_k1["placement"] == "reward" and reward_k1["unbiased"] is True
    reward_k3 = records["verl.trainer.ppo.core_algos.kl_penalty", "kl_penalty(kl_penalty='low_var_kl')"]
    assert reward_k3["rules"] == ["KL004"] and reward_k3["fixes"] == ["algorithm.kl_penalty=kl (k1 values in the "
                                                                        "reward, unbiased with any of verl's "
                                                                        "advantage estimators)"]

    openrlhf_loss = records["openrlhf.trainer.ray.ppo_actor.compute_approx_kl",
                            "compute_approx_kl(kl_estimator='k3', unbiased_gradient=False)"]
    assert openrlhf_loss["placement"] == "loss"
    assert openrlhf_loss["configuration"] == "k3 differentiated as a loss, seq-token-mean, on-policy"
    assert openrlhf_loss["rules"] == ["KL002", "KL007"]
    openrlhf_reward = records["openrlhf.trainer.ppo_utils.experience_maker.compute_approx_kl",
                              "compute_approx_kl(kl_estimator='k2', unbiased_gradient=False)"]
    assert openrlhf_reward["placement"] == "reward" and openrlhf_reward["rules"] == ["KL004"]


def test_patch_wraps_an_imported_module_and_unpatch_restores_it(monkeypatch):
    def kl_penalty(logprob, ref_logprob, kl_penalty):
        return 0.5 * (logprob - ref_logprob).square()

    module = types.ModuleType("verl.trainer.ppo.core_algos")
    module.kl_penalty = kl_penalty
    monkeypatch.setitem(sys.modules, "verl.trainer.ppo.core_algos", module)
    sites = patch("verl", reporter=Reporter("raise"))
    try:
        assert "verl.trainer.ppo.core_algos.kl_penalty" in sites and module.kl_penalty.__wrapped__ is kl_penalty
        from klaudit.watch import KLGradientError

        with pytest.raises(KLGradientError, match="KL003 k2 differentiated as a loss"):
            module.kl_penalty(torch.randn(2, 3, requires_grad=True), torch.randn(2, 3), "mse")
    finally:
        unpatch("verl")
    assert module.kl_penalty is kl_penalty


def test_bad_patch_requests_are_clear():
    with pytest.raises(ValueError, match="unknown framework 'trlx'"):
        patch("trlx")
    with pytest.raises(ValueError, match="KLAUDIT_WATCH_EVERY"):
        settings({"KLAUDIT_WATCH": "verl", "KLAUDIT_WATCH_EVERY": "often"})
    assert settings({"KLAUDIT_WATCH": " verl, OpenRLHF "})[0] == ["verl", "openrlhf"]
    assert set(FRAMEWORKS) == {"verl", "openrlhf"}
