"""Commands timed as after `pip install`, which leaves every module compiled to bytecode: an editable checkout
under PYTHONDONTWRITEBYTECODE=1, or a site-packages without .pyc files (a GPU machine's image here lacked them
for about 1,650 of the 3,900 modules that torch and transformers import), otherwise compiles those modules
again at every start, seconds that no installed klaudit or torch pays. The bytecode goes to a cache of the
benchmark's own (PYTHONPYCACHEPREFIX), filled by an untimed first run."""

from __future__ import annotations

import os


def user_environment(bytecode_cache: str) -> dict[str, str]:
    """This process's environment with bytecode written to and read from `bytecode_cache`."""
    environment = {name: value for name, value in os.environ.items() if name != "PYTHONDONTWRITEBYTECODE"}
    return {**environment, "PYTHONPYCACHEPREFIX": bytecode_cache}
