"""LaunchPlan building: argv per entrypoint kind, the torchrun environment contract, precedence, log paths."""

from __future__ import annotations

import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st
from torch.distributed.elastic.utils.api import macros

from runner.config.spec import Auth, Entrypoint, JobSpec, Logs, Rendezvous, Restart, Shutdown
from runner.rendezvous.base import RendezvousResult
from runner.system.environ import helper_env
from runner.workers.launch_plan import (
    VirtualLocalRankError,
    agent_secret_vars,
    build_plan,
    substitute_local_rank,
    without_agent_secrets,
    worker_argv,
)


def result(group_rank: int = 1, nodes: int = 2, nproc: int = 2) -> RendezvousResult:
    """A completed round where this node has `group_rank`."""
    return RendezvousResult(round=3, node="n1", group_rank=group_rank, group_world_size=nodes, nproc_per_node=nproc,
                            master_addr="10.0.0.1", master_port=29511)


def spec(**kw) -> JobSpec:
    """A spec with a script entrypoint unless told otherwise."""
    kw.setdefault("entrypoint", Entrypoint(script="train.py", args=("--lr", "0.1")))
    return JobSpec(name="j", cwd="/w", nproc_per_node=2, **kw)


def plan(s: JobSpec | None = None, **kw):
    """build_plan with sensible defaults."""
    args = {"attempt": 2, "run_dir": "/r", "base_env": {"PATH": "/bin"}}
    args.update(kw)
    return build_plan(s or spec(), result(), **args)


@pytest.mark.parametrize(
    ("ep", "argv"),
    [
        (Entrypoint(script="t.py", args=("a",)), (sys.executable, "-u", "t.py", "a")),
        (Entrypoint(module="pkg.train", args=("a",)), (sys.executable, "-u", "-m", "pkg.train", "a")),
        (Entrypoint(command=("bash", "run.sh"), args=("a",)), ("bash", "run.sh", "a")),
        (Entrypoint(script="t.py", python="/opt/py"), ("/opt/py", "-u", "t.py")),
    ],
)
def test_argv_for_each_entrypoint_kind(ep, argv):
    """script/module get the interpreter and -u; a command runs as given; args are appended."""
    assert worker_argv(spec(entrypoint=ep)) == argv


def test_contract_on_the_second_node():
    """Global ranks, sizes, master and restart fields are what torchrun would set on group rank 1."""
    p = plan(spec(restart=Restart(max_restarts=7)))
    assert [w.rank for w in p.workers] == [2, 3]
    env = dict(p.workers[1].env)
    expected = {
        "RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1",
        "GROUP_WORLD_SIZE": "2", "ROLE_NAME": "default", "ROLE_RANK": "3", "ROLE_WORLD_SIZE": "4",
        "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29511", "TORCHELASTIC_RUN_ID": "j-r",
        "TORCHELASTIC_RESTART_COUNT": "2", "TORCHELASTIC_MAX_RESTARTS": "7", "TORCHELASTIC_USE_AGENT_STORE": "False",
        "TORCHELASTIC_ERROR_FILE": "/r/attempt_2/rank_3/error.json", "OMP_NUM_THREADS": "1",
        "TORCHELASTIC_SIGNALS_TO_HANDLE": "SIGTERM,SIGINT,SIGHUP,SIGQUIT",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "PATH": "/bin",
    }
    assert {k: env[k] for k in expected} == expected


def test_user_env_overrides_defaults_but_not_the_contract():
    """spec.env beats OMP_NUM_THREADS's default and the base env; RANK etc. always come from the runner."""
    p = plan(spec(env=(("OMP_NUM_THREADS", "8"), ("RANK", "99"), ("PATH", "/x"))))
    env = dict(p.workers[0].env)
    assert env["OMP_NUM_THREADS"] == "8" and env["PATH"] == "/x" and env["RANK"] == "2"


def test_inherited_omp_threads_is_kept():
    """An OMP_NUM_THREADS already in the environment is not replaced by the default 1."""
    env = dict(plan(base_env={"OMP_NUM_THREADS": "4"}).workers[0].env)
    assert env["OMP_NUM_THREADS"] == "4"


def test_log_paths_and_extra_env():
    """Each worker logs under attempt_<k>/rank_<r>; agent extras (timer file) reach every worker."""
    p = plan(extra_env={"TORCHELASTIC_TIMER_FILE": "/t/fifo"})
    w = p.workers[0]
    assert w.log_dir == "/r/attempt_2/rank_2"
    assert w.stdout_path.endswith("rank_2/stdout.log") and w.stderr_path.endswith("rank_2/stderr.log")
    assert all(dict(x.env)["TORCHELASTIC_TIMER_FILE"] == "/t/fifo" for x in p.workers)
    assert dict(w.contract)["TORCHELASTIC_TIMER_FILE"] == "/t/fifo"


def test_the_etcd_password_variable_reaches_no_worker():
    """rendezvous.auth.password_env is the agent's secret: removed from every worker, inherited or named in env."""
    auth = Rendezvous(backend="etcd", auth=Auth(user="root", password_env="ETCD_PW"))
    base = {"PATH": "/bin", "ETCD_PW": "hunter22", "HF_TOKEN": "hf_x"}
    for s in (spec(rendezvous=auth), spec(rendezvous=auth, env=(("ETCD_PW", "hunter22"), ("A", "b")))):
        p = plan(s, base_env=base)
        for w in p.workers:
            env = dict(w.env)
            assert "ETCD_PW" not in env and "hunter22" not in env.values()
            assert env["HF_TOKEN"] == "hf_x" and env["PATH"] == "/bin"  # the workers' own secrets still reach them
    assert agent_secret_vars(spec(rendezvous=auth)) == {"ETCD_PW", "RUNNER_SECRET_FILE"}
    assert agent_secret_vars(spec()) == {"RUNNER_SECRET_FILE"}  # a hosted rendezvous's secret (docs/security.md)
    assert without_agent_secrets(spec(rendezvous=auth), base) == {"PATH": "/bin", "HF_TOKEN": "hf_x"}


def test_without_auth_the_environment_is_inherited_as_torchrun_does():
    """No password_env: the base environment, secrets included, is the worker's (they may need HF_TOKEN...)."""
    env = dict(plan(base_env={"PATH": "/bin", "ETCD_PW": "x", "HF_TOKEN": "y"}).workers[0].env)
    assert env["ETCD_PW"] == "x" and env["HF_TOKEN"] == "y"


def test_helper_env_keeps_only_locale_and_path():
    """A helper (shepherd, py-spy) gets PATH and the locale, nothing else: no credential of any kind."""
    environ = {"PATH": "/bin", "LANG": "C.UTF-8", "ETCD_PASSWORD": "p", "HF_TOKEN": "t", "HOME": "/h", "LC_ALL": "C"}
    assert helper_env(environ) == {"PATH": "/bin", "LANG": "C.UTF-8", "LC_ALL": "C"}


def test_omp_threads_only_when_workers_share_the_node():
    """As torchrun: OMP_NUM_THREADS=1 with more than one worker per node, nothing with one worker."""
    one = build_plan(spec(), result(nproc=1), attempt=0, run_dir="/r", base_env={})
    assert "OMP_NUM_THREADS" not in dict(one.workers[0].env)
    assert dict(plan().workers[0].env)["OMP_NUM_THREADS"] == "1"


def test_role_signals_and_fixed_master_port():
    """spec.role is ROLE_NAME; shutdown.signals_to_handle is TORCHELASTIC_SIGNALS_TO_HANDLE; master_port is fixed."""
    s = spec(role="trainer", shutdown=Shutdown(signals_to_handle=("SIGTERM", "SIGUSR1")),
             rendezvous=Rendezvous(master_port=29600))
    env = dict(plan(s).workers[0].env)
    assert env["ROLE_NAME"] == "trainer" and env["TORCHELASTIC_SIGNALS_TO_HANDLE"] == "SIGTERM,SIGUSR1"
    assert env["MASTER_PORT"] == "29600"


def test_run_id_unique_per_local_run_and_shared_by_etcd_nodes():
    """Local: <job>-<run dir name>, so two runs never share it; etcd: the job name on every node and every run."""
    ids = {dict(plan(run_dir=d).workers[0].env)["TORCHELASTIC_RUN_ID"] for d in ("/x/20240101-aa", "/x/20240101-bb")}
    assert ids == {"j-20240101-aa", "j-20240101-bb"}
    etcd = spec(rendezvous=Rendezvous(backend="etcd"))
    ids = {dict(plan(etcd, run_dir=d).workers[0].env)["TORCHELASTIC_RUN_ID"] for d in ("/x/a", "/y/b")}
    assert ids == {"j"}


def test_local_rank_in_arguments_is_substituted_as_torchrun_does():
    """${local_rank} and $local_rank become the local rank, $$ a single $, other ${...} stay; not the program."""
    ep = Entrypoint(script="t_${local_rank}.py", args=("--out=o${local_rank}", "$local_rank", "$${HOME}", "${x}", "$"))
    argv = [w.argv for w in plan(spec(entrypoint=ep)).workers]
    assert argv[1] == (sys.executable, "-u", "t_1.py", "--out=o1", "1", "${HOME}", "${x}", "$")
    cmd = Entrypoint(command=("/bin/${local_rank}", "a${local_rank}"), args=("b$local_rank",))
    assert plan(spec(entrypoint=cmd)).workers[0].argv == ("/bin/${local_rank}", "a0", "b0")


@given(st.text(alphabet=st.sampled_from("$${}_local_rankx0 a"), max_size=30), st.integers(0, 64))
def test_substitution_is_torchs_own(text, local_rank):
    """The same result as torch.distributed.elastic.utils.api.macros.substitute for any argument."""
    assert substitute_local_rank([text], local_rank) == tuple(macros.substitute([text], str(local_rank)))


def test_python_exec_is_the_interpreter_unless_the_spec_names_one():
    """torchrun's PYTHON_EXEC picks the interpreter; entrypoint.python wins over it."""
    assert plan(base_env={"PYTHON_EXEC": "/opt/py"}).workers[0].argv[0] == "/opt/py"
    named = spec(entrypoint=Entrypoint(script="t.py", python="/mine"))
    assert plan(named, base_env={"PYTHON_EXEC": "/opt/py"}).workers[0].argv[0] == "/mine"


def test_virtual_local_rank():
    """LOCAL_RANK=0 everywhere; each worker's CUDA_VISIBLE_DEVICES is its own entry; too few entries is an error."""
    s = spec(virtual_local_rank=True)
    p = plan(s, base_env={"CUDA_VISIBLE_DEVICES": "4, 6"})
    assert [(dict(w.env)["LOCAL_RANK"], dict(w.env)["CUDA_VISIBLE_DEVICES"]) for w in p.workers] == [("0", "4"),
                                                                                                   ("0", "6")]
    assert [dict(w.env)["CUDA_VISIBLE_DEVICES"] for w in plan(s).workers] == ["0", "1"]
    with pytest.raises(VirtualLocalRankError, match="local rank 1 has no GPU"):
        plan(s, base_env={"CUDA_VISIBLE_DEVICES": "3"})


@pytest.mark.parametrize(
    ("logs", "expected"),
    [
        (Logs(), [(True, True), (True, True)]),
        (Logs(tee=False), [(False, False), (False, False)]),
        (Logs(console_streams="stderr"), [(False, True), (False, True)]),
        (Logs(console_streams="0:stdout,other:none"), [(True, False), (False, False)]),
        (Logs(console_streams="1:none"), [(True, True), (False, False)]),
        (Logs(console_local_ranks=(1,)), [(False, False), (True, True)]),
    ],
)
def test_console_flags_per_rank(logs, expected):
    """stdout_to_console / stderr_to_console follow logs.tee, console_streams and console_local_ranks."""
    assert [(w.stdout_to_console, w.stderr_to_console) for w in plan(spec(logs=logs)).workers] == expected
