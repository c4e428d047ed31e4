"""`runner template slurm|kubernetes job.yaml` and `runner convert -- torchrun ...` (registered by runner.cli)."""

from __future__ import annotations

import argparse
from collections.abc import Callable

Cmd = Callable[[str, Callable[[argparse.Namespace], int], str], argparse.ArgumentParser]


def register(sub: object, cmd: Cmd) -> None:
    """Add the `template` and `convert` subcommands through cli.build_parser's `cmd(name, func, help)`."""
    template = cmd("template", cmd_template, "render a Slurm sbatch script or Kubernetes manifests for the job")
    template.add_argument("kind", choices=("slurm", "kubernetes", "k8s"), help="which scheduler")
    template.add_argument("spec", help="job spec (YAML); the output refers to it by this path")
    template.add_argument("-o", "--output", help="write to this file instead of stdout")
    convert = cmd("convert", cmd_convert, "print the job.yaml equivalent to a torchrun command line")
    convert.add_argument("torchrun", nargs=argparse.REMAINDER,
                         help="the torchrun command line, after `--`: runner convert -- torchrun ... train.py")


def emit(text: str, output: str | None) -> None:
    """Print, or write to `output`."""
    if output is None:
        print(text, end="")
        return
    with open(output, "w", encoding="utf-8") as f:
        f.write(text)


def cmd_template(ns: argparse.Namespace) -> int:
    """`runner template slurm|kubernetes job.yaml [-o FILE]`."""
    from runner.config.render import load_for_template, render

    spec, text = load_for_template(ns.spec)
    emit(render("kubernetes" if ns.kind == "k8s" else ns.kind, spec, ns.spec, text), ns.output)
    return 0


def cmd_convert(ns: argparse.Namespace) -> int:
    """`runner convert -- torchrun [options] script.py [args]`."""
    from runner.convert import ConvertError, to_yaml

    argv = ns.torchrun[1:] if ns.torchrun[:1] == ["--"] else ns.torchrun
    if not argv:
        raise ConvertError("no torchrun command line given", "runner convert -- torchrun --nproc-per-node 2 train.py")
    print(to_yaml(argv), end="")
    return 0
