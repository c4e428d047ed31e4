"""Timeouts of different layers whose order cannot work: the one that must be shorter is not (docs/spec.md).

Each rule is an `Order`: `shorter` must be shorter than `longer` wherever `applies` holds; otherwise the spec is
refused, naming both fields, what goes wrong and the fix. Only orders that cannot work are rules: an order that is
merely unusual (a lease shorter than the connect timeout, the defaults' own) stays valid, and docs/spec.md says why.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from runner.config.spec import JobSpec
from runner.config.yaml_source import Document, Path, dotted

Applies = Callable[[JobSpec, Document], bool]
Found = tuple[tuple[Path, ...], str, str]  # candidate paths (the first written wins), message, fix


def _always(_spec: JobSpec, _doc: Document) -> bool:
    return True


def _elastic_etcd(spec: JobSpec, _doc: Document) -> bool:
    """last_call is read only when a round may close with fewer than nodes.max nodes (etcd, min < max)."""
    return spec.rendezvous.backend == "etcd" and spec.nodes.min < spec.nodes.max


def _for_slurm(_spec: JobSpec, doc: Document) -> bool:
    """The spec is meant for `runner template slurm` (which checks the same order on any spec)."""
    cluster = doc.data.get("cluster") if isinstance(doc.data, dict) else None
    return isinstance(cluster, dict) and "slurm" in cluster


@dataclass(frozen=True)
class Order:
    """`shorter` must be shorter than `longer` (both durations in seconds; a null one is not compared)."""

    shorter: Path
    longer: Path
    why: str  # what goes wrong when it is not
    applies: Applies = _always
    longer_first: bool = False  # located at `longer` when both are written (the field its section is about)

    def values(self, spec: JobSpec) -> tuple[float | None, float | None]:
        """(shorter, longer) as the spec resolved them."""
        return _read(spec, self.shorter), _read(spec, self.longer)

    def broken(self, spec: JobSpec) -> bool:
        """Whether both are set and `shorter` is not shorter than `longer`."""
        short, long = self.values(spec)
        return short is not None and long is not None and short >= long

    def message(self, spec: JobSpec) -> str:
        """Both fields, their values, and what goes wrong."""
        short, long = self.values(spec)
        return (f"{dotted(self.shorter)} ({short:g} s) is not shorter than {dotted(self.longer)} ({long:g} s): "
                f"{self.why}")

    @property
    def fix(self) -> str:
        """The two ways out."""
        return f"lower {dotted(self.shorter)} below {dotted(self.longer)}, or raise {dotted(self.longer)}"


def _read(spec: JobSpec, path: Path) -> float | None:
    value: object = spec
    for part in path:
        value = getattr(value, str(part))
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


LAST_CALL = Order(
    ("rendezvous", "last_call"), ("rendezvous", "join_timeout"),
    "an elastic round closes last_call after nodes.min joined, but a node gives up join_timeout after it began to "
    "join, so a round that does not fill to nodes.max would always end in a rendezvous timeout",
    _elastic_etcd)
HEARTBEAT = Order(
    ("watchdog", "heartbeat_timeout"), ("watchdog", "max_run_time"),
    "the job is stopped at max_run_time before a silent worker could ever be found hung")
PROGRESS = Order(
    ("watchdog", "progress_timeout"), ("watchdog", "max_run_time"),
    "the job is stopped at max_run_time before a stalled step could ever be found")


def _stall_written(_spec: JobSpec, doc: Document) -> bool:
    """stall_timeout is on by default (300 s): a default longer than a short max_run_time only never fires."""
    watchdog = doc.data.get("watchdog") if isinstance(doc.data, dict) else None
    return isinstance(watchdog, dict) and watchdog.get("stall_timeout") is not None


STALL = Order(
    ("watchdog", "stall_timeout"), ("watchdog", "max_run_time"),
    "the job is stopped at max_run_time before a job where no rank makes progress could ever be found",
    _stall_written)
SLURM_GRACE = Order(
    ("shutdown", "grace_period"), ("cluster", "slurm", "signal_lead"),
    "the time limit would kill the workers mid-shutdown",
    _for_slurm, longer_first=True)
SLURM_LEAD = Order(
    ("cluster", "slurm", "signal_lead"), ("cluster", "slurm", "time_limit"),
    "the warning signal would come as the job starts, and stop it at once",
    _for_slurm)

ORDERS: tuple[Order, ...] = (LAST_CALL, HEARTBEAT, PROGRESS, STALL, SLURM_GRACE, SLURM_LEAD)


def timeout_order(spec: JobSpec, doc: Document) -> Iterator[Found]:
    """Every rule of ORDERS that applies to the spec and that it breaks (a DocCheck of runner/config/checks.py)."""
    for order in ORDERS:
        if order.applies(spec, doc) and order.broken(spec):
            where = (order.longer, order.shorter) if order.longer_first else (order.shorter, order.longer)
            yield where, order.message(spec), order.fix
