"""The one list of `runner` subcommands: the parser, `runner job.yaml`'s default and the docs all read it."""

from __future__ import annotations

from runner.cli.command import Command
from runner.cli.convert import ConvertCommand
from runner.cli.graph import GraphCommand
from runner.cli.plan import PlanCommand
from runner.cli.report import ReportCommand
from runner.cli.reset import ResetCommand
from runner.cli.run import RunCommand
from runner.cli.runs import RunsCommand
from runner.cli.secret import SecretCommand
from runner.cli.status import StatusCommand
from runner.cli.stop import StopCommand
from runner.cli.template import TemplateCommand
from runner.cli.validate import ValidateCommand

COMMANDS: tuple[type[Command], ...] = (
    RunCommand,
    ValidateCommand,
    PlanCommand,
    GraphCommand,
    StatusCommand,
    RunsCommand,
    ReportCommand,
    StopCommand,
    ResetCommand,
    TemplateCommand,
    ConvertCommand,
    SecretCommand,
)
DEFAULT = RunCommand  # `runner job.yaml` == `runner run job.yaml`


def names() -> tuple[str, ...]:
    """Every subcommand's name, in help order."""
    return tuple(c.name for c in COMMANDS)
