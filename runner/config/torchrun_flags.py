"""Every torchrun option: how torchrun reads it (option strings, PET_* variable) and where it goes in a job spec.

`FLAGS` is the one table behind `runner convert` and the table in docs/torchrun.md (kept equal by a test, which
also checks that it lists exactly the options of the tested torch's parser). `read_argv` reads a torchrun command
line as torchrun's argparse parser does: long options or their unique prefixes, `--opt=value`, `-rVALUE`, the last
occurrence wins, PET_<DEST> variables as defaults (Kubeflow's PyTorchJob convention), and everything after the
training script belongs to the script (but for a first `--` right after it, which argparse drops). Unlike
argparse, a script argument that happens to be an ambiguous prefix of a torchrun option (`--rdzv`) is passed on,
not refused.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import PurePath

from runner.errors import EXIT_SPEC, RunnerError

LAUNCH_MODULES = ("torch.distributed.run", "torch.distributed.launch")


class ConvertError(RunnerError):
    """A torchrun command line that torchrun itself would refuse, or that is not a torchrun command line."""

    exit_code = EXIT_SPEC


@dataclass(frozen=True)
class Flag:
    """One torchrun option: its option strings, whether it takes a value, and where it lands in the spec."""

    options: tuple[str, ...]  # as torchrun's parser declares them
    spec: str  # the spec field it sets, or "-" (nothing: see `note`)
    note: str = ""  # what differs, or why it has no meaning for the runner
    valued: bool = True  # takes a value (else a switch)
    pet: bool = True  # torchrun reads PET_<DEST> as its default (argparse_util.env / check_env)
    default: str = ""  # torchrun's default (text)
    choices: tuple[str, ...] = ()
    launch_only: bool = False  # `python -m torch.distributed.launch` only

    @property
    def dest(self) -> str:
        """Argparse's dest: the first long option, dashes as underscores ('nproc_per_node')."""
        first_long = next(o for o in self.options if o.startswith("--"))
        return first_long[2:].replace("-", "_")

    @property
    def name(self) -> str:
        """The canonical name used in notes and the table: the first long option."""
        return next(o for o in self.options if o.startswith("--"))

    @property
    def env_var(self) -> str | None:
        """PET_<DEST>, where torchrun reads one."""
        return f"PET_{self.dest.upper()}" if self.pet else None


def _both(name: str) -> tuple[str, ...]:
    """'--nproc-per-node' -> ('--nproc-per-node', '--nproc_per_node')."""
    return (name, "--" + name[2:].replace("-", "_"))


FLAGS: tuple[Flag, ...] = (
    Flag(("--nnodes",), "nodes, rendezvous.backend", default="1:1",
         note="N or MIN:MAX. More than one node: an etcd rendezvous. MIN 1 with no endpoint or a loopback one "
              "(e.g. `--nnodes=1:2 --rdzv-backend=c10d`): a single-node local job, with a note."),
    Flag(_both("--nproc-per-node"), "nproc_per_node", default="1",
         note="A number, or auto (GPUs if any, else CPUs), gpu, xpu, cpu: counted on each node when the job "
              "starts, without importing torch. Other accelerator names: refused, as torchrun refuses them."),
    Flag(_both("--rdzv-backend"), "rendezvous.backend", default="static",
         note="etcd/etcd-v2 -> etcd (v3 API); c10d/static on more than one node -> the self-hosted rendezvous "
              "(rendezvous.hosted: the node with the endpoint's address starts an etcd, as c10d's host does)."),
    Flag(_both("--rdzv-endpoint"), "rendezvous.endpoints",
         note="Kept for etcd backends; for c10d its HOST:PORT (port 29400 if none), for static MASTER_ADDR:29400: "
              "where the hosting node's etcd listens."),
    Flag(_both("--rdzv-id"), "name", default="none",
         note="Becomes the job name (sanitised to the name pattern; without it, the script's name and a digest: "
              "see above); TORCHELASTIC_RUN_ID is the name on etcd jobs and name-<run dir> on local ones."),
    Flag(_both("--rdzv-conf"), "rendezvous.join_timeout, rendezvous.last_call",
         note="join_timeout and last_call_timeout map on etcd jobs; every other key is listed in a note."),
    Flag(("--standalone",), "rendezvous.backend: local", valued=False,
         note="The embedded local rendezvous; --rdzv-backend/--rdzv-endpoint/--rdzv-id are ignored, as torchrun "
              "ignores them."),
    Flag(_both("--max-restarts"), "restart.max_restarts, restart.backoff", default="0",
         note="Restarts are immediate, as torchrun's (backoff set to 0)."),
    Flag(_both("--monitor-interval"), "-", default="0.1",
         note="No meaning: the runner learns of worker exits at once (pidfd), it does not poll."),
    Flag(_both("--start-method"), "-", default="spawn", choices=("spawn", "fork", "forkserver"),
         note="No meaning: every worker is a fresh process (python -u SCRIPT), like spawn."),
    Flag(_both("--event-log-handler"), "-", default="null",
         note="No meaning: the runner records events in its run dir (transitions.jsonl, agent.jsonl, report.json)."),
    Flag(("--role",), "role", default="default", note="ROLE_NAME in the workers' environment."),
    Flag(("-m", "--module"), "entrypoint.module", valued=False),
    Flag(_both("--no-python"), "entrypoint.command", valued=False,
         note="The program and its arguments run as is. With --module: refused, as torchrun refuses it."),
    Flag(_both("--run-path"), "entrypoint.script (absolute path)", valued=False,
         note="Runs as `python SCRIPT` in a fresh interpreter (torchrun: runpy.run_path in its spawned worker): "
              "same sys.argv and __main__; the interpreter is the runner's, not PYTHON_EXEC; stdout not forced "
              "unbuffered in torchrun, unbuffered (-u) here."),
    Flag(_both("--log-dir"), "logs.dir (absolute path)",
         note="Layout differs: DIR/JOB/RUN_ID/attempt_K/rank_R/{stdout,stderr}.log, error.json (torchrun: "
              "DIR/RDZV_ID_xxx/attempt_K/LOCAL_RANK/). The runner always writes both streams of every rank."),
    Flag(("-r", "--redirects"), "logs.console_streams", default="0",
         note="0-3 or a per-local-rank map (0:3,1:1): what torchrun keeps off the console. The log files "
              "always get both streams."),
    Flag(("-t", "--tee"), "logs.console_streams", default="0",
         note="Same format: streams shown on the console although redirected."),
    Flag(_both("--local-ranks-filter"), "logs.console_local_ranks",
         note="Console only; log files keep every rank, as torchrun's do."),
    Flag(_both("--duplicate-stdout-filters"), "-",
         note="Not copied to attempt_K/filtered_stdout.log: every rank's whole stdout is in its stdout.log; "
              "grep them (a note gives the command)."),
    Flag(_both("--duplicate-stderr-filters"), "-",
         note="As --duplicate-stdout-filters, for stderr.log."),
    Flag(_both("--node-rank"), "-", default="0",
         note="Static rendezvous only (as torchrun). One node: must be 0. Several: the rendezvous orders the "
              "nodes; start each agent with `--node ID` (a note says so)."),
    Flag(_both("--master-addr"), "rendezvous.master_addr", default="127.0.0.1",
         note="Static rendezvous only (as torchrun: with c10d it is ignored). One node: MASTER_ADDR. Several: "
              "MASTER_ADDR is group rank 0's advertised address (`runner job.yaml --advertise-addr`)."),
    Flag(_both("--master-port"), "rendezvous.master_port",
         note="Static rendezvous only (as torchrun: giving it keeps a one-node job static). A fixed MASTER_PORT "
              "on every attempt; without it torchrun uses 29500 (static) or a free port (c10d), the runner a "
              "free port each attempt."),
    Flag(_both("--local-addr"), "rendezvous.master_addr",
         note="One node: MASTER_ADDR. Several: start the agent with `runner job.yaml --advertise-addr ADDR`."),
    Flag(_both("--logs-specs"), "-", pet=False,
         note="No meaning: LogsSpecs plugins are torch classes; the agent never imports torch and has one layout."),
    Flag(_both("--numa-binding"), "-", pet=False, choices=("node", "socket", "exclusive", "core-complex"),
         note="Not applied: workers are not bound to the CPUs near their GPU; use entrypoint.command with "
              "numactl to bind them."),
    Flag(_both("--signals-to-handle"), "shutdown.signals_to_handle", default="SIGTERM,SIGINT,SIGHUP,SIGQUIT",
         note="Also TORCHELASTIC_SIGNALS_TO_HANDLE in the workers' environment. SIGUSR2 is the runner's graceful "
              "stop and uncatchable signals cannot be handled: dropped with a note; unknown names too (torchrun "
              "warns and skips them)."),
    Flag(_both("--shutdown-timeout"), "shutdown.grace_period",
         note="Default from TORCH_ELASTIC_SHUTDOWN_TIMEOUT, else 30 s, as torchrun."),
    Flag(_both("--virtual-local-rank"), "virtual_local_rank", valued=False,
         note="LOCAL_RANK=0 and CUDA_VISIBLE_DEVICES = the worker's own GPU, as torchrun."),
    Flag(_both("--use-env"), "entrypoint.args", valued=False, pet=False, launch_only=True,
         note="torch.distributed.launch only: without it, `--local-rank=${local_rank}` is the script's first "
              "argument (substituted per worker)."),
)
BY_OPTION: dict[str, Flag] = {option: flag for flag in FLAGS for option in flag.options}
HELP = ("-h", "--help")


@dataclass
class Parsed:
    """A torchrun command line read as torchrun reads it."""

    launcher: str  # 'torchrun', 'torch.distributed.run' or 'torch.distributed.launch'
    given: dict[str, str | bool] = field(default_factory=dict)  # dest -> value, from the command line
    from_env: dict[str, str | bool] = field(default_factory=dict)  # dest -> value, from PET_* variables
    program: list[str] = field(default_factory=list)  # training script (or program) and its arguments

    def value(self, dest: str) -> str | bool | None:
        """The command line's value, else the PET_* variable's, else None (torchrun's default)."""
        if dest in self.given:
            return self.given[dest]
        return self.from_env.get(dest)

    def text(self, dest: str, default: str = "") -> str:
        """A valued option as text, with torchrun's default."""
        value = self.value(dest)
        return default if value is None or isinstance(value, bool) else value

    def switch(self, dest: str) -> bool:
        """A switch: on the command line, or PET_*=1."""
        return self.value(dest) is True

    def set(self, dest: str) -> bool:
        """Given on the command line or by a PET_* variable."""
        return self.value(dest) is not None


def strip_launcher(argv: Sequence[str]) -> tuple[str, list[str]]:
    """(launcher, argv without a leading `torchrun` / `python -m torch.distributed.run|launch`)."""
    args = list(argv)
    if args and PurePath(args[0]).name == "torchrun":
        return "torchrun", args[1:]
    if len(args) >= 3 and PurePath(args[0]).name.startswith("python") and args[1] == "-m" and args[2] in LAUNCH_MODULES:
        return args[2], args[3:]
    if len(args) >= 2 and args[0] == "-m" and args[1] in LAUNCH_MODULES:
        return args[1], args[2:]
    return "torchrun", args


def known(launcher: str) -> dict[str, Flag]:
    """Option string -> Flag for this launcher."""
    return {o: f for o, f in BY_OPTION.items() if launcher == "torch.distributed.launch" or not f.launch_only}


def match_long(token: str, table: dict[str, Flag]) -> Flag:
    """An exact long option, or a unique prefix of one option string (argparse's abbreviations)."""
    if token in table:
        return table[token]
    found = [option for option in table if option.startswith("--") and option.startswith(token)]
    if len(found) == 1:
        return table[found[0]]
    if found:
        raise ConvertError(f"ambiguous torchrun option {token} (could be {', '.join(sorted(found))})",
                           "write the option in full")
    names = ", ".join(sorted({f.name for f in table.values()}))
    raise ConvertError(f"unknown torchrun option {token}",
                       f"torchrun knows: {names}; put the script's own options after the script name")


def split_option(token: str, table: dict[str, Flag]) -> tuple[Flag, str | None]:
    """(flag, value written in the same token or None): --opt, --opt=v, -r, -rv, -r=v, -m."""
    if token.startswith("--"):
        name, eq, value = token.partition("=")
        return match_long(name, table), (value if eq else None)
    if token in table:
        return table[token], None
    head, rest = token[:2], token[2:]
    if head in table and table[head].valued:
        return table[head], rest.removeprefix("=")
    raise ConvertError(f"unknown torchrun option {token}", "short options are -m, -r VALUE, -t VALUE")


def looks_like_option(token: str) -> bool:
    """Argparse takes a token starting with '-' as an option unless it is a negative number."""
    if not token.startswith("-") or token == "-":  # noqa: S105 - an argv token, not a password
        return False
    try:
        float(token)
    except ValueError:
        return True
    return False


def env_defaults(launcher: str, environ: Mapping[str, str]) -> dict[str, str | bool]:
    """Values torchrun takes from PET_<DEST> variables (a switch: PET_X=1 on, 0 off; anything else refused)."""
    out: dict[str, str | bool] = {}
    for flag in dict.fromkeys(known(launcher).values()):
        var = flag.env_var
        if var is None or var not in environ:
            continue
        raw = environ[var]
        if flag.valued:
            out[flag.dest] = raw
            continue
        try:
            on = bool(int(raw))
        except ValueError:
            raise ConvertError(f"{var}={raw!r}: torchrun reads this switch as an integer",
                               f"set {var}=1 or {var}=0") from None
        if on:
            out[flag.dest] = True
    return out


def option_value(flag: Flag, token: str, value: str | None, following: str | None) -> tuple[str | bool, int]:
    """(the option's value, how many following tokens it took): True for a switch; choices checked."""
    if not flag.valued:
        if value is not None:
            raise ConvertError(f"torchrun option {flag.name} takes no value ({token})", f"write {flag.name}")
        return True, 0
    used = 0
    if value is None:
        if following is None or looks_like_option(following):
            raise ConvertError(f"torchrun option {flag.name} needs a value", f"write {flag.name} VALUE")
        value, used = following, 1
    if flag.choices and value not in flag.choices:
        raise ConvertError(f"{flag.name} {value}: torchrun accepts {', '.join(flag.choices)}",
                           f"write one of: {', '.join(flag.choices)}")
    return value, used


def read_argv(argv: Sequence[str], environ: Mapping[str, str]) -> Parsed:
    """Torchrun's options up to the training script; everything after the script is the script's."""
    launcher, args = strip_launcher(argv)
    table = known(launcher)
    out = Parsed(launcher=launcher, from_env=env_defaults(launcher, environ))
    i = 0
    while i < len(args):
        token = args[i]
        if token == "--":  # noqa: S105 - an argv token, not a password
            out.program = args[i + 1:]
            break
        if not looks_like_option(token):
            out.program = args[i:]
            if out.program[1:2] == ["--"]:  # argparse drops a first `--` that starts the script's arguments
                del out.program[1]
            break
        if token in HELP:
            raise ConvertError("--help is not a command line to convert", "give the command line that runs a job")
        flag, value = split_option(token, table)
        following = args[i + 1] if i + 1 < len(args) else None
        out.given[flag.dest], used = option_value(flag, token, value, following)
        i += 1 + used
    if not out.program:
        raise ConvertError("no training script in the torchrun command line", "end it with: script.py [args...]")
    return out


def markdown_table() -> str:
    """The flag table of docs/torchrun.md."""
    rows = ["| torchrun option | PET variable | spec field | notes |", "|---|---|---|---|"]
    for flag in FLAGS:
        options = ", ".join(f"`{o}`" for o in flag.options)
        pet = f"`{flag.env_var}`" if flag.env_var else "-"
        note = flag.note.replace("|", "\\|")
        rows.append(f"| {options} | {pet} | {flag.spec} | {note} |")
    return "\n".join(rows) + "\n"
