"""Configuration calls and classes read from Python's own tree are the ones LibCST's positions give:
the same names, keyword values, field defaults and positions, whatever the spelling
(klaudit.frameworks.calls)."""

from __future__ import annotations

from pathlib import Path

import libcst
import pytest

from klaudit.frameworks import calls, cst_configs, trl
from klaudit.frameworks.settings import Setting

CONFIGS = '''\
"""Usage: `GRPOConfig(beta=0.1)` (a docstring names it; it is not a call)."""
from trl import GRPOConfig
import trl

x = "é"; c = GRPOConfig(beta=0.04, loss_type = "grpo", num_iterations=1_000, lr=-1e-3, a=0x1F, s=("a" "b"), f=f"x")
if True:
    d = trl.GRPOConfig(
        beta=0.1,  # comment
        **kwargs,
        loss_type=("dr_grpo"),
    )
(GRPOConfig)(beta=2, t=True, n=None, j=1j, e=..., neg=-(-2), by=b"x")
def f(a=GRPOConfig(beta=5)):
    return [GRPOConfig  # a comment between the name and its arguments
            (beta="""two
lines""", k=r"\\d")]


@dataclass
class Mine(trl.GRPOConfig):
    beta: float = 0.0
    loss_type = "dr_grpo"  # comment
    num_iterations: int = field(default=2, metadata={"help": "x"})
    other: int = 3

class Again(Mine, Generic[T]): beta = 0.5
class GRPOConfig(TrainingArguments):
    beta: float = field(default_factory=lambda: 0.04)
'''


NAMES = frozenset({*trl.CONFIG_CLASSES, "Mine", "Again"})


def _with_libcst(source: str):
    reader = cst_configs._Reader(NAMES, tuple(trl.KEYS), "t.py", {})
    libcst.MetadataWrapper(libcst.parse_module(source), unsafe_skip_copy=True).visit(reader)
    return reader.calls, reader.definitions


@pytest.mark.parametrize("newline", ["\n", "\r\n"])
def test_configurations_read_from_pythons_tree_are_those_libcsts_positions_give(newline):
    source = CONFIGS.replace("\n", newline)
    from_python = calls._python_configs(source, NAMES, tuple(trl.KEYS), "t.py")
    assert from_python is not None
    found, definitions = from_python
    assert len(found) == 5 and [d.name for d in definitions] == ["Mine", "Again", "GRPOConfig"]
    by_libcst = _with_libcst(source)
    order = lambda call: (call.where.line, call.where.column)  # noqa: E731
    assert sorted(found, key=order) == sorted(by_libcst[0], key=order)
    assert definitions[0] == by_libcst[1][0] and definitions[2] == by_libcst[1][2]
    assert by_libcst[1][1].fields == {} and definitions[1].bases == by_libcst[1][1].bases
    assert definitions[0].fields["beta"].value == "0.0" and definitions[0].fields["num_iterations"].value == "2"
    assert definitions[1].fields == {"beta": Setting("0.5", 26, 32, 42)}  # a one-line body: LibCST's reader skips it
    assert definitions[2].fields["beta"].value is None  # a computed default


def test_newer_syntax_than_pythons_is_read_by_libcst(monkeypatch):
    source = "from trl import GRPOConfig\n\n\nclass Mine(GRPOConfig):\n    beta: float = 0.0\n\n\nc = Mine(beta=0.1)\n"
    monkeypatch.setattr(calls, "_python_configs", lambda *args: None)  # as if Python could not read it
    found, definitions = calls.read_configs(source, {"GRPOConfig", "Mine"}, trl.KEYS, "t.py")
    assert [d.name for d in definitions] == ["Mine"] and definitions[0].fields["beta"].value == "0.0"
    assert [(c.name, c.settings["beta"].value) for c in found] == [("Mine", "0.1")]


REFUSED = '''\
import pytest
from trl import GRPOConfig

def test_refused(self):
    with pytest.raises(ValueError, match="generations"):
        GRPOConfig(beta=0.1, num_generations=1)
    with self.assertRaisesRegex(ValueError, "loss"), open("x"):
        cfg = GRPOConfig(
            loss_type="invalid")
    return GRPOConfig(beta=0.2)
'''


def test_a_configuration_a_test_expects_to_be_refused_is_none(monkeypatch):
    from_python = calls._python_configs(REFUSED, NAMES, tuple(trl.KEYS), "t.py")
    assert from_python is not None
    assert [(call.where.line, call.settings["beta"].value) for call in from_python[0]] == [(10, "0.2")]
    assert _with_libcst(REFUSED)[0] == from_python[0]


OPTIONS_AND_PARAMETERS = '''\
from trl import GRPOConfig

def train(beta: float = 0.04, *, steps=2, loss="grpo", shadowed=1.0, looped=1, imported=3, caught=4):
    for looped in range(2):
        pass
    shadowed = shadowed * 2
    import numpy as imported
    try:
        pass
    except ValueError as caught:
        GRPOConfig(num_iterations=imported, beta=caught)
    def inner(beta=0.5):
        return GRPOConfig(beta=beta, num_iterations=steps)
    return GRPOConfig(beta=beta, num_iterations=shadowed, loss_type=loss, importance_sampling_level=looped)

c = GRPOConfig(beta=args.kl_coef, num_iterations=self.cfg.num_iterations, loss_type=x[0].loss, other=f().beta)
d = GRPOConfig(beta=beta)  # a module-level name: no parameter
STEPS = 3
LOSS: str = "dr_grpo"
LOSS = "grpo"
for LEVEL in ("token",):
    pass
class Holder:
    STEPS = 9
e = GRPOConfig(num_iterations=STEPS, loss_type=LOSS, importance_sampling_level=LEVEL)
def uses_the_constant():
    return GRPOConfig(num_iterations=STEPS)
ENV_BETA = float(os.environ.get("GRPO_BETA", 0.005))
ENV_STEPS = int(os.getenv("STEPS", "2"))
ENV_LOSS = os.environ.get("LOSS")
ENV_LEVEL = float(os.environ.get("LEVEL", 0.1) or 0.2)
f = GRPOConfig(beta=ENV_BETA, num_iterations=ENV_STEPS, loss_type=ENV_LOSS, importance_sampling_level=ENV_LEVEL)
g = GRPOConfig(beta=float(os.environ.get("GRPO_BETA", "0.04")), num_iterations=int(os.getenv("ITERS")), loss_type=os.environ.get("LOSS", "x").lower())
def typed(kl: float = typer.Option(0.02, help="x"), steps: int = typer.Option(..., "--steps"), loss: str = Option(default="bnpo")):
    return GRPOConfig(beta=kl, num_iterations=steps, loss_type=loss)
@click.command()
@click.option("-k", "--kl-coef", "kl", default=0.03)
@click.option("--num-steps", type=int, default=5)
@click.option("--not-a-parameter", default=7)
def clicked(kl, num_steps, not_a_parameter_either):
    return GRPOConfig(beta=kl, num_iterations=num_steps, loss_type=not_a_parameter)
'''


def test_options_and_parameters_resolve_alike_in_both_trees():
    from klaudit.frameworks.options import option_defaults

    options = option_defaults({"run.py": 'a.add_argument("--kl_coef", default=0.1)\na.add_argument("--num_iterations", '
                                         'default=4)\na.add_argument("--loss", default="bnpo")\na.add_argument("--beta", default=9)\n'})
    from_python = calls._python_configs(OPTIONS_AND_PARAMETERS, NAMES, tuple(trl.KEYS), "t.py", options)
    assert from_python is not None
    reader = cst_configs._Reader(NAMES, tuple(trl.KEYS), "t.py", options)
    libcst.MetadataWrapper(libcst.parse_module(OPTIONS_AND_PARAMETERS), unsafe_skip_copy=True).visit(reader)
    assert from_python[0] == reader.calls
    values = [{key: setting.value for key, setting in call.settings.items()} for call in reader.calls]
    assert values == [
        {"num_iterations": None, "beta": None},  # names an import and an except clause rebind
        {"beta": "0.5", "num_iterations": "2"},  # the innermost function's parameter
        {"beta": "0.04", "num_iterations": None, "loss_type": "grpo", "importance_sampling_level": None},
        {"beta": "0.1", "num_iterations": "4", "loss_type": None, "other": None},
        {"beta": None},
        # a module constant bound once (a class body is a scope of its own); bound twice, or by a loop: none
        {"num_iterations": "3", "loss_type": None, "importance_sampling_level": None},
        {"num_iterations": "3"},
        # a module constant read from the environment takes the default a run without the variable reads;
        # no default, or one an expression computes further: none
        {"beta": "0.005", "num_iterations": "2", "loss_type": None, "importance_sampling_level": None},
        # a keyword set to such a read itself (humor-r1's `beta=float(os.environ.get("GRPO_BETA", "0.04"))`)
        {"beta": "0.04", "num_iterations": None, "loss_type": None},
        # a typer option's default stands in the parameter's place; `...` makes it required
        {"beta": "0.02", "num_iterations": None, "loss_type": "bnpo"},
        # a click option's default is its parameter's (the name written bare, else the long flag's)
        {"beta": "0.03", "num_iterations": "5", "loss_type": None},
    ]
    assert reader.calls[3].settings["beta"].origin == "the default of kl_coef at run.py:1"
    assert reader.calls[5].settings["num_iterations"].origin == "STEPS = 3 at line 18"
    assert reader.calls[7].settings["beta"].origin == "ENV_BETA = 0.005 at line 28 while GRPO_BETA is unset"
    assert reader.calls[8].settings["beta"].origin == "0.04 at line 33 while GRPO_BETA is unset"


CONFIGURATION_READS = '''\
from trl import PPOConfig

def train(cfg, path):
    epochs = cfg.get("ppo_epochs", 4)
    batch = int(cfg.get("batch_size", 8))
    mini = cfg.get("mini_batch_size", 4)
    lr = cfg.get("learning_rate")
    coef = cfg.get("kl_coef", 0.2)
    coef = coef * 2
    target = os.environ.get("TARGET_KL", 6.0)
    return PPOConfig(ppo_epochs=epochs, batch_size=batch, mini_batch_size=mini, learning_rate=lr, init_kl_coef=coef,
                     target_kl=target)
'''


def test_a_configuration_read_with_a_literal_default_gives_that_default_where_the_yaml_files_leave_the_key(tmp_path):
    """`epochs = cfg.get("ppo_epochs", 4)` bound once: a run whose configuration leaves the key out trains with 4, so
    the keyword is judged at 4 where no linted YAML file gives the key another value (the same value, at any depth,
    agrees); a read without a default, a name bound twice: no value. An environment read bound to a name gives its
    default, the value a run that leaves the variable unset reads, as it does written at the keyword."""
    from klaudit.frameworks.options import option_defaults

    config = tmp_path / "ppo.yaml"
    config.write_text("training:\n  ppo_epochs: 4\n  mini_batch_size: 1\n")
    options = option_defaults({}, [str(config)])
    from_python = calls._python_configs(CONFIGURATION_READS, NAMES | {"PPOConfig"}, ("ppo_epochs",), "t.py", options)
    assert from_python is not None
    reader = cst_configs._Reader(NAMES | {"PPOConfig"}, ("ppo_epochs",), "t.py", options)
    libcst.MetadataWrapper(libcst.parse_module(CONFIGURATION_READS), unsafe_skip_copy=True).visit(reader)
    assert from_python[0] == reader.calls
    [call] = reader.calls
    assert {key: setting.value for key, setting in call.settings.items()} == {
        "ppo_epochs": "4", "batch_size": "8", "mini_batch_size": None, "learning_rate": None, "init_kl_coef": None,
        "target_kl": "6.0"}
    assert call.settings["ppo_epochs"].origin == (
        "epochs = cfg.get('ppo_epochs', 4) at line 4, where the configuration leaves ppo_epochs out")
    assert call.settings["target_kl"].origin == "6.0 at line 10 while TARGET_KL is unset"


INLINE_READS = '''\
from trl import PPOConfig

def build(rl):
    return PPOConfig(ppo_epochs=rl.get("ppo_epochs", 4), batch_size=int(rl.get("batch_size", 8)),
                     mini_batch_size=rl.get("mini_batch_size", 4), learning_rate=rl.get("learning_rate"),
                     init_kl_coef=os.environ.get("KL", 0.2))
'''


def test_a_configuration_read_written_at_the_keyword_gives_its_default_as_one_bound_to_a_name_does(tmp_path):
    """`PPOConfig(ppo_epochs=rl.get("ppo_epochs", 4))` (YukoiWang/Emo-Agent-RL-finetune's static-rl/run_ppo.py, fifty-third
    set): the read is judged as `epochs = rl.get(...)` then `ppo_epochs=epochs` is, from either tree, the YAML files
    deciding whether the default holds. Where they give the key another value, in a section the mapping is named for
    (`rl.mini_batch_size` for `rl`; nvietanh1909/MedVLM-R1's `grpo.beta` for `grpo_cfg`, fifty-fourth set), the run
    reads that value; a read without a default gives no value, and one of the environment its default, the value a
    run that leaves the variable unset reads (Broyojo/humor-r1's `beta=float(os.environ.get("GRPO_BETA", "0.04"))`,
    sixty-first set), as a module constant bound to it has."""
    from klaudit.frameworks.options import option_defaults

    config = tmp_path / "ppo.yaml"
    config.write_text("rl:\n  ppo_epochs: 4\n  mini_batch_size: 1\n")
    options = option_defaults({}, [str(config)])
    from_python = calls._python_configs(INLINE_READS, NAMES | {"PPOConfig"}, ("ppo_epochs",), "t.py", options)
    assert from_python is not None
    reader = cst_configs._Reader(NAMES | {"PPOConfig"}, ("ppo_epochs",), "t.py", options)
    libcst.MetadataWrapper(libcst.parse_module(INLINE_READS), unsafe_skip_copy=True).visit(reader)
    assert from_python[0] == reader.calls
    [call] = reader.calls
    assert {key: setting.value for key, setting in call.settings.items()} == {
        "ppo_epochs": "4", "batch_size": "8", "mini_batch_size": "1", "learning_rate": None, "init_kl_coef": "0.2"}
    assert call.settings["ppo_epochs"].origin == (
        "ppo_epochs = rl.get('ppo_epochs', 4) at line 4, where the configuration leaves ppo_epochs out")
    assert call.settings["mini_batch_size"].origin == f"rl.mini_batch_size at {config}:3"
    assert call.settings["init_kl_coef"].origin == "0.2 at line 6 while KL is unset"


def test_a_value_the_yaml_files_give_in_another_section_or_disagree_on_is_unknown(tmp_path):
    from klaudit.frameworks.options import option_defaults

    (tmp_path / "sft.yaml").write_text("training:\n  mini_batch_size: 1\n")  # not the section `rl` names
    (tmp_path / "a.yaml").write_text("rl:\n  batch_size: 16\n")
    (tmp_path / "b.yaml").write_text("rl:\n  batch_size: 32\n")  # two values: which a run reads is unknown
    options = option_defaults({}, [str(tmp_path / name) for name in ("sft.yaml", "a.yaml", "b.yaml")])
    reader = cst_configs._Reader(NAMES | {"PPOConfig"}, ("ppo_epochs",), "t.py", options)
    libcst.MetadataWrapper(libcst.parse_module(INLINE_READS), unsafe_skip_copy=True).visit(reader)
    [call] = reader.calls
    assert call.settings["mini_batch_size"].value is None and call.settings["batch_size"].value is None
    assert call.settings["ppo_epochs"].value == "4"


def _beta_read(tmp_path, source: str, configs: list[str]):
    """The `beta` setting the config reader finds in `source` beside YAML files of the texts `configs` (c0.yaml,
    c1.yaml, ...), which are removed again."""
    from klaudit.frameworks.options import option_defaults

    paths = []
    for index, text in enumerate(configs):
        (tmp_path / f"c{index}.yaml").write_text(text)
        paths.append(str(tmp_path / f"c{index}.yaml"))
    reader = cst_configs._Reader(NAMES | {"GRPOConfig"}, ("beta",), "t.py", option_defaults({}, paths))
    libcst.MetadataWrapper(libcst.parse_module(source), unsafe_skip_copy=True).visit(reader)
    [call] = reader.calls
    for path in paths:
        Path(path).unlink()
    return call.settings["beta"]


SWEPT_BETA = '''\
from trl import GRPOConfig

def build(training_conf):
    return GRPOConfig(output_dir="out", beta=training_conf.get("beta", 0.04))
'''


def test_a_coefficient_the_yaml_files_sweep_is_judged_where_it_is_on(tmp_path):
    """sol0invictus/rlvr_experiments (seventy-second set) reads `beta=training_conf.get('beta', 0.04)` while its
    sweep's configs set `training.beta` to 0.0, 0.01 and 0.1: the runs of 0.01 and 0.1 train with the k3 term, so
    the keyword is judged at the first value strictly between 0 and 1, with the range named. Configs that agree give
    their one value, as before; a sweep with a value outside [0, 1), where 0 and 1 are not the only thresholds that
    matter, leaves it unknown."""
    def beta(*values: str) -> tuple[str | None, str]:
        found = _beta_read(tmp_path, SWEPT_BETA, [f"training:\n  lr: 1e-6\n  beta: {value}\n" for value in values])
        return found.value, found.origin

    assert beta("0.0", "0.01", "0.1") == (
        "0.01", f"training.beta at {tmp_path / 'c1.yaml'}:3; the 3 configs that set it give 0 to 0.1")
    assert beta("0.0", "0.0")[0] == "0.0"
    assert beta("0.0", "0.5", "2.0")[0] is None


GENERIC_HOLDER = '''\
from trl import GRPOConfig

class Trainer:
    def __init__(self, training_cfg=None):
        cfg = training_cfg or {}
        self.args = GRPOConfig(output_dir="out", beta=cfg.get("kl_coef", 0.01))
'''


@pytest.mark.parametrize("values, expected", [
    (("0.01", "0.02"), "0.01"),  # every config trains with the term: the first file's value stands for them
    (("0.02", "0.02"), "0.02"),
    (("0.0", "0.02"), None),  # a run without the term: which one a run reads is unknown
    (("0.02", "1.5"), None),
])
def test_a_mapping_named_for_no_section_reads_the_key_wherever_the_files_set_it(tmp_path, values, expected):
    """GuyNachshon/GRP-Obliteration (hundred-and-first set) hands `training_cfg` on as `cfg` and reads
    `beta=cfg.get("kl_coef", 0.01)`, while its model configs set `training.kl_coef` to 0.01 or 0.02: `cfg` names no
    section (a generic name), so it may be any `training` of them, and each has the k3 term on."""
    configs = [f"model:\n  name: q\ntraining:\n  kl_coef: {value}\n" for value in values]
    assert _beta_read(tmp_path, GENERIC_HOLDER, configs).value == expected


def test_a_mapping_named_for_another_section_still_reads_nothing_there(tmp_path):
    """The fallback is for a generic holder only: `rl.get("kl_coef", 0.01)` where the files set only
    `training.kl_coef` stays unknown, as a value in another section was before."""
    source = GENERIC_HOLDER.replace("cfg = training_cfg or {}", "rl = training_cfg or {}").replace("cfg.get", "rl.get")
    assert _beta_read(tmp_path, source, ["rl:\n  lr: 1e-6\ntraining:\n  kl_coef: 0.02\n"]).value is None


ALIASED_SECTION = '''\
from trl import GRPOConfig

class Trainer:
    def train(self):
        train_cfg = self.cfg.training
        return GRPOConfig(output_dir="out", beta=train_cfg.get("beta", 0.5))
'''


@pytest.mark.parametrize("module, expected", [
    ("pipeline/grpo_trainer.py", ("0.04", "training.beta at {root}/configs/grpo.yaml:2")),  # the config named so
    ("pipeline/trainer.py", ("0.1", "training.beta at {root}/configs/dpo.yaml:2; the 2 configs that set it give "
                                    "0.04 to 0.1")),  # no config named for it: the sweep's first file's value
])
def test_a_read_of_a_section_bound_to_a_name_looks_in_that_section_of_the_file_named_for_the_module(
        tmp_path, module, expected):
    """break-through-19/slm-agentic-post-training-pipeline (seventy-third set) binds `train_cfg = self.cfg.training`
    and reads `beta=train_cfg.get("beta", 0.04)` in grpo_trainer.py, while configs/grpo.yaml sets `training.beta:
    0.04` and configs/dpo.yaml, DPO's, `training.beta: 0.1`: the name stands for the section `training`, and of the
    configs that disagree the one named like the module decides."""
    from klaudit.frameworks.options import option_defaults

    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "dpo.yaml").write_text("training:\n  beta: 0.1\n")
    (tmp_path / "configs" / "grpo.yaml").write_text("training:\n  beta: 0.04\n")
    options = option_defaults({}, [str(tmp_path / "configs" / name) for name in ("dpo.yaml", "grpo.yaml")])
    found = calls._python_configs(ALIASED_SECTION, NAMES | {"GRPOConfig"}, ("beta",), str(tmp_path / module), options)
    assert found is not None
    [call] = found[0]
    assert (call.settings["beta"].value, call.settings["beta"].origin) == \
        (expected[0], expected[1].format(root=tmp_path))


@pytest.mark.parametrize("section", ['self.cfg.get("training", {})', 'self.cfg.get("training")',
                                     'self.cfg["training"]'])
def test_a_section_read_with_get_is_the_section(tmp_path, section):
    """shatianming5/goodhart-cascade (seventy-sixth set) binds `train_cfg = cfg.get("training", {})` and reads
    `beta=train_cfg.get("kl_coeff", 0.03)`: the name stands for the section `training` as `cfg["training"]` would.
    A `.get` with another default than an empty mapping (a value, not a section) stands for no section."""
    from klaudit.frameworks.options import option_defaults

    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "grpo.yaml").write_text("training:\n  beta: 0.01\n")
    options = option_defaults({}, [str(tmp_path / "configs" / "grpo.yaml")])
    source = ALIASED_SECTION.replace("self.cfg.training", section)
    found = calls._python_configs(source, NAMES | {"GRPOConfig"}, ("beta",), str(tmp_path / "trainer.py"), options)
    assert found is not None and found[0][0].settings["beta"].value == "0.01"
    valued = ALIASED_SECTION.replace("self.cfg.training", 'self.cfg.get("training", 3)')
    found = calls._python_configs(valued, NAMES | {"GRPOConfig"}, ("beta",), str(tmp_path / "trainer.py"), options)
    assert found is not None and found[0][0].settings["beta"].value is None  # not known to be the section's 0.01


@pytest.mark.parametrize("imported, read", [("import config", "config.BETA"), ("import config as c", "c.BETA"),
                                           ("import settings.config as c", "c.BETA")])
def test_a_constant_of_an_imported_project_module_read_as_its_attribute(tmp_path, imported, read):
    """dasanindya/wordle-grpo (seventy-fifth set): src/train_grpo.py does `import config` and builds
    `GRPOConfig(beta=config.BETA)`, where src/config.py binds `BETA = float(os.environ.get("WORDLE_BETA", "0.04"))`:
    0.04 where the variable is unset."""
    folder = tmp_path / "settings" if "settings" in imported else tmp_path
    folder.mkdir(exist_ok=True)
    (folder / "config.py").write_text('import os\n\nBETA = float(os.environ.get("WORDLE_BETA", "0.04"))\n')
    source = f"{imported}\nfrom trl import GRPOConfig\n\nargs = GRPOConfig(output_dir='out', beta={read})\n"
    found = calls._python_configs(source, NAMES | {"GRPOConfig"}, ("beta",), str(tmp_path / "train.py"))
    assert found is not None and found[0][0].settings["beta"].value == "0.04"
    other = source.replace(read, read.replace("BETA", "GAMMA"))  # a name the module does not bind: unknown
    found = calls._python_configs(other, NAMES | {"GRPOConfig"}, ("beta",), str(tmp_path / "train.py"))
    assert found is not None and found[0][0].settings["beta"].value is None


IMPORTED_CONSTANTS = '''\
from trl import PPOConfig
from config import PPO_EPOCHS, BATCH as PER_DEVICE, LR, REBOUND, MISSING
from settings.defaults import KL_COEF

REBOUND = 7
PPOConfig(num_ppo_epochs=PPO_EPOCHS, per_device_train_batch_size=PER_DEVICE, learning_rate=LR,
          num_mini_batches=PER_DEVICE // MINI, gradient_accumulation_steps=REBOUND, kl_coef=KL_COEF,
          total_episodes=(PPO_EPOCHS + 1) * PER_DEVICE - 2, response_length=MISSING, local_rollout_forward_batch_size=PER_DEVICE // 0)
MINI = 4
'''


def test_constants_imported_from_a_project_module_and_integer_arithmetic_resolve_alike_in_both_trees(tmp_path):
    from klaudit.frameworks.options import Options

    """i257608-cmd/rlhf-gpt2 (seventy-second set) imports `PPO_EPOCHS = 4`, `PPO_BATCH_SIZE = 16` and
    `PPO_MINI_BATCH = 4` from its config.py and sets `num_mini_batches=PPO_BATCH_SIZE // PPO_MINI_BATCH`: the
    constants are read from the module that binds them, and integer arithmetic on known values is computed."""
    (tmp_path / "config.py").write_text("PPO_EPOCHS = 4\nBATCH = 16\nLR = 1e-5\nREBOUND = 2\n")
    (tmp_path / "settings").mkdir()
    (tmp_path / "settings" / "defaults.py").write_text("KL_COEF = 0.2\nKL_COEF = 0.3\n")  # bound twice: no constant
    (tmp_path / "scripts").mkdir()
    script = tmp_path / "scripts" / "train.py"  # run from the project's root: `from config import` one folder up
    script.write_text(IMPORTED_CONSTANTS)
    names = ["PPOConfig"]
    from_python = calls._python_configs(IMPORTED_CONSTANTS, names, tuple(trl.KEYS), str(script), Options())
    assert from_python is not None
    reader = cst_configs._Reader(names, tuple(trl.KEYS), str(script), Options())
    libcst.MetadataWrapper(libcst.parse_module(IMPORTED_CONSTANTS), unsafe_skip_copy=True).visit(reader)
    assert from_python[0] == reader.calls
    settings = reader.calls[0].settings
    assert {key: setting.value for key, setting in settings.items()} == {
        "num_ppo_epochs": "4", "per_device_train_batch_size": "16", "learning_rate": "1e-5",
        "num_mini_batches": "4",  # MINI is bound after the call, but once, at module level: a constant all the same
        "gradient_accumulation_steps": None,  # imported, then bound again: no constant
        "kl_coef": None, "total_episodes": "78", "response_length": None,
        "local_rollout_forward_batch_size": None,  # a division by zero computes nothing
    }
    assert settings["num_ppo_epochs"].origin == "PPO_EPOCHS = 4 at config.py:1"
    assert settings["num_mini_batches"].origin == "PER_DEVICE // MINI with BATCH = 16 at config.py:2, MINI = 4 at line 9"


ENVIRONMENT_HELPER = '''\
import os
from trl import GRPOConfig


def _get_env_float(name, default):
    raw = os.getenv(name)
    if raw is None:
        return default
    return float(raw)


def env_or(key, fallback):
    return os.environ[key] if key in os.environ else fallback


def not_a_reader(name, default):
    return default * 2


STEPS = int(env_or("STEPS", 2))
a = GRPOConfig(beta=_get_env_float("GRPO_BETA", 0.05), num_iterations=STEPS, temperature=not_a_reader("T", 0.7))
'''


def test_a_helper_that_reads_an_environment_variable_with_a_fallback_reads_as_os_getenv():
    """antoninrottman/simple-grpo (seventy-third set) sets `beta=_get_env_float("GRPO_BETA", 0.05)` through a helper
    of its own around `os.getenv(name)`: a run that leaves the variable unset trains with 0.05. A function that
    reads no variable named by its first parameter is no such reader."""
    from klaudit.frameworks.options import Options

    found = calls._python_configs(ENVIRONMENT_HELPER, NAMES, tuple(trl.KEYS), "t.py", Options())
    assert found is not None
    [call] = found[0]
    assert {key: setting.value for key, setting in call.settings.items()} == {
        "beta": "0.05", "num_iterations": "2", "temperature": None}
    assert call.settings["beta"].origin == "0.05 at line 21 while GRPO_BETA is unset"
