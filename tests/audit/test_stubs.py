"""Dependencies that do not import are stubbed: the KL code that does not use them is audited, and
code that does fails with an error naming the stubbed module."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from klaudit.audit.runner import Target, audit_target  # noqa: E402
from klaudit.audit.stubs import StubbedDependencyError, StubFinder, failing_dependency  # noqa: E402

DATA = Path(__file__).parent / "data" / "stubbed"
STUBBED = ("klaudit_fixture_absent_cluster", "klaudit_fixture_absent_kernels", "fragile_dependency")


@pytest.fixture
def heavy_imports(monkeypatch):
    monkeypatch.syspath_prepend(str(DATA))  # where `fragile_dependency` is installed
    yield lambda qualname: audit_target(Target(path=str(DATA / "heavy_imports.py"), qualname=qualname),
                                        placements=("reward",))
    for name in [name for name in sys.modules if name.startswith(("_klaudit_target_heavy", *STUBBED))]:
        del sys.modules[name]


def test_kl_code_that_uses_no_stubbed_module_is_audited(heavy_imports):
    report = heavy_imports("k1_kl_reward")
    assert report.errors == []
    (row,) = report.results
    assert (row.objective, row.unbiased) == ("REV", True)
    (note,) = [note for note in report.notes if "stubbed:" in note]
    assert note.split("stubbed: ")[1].startswith(", ".join(STUBBED) + " (")


def test_kl_code_that_uses_a_stubbed_module_fails_naming_it(heavy_imports):
    report = heavy_imports("fused_kl")
    assert not report.results
    (error,) = report.errors
    assert "klaudit_fixture_absent_kernels.ops.fused_log_ratio" in error
    assert "install klaudit_fixture_absent_kernels" in error


def test_stubs_tolerate_module_level_use_only_while_importing():
    finder = StubFinder()
    finder.add("klaudit_fixture_absent_cluster", "missing")
    module = finder.create_module(finder.find_spec("klaudit_fixture_absent_cluster"))

    def decorated():
        return 1

    assert module.remote(decorated) is decorated and not module.available and module.__version__ == "0.0.0"
    assert types.new_class("Derived", (module.Base,)).__mro__[1:] == (object,)
    finder.importing = False
    for use in (lambda: module.remote(decorated), lambda: bool(module.available), lambda: module.x + 1):
        with pytest.raises(StubbedDependencyError, match="klaudit_fixture_absent_cluster"):
            use()


def test_the_users_package_torch_and_the_standard_library_are_never_stubbed():
    assert failing_dependency(ModuleNotFoundError("x", name="peft"), {"verl"}) == "peft"
    assert failing_dependency(ModuleNotFoundError("x", name="verl.utils"), {"verl"}) is None
    assert failing_dependency(ImportError("x", name="torch.distributed"), {"verl"}) is None
    assert failing_dependency(ImportError("x", name="json"), {"verl"}) is None


def test_torch_tensorboard_is_stubbed_where_tensorboard_is_missing(tmp_path, monkeypatch):
    # Megatron-LM's megatron/rl/rl_utils.py imports SummaryWriter beside its GRPO loss
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))  # the stub finder leaves with the test
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # not installed, whatever this machine has
    monkeypatch.delitem(sys.modules, "torch.utils.tensorboard", raising=False)
    (tmp_path / "trainer_with_writer.py").write_text(
        "from torch.utils.tensorboard import SummaryWriter\n\n\n"
        "def kl_loss(logprobs, ref_logprobs):\n    return logprobs - ref_logprobs\n")
    report = audit_target(Target(path=str(tmp_path / "trainer_with_writer.py"), qualname="kl_loss"),
                          placements=("loss",))
    assert report.errors == [] and report.results[0].objective == "ZERO"
    assert any("torch.utils.tensorboard" in note for note in report.notes)
    assert failing_dependency(ImportError("x", name="torch.utils.tensorboard"), {"verl"}) == "torch.utils.tensorboard"
    for name in [name for name in sys.modules if name.startswith(("torch.utils.tensorboard", "tensorboard"))]:
        monkeypatch.delitem(sys.modules, name)


def test_a_submodule_that_fails_is_stubbed_alone(tmp_path, monkeypatch):
    package = tmp_path / "klaudit_fixture_half_installed"
    package.mkdir()
    (package / "__init__.py").write_text("VERSION = '1'\n")
    (package / "kernels.py").write_text("raise OSError('no GPU here')\n")
    (tmp_path / "trainer_with_kernels.py").write_text(
        "import klaudit_fixture_half_installed as half\nfrom klaudit_fixture_half_installed.kernels import fused\n"
        "VERSION = half.VERSION\n\n\ndef kl_loss(logprobs, ref_logprobs):\n    return logprobs - ref_logprobs\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    report = audit_target(Target(path=str(tmp_path / "trainer_with_kernels.py"), qualname="kl_loss"),
                          placements=("loss",))
    assert report.errors == [] and report.results[0].objective == "ZERO"
    assert any("stubbed: klaudit_fixture_half_installed.kernels (" in note for note in report.notes)


def test_an_import_error_re_raised_by_a_lazy_module_names_its_cause():
    try:
        try:
            raise ModuleNotFoundError("No module named 'pandas'", name="pandas")
        except ModuleNotFoundError as missing:
            raise RuntimeError("Failed to import trl.models.utils") from missing
    except RuntimeError as error:
        assert failing_dependency(error, {"trl"}) == "pandas"


def test_a_module_of_the_users_package_that_fails_is_stubbed_unless_it_holds_the_audited_one():
    assert failing_dependency(ModuleNotFoundError("x", name="verl.utils"), {"verl"}, "verl.trainer.core_algos") == "verl.utils"
    assert failing_dependency(ModuleNotFoundError("x", name="verl.trainer"), {"verl"}, "verl.trainer.core_algos") is None
    assert failing_dependency(ModuleNotFoundError("x", name="verl.trainer.core_algos"), {"verl"},
                              "verl.trainer.core_algos") is None


def test_a_package_module_that_checks_its_environment_at_import_is_stubbed(tmp_path, monkeypatch):
    """NeMo-RL's shape: the loss utilities import the policy package, which asserts a transformers release
    when imported; the KL function uses nothing of it and is audited, and one that does fails naming it."""
    package = tmp_path / "klaudit_fixture_env_checked"
    (package / "policy").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "policy" / "__init__.py").write_text(
        "def _check():\n    assert False, 'written for an older transformers'\n\n\n_check()\nLIMIT = 20.0\n")
    (package / "losses.py").write_text(
        "from klaudit_fixture_env_checked.policy import LIMIT\n\n\n"
        "def k1_reward(logprobs, ref_logprobs):\n    return (logprobs - ref_logprobs).detach()\n\n\n"
        "def clamped_k1(logprobs, ref_logprobs):\n    return (logprobs - ref_logprobs).clamp(-LIMIT, LIMIT)\n")
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))  # the stub finder leaves with the test
    for qualname, placements in (("k1_reward", ("reward",)), ("clamped_k1", ("loss",))):
        report = audit_target(Target(path=str(package / "losses.py"), qualname=qualname), placements=placements)
        if qualname == "k1_reward":
            assert report.errors == [] and (report.results[0].objective, report.results[0].unbiased) == ("REV", True)
            assert any("stubbed: klaudit_fixture_env_checked.policy (" in note for note in report.notes)
        else:
            assert not report.results and "klaudit_fixture_env_checked.policy" in report.errors[0]
    for name in [name for name in sys.modules if name.startswith("klaudit_fixture_env_checked")]:
        monkeypatch.delitem(sys.modules, name)


def test_a_users_module_whose_call_into_an_installed_library_raises_at_import_is_stubbed(tmp_path, monkeypatch):
    """A trainer's package whose reward module calls into an installed library in a class body (a config
    fetched from the Hub, which raises offline): the library imported fine, so stubbing it changes nothing;
    the user's module that made the call is stubbed instead, and the KL code beside it is audited."""
    package = tmp_path / "klaudit_fixture_hub_config"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "reward.py").write_text(
        "import libcst\n\n\nclass ScalarConfig:\n    tree = libcst.parse_module('def (')\n\n\n"
        "def get_reward(model, ids):\n    return model(ids)\n")
    (package / "grpo.py").write_text(
        "from .reward import get_reward\n\n\n"
        "def kl_reward(logprobs, ref_logprobs):\n    return (logprobs - ref_logprobs).detach()\n")
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))  # the stub finder leaves with the test
    report = audit_target(Target(path=str(package / "grpo.py"), qualname="kl_reward"), placements=("reward",))
    assert report.errors == [] and [(row.objective, row.unbiased) for row in report.results] == [("REV", True)]
    (note,) = [note for note in report.notes if "stubbed:" in note]
    assert "stubbed: klaudit_fixture_hub_config.reward (" in note and "libcst" not in note.split(" (")[0]
    for name in [name for name in sys.modules if name.startswith("klaudit_fixture_hub_config")]:
        monkeypatch.delitem(sys.modules, name)


def test_a_copied_module_with_relative_imports_outside_any_package_is_audited(tmp_path, monkeypatch):
    """A framework's trainer copied into a scripts folder with no __init__.py keeps its relative imports: it is
    imported inside packages whose paths are its folder and the ones above it, so the file beside it is read
    for real, and what is not on disk (`..core`, a name the package would export) is stubbed, named as the file
    spells it."""
    scripts = tmp_path / "project" / "scripts"
    scripts.mkdir(parents=True)
    (scripts / "utils.py").write_text("def masked_sum(values, mask):\n    return (values * mask).sum(-1)\n")
    (scripts / "ppo_trainer.py").write_text(
        "from ..core import logprobs_from_logits\n"
        "from . import BaseTrainer\n"
        "from .utils import masked_sum\n\n\n"
        "class PPOTrainer(BaseTrainer):\n"
        "    def kl_reward(self, logprobs, ref_logprobs, mask):\n"
        "        return masked_sum((logprobs - ref_logprobs).detach(), mask)\n")
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))  # the stub finder leaves with the test
    report = audit_target(Target(path=str(scripts / "ppo_trainer.py"), qualname="PPOTrainer.kl_reward"),
                          placements=("reward",))
    assert report.errors == [] and [(row.objective, row.unbiased) for row in report.results] == [("REV", True)]
    (note,) = [note for note in report.notes if "stubbed:" in note]
    assert "stubbed: ..core, .BaseTrainer (" in note
    for name in [name for name in sys.modules if name.startswith("_klaudit_parents")]:
        monkeypatch.delitem(sys.modules, name)


def test_a_name_the_audited_modules_own_package_lacks_is_stubbed_as_its_submodule():
    error = ImportError("cannot import name 'BaseTrainer' from 'trl.trainer' (unknown location)", name="trl.trainer")
    assert failing_dependency(error, {"trl"}, "trl.trainer.ppo_trainer") == "trl.trainer.BaseTrainer"
