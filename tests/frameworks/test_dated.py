"""An unpinned framework dependency installs the latest release today, but the environment the project set up got the
release that was newest on the day git says the file declaring it was last committed (klaudit.frameworks.dated), and
the findings name what that release gives where it differs: TRL 1.10 turned use_bias_correction_kl on by default, so
`GRPOConfig(beta=0.04)` is ratio*k3 under the latest TRL 1.16, kl-math.md row 2 (KL003), while beside a bare `trl`
committed in July 2026 (TRL 1.7) it was a k3 loss, row 3 (KL002); committed in September (TRL 1.13) it was KL003 too. The publication days are TRL's on PyPI: 1.3 on 2026-04-26, 1.4 on
2026-05-08, 1.7 on 2026-06-25, 1.8 on 2026-07-09, 1.13 on 2026-09-10, 0.14 (the oldest klaudit knows) on 2025-01-29."""

from __future__ import annotations

import datetime
import json
import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from klaudit.cli import main
from klaudit.frameworks import dated
from klaudit.frameworks.versions import DEFAULT, Assumed, detect

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")

SCRIPT = "from trl import GRPOConfig, GRPOTrainer\n\nconfig = GRPOConfig(beta=0.04)\nGRPOTrainer(args=config).train()\n"


@pytest.fixture(autouse=True)
def _fresh_days():
    dated.last_committed.cache_clear()
    yield
    dated.last_committed.cache_clear()


def _git(repo: Path, *arguments: str, day: str = "2026-01-01") -> None:
    stamp = f"{day}T12:00:00+00:00"
    subprocess.run(["git", "-C", str(repo), *arguments], check=True, capture_output=True,
                   env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                        "GIT_COMMITTER_EMAIL": "t@t", "HOME": str(repo), "GIT_AUTHOR_DATE": stamp,
                        "GIT_COMMITTER_DATE": stamp})


def _project(root: Path, requirements: str, day: str, script: str = SCRIPT) -> Path:
    """A git repository whose requirements.txt and train.py were committed on `day`."""
    root.mkdir()
    (root / "requirements.txt").write_text(requirements)
    (root / "train.py").write_text(script)
    _git(root, "init", "-q")
    _git(root, "add", ".")
    _git(root, "commit", "-q", "-m", "train", day=day)
    return root


@pytest.mark.parametrize("requirements, day, expected", [
    ("trl\n", "2026-05-05", "1.3"),  # 1.4 came out three days later
    ("torch\ntrl>=0.12.0\n", "2026-07-08", "1.7"),  # a lower bound the newest meets says no more
    ("trl[vllm]\n", "2026-07-09", "1.8"),  # published that day
    ("trl >= 1.5\n", "2026-05-05", "1.5"),  # asked for one not out yet (a clock or a rebase): the oldest it allows
])
def test_an_unpinned_trl_got_the_newest_release_of_the_day_its_file_was_committed(tmp_path, requirements, day, expected):
    found = detect([_project(tmp_path / "p", requirements, day)])["trl"]
    assert found == Assumed(DEFAULT["trl"], then=Assumed(
        expected, f"trl {expected}, the newest when requirements.txt was last committed ({day})", guessed=True))


def test_a_day_before_every_known_release_is_an_older_release(tmp_path):
    then = detect([_project(tmp_path / "p", "trl\n", "2024-12-01")])["trl"].then
    assert (then.version, then.older) == ("0.14", True)
    assert then.source == "trl 0.14, a release older than every known one, the newest when requirements.txt was " \
                          "last committed (2024-12-01)"


def test_a_file_changed_since_or_never_committed_or_outside_git_or_of_the_latest_release_says_nothing(tmp_path):
    changed = _project(tmp_path / "changed", "trl\n", "2026-05-05")
    (changed / "requirements.txt").write_text("trl\ntorch\n")
    untracked = _project(tmp_path / "untracked", "torch\n", "2026-05-05")
    (untracked / "requirements-train.txt").write_text("trl\n")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "requirements.txt").write_text("trl\n")
    latest = _project(tmp_path / "latest", "trl\n", "2026-11-30")
    for root in (changed, untracked, outside, latest):
        assert "trl" not in detect([root]), root
    assert dated.last_committed(outside / "requirements.txt") is None


def test_a_pin_or_an_upper_bound_is_not_dated(tmp_path):
    assert detect([_project(tmp_path / "pinned", "trl==1.12.0\n", "2026-05-05")])["trl"] == Assumed(
        "1.12", "1.12.0 in requirements.txt")
    bounded = detect([_project(tmp_path / "bounded", "trl>=1.0,<1.12\n", "2026-05-05")])["trl"]
    assert bounded.version == "1.11" and bounded.then is None


def _findings(root: Path) -> dict[str, str]:
    result = CliRunner().invoke(main, ["lint", "--output-format", "json", str(root)])
    assert result.exit_code in (0, 1), result.output
    return {finding["code"]: finding["message"] for finding in json.loads(result.output)}


def test_the_latest_release_decides_and_the_release_of_the_day_is_named_where_it_differs(tmp_path):
    july = _findings(_project(tmp_path / "july", "trl\n", "2026-07-08"))
    assert list(july) == ["KL003"] and july["KL003"].endswith(
        "; under trl 1.7, the newest when requirements.txt was last committed (2026-07-08): KL002 instead")
    september = _findings(_project(tmp_path / "september", "trl\n", "2026-09-12"))
    assert list(september) == ["KL003"] and "under trl" not in september["KL003"]  # TRL 1.13: ratio*k3 as well
    # TRL 0.15: a k3 loss under each completion's own token mean, 1/|o| (kl-math.md row 21)
    march = _findings(_project(tmp_path / "march", "trl\n", "2025-03-01"))
    assert list(march) == ["KL003"] and march["KL003"].endswith(
        "; under trl 0.15, the newest when requirements.txt was last committed (2025-03-01): KL002 and KL007 instead")


def test_the_table_is_ordered_and_covers_every_known_trl_release():
    from klaudit.frameworks.versions import KNOWN, release

    published = dated._published()
    assert list(published["trl"]) == list(KNOWN["trl"])
    days = list(published["trl"].values())
    assert days == sorted(days) and days[0] == datetime.date(2025, 1, 29)
    assert all(list(lines) == [known for known in KNOWN[name] if known in lines]
               and all(release(line) for line in lines) for name, lines in published.items())
