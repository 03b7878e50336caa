"""Reading a Python file as Python reads it: the bytes decoded by its declared encoding.

One home for the decoding, used by the engine for the files it lints and by the project for the
modules it follows.
"""

from __future__ import annotations

import io
import tokenize

from klaudit.config import SYNTAX_ERROR_CODE
from klaudit.lint.findings import Finding
from klaudit.lint.parsing import file_finding


def _position_of(data: bytes, offset: int) -> tuple[int, int]:
    """1-based (line, column) of a byte offset."""
    line_start = data.rfind(b"\n", 0, offset) + 1
    return data.count(b"\n", 0, offset) + 1, offset - line_start + 1


def _unreadable(path: str, message: str, line: int = 1, column: int = 1) -> Finding:
    return file_finding(path, SYNTAX_ERROR_CODE, message, line, column)


def read_source(path: str) -> str | Finding:
    """The decoded text of a Python file, or a KL000 finding saying why it cannot be checked."""
    with open(path, "rb") as handle:
        return decode_source(path, handle.read())


def decode_source(path: str, data: bytes) -> str | Finding:
    """`data` (the bytes of `path`, from the disk or stdin) decoded, or a KL000 finding saying why not.

    The encoding is found as Python finds it (BOM, then a PEP 263 coding line, else UTF-8).
    """
    if b"\0" in data:
        line, column = _position_of(data, data.index(b"\0"))
        return _unreadable(path, "not Python source: the file contains NUL bytes (a binary file?)",
                           line, column)
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    except SyntaxError as error:
        return _unreadable(path, f"cannot decode the file: {error.msg}", error.lineno or 1)
    try:
        return data.decode(encoding)
    except UnicodeDecodeError as error:
        line, column = _position_of(data, error.start)
        return _unreadable(
            path,
            f"cannot decode the file as {encoding}: byte {data[error.start]:#04x} is invalid; "
            "save it as UTF-8 or declare its encoding (PEP 263)",
            line, column,
        )


# ---------------------------------------------------------------------------------------------
# Parsing and analysis (runs in the worker processes)


_worker_project = None
