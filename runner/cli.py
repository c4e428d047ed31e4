"""Command line: the only module that prints for humans or decides the process exit code."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from runner import __version__
from runner.cli_cluster import register as register_cluster
from runner.errors import EXIT_INFRA, EXIT_SPEC, RunnerError

COMMANDS = ("run", "validate", "plan", "graph", "status", "stop", "reset", "template", "convert")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `runner` and `python -m runner`."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] not in COMMANDS and not args[0].startswith("-"):
        args.insert(0, "run")  # `runner job.yaml` == `runner run job.yaml`
    parser = build_parser()
    ns = parser.parse_args(args)
    if not getattr(ns, "func", None):
        parser.print_help(sys.stderr)
        return EXIT_SPEC
    try:
        return int(ns.func(ns))
    except RunnerError as e:
        print(f"runner: error: {e.message}", file=sys.stderr)
        if e.fix:
            print(f"runner: fix: {e.fix}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # noqa: BLE001 - a bug of ours: keep the details, show one line
        return internal_error(e)


def internal_error(e: Exception) -> int:
    """Save the traceback to a file and print one line pointing at it (workers were already stopped)."""
    import tempfile  # noqa: PLC0415
    import traceback  # noqa: PLC0415

    with tempfile.NamedTemporaryFile("w", prefix="runner-crash-", suffix=".txt", delete=False) as f:
        traceback.print_exc(file=f)
    print(f"runner: internal error: {type(e).__name__}: {e} (details in {f.name}; please report it)", file=sys.stderr)
    return EXIT_INFRA


def build_parser() -> argparse.ArgumentParser:
    """All subcommands."""
    p = argparse.ArgumentParser(prog="runner", description="Run distributed PyTorch jobs from a YAML spec.")
    p.add_argument("--version", action="version", version=f"runner {__version__}")
    sub = p.add_subparsers(metavar="COMMAND")

    def cmd(name: str, func: Callable[[argparse.Namespace], int], help_: str) -> argparse.ArgumentParser:
        sp = sub.add_parser(name, help=help_, description=help_)
        sp.set_defaults(func=func)
        return sp

    run = cmd("run", cmd_run, "run the job on this node (the default: `runner job.yaml`)")
    run.add_argument("spec", help="job spec (YAML)")
    run.add_argument("--node", help="this node's id (default: $RUNNER_NODE, $SLURM_NODEID, pod index, hostname)")
    run.add_argument("--advertise-addr", help="address other nodes reach this one at (multi-node)")
    cmd("validate", cmd_validate, "check a job spec and report every problem").add_argument("spec")
    plan = cmd("plan", cmd_plan, "print the resolved spec and each rank's argv and environment")
    plan.add_argument("spec")
    plan.add_argument("--json", action="store_true", help="machine-readable output")
    cmd("graph", cmd_graph, "print the agent's state machine as a Mermaid diagram")
    status = cmd("status", cmd_status, "show the job's state, nodes and workers (while it runs and after)")
    status.add_argument("spec")
    status.add_argument("--json", action="store_true", help="machine-readable output")
    stop = cmd("stop", cmd_stop, "stop every agent of the job")
    stop.add_argument("spec")
    stop.add_argument("--graceful", action="store_true", help="let the workers finish; no restart")
    reset = cmd("reset", cmd_reset, "forget an ended etcd job's shared state so its name can run again")
    reset.add_argument("spec")
    reset.add_argument("--force", action="store_true", help="even while nodes are live")
    register_cluster(sub, cmd)
    return p


def load(path: str) -> Any:
    """Load and validate a spec; a SpecError propagates to main(), which prints every problem."""
    from runner.config import load_spec  # noqa: PLC0415 - keep `runner graph` and --help fast

    return load_spec(path)


def cmd_validate(ns: argparse.Namespace) -> int:
    """`runner validate job.yaml`."""
    spec = load(ns.spec)
    print(f"{ns.spec}: ok (job '{spec.name}', {spec.nodes.min}-{spec.nodes.max} node(s) x {spec.nproc_per_node})")
    return 0


def cmd_plan(ns: argparse.Namespace) -> int:
    """`runner plan job.yaml`: what `runner job.yaml` would run, without running it."""
    from runner.plan_view import plan_view  # noqa: PLC0415

    view = plan_view(load(ns.spec))
    if ns.json:
        print(json.dumps(view, indent=2))
    else:
        import yaml  # noqa: PLC0415

        print(yaml.safe_dump(view, sort_keys=False, width=120), end="")
    return 0


def cmd_graph(ns: argparse.Namespace) -> int:  # noqa: ARG001 - uniform signature
    """`runner graph`: the state machine as Mermaid."""
    from runner.machine import mermaid  # noqa: PLC0415

    print(mermaid())
    return 0


def cmd_status(ns: argparse.Namespace) -> int:
    """`runner status job.yaml [--json]`."""
    from runner.control import read_status  # noqa: PLC0415

    status = read_status(load(ns.spec))
    if ns.json:
        print(json.dumps(status, indent=2, default=str))
        return 0
    head = {k: v for k, v in status.items() if k != "nodes"}
    print("  ".join(f"{k}={v}" for k, v in head.items()))
    for node in status.get("nodes", []):
        workers = ", ".join(
            f"rank {w.get('rank')} pid {w.get('pid')}" + (f" exit {w['exit_code']}" if w.get("exit_code") is not None else "")
            for w in node.get("workers", [])
        )
        print(f"  node {node.get('node')}: {node.get('state')} attempt {node.get('attempt')}  [{workers}]")
    return 0


def cmd_stop(ns: argparse.Namespace) -> int:
    """`runner stop job.yaml [--graceful]`."""
    from runner.control import request_stop  # noqa: PLC0415

    print(request_stop(load(ns.spec), ns.graceful))
    return 0


def cmd_reset(ns: argparse.Namespace) -> int:
    """`runner reset job.yaml [--force]`."""
    from runner.control import reset  # noqa: PLC0415

    print(reset(load(ns.spec), ns.force))
    return 0


def cmd_run(ns: argparse.Namespace) -> int:
    """`runner job.yaml`: run the job on this node; exit code per README "Exit codes"."""
    import asyncio  # noqa: PLC0415

    from runner import agent, logs  # noqa: PLC0415

    spec = load(ns.spec)
    logs.configure(spec.logs.format)
    ctx = asyncio.run(agent.run(spec, node=ns.node, advertise_addr=ns.advertise_addr))
    print_summary(ctx)
    # Every worker is reaped and every file closed by now: skip the interpreter's teardown (tens of ms).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(int(ctx.exit_code))


def print_summary(ctx: Any) -> None:
    """The short report a human reads at the end: outcome, attempts, each root cause, where the logs are."""
    attempts = ctx.attempt + 1
    out = sys.stderr
    print(
        f"runner: job '{ctx.spec.name}' {ctx.outcome} after {attempts} attempt(s), "
        f"{ctx.restarts} restart(s); exit code {ctx.exit_code}",
        file=out,
    )
    failures = ctx.failures or ([ctx.failure] if ctx.failure is not None else [])  # INIT's fatal skips FAILED
    for f in failures[:-1]:
        print(f"runner:   attempt {f.attempt}: {f.reason}", file=out)
    if failures and ctx.outcome != "succeeded":
        print("runner: " + failures[-1].report().replace("\n", "\nrunner: "), file=out)
    elif failures:
        print(f"runner:   attempt {failures[-1].attempt}: {failures[-1].reason}", file=out)
    print(f"runner: logs: {ctx.run_dir}", file=out)
