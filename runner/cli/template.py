"""`runner template slurm|kubernetes job.yaml [-o FILE]`: render the job for a cluster scheduler."""

from __future__ import annotations

import argparse
from pathlib import Path

from runner.cli.command import Command
from runner.errors import RunnerError


class TemplateCommand(Command):
    """Render a Slurm sbatch script or Kubernetes manifests."""

    name = "template"
    help = "render a Slurm sbatch script or Kubernetes manifests for the job"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """kind, spec, -o."""
        parser.add_argument("kind", choices=("slurm", "kubernetes", "k8s"), help="which scheduler")
        parser.add_argument("spec", help="job spec (YAML); the output refers to it by this path")
        parser.add_argument("-o", "--output", help="write to this file instead of stdout")

    def run(self, args: argparse.Namespace) -> int:
        """Print (or write) the rendered template; what it changed in the spec's job, on stderr."""
        import sys

        from runner.config.clusters.render import render_file

        notes: list[str] = []
        emit(render_file("kubernetes" if args.kind == "k8s" else args.kind, args.spec, notes), args.output)
        for note in notes:
            print(f"runner template: note: {note}", file=sys.stderr)
        return 0


def emit(text: str, output: str | None) -> None:
    """Print, or write to `output`."""
    if output is None:
        print(text, end="")
        return
    try:
        Path(output).write_text(text, encoding="utf-8")
    except OSError as e:
        raise RunnerError(f"cannot write {output}: {e.strerror or e}", fix="pick another place with -o FILE") from e
