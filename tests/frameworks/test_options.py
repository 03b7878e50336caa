"""A framework keyword set from an option of the project's, or from a parameter of the enclosing
function, is judged at that option's default (klaudit.frameworks.options): TRL adds beta * k3 to the
loss whenever beta != 0 (kl-math.md §8, row 3), so `GRPOConfig(beta=args.beta)` with `--beta`
defaulting to 0.04 trains with the k3 loss unless the run passes another value."""

from __future__ import annotations

from pathlib import Path

import pytest

from klaudit.config import Settings
from klaudit.frameworks.options import Default, option_defaults, resolve
from klaudit.lint.engine import lint_paths

ARGPARSE = '''\
parser.add_argument("--beta", type=float, default=0.04,
                    help="KL coefficient (see the paper)")
parser.add_argument("-n", "--num-iterations", type=int, default=1_000)
parser.add_argument("--loss_type", default='grpo')
parser.add_argument("--lr", type=float, default=float("1e-6"))  # computed: no default
parser.add_argument("--seed", type=int)
'''
DATACLASS = '''\
from dataclasses import dataclass, field

@dataclass
class ScriptArguments:
    kl_coef: float = field(default=0.05, metadata={"help": "x"})
    ref_name: str = "base"
    beta: float = 0.04
    required: float
    gradient_accumulation_steps: Optional[int] = field(
        default=4, metadata={"help": "the number of gradient accumulation steps"}
    )
'''


def test_option_defaults_are_read_from_argparse_and_dataclasses():
    options = option_defaults({"run.py": ARGPARSE, "args.py": DATACLASS})
    found = {name: options.default(name, "train.py") for name in
             ("beta", "num_iterations", "loss_type", "kl_coef", "ref_name", "lr", "seed", "required",
              "gradient_accumulation_steps")}
    assert {name: default and default.value for name, default in found.items()} == {
        "beta": "0.04",  # the same in both files
        "num_iterations": "1000", "loss_type": "grpo", "kl_coef": "0.05", "ref_name": "base",
        "lr": None, "seed": None, "required": None,  # computed, absent, no default
        "gradient_accumulation_steps": "4"}  # a field call written over several lines
    assert found["kl_coef"].origin == "args.py:5" and found["num_iterations"].origin == "run.py:3"



PYDANTIC = '''\
from pydantic import BaseModel, Field

class GRPOCfg(BaseModel):
    beta_kl: float = Field(default=0.04, ge=0.0, le=1.0)  # KL penalty coefficient
    num_generations: int = Field(8, ge=2)
    max_prompts: int = Field(default=30_000, ge=100)
    tags: list = Field(default_factory=list)
'''


def test_option_defaults_are_read_from_pydantic_fields():
    """jiaqianjing/cpt-sft-grpo-med-zh (seventy-third set) declares `beta_kl: float = Field(default=0.04, ge=0.0,
    le=1.0)` in a pydantic schema and trains `GRPOConfig(beta=cfg.grpo.beta_kl)`: the field's default, given by
    keyword or first by position, is the option's, as a dataclass field's is."""
    options = option_defaults({"schema.py": PYDANTIC})
    found = {name: options.default(name, "train.py") for name in ("beta_kl", "num_generations", "max_prompts", "tags")}
    assert {name: default and default.value for name, default in found.items()} == {
        "beta_kl": "0.04", "num_generations": "8", "max_prompts": "30000", "tags": None}


def _default_values(script: str, names) -> dict[str, str | None]:
    """The default of each option `names` for a configuration built in the script `script` (train_grpo.py)."""
    options = option_defaults({"train_grpo.py": script})
    return {name: (default := options.default(name, "train_grpo.py")) and default.value for name in names}


def test_an_option_defaulting_to_a_module_constant_takes_the_constant():
    """RAFE_NLP_assest_management (fresh63) gathers its settings at the top of train_grpo.py (`BETA = 0.02`) and
    gives them to its parser (`default=BETA`): a run that leaves --beta alone trains at 0.02. A name bound twice,
    declared `global`, bound to a computed value or only inside a function has no known value."""
    script = (
        "BETA = 0.02  # KL weight\n"
        "EPOCHS: int = 3\n"
        "LR = float('1e-6')\n"
        "TWICE = 1\n"
        "TWICE = 2\n"
        "def setup():\n"
        "    global SHIFTED\n"
        "    SHIFTED = 0.5\n"
        "    LOCAL = 4\n"
        "SHIFTED = 0.1\n"
        "def parser():\n"
        "    p.add_argument('--beta', type=float, default=BETA)\n"
        "    p.add_argument('--epochs', type=int, default=EPOCHS, help='passes')\n"
        "    p.add_argument('--lr', type=float, default=LR)\n"
        "    p.add_argument('--twice', default=TWICE)\n"
        "    p.add_argument('--shifted', default=SHIFTED)\n"
        "    p.add_argument('--local', default=LOCAL)\n"
    )
    found = _default_values(script, ("beta", "epochs", "lr", "twice", "shifted", "local"))
    assert found == {"beta": "0.02", "epochs": "3", "lr": None, "twice": None, "shifted": None, "local": None}
    assert option_defaults({"train_grpo.py": script}).default("beta", "train_grpo.py").origin == "train_grpo.py:12"


def test_an_option_defaulting_to_an_entry_of_a_module_dict_takes_the_entry():
    """cs234-project (fresh102) keeps its settings in a dict at the top of the script (`DEFAULTS = {"beta": 0.05,
    ...}`) and hands each to its parser (`default=DEFAULTS["beta"]`): a run that leaves --beta alone trains at 0.05.
    A dict changed in place, with a `**` spread, with the key in a nested section too, bound twice or declared
    `global` has no known entry."""
    script = (
        "DEFAULTS = {\n"
        "    'model': 'Qwen/Qwen2.5-7B-Instruct',\n"
        "    \"beta\": 0.05,  # KL weight\n"
        "    'epochs': 3,\n"
        "}\n"
        "ONE_LINE = {'lr': 1e-6, 'warmup': 10}\n"
        "CHANGED = {'clip': 0.2}\n"
        "CHANGED['clip'] = 0.3\n"
        "SPREAD = {**BASE, 'gamma': 1.0}\n"
        "NESTED = {\n"
        "    'tau': 0.1,\n"
        "    'ppo': {'tau': 0.2},\n"
        "}\n"
        "def parser():\n"
        "    p.add_argument('--beta', type=float, default=DEFAULTS[\"beta\"])\n"
        "    p.add_argument('--epochs', type=int, default=DEFAULTS['epochs'], help='passes')\n"
        "    p.add_argument('--lr', default=ONE_LINE['lr'])\n"
        "    p.add_argument('--missing', default=DEFAULTS['missing'])\n"
        "    p.add_argument('--clip', default=CHANGED['clip'])\n"
        "    p.add_argument('--gamma', default=SPREAD['gamma'])\n"
        "    p.add_argument('--tau', default=NESTED['tau'])\n"
    )
    found = _default_values(script, ("beta", "epochs", "lr", "missing", "clip", "gamma", "tau"))
    assert found == {"beta": "0.05", "epochs": "3", "lr": "1e-6", "missing": None, "clip": None, "gamma": None,
                     "tau": None}
    assert option_defaults({"train_grpo.py": script}).default("beta", "train_grpo.py").origin == "train_grpo.py:15"
    twice = script.replace("ONE_LINE = {", "DEFAULTS = {'beta': 0.1}\nONE_LINE = {")
    assert option_defaults({"train_grpo.py": twice}).default("beta", "train_grpo.py") is None


def test_an_option_given_two_defaults_has_the_one_of_the_file_that_builds_the_config():
    """text2sql-grpo (eleventh set): --beta defaults to 0.04 in train_reasoning_grpo.py and 0.01 in
    train_grpo_finer_full.py; each script builds its GRPOConfig from its own options."""
    options = option_defaults({"a.py": ARGPARSE, "b.py": ARGPARSE.replace("0.04", "0.01")})
    assert options.default("beta", "a.py").value == "0.04" and options.default("beta", "b.py").value == "0.01"
    assert options.default("beta", "c.py") is None  # a third file: which script runs it is not known
    assert options.default("loss_type", "c.py").value == "grpo"  # the same everywhere


def test_a_project_installed_on_its_own_sees_only_its_own_options(tmp_path):
    """CriticCoT carries LLaMA-Factory beside ms-swift: LLaMA-Factory's PPO reads per_device_train_batch_size from
    transformers' TrainingArguments, not from ms-swift's dataclass, which gives it 1. Each folder with a setup.py
    or pyproject.toml is a project of its own; a file outside any sees every file's options."""
    for project in ("ms-swift", "LLaMA-Factory"):
        (tmp_path / project).mkdir()
        (tmp_path / project / "setup.py").write_text("")
    swift = str(tmp_path / "ms-swift" / "arguments.py")
    options = option_defaults({swift: "from dataclasses import dataclass\n\n@dataclass\nclass A:\n"
                                      "    per_device_train_batch_size: int = 1\n"})
    assert options.default("per_device_train_batch_size", str(tmp_path / "LLaMA-Factory" / "ppo.py")) is None
    assert options.default("per_device_train_batch_size", str(tmp_path / "ms-swift" / "train.py")).value == "1"
    assert options.default("per_device_train_batch_size", str(tmp_path / "run.py")).value == "1"


@pytest.mark.parametrize("written, expected", [
    ("beta", "0.5"),  # the enclosing function's parameter
    ("args.beta", "0.04"), ("self.args.beta", "0.04"),  # the option named like the last attribute
    ("args.seed", None), ("x", None), ("args.", None), ("f().beta", None),
    ("self.beta", "0.04"),  # an attribute of the object itself: the option's name, nothing nested below a root
])
def test_resolve(written, expected):
    options = option_defaults({"run.py": 'p.add_argument("--beta", default=0.04)\n'})
    found = resolve(written, {"beta": Default("0.5", "the default of parameter beta")}, options, "train.py")
    assert (found and found.value) == expected


def _codes(tmp_path, files):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    result = lint_paths([str(tmp_path)], settings=Settings(root=tmp_path), jobs=1)
    return sorted((f.path.rsplit("/", 1)[-1], f.line, f.code) for f in result.findings)


def test_a_config_set_from_an_option_of_another_file_has_its_default(tmp_path):
    trainer = "from trl import GRPOConfig\n\n\ndef config(args):\n    return GRPOConfig(\n        beta=args.beta)\n"
    run = 'import argparse\np = argparse.ArgumentParser()\np.add_argument("--beta", type=float, default={})\n'
    assert _codes(tmp_path, {"trainer.py": trainer, "run.py": run.format("0.04")}) == [("trainer.py", 6, "KL003")]
    assert _codes(tmp_path, {"trainer.py": trainer, "run.py": run.format("0.0")}) == []  # the KL is off by default


def test_a_parameter_default_decides_unless_the_body_reassigns_it(tmp_path):
    source = ("from trl import GRPOConfig\n\n\ndef train(beta=0.04, loss_type='grpo'):\n"
              "    return GRPOConfig(beta=beta, loss_type=loss_type)\n")
    assert _codes(tmp_path, {"train.py": source}) == [("train.py", 5, "KL003"), ("train.py", 5, "KL007")]
    reassigned = source.replace("    return", "    beta = float(beta) / 10\n    return")
    assert _codes(tmp_path, {"train.py": reassigned}) == []


@pytest.mark.parametrize("declared, expected", [
    ("typer.Option(0.04, help='KL penalty')", [("train.py", 7, "KL003")]),
    ("typer.Option(default=0.04)", [("train.py", 7, "KL003")]),
    ("typer.Option(0.0, '--kl-coef')", []),  # off unless the run asks for it
    ("typer.Option(..., help='required')", []),  # every run passes its own: no default to judge
])
def test_a_typer_options_default_is_the_parameters(tmp_path, declared, expected):
    source = ("import typer\nfrom trl import GRPOConfig\n\n\n"
              f"def main(kl_coef: float = {declared}):\n    config = GRPOConfig(\n        beta=kl_coef)\n")
    assert _codes(tmp_path, {"train.py": source}) == expected


def test_a_click_options_default_is_read_as_argparses(tmp_path):
    source = ("import click\nfrom trl import GRPOConfig\n\n\n@click.command()\n"
              "@click.option('-k', '--kl-coef', type=float, default={})\ndef main(kl_coef):\n"
              "    config = GRPOConfig(beta=kl_coef)\n")
    assert _codes(tmp_path, {"train.py": source.format("0.04")}) == [("train.py", 8, "KL003")]
    assert _codes(tmp_path, {"train.py": source.format("0.0")}) == []


CONFIG_DICTS = """\
GRPO = {
    "group_size": 4,
    "beta": 0.04,  # KL penalty
    "kl": {"beta": 0.04, "off": 0.0},
}
CHANGED = {"beta": 0.04}
SPREAD = {**GRPO, "beta": 0.04}
STAGES = {1: {"beta": 0.04, "steps": 10}, 2: {"beta": 0.04, "steps": 20}}
SWEEP = {"low": {"beta": 0.0}, "high": {"beta": 0.04}}


def later():
    CHANGED["beta"] = 0.0
"""


@pytest.mark.parametrize("script, expected", [
    ("from config import GRPO\nconfig = GRPOConfig(beta=GRPO['beta'])\n", [("train.py", 3, "KL003")]),
    ("import config\nconfig = GRPOConfig(beta=config.GRPO['kl']['beta'])\n", [("train.py", 3, "KL003")]),
    ("from config import GRPO as G\nkl = G['kl']\nconfig = GRPOConfig(beta=kl['off'])\n", []),  # 0.0: no KL term
    # `beta or GRPO["beta"]` of a parameter that defaults to None: the dict's value where the caller leaves it alone
    ("from config import GRPO\ndef run(beta=None):\n    beta = beta or GRPO['beta']\n"
     "    return GRPOConfig(beta=beta)\n", [("train.py", 5, "KL003")]),
    # an entry picked at run time (`STAGES[stage]`) reads what every entry gives alike
    ("from config import STAGES\ndef run(stage):\n    config = STAGES[stage]\n"
     "    return GRPOConfig(beta=config['beta'])\n", [("train.py", 5, "KL003")]),
    ("from config import SWEEP\ndef run(arm):\n    return GRPOConfig(beta=SWEEP[arm]['beta'])\n", []),
    # not read: an entry some statement changes, a dict that spreads another, a parameter that hides the dict
    ("from config import CHANGED\nconfig = GRPOConfig(beta=CHANGED['beta'])\n", []),
    ("from config import SPREAD\nconfig = GRPOConfig(beta=SPREAD['beta'])\n", []),
    ("from config import GRPO\ndef run(GRPO):\n    return GRPOConfig(beta=GRPO['beta'])\n", []),
    ("from config import GRPO\ndef run(beta=0.1):\n    beta = beta or GRPO['beta']\n"
     "    return GRPOConfig(beta=beta)\n", []),  # a caller's value may decide
    # Brennen-Hill (eighty-seventh set): the same fallback written as a conditional, in the keyword itself
    ("from config import GRPO\ndef run(specific_beta=None):\n"
     "    return GRPOConfig(beta=specific_beta if specific_beta is not None else GRPO['beta'])\n", [("train.py", 4, "KL003")]),
    ("from config import GRPO\ndef run(b=None):\n    return GRPOConfig(beta=GRPO['beta'] if b is None else b)\n",
     [("train.py", 4, "KL003")]),
    ("from config import GRPO\ndef run(b=None):\n    return GRPOConfig(beta=GRPO['kl']['off'] if b is None else b)\n",
     []),  # the fallback is 0.0
    ("from config import GRPO\ndef run(b=None, c=None):\n    return GRPOConfig(beta=GRPO['beta'] if b is None else c)\n",
     []),  # not a fallback from the parameter tested
])
def test_an_entry_of_a_modules_dict_literal_is_its_value(tmp_path, script, expected):
    """`GRPOConfig(beta=GRPO["beta"])` with `GRPO = {"beta": 0.04, ...}` bound once in the project's config.py and
    changed nowhere trains with 0.04: TRL 1.16's ratio*k3 (kl-math.md row 2, KL003); 0.0 adds no KL term."""
    files = {"config.py": CONFIG_DICTS, "train.py": "from trl import GRPOConfig\n" + script}
    assert _codes(tmp_path, files) == expected


def test_a_key_nested_in_the_projects_yaml_has_the_value_given_there(tmp_path):
    """grpo-llm-unlearning (eleventh set): GRPOConfig(beta=cfg.training.grpo.beta, num_iterations=...) with
    config/train.yaml's training.grpo.beta 0.04 and num_iterations 2, TRL 1.5: the k3 loss (row 3, KL002),
    on samples of an older policy (row 22, KL008)."""
    (tmp_path / "requirements.txt").write_text("trl==1.5.0\n")
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "train.yaml").write_text("training:\n  grpo:\n    beta: 0.04\n    num_iterations: 2\n")
    trainer = ("from trl import GRPOConfig\n\n\ndef main(cfg):\n    return GRPOConfig(\n"
               "        num_iterations=cfg.training.grpo.num_iterations,\n        beta=cfg.training.grpo.beta)\n")
    assert _codes(tmp_path, {"train.py": trainer}) == [("train.py", 6, "KL008"), ("train.py", 7, "KL002")]
    (tmp_path / "config" / "other.yaml").write_text("training:\n  grpo:\n    beta: 0.0\n")  # two values: unknown
    assert _codes(tmp_path, {"train.py": trainer}) == []


def test_a_top_level_yaml_key_is_no_option(tmp_path):
    """`args.beta` is an option's name, not a YAML path: a YAML file's top-level `beta` (a DPO config of the
    same project) does not decide it."""
    (tmp_path / "dpo.yaml").write_text("beta: 0.1\n")
    trainer = "from trl import GRPOConfig\n\n\ndef main(args):\n    return GRPOConfig(beta=args.beta)\n"
    assert _codes(tmp_path, {"train.py": trainer}) == []


RUN_SCRIPT = '''\
import argparse
from trl import GRPOConfig


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kl-coef", type=float, default=0.0)
    args = ap.parse_args()
    return GRPOConfig(output_dir="out", beta=args.kl_coef)
'''


def _launched(tmp_path, launches):
    (tmp_path / "rl").mkdir()
    (tmp_path / "rl" / "train.py").write_text(RUN_SCRIPT)
    for name, text in launches.items():
        (tmp_path / name).write_text(text)
    result = lint_paths([str(tmp_path)], settings=Settings(root=tmp_path), jobs=1)
    return [(f.path.rsplit("/", 1)[-1], f.line, f.code, f.message) for f in result.findings]


def test_a_launch_that_sets_an_option_decides_its_value(tmp_path):
    """posix4e/tmuxbench (fifty-first set): the script's --beta defaults to 0 (no KL), but the launch script
    runs it with `--beta "$BETA"` after `BETA="${BETA:-0.04}"`: that run trains TRL 1.16's ratio*k3 loss
    (row 2, KL003), and the message says which launch gives the value."""
    launch = 'BETA="${BETA:-0.04}"\ncd ~/project\npython rl/train.py --steps 10 \\\n  --kl-coef "$BETA" --out x\n'
    [(path, line, code, message)] = _launched(tmp_path, {"run.sh": launch})
    assert (path, line, code) == ("train.py", 9, "KL003")
    assert "beta=0.04 (--kl-coef of the launch at" in message and "run.sh:3, set at line 1)" in message


def test_launches_that_sweep_a_coefficient_between_0_and_1_give_one_verdict(tmp_path):
    """venzino-han/rl4rec (fiftieth set): seventeen launches of src/grpo_train.py set
    --reference_model_kld_coef to 0.001, 0.005 or 0.01 (argparse default 0.0), all of them a KL weight: each run
    trains TRL 1.16's ratio*k3 loss (row 2, KL003), and the message gives the range."""
    launches = {"a.sh": "python rl/train.py --kl-coef 0.01\n", "b.sh": "python rl/train.py --kl-coef 0.001\n",
                "c.sh": "python rl/train.py --kl-coef 0.005\n"}
    [(path, line, code, message)] = _launched(tmp_path, launches)
    assert (path, line, code) == ("train.py", 9, "KL003")
    assert "beta=0.01 (--kl-coef of the launch at" in message
    assert "a.sh:1; the 3 launches set 0.001 to 0.01)" in message


@pytest.mark.parametrize("launches", [
    {"run.sh": "python rl/train.py --steps 10\n"},  # the launch leaves the option at its default: no KL
    {"run.sh": "# python rl/train.py --kl-coef 0.04\npython rl/train.py\n"},  # a comment runs nothing
    {"a.sh": "python rl/train.py --kl-coef 0.0\n", "b.sh": "python rl/train.py --kl-coef 0.1\n"},  # KL or none
    {"a.sh": "python rl/train.py --kl-coef 0.5\n", "b.sh": "python rl/train.py --kl-coef 2\n"},  # not a fraction
    {"run.sh": "python other/train.py --kl-coef 0.04\n"},  # another script than the one that declares it
])
def test_launches_that_do_not_set_one_value_leave_the_default(tmp_path, launches):
    assert _launched(tmp_path, launches) == []


@pytest.mark.parametrize("launch, found", [
    ("torchrun --nproc_per_node=4 -m rl.train --kl-coef 0.04\n", True),  # the module by its dotted name
    ("python -m rl.train\n", False),  # left at the default of 0
    ("cd src && python -m torch.distributed.run rl/train.py --kl-coef 0.04\n", True),  # torch's module, a path
    ("python -m other.train --kl-coef 0.04\n", False),  # a module the project does not hold: none of its runs
])
def test_a_launch_may_run_the_script_by_its_module_name(tmp_path, launch, found):
    """Corleno/KEPO (fresh93) runs `torchrun ... -m src.gold_multimodal.gold_multimodal --alpha 1.0 ...`: the
    module's options are set as a path's are."""
    assert bool(_launched(tmp_path, {"run.sh": launch})) is found


@pytest.mark.parametrize("layout, module", [
    ("pkg/train.py", "pkg.train"), ("pkg/train/__main__.py", "pkg.train"), ("src/pkg/train.py", "pkg.train"),
    ("src/pkg/train.py", "src.pkg.train"),
])
def test_a_module_launch_is_found_as_a_file_a_package_main_or_below_src(tmp_path, layout, module):
    from klaudit.frameworks.settings import launched_scripts

    (tmp_path / ".git").mkdir()
    (tmp_path / layout).parent.mkdir(parents=True)
    (tmp_path / layout).write_text("")
    launcher = tmp_path / "scripts" / "run.sh"
    launched = list(launched_scripts(str(launcher), f"accelerate launch -m {module} --x 1\n"))
    assert launched == [(len("accelerate launch "), tmp_path / layout)]


@pytest.mark.parametrize("assigned, found", [
    ("code_dir=$work_dir/OpenRLHF", True),  # the folder below a variable set elsewhere
    ("code_dir=/path/to/AlignDistil/OpenRLHF", True),  # a placeholder root: its last folders
    ("code_dir=/opt/elsewhere", False),  # a folder that is not the project's
    ("code_dir=$(pwd)/..", False),  # computed: nothing written to follow
    ("", False),  # never assigned
])
def test_a_script_below_a_variable_is_found_in_the_folder_it_names(tmp_path, assigned, found):
    """songmzhang/AlignDistil (fresh90) runs `deepspeed $code_dir/openrlhf/cli/train.py` after
    `code_dir=$work_dir/OpenRLHF`: the script is OpenRLHF/openrlhf/cli/train.py, whose flags the launch sets."""
    from klaudit.frameworks.settings import launched_scripts

    (tmp_path / ".git").mkdir()
    script = tmp_path / "OpenRLHF" / "openrlhf" / "cli" / "train.py"
    script.parent.mkdir(parents=True)
    script.write_text("")
    text = f"{assigned}\ndeepspeed --num_gpus 8 $code_dir/openrlhf/cli/train.py --beta 0.1\n"
    launched = list(launched_scripts(str(tmp_path / "scripts" / "run.sh"), text))
    assert launched == ([(text.index("deepspeed --num_gpus 8 ") + len("deepspeed --num_gpus 8 "), script)]
                        if found else [])


def test_a_hydra_entry_takes_no_flags_from_its_launch(tmp_path):
    """`python -m pkg.main trainer.kl_coef=0.1` sets a Hydra override, not the dataclass field's flag: the entry is
    no run whose options are its fields' defaults (a coefficient left at 0 there could be set by the override)."""
    (tmp_path / "pkg").mkdir()
    entry = "import hydra\nfrom pkg.config import Config\n\n\n@hydra.main(config_path='.')\ndef main(cfg):\n    pass\n"
    sources = {str(tmp_path / "pkg" / "main.py"): entry,
               str(tmp_path / "pkg" / "config.py"): "@dataclass\nclass Config:\n    kl_coef: float = 0.0\n"}
    for path, text in sources.items():
        Path(path).write_text(text)
    (tmp_path / "run.sh").write_text("python -m pkg.main trainer.kl_coef=0.1\n")
    options = option_defaults(sources, [str(tmp_path / "run.sh")])
    assert options.run_values("kl_coef", str(tmp_path / "pkg" / "config.py")) is None
    (tmp_path / "pkg" / "main.py").write_text(entry.replace("@hydra.main(config_path='.')\n", ""))
    sources[str(tmp_path / "pkg" / "main.py")] = entry.replace("@hydra.main(config_path='.')\n", "")
    options = option_defaults(sources, [str(tmp_path / "run.sh")])
    assert options.run_values("kl_coef", str(tmp_path / "pkg" / "config.py")) == {"0.0"}


def _rs_grpo(tmp_path, launch: str, local: str = "", nested_local: str = ""):
    """just-a-go/RS-GRPO (fresh102): a launch runs src/open_r1/grpo.py, which imports GRPOConfig from its trainer
    package, whose `__init__.py` re-exports it from grpo_config.py (field `beta`, default 0.04); the trainer copies
    `self.beta = args.beta`. `local` is more code of the project, `nested_local` code of a project inside it."""
    (tmp_path / "setup.py").write_text("")
    files = {"src/open_r1/grpo.py": "from open_r1.trainer import GRPOConfig, Trainer\n",
             "src/open_r1/trainer/__init__.py": "from .grpo_config import GRPOConfig\nfrom .trainer import Trainer\n",
             "src/open_r1/trainer/grpo_config.py": "@dataclass\nclass GRPOConfig:\n    beta: float = 0.04\n"
                                                   "    lr: float = 1e-6\n",
             "src/open_r1/trainer/trainer.py": "class Trainer:\n    def __init__(self, args):\n"
                                               "        self.beta = args.beta\n",
             "src/open_r1/utils.py": local,
             "vision-utils/pyproject.toml": "",
             "vision-utils/src/resize.py": nested_local}
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    (tmp_path / "run.sh").write_text(launch)
    sources = {str(tmp_path / name): text for name, text in files.items() if name.endswith(".py")}
    return option_defaults(sources, [str(tmp_path / "run.sh")]).zero_in_launched_runs(
        "beta", str(tmp_path / "src/open_r1/trainer/trainer.py"))


ZERO_BETA = "BETA=${BETA:-0.00}\ntorchrun src/open_r1/grpo.py --beta \"$BETA\" --lr 1e-6\n"


@pytest.mark.parametrize("launch, local, nested_local, zero", [
    (ZERO_BETA, "", "", True),  # the only launch sets 0 over the field's 0.04: no run has a KL term
    (ZERO_BETA, "", "def resize(h, w):\n    beta = math.sqrt(h * w)\n", True),  # another project's own `beta`
    (ZERO_BETA, "def preset():\n    return GRPOConfig(beta=0.1)\n", "", False),  # the project's code sets it
    (ZERO_BETA + "torchrun src/open_r1/grpo.py --lr 1e-6\n", "", "", False),  # a launch leaves the 0.04
    (ZERO_BETA.replace("0.00", "0.04"), "", "", False),
])
def test_a_coefficient_every_launch_sets_to_zero_scales_nothing(tmp_path, launch, local, nested_local, zero):
    assert _rs_grpo(tmp_path, launch, local, nested_local) is zero


def test_a_yaml_section_read_by_its_keys_has_the_value_the_yaml_gives(tmp_path):
    """lianghsun/peptide-dpt (fifty-first set): `cfg = yaml.safe_load(f)`, `g = cfg["grpo"]`,
    `GRPOConfig(beta=g["kl_coef"])`, with `grpo: kl_coef: 0.05` in both of its YAML configs: TRL 1.16's
    ratio*k3 loss (row 2, KL003), the message naming the YAML key."""
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "grpo.yaml").write_text("grpo:\n  kl_coef: 0.05\n  group_size: 8\n")
    trainer = ("import yaml\nfrom trl import GRPOConfig\n\n\ndef main(path):\n    cfg = yaml.safe_load(open(path))\n"
               "    g = cfg[\"grpo\"]\n    return GRPOConfig(num_generations=g[\"group_size\"],\n"
               "                      beta=g[\"kl_coef\"])\n")
    assert _codes(tmp_path, {"train.py": trainer}) == [("train.py", 9, "KL003")]
    spelled = trainer.replace('    g = cfg["grpo"]\n', "").replace('g["kl_coef"]', 'cfg["grpo"]["kl_coef"]')
    assert _codes(tmp_path, {"train.py": spelled}) == [("train.py", 8, "KL003")]
    (tmp_path / "configs" / "small.yaml").write_text("grpo:\n  kl_coef: 0.0\n")  # two values: unknown
    assert _codes(tmp_path, {"train.py": trainer}) == []


def test_a_dicts_own_key_is_no_option_of_the_project(tmp_path):
    """`d["beta"]` of some dict is not the project's --beta option (a single attribute, `args.beta`, is)."""
    run = 'import argparse\np = argparse.ArgumentParser()\np.add_argument("--beta", type=float, default=0.04)\n'
    trainer = "from trl import GRPOConfig\n\n\ndef config(d):\n    return GRPOConfig(beta=d[\"beta\"])\n"
    assert _codes(tmp_path, {"trainer.py": trainer, "run.py": run}) == []


DATACLASS_ARGUMENTS = '''\
from dataclasses import dataclass, field
from typing import Optional


@dataclass
class ScriptArguments:
    beta: Optional[float] = field(default=0.04)
'''
PARSED_SCRIPT = '''\
from transformers import HfArgumentParser
from trl import GRPOConfig

from args import ScriptArguments


def main():
    script_args = HfArgumentParser(ScriptArguments).parse_args_into_dataclasses()[0]
    return GRPOConfig(output_dir="out", beta=script_args.beta)
'''


@pytest.mark.parametrize("launch, found", [
    ("python train.py --beta=0.0\n", False),  # a dataclass flag the launch sets: judged at its value, no KL
    ('BETA=0.0\npython train.py --beta="$BETA"\n', False),  # a variable the launch script sets: read
    ("python train.py --beta=$BETA\n", False),  # a variable set elsewhere: not the dataclass's 0.04, unknown
    ("python train.py --steps 10\n", True),  # left at the dataclass's 0.04: the k3 term trains
])
def test_a_dataclass_option_a_launch_sets_is_not_its_default(tmp_path, launch, found):
    """PrasannS/d2po (seventy-second set) parses a dataclass of another module with HfArgumentParser and launches
    `src/train_ppo.py --mini_batch_size=$MBSIZE`: its flags are the dataclass's fields, so the launch's value is the
    run's, and one the lint cannot read leaves the option unknown, never the field's default (which gave a false
    KL007 for one response per mini-batch)."""
    (tmp_path / "args.py").write_text(DATACLASS_ARGUMENTS)
    (tmp_path / "train.py").write_text(PARSED_SCRIPT)
    (tmp_path / "run.sh").write_text(launch)
    result = lint_paths([str(tmp_path)], settings=Settings(root=tmp_path), jobs=1)
    assert bool(result.findings) is found, [f.message for f in result.findings]


def test_a_functions_parameter_is_no_dataclass_field(tmp_path):
    """minstar/BIOAgents (seventy-first set): `beta: float = 0.01` in its config dataclass, and `beta: float = 0.04,`
    on a line of a function's signature elsewhere. The parameter is no option of the command line: the dataclass's
    0.01 is the only default, so `GRPOConfig(beta=config.beta)` trains TRL's k3 term (before, two defaults left the
    value unknown and nothing was reported)."""
    fields = ("from dataclasses import dataclass\n\n\n@dataclass\nclass TrainConfig:\n    beta: float = {}\n\n\n"
              "def rollout(\n    model,\n    beta: float = 0.04,\n):\n    return model\n")
    trainer = ("from trl import GRPOConfig\n\nfrom fields import TrainConfig\n\n\n"
               "def build(config: TrainConfig):\n    return GRPOConfig(output_dir='out', beta=config.beta)\n")
    assert _codes(tmp_path, {"fields.py": fields.format("0.01"), "trainer.py": trainer}) == [("trainer.py", 7, "KL003")]
    assert _codes(tmp_path, {"fields.py": fields.format("0.0"), "trainer.py": trainer}) == []


def test_a_scripts_own_option_swept_by_a_variable_keeps_its_default(tmp_path):
    """CanadaApollo6/gridiron-grpo (sixty-seventh set) runs `src/train_grpo.py --beta "$b"` for each b of a sweep
    (0, 0.04, 0.1, 0.2 by default); the script's own --beta defaults to 0.04: that default stands for the runs, as
    before dataclass fields were read as flags (their unread values leave a field unknown, not an argument)."""
    (tmp_path / "rl").mkdir()
    (tmp_path / "rl" / "train.py").write_text(RUN_SCRIPT.replace("default=0.0", "default=0.04"))
    (tmp_path / "sweep.sh").write_text('for b in $BETAS; do\n  python rl/train.py --kl-coef "$b"\ndone\n')
    result = lint_paths([str(tmp_path)], settings=Settings(root=tmp_path), jobs=1)
    assert [(f.line, f.code) for f in result.findings] == [(9, "KL003")]
