"""OpenRLHF's train_ppo_ray options in launch scripts, judged by the catalog (kl-math.md §8).

Rows: k1 as a loss 1 (KL001), k2 as a loss or k2's gradient (unbiased_gradient) 2 (KL003), OpenRLHF's
clamped k3 as a loss 3-4 (KL002), k2/k3 in the reward 7-8 (KL004), k1 in the reward 6 (correct, but for
OpenRLHF's clamp of every estimate to [-10, 10]: KL010 from 0.8.6), a per-sequence token-mean 21 (KL007),
a loss on samples of an older policy 22-23 (KL008). The table must agree with the lint of code shaped
like OpenRLHF's (fixtures/bad/openrlhf_kl_flags.py), value by value.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from klaudit.config import Settings
from klaudit.frameworks import Context, lint_config, openrlhf
from klaudit.frameworks.versions import DEFAULT, Assumed
from klaudit.lint.engine import lint_paths
from tests.frameworks.launches import launch_codes

# One update per rollout unless a case says otherwise: the KL loss is then on-policy.
LAUNCH = "python3 -m openrlhf.cli.train_ppo_ray --rollout.batch_size 128 --train.batch_size 128 {flags}\n"


def codes(flags: str, version: str | None = None) -> list[str]:
    versions = {**{n: Assumed(v) for n, v in DEFAULT.items()}, **({"openrlhf": Assumed(version, "pinned")} if version else {})}
    return sorted(f.code for f in lint_config("run.sh", LAUNCH.format(flags=flags), Context(versions)))


@pytest.mark.parametrize("flags, expected", [
    ("--algo.kl.init_coef 0.01", ["KL010"]),  # k1 reward (row 6), clamped
    ("--algo.kl.estimator k2", ["KL004", "KL010"]),
    ("--algo.kl.estimator k3", ["KL004"]),  # low_var_kl's rows name its clamps
    ("--algo.kl.use_loss", ["KL001", "KL010"]),  # default estimator k1
    ("--algo.kl.use_loss --algo.kl.estimator k2", ["KL003", "KL010"]),
    ("--algo.kl.use_loss --algo.kl.estimator k3", ["KL002"]),
    ("--algo.kl.use_loss --algo.kl.estimator k3 --algo.kl.unbiased_gradient", ["KL003"]),  # k2's gradient, unclamped
    ("--algo.kl.use_loss --algo.kl.estimator k3 --train.max_epochs 2", ["KL002", "KL008"]),
    ("--algo.kl.use_loss --algo.kl.unbiased_gradient --train.max_epochs 2", ["KL003", "KL008"]),  # token-IS only
    ("--algo.kl.use_loss --algo.kl.estimator k2 --train.async_enable", ["KL003", "KL008", "KL010"]),
    ("--algo.kl.estimator k3 --train.max_epochs 2", ["KL004", "KL008"]),  # a reward over two epochs: rows 7, 23
    ("--algo.kl.estimator k1 --actor.loss_agg_mode seq-mean-token-mean", ["KL007", "KL010"]),
    ("--algo.kl.estimator k1 --actor.policy_loss_type gspo", []),  # a per-sequence ratio: no catalog row
    ("--algo.kl.init_coef 0 --algo.kl.use_loss --algo.kl.estimator k3", []),  # the KL is off
    ("--algo.kl.use_loss --algo.kl.estimator $EST", []),  # unknown: no verdict
    ("--algo.advantage.estimator group_norm", []),  # no KL flag: nothing to judge
])
def test_flags_get_the_catalog_s_verdict(flags, expected):
    assert codes(flags) == expected


def test_releases_change_the_verdict():
    assert codes("--use_kl_loss --kl_estimator k3", "0.7") == ["KL002"]  # plain k3, no clamp before 0.8.6
    assert codes("--use_kl_loss --kl_estimator k1", "0.7") == ["KL001"]
    assert codes("--use_kl_loss --kl_estimator k1", "0.6") == ["KL001"]  # 1/L weights: the k1 loss is row 1b
    # 0.6 rebuilds the packed KL loss with torch.tensor: its values without a gradient (row 1c), whatever the estimator
    assert codes("--use_kl_loss --kl_estimator k3 --packing_samples", "0.6") == ["KL001"]
    assert codes("--use_kl_loss --kl_estimator k2 --packing_samples --max_epochs 2", "0.6") == ["KL001"]
    assert codes("--use_kl_loss --kl_estimator k3 --packing_samples", "0.7") == ["KL002"]
    assert codes("--algo.kl.use_loss --algo.kl.unbiased_gradient --algo.kl.estimator k3", "0.10") == ["KL002"]


@pytest.mark.parametrize("version, clamped", [("0.8", False), ("0.8.5", False), ("0.8.6", True), ("0.9", True)])
def test_the_clamp_came_in_0_8_6(version, clamped):
    """compute_approx_kl of the 0.8.0 to 0.8.5 wheels returns the estimate as computed; 0.8.6 to 0.8.9 clamp it
    to [-10, 10]: a k1 or k2 estimate is then cut on tokens far from the reference (KL010)."""
    assert codes("--init_kl_coef 0.01", version) == (["KL010"] if clamped else [])
    assert codes("--use_kl_loss --kl_estimator k2", version) == (["KL003", "KL010"] if clamped else ["KL003"])
    loss = "low_var_kl differentiated" if clamped else "k3 differentiated"
    assert loss in lint_config("run.sh", LAUNCH.format(flags="--use_kl_loss --kl_estimator k3"), Context(
        {**{n: Assumed(v) for n, v in DEFAULT.items()}, "openrlhf": Assumed(version, "pinned")}))[0].message


def test_up_to_0_6_the_policy_loss_is_each_responses_token_mean():
    """OpenRLHF 0.5.9-0.6.4's PolicyLoss: masked_mean(loss, action_mask, dim=-1).mean(), a k1 reward's 1/L weights
    (row 21), unless --packing_samples makes the micro-batch one row (token_level_loss from 0.7 on)."""
    assert codes("--init_kl_coef 0.01", "0.6") == ["KL007"]
    assert codes("--init_kl_coef 0.01 --packing_samples", "0.6") == []
    assert codes("--init_kl_coef 0.01", "0.7") == []
    [finding] = lint_config("run.sh", "deepspeed --module openrlhf.cli.train_ppo_ray --init_kl_coef 0.01 "
                                      "--rollout_batch_size 64 --train_batch_size 64\n",
                            Context({**{n: Assumed(v) for n, v in DEFAULT.items()}, "openrlhf": Assumed("0.6", "pinned")}))
    assert finding.fix.startswith("--packing_samples with the KL in the reward")


def test_the_k3_switch_of_0_6_0_puts_k3_in_the_reward():
    assert codes("--init_kl_coef 0.01 --use_kl_estimator_k3 --packing_samples", "0.6") == ["KL004"]  # row 7
    assert codes("--use_kl_loss --use_kl_estimator_k3", "0.6") == ["KL002", "KL007"]  # row 3, each response's mean
    text = ("deepspeed --module openrlhf.cli.train_ppo_ray --init_kl_coef 0.01\n  --use_kl_estimator_k3 "
            "--rollout_batch_size 64 --train_batch_size 64\n")
    found = {f.code: f for f in lint_config("run.sh", text)}
    assert sorted(found) == ["KL004", "KL007"]
    assert found["KL004"].line == 2  # the switch that chose k3
    assert found["KL007"].line == 1  # the reward's coefficient: no flag names the reduction up to 0.6
    assert "[openrlhf 0.6 (--use_kl_estimator_k3, a switch of releases up to 0.6.0): " in found["KL004"].message


def test_a_packed_kl_loss_of_0_6_trains_nothing_and_its_fix_keeps_to_the_release():
    """astOwOlfo/swe_bench_rl's launch of an OpenRLHF 0.6.0 fork: `--use_kl_loss --use_kl_estimator_k3
    --packing_samples` rebuilds the KL loss with torch.tensor, so it has no gradient (row 1c, KL001). The fix names
    the switch that release has (no `--kl_estimator` yet) and no clamp (0.8.6 brought it)."""
    text = ("deepspeed --module openrlhf.cli.train_ppo_ray --init_kl_coef 0.01 --use_kl_loss\n"
            "  --use_kl_estimator_k3 --packing_samples --rollout_batch_size 64 --train_batch_size 64\n")
    found = {f.code: f for f in lint_config("run.sh", text)}
    assert sorted(found) == ["KL001"]
    assert "without its gradient" in found["KL001"].message
    fix = found["KL001"].fix
    assert fix.startswith("drop --use_kl_loss and leave out --use_kl_estimator_k3: the KL as a k1 reward")
    assert "clamp" not in fix


def test_flat_names_say_the_script_is_for_an_earlier_release(tmp_path):
    [finding] = lint_config("run.sh", "deepspeed --module openrlhf.cli.train_ppo_ray --use_kl_loss --kl_estimator k3 "
                                      "--rollout_batch_size 64 --train_batch_size 64\n")
    assert "[openrlhf 0.10 (flat flag names): use_kl_loss=True, kl_estimator=k3" in finding.message
    assert finding.fix.startswith("drop --use_kl_loss and set --kl_estimator k1")


def test_flat_names_decide_where_the_project_pins_a_git_commit(tmp_path):
    """A dependency on a git commit of OpenRLHF names no release: the flat names still say 0.10."""
    (tmp_path / "requirements.txt").write_text("openrlhf @ git+https://github.com/OpenRLHF/OpenRLHF.git@0123456789abcdef\n")
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'mine'\n")
    (tmp_path / "run.sh").write_text("deepspeed --module openrlhf.cli.train_ppo_ray --use_kl_loss --kl_estimator k3 "
                                     "--rollout_batch_size 64 --train_batch_size 64\n")
    [finding] = lint_paths([str(tmp_path)], settings=Settings(root=tmp_path), jobs=1).findings
    assert "[openrlhf 0.10 (flat flag names): use_kl_loss=True, kl_estimator=k3" in finding.message


FLAT_K1_REWARD = "python3 -m openrlhf.cli.train_ppo_ray --init_kl_coef 0.01 --rollout_batch_size 64 --train_batch_size 64\n"


@pytest.mark.parametrize("copy, version_file, expected", [
    (None, None, ["KL010"]),  # no copy: the flat names say 0.10, whose k1 reward is clamped
    ("openrlhf", None, []),  # LIMR: a copy stating no release is its own code's, linted with the tree
    # R1-Searcher: 0.5.5 is read as 0.6, unclamped; its policy loss is each response's token mean (row 21)
    ("OpenRLHF-RAG/openrlhf", "OpenRLHF-RAG/version.txt", ["KL007"]),
    ("third_party/openrlhf", "third_party/version.txt", ["KL010"]),  # a copy stating 0.9: clamped
])
def test_a_copy_of_openrlhf_in_the_project_decides_the_release(tmp_path, copy, version_file, expected):
    (tmp_path / "setup.py").write_text("")  # the project root
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "train.sh").write_text(FLAT_K1_REWARD)
    if copy is not None:
        (tmp_path / copy / "cli").mkdir(parents=True)
        (tmp_path / copy / "cli" / "train_ppo_ray.py").write_text("")
    if version_file is not None:
        (tmp_path / version_file).write_text("0.9.1\n" if "third_party" in version_file else "0.5.5\n")
    roots = (str(tmp_path.resolve()),)
    found = lint_config(str(tmp_path / "scripts" / "train.sh"), FLAT_K1_REWARD, Context(roots=roots))
    assert [f.code for f in found] == expected
    if version_file == "third_party/version.txt":
        assert "[openrlhf 0.9 (0.9.1 in third_party/version.txt)" in found[0].message


def test_a_search_for_the_copy_stops_at_the_linted_root(tmp_path):
    """An unpacked tree without project files: a sibling folder above the linted root is another project."""
    (tmp_path / "other" / "openrlhf" / "cli").mkdir(parents=True)
    (tmp_path / "other" / "openrlhf" / "cli" / "train_ppo_ray.py").write_text("")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "train.sh").write_text(FLAT_K1_REWARD)
    found = lint_config(str(tmp_path / "mine" / "train.sh"), FLAT_K1_REWARD,
                        Context(roots=(str((tmp_path / "mine").resolve()),)))
    assert [f.code for f in found] == ["KL010"]


def test_bash_arrays_variables_and_the_finding_s_place():
    text = ("KL=k2\nARGS=(\n   --algo.kl.use_loss  # the KL as a loss\n   --algo.kl.estimator $KL\n"
            "   --rollout.batch_size 64 --rollout.n_samples_per_prompt 8 --train.batch_size 64\n)\n"
            "ray job submit -- python3 -m openrlhf.cli.train_ppo_ray \"${ARGS[@]}\"\n")
    found = {f.code: f for f in lint_config("run.sh", text)}
    assert sorted(found) == ["KL003", "KL008", "KL010"]
    assert (found["KL003"].line, found["KL003"].column) == (1, 1)  # the variable's assignment
    assert found["KL008"].line == 5 and text.splitlines()[4][found["KL008"].column - 1:].startswith("--train.batch_size")
    assert "divided by about the mean response length" in found["KL003"].fix


FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "bad" / "openrlhf_kl_flags.py"
# The catalog's name of each estimator value, as the description of a finding starts.
DESCRIBED = {"k1": "k1 ", "k2": "k2 ", "k3": "low_var_kl "}


def _estimator_values(message: str) -> set[str]:
    """The values of the `estimator` switch a finding names (`estimator="k1"|"k2"`)."""
    named = re.search(r'estimator=((?:"[^"]*"\|?)+)', message)
    return set(re.findall(r'"([^"]*)"', named.group(1))) if named else set()


def test_the_flag_table_agrees_with_the_lint_of_openrlhf_shaped_code():
    """For each placement (use_loss) and estimator value: the codes the lint of OpenRLHF-shaped code
    reports for that value (by its switch label, or by its description where a finding of the whole
    placement carries no label) are the codes the flags give. The code has OpenRLHF's default batch
    sizes (several updates per rollout), so the flags do too. One difference: the reward reaches the PPO
    ratio through the experience another class's method hands over, which the lint of code does not follow;
    the flags know the batch sizes, and add the reward's KL008 (row 23)."""
    by_placement: dict[bool, list] = {True: [], False: []}
    for finding in lint_paths([str(FIXTURE)], settings=Settings(root=FIXTURE.parent), jobs=1).findings:
        use_loss = re.search(r"use_loss=(True|False)", finding.message)
        assert use_loss is not None, finding.message
        by_placement[use_loss.group(1) == "True"].append(finding)
    for use_loss, findings in by_placement.items():
        for value, described in DESCRIBED.items():
            labelled = {f.code for f in findings if value in _estimator_values(f.message)}
            unlabelled = {f.code for f in findings if "estimator=" not in f.message}
            of_value = labelled | {f.code for f in findings if "estimator=" not in f.message
                                   and f.message.startswith(described)}
            flags = f"--algo.kl.estimator {value}" + (" --algo.kl.use_loss" if use_loss else "")
            from_flags = {f.code for f in lint_config("run.sh", "python3 -m openrlhf.cli.train_ppo_ray " + flags)}
            handed_over = set() if use_loss else {"KL008"}
            assert of_value and of_value <= from_flags <= labelled | unlabelled | handed_over, (
                use_loss, value, of_value, from_flags)


@pytest.mark.parametrize("body, expected", [
    ("    return r - kl_coef * kl\n", ["KL008", "KL010"]),  # upstream's: the clamped k1 reward over 8 updates
    ("    return r * action_mask\n", []),  # a fork's task reward alone: the KL flags put nothing in the reward
])
def test_a_copy_whose_compute_reward_drops_the_kl_has_no_kl_reward(tmp_path, body, expected):
    """Distributional-Matching-Tuning (fifteenth set) carries OpenRLHF 0.8.9 with compute_reward rewritten to
    return the task reward alone: its upstream PPO examples' --init_kl_coef adds no KL to the rewards."""
    (tmp_path / "setup.py").write_text("from setuptools import setup\nsetup(name='openrlhf')\n")
    (tmp_path / "version.txt").write_text("0.8.9\n")
    (tmp_path / "openrlhf" / "models").mkdir(parents=True)
    (tmp_path / "openrlhf" / "__init__.py").write_text("")
    (tmp_path / "openrlhf" / "models" / "utils.py").write_text(
        "def compute_reward(r, kl_coef, kl, action_mask=None):\n" + body)
    (tmp_path / "openrlhf" / "cli").mkdir()
    (tmp_path / "openrlhf" / "cli" / "train_ppo_ray.py").write_text("")
    launch = "python3 -m openrlhf.cli.train_ppo_ray --init_kl_coef 0.01 --rollout_batch_size 1024 --train_batch_size 128\n"
    assert launch_codes(tmp_path, launch) == expected


_FORK_MAKER = """\
from openrlhf.models.utils import compute_reward


class NaiveExperienceMaker:
    def make_experience_list(self, experiences, args):
        if self.advantage_estimator == "group_norm":
            experiences = self.get_grpo_advantages(experiences, args.n_samples_per_prompt)
        else:
            for experience in experiences:
                reward = compute_reward(experience.info["reward"], self.kl_ctl.value, experience.kl)
                if self.advantage_estimator == "gae":
                    experience.advantages = self.get_advantages_and_returns(experience.values, reward)
                elif self.advantage_estimator == "reinforce":
                    experience.advantages = self.get_cumulative_returns(reward)
        return experiences
"""


@pytest.mark.parametrize("estimator, maker, expected", [
    ("group_norm", _FORK_MAKER, []),  # the fork's group_norm branch: task rewards alone, the KL only logged
    ("reinforce", _FORK_MAKER, ["KL008"]),  # its other branch puts the k1 in the rewards, over 8 updates
    ("group_norm", _FORK_MAKER.replace(  # upstream's order: compute_reward first, for every estimator
        '        if self.advantage_estimator == "group_norm":\n'
        '            experiences = self.get_grpo_advantages(experiences, args.n_samples_per_prompt)\n'
        '        else:\n', '        if True:\n'), ["KL008"]),
])
def test_an_estimator_whose_branch_of_the_copy_takes_no_kl_reward_has_none(tmp_path, estimator, maker, expected):
    """wantbook-book/MCGEP (thirty-eighth set) carries OpenRLHF 0.5.1 whose make_experience_list gives
    `group_norm` its group-normalised task rewards and calls compute_reward only in the other branch: its GRPO
    launches' --init_kl_coef puts no KL in any reward, while its REINFORCE launches keep the k1 reward."""
    (tmp_path / "version.txt").write_text("0.5.1\n")
    (tmp_path / "openrlhf" / "models").mkdir(parents=True)
    (tmp_path / "openrlhf" / "models" / "utils.py").write_text("def compute_reward(r, kl_coef, kl):\n"
                                                              "    return r - kl_coef * kl\n")
    (tmp_path / "openrlhf" / "trainer" / "ppo_utils").mkdir(parents=True)
    (tmp_path / "openrlhf" / "trainer" / "ppo_utils" / "experience_maker.py").write_text(maker)
    (tmp_path / "openrlhf" / "cli").mkdir()
    (tmp_path / "openrlhf" / "cli" / "train_ppo_ray.py").write_text("")
    launch = ("python3 -m openrlhf.cli.train_ppo_ray --init_kl_coef 0.01 --rollout_batch_size 1024 "
              f"--train_batch_size 128 --advantage_estimator {estimator} --packing_samples\n")
    assert launch_codes(tmp_path, launch) == expected


@pytest.mark.parametrize("flags, version, expected", [
    ("--use_kl_loss --kl_estimator k2 --micro_train_batch_size 1", "0.8", ["KL003", "KL007"]),  # row 2 with 1/L
    ("--init_kl_coef 0.01 --micro_train_batch_size 1", "0.9", ["KL007", "KL010"]),  # the k1 reward's policy loss
    ("--init_kl_coef 0.01 --micro_train_batch_size 2", "0.9", ["KL010"]),  # two responses: a batch's token mean
    ("--init_kl_coef 0.01 --micro_train_batch_size 1 --use_dynamic_batch", "0.9", ["KL010"]),  # tokens decide
    ("--algo.kl.init_coef 0.01 --train.micro_batch_size 1", "0.11", ["KL010"]),  # the step's token count
    ("--init_kl_coef 0.01 --micro_train_batch_size $MB", "0.9", ["KL010"]),  # unknown: decides nothing
])
def test_a_micro_batch_of_one_response_is_a_per_response_mean_from_0_7_to_0_10(flags, version, expected):
    """0.7 to 0.10 take masked_mean over each micro-batch's tokens, for the policy loss (which carries a KL
    reward) and for the KL loss: one response per micro-batch divides it by its own length (row 21, KL007)."""
    assert codes(flags, version) == expected


def test_the_micro_batch_kl007_points_at_the_micro_batch_flag():
    text = LAUNCH.format(flags="--init_kl_coef 0.01 \\\n  --micro_train_batch_size 1")
    versions = {**{n: Assumed(v) for n, v in DEFAULT.items()}, "openrlhf": Assumed("0.9", "pinned")}
    [length] = [f for f in lint_config("run.sh", text, Context(versions)) if f.code == "KL007"]
    assert length.line == 2 and "micro_train_batch_size" in length.fix and "0.11" in length.fix


_FORK_CLI = """\
import argparse

if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--init_kl_coef", type=float, default=0.01)
    parser.add_argument("--kl_estimator", type=str, default="k3", choices=["k1", "k2", "k3"])
    parser.add_argument("--rollout_batch_size", type=int, default=1024)
    parser.add_argument("--train_batch_size", type=int, default=128)
    parser.add_argument("--param_dtype", type=str, default="bf16")
    parser.add_argument("--packing_samples", action="store_true", default=False)
    args = parser.{parse}()
"""


@pytest.mark.parametrize("flags, parse, expected", [
    ("--param_dtype bf16", "parse_args", ["KL004", "KL008"]),  # the fork's default: clamped k3 in the reward
    ("--param_dtype bf16 --kl_estimator k1", "parse_args", ["KL008", "KL010"]),  # upstream's k1, clamped
    ("--bf16", "parse_args", []),  # argparse: unrecognized arguments: --bf16; nothing trains
    ("--packing", "parse_args", ["KL004", "KL008"]),  # an abbreviation argparse accepts (--packing_samples)
    ("--bf16", "parse_known_args", ["KL004", "KL008"]),  # unknown options are left to the script
])
def test_a_copy_s_command_line_decides_defaults_and_refuses_options_it_lacks(tmp_path, flags, parse, expected):
    """khazic/OpenRLHF_lao (thirty-fourth set) carries OpenRLHF 0.9.6 whose train_ppo_ray defaults --kl_estimator to
    k3 (upstream: k1) and spells the precision --param_dtype: its launches without --kl_estimator put the clamped
    k3 in the rewards (row 7), and those that still pass upstream's --bf16 stop at argparse before any update."""
    (tmp_path / "version.txt").write_text("0.9.6\n")
    (tmp_path / "openrlhf" / "models").mkdir(parents=True)
    (tmp_path / "openrlhf" / "models" / "utils.py").write_text("def compute_reward(r, kl_coef, kl):\n"
                                                              "    return r - kl_coef * kl\n")
    (tmp_path / "openrlhf" / "cli").mkdir()
    (tmp_path / "openrlhf" / "cli" / "train_ppo_ray.py").write_text(_FORK_CLI.format(parse=parse))
    launch = ("ray job submit --address=http://127.0.0.1:8265 -- python3 -m openrlhf.cli.train_ppo_ray \\\n"
              f"    --init_kl_coef 0.01 --rollout_batch_size 1024 --train_batch_size 128 {flags}\n")
    assert launch_codes(tmp_path, launch) == expected


def test_a_command_line_that_computes_option_names_refuses_nothing(tmp_path):
    """Option names computed from what this reading cannot list (`f"--{prefix}.adam.lr"` over a tuple held
    elsewhere): no option counts as one the copy lacks; the defaults it does list still count."""
    module = tmp_path / "train_ppo_ray.py"
    module.write_text(_FORK_CLI.format(parse="parse_args").replace(
        "    args =", '    for prefix in PREFIXES:\n        parser.add_argument(f"--{prefix}.adam.lr")\n    args ='))
    parser = openrlhf.copy_parser(module)
    assert parser is not None and not parser.closed
    assert parser.refuses(["actor.adam.lr", "bf16"]) is None
    assert parser.defaults_of()[openrlhf.ESTIMATOR] == "k3"


def test_option_names_spelled_over_a_literal_tuple_are_listed(tmp_path):
    """OpenRLHF 0.10.2 to 0.11 add `--actor.adam.lr` and its kin in `for prefix in ("actor", "critic"):` with
    `add_argument(f"--{prefix}.adam.lr")`: each spelling is an option, and the command line stays closed."""
    module = tmp_path / "train_ppo_ray.py"
    module.write_text(_FORK_CLI.format(parse="parse_args").replace(
        "    args =", '    for prefix in ("actor", "critic"):\n        parser.add_argument(f"--{prefix}.adam.lr")\n    args ='))
    parser = openrlhf.copy_parser(module)
    assert parser is not None and parser.closed
    assert {"actor.adam.lr", "critic.adam.lr"} <= parser.options
    assert parser.refuses(["actor.adam.lr", "critic.adam.lr"]) is None
    assert parser.refuses(["actor.adam.lr", "bf16"]) == "bf16"


def test_every_release_s_options_are_listed_and_closed():
    """fields/openrlhf_options.txt (scripts/config_fields.py --openrlhf, from the wheels of 0.3.6 to 0.11.2): each
    KL, batch and estimator option this module reads, in its 0.11 and its flat spelling, is one some release takes,
    and every release's train_ppo_ray parses a closed command line."""
    parser = openrlhf.released_parser("openrlhf/cli/train_ppo_ray.py")
    assert parser is not None and parser.closed and parser.merged
    assert parser.refuses(list(openrlhf.FLAGS)) is None
    assert parser.refuses(["init_kl", "max_turn"]) == "max_turn"  # an abbreviation some release may take; none has
    assert openrlhf.released_parser("openrlhf/cli/train_kto.py") is None


@pytest.mark.parametrize("option, expected", [
    ("", ["KL002"]),  # OpenRLHF's clamped k3 as a loss (row 3)
    ("--max_turn 5", []),  # argparse: unrecognized arguments, under every release
    ("--enable_agent_trajectory", []),
    ("--actor.adam.lr 1e-6", ["KL002"]),  # added in a loop over ("actor", "critic")
])
def test_an_installed_release_refuses_an_option_no_release_has(tmp_path, option, expected):
    """tarunbeerelli/RLEF-code (hundred-and-third set) archives OpenRLHF launches that pass `--max_turn 5` or
    `--enable_agent_trajectory`, options of no published release: argparse stops them before anything trains."""
    launch = ("python3 -m openrlhf.cli.train_ppo_ray --rollout.batch_size 128 --train.batch_size 128 --algo.kl.use_loss "
              f"--algo.kl.estimator k3 {option}\n")
    assert launch_codes(tmp_path, launch) == expected


@pytest.mark.parametrize("where, reported, docs", [
    ("RL/examples/scripts/train_ppo_llama_ray.sh", False, ""),  # upstream's launch in the checkout the project carries
    ("RL/examples/script/R1_on_math.sh", True, ""),  # a folder of the project's own in the checkout (concise-reasoning)
    ("examples/step2.sh", True, ""),  # the project's own launch outside the checkout
    # the project's own instructions beside the checkout run it (wangkevin02/USP, fresh100): its run
    ("RL/examples/scripts/train_ppo_llama_ray.sh", True, "cd ./examples/scripts\n./train_ppo_llama_ray.sh\n"),
    # a link names it and runs nothing
    ("RL/examples/scripts/train_ppo_llama_ray.sh", False, "[script](RL/examples/scripts/train_ppo_llama_ray.sh)\n"),
])
def test_a_carried_checkouts_example_launches_are_upstreams(tmp_path, where, reported, docs):
    """WooooDyy/Critique-RL (fresh105) carries OpenRLHF's repository in `RL/` (its own setup.py) with upstream's
    `examples/scripts/train_ppo_llama*.sh`, which the project never runs: their flags are no run of it. USP edited
    one of them and its own notes beside the checkout run it: that one is its run."""
    (tmp_path / "setup.py").write_text("from setuptools import setup\n\nsetup(name='app')\n")
    (tmp_path / "Readme.md").write_text(docs)
    checkout = tmp_path / "RL"
    (checkout / "openrlhf" / "models").mkdir(parents=True)
    (checkout / "setup.py").write_text("from setuptools import setup\n\nsetup(name='openrlhf')\n")
    (checkout / "version.txt").write_text("0.11.2\n")
    (checkout / "openrlhf" / "models" / "utils.py").write_text("def compute_reward(r, kl_coef, kl):\n"
                                                               "    return r - kl_coef * kl\n")
    (checkout / "openrlhf" / "cli").mkdir()
    (checkout / "openrlhf" / "cli" / "train_ppo_ray.py").write_text("import sys\n")
    launch = tmp_path / where
    launch.parent.mkdir(parents=True, exist_ok=True)
    launch.write_text(LAUNCH.format(flags="--algo.kl.use_loss --algo.kl.estimator k3"))
    found = lint_paths([str(tmp_path)], settings=Settings(root=tmp_path), jobs=1).findings
    assert any(f.path.endswith(where.rsplit("/", 1)[-1]) for f in found) is reported


@pytest.mark.parametrize("entry, reported", [
    ("from openrlhf.models import Actor\n", True),  # the project's own entry over OpenRLHF: its flags are judged
    ("import torch\n", False),  # a module that does not build on OpenRLHF: its flags are its own
])
def test_the_projects_own_entry_held_in_a_heredoc_takes_openrlhfs_flags(tmp_path, entry, reported):
    """WooooDyy/Critique-RL (hundred-and-fifth set) writes its command in a heredoc, `read -r -d ''
    training_commands <<EOF` then `train_ppo --max_epochs ${ppo_inner_epochs} ... --init_kl_coef ${init_kl_coef}\\`
    (no space before the continuation), and runs `deepspeed --module $training_commands`: its own `train_ppo.py`, an
    edited copy of OpenRLHF's entry, with OpenRLHF's flags. Two epochs over each rollout train the k1 reward on
    older samples (row 23, KL008), placed where the script sets the epochs; before, neither the launch nor the
    coefficient (read with the backslash) was seen."""
    (tmp_path / "setup.py").write_text("")
    (tmp_path / "train_ppo.py").write_text(entry)
    script = tmp_path / "run.sh"
    script.write_text("init_kl_coef=0.01\nppo_inner_epochs=2\n\nread -r -d '' training_commands <<EOF\ntrain_ppo \\\n"
                      "   --rollout_batch_size 64 --train_batch_size 64 --n_samples_per_prompt 1 \\\n"
                      "   --max_epochs ${ppo_inner_epochs} \\\n   --init_kl_coef ${init_kl_coef}\\\n"
                      "   --save_path out\nEOF\n\ndeepspeed --master_port 39699 --module $training_commands\n")
    found = lint_paths([str(tmp_path)], settings=Settings(root=tmp_path), jobs=1).findings
    assert (("KL008", 2) in {(f.code, f.line) for f in found if f.path.endswith("run.sh")}) is reported
