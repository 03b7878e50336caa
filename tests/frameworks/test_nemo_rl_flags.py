"""NeMo-RL's GRPO KL settings: its YAML configs (with their `defaults:` inheritance) and the overrides of the
scripts that launch its `run_grpo*.py`, judged by the KL code of the release or of the project's copy.

Expected codes come from kl-math.md §8, worked out by hand for what each release's ClippedPGLossFn
differentiates:
- up to 0.6 the estimate itself is the loss: k1 row 1 (KL001), k2 row 2 (KL003), k3 row 3 (KL002);
- from 0.7 the loss term is exp(logp - sg(logp)) * k, whose gradient is k grad log pi + grad k: for k3 the
  score-weighted k3 of row 2 (KL003), for k1 a k1 reward on its own token, also row 2 (KL003), for k2 a k2
  loss beside a same-token k2 reward, no unbiased row (KL009);
- k3 with the 20 / 10 clamps of 0.5's defaults is verl's low_var_kl (row 4, KL002 alone); any other clamp on the
  log-ratio or the estimate (0.4's fixed one on the log-ratio) is KL010;
- 1/L per response (`token_level_loss: false`) row 21 (KL007); the batch's token mean row 20 (no finding);
- more responses per rollout than `train_global_batch_size`, or asynchronous GRPO, trains the KL on an
  older policy's samples with at most the sampled token reweighted: rows 22-23 (KL008);
- `use_kl_in_reward` with the Reinforce++ estimator: the estimate on its own token's advantage (k1: row 2,
  KL003; k2 / k3: rows 7-8, KL004), clamped by calculate_kl's defaults (KL010, but for k3: low_var_kl).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from klaudit.catalog import Aggregation, Estimator, Returns, Sampling
from klaudit.frameworks import Context, lint_config, nemo_rl
from klaudit.frameworks.settings import Setting, yaml_settings
from klaudit.frameworks.versions import DEFAULT, Assumed, installed_release
from klaudit.lint.edits import apply_edits

BASE = """\
grpo:
  num_prompts_per_step: 32
  num_generations_per_prompt: 16
  adv_estimator:
    name: "{advantage}"
  async_grpo:
    enabled: {asynchronous}
loss_fn:
  reference_policy_kl_penalty: {beta}
  reference_policy_kl_type: "{kl_type}"
  kl_input_clamp_value: {input_clamp}
  kl_output_clamp_value: {output_clamp}
  use_on_policy_kl_approximation: {approximation}
  token_level_loss: {token_level}
  use_kl_in_reward: {in_reward}
policy:
  train_global_batch_size: {update_batch}
"""
VALUES = dict(advantage="grpo", asynchronous="false", beta="0.01", kl_type="k3", input_clamp="20.0",
              output_clamp="10.0", approximation="false", token_level="true", in_reward="false", update_batch="512")


def context(version: str) -> Context:
    return Context({**{name: Assumed(v) for name, v in DEFAULT.items()}, nemo_rl.NAME: Assumed(version, "pinned")})


def codes(version: str = "0.7", **changes: str) -> list[str]:
    text = BASE.format(**{**VALUES, **changes})
    return sorted(f.code for f in lint_config("examples/configs/grpo.yaml", text, context(version)))


@pytest.mark.parametrize("version, changes, expected", [
    # up to 0.6: the estimate differentiated as a loss, on-policy (32 x 16 = 512 responses, one update)
    ("0.3", {}, ["KL002"]),  # k3 only, unclamped
    ("0.4", {}, ["KL002", "KL010"]),  # k3, its log-ratio clamped to [-20, 20]
    ("0.5", {}, ["KL002"]),  # k3 with both default clamps: verl's low_var_kl, row 4
    ("0.5", {"output_clamp": "null"}, ["KL002", "KL010"]),  # the log-ratio clamp alone
    ("0.5", {"kl_type": "k1"}, ["KL001", "KL010"]),
    ("0.5", {"kl_type": "k2"}, ["KL003", "KL010"]),
    ("0.6", {"input_clamp": "null", "output_clamp": "null"}, ["KL002"]),
    # 0.7: the score-weighted estimate
    ("0.7", {}, ["KL003", "KL010"]),
    ("0.7", {"kl_type": "k1"}, ["KL003", "KL010"]),
    ("0.7", {"kl_type": "k2"}, ["KL009", "KL010"]),
    ("0.7", {"input_clamp": "null", "output_clamp": "null"}, ["KL003"]),
    ("0.7", {"beta": "0.0"}, []),  # no KL term
    ("0.7", {"kl_type": "k4"}, []),  # not an estimator NeMo-RL knows: no verdict
    # the aggregation
    ("0.5", {"token_level": "false", "input_clamp": "null", "output_clamp": "null"}, ["KL002", "KL007"]),
    # stale samples: 512 responses in updates of 128, asynchronous GRPO, with or without the token weight
    ("0.6", {"update_batch": "128", "input_clamp": "null", "output_clamp": "null"}, ["KL002", "KL008"]),
    ("0.6", {"update_batch": "128", "approximation": "true", "input_clamp": "null", "output_clamp": "null"},
     ["KL002", "KL008"]),
    ("0.7", {"asynchronous": "true", "input_clamp": "null", "output_clamp": "null"}, ["KL003", "KL008"]),
    ("0.7", {"update_batch": "1024", "input_clamp": "null", "output_clamp": "null"}, ["KL003"]),  # < 1 step: one
    # the KL in the Reinforce++ advantage; the GRPO estimator ignores it and the loss has none
    ("0.6", {"in_reward": "true", "advantage": "reinforce_plus_plus", "kl_type": "k1"}, ["KL003", "KL010"]),
    ("0.6", {"in_reward": "true", "advantage": "reinforce_plus_plus"}, ["KL004"]),  # low_var_kl in the reward
    ("0.6", {"in_reward": "true"}, []),
    ("0.5", {"in_reward": "true", "input_clamp": "null", "output_clamp": "null"}, ["KL002"]),  # 0.5 has no such key
])
def test_each_release_differentiates_its_own_kl_term(version, changes, expected):
    assert codes(version, **changes) == expected


def test_the_kl_configuration_of_each_form():
    """The catalog configuration behind the codes above, for the three forms of the KL term."""
    settings = yaml_settings(BASE.format(**{**VALUES, "update_batch": "128"}))
    plain = nemo_rl.judge(settings, nemo_rl.RELEASES["0.6"])
    weighted = nemo_rl.judge({**settings, nemo_rl.KL_TYPE: Setting("k2", 10, 3, 10)}, nemo_rl.RELEASES["0.7"])
    assert plain is not None and weighted is not None
    assert (plain[0].config.loss, plain[0].config.sampling, plain[1]) == (Estimator.LOW_VAR_KL, Sampling.OFF_POLICY, False)
    assert plain[0].config.aggregation is Aggregation.BATCH_MEAN
    config = weighted[0].config
    assert (config.loss, config.reward, config.returns) == (Estimator.K2, Estimator.K2, Returns.LOCAL)
    assert plain[0].where("KL008").line == 17  # train_global_batch_size, the key to change
    assert "num_prompts_per_step=32" in plain[0].flags and "train_global_batch_size=128" in plain[0].flags


def test_a_config_without_a_grpo_section_or_penalty_is_not_read():
    assert lint_config("dpo.yaml", "loss_fn:\n  reference_policy_kl_penalty: 0.1\n", context("0.7")) == []
    assert lint_config("grpo.yaml", "grpo:\n  num_prompts_per_step: 8\nloss_fn:\n  token_level_loss: false\n",
                       context("0.7")) == []


def write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(textwrap.dedent(text))


def test_an_inheriting_config_reports_only_what_its_own_keys_decide(tmp_path):
    """A child config (`defaults: "base.yaml"`, NeMo-RL's spelling) reports the rules its keys change: its
    bigger rollout makes the base's KL stale (KL008 at its batch size), its base's k3 is the base's finding."""
    write(tmp_path, {"pyproject.toml": "[project]\nname = 'x'\n",
                     "configs/base.yaml": BASE.format(**{**VALUES, "input_clamp": "null", "output_clamp": "null"}),
                     "configs/big.yaml": """\
                         defaults: "base.yaml"
                         grpo:
                           num_prompts_per_step: 64
                           num_generations_per_prompt: 32
                         """,
                     "configs/renamed.yaml": "defaults: base.yaml\ncheckpointing:\n  checkpoint_dir: results\n",
                     "configs/token_mean.yaml": "defaults:\n  - base.yaml\nloss_fn:\n  token_level_loss: false\n"})
    found = {name: sorted((f.line, f.code) for f in lint_config(str(tmp_path / "configs" / name),
                                                                 (tmp_path / "configs" / name).read_text(), context("0.6")))
             for name in ("base.yaml", "big.yaml", "renamed.yaml", "token_mean.yaml")}
    assert found == {"base.yaml": [(10, "KL002")], "big.yaml": [(3, "KL008")], "renamed.yaml": [],
                     "token_mean.yaml": [(4, "KL007")]}


def test_a_section_marked_override_replaces_the_inherited_one(tmp_path):
    write(tmp_path, {"base.yaml": BASE.format(**VALUES),
                     "child.yaml": """\
                         defaults: base.yaml
                         policy:
                           _override_: true
                           model_name: small
                         grpo:
                           num_prompts_per_step: 64
                         """})
    # the replaced policy section has no train_global_batch_size: the steps per rollout are unknown, not stale
    assert [f.code for f in lint_config(str(tmp_path / "child.yaml"), (tmp_path / "child.yaml").read_text(),
                                        context("0.6"))] == []


LOSS_0_6 = """\
class ClippedPGLossFn:
    def __init__(self, cfg):
        self.reference_policy_kl_type = cfg["reference_policy_kl_type"]
        self.kl_input_clamp_value = cfg["kl_input_clamp_value"]

    def __call__(self, curr_logprobs, generation_logprobs):
        if self.use_on_policy_kl_approximation:
            weights = torch.exp(curr_logprobs - generation_logprobs).detach()
        else:
            weights = torch.ones_like(curr_logprobs)
"""
LOSS_0_7 = LOSS_0_6.replace("torch.ones_like(curr_logprobs)", "torch.exp(\n                curr_logprobs - curr_logprobs.detach()\n            )")
LOSS_0_3 = """\
from nemo_rl.algorithms.utils import calculate_kl_penalty_joschu2020
kl = beta * calculate_kl_penalty_joschu2020(logprobs_policy=curr_logprobs, logprobs_reference=ref_logprobs)
"""
UTILS_0_4 = """\
def calculate_kl_penalty_joschu2020(
    logprobs_policy: torch.Tensor, logprobs_reference: torch.Tensor, clamp_value: Optional[float] = 20.0
) -> torch.Tensor:
    r = logprobs_reference - logprobs_policy
"""
UTILS_0_3 = "def calculate_kl_penalty_joschu2020(logprobs_policy, logprobs_reference):\n    r = logprobs_reference - logprobs_policy\n"


@pytest.mark.parametrize("loss, utils, release", [
    (LOSS_0_3, UTILS_0_3, "0.3"), (LOSS_0_3, UTILS_0_4, "0.4"), (LOSS_0_6, "", "0.5"),
    (LOSS_0_6 + "use_kl_in_reward = False\n", "", "0.6"), (LOSS_0_7 + "use_kl_in_reward = False\n", "", "0.7"),
])
def test_a_copy_is_read_as_the_release_its_kl_code_matches(loss, utils, release):
    assert nemo_rl.code_of_copy(loss, utils) == nemo_rl.RELEASES[release]


GRPO_SCRIPT = """\
import os
from nemo_rl.utils.config import load_config

def main():
    config_path = os.path.join(os.path.dirname(__file__), "configs", "grpo_project.yaml")
    config = load_config(config_path)
"""
LAUNCH = """\
#!/bin/bash
grpo_bs=128
kl=0.001
uv run examples/run_grpo_project.py \\
    grpo.num_prompts_per_step=64 \\
    grpo.num_generations_per_prompt=8 \\
    loss_fn.reference_policy_kl_penalty=${kl} \\
    policy.train_global_batch_size=${grpo_bs}
"""


def test_a_launch_script_is_judged_by_the_copy_it_runs(tmp_path):
    """The script's own default config, its overrides placed where their values are set, and the copy's
    KL code (0.3's unclamped k3 loss) over the release assumed (0.7's score-weighted one)."""
    write(tmp_path, {"pyproject.toml": "[project]\nname = 'project'\n",
                     "examples/run_grpo_project.py": GRPO_SCRIPT,
                     "examples/configs/grpo_project.yaml": BASE.format(**VALUES),
                     "nemo_rl/algorithms/loss_functions.py": LOSS_0_3,
                     "nemo_rl/algorithms/utils.py": UTILS_0_3,
                     "train.sh": LAUNCH})
    found = lint_config(str(tmp_path / "train.sh"), LAUNCH, Context(roots=(str(tmp_path),)))
    assert sorted((f.line, f.code) for f in found) == [(2, "KL008"), (3, "KL002")]
    assert "the copy in nemo_rl/" in found[0].message
    for module in ("loss_functions.py", "utils.py"):  # no copy: the release assumed decides
        (tmp_path / "nemo_rl" / "algorithms" / module).unlink()
    nemo_rl_found = lint_config(str(tmp_path / "train.sh"), LAUNCH, Context(roots=(str(tmp_path),)))
    assert sorted(f.code for f in nemo_rl_found) == ["KL003", "KL008", "KL010"]
    assert f"NeMo-RL {DEFAULT[nemo_rl.NAME]}" in nemo_rl_found[0].message


def test_a_per_response_mean_is_fixed_by_the_token_mean_and_relints_clean():
    text = BASE.format(**{**VALUES, "token_level": "false", "input_clamp": "null", "output_clamp": "null"})
    found = {f.code: f for f in lint_config("grpo.yaml", text, context("0.6"))}
    assert found["KL007"].autofix is not None and found["KL007"].line == 14
    fixed = apply_edits(text, found["KL007"].autofix.edits)
    assert "token_level_loss: true" in fixed
    assert sorted(f.code for f in lint_config("grpo.yaml", fixed, context("0.6"))) == ["KL002"]
    assert found["KL002"].autofix is None and "ClippedPGLossFn" in found["KL002"].fix
    # the code fix keeps the scale of NeMo-RL's batch token mean: the estimators' per-sequence sums over the tokens
    fixed_estimate = {f.code: f for f in lint_config("grpo.yaml", fixed, context("0.6"))}["KL002"].fix
    assert ".loss.sum() / mask.sum()" in fixed_estimate and ".loss.mean()" not in fixed_estimate


def test_the_container_image_a_project_runs_states_the_release(tmp_path):
    """NVIDIA ships NeMo-RL as a container image; a project's slurm script names the one its configs run in
    (0.5: the plain k3 loss, KL002), and images that disagree state nothing (the latest, 0.7: KL003)."""
    write(tmp_path, {"configs/grpo.yaml": BASE.format(**VALUES),
                     "scripts/slurm/grpo.sh": 'CONTAINER=${CONTAINER:-"nvcr.io/nvidia/nemo-rl:v0.5.0"}\n'})
    config = tmp_path / "configs" / "grpo.yaml"

    def judged() -> tuple[list[str], str]:
        found = lint_config(str(config), config.read_text(), Context(roots=(str(tmp_path),)))
        return sorted(f.code for f in found), found[0].message

    codes, message = judged()
    assert codes == ["KL002"] and "NeMo-RL 0.5 (nvcr.io/nvidia/nemo-rl:v0.5.0 in scripts/slurm/grpo.sh" in message
    write(tmp_path / "k8s", {"job.yaml": "image: nvcr.io/nvidia/nemo-rl:v0.7.0\n"})
    installed_release.cache_clear()
    assert judged()[0] == ["KL003", "KL010"]


def test_a_cloned_release_branch_states_the_release_and_a_readme_only_where_scripts_name_none(tmp_path):
    """`git clone --branch v0.6.0 .../NVIDIA-NeMo/RL.git` in a setup script states 0.6 (the plain low_var_kl loss);
    the same in a README's install instructions does too when no script names a release."""
    write(tmp_path, {"configs/grpo.yaml": BASE.format(**VALUES),
                     "cluster/README.md": "```\ngit clone --branch v0.6.0 https://github.com/NVIDIA-NeMo/RL.git NeMo-RL\n```\n"})
    config = tmp_path / "configs" / "grpo.yaml"
    found = lint_config(str(config), config.read_text(), Context(roots=(str(tmp_path),)))
    assert [f.code for f in found] == ["KL002"]
    assert "NeMo-RL 0.6 (git clone --branch v0.6.0 in cluster/README.md" in found[0].message
    write(tmp_path, {"setup.sh": "git clone https://github.com/NVIDIA/NeMo-RL -b v0.3.1\n"})
    installed_release.cache_clear()
    found = lint_config(str(config), config.read_text(), Context(roots=(str(tmp_path),)))
    assert [f.code for f in found] == ["KL002"] and "NeMo-RL 0.3 (git clone https://github.com/NVIDIA/NeMo-RL -b v0.3.1 in setup.sh" in found[0].message


def test_a_ppo_config_takes_its_epochs_and_a_config_renaming_the_estimator_reports_nothing(tmp_path):
    """NeMo-RL's PPO trains the same ClippedPGLossFn `ppo.ppo_epochs` times per rollout (default 4): KL008
    at the epochs; a GRPO config that only names another advantage estimator changes nothing of a KL in the
    loss, so its base's findings are not repeated there."""
    text = ("ppo:\n  ppo_epochs: 2\n  num_prompts_per_step: 32\n  num_generations_per_prompt: 16\n"
            "loss_fn:\n  reference_policy_kl_penalty: 0.001\n  reference_policy_kl_type: k3\n"
            "  kl_input_clamp_value: null\n  kl_output_clamp_value: null\n"
            "policy:\n  train_global_batch_size: 512\n")
    found = {f.code: f for f in lint_config("ppo.yaml", text, context("0.6"))}
    assert sorted(found) == ["KL002", "KL008"] and found["KL008"].line == 2 and "ppo_epochs=2" in found["KL008"].message
    write(tmp_path, {"base.yaml": BASE.format(**VALUES), "gdpo.yaml": 'defaults: base.yaml\ngrpo:\n  adv_estimator:\n    name: "gdpo"\n'})
    assert lint_config(str(tmp_path / "gdpo.yaml"), (tmp_path / "gdpo.yaml").read_text(), context("0.6")) == []


def test_an_entry_script_named_from_a_project_variable(tmp_path):
    """NeMo-RL's functional tests run `$PROJECT_ROOT/examples/run_grpo.py` with the script's default config:
    2 prompts x 4 generations in updates of 4 responses take two optimizer steps per rollout."""
    launch = ("cd $PROJECT_ROOT\nuv run coverage run $PROJECT_ROOT/examples/run_grpo_project.py \\\n"
              "    grpo.num_prompts_per_step=2 \\\n    grpo.num_generations_per_prompt=4 \\\n"
              "    policy.train_global_batch_size=4\n")
    write(tmp_path, {"pyproject.toml": "", "examples/run_grpo_project.py": GRPO_SCRIPT,
                     "examples/configs/grpo_project.yaml": BASE.format(**VALUES), "tests/functional/grpo.sh": launch})
    found = lint_config(str(tmp_path / "tests/functional/grpo.sh"), launch, context("0.6"))
    assert [(f.line, f.code) for f in found] == [(5, "KL008")]
    commented = "# the same shape as examples/run_grpo_project.py\n" + launch.replace("$PROJECT_ROOT/examples/", "./")
    assert lint_config(str(tmp_path / "tests/functional/grpo.sh"), commented, context("0.6")) == []  # named in a comment only


@pytest.mark.parametrize("commit, expected", [
    ("5fb588932b", "0.6.0"),  # the v0.6.0 tag
    ("85eeb8d059b0249cace427dd5dec9573107be224", "0.5.0.dev0"),  # 2025-10-17: reached by v0.5.0, not by v0.4.0
    ("33bce20d783468d2eec75bace5982f3cc2c5bb8d", "0.7.0.dev0"),  # the score weight (2026-06-24), first tagged v0.7.0
])
def test_the_commit_table_places_a_nemo_rl_commit_by_its_release_tags(commit, expected):
    """Read by hand from NeMo-RL's repository (git tag --contains COMMIT); its package_info.py still says
    0.6.0 at 33bce20d, which is why the table follows the tags."""
    from klaudit.frameworks.versions import commit_version

    assert commit_version(nemo_rl.NAME, commit) == expected


def test_a_dockerfile_checkout_of_a_commit_between_releases_reports_what_both_give(tmp_path):
    """NeMo-Skills builds NeMo-RL at 85eeb8d (between 0.4 and 0.5) through an ENV default: 0.4's k3 with its
    log-ratio clamp (KL002 + KL010) and 0.5's low_var_kl (KL002) agree on KL002 alone."""
    write(tmp_path, {"configs/grpo.yaml": BASE.format(**VALUES),
                     "dockerfiles/Dockerfile.nemo-rl": (
                         "ARG NEMO_RL_COMMIT\nENV NEMO_RL_COMMIT=${NEMO_RL_COMMIT:-85eeb8d059b0249cace427dd5dec9573107be224}\n"
                         "RUN git clone https://github.com/NVIDIA-NeMo/RL.git /opt/NeMo-RL && cd /opt/NeMo-RL && "
                         "git checkout ${NEMO_RL_COMMIT}\n")})
    config = tmp_path / "configs" / "grpo.yaml"
    found = lint_config(str(config), config.read_text(), Context(roots=(str(tmp_path),)))
    assert [f.code for f in found] == ["KL002"]
    assert "0.5.0.dev0 at commit 85eeb8d059 in dockerfiles/Dockerfile.nemo-rl, between 0.4 and 0.5" in found[0].message


def test_a_nemo_rl_dependency_on_a_git_commit(tmp_path):
    """`nemo-rl @ git+...@<the v0.6.0 commit>` in pyproject.toml: 0.6's low_var_kl loss (KL002), not 0.7's KL003."""
    write(tmp_path, {"pyproject.toml": '[project]\nname = "p"\ndependencies = ["nemo-rl @ git+https://github.com/NVIDIA-NeMo/RL.git@5fb588932b"]\n',
                     "configs/grpo.yaml": BASE.format(**VALUES)})
    from klaudit.frameworks import for_roots

    config = tmp_path / "configs" / "grpo.yaml"
    found = lint_config(str(config), config.read_text(), for_roots({}, [tmp_path]))
    assert [f.code for f in found] == ["KL002"] and "NeMo-RL 0.6 (0.6.0 at commit 5fb588932b" in found[0].message
