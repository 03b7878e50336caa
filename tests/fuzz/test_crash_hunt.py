"""scripts/crash_hunt.py --mutants: the same mutants for a seed, each unlike its base, and a short hunt
over them finds no crash, hang or wrong KL000 (the long run: see the script's docstring)."""

from __future__ import annotations

import importlib.util
import random
import sys
from pathlib import Path

SCRIPT = Path(__file__).parents[2] / "scripts" / "crash_hunt.py"
spec = importlib.util.spec_from_file_location("crash_hunt", SCRIPT)
crash_hunt = importlib.util.module_from_spec(spec)
sys.modules["crash_hunt"] = crash_hunt  # the worker pool pickles its functions by module name
spec.loader.exec_module(crash_hunt)


def test_mutate_changes_the_source_and_follows_the_seed():
    source = (Path(__file__).parents[2] / "fixtures" / "bad").glob("*.py").__next__().read_text()
    first = [crash_hunt.mutate(source, random.Random(seed)) for seed in range(20)]
    assert first == [crash_hunt.mutate(source, random.Random(seed)) for seed in range(20)]
    assert sum(mutant != source for mutant in first) >= 18  # a swap or rename may find nothing to change


def test_a_short_hunt_over_mutants(tmp_path):
    paths = crash_hunt.write_mutants(tmp_path / "mutants", 40, seed=3)
    again = crash_hunt.write_mutants(tmp_path / "again", 40, seed=3)
    assert [Path(p).read_text() for p in paths] == [Path(p).read_text() for p in again]
    records = crash_hunt.hunt([str(tmp_path / "mutants")], jobs=1, hang=60, limits=crash_hunt.engine.Limits())
    assert len(records) == 40
    assert [r for r in records if r["status"] in ("crash", "hang", "wrong-KL000")] == []
