"""Write the keywords some release of TRL's GRPOConfig accepts, the options some release of OpenRLHF's trainers
accepts and the Hydra configs some release of verl ships, for the lint.

A `GRPOConfig(...)` call with a keyword no release takes (`max_new_tokens=`, `num_generation_per_prompt=`) raises
a TypeError before anything trains, so its KL flags train nothing. klaudit reads the accepted keywords from
`klaudit/frameworks/fields/grpo_config.txt`, written by this script from the wheels of TRL and of transformers
(GRPOConfig derives from TrainingArguments): every dataclass field of the classes in TRL's `grpo_config.py` and
`base_config.py`, and of transformers' `TrainingArguments`, in any of the wheels given:

    python scripts/config_fields.py trl-*.whl transformers-*.whl > klaudit/frameworks/fields/grpo_config.txt

The union over the releases is kept: a keyword that some release took may be what the project's pinned one takes.

With `--openrlhf`, the wheels are OpenRLHF's, and what is written is each of its trainer modules (`cli/train_*.py`)
with every option some release's argparse adds (a `*` where a release's parser leaves its options open):

    python scripts/config_fields.py --openrlhf openrlhf-*.whl > klaudit/frameworks/fields/openrlhf_options.txt

A launch that passes an option no release has (`--max_turn 5`) stops at argparse whatever is installed.

With `--verl`, the wheels are verl's, and what is written is the name of each Hydra config some release ships in
`verl/trainer/config/`; a launch of verl as installed that names another (and the project has no such file) stops
before anything trains:

    python scripts/config_fields.py --verl verl-*.whl > klaudit/frameworks/fields/verl_configs.txt
"""

from __future__ import annotations

import ast
import re
import sys
import zipfile

from klaudit.frameworks import openrlhf

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


def openrlhf_options(wheels: list[str]) -> None:
    """Print `module option` for each option some wheel's trainer module adds (the OPEN option where one wheel's
    parser may take more than it adds)."""
    accepted: dict[str, set[str]] = {}
    versions: list[str] = []
    for wheel in wheels:
        match = re.search(r"openrlhf-([^-]+)-", wheel)
        versions.append(match.group(1) if match else wheel)
        with zipfile.ZipFile(wheel) as archive:
            for name in archive.namelist():
                module = re.search(r"openrlhf/cli/train_\w+\.py$", name)
                if module and openrlhf.LAUNCH.search(module.group()):
                    parser = openrlhf.parser_of(archive.read(name).decode("utf-8"))
                    options = accepted.setdefault(module.group(), set())
                    options |= parser.options | (set() if parser.closed else {openrlhf.OPEN})
    print(f"# options some OpenRLHF trainer accepts, read by scripts/config_fields.py --openrlhf from: "
          f"{', '.join(sorted(versions, key=_release))}")
    print("\n".join(f"{module} {option}" for module in sorted(accepted) for option in sorted(accepted[module])))


def verl_configs(wheels: list[str]) -> None:
    """Print the name of each config some wheel ships at `verl/trainer/config/<name>.yaml`."""
    names: set[str] = set()
    versions: list[str] = []
    for wheel in wheels:
        match = re.search(r"verl-([^-]+)-", wheel)
        versions.append(match.group(1) if match else wheel)
        with zipfile.ZipFile(wheel) as archive:
            names |= {found.group(1) for name in archive.namelist()
                      if (found := re.search(r"(?:^|/)verl/trainer/config/([\w.-]+)\.yaml$", name))}
    print(f"# Hydra configs some verl release ships, read by scripts/config_fields.py --verl from: "
          f"{', '.join(sorted(versions, key=_release))}")
    print("\n".join(sorted(names)))


def _release(version: str) -> tuple[int, ...]:
    """A version's numbers, for sorting (0.10 after 0.9)."""
    return tuple(int(part) for part in re.findall(r"\d+", version))


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
    if sys.argv[1:2] == ["--openrlhf"]:
        openrlhf_options(sys.argv[2:])
    elif sys.argv[1:2] == ["--verl"]:
        verl_configs(sys.argv[2:])
    else:
        main(sys.argv[1:])
