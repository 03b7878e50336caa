"""Write the keywords some release of TRL's GRPOConfig accepts, for the lint.

A `GRPOConfig(...)` call with a keyword no release takes (`max_new_tokens=`, `num_generation_per_prompt=`) raises
a TypeError before anything trains, so its KL flags train nothing. klaudit reads the accepted keywords from
`klaudit/frameworks/fields/grpo_config.txt`, written by this script from the wheels of TRL and of transformers
(GRPOConfig derives from TrainingArguments): every dataclass field of the classes in TRL's `grpo_config.py` and
`base_config.py`, and of transformers' `TrainingArguments`, in any of the wheels given:

    python scripts/config_fields.py trl-*.whl transformers-*.whl > klaudit/frameworks/fields/grpo_config.txt

The union over the releases is kept: a keyword that some release took may be what the project's pinned one takes.
"""

from __future__ import annotations

import ast
import re
import sys
import zipfile

# the modules of each wheel whose classes' fields are GRPOConfig's keywords
MODULES = ("trl/trainer/grpo_config.py", "trl/trainer/base_config.py", "transformers/training_args.py")
_CLASSES = {"transformers/training_args.py": ("TrainingArguments",)}  # only this class of that module


def fields(source: str, classes: tuple[str, ...] | None) -> set[str]:
    """The annotated class-level names (dataclass fields) of the classes of a module (of `classes`, if given)."""
    found: set[str] = set()
    for node in ast.parse(source).body:
        if isinstance(node, ast.ClassDef) and (classes is None or node.name in classes):
            found |= {item.target.id for item in node.body
                      if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)}
    return found


def main(wheels: list[str]) -> None:
    accepted: set[str] = set()
    versions: list[str] = []
    for wheel in wheels:
        match = re.search(r"(trl|transformers)-([^-]+)-", wheel)
        versions.append(f"{match.group(1)} {match.group(2)}" if match else wheel)
        with zipfile.ZipFile(wheel) as archive:
            for module in MODULES:
                if module in archive.namelist():
                    accepted |= fields(archive.read(module).decode("utf-8"), _CLASSES.get(module))
    print(f"# keywords some GRPOConfig accepts, read by scripts/config_fields.py from: {', '.join(versions)}")
    print("\n".join(sorted(name for name in accepted if not name.startswith("_"))))


if __name__ == "__main__":
    main(sys.argv[1:])
