"""Prometheus metrics of a job with replica groups (metrics.enabled): every series carries the group's label.

One endpoint per node, as for any job (metrics.host:metrics.port), with each group this node runs: its state,
attempt, restarts, the step it committed last (what its rank 0 reported), its transitions and failures by class,
and the hosted lighthouse's restarts; each group's ETTR and lost seconds, and the job's ETTR (docs/goodput.md).
prometheus_client is imported only by `start()`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from runner.config.spec import JobSpec
from runner.errors import RunnerError
from runner.observe.ledger import gauge_values, job_ledger
from runner.observe.metrics import STATES, Endpoint


class GroupMetrics:
    """The node's replica-group metrics; start() once, `group(k)` hooks per group, stop() at the end."""

    def __init__(self, spec: JobSpec, node: str, groups: list[int]) -> None:
        """No side effects until start()."""
        self.spec, self.node, self.groups = spec, node, groups
        self.port: int | None = None
        self._endpoint: Endpoint | None = None
        self._m: dict[str, Any] = {}
        self.ledgers: Callable[[], dict[int, dict[str, object]]] | None = None  # each group's ETTR ledger so far

    def start(self, lighthouse_restarts: Callable[[], int]) -> int:
        """Create the series and serve them; the bound port."""
        try:
            import prometheus_client as prom
        except ImportError:
            raise RunnerError("metrics.enabled needs the prometheus-client package",
                              "pip install prometheus-client, or set metrics.enabled: false") from None
        reg = prom.CollectorRegistry()
        by_group = ["group"]
        self._m = {
            "info": prom.Info("runner_job", "Job and node of this agent", registry=reg),
            "state": prom.Enum("runner_group_state", "Current state of each replica group", by_group,
                               states=list(STATES), registry=reg),
            "attempt": prom.Gauge("runner_group_attempt", "Current attempt of each group (0 = first)", by_group,
                                  registry=reg),
            "restarts": prom.Gauge("runner_group_restarts_used", "Restarts charged to each group's budget", by_group,
                                   registry=reg),
            "step": prom.Gauge("runner_group_committed_step", "The step each group's rank 0 reported committed last",
                               by_group, registry=reg),
            "transitions": prom.Counter("runner_group_transitions", "State transitions of each group",
                                        ["group", "src", "dst", "trigger"], registry=reg),
            "failures": prom.Counter("runner_group_failures", "Failed attempts of each group, by failure class",
                                     ["group", "class"], registry=reg),
            "lighthouse": prom.Gauge("runner_lighthouse_restarts", "Times the hosted lighthouse was restarted",
                                     registry=reg),
            "ettr": prom.Gauge("runner_group_ettr", "Each group's productive time / wall time so far", by_group,
                               registry=reg),
            "lost": prom.Gauge("runner_group_lost_seconds", "Seconds each group lost to failures so far", by_group,
                               registry=reg),
            "job_ettr": prom.Gauge("runner_ettr", "The job's productive time (any group stepping) / wall time",
                                   registry=reg),
        }
        self._m["job_ettr"].set_function(lambda: gauge_values(self.job_ledger)[0])
        self._m["info"].info({"job": self.spec.name, "node": self.node})
        self._m["lighthouse"].set_function(lighthouse_restarts)
        for k in self.groups:
            self._m["state"].labels(str(k)).state("INIT")
            self._m["attempt"].labels(str(k)).set(0)
            self._m["restarts"].labels(str(k)).set(0)
            self._m["ettr"].labels(str(k)).set_function(lambda k=k: gauge_values(lambda: self.group_ledger(k))[0])
            self._m["lost"].labels(str(k)).set_function(lambda k=k: gauge_values(lambda: self.group_ledger(k))[1])
        self._endpoint = Endpoint(self.spec, reg)
        self.port = self._endpoint.port
        return self.port

    def group(self, k: int) -> GroupView:
        """The hooks of group `k` (what TransitionLog calls)."""
        return GroupView(self, k)

    def on_transition(self, k: int, src: str, dst: str, trigger: str, attempt: int, restarts: int) -> None:
        """Record one state change of group `k`."""
        if not self._m:
            return
        label = str(k)
        self._m["state"].labels(label).state(dst)
        self._m["attempt"].labels(label).set(attempt)
        self._m["restarts"].labels(label).set(restarts)
        self._m["transitions"].labels(label, src, dst, trigger).inc()

    def on_failure(self, k: int, failure_class: str) -> None:
        """Count a failed attempt of group `k` under its class."""
        if self._m:
            self._m["failures"].labels(str(k), failure_class).inc()

    def group_ledger(self, k: int) -> dict[str, object]:
        """Group `k`'s ledger so far ({} before the group exists)."""
        return self.ledgers().get(k, {}) if self.ledgers is not None else {}

    def job_ledger(self) -> Mapping[str, object]:
        """The job's ledger so far, from the groups' (the union of their productive spans)."""
        return job_ledger(list(self.ledgers().values()) if self.ledgers is not None else [])

    def on_step(self, k: int, step: int) -> None:
        """Group `k`'s rank 0 reported `step` committed."""
        if self._m:
            self._m["step"].labels(str(k)).set(step)

    def stop(self) -> None:
        """Stop serving (idempotent)."""
        if self._endpoint is not None:
            self._endpoint.close()
            self._endpoint = None


class GroupView:
    """One group's hooks into the node's GroupMetrics (the same calls as AgentMetrics')."""

    def __init__(self, metrics: GroupMetrics, k: int) -> None:
        self._metrics, self._k = metrics, k

    def on_transition(self, src: str, dst: str, trigger: str, attempt: int, restarts: int) -> None:
        """Record one state change of the group."""
        self._metrics.on_transition(self._k, src, dst, trigger, attempt, restarts)

    def on_failure(self, failure_class: str) -> None:
        """Count a failed attempt of the group under its class."""
        self._metrics.on_failure(self._k, failure_class)
