"""A launch script written into a project and linted as klaudit lint reads it (the project as the linted root)."""

from __future__ import annotations

from pathlib import Path

from klaudit.frameworks import Context, lint_config


def launch_codes(root: Path, launch: str) -> list[str]:
    """The sorted rule codes of the launch `launch`, written to `root`/examples/train.sh."""
    script = root / "examples" / "train.sh"
    script.parent.mkdir(exist_ok=True)
    script.write_text(launch)
    return sorted(f.code for f in lint_config(str(script), launch, Context(roots=(str(root.resolve()),))))
