"""The negative corpus: correct code that looks like KL code must give no finding.

`fixtures/clean/` holds preference losses with implicit rewards, SFT and reward-model training,
a critic's squared error, KL metrics and an approximate-KL early stop, forward-KL distillation,
the unbiased KL placements of kl-math.md section 8 and a rollout buffer filled under no_grad.
Each file must reach the analysis (it has KL vocabulary) and stay silent, linted with the rest
of the directory and on its own.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from klaudit.lint.engine import lint_paths
from klaudit.lint.roles import might_contain_kl

CLEAN = Path(__file__).resolve().parents[2] / "fixtures" / "clean"
FILES = sorted(path.name for path in CLEAN.glob("*.py"))


def shown(findings) -> str:
    return "\n".join(f"  {Path(f.path).name}:{f.line}: {f.code} {f.message[:120]}" for f in findings)


def test_the_clean_corpus_covers_the_trainer_styles():
    assert len(FILES) >= 8, FILES


@pytest.mark.parametrize("name", FILES)
def test_clean_file_reaches_the_analysis(name):
    text = (CLEAN / name).read_text(encoding="utf-8")
    assert text.lstrip().startswith('"""'), f"{name} needs a docstring saying why it is correct"
    assert might_contain_kl(text), f"{name} has no KL vocabulary: it would pass without being analysed"
    assert "# <-" not in text


def test_the_clean_corpus_gives_no_finding():
    result = lint_paths([str(CLEAN)])
    assert result.errors == []
    assert result.files_analysed == len(FILES)
    assert result.findings == [], shown(result.findings)


@pytest.mark.parametrize("name", FILES)
def test_each_clean_file_alone_gives_no_finding(name):
    result = lint_paths([str(CLEAN / name)])
    assert result.errors == []
    assert result.findings == [], shown(result.findings)
