"""The pytest plugin (entry point `klaudit`): check-grad targets as test items.

    pytest --klaudit-check-grad src/train.py::kl_penalty
    # or in pytest.ini / pyproject.toml:  klaudit_check_grad = ["src/train.py::kl_penalty"]

Each target (any form `klaudit check-grad` takes) becomes one test item, run as check-grad runs it
(in a child process, with its time limit); the item fails with check-grad's table when a row is
biased, and errs when the audit could not run. pytest loads this module in every run of every
project where klaudit is installed, so it imports nothing heavy (no torch) unless a target is given.
"""

from __future__ import annotations

import pytest

OPTION, INI = "--klaudit-check-grad", "klaudit_check_grad"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("klaudit", "KL gradients (klaudit check-grad)")
    group.addoption(OPTION, action="append", default=[], metavar="TARGET", dest="klaudit_check_grad",
                    help="Audit this KL code as a test item: PATH.py, PATH.py::function or package.module:function.")
    group.addoption("--klaudit-fail-on", choices=("any", "used"), default="any", dest="klaudit_fail_on",
                    help="Fail on any biased row, or only on rows of placements the code uses (check-grad --fail-on).")
    parser.addini(INI, type="linelist", default=[], help="check-grad targets audited as test items.")


def _targets(config: pytest.Config) -> list[str]:
    return list(dict.fromkeys([*config.getini(INI), *config.getoption("klaudit_check_grad")]))


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list) -> None:
    items.extend(CheckGradItem.from_parent(session, name=f"klaudit-check-grad[{target}]", target=target)
                 for target in _targets(config))


class CheckGradFailure(Exception):
    """A biased row or an audit that could not run; the message is check-grad's report."""


class CheckGradItem(pytest.Item):
    def __init__(self, *, target: str, **kwargs) -> None:
        super().__init__(**kwargs)
        self.target = target

    def runtest(self) -> None:
        from klaudit.audit import TORCH_MISSING, torch_importable

        if not torch_importable():
            raise CheckGradFailure(TORCH_MISSING)
        from klaudit.audit.runner import run

        report = run([self.target])
        if report.exit_code_for(used_only=self.config.getoption("klaudit_fail_on") == "used") != 0:
            raise CheckGradFailure(report.to_text())

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, CheckGradFailure):
            return f"klaudit check-grad {self.target}\n{excinfo.value}"
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self):
        return self.path, None, f"klaudit check-grad {self.target}"
