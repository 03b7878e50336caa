"""`python -m klaudit.watch install|uninstall [--dir DIR]`: the start-up hook that KLAUDIT_WATCH needs.

`install` writes klaudit-watch.pth into site-packages (or DIR), so that every Python process of this
environment reads KLAUDIT_WATCH at start-up (klaudit.watch.autostart); `uninstall` removes it.
"""

from __future__ import annotations

import argparse
import sysconfig
from pathlib import Path

from klaudit.watch.environment import PTH_LINE, PTH_NAME


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m klaudit.watch", description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("install", "uninstall"))
    parser.add_argument("--dir", default=sysconfig.get_paths()["purelib"], help="site directory (default: %(default)s)")
    arguments = parser.parse_args(argv)
    path = Path(arguments.dir, PTH_NAME)
    if arguments.action == "install":
        path.write_text(PTH_LINE, encoding="utf-8")
        print(f"wrote {path}: set KLAUDIT_WATCH=verl,openrlhf to watch a run")
    elif path.exists():
        path.unlink()
        print(f"removed {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
