"""Optional Prometheus endpoint on the agent (metrics.enabled): state, attempt, restarts, rendezvous, exits.

prometheus_client is imported only by `start()`, so an agent without metrics never loads it. Each AgentMetrics
has its own registry (no process-global state), served by prometheus_client's threaded HTTP server.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import structlog

from runner.config.spec import JobSpec
from runner.errors import RunnerError
from runner.observe.ledger import gauge_values
from runner.observe.recovery import PHASES

STATES = ("INIT", "RENDEZVOUS", "RUNNING", "FAILED", "RESTARTING", "SHUTDOWN")
# trigger of a transition -> cause counted in runner_worker_exits_total (one per attempt's deciding exit)
EXIT_CAUSES = {"workers_succeeded": "succeeded", "worker_failed": "failed", "timer_expired": "watchdog",
               "deadline_reached": "deadline"}
RECOVER_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300)  # runner_time_to_recover_seconds


class Endpoint:
    """The HTTP endpoint serving one registry on metrics.host:metrics.port (prometheus_client's server thread)."""

    def __init__(self, spec: JobSpec, registry: Any) -> None:
        """Bind and serve now; a port that cannot be bound is a RunnerError that says what to change."""
        import prometheus_client as prom

        try:
            self._server, self._thread = prom.start_http_server(spec.metrics.port, spec.metrics.host,
                                                                registry=registry)
        except OSError as err:
            raise RunnerError(f"cannot serve metrics on {spec.metrics.host}:{spec.metrics.port}: {err.strerror}",
                              "choose another metrics.port (0 = any free port)") from None
        self.port = int(self._server.server_address[1])
        structlog.get_logger("runner").info("metrics_listening", host=spec.metrics.host, port=self.port)

    def close(self) -> None:
        """Stop serving and wait (bounded) for the server's thread."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


class AgentMetrics:
    """The agent's metrics; call start() once, the on_* hooks from the agent, stop() at the end."""

    def __init__(self, spec: JobSpec, node: str = "") -> None:
        """No side effects: nothing is imported, bound or served until start()."""
        self.spec = spec
        self.node = node
        self.port: int | None = None  # the bound port, after start()
        self._endpoint: Endpoint | None = None
        self._m: dict[str, Any] = {}
        self._last = time.monotonic()
        self._rdzv_since: float | None = None
        self.ledger: Callable[[], dict[str, object]] | None = None  # the ETTR ledger so far (runner_ettr, lost seconds)

    def start(self) -> int:
        """Create the metrics and serve them on metrics.host:metrics.port; returns the bound port."""
        try:
            import prometheus_client as prom
        except ImportError:
            raise RunnerError("metrics.enabled needs the prometheus-client package",
                              "pip install prometheus-client, or set metrics.enabled: false") from None
        reg = prom.CollectorRegistry()
        self._m = {
            "info": prom.Info("runner_job", "Job and node of this agent", registry=reg),
            "state": prom.Enum("runner_state", "Current state of the agent", states=list(STATES), registry=reg),
            "attempt": prom.Gauge("runner_attempt", "Current attempt (0 = first)", registry=reg),
            "restarts": prom.Gauge("runner_restarts_used", "Restarts charged to the budget", registry=reg),
            "budget": prom.Gauge("runner_max_restarts", "restart.max_restarts", registry=reg),
            "rdzv": prom.Histogram("runner_rendezvous_duration_seconds", "Time to complete a rendezvous round",
                                   buckets=(0.1, 0.5, 1, 2, 5, 10, 30, 60, 300, 600), registry=reg),
            "exits": prom.Counter("runner_worker_exits", "Attempts ended by worker exits, by cause", ["cause"],
                                  registry=reg),
            "transitions": prom.Counter("runner_transitions", "State transitions", ["src", "dst", "trigger"],
                                        registry=reg),
            "failures": prom.Counter("runner_failures", "Failed attempts, by failure class (docs/failure_classes.md)",
                                     ["class"], registry=reg),
            "since": prom.Gauge("runner_seconds_since_last_transition", "Seconds since the last transition",
                                registry=reg),
            "recover": prom.Histogram("runner_time_to_recover_seconds",
                                      "Failure -> every worker of the next attempt running / ready", ["phase"],
                                      buckets=RECOVER_BUCKETS, registry=reg),
            "ettr": prom.Gauge("runner_ettr", "Productive time / wall time so far (docs/goodput.md)", registry=reg),
            "lost": prom.Gauge("runner_lost_seconds", "Seconds lost to failures so far (docs/goodput.md)",
                               registry=reg),
        }
        self._m["ettr"].set_function(lambda: gauge_values(self.ledger)[0])
        self._m["lost"].set_function(lambda: gauge_values(self.ledger)[1])
        self._m["info"].info({"job": self.spec.name, "node": self.node})
        self._m["state"].state("INIT")
        self._m["budget"].set(self.spec.restart.max_restarts)
        for phase in PHASES:  # both series from the start, empty until the first recovery
            self._m["recover"].labels(phase)
        self._m["since"].set_function(lambda: time.monotonic() - self._last)
        self._endpoint = Endpoint(self.spec, reg)
        self.port = self._endpoint.port
        return self.port

    def on_transition(self, src: str, dst: str, trigger: str, attempt: int, restarts: int) -> None:
        """Record one state change; leaving RENDEZVOUS by rendezvous_complete observes the round's duration."""
        if not self._m:
            return
        now = time.monotonic()
        if src == "RENDEZVOUS" and trigger == "rendezvous_complete" and self._rdzv_since is not None:
            self.on_rendezvous(now - self._rdzv_since)
        self._rdzv_since = now if dst == "RENDEZVOUS" else None
        self._last = now
        self._m["state"].state(dst)
        self._m["attempt"].set(attempt)
        self._m["restarts"].set(restarts)
        self._m["transitions"].labels(src, dst, trigger).inc()
        if trigger in EXIT_CAUSES:
            self.on_worker_exit(EXIT_CAUSES[trigger])

    def on_failure(self, failure_class: str) -> None:
        """Count a failed attempt under its class (runner_failures_total{class=...})."""
        if self._m:
            self._m["failures"].labels(failure_class).inc()

    def on_worker_exit(self, cause: str) -> None:
        """Count a worker exit that decided an attempt: succeeded, failed, watchdog, deadline, ..."""
        if self._m:
            self._m["exits"].labels(cause).inc()

    def on_rendezvous(self, duration_s: float) -> None:
        """Observe how long a rendezvous round took."""
        if self._m:
            self._m["rdzv"].observe(duration_s)

    def on_recovery(self, phase: str, seconds: float) -> None:
        """Observe one recovery's failure -> all workers `phase` ("running" or "ready") time."""
        if self._m:
            self._m["recover"].labels(phase).observe(seconds)

    def stop(self) -> None:
        """Stop serving (idempotent)."""
        if self._endpoint is not None:
            self._endpoint.close()
            self._endpoint = None
