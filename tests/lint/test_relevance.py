"""Which functions the lint interprets on their own (klaudit.lint.relevance): every function that may
meet a KL term, found through what it refers to, and none of the others."""

from __future__ import annotations

import ast
import textwrap

import libcst

from klaudit.config import Settings
from klaudit.lint.engine import lint_paths
from klaudit.lint.modules import MODULE_BODY, module_functions
from klaudit.lint.relevance import worth_interpreting


def worth(source: str, stored=(), imported=(), body=False) -> dict[str, bool]:
    """{function: worth interpreting}, in the order of the lint's module_functions; the module's own
    statements (MODULE_BODY) too with `body`."""
    source = textwrap.dedent(source)
    names = [func.name.value for func, _ in module_functions(libcst.parse_module(source), with_body=True)]
    found = dict(zip(names, worth_interpreting(source, ast.parse(source), stored, lambda name: name in imported),
                     strict=True))
    return found if body else {name: value for name, value in found.items() if name != MODULE_BODY}


def test_a_module_s_own_statements_are_worth_interpreting_when_they_call_something_with_kl_in_it():
    assert worth("import torch\nKL_COEF = 0.1\n", body=True) == {MODULE_BODY: False}  # settings: no call
    script = "import torch\nkl = logp - ref_logp\nloss = pg + kl.mean()\nloss.backward()\n"
    assert worth(script, body=True) == {MODULE_BODY: True}
    assert worth("def f(x):\n    return x\n\nif __name__ == '__main__':\n    f(1)\n", body=True) == {
        "f": False, MODULE_BODY: False}


PENALTY = """
    import torch

    def penalty(logprobs, ref_logprobs):
        r = ref_logprobs - logprobs
        return torch.exp(r) - r - 1

    def train_step(lp, base_lp, pg_loss):
        loss = pg_loss + penalty(lp, base_lp).mean()
        loss.backward()

    def unrelated(x):
        return x * 2
"""


def test_a_function_that_calls_a_kl_helper_of_its_module_is_interpreted_and_its_finding_reported(tmp_path):
    assert worth(PENALTY) == {"penalty": True, "train_step": True, "unrelated": False}
    (tmp_path / "step.py").write_text(textwrap.dedent(PENALTY))
    result = lint_paths([str(tmp_path)], settings=Settings(root=tmp_path), jobs=1)
    assert [(f.line, f.code) for f in result.findings] == [(9, "KL002")]  # in train_step, which names no KL


def test_names_the_roles_read_as_the_reference_seed_a_function():
    assert worth("def f(lp, sft_logprobs):\n    return lp - sft_logprobs\n") == {"f": True}
    assert worth("def f(x):\n    return self.teacher(x)\n") == {"f": True}
    assert worth("def f(x, y):\n    return x - y\n") == {"f": False}


def test_attributes_constants_and_methods_made_of_kl_link_the_functions_that_read_them():
    source = """
        ESTIMATORS = {"k3": k3}
        PLAIN = {"a": 1}

        def k3(logprobs, ref_logprobs):
            return ref_logprobs - logprobs

        def by_table(name, a, b):
            return ESTIMATORS[name](a, b)

        def by_plain(name):
            return PLAIN[name]

        class Trainer:
            def __init__(self):
                self.estimator = KLEstimator()
                self.other = Other()

            def step(self, a, b):
                return self.estimator(a, b)

            def other_step(self, a):
                return self.other(a)

            def compute(self, a, b):
                return self.helper(a, b) + self.kl_coef

            def uses_compute(self, a, b):
                return self.compute(a, b)
    """
    assert worth(source) == {"k3": True, "by_table": True, "by_plain": False, "__init__": True,
                             "step": True, "other_step": False, "compute": True, "uses_compute": True}


def test_stored_fields_imports_the_analysis_follows_and_derived_classes_link_functions():
    source = """
        from helpers import shaped, plain
        from trainer import BaseTrainer

        def reads_field(batch):
            return batch.penalty.mean()

        def reads_key(batch):
            return batch["penalty"].mean()

        def calls_followed(a, b):
            return shaped(a, b)

        def calls_plain(a):
            return plain(a)

        class Derived(BaseTrainer):
            def step(self, a):
                return super().step(a)

        class Own:
            def step(self, a):
                return self.go(a)
    """
    source = textwrap.dedent(source)
    flags = worth_interpreting(source, ast.parse(source), ("penalty",), lambda name: name in ("shaped", "BaseTrainer"))
    # reads_field, reads_key, calls_followed, calls_plain, Derived.step, Own.step
    assert flags == [True, True, True, False, True, False]
    assert worth_interpreting(source, ast.parse(source), ("['penalty']",), lambda name: False) == \
        [True, True, False, False, False, False]


def test_a_definition_under_a_module_level_if_counts_as_a_link():
    source = """
        if HAVE_FAST:
            def fast(a, b):
                return a - b

        def caller(a, b):
            return fast(a, b)

        def other(a):
            return a
    """
    assert worth(source) == {"caller": True, "other": False}
