"""LaunchPlan building: argv per entrypoint kind, the torchrun environment contract, precedence, log paths."""

from __future__ import annotations

import sys

import pytest

from runner.config.spec import Auth, Entrypoint, JobSpec, Rendezvous, Restart
from runner.rendezvous.base import RendezvousResult
from runner.workers.launch_plan import agent_secret_vars, build_plan, helper_env, without_agent_secrets, worker_argv


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
    args = {"attempt": 2, "restart_count": 2, "run_id": "j", "run_dir": "/r", "base_env": {"PATH": "/bin"}}
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
        "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29511", "TORCHELASTIC_RUN_ID": "j",
        "TORCHELASTIC_RESTART_COUNT": "2", "TORCHELASTIC_MAX_RESTARTS": "7", "TORCHELASTIC_USE_AGENT_STORE": "False",
        "TORCHELASTIC_ERROR_FILE": "/r/attempt_2/rank_3/error.json", "OMP_NUM_THREADS": "1",
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
    assert agent_secret_vars(spec(rendezvous=auth)) == {"ETCD_PW"}
    assert agent_secret_vars(spec()) == frozenset()
    assert without_agent_secrets(spec(rendezvous=auth), base) == {"PATH": "/bin", "HF_TOKEN": "hf_x"}


def test_without_auth_the_environment_is_inherited_as_torchrun_does():
    """No password_env: the base environment, secrets included, is the worker's (they may need HF_TOKEN...)."""
    env = dict(plan(base_env={"PATH": "/bin", "ETCD_PW": "x", "HF_TOKEN": "y"}).workers[0].env)
    assert env["ETCD_PW"] == "x" and env["HF_TOKEN"] == "y"


def test_helper_env_keeps_only_locale_and_path():
    """A helper (shepherd, py-spy) gets PATH and the locale, nothing else: no credential of any kind."""
    environ = {"PATH": "/bin", "LANG": "C.UTF-8", "ETCD_PASSWORD": "p", "HF_TOKEN": "t", "HOME": "/h", "LC_ALL": "C"}
    assert helper_env(environ) == {"PATH": "/bin", "LANG": "C.UTF-8", "LC_ALL": "C"}
