"""Which functions the lint interprets on their own (klaudit.lint.relevance): every function that may
meet a KL term, found through what it refers to, and none of the others."""

from __future__ import annotations

import ast
import textwrap

from klaudit.config import Settings
from klaudit.lint.engine import lint_paths
from klaudit.lint.relevance import worth_interpreting


def worth(source: str, stored=(), imported=()) -> dict[str, bool]:
    source = textwrap.dedent(source)
    tree = ast.parse(source)
    names = [n.name for s in tree.body for n in ([s] if not isinstance(s, ast.ClassDef) else s.body)
             if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    return dict(zip(names, worth_interpreting(source, tree, stored, lambda name: name in imported), strict=True))


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
