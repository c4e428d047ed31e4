"""Entry point of `runner`: the only place that turns errors into messages and picks the process exit code."""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Sequence

from runner import __version__
from runner.cli.commands import COMMANDS, DEFAULT, names
from runner.errors import EXIT_INFRA, EXIT_SPEC, RunnerError


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `runner` and `python -m runner`."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] not in names() and not args[0].startswith("-"):
        args.insert(0, DEFAULT.name)
    parser = build_parser()
    ns = parser.parse_args(args)
    command = getattr(ns, "command", None)
    if command is None:
        parser.print_help(sys.stderr)
        return EXIT_SPEC
    try:
        return int(command.run(ns))
    except RunnerError as e:
        print(f"runner: error: {e.message}", file=sys.stderr)
        if e.fix:
            print(f"runner: fix: {e.fix}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        return 130
    except Exception as e:
        return internal_error(e)


def internal_error(e: Exception) -> int:
    """Save the traceback to a file and print one line pointing at it (workers were already stopped).

    Never raises: with no temp dir to take the traceback (a full or read-only disk), the line says so instead.
    """
    import tempfile
    import traceback

    try:
        with tempfile.NamedTemporaryFile("w", prefix="runner-crash-", suffix=".txt", delete=False) as f:
            details = f"details in {f.name}"
            traceback.print_exc(file=f)
    except OSError as saving:
        details = f"the traceback could not be saved: {saving.strerror or saving}"
    with contextlib.suppress(OSError):  # the console may be gone
        print(f"runner: internal error: {type(e).__name__}: {e} ({details}; please report it)", file=sys.stderr)
    return EXIT_INFRA


def build_parser() -> argparse.ArgumentParser:
    """The parser of every registered subcommand."""
    p = argparse.ArgumentParser(prog="runner", description="Run distributed PyTorch jobs from a YAML spec.")
    p.add_argument("--version", action="version", version=f"runner {__version__}")
    sub = p.add_subparsers(metavar="COMMAND")
    for cls in COMMANDS:
        command = cls()
        sp = sub.add_parser(cls.name, help=cls.help, description=cls.help)
        command.add_arguments(sp)
        sp.set_defaults(command=command)
    return p
