"""Parsing source for the rule tests, robust to a CPython 3.11 quirk.

``ast.parse`` can fail once with ``SystemError: AST constructor recursion depth mismatch``
when run in a process that earlier formatted a Dagster failure under pytest's output
capture (``test_checkpoint_integrity``'s IO-manager test, then a rule test, on one xdist
worker): the C-level AST converter's depth counter is module state, and something that
runs during the first conversion afterwards (a pending finalizer formatting a traceback,
which parses source itself) leaves it unbalanced. The next parse is clean. The error says
nothing about the source, so the parse is tried once more; any other error stands.
"""

import ast

_QUIRK = "AST constructor recursion depth mismatch"


def parse_source(source: str, filename: str = "<unknown>") -> ast.Module:
    """``ast.parse(source, filename)``, again once after the converter's depth quirk."""
    try:
        return ast.parse(source, filename=filename)
    except SystemError as error:
        if _QUIRK not in str(error):
            raise
        return ast.parse(source, filename=filename)
