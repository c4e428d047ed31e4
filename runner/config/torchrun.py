"""`runner convert -- torchrun [options] script.py [args]`: the equivalent job spec (pure: argv in, dict out)."""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Any

import yaml

from runner.errors import EXIT_SPEC, RunnerError

LAUNCH_MODULES = ("torch.distributed.run", "torch.distributed.launch")
# torchrun option -> takes a value? (`--a_b` and `--a-b` are the same option)
VALUED = {"nnodes", "nproc-per-node", "rdzv-backend", "rdzv-endpoint", "rdzv-id", "rdzv-conf", "max-restarts",
          "log-dir", "redirects", "tee", "node-rank", "master-addr", "master-port", "monitor-interval",
          "start-method", "role", "local-addr", "rdzv-timeout"}
SWITCHES = {"standalone", "module", "no-python"}
IGNORED = {"monitor-interval": "the runner waits on worker exits, it does not poll",
           "start-method": "workers are always started as fresh processes",
           "role": "roles are not supported; ROLE_NAME is 'default'",
           "local-addr": "pass `runner job.yaml --advertise-addr ADDR` on each node instead",
           "node-rank": "each node's id comes from --node, SLURM_NODEID or the pod index; ranks come from the rendezvous",
           "master-addr": "the rendezvous picks MASTER_ADDR (rank 0's node) and a fresh MASTER_PORT every attempt",
           "master-port": "the rendezvous picks MASTER_ADDR (rank 0's node) and a fresh MASTER_PORT every attempt"}
SHORT = {"-m": "module", "-r": "redirects", "-t": "tee"}
RDZV_CONF = {"join_timeout": "join_timeout", "last_call_timeout": "last_call"}


class ConvertError(RunnerError):
    """A torchrun command line the converter cannot translate faithfully."""

    exit_code = EXIT_SPEC


@dataclass
class Parsed:
    """torchrun's options (normalised names) and the program with its arguments."""

    options: dict[str, str | bool] = field(default_factory=dict)
    program: list[str] = field(default_factory=list)


def strip_launcher(argv: Sequence[str]) -> list[str]:
    """Argv without a leading `torchrun` / `python -m torch.distributed.run`."""
    args = list(argv)
    if args and PurePath(args[0]).name == "torchrun":
        return args[1:]
    if len(args) >= 3 and PurePath(args[0]).name.startswith("python") and args[1:3] in (["-m", m] for m in LAUNCH_MODULES):
        return args[3:]
    return args


def option_name(token: str) -> str:
    """'--nproc_per_node' -> 'nproc-per-node'; '-m' -> 'module'; an unknown option -> ConvertError."""
    name = SHORT.get(token) or token.lstrip("-").replace("_", "-")
    if name in VALUED or name in SWITCHES:
        return name
    known = ", ".join(f"--{n}" for n in sorted(VALUED | SWITCHES))
    raise ConvertError(f"unknown torchrun option {token}", f"runner convert knows: {known}; "
                       "put the script's own options after the script name")


def parse(argv: Sequence[str]) -> Parsed:
    """Torchrun's options up to the script; everything after the script is the script's."""
    out, args, i = Parsed(), strip_launcher(argv), 0
    while i < len(args):
        token = args[i]
        if token == "--":  # noqa: S105 - an argv token, not a password
            out.program = args[i + 1:]
            break
        if not token.startswith("-") or token == "-":  # noqa: S105 - same
            out.program = args[i:]
            break
        flag, has_value, value = token.partition("=")
        name = option_name(flag)
        if name in SWITCHES:
            out.options[name] = True
        elif has_value:
            out.options[name] = value
        elif i + 1 < len(args):
            out.options[name], i = args[i + 1], i + 1
        else:
            raise ConvertError(f"torchrun option {flag} needs a value", f"write {flag} VALUE")
        i += 1
    if not out.program:
        raise ConvertError("no training script in the torchrun command line", "end it with: script.py [args...]")
    return out


def job_name(opts: dict[str, str | bool], program: list[str]) -> str:
    """rdzv-id, else the script or module name, made to fit the spec's name pattern."""
    script = program[0] if opts.get("module") else PurePath(program[0]).stem
    raw = str(opts.get("rdzv-id") or script or "job")
    name = re.sub(r"[^a-zA-Z0-9_.-]+", "-", raw).strip("-.")[:63]
    return name if name and name[0].isalnum() else f"job-{name}".strip("-")


def integer(opts: dict[str, str | bool], name: str, default: int) -> int:
    """An integer option, or a ConvertError naming it."""
    value = opts.get(name, default)
    try:
        return int(value)
    except ValueError:
        fix = "write the number of workers per node, e.g. 8" if name == "nproc-per-node" else "write an integer"
        raise ConvertError(f"--{name} {value}: the runner needs a number here", fix) from None


def entrypoint(opts: dict[str, str | bool], program: list[str]) -> dict[str, Any]:
    """Script / module / command, with the program's arguments."""
    head, rest = program[0], program[1:]
    if opts.get("no-python"):
        entry: dict[str, Any] = {"command": program}
        return entry
    entry = {"module": head} if opts.get("module") else {"script": head}
    if rest:
        entry["args"] = rest
    return entry


def nodes(opts: dict[str, str | bool]) -> tuple[int | str, int]:
    """--nnodes N or MIN:MAX -> (spec value, max)."""
    raw = str(opts.get("nnodes", "1"))
    low, _, high = raw.partition(":")
    try:
        lo, hi = int(low), int(high or low)
    except ValueError:
        raise ConvertError(f"--nnodes {raw}: not N or MIN:MAX", "write e.g. --nnodes 4 or --nnodes 2:4") from None
    return (lo if lo == hi else f"{lo}:{hi}"), hi


def rendezvous(opts: dict[str, str | bool], max_nodes: int, notes: list[str]) -> dict[str, Any]:
    """Local for one node (or --standalone); etcd otherwise."""
    backend = str(opts.get("rdzv-backend", "static"))
    endpoint = str(opts.get("rdzv-endpoint", ""))
    rdzv: dict[str, Any] = {}
    if opts.get("standalone") or max_nodes == 1:
        rdzv["backend"] = "local"
    else:
        rdzv["backend"] = "etcd"
        if backend.startswith("etcd") and endpoint:
            rdzv["endpoints"] = endpoint
        else:
            host = endpoint.rpartition(":")[0] or endpoint or "127.0.0.1"
            rdzv["endpoints"] = f"{host}:2379"
            notes.append(f"rdzv-backend {backend} has no runner equivalent: rendezvous.endpoints must point at an etcd")
    for pair in filter(None, str(opts.get("rdzv-conf", "")).split(",")):
        key, _, value = pair.partition("=")
        if key.strip() in RDZV_CONF and rdzv["backend"] == "etcd":
            rdzv[RDZV_CONF[key.strip()]] = float(value) if value.replace(".", "", 1).isdigit() else value.strip()
        else:
            notes.append(f"rdzv-conf {key.strip()} is not used by the runner")
    if "rdzv-timeout" in opts and rdzv["backend"] == "etcd":
        rdzv["join_timeout"] = integer(opts, "rdzv-timeout", 900)
    return rdzv


def logs(opts: dict[str, str | bool], notes: list[str]) -> dict[str, Any]:
    """--log-dir, --redirects, --tee -> logs.dir and logs.tee (the runner always writes per-rank files)."""
    out: dict[str, Any] = {}
    if opts.get("log-dir"):
        out["dir"] = opts["log-dir"]
    redirects, tee = str(opts.get("redirects", "0")), str(opts.get("tee", "0"))
    for name, value in (("redirects", redirects), ("tee", tee)):
        if ":" in value:
            notes.append(f"per-rank --{name} {value} is not supported: the same setting applies to every rank")
    if redirects.rpartition(":")[2] != "0" and tee.rpartition(":")[2] == "0":
        out["tee"] = False  # output goes to files only, as with torchrun --redirects
    return out


def convert(argv: Sequence[str]) -> tuple[dict[str, Any], list[str]]:
    """(job spec dict, notes about options that have no exact equivalent)."""
    parsed, notes = parse(argv), list[str]()
    opts = parsed.options
    node_value, max_nodes = nodes(opts)
    spec: dict[str, Any] = {"version": 1, "name": job_name(opts, parsed.program),
                            "entrypoint": entrypoint(opts, parsed.program)}
    if max_nodes != 1:
        spec["nodes"] = node_value
    spec["nproc_per_node"] = integer(opts, "nproc-per-node", 1)
    spec["rendezvous"] = rendezvous(opts, max_nodes, notes)
    spec["restart"] = {"max_restarts": integer(opts, "max-restarts", 0)}  # torchrun's default is 0
    if log_section := logs(opts, notes):
        spec["logs"] = log_section
    notes += [f"--{name}: {why}" for name, why in IGNORED.items() if name in opts]
    return spec, notes


def to_yaml(argv: Sequence[str]) -> str:
    """The job.yaml text: a comment with the original command and notes, then the spec."""
    spec, notes = convert(argv)
    head = ["# converted by `runner convert` from:", f"#   {shlex.join(argv)}"]
    head += [f"# note: {note}" for note in notes]
    return "\n".join(head) + "\n" + str(yaml.safe_dump(spec, sort_keys=False, width=120))
