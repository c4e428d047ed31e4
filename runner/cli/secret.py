"""`runner secret --new PATH`: write a new per-job secret for a hosted rendezvous (docs/security.md)."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from runner.cli.command import Command
from runner.errors import EXIT_SPEC, RunnerError


class SecretFileError(RunnerError):
    """The secret's file cannot be created (it exists, or its folder refuses)."""

    exit_code = EXIT_SPEC


class SecretCommand(Command):
    """Write a job's secret."""

    name = "secret"
    help = "write a new secret for a hosted rendezvous (rendezvous.secret_file / RUNNER_SECRET_FILE)"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """--new PATH."""
        parser.add_argument("--new", metavar="PATH", required=True,
                            help="file to create (mode 0600; an existing file is never overwritten)")

    def run(self, args: argparse.Namespace) -> int:
        """Create the file; print its path."""
        from runner.contract import SECRET_ENV
        from runner.rendezvous.etcd.job_secret import new_secret_file

        path = Path(args.new)
        try:
            new_secret_file(path)
        except FileExistsError:
            raise SecretFileError(f"{path} exists: a secret is never overwritten (the job's nodes may be using it)",
                            fix=f"use it as it is, or remove it first (rm {path}) when no job uses it") from None
        except OSError as exc:
            msg = f"cannot create {path}: {exc.strerror}"
            raise SecretFileError(msg, fix="choose a folder you can write to") from None
        # The variable is read in each node's own folder: an absolute path, so the line works pasted anywhere.
        print(f"runner: wrote a new secret to {path} (mode 0600); give it to every node of the job: "
              f"rendezvous.secret_file: {path} (relative to the spec's folder), "
              f"or export {SECRET_ENV}={shlex.quote(str(path.absolute()))}")
        return 0
