"""Findings are a function of the linted files, not of the order they are analysed in, of which
other files a worker process analysed first, or of the number of worker processes.

The project below exercises the ways the analysis once depended on order: a call summary cut
off by the depth limit (`chain.kl_estimate` reached five calls deep from `deep.py`) reused for a
shallow call (`shallow.py`); a summary whose recursive call was cut off because its caller was
being interpreted (`recursion.deeper` under `recursion.k3_or_deeper`, from `x_user.py`) reused
where nothing is cut (`y_user.py`); and a module parsed twice, once as an import and once as a
linted file, so that the helper's nodes were not in the tree the report located them in
(`estimators.py`, imported by `a_user.py`, loses its "estimator computed at line 2").
"""

from __future__ import annotations

import textwrap
from pathlib import Path

from klaudit.lint.engine import MIN_FILES_PER_WORKER, lint_paths

CHAIN = """\
import torch


def k3_value(logp, ref_logp):
    log_ratio = ref_logp - logp
    return torch.exp(log_ratio) - log_ratio - 1


def kl_estimate(logp, ref_logp):
    return k3_value(logp, ref_logp)


def step3(logp, ref_logp):
    return kl_estimate(logp, ref_logp)


def step2(logp, ref_logp):
    return step3(logp, ref_logp)


def step1(logp, ref_logp):
    return step2(logp, ref_logp)
"""

RECURSION = """\
import torch


def k3_or_deeper(logp, ref_logp, depth):
    log_ratio = ref_logp - logp
    if depth:
        return deeper(logp, ref_logp, depth)
    return torch.exp(log_ratio) - log_ratio - 1


def deeper(logp, ref_logp, depth):
    return k3_or_deeper(logp, ref_logp, depth)
"""

CALLER = """\
from {module} import {name}


def compute_loss(logp, ref_logp, mask, beta):
    kl = {name}(logp, ref_logp{extra})
    loss = beta * (kl * mask).sum()
    return loss
"""

ESTIMATORS = """\
def squared_log_ratio(logp, ref_logp):
    return 0.5 * (logp - ref_logp) ** 2


def compute_loss(logp, ref_logp, mask, pg_loss, beta):
    kl = squared_log_ratio(logp, ref_logp)
    loss = pg_loss + beta * (kl * mask).sum(-1).mean()
    return loss
"""

USER = """\
from estimators import compute_loss


def train_step(logp, ref_logp, mask, pg_loss, beta):
    loss = compute_loss(logp, ref_logp, mask, pg_loss, beta)
    return loss
"""

# What each file gives when it is linted on its own (kl-math.md section 8): k3 differentiated as
# a loss is KL002; k2 is KL003, reported where the loss stores it, its origin the helper's return.
EXPECTED = {
    "shallow.py": [(6, "KL002", None)],
    "estimators.py": [(7, "KL003", 2)],
    "x_user.py": [(6, "KL002", None)],
    "y_user.py": [(6, "KL002", None)],
}


def write_project(root: Path) -> list:
    files = {
        "chain.py": CHAIN,
        "deep.py": CALLER.format(module="chain", name="step1", extra=""),  # k3_value is past the depth limit
        "shallow.py": CALLER.format(module="chain", name="kl_estimate", extra=""),
        "recursion.py": RECURSION,
        "x_user.py": CALLER.format(module="recursion", name="k3_or_deeper", extra=", 1"),
        "y_user.py": CALLER.format(module="recursion", name="deeper", extra=", 1"),
        "estimators.py": ESTIMATORS,
        "a_user.py": USER,
    }
    for name, text in files.items():
        (root / name).write_text(textwrap.dedent(text))
    return sorted(files)


def found(paths: list, jobs: int = 1) -> list:
    result = lint_paths([str(p) for p in paths], jobs=jobs)
    assert not result.errors
    return sorted((Path(f.path).name, f.line, f.code, f.origin_line, f.message) for f in result.findings)


def summary(findings: list) -> dict:
    out: dict = {}
    for name, line, code, origin_line, _ in findings:
        out.setdefault(name, []).append((line, code, origin_line))
    return out


def test_each_file_alone_gives_the_expected_findings(tmp_path):
    names = write_project(tmp_path)
    alone = [finding for name in names for finding in found([tmp_path / name])]
    assert summary(alone) == EXPECTED


def test_findings_do_not_depend_on_the_order_of_the_files(tmp_path):
    names = write_project(tmp_path)
    alone = sorted(finding for name in names for finding in found([tmp_path / name]))
    for start in range(len(names)):
        for ordered in (names, names[::-1]):
            order = ordered[start:] + ordered[:start]
            assert found([tmp_path / name for name in order]) == alone, order


def test_findings_do_not_depend_on_the_number_of_workers(tmp_path):
    write_project(tmp_path)
    # copies of the callers, so that there are enough files for two workers to start
    for index in range(2 * MIN_FILES_PER_WORKER):
        (tmp_path / f"z_shallow_{index}.py").write_text(CALLER.format(module="chain", name="kl_estimate", extra=""))
        (tmp_path / f"z_deep_{index}.py").write_text(CALLER.format(module="chain", name="step1", extra=""))
    one_worker = found([tmp_path], jobs=1)
    assert found([tmp_path], jobs=2) == one_worker
    assert summary(one_worker)["estimators.py"] == EXPECTED["estimators.py"]
    assert len(one_worker) == len(EXPECTED) + 2 * MIN_FILES_PER_WORKER  # and one in each z_shallow
