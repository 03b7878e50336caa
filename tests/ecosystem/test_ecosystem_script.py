"""The comparison logic of scripts/ecosystem.py on a tiny synthetic corpus (no real trees, no lint run)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "ecosystem.py"
spec = importlib.util.spec_from_file_location("ecosystem_script", SCRIPT)
ecosystem = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = ecosystem  # dataclasses look their module up there
spec.loader.exec_module(ecosystem)


def finding(tree: Path, file: str, code: str, line: int) -> dict:
    return {"code": code, "filename": str(tree / file), "location": {"row": line, "column": 1}, "message": code}


def site(file: str, line: int, code: str, verdict: str) -> dict:
    return {"file": file, "line": line, "code": code, "verdict": verdict, "reason": f"{verdict} {code}"}


@pytest.fixture
def corpus(tmp_path: Path):
    """Two repositories: one whose lint agrees with the review, one with every kind of difference."""
    root, expected, findings = tmp_path / "corpus", tmp_path / "expected", tmp_path / "findings"
    for folder in (root, expected, findings):
        folder.mkdir()
    repos = {"repos": [{"repo": "a/good", "commit": "1", "dir": "a+good"},
                       {"repo": "b/bad", "commit": "2", "dir": "b+bad"}]}
    (tmp_path / "repos.json").write_text(json.dumps(repos))

    good = root / "a+good"
    (expected / "a+good.json").write_text(json.dumps({"sites": [
        site("loss.py", 10, "KL002", "tp"),     # found twice at the same line (a switch): one site
        site("loss.py", 20, "KL003", "miss"),   # still missed
        site("loss.py", 30, "KL011", "fp"),     # still reported wrongly
        site("reward.py", 5, "KL004", "ok"),    # rightly silent
    ]}))
    (findings / "a+good.json").write_text(json.dumps([
        finding(good, "loss.py", "KL002", 10), finding(good, "loss.py", "KL002", 10),
        finding(good, "loss.py", "KL011", 31),  # within the line tolerance
    ]))

    bad = root / "b+bad"
    (expected / "b+bad.json").write_text(json.dumps({"sites": [
        site("x.py", 1, "KL001", "tp"),         # not found any more: lost
        site("x.py", 50, "KL004", "ok"),        # now reported: a new false positive
        site("x.py", 70, "KL007", "miss"),      # now found
        site("x.py", 90, "KL009", "fp"),        # no longer reported: fixed
    ]}))
    (findings / "b+bad.json").write_text(json.dumps([
        finding(bad, "x.py", "KL004", 50),
        finding(bad, "x.py", "KL007", 72),
        finding(bad, "x.py", "KL002", 200),     # no reviewed site: unreviewed
        finding(bad, "x.py", "KL001", 9),       # same code as the lost site, but too far away
    ]))
    args = ["--root", str(root), "--repos", str(tmp_path / "repos.json"), "--expected", str(expected),
            "--findings", str(findings), "--json"]
    return args


def run(args: list[str], capsys) -> tuple[int, dict]:
    status = ecosystem.main(args)
    return status, json.loads(capsys.readouterr().out)


def test_agreeing_repository_passes_with_its_recall_and_precision(corpus, capsys):
    status, table = run(corpus + ["--repo", "good"], capsys)
    assert status == 0
    total = table["total"]
    assert (total["tp"], total["fp"], total["miss"], total["ok"], total["lost"], total["unreviewed"]) == (1, 1, 1, 1, 0, 0)
    assert total["recall"] == 0.5      # 1 found of 2 real pitfalls
    assert total["precision"] == 0.5   # 1 right of 2 reviewed findings
    assert table["repos"]["a+good"]["codes"]["KL002"]["tp"] == 1
    assert table["repos"]["a+good"]["diff"] == []


def test_every_difference_is_listed_and_fails_the_check(corpus, capsys):
    status, table = run(corpus + ["--repo", "bad"], capsys)
    assert status == 1
    outcomes = sorted((d["outcome"], d["code"], d["line"]) for d in table["repos"]["b+bad"]["diff"])
    assert outcomes == [("fixed_fp", "KL009", 90), ("lost", "KL001", 1), ("new_fp", "KL004", 50),
                        ("now_found", "KL007", 72), ("unreviewed", "KL001", 9), ("unreviewed", "KL002", 200)]
    total = table["total"]
    assert (total["tp"], total["fp"], total["lost"], total["unreviewed"]) == (1, 1, 1, 2)
    assert total["recall"] == 0.5      # the found miss counts, the lost finding does not
    assert total["precision"] == 0.5


def test_totals_add_up_over_repositories(corpus, capsys):
    status, table = run(corpus, capsys)
    assert status == 1
    assert table["total"]["tp"] == 2 and table["total"]["fp"] == 2
    assert table["total"]["recall"] == pytest.approx(2 / 4, abs=1e-3)
    assert table["codes"]["KL002"] == {"tp": 1, "fp": 0, "miss": 0, "ok": 0, "lost": 0, "unreviewed": 1,
                                       "fixed_fp": 0, "recall": 1.0, "precision": 1.0}
    assert table["codes"]["KL004"]["ok"] == 1  # a+good's silent site; b+bad's is now reported


def test_findings_about_files_are_listed_apart_and_not_scored(corpus, capsys, tmp_path):
    """A syntax error (KL000) or a cut-short analysis (KL099) is no KL site: neither unreviewed nor a hit."""
    path = tmp_path / "findings" / "a+good.json"
    records = json.loads(path.read_text())
    good = tmp_path / "corpus" / "a+good"
    path.write_text(json.dumps(records + [finding(good, "broken.py", "KL000", 3), finding(good, "big.py", "KL099", 7)]))
    status, table = run(corpus + ["--repo", "good"], capsys)
    assert status == 0
    assert table["total"]["unreviewed"] == 0 and table["total"]["tp"] == 1
    assert [(f["file"], f["code"]) for f in table["repos"]["a+good"]["file_level"]] == [("big.py", "KL099"), ("broken.py", "KL000")]


def test_a_saved_report_whose_lint_hit_an_internal_error_is_an_error(corpus, capsys, tmp_path):
    """A report read with --findings beside the lint's stderr: an internal error there means files went
    unanalysed (six flag findings of TRL's tests vanished so on 2026-11-29), so the tree fails as a live
    lint that exits 2 does; other stderr lines (warnings) do not."""
    stderr = tmp_path / "findings" / "a+good.err"
    stderr.write_text("warning: a notebook without code cells\n")
    assert run(corpus + ["--repo", "good"], capsys)[0] == 0
    stderr.write_text("error: /x/tests/test_grpo.py: internal error: IndexError: list index out of range\n")
    status, table = run(corpus + ["--repo", "good"], capsys)
    assert status == 2 and "internal error" in table["repos"]["a+good"]["error"]


def test_a_missing_tree_is_an_error_not_a_pass(corpus, capsys, tmp_path):
    args = [a for a in corpus if a not in ("--findings", str(tmp_path / "findings"))]
    status = ecosystem.main(args + ["--repo", "good"])
    capsys.readouterr()
    assert status == 2


def test_an_unknown_verdict_is_rejected(tmp_path):
    path = tmp_path / "x.json"
    path.write_text(json.dumps({"sites": [site("a.py", 1, "KL001", "maybe")]}))
    with pytest.raises(ValueError, match="maybe"):
        ecosystem.load_sites(path)


CORPORA = sorted(path.parent.relative_to(SCRIPT.parents[1] / "tests" / "ecosystem").as_posix().strip(".")
                 for path in (SCRIPT.parents[1] / "tests" / "ecosystem").glob("**/repos.json"))


def test_every_set_is_checked():
    assert {"", "heldout", "fresh", "fresh17", "fresh18"} <= set(CORPORA)


@pytest.mark.parametrize("corpus", CORPORA)
def test_the_committed_review_is_well_formed(corpus):
    """Every committed expectation names a repository of its set, a rule code and a reason."""
    folder = SCRIPT.parents[1] / "tests" / "ecosystem" / corpus
    names = {entry["dir"] for entry in json.loads((folder / "repos.json").read_text())["repos"]}
    codes = {f"KL{n:03d}" for n in range(1, 12)}
    for path in (folder / "expected").glob("*.json"):
        assert path.stem in names
        sites = ecosystem.load_sites(path)  # none: reviewed, and no KL site in it
        for entry in sites:
            assert entry.code in codes and entry.reason and not entry.file.startswith("/")
        keys = [(s.file, s.code, s.line) for s in sites]
        assert len(keys) == len(set(keys)), f"duplicate site in {path.name}"


def test_the_klaudit_of_pythonpath_is_measured_even_from_inside_a_checkout(tmp_path, monkeypatch):
    """`python -m` puts its working directory first on sys.path: run from this checkout with another
    checkout on PYTHONPATH, the lint must still be that other checkout's (here a stand-in that prints
    a marker instead of linting)."""
    other = tmp_path / "other" / "klaudit"
    other.mkdir(parents=True)
    (other / "__init__.py").write_text("")
    (other / "__main__.py").write_text('print(\'[{"marker": "other checkout"}]\')\n')
    tree = tmp_path / "tree"
    tree.mkdir()
    monkeypatch.chdir(SCRIPT.parents[1])
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "other"))
    assert ecosystem.run_lint(tree, timeout=60, select=None) == [{"marker": "other checkout"}]


def test_a_flag_finding_whose_version_note_holds_parentheses_is_scored_as_a_flag(tmp_path):
    """A note on a git-commit pin klaudit cannot place carries its own parenthesis (how to pin a release): the finding is still
    a flag finding, not an unreviewed code site. The message is klaudit's own, from a lint of a tree
    that pins TRL at a commit and runs it with beta > 0."""
    from klaudit.lint.engine import lint_paths

    (tmp_path / "setup.py").write_text(
        'install_requires = ["trl @ git+https://github.com/huggingface/trl.git@0123456789abcdef0123456789abcdef01234567"]\n')
    (tmp_path / "train.py").write_text("from trl import GRPOConfig\n\nargs = GRPOConfig(beta=0.1)\n")
    messages = [f.message for f in lint_paths([str(tmp_path)]).findings if f.code != "KL099"]
    assert messages and all("git commit" in m for m in messages)
    assert all(ecosystem.FLAG_MESSAGE.search(m) for m in messages)



def test_nemo_rl_findings_are_scored_as_flags(tmp_path):
    """The three ways a NeMo-RL finding names its release (the default, a container image, the project's copy),
    from klaudit's own lint of a NeMo-RL config."""
    from klaudit.frameworks import Context, lint_config

    extras = {"default": {}, "image": {"job.sh": "srun --container-image=nvcr.io/nvidia/nemo-rl:v0.5.0 true\n"},
              "copy": {"pyproject.toml": "", "nemo_rl/algorithms/loss_functions.py": "kl = calculate_kl_penalty_joschu2020(a, b)\n"}}
    messages = {}
    for name, files in extras.items():
        root = tmp_path / name
        for relative, text in {**files, "grpo.yaml": "grpo:\n  num_prompts_per_step: 8\nloss_fn:\n  reference_policy_kl_penalty: 0.01\n"}.items():
            (root / relative).parent.mkdir(parents=True, exist_ok=True)
            (root / relative).write_text(text)
        found = lint_config(str(root / "grpo.yaml"), (root / "grpo.yaml").read_text(), Context(roots=(str(root),)))
        messages[name] = found[0].message
    assert "[NeMo-RL 0.7: " in messages["default"] and "[NeMo-RL 0.5 (nvcr.io/nvidia/nemo-rl:v0.5.0 in job.sh): " in messages["image"]
    assert "[NeMo-RL (the copy in nemo_rl/): " in messages["copy"]
    assert all(ecosystem.FLAG_MESSAGE.search(m) for m in messages.values())


@pytest.mark.parametrize("path, text, name", [
    ("run.sh", "cd /root/slime\npython3 train.py --use-kl-loss --kl-loss-coef 0.01 --kl-loss-type low_var_kl\n", "slime"),
    ("run.sh", "cd /root/miles\npython3 train.py --use-kl-loss --kl-loss-coef 0.01 --kl-loss-type low_var_kl\n", "miles"),
    ("rlvr.yaml", "use_kl_loss: true\nkl_loss_coef: 0.01\nactor_train:\n  device_mapping: list(range(0,8))\n"
     "actor_infer:\n  device_mapping: list(range(0,8))\n", "ROLL"),
    ("train.sh", "swift rlhf --rlhf_type grpo --beta 0.001 --model m\n", "ms-swift"),
])
def test_slime_and_roll_findings_are_scored_as_flags(path, text, name):
    """A slime (or miles) launch's, a ROLL config's or an ms-swift launch's finding (its release unnamed, as
    EasyR1's), from klaudit's own lint."""
    from klaudit.frameworks import lint_config

    (finding, *_) = lint_config(path, text)
    assert f"[{name}: " in finding.message and ecosystem.FLAG_MESSAGE.search(finding.message)


def test_easydel_findings_are_scored_as_flags(tmp_path):
    """An EasyDeL finding names `easydel` and its release, from klaudit's own lint of a GRPOConfig call."""
    from klaudit.lint.engine import lint_paths

    (tmp_path / "train.py").write_text("import easydel as ed\n\nconfig = ed.GRPOConfig(beta=0.04)\n")
    messages = [f.message for f in lint_paths([str(tmp_path)]).findings]
    assert messages and all("[easydel 0.3: " in m and ecosystem.FLAG_MESSAGE.search(m) for m in messages)
