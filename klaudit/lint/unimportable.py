"""Modules of a package Python cannot import: an `__init__.py` of the package, or of one around it, that Python
rejects (the KL000 the lint reports there) stops every `import package.module` before the module runs.

jzhws/VisualQualityAssessment-RL-Trainer's `src/open_r1/trainer/__init__.py` imports `.grpo_trainer_refine-iqa`
(a hyphen is no name): every trainer of that package, and every script importing it, fails at import, so their KL
code never trains. Such a module is not analysed, only its syntax checked. A script (`if __name__ ==
"__main__":`) can still be run by its path, which imports no package around it, and is analysed as usual; so is a
file named on the command line.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

from klaudit.lint.syntax import is_script


def unimportable(walked: Mapping[str, str], rejected: Callable[[str], bool]) -> frozenset[str]:
    """The paths among `walked` (Python files found by walking a folder: path -> source) inside a package whose
    `__init__.py`, or an enclosing package's, Python rejects (`rejected(path)`: the KL000 of that file)."""
    broken: dict[str, bool] = {}  # folder -> whether importing it fails

    def fails(folder: str) -> bool:
        if folder not in broken:
            init = os.path.join(folder, "__init__.py")
            parent = os.path.dirname(folder)
            broken[folder] = os.path.isfile(init) and (rejected(init) or (parent != folder and fails(parent)))
        return broken[folder]

    return frozenset(path for path, source in walked.items()
                     if os.path.basename(path) != "__init__.py" and not is_script(source)
                     and fails(os.path.dirname(path)))
