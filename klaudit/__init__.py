"""klaudit: find and explain wrong KL-divergence gradients in RL code for language models.

The linter (`klaudit lint`) needs only libcst and click; the estimators and the gradient
audit (`klaudit.estimators`, `klaudit.audit`) need torch and are imported lazily.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
