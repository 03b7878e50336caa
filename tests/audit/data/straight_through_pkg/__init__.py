"""A trainer package shaped like verl 0.9: its __init__ imports a cluster runtime that is not installed
here, its losses call a KL helper that strips a '+' suffix and wraps the plain estimator with a
straight-through gradient. check-grad audits it without the package or the runtime being installed."""

import klaudit_fixture_absent_runtime  # noqa: F401 - stubbed by check-grad
