"""Optional fused kernels (Triton) behind `klaudit.estimators`; importing this package needs no Triton.

`token_kl` holds the fused exact per-token KL over the vocabulary. `klaudit.estimators.exact_token_kl`
uses it on CUDA tensors when Triton imports (`pip install 'klaudit[triton]'`), and its chunked torch
code everywhere else; on CPU tensors the kernel runs under Triton's interpreter, for the tests.
"""

from __future__ import annotations

import importlib.util


def triton_available() -> bool:
    """Whether Triton can be found, asked without importing it."""
    try:
        return importlib.util.find_spec("triton") is not None
    except (ImportError, ValueError):  # ValueError: sys.modules["triton"] is None, i.e. blocked
        return False
