"""The command line's words as its parser knows them: each subcommand's parser, and the problems of a usage line's
options and choices. Shared by tests/house/test_docs.py (README, docs) and tests/house/test_docs_run.py (commands run)."""

from __future__ import annotations

import argparse
import re

from runner.cli.main import build_parser

FLAG = re.compile(r"^--?[A-Za-z][\w-]*$")


def subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def check_words(sub: str, words: list[str], parser: argparse.ArgumentParser, line: str) -> list[str]:
    """Problems with the options and choices `words` show for subcommand `sub`."""
    options = {s for a in parser._actions for s in a.option_strings}
    choices = {str(c) for a in parser._actions if not a.option_strings and a.choices for c in a.choices}
    problems = []
    for raw in words:
        if raw == "--":
            break
        for token in filter(None, re.split(r"[\[\]|]", raw)):
            name = token.split("=", 1)[0]
            if FLAG.match(name) and name not in options:
                problems.append(f"`runner {sub}` has no option {token} ({line!r})")
            elif not FLAG.match(name) and re.fullmatch(r"[a-z][a-z0-9-]*", token) and "|" in raw and token not in choices:
                problems.append(f"`runner {sub}` has no choice {token!r} ({line!r})")
    return problems
