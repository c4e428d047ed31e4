"""What a valid spec needs from this machine: checked before a run creates anything.

`runner run` refuses every finding with exit 2 before the run dir, any etcd key or any worker exists; `runner
validate` refuses the same findings with the same message (both call `check`), except those that may hold where the
job really runs, which it prints as warnings saying why (`Checked.deferred`): the field depends on a `${VAR}` the
compute node may set otherwise, or the spec has a `cluster` section (it is meant for `runner template` and a
scheduler's nodes). Each finding names the field, and its line when the parsed document is given.

Checked: cwd is a directory; the script exists; the program (command[0] or entrypoint.python) is found and
executable; a module's top-level package is found; logs.dir can be created or written; TLS and password files
are readable and the password variable is set (etcd); prometheus-client is installed when metrics are on;
this node's workers fit in the open-file and process limits; the workers' argv and environment fit in
ARG_MAX.
"""

from __future__ import annotations

import importlib.util
import os
import resource
import shutil
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from runner.config.spec import JobSpec
from runner.config.yaml_source import Document, Path, dotted
from runner.errors import SpecError, SpecProblem

Finding = tuple[Path, str, str]  # field, message, fix
FDS_PER_WORKER = 5  # with tee: stdout and stderr pipes, their two log files, the pidfd (without tee: the pidfd)
FDS_OF_AGENT = 64  # the agent's own: logs, etcd channels, timer, shepherd pipe, event loop
CONTRACT_ENV_BYTES = 4096  # RANK, WORLD_SIZE, MASTER_ADDR, ... that the agent adds to each worker's environment


@dataclass(frozen=True)
class Checked:
    """The findings of one spec on this machine: `runner run` refuses them all, `runner validate` the `refused`."""

    refused: tuple[SpecProblem, ...]
    deferred: tuple[tuple[SpecProblem, str], ...]  # each with why it may hold where the job runs

    @property
    def problems(self) -> list[SpecProblem]:
        """Every finding, in the order found."""
        return [*self.refused, *(p for p, _ in self.deferred)]


def check(spec: JobSpec, doc: Document | None = None, environ: Mapping[str, str] | None = None) -> Checked:
    """Every finding, located in `doc` when given, and which of them may hold on the node the job runs on."""
    env = os.environ if environ is None else environ
    found = [*_entrypoint(spec, env), *_logs(spec), *_rendezvous(spec, env), *_metrics(spec), *_limits(spec, env),
             *_fault_tolerance(spec, env)]
    refused: list[SpecProblem] = []
    deferred: list[tuple[SpecProblem, str]] = []
    for path, message, fix in found:
        problem = SpecProblem(dotted(path), message, fix) if doc is None else doc.problem(path, message, fix)
        why = elsewhere(path, doc)
        if why:
            deferred.append((problem, why))
        else:
            refused.append(problem)
    return Checked(tuple(refused), tuple(deferred))


def elsewhere(path: Path, doc: Document | None) -> str:
    """Why a finding at `path` may not hold on the node the job runs on ('' when it holds there too)."""
    if doc is None:
        return ""
    if isinstance(doc.data, dict) and "cluster" in doc.data:
        return ("the spec has a `cluster` section: it runs on the cluster's nodes (runner template), "
                "where this may be met")
    related = [*((("cwd",),) if path[:1] in (("entrypoint",), ("cwd",)) else ())]
    names = sorted({name for where, used in doc.variables.items() for name in used
                    if where[: len(path)] == path or path[: len(where)] == where or where in related})
    if names:
        shown = ", ".join(f"${{{name}}}" for name in names)
        return f"it depends on {shown}, which the node the job runs on may set otherwise"
    return ""


def preflight(
    spec: JobSpec, doc: Document | None = None, environ: Mapping[str, str] | None = None
) -> list[SpecProblem]:
    """Every finding, located in `doc` when given."""
    return check(spec, doc, environ).problems


def _entrypoint(spec: JobSpec, env: Mapping[str, str]) -> Iterator[Finding]:
    ep = spec.entrypoint
    if not os.path.isdir(spec.cwd):
        yield ("cwd",), f"cwd {spec.cwd} is not a directory here", "fix `cwd` (relative to the spec file's folder)"
        return
    if ep.script is not None:
        script = os.path.join(spec.cwd, ep.script)
        if not os.path.isfile(script):
            yield (("entrypoint",), f"script {ep.script} not found in {spec.cwd}",
                   "fix the path (relative to `cwd`, itself relative to the spec file's folder)")
        elif not os.access(script, os.R_OK):
            yield ("entrypoint",), f"script {script} is not readable", "chmod a+r it"
    if ep.module is not None and ep.python is None and "PYTHONPATH" not in dict(spec.env):
        top = ep.module.split(".", 1)[0]
        local = os.path.isdir(os.path.join(spec.cwd, top)) or os.path.isfile(os.path.join(spec.cwd, top + ".py"))
        if not local and _find_module(top) is None:
            message = f"module {top} is neither in {spec.cwd} nor installed for {sys.executable}"
            yield ("entrypoint", "module"), message, "install it, or set cwd to the folder that holds it"
    program = ep.command[0] if ep.command else ep.python
    if program and not _runnable(program, spec.cwd, env):
        field = ("entrypoint", "command") if ep.command else ("entrypoint", "python")
        yield field, f"program '{program}' not found or not executable", "install it, fix PATH, or give a full path"


def _find_module(name: str) -> object | None:
    try:
        return importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None


def _runnable(program: str, cwd: str, env: Mapping[str, str]) -> bool:
    """As exec would find it: a path (relative to the worker's cwd), else a name on PATH."""
    if os.sep in program:
        path = os.path.join(cwd, os.path.expanduser(program))
        return os.path.isfile(path) and os.access(path, os.X_OK)
    return shutil.which(program, path=env.get("PATH", os.defpath)) is not None


def _logs(spec: JobSpec) -> Iterator[Finding]:
    where: Path = ("logs", "dir")
    target = os.path.abspath(os.path.expanduser(spec.logs.dir))  # as the agent resolves it: against its own cwd
    existing = target
    while not os.path.lexists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        yield where, f"{existing} is not a directory, so logs cannot go under {target}", "choose another logs.dir"
    elif not os.access(existing, os.W_OK | os.X_OK):
        verb = "written" if existing == target else f"created (no write access to {existing})"
        yield where, f"logs.dir {target} cannot be {verb}", "choose a folder you can write to, e.g. runner-logs"


def _rendezvous(spec: JobSpec, env: Mapping[str, str]) -> Iterator[Finding]:
    rdzv = spec.rendezvous
    if rdzv.backend != "etcd":
        return
    for name in ("ca", "cert", "key"):
        path = getattr(rdzv.tls, name)
        if path is not None and not _readable(path):
            yield ("rendezvous", "tls", name), f"{path} is not a readable file", "fix the path (relative to the spec)"
    if rdzv.secret_file is not None and not _readable(rdzv.secret_file):
        yield (("rendezvous", "secret_file"), f"{rdzv.secret_file} is not a readable file",
               "fix the path (relative to the spec), or make one: runner secret --new PATH")
    auth = rdzv.auth
    if auth.password_file is not None and not _readable(auth.password_file):
        yield (("rendezvous", "auth", "password_file"), f"{auth.password_file} is not a readable file",
               "fix the path (relative to the spec)")
    if auth.password_env is not None and auth.password_env not in env:
        yield (("rendezvous", "auth", "password_env"), f"environment variable {auth.password_env} is not set",
               f"export {auth.password_env}=... before running")


def _readable(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.R_OK)


def _metrics(spec: JobSpec) -> Iterator[Finding]:
    if spec.metrics.enabled and _find_module("prometheus_client") is None:
        yield ("metrics", "enabled"), "metrics need the prometheus-client package", "pip install prometheus-client"


FT_INSTALL = "pip install 'runner[ft]' (torchft, with its lighthouse) into the workers' environment"


def lighthouse_program(env: Mapping[str, str]) -> str | None:
    """The `torchft_lighthouse` the agent runs: beside this interpreter (a virtualenv's bin/), else on PATH."""
    beside = os.path.join(os.path.dirname(sys.executable), "torchft_lighthouse")
    if os.access(beside, os.X_OK):
        return beside
    return shutil.which("torchft_lighthouse", path=env.get("PATH"))


def _fault_tolerance(spec: JobSpec, env: Mapping[str, str]) -> Iterator[Finding]:
    """Replica groups need torchft where the workers run, and its lighthouse binary where a hosted one runs."""
    groups = spec.replica_groups
    if groups is None:
        return
    if spec.entrypoint.kind != "command" and spec.entrypoint.python is None and _find_module("torchft") is None:
        yield ("replica_groups",), "replica groups need torchft, which is not installed", FT_INSTALL
    if groups.lighthouse.hosted and lighthouse_program(env) is None:
        yield (("replica_groups", "lighthouse", "hosted"), "a hosted lighthouse needs `torchft_lighthouse`, not found",
               FT_INSTALL + ", or set hosted: false and the address of a running lighthouse")


def _limits(spec: JobSpec, env: Mapping[str, str]) -> Iterator[Finding]:
    nproc = spec.workers_per_node  # every replica group's workers, when the spec has groups
    fds = FDS_OF_AGENT + nproc * (FDS_PER_WORKER if spec.logs.tee else 1)
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and fds > soft:
        yield (("nproc_per_node",), f"{nproc} workers need about {fds} open files, the limit here is {soft}",
               "raise it (ulimit -n) or lower nproc_per_node")
    procs, _ = resource.getrlimit(resource.RLIMIT_NPROC)
    if procs != resource.RLIM_INFINITY and nproc + 2 > procs:
        yield (("nproc_per_node",), f"{nproc} workers exceed this user's process limit ({procs})",
               "raise it (ulimit -u) or lower nproc_per_node")
    arg_max = os.sysconf("SC_ARG_MAX")
    strings = [*_argv(spec), *(f"{k}={v}" for k, v in {**env, **dict(spec.env)}.items())]
    size = CONTRACT_ENV_BYTES + sum(len(s.encode("utf-8", "surrogateescape")) + 1 + 8 for s in strings)
    if arg_max > 0 and size > arg_max:
        message = f"a worker's arguments and environment take about {size} bytes, more than ARG_MAX ({arg_max}) here"
        yield ("env",), message, "shorten env values or args, or run from a smaller environment"


def _argv(spec: JobSpec) -> tuple[str, ...]:
    ep = spec.entrypoint
    if ep.command is not None:
        return (*ep.command, *ep.args)
    return (ep.python or sys.executable, "-u", "-m" if ep.module else "", ep.module or ep.script or "", *ep.args)


def require(spec: JobSpec, source: str, doc: Document | None = None) -> None:
    """For `runner run`: SpecError (exit 2) when anything above fails, before anything is created."""
    problems = check(spec, doc).problems
    if problems:
        raise SpecError(source, problems)


def validate(spec: JobSpec, source: str, doc: Document | None = None) -> list[tuple[SpecProblem, str]]:
    """For `runner validate`: what run refuses raises the same SpecError (exit 2, the same text).

    Returned: the findings that may hold on the node the job runs on, each with why, to print as warnings.
    """
    checked = check(spec, doc)
    if checked.refused:
        raise SpecError(source, list(checked.refused))
    return list(checked.deferred)
