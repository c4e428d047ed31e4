"""`runner convert -- torchrun [options] script.py [args]`: the equivalent job spec (pure: argv and environ in).

Every torchrun option (runner.config.torchrun_flags.FLAGS) either sets a spec field with the same behaviour or
adds a note saying precisely what differs; torchrun's own refusals (bad values) are refused with its reason.
Strings from the command line are written so the spec's `${VAR}` interpolation leaves them as typed (`${` is
written `$${`); the workers then get torchrun's `${local_rank}` substitution from the launch plan.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import signal
from collections.abc import Mapping, Sequence
from pathlib import PurePath
from string import Template

import yaml

from runner.config.build import UNHANDLEABLE
from runner.config.devices import KINDS
from runner.config.torchrun_flags import FLAGS, ConvertError, Parsed, read_argv

__all__ = ["ConvertError", "convert", "to_yaml"]

RDZV_CONF = {"join_timeout": "join_timeout", "last_call_timeout": "last_call"}
LOOPBACK = ("", "localhost", "127.0.0.1", "::1", "[::1]", "0.0.0.0")  # noqa: S104 - compared, never bound
NAME_DIGEST = 6  # hex digits of the conversion's digest in a name taken from the script (`train-3f9a2c`)
HOSTED_PORT = 29400  # torchrun's default c10d port: the self-hosted rendezvous listens there
STD_VALUE = re.compile(r"^[0123]$")
STD_MAP = re.compile(r"^(\d:[0123],)*(\d:[0123])$")  # torch's _MAPPING_REGEX: local ranks 0-9 only
STREAMS = {0: "none", 1: "stdout", 2: "stderr", 3: "all"}


class Conversion:
    """One command line being converted: the spec built so far and the notes.

    One concern over 20 methods: each method converts one group of torchrun flags into its spec section, and all
    share the notes and the spec under construction (split, each would pass both around).
    """

    def __init__(self, parsed: Parsed, environ: Mapping[str, str], cwd: str | None) -> None:
        self.p = parsed
        self.environ = environ
        self.cwd = cwd
        self.notes: list[str] = []
        self.spec: dict[str, object] = {"version": 1}
        self.by_script = True  # the name is the script's or module's (not an --rdzv-id): it gets a digest

    def note(self, text: str) -> None:
        """Record something that has no exact equivalent."""
        self.notes.append(text)

    def section(self, name: str) -> dict[str, object]:
        """spec[name], created on first use."""
        out = self.spec.get(name)
        if not isinstance(out, dict):
            out = self.spec[name] = {}
        return out

    def absolute(self, path: str) -> str:
        """`path` against the converting shell's folder (torchrun's), so the spec runs the same file anywhere."""
        if self.cwd is None or os.path.isabs(path):
            return path
        return os.path.normpath(os.path.join(self.cwd, path))

    def integer(self, dest: str, flag: str, default: str, minimum: int = 0) -> int:
        """A valued option torchrun reads with int()."""
        raw = self.p.text(dest, default)
        try:
            value = int(raw)
        except ValueError:
            raise ConvertError(f"{flag} {raw}: torchrun needs an integer here", "write a whole number") from None
        if value < minimum:
            raise ConvertError(f"{flag} {raw}: must be at least {minimum}", f"write a number >= {minimum}")
        return value

    # -- sections -------------------------------------------------------------------------------------------

    def nodes(self) -> tuple[int, int]:
        """--nnodes N or MIN:MAX (torchrun: 0 < MIN <= MAX)."""
        raw = self.p.text("nnodes", "1:1")
        parts = raw.split(":")
        try:
            low, high = int(parts[0]), int(parts[-1])
        except ValueError:
            low = high = -1
        if len(parts) > 2 or low == -1:
            raise ConvertError(f"--nnodes {raw}: not N or MIN:MAX", "write e.g. --nnodes 4 or --nnodes 2:4")
        if not 0 < low <= high:
            raise ConvertError(f"--nnodes {raw}: torchrun needs 0 < MIN <= MAX", "e.g. --nnodes 1:4")
        return low, high

    def nproc(self) -> None:
        """A number, or auto/gpu/xpu/cpu (counted where the job runs)."""
        raw = self.p.text("nproc_per_node", "1")
        if raw in KINDS:
            self.spec["nproc_per_node"] = raw
            return
        try:
            value = int(raw)
        except ValueError:
            raise ConvertError(f"--nproc-per-node {raw}: unsupported value",
                               "write a number of workers per node, or auto, gpu, xpu, cpu") from None
        if value < 1:
            raise ConvertError(f"--nproc-per-node {raw}: torchrun would start no worker", "write at least 1")
        self.spec["nproc_per_node"] = value

    def name(self, standalone: bool) -> None:
        """--rdzv-id (not with --standalone, where torchrun draws a uuid), else the script or module name.

        A name taken from the script gets a digest of the whole conversion once the spec is built (`named`).
        """
        program = self.p.program[0]
        script = program if self.p.switch("module") else PurePath(program).stem
        rdzv_id = self.p.text("rdzv_id", "none")
        raw = script if standalone or rdzv_id == "none" else rdzv_id
        name = re.sub(r"[^a-zA-Z0-9_.-]+", "-", raw).strip("-.")[:63]
        name = name if name and name[0].isalnum() else f"job-{name}".strip("-")[:63]
        if raw == rdzv_id and name != rdzv_id:
            self.note(f"--rdzv-id {rdzv_id}: the job name must match [a-zA-Z0-9][a-zA-Z0-9_.-]*; using {name}")
        self.spec["name"] = name
        self.by_script = standalone or rdzv_id == "none"

    def distinct_name(self) -> None:
        """A script's name plus a digest of what the conversion made: `train-3f9a2c`.

        Two different conversions (another folder, script, arguments, worker count, ...) get different names, so their
        logs folders, runs and node ledgers never mix; the same command converted again gets the same name. A job of
        several nodes leaves the node-local fields (cwd, logs.dir) out of the digest: every node must agree on the
        name whatever folder it converted in. An --rdzv-id is the user's own name and is kept as it is.
        """
        if not self.by_script:
            return
        identity = {k: v for k, v in self.spec.items() if k != "name"}
        rdzv, logs = self.spec.get("rendezvous"), identity.get("logs", {})
        if isinstance(rdzv, dict) and rdzv.get("backend") == "etcd":
            identity.pop("cwd", None)
            identity["logs"] = {k: v for k, v in logs.items() if k != "dir"} if isinstance(logs, dict) else logs
        blob = json.dumps(identity, sort_keys=True, separators=(",", ":"), default=str)
        digest = hashlib.sha256(blob.encode("utf-8", "surrogatepass")).hexdigest()[:NAME_DIGEST]
        self.spec["name"] = f"{str(self.spec['name'])[: 62 - NAME_DIGEST]}-{digest}"

    def rendezvous(self, low: int, high: int) -> None:
        """Local for one node (what torchrun's run() makes c10d on localhost), else etcd."""
        standalone = self.p.switch("standalone")
        backend = self.p.text("rdzv_backend", "static")
        endpoint = self.p.text("rdzv_endpoint", "")
        master_port = self.p.value("master_port")
        if standalone:
            backend, endpoint = "c10d", "localhost:0"
        elif backend == "static" and not endpoint and master_port is None and high == 1:
            backend, endpoint = "c10d", "localhost:0"  # torchrun's run(): a one-node job gets a local c10d
        self.name(standalone)
        host = endpoint.rpartition(":")[0] if ":" in endpoint.strip("[]") or endpoint.startswith("[") else endpoint
        local = high == 1 or (low == 1 and not backend.startswith("etcd") and (host in LOOPBACK
                                                                               or host.startswith("127.")))
        if local:
            if high > 1:
                self.note(f"--nnodes {low}:{high} with the {backend} rendezvous on {endpoint or 'this host'}: "
                          "converted to a single-node local job (torchrun would also wait for other nodes joining "
                          f"there); for several nodes write nodes: {low}:{high} and an etcd rendezvous")
            self.local_rendezvous(backend)
        else:
            self.spec["nodes"] = low if low == high else f"{low}:{high}"
            self.etcd_rendezvous(backend, endpoint)
            self.loopback_note(high)
        self.rdzv_conf(local)

    def loopback_note(self, high: int) -> None:
        """A several-node job on a loopback endpoint works on one machine only: say so (runner template refuses it)."""
        from runner.config.cluster_checks import classify

        endpoints = str(self.section("rendezvous").get("endpoints", ""))
        first = endpoints.split(",", maxsplit=1)[0].strip()
        if first and classify(first, lambda _: ()).this_machine_only:
            port = first.rpartition(":")[2]
            self.note(f"rendezvous.endpoints {first} is this machine's loopback, but --nnodes allows {high} nodes: "
                      "on separate machines each node would reach (or host) an etcd of its own. Write the first "
                      f"node's address, or \"${{RUNNER_FIRST_NODE}}:{port}\" for `runner template` (docs/clusters.md); "
                      "`runner template` refuses the loopback endpoint")

    def local_rendezvous(self, backend: str) -> None:
        """The local backend; static keeps --master-addr/--master-port, as torchrun's static rendezvous does."""
        rdzv = self.section("rendezvous")
        rdzv["backend"] = "local"
        if backend == "static":
            rdzv["master_addr"] = self.p.text("master_addr", "127.0.0.1")
            rdzv["master_port"] = self.integer("master_port", "--master-port", "29500", 1)
            if self.integer("node_rank", "--node-rank", "0") != 0:
                self.note("--node-rank: a one-node job's node is rank 0 (torchrun would wait for a node 0 forever)")
        else:
            for dest, flag in (("master_addr", "--master-addr"), ("node_rank", "--node-rank")):
                if self.p.set(dest):
                    self.note(f"{flag}: ignored, as torchrun ignores it with the {backend} rendezvous")
        if self.p.set("local_addr"):
            rdzv["master_addr"] = self.p.text("local_addr")

    def etcd_rendezvous(self, backend: str, endpoint: str) -> None:
        """Use etcd (v3) for several nodes; what torchrun's c10d/static backends do needs a note."""
        rdzv = self.section("rendezvous")
        rdzv["backend"] = "etcd"
        if backend.startswith("etcd") and endpoint:
            rdzv["endpoints"] = endpoint
            if backend in {"etcd-v2", "etcd"}:
                self.note(f"--rdzv-backend {backend}: the runner uses etcd's v3 API (etcd 3.4+ serves it)")
        else:  # c10d or static: one node hosts the rendezvous itself (an etcd it starts), nothing else to run
            if backend == "static":
                host, port = self.p.text("master_addr", "127.0.0.1"), HOSTED_PORT
            else:
                host, _, port_text = endpoint.rpartition(":") if ":" in endpoint else (endpoint, "", "")
                port = int(port_text) if port_text.isdigit() else HOSTED_PORT
            rdzv["hosted"] = True
            rdzv["endpoints"] = f"{host or '127.0.0.1'}:{port}"
            self.note(f"--rdzv-backend {backend}: self-hosted rendezvous (rendezvous.hosted): the node whose machine "
                      f"has {host or '127.0.0.1'} starts an etcd on port {port} for the others, as c10d's host "
                      "does; install it with `pip install -c constraints.txt -e '.[etcd]'` (docs/multinode.md)")
            self.note("the nodes of a hosted rendezvous share the job's secret (TLS and auth, unlike c10d's open "
                      "store): `runner secret --new job.secret`, then `export RUNNER_SECRET_FILE=$PWD/job.secret` on "
                      "every node (docs/security.md); one machine (a loopback endpoint) needs none")
        if backend == "static":
            if self.p.set("master_port"):
                rdzv["master_port"] = self.integer("master_port", "--master-port", "29500", 1)
            self.note("--node-rank: start each agent with `runner job.yaml --node nodeR` (zero-padded beyond 10 "
                      "nodes: ids are ordered as text) and `--advertise-addr ITS_ADDR`")
        if self.p.set("local_addr"):
            self.note(f"--local-addr {self.p.text('local_addr')}: per node; start that node's agent with "
                      "`runner job.yaml --advertise-addr ADDR`")

    def rdzv_conf(self, local: bool) -> None:
        """join_timeout / last_call_timeout on etcd jobs; every other key is a note."""
        for pair in self.p.text("rdzv_conf", "").split(","):
            if not pair:
                continue
            key, _, value = pair.partition("=")
            if not key or not value:
                raise ConvertError(f"--rdzv-conf {pair!r}: torchrun needs key=value", "e.g. join_timeout=600")
            if key in RDZV_CONF and not local:
                try:
                    self.section("rendezvous")[RDZV_CONF[key]] = float(value)
                except ValueError:
                    raise ConvertError(f"--rdzv-conf {key}={value}: not a number of seconds", "e.g. 600") from None
            elif key in RDZV_CONF:
                self.note(f"--rdzv-conf {key}: no meaning for a one-node job (its rendezvous completes at once)")
            else:
                self.note(f"--rdzv-conf {key}: not used by the runner")

    def restart(self) -> None:
        """Set --max-restarts: torchrun's default is 0 restarts, and it restarts at once."""
        restarts = self.integer("max_restarts", "--max-restarts", "0")
        section = self.section("restart")
        section["max_restarts"] = restarts
        if restarts:
            section["backoff"] = {"initial": 0, "max": 0}

    def shutdown(self) -> None:
        """--signals-to-handle and --shutdown-timeout (default TORCH_ELASTIC_SHUTDOWN_TIMEOUT)."""
        if self.p.set("signals_to_handle"):
            kept: list[str] = []
            for raw in self.p.text("signals_to_handle").split(","):
                name = raw.strip()
                if not name.startswith("SIG") or not isinstance(getattr(signal, name, None), signal.Signals):
                    self.note(f"--signals-to-handle {name}: not a signal name; skipped (torchrun warns and skips it)")
                elif name in UNHANDLEABLE:
                    self.note(f"--signals-to-handle {name}: not handled: {UNHANDLEABLE[name]}")
                elif name not in kept:
                    kept.append(name)
            if kept:
                self.section("shutdown")["signals_to_handle"] = kept
            else:
                self.note("--signals-to-handle: no usable signal left; the default SIGTERM,SIGINT,SIGHUP,SIGQUIT stays")
        raw = self.p.text("shutdown_timeout") or self.environ.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "")
        if raw:
            try:
                seconds = float(raw)
            except ValueError:
                raise ConvertError(f"--shutdown-timeout {raw}: not a number of seconds", "e.g. 30") from None
            if not 0 <= seconds < float("inf"):
                raise ConvertError(f"--shutdown-timeout {raw}: not a number of seconds", "e.g. 30")
            self.section("shutdown")["grace_period"] = int(seconds) if seconds.is_integer() else seconds

    def std(self, dest: str, flag: str) -> int | dict[int, int]:
        """Read as torch's Std.from_str: 0-3, or a map of local ranks 0-9 (0:3,1:1)."""
        raw = self.p.text(dest, "0")
        if STD_VALUE.match(raw):
            return int(raw)
        if STD_MAP.match(raw):
            return {int(k): int(v) for k, v in (item.split(":") for item in raw.split(","))}
        raise ConvertError(f"{flag} {raw}: not 0-3 or a map such as 0:3,1:1", "e.g. --redirects 3 or 0:3,1:1")

    def console_streams(self) -> str:
        """logs.console_streams from --redirects and --tee: a stream is on the console unless redirected, or teed."""
        redirects, tee = self.std("redirects", "--redirects"), self.std("tee", "--tee")

        def console(rank: int | None) -> str:
            red = redirects if isinstance(redirects, int) else redirects.get(rank, 0) if rank is not None else 0
            teed = tee if isinstance(tee, int) else tee.get(rank, 0) if rank is not None else 0
            return STREAMS[(~red & 3) | teed]

        other = console(None)  # local ranks 10 and up: a map never names them
        ranks = {r: console(r) for r in range(10)}
        if all(v == other for v in ranks.values()):
            return other
        items = [f"{r}:{v}" for r, v in ranks.items() if v != other]
        return ",".join(items + ([f"other:{other}"] if other != "all" else []))

    def logs(self) -> None:
        """--log-dir, --redirects/--tee (console streams per rank), --local-ranks-filter, duplicate filters."""
        out: dict[str, object] = {}
        if self.p.text("log_dir"):
            out["dir"] = self.absolute(self.p.text("log_dir"))
        streams = self.console_streams()
        if streams != "all":
            out["console_streams"] = streams
        if self.p.text("local_ranks_filter"):
            raw = self.p.text("local_ranks_filter")
            try:
                local_ranks = out["console_local_ranks"] = sorted({int(r) for r in raw.split(",")})
            except ValueError:
                raise ConvertError(f"--local-ranks-filter {raw}: torchrun needs a comma-separated list of integers",
                                   "e.g. --local-ranks-filter=0,1,2") from None
            if min(local_ranks) < 0:
                raise ConvertError(f"--local-ranks-filter {raw}: local ranks start at 0", "e.g. 0,1")
        if self.p.set("redirects") or self.p.set("tee"):
            self.note("--redirects/--tee: only the console differs; the runner always writes both streams of every "
                      "rank to RUN_DIR/attempt_K/rank_R/{stdout,stderr}.log")
        template = self.environ.get("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE")
        if template:
            out["prefix"] = self.prefix(template)
        if out:
            self.spec["logs"] = out

    def duplicate_filters(self) -> None:
        """--duplicate-stdout/stderr-filters: the grep that finds the same lines in the runner's log files."""
        for stream in ("stdout", "stderr"):
            raw = self.p.text(f"duplicate_{stream}_filters")
            if raw:
                needles = [n.replace("\0", ",") for n in raw.replace(",,", "\0").split(",")]
                pattern = " ".join(f"-e {shlex.quote(n)}" for n in needles)
                self.note(f"--duplicate-{stream}-filters: no filtered_{stream}.log; the same lines: "
                          f"grep -F {pattern} RUN_DIR/attempt_*/rank_*/{stream}.log")

    def prefix(self, template: str) -> str:
        """TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE ($role_name, $rank, $local_rank) as logs.prefix."""
        marks = {"rank": "\0r\0", "local_rank": "\0l\0"}
        text = Template(template).safe_substitute(role_name=self.p.text("role", "default"), **marks)
        text = text.replace("{", "{{").replace("}", "}}")
        return text.replace(marks["rank"], "{rank}").replace(marks["local_rank"], "{local_rank}")

    def entrypoint(self) -> None:
        """Script / module / command, torch.distributed.launch's --local-rank, PYTHON_EXEC."""
        head, rest = self.p.program[0], self.p.program[1:]
        launch = self.p.launcher == "torch.distributed.launch"
        use_env = not launch or self.p.switch("use_env")
        if launch and self.p.switch("no_python") and not use_env:
            raise ConvertError("torch.distributed.launch --no-python needs --use-env (torch refuses it)",
                               "add --use-env, or run a python script")
        entry: dict[str, object]
        if self.p.switch("run_path"):
            entry = {"script": self.absolute(head)}
            self.note("--run-path: " + next(f.note for f in FLAGS if f.dest == "run_path"))
        elif self.p.switch("no_python"):
            if self.p.switch("module"):
                raise ConvertError("--no-python and --module together (torchrun refuses them)", "keep one of them")
            entry = {"command": [head]}
        elif self.p.switch("module"):
            entry = {"module": head}
        else:
            entry = {"script": head}
        args = ([] if use_env else ["--local-rank=${local_rank}"]) + rest
        if args:
            entry["args"] = args
        if "PYTHON_EXEC" in self.environ and not self.p.switch("run_path") and "command" not in entry:
            entry["python"] = self.environ["PYTHON_EXEC"]
        self.spec["entrypoint"] = entry
        if self.cwd is not None:
            self.spec["cwd"] = self.cwd

    def workers(self) -> None:
        """--role, --virtual-local-rank, and the notes of options with no meaning here."""
        if self.p.text("role", "default") != "default":
            self.spec["role"] = self.p.text("role")
        if self.p.switch("virtual_local_rank"):
            self.spec["virtual_local_rank"] = True
        if self.environ.get("TORCHELASTIC_ENABLE_FILE_TIMER") == "1":
            self.spec["watchdog"] = {"enabled": True}
            self.note("TORCHELASTIC_ENABLE_FILE_TIMER=1: watchdog.enabled (each rank gets its own "
                      "TORCHELASTIC_TIMER_FILE)")
        for flag in FLAGS:
            if flag.spec == "-" and self.p.given.get(flag.dest, self.p.from_env.get(flag.dest)) not in (
                    None, flag.default) and not flag.dest.startswith(("node_rank", "duplicate_")):
                self.note(f"{flag.name}: {flag.note}")

    def build(self) -> dict[str, object]:
        """The spec, in the order a reader expects."""
        low, high = self.nodes()
        self.rendezvous(low, high)
        self.entrypoint()
        self.nproc()
        self.workers()
        self.restart()
        self.shutdown()
        self.logs()
        self.duplicate_filters()
        self.distinct_name()
        order = ("version", "name", "entrypoint", "cwd", "nodes", "nproc_per_node", "role", "virtual_local_rank",
                 "rendezvous", "restart", "shutdown", "logs", "watchdog")
        return {key: escape(self.spec[key]) for key in order if key in self.spec}


def escape(value: object) -> object:
    """Every string with `${` written `$${`, so the spec's interpolation gives back what was typed."""
    if isinstance(value, str):
        return value.replace("${", "$${")
    if isinstance(value, list):
        return [escape(v) for v in value]
    if isinstance(value, dict):
        return {k: escape(v) for k, v in value.items()}
    return value


def convert(argv: Sequence[str], environ: Mapping[str, str] | None = None,
            cwd: str | None = None) -> tuple[dict[str, object], list[str]]:
    """(job spec dict, notes).

    `environ` gives PET_* and the other variables torchrun reads; `cwd` (torchrun's folder) is recorded as the
    spec's cwd and makes --log-dir and --run-path paths absolute.
    """
    conversion = Conversion(read_argv(argv, environ or {}), environ or {}, cwd)
    spec = conversion.build()
    used = sorted(f"{f.env_var}={(environ or {})[f.env_var]}" for f in FLAGS
                  if f.env_var and f.dest in conversion.p.from_env and f.dest not in conversion.p.given)
    notes = [f"from the environment (as torchrun reads it): {', '.join(used)}"] if used else []
    return spec, notes + conversion.notes


def to_yaml(argv: Sequence[str], environ: Mapping[str, str] | None = None, cwd: str | None = None) -> str:
    """The job.yaml text: a comment with the original command and notes, then the spec."""
    spec, notes = convert(argv, environ, cwd)
    head = ["# converted by `runner convert` from:", f"#   {comment_text(shlex.join(argv))}"]
    head += [f"# note: {comment_text(note)}" for note in notes]
    refuse_undecodable(spec)
    body = yaml.dump(spec, Dumper=ExactDumper, sort_keys=False, width=120, allow_unicode=True)
    return "\n".join(head) + "\n" + str(body)


class ExactDumper(yaml.SafeDumper):
    """safe_dump whose strings load back exactly.

    A string with a character that is not printable is double-quoted, where the emitter escapes it (plain or
    single-quoted, PyYAML writes U+0085 raw and the loader folds it into a space).
    """


def represent_text(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    """A string node: double-quoted when it holds a character that is not printable, else PyYAML's choice."""
    style = '"' if any(not c.isprintable() for c in text) else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)


ExactDumper.add_representer(str, represent_text)


def refuse_undecodable(value: object, field: str = "spec") -> None:
    """Refuse (ConvertError) a string holding bytes that were not UTF-8 (lone surrogates in Python).

    A spec is UTF-8 text and cannot hold them.
    """
    if isinstance(value, dict):
        for key, item in value.items():
            refuse_undecodable(item, f"{field}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            refuse_undecodable(item, f"{field}[{i}]")
    elif isinstance(value, str) and any("\ud800" <= c <= "\udfff" for c in value):
        raise ConvertError(f"{field} {value!a}: bytes that are not UTF-8, which a spec (UTF-8 text) cannot hold",
                           "pass it as UTF-8 text, e.g. a file name through an environment variable the script reads")


def comment_text(text: str) -> str:
    """`text` as one line of a YAML comment.

    What is not printable (line breaks, controls, a byte order mark, surrogates: YAML refuses them or reads them as
    the comment's end) is written as its Python escape (backslash n, backslash ufeff).
    """
    return "".join(c if c.isprintable() else c.encode("unicode_escape", "backslashreplace").decode() for c in text)
