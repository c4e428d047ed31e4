"""Secrets end to end with real runner processes: nothing in clear on disk, no etcd password in a worker or helper.

One job runs (module fixture): its spec env holds secret-looking values, its args a token (and, over etcd, the
agent's environment the etcd password that `rendezvous.auth.password_env` names). A rank fails once (so failure.json is
written) and the job restarts. While the workers of the second attempt wait, the tests read their environment and
the shepherd's from /proc; after the job, every file it left (run dir, runs index, validation cache) is searched
for every secret, and the modes of the run dir and the agent's files are checked.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from conftest import RUNNER, alive, wait_for

from runner.testing.etcd_server import etcd_server

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

ETCD_PASSWORD = "etcd-pw-Q7x9Z1w"
# Every value that must never be written in clear: env values (by name and by shape) and an argument.
SPEC_SECRETS = {
    "HF_TOKEN": "hf-tok-A1b2C3d4",
    "DB_PASS": "dbpass-E5f6g7",
    "DATABASE_URL": "postgres://app:dburl-G7h8i9@db:5432/app",
    "CACHE_ADDR": "redis://:cache-I9j0k1@cache:6379/0",
    "MSSQL_CONN": "Server=db;User ID=sa;Password=conn-K1l2m3;",
}
HIDDEN = ("hf-tok-A1b2C3d4", "dbpass-E5f6g7", "dburl-G7h8i9", "cache-I9j0k1", "conn-K1l2m3", "arg-M3n4o5")
ALL_SECRETS = (*HIDDEN, ETCD_PASSWORD)

WORKER = """\
import json, os, sys, time
out, attempt, rank = sys.argv[1], int(os.environ["TORCHELASTIC_RESTART_COUNT"]), int(os.environ["RANK"])
path = os.path.join(out, f"rank{rank}.attempt{attempt}.json")
with open(path + ".tmp", "w") as f:
    json.dump({"pid": os.getpid()}, f)
os.replace(path + ".tmp", path)
if rank == 1 and attempt == 0:
    sys.exit(3)  # one failure, so that failure.json is written
deadline = time.monotonic() + 120
while not os.path.exists(os.path.join(out, "release")) and time.monotonic() < deadline:
    time.sleep(0.05)
print(f"rank {rank} done", flush=True)
"""


def spec_text(rendezvous: str) -> str:
    """The job: 2 workers, secrets in env and args, the password variable named by rendezvous.auth."""
    env = "\n".join(f"  {k}: {json.dumps(v)}" for k, v in SPEC_SECRETS.items())
    return textwrap.dedent("""\
        version: 1
        name: secrets
        entrypoint:
          script: worker.py
          args: ["${OUT}", "--api-token", "arg-M3n4o5"]
        nproc_per_node: 2
        logs: {dir: "${LOGS}"}
        restart: {max_restarts: 1, backoff: {initial: 0.1s}}
        shutdown: {grace_period: 5s}
        """) + f'env:\n{env}\n  OMP_NUM_THREADS: "2"\n' + rendezvous


@dataclass
class Observed:
    """What one run left behind and what was seen while it ran."""

    home: Path
    returncode: int = -1
    console: str = ""
    worker_environs: list[dict[str, str]] = field(default_factory=list)
    shepherd_environs: list[dict[str, str]] = field(default_factory=list)
    cli_output: str = ""

    @property
    def run_dir(self) -> Path:
        """The run's folder."""
        dirs = [d for d in (self.home / "logs").glob("*/*") if d.is_dir() and not d.is_symlink()]
        assert len(dirs) == 1, dirs
        return dirs[0]


def environ_of(pid: int) -> dict[str, str]:
    """The environment a running process was started with."""
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)


def children(pid: int) -> list[int]:
    """Live direct children of `pid`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(entry.name))
    return found


def cmdline(pid: int) -> str:
    """The process's command line, NULs as spaces ('' once it is gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def run_job(home: Path, rendezvous: str, extra_env: dict[str, str]) -> Observed:
    """Run the job under `home`, observe its workers and shepherd while they wait, release them, reap everything."""
    home.mkdir(parents=True, exist_ok=True)
    out = home / "out"
    out.mkdir()
    (home / "worker.py").write_text(WORKER)
    (home / "job.yaml").write_text(spec_text(rendezvous))
    env = {**os.environ, "OUT": str(out), "LOGS": str(home / "logs"), "PYTHONUNBUFFERED": "1",
           "XDG_STATE_HOME": str(home / "state"), "XDG_CACHE_HOME": str(home / "cache"), **extra_env}
    seen = Observed(home)
    proc = subprocess.Popen([*RUNNER, str(home / "job.yaml")], cwd=home, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        files = [out / f"rank{r}.attempt1.json" for r in (0, 1)]
        wait_for(lambda: all(f.exists() for f in files) or proc.poll() is not None, 90, "attempt 1's workers")
        assert proc.poll() is None, proc.communicate()[0]
        for f in files:
            seen.worker_environs.append(environ_of(json.loads(f.read_text())["pid"]))
        for pid in children(proc.pid):
            if "shepherd_main" in cmdline(pid):
                seen.shepherd_environs.append(environ_of(pid))
        (out / "release").touch()
        seen.console, _ = proc.communicate(timeout=90)
        seen.returncode = proc.returncode
        for args in (("status", "--json"), ("plan", "--json"), ("plan",), ("validate",)):
            done = subprocess.run([*RUNNER, *args, str(home / "job.yaml")], cwd=home, env=env,
                                  capture_output=True, text=True, timeout=60, check=False)
            seen.cli_output += done.stdout + done.stderr
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        for info in out.glob("rank*.json"):
            pid = json.loads(info.read_text())["pid"]
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
    return seen


@pytest.fixture(scope="module")
def local_run(tmp_path_factory: pytest.TempPathFactory) -> Observed:
    """The job on the local backend (no etcd, so no etcd password: rendezvous.auth would do nothing there and is
    refused; etcd_run below keeps the password from the workers)."""
    return run_job(tmp_path_factory.mktemp("secrets-local"), "rendezvous:\n  backend: local\n", {})


def every_file(*roots: Path) -> Iterator[Path]:
    """Every regular file under `roots`."""
    for root in roots:
        for path in root.rglob("*"):
            if path.is_file() and not path.is_symlink():
                yield path


def test_the_job_runs_and_restarts(local_run: Observed) -> None:
    """The run itself: one failure, one restart, success (so every writer of the run dir was exercised)."""
    assert local_run.returncode == 0, local_run.console
    report = json.loads((local_run.run_dir / "report.json").read_text())
    assert report["outcome"] == "succeeded" and report["restarts"] == 1
    assert (local_run.run_dir / "attempt_0" / "failure.json").is_file()


def test_no_secret_in_any_file_or_output(local_run: Observed) -> None:
    """No secret in clear in the run dir, the runs index or the cache, nor on the console, status, plan, validate."""
    searched = 0
    for path in every_file(local_run.home / "logs", local_run.home / "state", local_run.home / "cache"):
        data = path.read_bytes()
        searched += 1
        for secret in ALL_SECRETS:
            assert secret.encode() not in data, f"{secret} in {path}"
    assert searched >= 8  # spec, status, report, transitions, agent log, failure, rank logs...
    for secret in ALL_SECRETS:
        assert secret not in local_run.console, local_run.console
        assert secret not in local_run.cli_output, local_run.cli_output


def test_spec_json_masks_only_the_secrets(local_run: Observed) -> None:
    """spec.json: secret names masked whole, URL and connection-string passwords masked in place, the rest kept."""
    spec = json.loads((local_run.run_dir / "spec.json").read_text())
    assert spec["env"] == {
        "HF_TOKEN": "***", "DB_PASS": "***", "DATABASE_URL": "***", "CACHE_ADDR": "redis://:***@cache:6379/0",
        "MSSQL_CONN": "Server=db;User ID=sa;Password=***;", "OMP_NUM_THREADS": "2",
    }
    assert spec["entrypoint"]["args"][1:] == ["--api-token", "***"]
    assert spec["rendezvous"]["backend"] == "local"


def test_workers_get_the_real_values(local_run: Observed) -> None:
    """Each worker's /proc/<pid>/environ: every spec env value as given (the etcd password: etcd_run below)."""
    assert len(local_run.worker_environs) == 2
    for environ in local_run.worker_environs:
        assert {k: environ[k] for k in SPEC_SECRETS} == SPEC_SECRETS


def test_the_shepherd_holds_no_secret(local_run: Observed) -> None:
    """The guard process (a child of the agent running shepherd_main) has no password and no token."""
    assert local_run.shepherd_environs, "no shepherd found among the agent's children"
    for environ in local_run.shepherd_environs:
        for secret in ALL_SECRETS:
            assert all(secret not in v for v in environ.values()), sorted(environ)


def test_run_dir_is_private(local_run: Observed) -> None:
    """The run dir is 0700 and every file the agent wrote there is 0600."""
    run_dir = local_run.run_dir
    assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700
    agent_files = [*run_dir.glob("*.json"), *run_dir.glob("*.jsonl"), *run_dir.glob("attempt_*/failure.json")]
    names = {p.relative_to(run_dir).as_posix() for p in agent_files}
    assert {"spec.json", "status.json", "report.json", "transitions.jsonl", "agent.jsonl",
            "attempt_0/failure.json"} <= names
    for path in agent_files:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    for path in every_file(run_dir):  # rank logs too: whatever their mode, only the owner can reach them
        assert run_dir in path.parents


@pytest.fixture(scope="module")
def etcd_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Observed, str]:
    """The same job over a TLS + auth etcd (password from ETCD_PASSWORD); with everything etcd held afterwards."""
    tmp = tmp_path_factory.mktemp("secrets-etcd")
    with etcd_server(tmp / "etcd", tls=True) as server:
        server.enable_auth(ETCD_PASSWORD)
        certs = server.certs
        assert certs is not None
        rendezvous = textwrap.dedent(f"""\
            rendezvous:
              backend: etcd
              endpoints: ["{server.endpoint}"]
              master_addr: 127.0.0.1
              last_call: 0s
              connect_timeout: 20s
              tls: {{ca: {certs.ca}, cert: {certs.client_cert}, key: {certs.client_key}}}
              auth: {{user: root, password_env: ETCD_PASSWORD}}
            """)
        seen = run_job(tmp / "job", rendezvous, {"ETCD_PASSWORD": ETCD_PASSWORD})
        stored = server.etcdctl("get", "--prefix", "", user=f"root:{ETCD_PASSWORD}").stdout
    return seen, stored


def test_etcd_with_tls_and_auth_keeps_the_password_from_workers(etcd_run: tuple[Observed, str]) -> None:
    """Over a TLS + auth etcd: the job succeeds; the password reaches no worker, no file, no output."""
    seen, _ = etcd_run
    assert seen.returncode == 0, seen.console
    assert len(seen.worker_environs) == 2
    for environ in seen.worker_environs:
        assert "ETCD_PASSWORD" not in environ and {k: environ[k] for k in SPEC_SECRETS} == SPEC_SECRETS
        assert all(ETCD_PASSWORD not in v for v in environ.values())
    assert seen.shepherd_environs, "no shepherd found among the agent's children"
    for environ in seen.shepherd_environs:  # the guard holds no password either
        assert all(ETCD_PASSWORD not in v for v in environ.values()), sorted(environ)
    for path in every_file(seen.home / "logs", seen.home / "state", seen.home / "cache"):
        for secret in ALL_SECRETS:
            assert secret.encode() not in path.read_bytes(), f"{secret} in {path}"
    for secret in ALL_SECRETS:
        assert secret not in seen.console + seen.cli_output


def test_etcd_holds_no_env_secret_in_clear(etcd_run: tuple[Observed, str]) -> None:
    """etcd's copy of the spec holds the env secrets (by name and by shape) as digests only."""
    _, stored = etcd_run
    assert "/secrets/" in stored  # the job's keys were read
    for secret in (*HIDDEN[:-1], ETCD_PASSWORD):
        assert secret not in stored, f"{secret} stored in etcd"


def test_etcd_holds_no_argument_secret_in_clear(etcd_run: tuple[Observed, str]) -> None:
    """A token given as `--api-token X` in entrypoint.args is not stored in etcd in clear either."""
    _, stored = etcd_run
    assert "arg-M3n4o5" not in stored
