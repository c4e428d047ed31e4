"""The shape of a subcommand: a name, a one-line help, its arguments, and `run` returning the exit code."""

from __future__ import annotations

import abc
import argparse
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from runner.config.spec import JobSpec


class Command(abc.ABC):
    """One `runner` subcommand. Register it in `runner.cli.commands.COMMANDS`, the only list of them."""

    name: ClassVar[str]
    help: ClassVar[str]

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:  # noqa: B027 - optional hook
        """Add this command's arguments (none by default)."""

    @abc.abstractmethod
    def run(self, args: argparse.Namespace) -> int:
        """Do the work; return the process exit code (README "Exit codes")."""


def load(path: str) -> JobSpec:
    """Load and validate a spec; a SpecError propagates to main(), which prints every problem."""
    from runner.config import load_spec

    return load_spec(path)


def add_spec_argument(parser: argparse.ArgumentParser) -> None:
    """The positional `spec` argument most commands take."""
    parser.add_argument("spec", help="job spec (YAML)")
