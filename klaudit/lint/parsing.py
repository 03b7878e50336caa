"""Source text -> a LibCST module, or the one finding that says why the file cannot be (fully) read.

Python's own parser is the judge of syntax: a file it rejects is KL000 at the place it names, unless
LibCST reads it (syntax of a newer Python than the one running klaudit: `type X = int` under 3.11).
A file Python accepts but LibCST cannot read, or whose expressions nest deeper than `MAX_NESTING`
(LibCST's parser costs grow faster than linearly in the depth of a chain: a 2,000-call method chain
takes it about a minute), is not analysed and gets one informational KL099 instead.
"""

from __future__ import annotations

import ast
import itertools
import re
import warnings

import libcst

from klaudit.config import INCOMPLETE_CODE, SYNTAX_ERROR_CODE
from klaudit.lint.findings import Finding
from klaudit.lint.syntax import libcst_module, python_ast

# Nesting of the syntax tree (statements, expressions, operands) beyond which a file is not parsed with
# LibCST. Real code stays far below it (the deepest file of verl nests 19 levels); a chain of 200
# operators or 100 method calls passes; LibCST reads this depth in well under a second.
MAX_NESTING = 400


def file_finding(path: str, code: str, message: str, line: int = 1, column: int = 1) -> Finding:
    return Finding(path, line, column, code, message, line, column)


def incomplete(path: str, why: str, line: int = 1) -> Finding:
    """The KL099 note: the file, or part of it, was not analysed."""
    return file_finding(path, INCOMPLETE_CODE, f"{why}; findings in this file may be incomplete", line)


def python_tree(path: str, source: str) -> ast.Module | Finding | None:
    """Python's syntax tree of `source`; a KL000 or KL099 finding when Python cannot build one; None
    when Python rejects it but LibCST reads it (newer syntax): the caller parses it with LibCST."""
    try:
        return python_ast(source)
    except SyntaxError as error:
        if _libcst_reads(source):
            return None
        if (other := _OTHER_INTERPRETER.match(source)) is not None:
            return incomplete(path, f"not analysed: its first line runs it with {other.group(1)}, not Python")
        return file_finding(path, SYNTAX_ERROR_CODE, f"syntax error: {error.msg}", error.lineno or 1,
                            max(error.offset or 1, 1))
    except (RecursionError, MemoryError):
        return incomplete(path, "not analysed: the code nests too deeply for Python's own parser")
    except ValueError as error:  # e.g. "source code string cannot contain null bytes"
        return file_finding(path, SYNTAX_ERROR_CODE, f"syntax error: {error}")


# a first line that runs the file with another program (`#!/usr/bin/env bash` atop a wrapper named run.py)
_OTHER_INTERPRETER = re.compile(r"#![ \t]*(?:/usr/bin/env[ \t]+(?:-S[ \t]+)?)?(?:\S*/)?"
                                r"(bash|sh|zsh|dash|ksh|fish|node|perl|ruby)\b")


def _libcst_reads(source: str) -> bool:
    try:
        libcst.parse_module(source)
    except Exception:  # noqa: BLE001 - any failure means LibCST does not read it either
        return False
    return True


def nesting(tree: ast.AST) -> tuple[int, int]:
    """(depth, line) of the most deeply nested node of a syntax tree, found without recursion."""
    deepest, line = 0, 1
    stack = [(tree, 1, 1)]
    while stack:
        node, depth, where = stack.pop()
        where = getattr(node, "lineno", where)
        if depth > deepest:
            deepest, line = depth, where
        stack.extend((child, depth + 1, where) for child in ast.iter_child_nodes(node))
    return deepest, line


_LINE_END = re.compile(r"\r\n?|\n")  # as Python's tokenizer counts lines


def may_nest_past(tree: ast.Module, source: str, limit: int) -> bool:
    """False when `tree` (parsed from `source`) provably nests at most `limit` levels, found without
    visiting most of its nodes; True when it may nest deeper (then `nesting` measures it).

    Every level of a statement or expression spends a character of its own text (an operator, a
    bracket, a keyword, a name), or is a wrapper whose child does: a node spanning n characters holds
    at most 2n + 2 levels. The walk goes down only where that bound of a node exceeds the limit. A
    definition's decorators lie outside its span, and the positions inside an f-string are not to be
    trusted: those are walked in full."""
    # characters up to the end of each line, its line end counted as 2 (columns are in bytes, but only
    # an upper bound of the characters a node spans matters)
    ends = [0, *itertools.accumulate(len(line) + 2 for line in _LINE_END.split(source))]
    stack: list[tuple[ast.AST, int, bool]] = [(tree, 1, False)]  # (node, its depth, whether to walk it in full)
    while stack:
        node, depth, exact = stack.pop()
        for child in ast.iter_child_nodes(node):
            if not exact and isinstance(child, (ast.expr, ast.pattern, ast.stmt)) and not isinstance(
                    child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                last, end = child.end_lineno, child.end_col_offset  # set by the parser on every node of its tree
                if last is not None and end is not None:
                    size = end - child.col_offset if child.lineno == last else ends[last] - ends[child.lineno - 1]
                    if depth + 2 * size + 3 <= limit:
                        continue
            if depth + 1 > limit:
                return True
            stack.append((child, depth + 1, exact or isinstance(child, ast.JoinedStr)))
    return False


def refusal(path: str, source: str) -> Finding | None:
    """The finding that replaces the analysis of a file (KL000, or KL099 where it nests too deeply for
    LibCST), or None when it is to be analysed."""
    tree = python_tree(path, source)
    if isinstance(tree, Finding):
        return tree
    if tree is not None and may_nest_past(tree, source, MAX_NESTING):
        depth, line = nesting(tree)
        if depth > MAX_NESTING:
            return incomplete(path, f"not analysed: the code at line {line} nests {depth} levels deep "
                                    f"(the limit is {MAX_NESTING})", line)
    return None


def parse(path: str, source: str, known: libcst.Module | None = None) -> libcst.Module | Finding:
    """The LibCST module of a file that has no `refusal`, or the finding that replaces its analysis;
    `known` is a tree already parsed from `source` (the file was followed as an import), taken
    instead of a new one."""
    if known is not None:
        return known
    try:
        return libcst_module(source)
    except (libcst.ParserSyntaxError, libcst.CSTValidationError) as error:
        return _compile_error(path, source) or incomplete(
            path, f"not analysed: Python reads this file but LibCST does not ({getattr(error, 'message', error)})",
            getattr(error, "raw_line", 1))
    except RecursionError:
        return incomplete(path, "not analysed: the code nests too deeply for LibCST")


def _compile_error(path: str, source: str) -> Finding | None:
    """KL000 for code Python's parser reads but its compiler rejects (`nonlocal` at module level), where
    LibCST's parser also fails; asked only once it has. (Where LibCST's parser builds a tree, as for
    `return* x`, the file is analysed as Python's parser reads it.)"""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compile(source, path, "exec", dont_inherit=True)
    except SyntaxError as error:
        return file_finding(path, SYNTAX_ERROR_CODE, f"syntax error: {error.msg}", error.lineno or 1,
                            max(error.offset or 1, 1))
    except (ValueError, RecursionError, MemoryError):
        return None
    return None


def syntax_finding(path: str, source: str) -> Finding | None:
    """KL000 for a file that is not analysed (no KL vocabulary) when Python's parser rejects it.

    Compiling to bytecode builds no Python objects for the syntax tree, which makes it a few times
    cheaper than `ast.parse`; code it accepts Python's parser accepts. Only when it objects does the
    parser decide (the objection may be the compiler's alone, `return` outside a function)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compile(source, path, "exec", dont_inherit=True)
        return None
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        pass
    tree = python_tree(path, source)
    return tree if isinstance(tree, Finding) and tree.code == SYNTAX_ERROR_CODE else None
