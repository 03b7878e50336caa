"""klaudit in a project's own test suite: `assert_kl_unbiased` and the pytest plugin."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

KL_CODE = textwrap.dedent('''
    import torch

    from klaudit.estimators import kl_penalty


    def k3_loss(logprobs, ref_logprobs, mask):
        """Schulman's k3 differentiated as a loss: the per-token forward KL's gradient (KL002)."""
        log_ratio = ref_logprobs - logprobs
        return ((torch.exp(log_ratio) - log_ratio - 1) * mask).sum(-1).mean()


    def unbiased_loss(logprobs, ref_logprobs, mask):
        return kl_penalty(logprobs, ref_logprobs, mask).loss.mean()
''')


def _pytest(tmp_path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)


def test_assert_kl_unbiased_passes_and_fails_with_the_table(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    from klaudit.testing import KLGradientError, assert_kl_unbiased

    (tmp_path / "kl_code.py").write_text(KL_CODE)
    monkeypatch.syspath_prepend(str(tmp_path))
    import kl_code

    report = assert_kl_unbiased(kl_code.unbiased_loss, placement="loss")
    assert report.unbiased and [row.objective for row in report.results] == ["REV"]
    with pytest.raises(KLGradientError) as failure:
        assert_kl_unbiased(kl_code.k3_loss, placement="loss")
    message = str(failure.value)
    assert "mode  placement  configuration" in message and "PFWD" in message and "biased (KL002)" in message
    assert "1 row audited, 1 biased, 0 errors" in message


def test_plugin_runs_check_grad_targets_as_test_items(tmp_path):
    pytest.importorskip("torch")
    (tmp_path / "kl_code.py").write_text(KL_CODE)
    passed = _pytest(tmp_path, "--klaudit-check-grad", "kl_code.py::unbiased_loss", "kl_code.py")
    assert passed.returncode == 0, passed.stdout
    assert "1 passed" in passed.stdout
    failed = _pytest(tmp_path, "--klaudit-check-grad", "kl_code.py::k3_loss", "kl_code.py")
    assert failed.returncode == 1
    assert "klaudit check-grad kl_code.py::k3_loss" in failed.stdout and "biased (KL002)" in failed.stdout
    # the same target kept in the project's configuration
    (tmp_path / "pytest.ini").write_text("[pytest]\nklaudit_check_grad =\n    kl_code.py::k3_loss\n")
    assert _pytest(tmp_path, "kl_code.py").returncode == 1


def test_the_plugin_does_not_import_torch_when_unused(tmp_path):
    (tmp_path / "test_plain.py").write_text(textwrap.dedent('''
        import sys

        def test_torch_is_not_imported():
            assert "klaudit.pytest_plugin" in sys.modules  # the plugin is loaded ...
            assert "torch" not in sys.modules  # ... and pulled in nothing heavy
    '''))
    result = _pytest(tmp_path, "test_plain.py")
    assert result.returncode == 0, result.stdout
    assert "--klaudit-check-grad" in _pytest(tmp_path, "--help").stdout
