"""`runner convert -- torchrun ...`: round trips (the printed YAML loads as a spec with the right fields), every
torchrun option accepted, torchrun's own reading of the command line (argparse, PET_* variables) reproduced, and
bad values refused with a clear message, exit 2, no traceback."""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import RUNNER, runner_cli
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from torch.distributed.elastic.multiprocessing.api import Std, to_map
from torch.distributed.run import get_args_parser

from runner.config import load_spec_text
from runner.config.spec import JobSpec
from runner.config.torchrun import convert, to_yaml
from runner.config.torchrun_flags import FLAGS, ConvertError, read_argv
from runner.workers.launch_plan import worker_argv


def DIGESTED(stem: str) -> re.Pattern[str]:
    """A name taken from the script: its stem and the conversion's digest (docs/torchrun.md)."""
    return re.compile(re.escape(stem) + "-[0-9a-f]{6}")


CASES: list[tuple[str, dict[str, Any]]] = [
    ("torchrun --standalone --nproc-per-node=2 train.py --epochs 3",
     {"name": DIGESTED("train"), "entrypoint.script": "train.py", "entrypoint.args": ("--epochs", "3"),
      "nproc_per_node": 2, "rendezvous.backend": "local", "restart.max_restarts": 0}),
    ("torchrun --nproc_per_node 8 -m pkg.train --lr 0.1",
     {"name": DIGESTED("pkg.train"), "entrypoint.module": "pkg.train", "entrypoint.args": ("--lr", "0.1"), "nproc_per_node": 8}),
    (("torchrun --nnodes=4 --nproc-per-node=8 --rdzv-backend=etcd-v2 --rdzv-endpoint=etcd1:2379 --rdzv-id=exp7 "
      "--max-restarts=3 train.py"),
     {"name": "exp7", "nodes.min": 4, "nodes.max": 4, "rendezvous.backend": "etcd",
      "rendezvous.endpoints": ("etcd1:2379",), "restart.max_restarts": 3, "restart.backoff.initial": 0.0}),
    (("torchrun --nnodes 2:4 --rdzv_backend c10d --rdzv_endpoint head:29400 --rdzv_conf join_timeout=120,"
      "last_call_timeout=5 train.py"),
     {"nodes.min": 2, "nodes.max": 4, "rendezvous.backend": "etcd", "rendezvous.hosted": True,
      "rendezvous.endpoints": ("head:29400",), "rendezvous.join_timeout": 120.0, "rendezvous.last_call": 5.0}),
    ("torchrun --nnodes=1:2 --rdzv-backend=c10d --rdzv-endpoint=localhost:29400 train.py",
     {"nodes.max": 1, "rendezvous.backend": "local"}),
    ("torchrun --nnodes=1:2 --rdzv-backend=c10d train.py", {"nodes.max": 1, "rendezvous.backend": "local"}),
    ("torchrun --nnodes=1:2 --rdzv-backend=c10d --rdzv-endpoint=head:29400 train.py",
     {"nodes.min": 1, "nodes.max": 2, "rendezvous.backend": "etcd"}),
    ("torchrun --no-python --nproc-per-node 2 bash run.sh fast",
     {"entrypoint.command": ("bash",), "entrypoint.args": ("run.sh", "fast"), "entrypoint.script": None}),
    ("torchrun --redirects 3 --log-dir /var/log/job train.py",
     {"logs.console_streams": "none", "logs.dir": "/var/log/job", "logs.tee": True}),
    ("torchrun --redirects 1 train.py", {"logs.console_streams": "stderr"}),
    ("torchrun --redirects 3 --tee 3 train.py", {"logs.console_streams": "all"}),
    ("torchrun -r 0:3,1:1 train.py", {"logs.console_streams": "0:none,1:stderr"}),
    ("torchrun -r3 -t 0:1 train.py", {"logs.console_streams": "0:stdout,other:none"}),
    ("torchrun --local-ranks-filter=0,2 train.py", {"logs.console_local_ranks": (0, 2)}),
    ("torchrun --role trainer --virtual-local-rank train.py", {"role": "trainer", "virtual_local_rank": True}),
    ("torchrun --nproc-per-node cpu train.py", {"nproc_per_node": os.cpu_count() and len(os.sched_getaffinity(0))}),
    ("torchrun --signals-to-handle SIGTERM,SIGUSR1 --shutdown-timeout 5 train.py",
     {"shutdown.signals_to_handle": ("SIGTERM", "SIGUSR1"), "shutdown.grace_period": 5.0}),
    ("torchrun --master-addr 127.0.0.2 --master-port 29611 train.py",
     {"rendezvous.backend": "local", "rendezvous.master_addr": "127.0.0.2", "rendezvous.master_port": 29611}),
    ("torchrun --master-addr 10.1.1.1 train.py", {"rendezvous.master_addr": None, "rendezvous.master_port": None}),
    ("torchrun --standalone --local-addr 127.0.0.3 train.py", {"rendezvous.master_addr": "127.0.0.3"}),
    ("torchrun --nnodes 2 --master-addr 10.0.0.5 --master-port 29500 --node-rank 1 train.py",
     {"rendezvous.backend": "etcd", "rendezvous.hosted": True, "rendezvous.endpoints": ("10.0.0.5:29400",),
      "rendezvous.master_port": 29500}),
    ("python -m torch.distributed.run --nproc-per-node=2 --monitor-interval=1 --node-rank=0 train.py",
     {"nproc_per_node": 2, "name": DIGESTED("train")}),
    ("python3 -m torch.distributed.launch --nproc_per_node 2 train.py --x 1",
     {"entrypoint.args": ("--local-rank=${local_rank}", "--x", "1")}),
    ("python -m torch.distributed.launch --use_env train.py --x", {"entrypoint.args": ("--x",)}),
    ("/opt/bin/torchrun --standalone train.py -- --flag", {"entrypoint.args": ("--flag",)}),  # as argparse
    ("torchrun -- train.py -- --flag", {"entrypoint.args": ("--", "--flag")}),
    ("torchrun train.py a -- b", {"entrypoint.args": ("a", "--", "b")}),
    ("torchrun --standalone --rdzv-id=my/exp train.py", {"name": DIGESTED("train")}),
    ("torchrun --rdzv-id=my/exp --nnodes 2 --rdzv-backend etcd --rdzv-endpoint e:2379 t.py", {"name": "my-exp"}),
    ("torchrun --run-path /abs/t.py a", {"entrypoint.script": "/abs/t.py", "entrypoint.args": ("a",)}),
    ("torchrun --nnode 2 --rdzv-backend etcd --rdzv-endpoint e:2379 t.py", {"nodes.min": 2}),  # argparse prefix
]


def field(spec: JobSpec, dotted: str) -> Any:
    """spec.a.b for 'a.b'."""
    value: Any = spec
    for part in dotted.split("."):
        value = getattr(value, part)
    return value


@pytest.mark.parametrize(("command", "expected"), CASES, ids=[c[0][:60] for c in CASES])
def test_round_trip(command: str, expected: dict[str, Any]) -> None:
    """The YAML printed for a torchrun command line loads with the spec loader and has the expected fields."""
    spec = load_spec_text(to_yaml(shlex.split(command)), base_dir="/w", environ={})
    for dotted, value in expected.items():
        if isinstance(value, re.Pattern):
            assert value.fullmatch(field(spec, dotted)), (dotted, field(spec, dotted))
        else:
            assert field(spec, dotted) == value, dotted


def converted_name(command: str, cwd: str) -> str:
    spec, _ = convert(shlex.split(command), {}, cwd)
    return str(spec["name"])


def test_converted_names_are_distinct_per_conversion_and_stable() -> None:
    """Two conversions of `train.py` (another folder, other arguments or workers) never share a name, so their logs,
    runs and node ledgers never mix; the same command converted again gets the same name."""
    base = "torchrun --standalone --nproc-per-node 2 train.py --lr 0.1"
    name = converted_name(base, "/home/u/a")
    assert re.fullmatch(r"train-[0-9a-f]{6}", name)
    assert converted_name(base, "/home/u/a") == name  # stable
    others = {converted_name(base, "/home/u/b"), converted_name(base.replace("0.1", "0.2"), "/home/u/a"),
              converted_name(base.replace("2 train", "4 train"), "/home/u/a")}
    assert name not in others and len(others) == 3
    assert re.fullmatch(r"pkg\.train-[0-9a-f]{6}", converted_name("torchrun -m pkg.train", "/w"))


def test_nodes_of_one_job_get_one_name_wherever_they_convert() -> None:
    """Several nodes: the node rank and the folder each node converts in leave the name alone (nodes must agree)."""
    command = "torchrun --nnodes 2 --master-addr 10.0.0.5 --master-port 29500 --node-rank {} train.py"
    assert converted_name(command.format(0), "/home/a") == converted_name(command.format(1), "/scratch/b")
    named = "torchrun --nnodes 2 --rdzv-backend etcd --rdzv-endpoint e:2379 --rdzv-id exp7 train.py"
    assert converted_name(named, "/w") == "exp7"  # the user's own id is kept as it is


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="abcdefghijklmnopqrstuvwxyz_.-0123456789", min_size=1, max_size=90))
def test_a_converted_name_always_loads(stem: str) -> None:
    """Whatever the script is called, the digested name fits the spec's name pattern and length."""
    assume(not stem.startswith("-"))
    spec = load_spec_text(to_yaml(["torchrun", f"{stem}.py"], cwd="/w"), base_dir="/w", environ={})
    assert re.search(r"-[0-9a-f]{6}$", spec.name) and len(spec.name) <= 63


def test_notes_explain_what_has_no_equivalent() -> None:
    """Options the runner does without are listed as comments, not silently dropped."""
    text = to_yaml(shlex.split("torchrun --nnodes 2 --rdzv-backend c10d --rdzv-endpoint h:1 --monitor-interval 5 "
                               "--start-method fork --numa-binding node --logs-specs x --event-log-handler y t.py"))
    for option in ("--rdzv-backend c10d", "--monitor-interval:", "--start-method:", "--numa-binding:",
                   "--logs-specs:", "--event-log-handler:"):
        assert f"# note: {option}" in text
    quiet = to_yaml(shlex.split("torchrun --standalone --nproc-per-node 2 t.py"))
    assert "# note" not in quiet  # nothing differs: nothing to say


SAMPLES = {"nnodes": "1", "nproc_per_node": "2", "rdzv_backend": "static", "rdzv_endpoint": "",
           "rdzv_id": "x", "rdzv_conf": "timeout=5", "max_restarts": "1", "monitor_interval": "1",
           "start_method": "spawn", "event_log_handler": "console", "role": "r", "log_dir": "/tmp/l",
           "redirects": "1", "tee": "2", "local_ranks_filter": "0", "duplicate_stdout_filters": "a",
           "duplicate_stderr_filters": "b", "node_rank": "0", "master_addr": "127.0.0.1", "master_port": "29555",
           "local_addr": "127.0.0.1", "logs_specs": "x", "numa_binding": "node", "signals_to_handle": "SIGTERM",
           "shutdown_timeout": "3"}


@pytest.mark.parametrize("flag", FLAGS, ids=[f.name for f in FLAGS])
def test_every_torchrun_option_is_accepted(flag) -> None:
    """No option of torchrun is refused: each converts (with every option string) and the spec loads."""
    for option in flag.options:
        launcher = ["python", "-m", "torch.distributed.launch"] if flag.launch_only else ["torchrun"]
        value = [SAMPLES[flag.dest]] if flag.valued else []
        program = ["--no-python", "/bin/true"] if flag.dest == "use_env" else ["/abs/t.py"]
        argv = [*launcher, option, *value, *program]
        load_spec_text(to_yaml(argv), base_dir="/w", environ={})


def test_pet_variables_are_defaults_as_for_torchrun() -> None:
    """PET_<DEST> gives an option's value when the command line does not; the command line wins; notes say so."""
    env = {"PET_NPROC_PER_NODE": "4", "PET_STANDALONE": "1", "PET_MAX_RESTARTS": "2", "PET_ROLE": "w"}
    spec, notes = convert(["torchrun", "--max-restarts", "5", "t.py"], env)
    assert (spec["nproc_per_node"], spec["restart"]["max_restarts"], spec["role"]) == (4, 5, "w")
    assert spec["rendezvous"]["backend"] == "local"
    assert "PET_NPROC_PER_NODE=4" in notes[0] and "PET_MAX_RESTARTS" not in notes[0]
    assert convert(["torchrun", "t"], {"PET_MODULE": "0"})[0]["entrypoint"] == {"script": "t"}
    assert convert(["torchrun", "t"], {"PET_MODULE": "1"})[0]["entrypoint"] == {"module": "t"}
    assert convert(["torchrun", "-m", "t"], {"PET_MODULE": "0"})[0]["entrypoint"] == {"module": "t"}
    with pytest.raises(ConvertError, match="PET_STANDALONE='yes'"):
        convert(["torchrun", "t.py"], {"PET_STANDALONE": "yes"})


def test_environment_torchrun_reads() -> None:
    """TORCHELASTIC_ENABLE_FILE_TIMER=1 turns the watchdog on; PYTHON_EXEC is the interpreter; the shutdown
    timeout default and the log line prefix template come from their variables."""
    env = {"TORCHELASTIC_ENABLE_FILE_TIMER": "1", "PYTHON_EXEC": "/opt/py", "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "7",
           "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": "[$role_name ${rank}/$local_rank {x}]"}
    spec = load_spec_text(to_yaml(["torchrun", "--role", "w", "t.py"], env), base_dir="/w", environ={})
    assert spec.watchdog.enabled and spec.entrypoint.python == "/opt/py" and spec.shutdown.grace_period == 7.0
    assert spec.logs.prefix == "[w {rank}/{local_rank} {{x}}]"


def test_cwd_is_recorded_and_paths_made_absolute(tmp_path) -> None:
    """The spec runs the same files wherever it is saved: cwd is torchrun's folder, --log-dir is absolute."""
    text = to_yaml(["torchrun", "--log-dir", "logs", "--run-path", "sub/t.py"], {}, cwd="/home/u/proj")
    spec = load_spec_text(text, base_dir=str(tmp_path), environ={})
    assert spec.cwd == "/home/u/proj" and spec.logs.dir == "/home/u/proj/logs"
    assert spec.entrypoint.script == "/home/u/proj/sub/t.py"


def test_launch_local_rank_reaches_each_worker_as_torch_launch_passes_it() -> None:
    """torch.distributed.launch without --use-env: `--local-rank=N` before the script's own arguments."""
    spec = load_spec_text(to_yaml(shlex.split("python -m torch.distributed.launch --nproc-per-node 2 t.py --a")),
                          base_dir="/w", environ={})
    assert worker_argv(spec, 1)[2:] == ("t.py", "--local-rank=1", "--a")


@given(st.lists(st.text(st.characters(blacklist_categories=("Cs", "Cc")), max_size=12), max_size=5))
@settings(max_examples=150, deadline=None)
def test_arguments_come_back_as_typed(args: list[str]) -> None:
    """Any script arguments (with `${`, `$$`, quotes, YAML syntax) load back exactly as typed."""
    spec = load_spec_text(to_yaml(["torchrun", "t.py", *args]), base_dir="/w", environ={})
    assert spec.entrypoint.args == tuple(args)


@given(st.lists(st.text(st.characters(blacklist_characters="\x00"), max_size=12), max_size=5))
@settings(max_examples=300, deadline=None)
def test_any_character_in_the_command_loads_back_or_is_refused(args: list[str]) -> None:
    """Every character a command line can hold (a byte order mark, U+0085, U+2028, controls, in the arguments and
    in the comment that echoes the command): the spec loads back with the arguments exactly as typed, or, only
    for bytes that were not UTF-8 (lone surrogates in Python), runner convert refuses it and names the field."""
    undecodable = any("\ud800" <= c <= "\udfff" for a in args for c in a)
    try:
        text = to_yaml(["torchrun", "t.py", *args])
    except ConvertError as e:
        assert undecodable and "not UTF-8" in str(e) and "entrypoint.args[" in str(e), e
        return
    assert not undecodable
    assert load_spec_text(text, base_dir="/w", environ={}).entrypoint.args == tuple(args)


def test_the_command_echoed_in_the_comment_keeps_to_one_line() -> None:
    """The comment that echoes the command escapes line breaks YAML knows (\\n, \\r, U+0085, U+2028) and a byte
    order mark: the spec's first two lines are the comment, and it loads."""
    text = to_yaml(["torchrun", "t.py", "a\nb", "c\rd", "e\x85f", "g\u2028h", "\ufeff"])
    lines = text.splitlines()
    assert lines[1].startswith("#   torchrun t.py") and lines[2].startswith("version: 1"), text
    assert "\\n" in lines[1] and "\\x85" in lines[1] and "\\u2028" in lines[1] and "\\ufeff" in lines[1]
    assert load_spec_text(text, base_dir="/w", environ={}).entrypoint.args[-1] == "\ufeff"


def test_cli_refuses_an_argument_that_is_not_utf8() -> None:
    """A byte that is not UTF-8 in the command line: exit 2, one line naming the argument, no traceback."""
    done = subprocess.run([*RUNNER, "convert", "--", "torchrun", "t.py", b"caf\xe9"],
                          capture_output=True, text=True, check=False, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "not UTF-8" in done.stderr and "entrypoint.args[0]" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""


STD = st.one_of(st.sampled_from("0123"),
                st.dictionaries(st.integers(0, 9), st.integers(0, 3), min_size=1, max_size=4).map(
                    lambda d: ",".join(f"{k}:{v}" for k, v in d.items())))


@given(STD, STD)
@settings(max_examples=200, deadline=None)
def test_console_streams_match_torchs_logs_specs(redirects: str, tee: str) -> None:
    """For any --redirects/--tee pair, each local rank's console streams are torch's: not redirected, or teed."""
    spec = load_spec_text(to_yaml(["torchrun", "-r", redirects, "-t", tee, "t.py"]), base_dir="/w", environ={})
    reds, tees = to_map(Std.from_str(redirects), 12), to_map(Std.from_str(tee), 12)
    for rank in range(12):
        shown = (Std.ALL & ~reds[rank]) | tees[rank]
        expected = (Std.OUT in shown, Std.ERR in shown)
        assert spec.logs.to_console(rank) == expected, rank


@contextlib.contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    """os.environ with `values` added, restored after (torch's parser reads PET_* when it is built)."""
    saved = dict(os.environ)
    os.environ.update(values)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


TOKENS = st.sampled_from(["--nproc-per-node", "--nproc_per_node", "--nproc", "--nnodes", "--nnode", "--role",
                          "-m", "--standalone", "--max-restarts", "--max_r", "-r", "-r3", "-t=1", "--tee=2",
                          "--rdzv-id", "--rdzv", "--no-python", "--run-path", "--local-ranks-filter", "2", "0:1",
                          "x", "-", "--", "-5", "--bogus", "--role=a=b"])


@given(st.lists(TOKENS, max_size=6),
       st.dictionaries(st.sampled_from(["PET_NPROC_PER_NODE", "PET_ROLE", "PET_MODULE", "PET_TEE"]),
                       st.sampled_from(["0", "1", "3"]), max_size=2))
@settings(max_examples=300, deadline=None)
def test_command_line_read_as_torchrun_reads_it(tokens: list[str], env: dict[str, str]) -> None:
    """Option values, PET_* defaults and the script's arguments are what torch's own parser finds."""
    argv = [*tokens, "train.py", "--lr", "1"]
    script_at = next(i for i, tok in enumerate(argv) if tok == "--" or not tok.startswith("-") or tok in ("-", "-5"))
    # argparse refuses an ambiguous option prefix even among the script's arguments; the runner passes it on
    assume(not any(tok in ("--nproc", "--rdzv") for tok in argv[script_at:]))
    with environment(env), contextlib.redirect_stderr(None):
        try:
            theirs = vars(get_args_parser().parse_args(argv))
        except SystemExit:
            theirs = None
    try:
        ours = read_argv(["torchrun", *argv], env)
    except ConvertError:
        assert theirs is None, argv
        return
    if theirs is None:  # read alike, but a value torch's parser refuses (`--max-restarts 0:1`): convert refuses it
        with pytest.raises(ConvertError):
            convert(["torchrun", *argv], env, cwd="/w")
        return
    assert [theirs["training_script"], *theirs["training_script_args"]] == ours.program
    for dest in ("nproc_per_node", "nnodes", "role", "max_restarts", "rdzv_id", "redirects", "tee",
                 "local_ranks_filter"):
        assert str(theirs[dest]) == ours.text(dest, str(theirs[dest])), dest
    for dest in ("module", "standalone", "no_python", "run_path"):
        assert theirs[dest] == ours.switch(dest), dest


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`python -m runner convert ARGS`."""
    return runner_cli("convert", *args, env={**os.environ, **(env or {})})


def test_cli_prints_yaml_that_loads_and_notes_on_stderr() -> None:
    """The real command prints the spec on stdout (cwd recorded), each note on stderr, and exits 0."""
    done = cli("--", "torchrun", "--nproc-per-node", "2", "--monitor-interval", "3", "train.py")
    assert done.returncode == 0, done.stderr
    spec = load_spec_text(done.stdout, environ={})
    assert spec.nproc_per_node == 2 and spec.cwd == os.getcwd()
    assert "runner convert: note: --monitor-interval:" in done.stderr


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--", "torchrun", "--bogus-flag", "1", "train.py"], "unknown torchrun option --bogus-flag"),
        (["--", "torchrun", "--nproc-per-node", "tpu", "train.py"], "--nproc-per-node tpu"),
        (["--", "torchrun", "--nnodes", "a:b", "train.py"], "--nnodes a:b"),
        (["--", "torchrun", "--nnodes", "3:2", "train.py"], "0 < MIN <= MAX"),
        (["--", "torchrun", "--standalone"], "no training script"),
        (["--", "torchrun", "--max-restarts"], "needs a value"),
        (["--", "torchrun", "--rdzv", "x", "t.py"], "ambiguous torchrun option --rdzv"),
        (["--", "torchrun", "--redirects", "4", "t.py"], "--redirects 4"),
        (["--", "torchrun", "--local-ranks-filter", "a", "t.py"], "comma-separated list of integers"),
        (["--", "torchrun", "--start-method", "thread", "t.py"], "torchrun accepts spawn"),
        (["--", "torchrun", "--no-python", "-m", "t"], "--no-python and --module"),
        (["--", "python", "-m", "torch.distributed.launch", "--no-python", "t"], "needs --use-env"),
        (["--", "torchrun", "--standalone=1", "t.py"], "takes no value"),
        (["--", "torchrun", "--help"], "--help"),
        ([], "no torchrun command line"),
    ],
)
def test_bad_command_lines_exit_2_with_a_message(argv: list[str], message: str) -> None:
    """A clear one-line error and a fix on stderr, exit code 2, never a traceback."""
    done = cli(*argv)
    assert done.returncode == 2, done.stdout
    assert message in done.stderr and "runner: fix:" in done.stderr
    assert "Traceback" not in done.stderr
