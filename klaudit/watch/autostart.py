"""Imported at interpreter start-up by klaudit-watch.pth when KLAUDIT_WATCH is set: patches what it names
(klaudit.watch.environment). A bad value is one line on stderr; the process starts all the same."""

import sys

from klaudit.watch.environment import activate

try:
    activate()
except ValueError as error:
    print(f"klaudit.watch: not started: {error}", file=sys.stderr)
