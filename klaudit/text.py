"""Reading a launch script, configuration or requirements file as pip and the YAML loaders read it: a
byte-order mark names UTF-8, UTF-16 or UTF-32 (Windows PowerShell's `pip freeze > requirements.txt` writes
UTF-16), else the bytes are UTF-8; a byte that does not decode is replaced, never fatal.

Python files the lint analyses are decoded as Python decodes them instead (klaudit.lint.sources).
"""

from __future__ import annotations

import codecs
from pathlib import Path

# The longer marks first: UTF-32 LE's begins with UTF-16 LE's.
_MARKS = ((codecs.BOM_UTF32_LE, "utf-32-le"), (codecs.BOM_UTF32_BE, "utf-32-be"), (codecs.BOM_UTF8, "utf-8"),
          (codecs.BOM_UTF16_LE, "utf-16-le"), (codecs.BOM_UTF16_BE, "utf-16-be"))


def decode_text(data: bytes) -> str:
    """`data` decoded by its byte-order mark (which is dropped), else as UTF-8."""
    for mark, encoding in _MARKS:
        if data.startswith(mark):
            return data[len(mark):].decode(encoding, errors="replace")
    return data.decode("utf-8", errors="replace")


def file_text(path: str | Path) -> str:
    """The text of the file at `path` (decode_text); OSError where it cannot be read."""
    return decode_text(Path(path).read_bytes())


def read_text(path: Path) -> str | None:
    """The text of the file at `path` (decode_text); None when it is no readable file."""
    try:
        return file_text(path) if path.is_file() else None
    except OSError:
        return None
