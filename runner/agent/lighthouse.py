"""The hosted TorchFT lighthouse: where replica groups agree on a quorum every step (docs/replica_groups.md).

The agent runs `torchft_lighthouse` (runner[ft]) on 127.0.0.1 (several nodes: on every interface, advertised at the
node's address) in its own session, with no secret of the agent's in
its environment, under a guard of its own (a Shepherd, as the hosted etcd): it dies with the agent, however the
agent ends. If it exits while the job runs, it is started again on the same port, up to MAX_RESTARTS times; the
groups' managers retry their quorum meanwhile (a quorum that times out fails the step, and that group restarts).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

from runner.errors import RunnerError
from runner.rendezvous.ports import free_port
from runner.system import procs
from runner.system.environ import helper_env
from runner.system.output_pump import OutputPump
from runner.system.served import describe_exit, exited, last_line, listens, log_tail
from runner.system.shepherd import Shepherd
from runner.system.supervised import RestartPolicy, StartFailed, supervise

if TYPE_CHECKING:
    from collections.abc import Callable

    from structlog.typing import FilteringBoundLogger

    from runner.config.spec import Lighthouse

HOST = "127.0.0.1"
ALL_INTERFACES = "0.0.0.0"  # noqa: S104 - several nodes: the groups on other nodes reach it
MAX_RESTARTS = 20  # in all, over the job
MAX_FAILED_STARTS = 5  # in a row
RETRY_S = 0.5
LIGHTHOUSE_POLICY = RestartPolicy("lighthouse_restarting", MAX_RESTARTS, MAX_FAILED_STARTS, retry_s=RETRY_S)
START_TIMEOUT_S = 15.0
POLL_S = 0.02
STOP_GRACE_S = 2.0
LOG_TAIL_BYTES = 2000


class LighthouseError(RunnerError):
    """The hosted lighthouse could not start (exit 3: infrastructure)."""


class HostedLighthouse:
    """One `torchft_lighthouse` process for the job's replica groups, restarted if it dies."""

    def __init__(self, program: str, spec: Lighthouse, min_replicas: int, folder: Path,
                 log: FilteringBoundLogger, advertise: str | None = None) -> None:
        """`advertise`: the host other nodes reach it at (several nodes: it then listens on every interface)."""
        bind = ALL_INTERFACES if advertise else HOST
        self.port = spec.port or free_port(bind)
        self.address = f"http://{advertise or HOST}:{self.port}"
        self.log_path = folder / "lighthouse.log"
        self.restarts = 0
        self._argv = [
            program, "--bind", f"{bind}:{self.port}", "--min_replicas", str(min_replicas),
            "--join_timeout_ms", str(round(spec.join_timeout * 1000)),
            "--heartbeat_timeout_ms", str(round(spec.heartbeat_timeout * 1000)),
            "--quorum_tick_ms", str(max(1, round(spec.quorum_tick * 1000))),
        ]
        self._log = log
        self._guard = Shepherd(agent=False, cgroup=False, log=log)
        self._proc: subprocess.Popen[bytes] | None = None
        self._pump: OutputPump | None = None
        self.on_gone: Callable[[str], None] | None = None  # told once it stopped restarting it, with why
        self._fd: int | None = None
        self._stopping = asyncio.Event()
        self._supervisor: asyncio.Task[None] | None = None

    @property
    def pid(self) -> int | None:
        """The running lighthouse's pid."""
        return self._proc.pid if self._proc is not None else None

    async def start(self) -> None:
        """Start it and wait until it listens; LighthouseError if it cannot."""
        try:
            await self._spawn()
        except BaseException:
            await self.stop(grace=0.0)
            raise
        self._log.info("lighthouse_hosted", pid=self.pid, address=self.address, log=str(self.log_path))
        self._supervisor = asyncio.get_running_loop().create_task(self._supervise(), name="lighthouse")

    def _popen(self) -> subprocess.Popen[bytes]:
        """Start it (its own session, no secret of the agent's) under the guard.

        Its output goes through a pipe the agent copies into lighthouse.log (runner/system/output_pump.py): writing
        the file itself, it would die of a full logs disk (torchft_lighthouse exits 120 when a write fails).
        """
        if self._pump is not None:
            self._pump.close()
        pump = self._pump = OutputPump(self.log_path, "lighthouse_log_write_failed")
        try:
            proc = subprocess.Popen(self._argv, stdin=subprocess.DEVNULL, stdout=pump.write_fd,
                                    stderr=subprocess.STDOUT, env=helper_env(os.environ), start_new_session=True)
        except OSError as exc:
            pump.close()
            raise LighthouseError(f"cannot start the hosted lighthouse ({self._argv[0]}): {exc}",
                                  fix="pip install 'runner[ft]'; or set replica_groups.lighthouse.address") from exc
        pump.start()
        self._fd = os.pidfd_open(proc.pid)
        self._guard.watch(proc.pid)  # from now on it dies with this agent, however the agent ends
        return proc

    async def _spawn(self) -> None:
        """Start it and wait until it listens on its port."""
        self._proc = self._popen()
        fd = self._fd
        assert fd is not None
        deadline = asyncio.get_running_loop().time() + START_TIMEOUT_S
        while not listens(self._proc.pid, self.port):
            if procs.exited(fd):
                code = self._reap()
                raise LighthouseError(f"the hosted lighthouse exited with {describe_exit(code)} while starting: "
                                      f"{last_line(self.log_tail())}", fix=f"see {self.log_path}")
            if asyncio.get_running_loop().time() > deadline:
                raise LighthouseError(f"the hosted lighthouse did not listen on {self.address} within "
                                      f"{START_TIMEOUT_S:g} s", fix=f"see {self.log_path}")
            await asyncio.sleep(POLL_S)

    async def _supervise(self) -> None:
        """While the job runs: start it again when it dies, on the same port (its quorum state starts afresh).

        Under LIGHTHOUSE_POLICY (runner/system/supervised.py): a start that fails is tried again (after RETRY_S x the
        failures in a row); MAX_RESTARTS restarts in all, or MAX_FAILED_STARTS failed starts in a row, and it is
        gone: `on_gone` says why (the groups cannot step).
        """
        why = await supervise(self, LIGHTHOUSE_POLICY, self._log)
        if why is not None:
            self._gone(f"the hosted lighthouse is gone {why}")

    def stopping(self) -> bool:
        """stop() was called: no restart."""
        return self._stopping.is_set()

    async def exited(self) -> None:
        """Wait until the running lighthouse exits (not reaped)."""
        await self._exited()

    def reaped(self) -> str:
        """Reap the lighthouse that exited; how it ended."""
        return describe_exit(self._reap())

    async def respawn(self) -> None:
        """Start it again and wait until it listens; StartFailed when it cannot."""
        try:
            await self._spawn()
        except LighthouseError as exc:
            raise StartFailed(exc.message) from exc

    def discard(self) -> None:
        """SIGKILL (through its pidfd) and reap the process of a failed start, if it still runs."""
        self._discard()

    def _discard(self) -> None:
        """SIGKILL (through its pidfd) and reap the process of a failed start, if it still runs."""
        if self._fd is not None and self._proc is not None:
            procs.send(self._fd, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                self._reap()

    def _gone(self, reason: str) -> None:
        self._log.error("lighthouse_gone", reason=reason, log=str(self.log_path))
        if self.on_gone is not None:
            self.on_gone(reason)

    async def _exited(self) -> None:
        assert self._fd is not None
        await exited(self._fd)

    def _reap(self) -> int:
        """Once it exited: the guard forgets it, it is reaped; its exit status."""
        assert self._proc is not None
        self._guard.forget(self._proc.pid)
        code = self._proc.wait()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        return code

    async def stop(self, grace: float = STOP_GRACE_S) -> None:
        """SIGTERM, at most `grace` s, then SIGKILL (through its pidfd); reap it and close the guard."""
        self._stopping.set()
        if self._supervisor is not None and self._supervisor is not asyncio.current_task():
            self._supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._supervisor
        if self._fd is not None and self._proc is not None:
            procs.send(self._fd, signal.SIGTERM)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._exited(), grace)
            if not procs.exited(self._fd):
                procs.send(self._fd, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                self._reap()
        if self._pump is not None:
            self._pump.close()
        self._guard.close()

    def log_tail(self) -> str:
        """The end of its log (for error messages)."""
        return log_tail(self.log_path, LOG_TAIL_BYTES)
