"""The framework release a lint assumes: pinned in [tool.klaudit], read from the linted code, or the
latest known; and the defaults that change with it (TRL's history, read from its released GRPOConfig:
beta 0.04 up to 0.18, loss_type bnpo from 0.17 and dapo from 0.22, use_bias_correction_kl from 0.26,
default True from 1.10)."""

from __future__ import annotations

import codecs
import json
from pathlib import Path

import libcst as cst
import pytest
from click.testing import CliRunner

from klaudit.cli import main
from klaudit.config import ConfigError, load_settings
from klaudit.frameworks import Context, lint_python, prepare
from klaudit.frameworks.versions import (
    DEFAULT,
    Assumed,
    assumed_versions,
    commit_version,
    detect,
    installed_by_the_file,
)


def trl_codes(call: str, version: str) -> list[str]:
    source = f"from trl import GRPOConfig\n\nargs = {call}\n"
    context = Context({**{n: Assumed(v) for n, v in DEFAULT.items()}, "trl": Assumed(version, "pinned")})
    return sorted(f.code for f in lint_python("train.py", cst.parse_module(source), source, context))


@pytest.mark.parametrize("call, version, expected", [
    ("GRPOConfig()", "0.15", ["KL002", "KL007"]),  # beta 0.04 by default; per-sequence token-mean
    ("GRPOConfig()", "0.16", ["KL002"]),  # the batch's token-mean
    ("GRPOConfig()", "0.18", ["KL002"]),  # loss_type bnpo
    ("GRPOConfig()", "0.19", []),  # beta 0.0 from 0.19
    ("GRPOConfig(beta=0.04)", "0.25", ["KL002"]),  # no bias correction yet: a plain k3 loss
    ("GRPOConfig(beta=0.04)", "1.9", ["KL002"]),  # the correction exists, off by default
    ("GRPOConfig(beta=0.04)", "1.10", ["KL003"]),  # on by default from 1.10: ratio*k3
    ("GRPOConfig(beta=0.04, use_bias_correction_kl=True)", "1.0", ["KL003"]),
])
def test_trl_defaults_follow_the_release(call, version, expected):
    assert trl_codes(call, version) == expected


def test_pins_are_validated_and_a_bad_one_exits_2(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[tool.klaudit]\nframeworks = {trl = "1.9", openrlhf = "0.10.4", '
                                             'tunix = "0.1.5"}\n')
    # tunix is known by patch releases: 0.1.5 has the semantics of 0.1.4 (loss_agg_mode, no kl_loss_mode yet)
    assert load_settings([str(tmp_path)]).frameworks == {"trl": "1.9", "openrlhf": "0.10", "tunix": "0.1.4"}
    for table, error in (('{trl = "2.0"}', "not a release klaudit knows"), ('{deepspeed = "1.0"}', "unknown framework"),
                         ('{tunix = "0.2.0"}', "not a release klaudit knows"),
                         ('"trl"', "must be a table")):
        (tmp_path / "pyproject.toml").write_text(f"[tool.klaudit]\nframeworks = {table}\n")
        with pytest.raises(ConfigError, match=error):
            load_settings([str(tmp_path)])
    (tmp_path / "pyproject.toml").write_text('[tool.klaudit]\nframeworks = {deepspeed = "1.0"}\n')
    (tmp_path / "run.sh").write_text("echo\n")
    result = CliRunner().invoke(main, ["lint", str(tmp_path)])
    assert result.exit_code == 2 and "unknown framework `deepspeed`" in result.output


@pytest.mark.parametrize("requirement, expected", [
    ("trl>=0.15.0,<0.16.0", "0.15"),  # xling-grpo-sub3b (twelfth fresh set)
    ("trl >= 0.14, < 0.20", "0.19"),
    ("trl<=0.17.2", "0.17"),
    ("trl~=0.15.0", "0.15"),  # >=0.15.0, ==0.15.*
    ("trl~=0.15", "0.29"),  # >=0.15, ==0.*: the newest 0.x
    ("trl==0.18.*", "0.18"),
    ("trl>=0.14.0", None),  # a lower bound alone: the default, stated by nothing
    ("trl<0.10", None),  # no known release allowed
    ("google-tunix>=0.1.4,<0.1.7", "0.1.4"),  # tunix by patch releases: 0.1.4 to 0.1.6 judged as 0.1.4
])
def test_a_dependency_bounded_from_above_is_the_newest_release_it_allows(tmp_path, requirement, expected):
    (tmp_path / "requirements.txt").write_text(f"torch\n{requirement}  # the trainer\n")
    found = detect([tmp_path])
    name = "tunix" if "tunix" in requirement else "trl"
    if expected is None:
        assert name not in found
    else:
        assert found[name].version == expected
        assert found[name].source.endswith("in requirements.txt: the newest release it allows")


def test_an_exact_pin_beats_a_bound_and_a_bound_beats_nothing(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\ndependencies = ["trl>=0.15,<0.17"]\n')
    assert detect([tmp_path])["trl"] == Assumed("0.16", "trl>=0.15,<0.17 in pyproject.toml: the newest release it allows")
    (tmp_path / "requirements.txt").write_text("trl==0.15.2\n")
    assert detect([tmp_path])["trl"] == Assumed("0.15", "0.15.2 in requirements.txt")


def test_a_tunix_checkout_states_its_release_under_its_distribution_name(tmp_path):
    """tunix is installed as google-tunix; its checkout's tunix/__init__.py reads the version from metadata."""
    (tmp_path / "tunix").mkdir()
    (tmp_path / "tunix" / "__init__.py").write_text("__version__ = version('google-tunix')\n")
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "google-tunix"\nversion = "0.1.8"\n')
    assert detect([tmp_path])["tunix"] == Assumed("0.1.7", "0.1.8 in pyproject.toml")  # the latest known before it


def test_the_version_is_read_from_the_linted_tree_and_its_pins(tmp_path):
    checkout = tmp_path / "trl-checkout"
    (checkout / "trl").mkdir(parents=True)
    (checkout / "trl" / "__init__.py").write_text("from importlib.metadata import version\n__version__ = version('trl')\n")
    (checkout / "VERSION").write_text("1.10.0.dev0\n")
    (checkout / "pyproject.toml").write_text('[project]\nname = "trl"\ndynamic = ["version"]\n')
    assert detect([checkout / "trl"])["trl"] == Assumed("1.10", "1.10.0.dev0 in VERSION")
    project = tmp_path / "project"
    project.mkdir()
    (project / "requirements.txt").write_text("torch>=2.0\ntrl==0.19.0\nopenrlhf[vllm]==0.9.3\n")
    (project / "pyproject.toml").write_text("[project]\nname = 'mine'\n")
    found = detect([project])
    assert found["trl"] == Assumed("0.19", "0.19.0 in requirements.txt")
    assert found["openrlhf"] == Assumed("0.9", "0.9.3 in requirements.txt")
    (project / "requirements.txt").write_text("trl==0.9.6\n")  # older than any release klaudit knows
    assert detect([project])["trl"].version == "0.14"
    assert assumed_versions({"trl": "1.16"}, [project])["trl"] == Assumed("1.16", "pinned")
    assert assumed_versions({}, [tmp_path / "elsewhere"])["verl"] == Assumed(DEFAULT["verl"])


def test_several_requirements_on_one_line_of_setup_py_are_each_read(tmp_path):
    """`install_requires=["torch>=2", "trl==0.16.0"]` on one line: the pin is an item of the list, not the
    start of a line. A name that only ends like a framework's (`mytrl==1.0`) pins nothing."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "setup.py").write_text('setup(name="x", install_requires=["torch>=2", "trl==0.16.0"])\n')
    assert detect([project])["trl"] == Assumed("0.16", "0.16.0 in setup.py")
    (project / "setup.py").write_text('setup(name="x", install_requires=["torch>=2", "mytrl==1.0"])\n')
    assert "trl" not in detect([project])
    (project / "setup.py").write_text(
        'setup(install_requires=["trl @ git+https://github.com/huggingface/trl.git@1bca49515ecd5b85d16e68c42c76670e252e19f1"])\n')
    assert detect([project])["trl"].source.startswith("0.18.0.dev0 at commit 1bca49515e in setup.py")


def test_a_dockerfile_that_pip_installs_a_pinned_release_states_it(tmp_path):
    """financial-grpo (fifteenth set) installs `trl==0.16.1 --no-dependencies` in its Dockerfile, over a
    continued line; a commented-out install says nothing, and a requirements file's pin comes first."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "Dockerfile").write_text("FROM rocm/pytorch\n# RUN pip install trl==0.14.0\n"
                                        "RUN pip install deepspeed==0.16.4 \\\n    'trl==0.16.1' --no-dependencies\n")
    assert detect([project])["trl"] == Assumed("0.16", "0.16.1 in Dockerfile")
    (project / "requirements.txt").write_text("trl==0.19.0\n")
    assert detect([project])["trl"] == Assumed("0.19", "0.19.0 in requirements.txt")


def test_a_lock_file_gives_the_resolved_release_where_the_requirement_is_a_range(tmp_path):
    """bradhilton/rl-experiments asks for `trl>=0.15.2` in pyproject.toml and uv.lock resolves 0.15.2:
    the lock decides (beta 0.04 by default there), not the latest release. An exact pin still comes first."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "pyproject.toml").write_text("[project]\nname = 'mine'\ndependencies = ['trl>=0.15.2']\n")
    (project / "uv.lock").write_text('version = 1\n\n[[package]]\nname = "trl"\nversion = "0.15.2"\n'
                                     'source = { registry = "https://pypi.org/simple" }\n')
    assert detect([project])["trl"] == Assumed("0.15", "0.15.2 in uv.lock")
    (project / "requirements.txt").write_text("trl==0.19.0\n")
    assert detect([project])["trl"] == Assumed("0.19", "0.19.0 in requirements.txt")


def test_a_git_tag_is_a_release_and_a_git_commit_is_the_version_it_states(tmp_path):
    """HAPO and audio-long-form-reasoner (tenth and ninth sets) pin TRL at a commit of its main branch: the
    version file there says 0.18.0.dev0 (klaudit/frameworks/commits/trl.txt, checked against TRL's history
    on 2026-11-29: 1bca495 is 2025-04-26, between 0.17 and 0.18), so both releases are judged. A commit the
    table lacks names no release: the latest known is assumed and every flag finding says why; a tag names
    its release; a branch (`@main`) says nothing."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "pyproject.toml").write_text("[project]\nname = 'mine'\n")
    requirements = project / "requirements.txt"
    requirements.write_text("trl[vllm] @ git+https://github.com/huggingface/trl.git@v0.16.0\n")
    assert detect([project])["trl"] == Assumed("0.16", "0.16.0 in requirements.txt (git tag v0.16.0)")
    requirements.write_text("trl @ git+https://github.com/huggingface/trl.git@main\n")
    assert "trl" not in detect([project])
    setup = 'deps = [\n    "trl @ git+https://github.com/huggingface/trl.git@{}",  # a fix\n]\n'
    (project / "setup.py").write_text(setup.format("1bca49515ecd5b85d16e68c42c76670e252e19f1"))
    assumed = detect([project])["trl"]
    assert (assumed.version, assumed.earlier, assumed.stated) == ("0.18", "0.17", True)
    assert assumed.label("trl") == ("trl 0.18 (0.18.0.dev0 at commit 1bca49515e in setup.py, "
                                    "between 0.17 and 0.18: what both agree on)")
    (project / "setup.py").write_text(setup.format("c04e84c"))  # a short hash
    assert detect([project])["trl"].earlier == "0.16"
    (project / "setup.py").write_text(setup.format("0123456789abcdef0123456789abcdef01234567"))  # not TRL's
    assumed = detect([project])["trl"]
    assert (assumed.version, assumed.stated) == (DEFAULT["trl"], False)
    assert assumed.source.startswith("setup.py pins trl at a git commit klaudit cannot place")
    assert 'frameworks = {trl = "..."}' in assumed.label("trl")


@pytest.mark.parametrize("commit, expected", [
    ("69ad852e5654a77f1695eb4c608906fe0c7e8624", "0.16.0.dev0"),  # 2025-02-25
    ("c04e84c4545acfaecdf7e0631ad07a86ab0fb2f6", "0.17.0.dev0"),  # 2025-04-15
    ("1BCA495", "0.18.0.dev0"),
    ("abcdef0", None),
])
def test_the_commit_table_gives_the_version_each_commit_states(commit, expected):
    """Read by hand from trl/__init__.py at each commit of TRL's repository (git show COMMIT:trl/__init__.py)."""
    assert commit_version("trl", commit) == expected


@pytest.mark.parametrize("commit, expected", [
    # older than 0.7, the oldest known: verl's table keeps these too, each with the version it states
    ("483fa8ac76fc4d149feeff4368d380a93e4246be", "0.1"),  # 2025-02-04, HKUNLP/critic-rl's pin
    ("0a1b16f800c2", "0.2.0.dev"),  # 2025-02-20: "bump up version to v0.2.0.dev"
    # the development of known releases
    ("55f651c94de75a1efcde8e14d079a0e70841a516", "0.7.0.dev"),  # 2025-10-15: "bump version to 0.7.0.dev"
    ("0a34822", "0.8.0.dev"),  # 2026-01-21: "update version in the main branch", after 0.7.0
])
def test_the_verl_commit_table_gives_the_version_each_commit_states(commit, expected):
    """Read by hand from verl's repository (git show COMMIT:verl/version/version, on its main branch)."""
    assert commit_version("verl", commit) == expected


def test_a_bare_git_url_of_verl_at_an_older_commit_is_judged_by_the_oldest_known_release(tmp_path):
    """HKUNLP/critic-rl's requirements.txt names verl by its URL alone, at 483fa8a, whose verl/version/version
    says 0.1: older than every known release, so judged by 0.7 and said to be older."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "pyproject.toml").write_text("[project]\nname = 'mine'\n")
    (project / "requirements.txt").write_text(
        "deepspeed==0.15.0\ngit+https://github.com/volcengine/verl.git@483fa8ac76fc4d149feeff4368d380a93e4246be\n")
    assumed = detect([project])["verl"]
    assert (assumed.version, assumed.older, assumed.stated) == ("0.7", True, True)
    assert assumed.label("verl") == ("verl 0.7 (0.1 at commit 483fa8ac76 in requirements.txt; older than 0.7, "
                                     "judged by 0.7's flags)")
    (project / "requirements.txt").write_text("git+https://github.com/volcengine/verl.git@55f651c94de7\n")
    assert detect([project])["verl"] == Assumed("0.7", "0.7.0.dev at commit 55f651c94d in requirements.txt")
    (project / "requirements.txt").write_text("git+https://github.com/someone/verl-fork.git@483fa8ac76fc\n")
    assert "verl" not in detect([project])  # another repository's commit


@pytest.mark.parametrize("commit, between, expected", [
    # 0.16.0.dev0, between 0.15 and 0.16: beta=0.04 adds the k3 loss in both (KL002, kl-math.md §8 row 3); 0.15
    # averages each sequence's tokens (KL007, row 21) where 0.16 takes the batch's token-mean: not reported
    ("69ad852e5654", "0.15 and 0.16", ["KL002"]),
    # 1.10.0.dev0, between 1.9 and 1.10: 1.10 weights k3 by the ratio by default (KL003, row 2), 1.9 does not
    # (KL002); TRL's grpo_config.py at 8db673e40d (2026-07-21) still defaults use_bias_correction_kl=False, so
    # judging the commit as 1.10 would have been wrong: the releases disagree and nothing is reported
    ("8db673e40d", "1.9 and 1.10", []),
])
def test_a_development_state_is_reported_only_where_both_releases_agree(tmp_path, commit, between, expected):
    (tmp_path / "requirements.txt").write_text(f"trl @ git+https://github.com/huggingface/trl.git@{commit}\n")
    source = "from trl import GRPOConfig\n\nargs = GRPOConfig(beta=0.04)\n"
    context = prepare({}, [tmp_path], {"train.py": source})
    assert f"between {between}" in context.versions["trl"].source
    found = lint_python(str(tmp_path / "train.py"), cst.parse_module(source), source, context)
    assert [f.code for f in found] == expected
    assert all(f"between {between}" in f.message for f in found)


def test_a_checkout_s_own_grpoconfig_defaults_decide(tmp_path):
    """Linting a TRL tree whose GRPOConfig defaults use_bias_correction_kl=False (a 1.10 dev snapshot):
    its calls are judged by that default, not by the release's."""
    config = ("from dataclasses import dataclass, field\n\n\n@dataclass\nclass GRPOConfig(TrainingArguments):\n"
              "    beta: float = field(default=0.0)\n    use_bias_correction_kl: bool = field(default=False)\n")
    test = "from trl import GRPOConfig\n\nargs = GRPOConfig(beta=0.1)\n"
    context = prepare({}, [tmp_path], {"trl/trainer/grpo_config.py": config, "tests/test_grpo.py": test})
    [finding] = lint_python("tests/test_grpo.py", cst.parse_module(test), test, context)
    assert finding.code == "KL002"
    assert "defaults of GRPOConfig in trl/trainer/grpo_config.py" in finding.message
    assert lint_python("trl/trainer/grpo_config.py", cst.parse_module(config), config, context) == []


CHECKOUT_CONFIG = ("from dataclasses import dataclass, field\n\n\n@dataclass\nclass GRPOConfig(TrainingArguments):\n"
                   "    beta: float = field(default=0.04)\n")


def test_a_call_of_a_checked_in_trl_s_grpoconfig_that_sets_no_kl_key_trains_its_default_beta(tmp_path):
    """A project carrying TRL 0.17 (beta 0.04 by default): `GRPOConfig(output_dir=...)` in its tests trains the k3
    loss (row 3, KL002). Only a class of the project's own, whose body sets a key, is judged at its definition
    instead; TRL's own GRPOConfig is no such class."""
    test = ("import unittest\nfrom trl import GRPOConfig\n\n\nclass T(unittest.TestCase):\n"
            "    def test_training(self):\n        args = GRPOConfig(output_dir='out', learning_rate=0.1)\n\n"
            "    @unittest.skip('needs a vLLM server')\n    def test_vllm(self):\n"
            "        args = GRPOConfig(output_dir='out')\n")
    (tmp_path / "trl").mkdir()
    (tmp_path / "trl" / "__init__.py").write_text('__version__ = "0.17.0"\n')
    context = prepare({}, [tmp_path], {"trl/trainer/grpo_config.py": CHECKOUT_CONFIG, "tests/test_grpo.py": test})
    found = lint_python("tests/test_grpo.py", cst.parse_module(test), test, context)
    assert [(f.line, f.code) for f in found] == [(7, "KL002")]  # the skipped test builds a config nothing trains


def test_trl_s_own_default_config_beside_its_grpoconfig_is_not_a_user_s(tmp_path):
    """GRPOTrainer builds `GRPOConfig(f"{model_name}-GRPO")` when given no args: the trainer's loss is where the
    checkout's KL is reported, not this default."""
    trainer = "from .grpo_config import GRPOConfig\n\n\ndef build(args, name):\n    return args or GRPOConfig(f'{name}-GRPO')\n"
    context = prepare({}, [tmp_path], {"trl/trainer/grpo_config.py": CHECKOUT_CONFIG,
                                       "trl/trainer/grpo_trainer.py": trainer})
    assert lint_python("trl/trainer/grpo_trainer.py", cst.parse_module(trainer), trainer, context) == []


def test_a_framework_vendored_beside_its_launch_scripts_decides_for_them(tmp_path):
    """R1-Searcher keeps OpenRLHF 0.5 in OpenRLHF-RAG/ with the scripts that launch it: their k1 reward
    is unclamped there (no KL010), and the policy loss that carries it is each response's token mean (row 21,
    KL007); a script outside it gets the run's release (0.10 for the flat option names, whose clamp at ±10
    makes the k1 reward KL010). A pin still wins. Both keep OpenRLHF's default batch sizes, several updates
    per rollout: the reward meets only the PPO token ratio (row 23, KL008)."""
    from klaudit.frameworks import lint_config

    vendored = tmp_path / "OpenRLHF-RAG"
    (vendored / "openrlhf").mkdir(parents=True)
    (vendored / "openrlhf" / "__init__.py").write_text("")
    (vendored / "version.txt").write_text("0.5.5.post2\n")
    (vendored / "setup.py").write_text("from setuptools import setup\nsetup(name='openrlhf')\n")
    launch = "python3 -m openrlhf.cli.train_ppo_ray --init_kl_coef 0.01 --advantage_estimator gae\n"
    inside, outside = vendored / "run.sh", tmp_path / "run.sh"
    for script in (inside, outside):
        script.write_text(launch)
    context = prepare({}, [tmp_path], {})
    assert sorted(f.code for f in lint_config(str(inside), launch, context)) == ["KL007", "KL008"]
    assert sorted(f.code for f in lint_config(str(outside), launch, context)) == ["KL008", "KL010"]
    pinned = prepare({"openrlhf": "0.11"}, [tmp_path], {})
    assert sorted(f.code for f in lint_config(str(inside), launch, pinned)) == ["KL008", "KL010"]


def test_a_notebook_that_installs_a_pinned_release_is_read_with_it(tmp_path):
    """philschmid's mini-deepseek-r1 notebook installs trl==0.14.0 in a %pip cell carried over backslashes:
    there GRPOConfig(beta=0.04) is a plain k3 loss (row 3, KL002) averaged per sequence (row 21, KL007); with
    no pin, TRL 1.16's default bias correction makes it ratio*k3 (row 2's local gradient, KL003)."""
    import json

    from klaudit.config import Settings
    from klaudit.lint.engine import lint_paths

    def cells(*sources: str) -> str:
        return json.dumps({"cells": [{"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
                                      "source": source.splitlines(keepends=True)} for source in sources],
                           "metadata": {}, "nbformat": 4, "nbformat_minor": 5})

    config = 'from trl import GRPOConfig\nargs = GRPOConfig(output_dir="out", beta=0.04)\n'
    install = '%pip install --upgrade \\\n  "transformers==4.48.1" \\\n  "trl==0.14.0"\n'
    (tmp_path / "pinned.ipynb").write_text(cells(install, config))
    (tmp_path / "latest.ipynb").write_text(cells("%pip install trl\n", config))
    found = lint_paths([str(tmp_path)], settings=Settings(root=tmp_path), jobs=1).findings
    codes = {name: sorted(f.code for f in found if f.path.endswith(name)) for name in ("pinned.ipynb", "latest.ipynb")}
    assert codes == {"pinned.ipynb": ["KL002", "KL007"], "latest.ipynb": ["KL003"]}
    assert any("0.14.0 in the notebook's pip install" in f.message for f in found)


def test_a_notebook_exported_as_a_script_keeps_its_pinned_release(tmp_path):
    """Unsloth's notebooks ship as scripts too (`jupyter nbconvert --to script`): the pip cell becomes a
    `get_ipython().run_cell_magic(...)` string, where trl==0.14.0 still decides GRPOConfig(beta=0.04)'s
    verdict (a plain k3 loss per sequence, rows 3 and 21: KL002, KL007; TRL 1.16's default: KL003)."""
    from klaudit.config import Settings
    from klaudit.lint.engine import lint_paths

    config = 'from trl import GRPOConfig\nargs = GRPOConfig(output_dir="out", beta=0.04)\n'
    magic = ("get_ipython().run_cell_magic('capture', '', '!pip install -qqq \\\\\\n"
             "    \"unsloth\" trl==0.14.0 vllm\\n')\n")
    (tmp_path / "pinned_export.py").write_text(magic + config)
    (tmp_path / "plain.py").write_text("# pip install trl==0.14.0 (a comment, not a cell)\n" + config)
    found = lint_paths([str(tmp_path)], settings=Settings(root=tmp_path), jobs=1).findings
    codes = {name: sorted(f.code for f in found if f.path.endswith(name)) for name in ("pinned_export.py", "plain.py")}
    assert codes == {"pinned_export.py": ["KL002", "KL007"], "plain.py": ["KL003"]}



def test_each_linted_root_keeps_its_own_release(tmp_path):
    """Two projects linted in one run (files, as a pre-commit hook passes them): a pin in one project's
    requirements is not the other's release (TRL 0.16's plain k3 there, the latest's ratio*k3 here)."""
    from klaudit.lint.engine import lint_paths

    for project in ("pinned", "unpinned"):
        (tmp_path / project).mkdir()
        (tmp_path / project / "train.py").write_text("from trl import GRPOConfig\n\nargs = GRPOConfig(beta=0.1)\n")
    (tmp_path / "pinned" / "requirements.txt").write_text("trl==0.16.1\n")
    found = lint_paths([str(tmp_path / "pinned" / "train.py"), str(tmp_path / "unpinned" / "train.py")]).findings
    codes = {project: sorted(f.code for f in found if f"/{project}/" in f.path) for project in ("pinned", "unpinned")}
    assert codes == {"pinned": ["KL002"], "unpinned": ["KL003"]}


def test_a_release_older_than_every_known_one_says_it_is_judged_by_the_oldest():
    """TinyZero's verl states 0.1: its findings name 0.8, whose flags they read, and say why."""
    assert Assumed("0.8", "0.1 in verl/version/version", older=True).label("verl") == (
        "verl 0.8 (0.1 in verl/version/version; older than 0.8, judged by 0.8's flags)")
    assert Assumed("0.9", "0.9.1 in verl/version/version").label("verl") == "verl 0.9 (0.9.1 in verl/version/version)"


@pytest.mark.parametrize("mark, encoding", [(codecs.BOM_UTF16_LE, "utf-16-le"), (codecs.BOM_UTF16_BE, "utf-16-be"),
                                            (codecs.BOM_UTF32_LE, "utf-32-le"), (codecs.BOM_UTF8, "utf-8")],
                         ids=["utf-16-le", "utf-16-be", "utf-32-le", "utf-8"])
def test_a_requirements_file_with_a_byte_order_mark_is_read_as_pip_reads_it(tmp_path, mark, encoding):
    """Windows PowerShell's `pip freeze > requirements.txt` writes UTF-16 with a byte-order mark (alexchilton's
    Wordle GRPO, twenty-seventh set, pins trl==0.26.2 so); pip decodes it by the mark, and so does the lint."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "requirements.txt").write_bytes(mark + "accelerate==1.2.0\r\ntrl==0.26.2\r\n".encode(encoding))
    assert detect([project])["trl"] == Assumed("0.26", "0.26.2 in requirements.txt")


def test_a_launch_script_saved_as_utf16_is_linted_for_its_flags(tmp_path):
    """A byte-order mark names the encoding of a launch script too: its verl flags are read, not mojibake."""
    script = "python3 -m verl.trainer.main_ppo actor_rollout_ref.actor.use_kl_loss=True \\\n" \
             "    actor_rollout_ref.actor.kl_loss_type=k1\n"
    (tmp_path / "run.sh").write_text(script, encoding="utf-16")
    (tmp_path / "plain.sh").write_text(script, encoding="utf-8")
    result = CliRunner().invoke(main, ["lint", "--output-format", "json", "--exit-zero", str(tmp_path)])
    found = {(Path(f["filename"]).name, f["code"]) for f in json.loads(result.output)}
    assert {("run.sh", "KL001"), ("plain.sh", "KL001")} <= found


def test_a_setup_script_that_installs_a_pinned_release_states_it(tmp_path):
    """maleshep/llm-training (thirty-second set) installs `"trl==1.3.0"` with `uv add` or `python3 -m pip install`
    in setup_training_env.sh, whose TRL takes `use_bias_correction_kl=False` by default (plain k3: KL002, not
    KL003); a launch script's install says nothing about the project's dependencies."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "run_grpo.sh").write_text("pip install trl==0.14.0\npython train.py\n")
    assert "trl" not in detect([project])
    (project / "setup_training_env.sh").write_text(
        'if command -v uv; then\n    uv add \\\n        "torch>=2.9" \\\n        "trl==1.3.0" \\\n        "peft>=0.15"\n'
        'else\n    python3 -m pip install \\\n        "trl==1.3.0"\nfi\n')
    assert detect([project])["trl"] == Assumed("1.3", "1.3.0 in setup_training_env.sh")


@pytest.mark.parametrize("listed, expected", [
    ("  - pip:\n      - trl==0.17.0\n      - torch>=2.5\n", Assumed("0.17", "0.17.0 in environment.yml")),
    ("  - trl=0.17.0  # conda-forge's build\n", Assumed("0.17", "0.17.0 in environment.yml")),
    ("  - pip:\n      - trl>=0.17.0\n", None),  # a lower bound says nothing the default does not
])
def test_a_conda_environment_file_states_a_pinned_release(tmp_path, listed, expected):
    """0xSingletOnly/LiMing (thirty-fourth set) pins trl==0.17.0 in the `pip:` list of its conda environment.yml,
    the environment its notebook ran in: TRL 0.17's loss, not the newest release's."""
    (tmp_path / "environment.yml").write_text("name: research\nchannels:\n  - conda-forge\ndependencies:\n"
                                              "  - python=3.11\n" + listed)
    assert detect([tmp_path]).get("trl") == expected


@pytest.mark.parametrize("header, expected", [
    ("# platform: linux-64\n", Assumed("0.15", "0.15.1 in requirements.txt")),
    ("", None),  # without conda's header, `name=version` is no requirement pip reads
])
def test_a_conda_export_saved_as_requirements_states_the_release(tmp_path, header, expected):
    """bbirdxr/GRPO-Qwen2.5-7B-Medicine (fifty-fifth set) saves `conda list --export` as requirements.txt:
    `trl=0.15.1=pypi_0` is TRL 0.15.1, whose GRPO loss averages each completion over its own tokens (KL007 beside
    KL002), not the default release's."""
    (tmp_path / "requirements.txt").write_text(
        "# This file may be used to create an environment using:\n# $ conda create --name <env> --file <this file>\n"
        + header + "_libgcc_mutex=0.1=main\ntransformers=4.48.3=pypi_0\ntrl=0.15.1=pypi_0\n")
    assert detect([tmp_path]).get("trl") == expected


@pytest.mark.parametrize("listed, expected", [
    # TRL 0.18 needs transformers 4.50, so 4.46.0 installs TRL 0.17 at the newest (Requires-Dist of the wheels)
    ("transformers==4.46.0\ntrl\n", Assumed("0.17", "transformers==4.46.0 beside trl in requirements.txt: the "
                                                 "newest release that installs with it")),
    ("transformers==4.51.3\ntrl>=0.14.0\n", Assumed("0.19", "transformers==4.51.3 beside trl in requirements.txt: "
                                                         "the newest release that installs with it")),
    # below TRL 0.14's floor: a release older than GRPOTrainer, judged as the oldest known (it trains no GRPO)
    ("transformers==4.45.0\ntrl>=0.9.0\n", Assumed("0.14", "transformers==4.45.0 beside trl in requirements.txt: a "
                                                        "release older than every known one installs with it",
                                                        older=True)),
    ("transformers==4.57.0\ntrl\n", None),  # every release installs with it: the default's
    ("transformers==4.50.0\ntrl>=0.19\n", None),  # no release allows both: nothing is said
    ("transformers==4.46.0\n", None),  # TRL installed apart: pip upgrades transformers to what TRL needs
])
def test_a_transformers_pin_beside_trl_caps_the_release_pip_resolves(tmp_path, listed, expected):
    """saikiranrallabandi/inframind (fifty-fifth set) lists `transformers==4.45.0` and `trl>=0.9.0` together: pip
    resolves them at once and cannot install a TRL that needs a newer transformers."""
    (tmp_path / "requirements.txt").write_text(listed)
    assert detect([tmp_path]).get("trl") == expected


@pytest.mark.parametrize("installs, expected", [
    ('"torch", "transformers==4.46.0", "trl>=0.12.0"', Assumed(
        "0.17", "transformers==4.46.0 beside trl in the image's pip_install: the newest release that installs with it")),
    ('"transformers==4.57.3",\n        "trl==0.26.2",', Assumed("0.26", "0.26.2 in the image's pip_install")),
    ('"transformers", "trl"', None),  # nothing pinned: the project's files decide
])
def test_a_script_s_modal_image_states_the_release_it_runs(tmp_path, installs, expected):
    """saikiranrallabandi/inframind (fifty-fifth set) runs grpo_training.py on Modal in an image the script builds
    itself (`pip_install("transformers==4.46.0", ..., "trl>=0.12.0")`): TRL 0.17 there, whose GRPO loss is plain k3
    (KL002), not TRL 1.16's ratio * k3 (KL003), whatever the project's requirements.txt says."""
    script = tmp_path / "grpo_training.py"
    script.write_text("import modal\n\nimage = (\n    modal.Image.debian_slim()\n    .pip_install(\n        "
                      + installs + "\n    )\n)\n")
    assert installed_by_the_file(str(script)).get("trl") == expected


def test_a_readme_s_pinned_pip_install_states_the_release_where_no_file_of_the_code_does(tmp_path):
    """wangyu0627/MLLMRec-R1 (fifty-first set) has no requirements file; its README installs `trl==0.26.2`, whose
    use_bias_correction_kl defaults to False: GRPOConfig(beta=0.1) is plain k3 as a loss (KL002), not TRL 1.10's
    ratio * k3 (KL003). A dependency file's pin comes first, and Markdown files that disagree state nothing."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "README.md").write_text("# Setup\n\n```bash\npip install transformers==4.57.3 trl==0.26.2 peft\n```\n")
    assert detect([project])["trl"] == Assumed("0.26", "0.26.2 in the pip install of README.md")
    (project / "train.py").write_text("from trl import GRPOConfig\n\nargs = GRPOConfig(beta=0.1)\n")
    result = CliRunner().invoke(main, ["lint", "--output-format", "json", "--exit-zero", str(project)])
    assert [finding["code"] for finding in json.loads(result.output)] == ["KL002"]
    (project / "INSTALL.md").write_text("pip install trl==1.12.0\n")
    assert "trl" not in detect([project])
    (project / "requirements.txt").write_text("trl==0.19.0\n")
    assert detect([project])["trl"] == Assumed("0.19", "0.19.0 in requirements.txt")


def test_the_packages_of_a_logged_run_state_the_release_where_no_file_of_the_code_does(tmp_path):
    """innocentbai/Reason4Rec-GRPO (ninety-second set) asks an unpinned trl, but commits the Weights & Biases folder of
    its training run, whose `files/requirements.txt` is that environment's `pip freeze` with trl==0.19.0: plain k3
    as a loss there (KL002), not the newest TRL's ratio * k3 (KL003). The newest run decides; a pin the project
    declares comes first."""
    project = tmp_path / "project"
    for run, version in (("offline-run-20250613_212206-i2iy2r9c", "0.19.0"), ("run-20250401_090000-abc123", "0.16.0")):
        (project / "wandb" / run / "files").mkdir(parents=True)
        (project / "wandb" / run / "files" / "requirements.txt").write_text(f"torch==2.6.0\ntrl=={version}\n")
    (project / "requirements.txt").write_text("trl\ntorch\n")
    where = "wandb/offline-run-20250613_212206-i2iy2r9c/files/requirements.txt"
    assert detect([project])["trl"] == Assumed("0.19", f"0.19.0 in {where}, the packages of a logged run")
    (project / "train.py").write_text("from trl import GRPOConfig\n\nargs = GRPOConfig(beta=0.1)\n")
    result = CliRunner().invoke(main, ["lint", "--output-format", "json", "--exit-zero", str(project)])
    assert [finding["code"] for finding in json.loads(result.output)] == ["KL002"]
    (project / "requirements.txt").write_text("trl==0.26.2\n")
    assert detect([project])["trl"].version == "0.26"


def test_a_requirements_lock_pins_the_release(tmp_path):
    """minstar/BIOAgents (seventy-first set) pins trl==0.28.0 in the requirements.lock rye wrote (pyproject asks
    trl>=0.8): TRL 0.28's plain k3 as a loss (KL002), not the newest TRL's ratio * k3."""
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "bio"\ndependencies = ["trl>=0.8"]\n')
    (tmp_path / "requirements.lock").write_text("# generated by rye\ntorch==2.6.0\ntrl==0.28.0\n")
    assert detect([tmp_path])["trl"] == Assumed("0.28", "0.28.0 in requirements.lock")


def test_a_requirements_file_named_for_the_script_decides_where_the_projects_disagree(tmp_path):
    """zyhnosleep/qwen-project (seventy-sixth set) pins trl==0.11.4 in requirements.txt for its PPO scripts and
    trl==0.15.2 in requirements_grpo.txt for qwen_grpo.py: that script runs 0.15 (GRPOConfig exists; a plain k3 with
    each completion's token mean), not 0.11, where it would not even import."""
    from klaudit.frameworks.versions import named_requirements_pin

    (tmp_path / "pyproject.toml").write_text("")
    (tmp_path / "requirements.txt").write_text("torch\ntrl==0.11.4\n")
    (tmp_path / "requirements_grpo.txt").write_text("trl==0.15.2\nvllm\n")
    assert named_requirements_pin("trl", tmp_path / "qwen_grpo.py").version == "0.15"
    assert named_requirements_pin("trl", tmp_path / "qwen_ppo.py") is None  # no file named for it: the usual order
    (tmp_path / "requirements_grpo.txt").write_text("trl==0.11.4\n")
    assert named_requirements_pin("trl", tmp_path / "qwen_grpo.py") is None  # the files agree: nothing to decide
    nested = tmp_path / "scripts" / "qwen_grpo.py"
    nested.parent.mkdir()
    (tmp_path / "requirements_grpo.txt").write_text("trl==0.15.2\n")
    assert named_requirements_pin("trl", nested).version == "0.15"  # the nearest folder that holds some


def _openrlhf_copy(folder: Path) -> None:
    (folder / "openrlhf" / "cli").mkdir(parents=True)
    (folder / "openrlhf" / "__init__.py").write_text("")
    (folder / "openrlhf" / "cli" / "train_ppo_ray.py").write_text("")
    (folder / "version.txt").write_text("0.5.5.post2\n")
    (folder / "setup.py").write_text("from setuptools import setup\nsetup(name='openrlhf')\n")


@pytest.mark.parametrize("copies, codes", [
    (["training/OpenRLHF"], ["KL007", "KL008"]),  # the project's one copy, installed from two folders down: 0.5
    (["training/OpenRLHF", "baselines/OpenRLHF"], ["KL008", "KL010"]),  # two: which one runs is not known
])
def test_the_one_copy_two_folders_below_the_root_is_the_one_a_root_launch_runs(tmp_path, copies, codes):
    """peer0/TruthRL-personalized- (fresh103) keeps verl in training/verl/, installs it with `pip install -e .` there,
    and launches `python3 -m verl.trainer.main_ppo` from the root: the launch runs that copy's release."""
    from klaudit.frameworks import lint_config

    for copy in copies:
        _openrlhf_copy(tmp_path / copy)
    launch = "python3 -m openrlhf.cli.train_ppo_ray --init_kl_coef 0.01 --advantage_estimator gae\n"
    (tmp_path / "run.sh").write_text(launch)
    context = prepare({}, [tmp_path], {})
    assert sorted(f.code for f in lint_config(str(tmp_path / "run.sh"), launch, context)) == codes
