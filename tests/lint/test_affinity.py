"""Files analysed in one worker (klaudit.lint.affinity): a module with the one file of the run that imports
it, groups small enough to keep the workers busy, and the same findings as one file a task."""

from __future__ import annotations

from pathlib import Path

from klaudit.lint import affinity, engine
from klaudit.lint.project import Project
from tests.lint.test_determinism import CALLER, found, write_project


def sources(root: Path, files: dict[str, str]) -> dict[str, str]:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return {str(root / name): text for name, text in files.items()}


def named(groups: list[list[str]], root: Path) -> list[list[str]]:
    return [[str(Path(path).relative_to(root)) for path in group] for group in groups]


def test_a_module_imported_by_one_file_of_the_run_is_analysed_with_it(tmp_path):
    texts = sources(tmp_path, {
        "pkg/trainer.py": "from .shared import agg\n" + "kl = 1\n" * 20,
        "pkg/small.py": "from pkg.trainer import Trainer  # kl\n",
        "pkg/shared.py": "def agg(x):\n    return x\n",
        "pkg/user.py": "from .shared import agg  # kl\n",
        "big.py": "# kl\n" * 500,
    })
    groups = affinity.groups(texts, Project([tmp_path]), workers=1)
    # shared.py has two importers and stays alone
    assert named(groups, tmp_path) == [["big.py"], ["pkg/trainer.py", "pkg/small.py"], ["pkg/user.py"],
                                       ["pkg/shared.py"]]


def test_a_file_without_kl_vocabulary_imports_nothing_it_would_be_analysed_with(tmp_path):
    # the package's __init__ names the trainer too, but it is never parsed: it follows no import
    texts = sources(tmp_path, {
        "pkg/__init__.py": "from .trainer import Trainer\nfrom .gmpo import GMPOConfig\n",
        "pkg/trainer.py": "def loss(ref_logps):\n    return ref_logps\n" + "x = 1\n" * 20,
        "pkg/gmpo.py": "from .trainer import Trainer  # kl\n",
        "big.py": "# kl\n" * 100,
    })
    groups = affinity.groups(texts, Project([tmp_path]), workers=1)
    assert named(groups, tmp_path) == [["big.py"], ["pkg/trainer.py", "pkg/gmpo.py"], ["pkg/__init__.py"]]


def test_a_group_stays_within_a_share_of_the_run_that_keeps_the_workers_busy(tmp_path):
    # a chain of imports, each module imported by the next file only
    files = {f"m{index}.py": f"from m{index + 1} import f\n" + "# kl\n" * 10 for index in range(7)}
    files["m7.py"] = "def f():\n    return 1\n"
    texts = sources(tmp_path, files)
    total = sum(len(text) for text in texts.values())
    for workers in (1, 2, 4):
        groups = affinity.groups(texts, Project([tmp_path]), workers)
        assert sorted(path for group in groups for path in group) == sorted(texts)
        assert all(len(group) == 1 or sum(len(texts[p]) for p in group) <= total // (2 * workers) for group in groups)
    assert max(len(group) for group in affinity.groups(texts, Project([tmp_path]), 1)) > 1


def test_grouped_files_give_the_findings_of_one_file_a_task(tmp_path, monkeypatch):
    write_project(tmp_path)
    for index in range(2 * engine.MIN_FILES_PER_WORKER):
        (tmp_path / f"z_shallow_{index}.py").write_text(CALLER.format(module="chain", name="kl_estimate", extra=""))
    grouped = found([tmp_path], jobs=2)
    monkeypatch.setattr(affinity, "groups", lambda sources, project, workers: [[path] for path in sources])
    assert found([tmp_path], jobs=2) == grouped == found([tmp_path], jobs=1)
