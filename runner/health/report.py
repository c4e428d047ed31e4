"""What one try of the health checks found: the failed checks with their reasons, and how long it took."""

from __future__ import annotations

from dataclasses import dataclass, field

MAX_REASON_CHARS = 500  # one reason, as shown on the console, in status and in report.json


def bounded(text: str, limit: int = MAX_REASON_CHARS) -> str:
    """`text` on one line, at most `limit` characters (its end kept: the last lines say most)."""
    flat = " | ".join(line.strip() for line in text.splitlines() if line.strip())
    return flat if len(flat) <= limit else "..." + flat[-(limit - 3):]


@dataclass(frozen=True)
class HealthFailure:
    """One failed check: which (`disk`, `memory`, `gpus`, `command`), of what (a path, a command line), and why."""

    check: str
    reason: str
    subject: str = ""

    def __str__(self) -> str:
        return f"{self.check} {self.subject}: {self.reason}" if self.subject else f"{self.check}: {self.reason}"

    def to_dict(self) -> dict[str, str]:
        """For status and report.json."""
        return {"check": self.check, "subject": self.subject, "reason": self.reason}


@dataclass(frozen=True)
class HealthReport:
    """One try of every configured check: what was checked, what failed (empty: healthy), how long it took."""

    checked: tuple[str, ...] = ()
    failures: tuple[HealthFailure, ...] = ()
    duration_s: float = 0.0
    at: float = 0.0  # when the try began (epoch seconds)
    extra: dict[str, object] = field(default_factory=dict)  # what the caller adds: round, attempt, try number

    @property
    def healthy(self) -> bool:
        """No check failed."""
        return not self.failures

    def reasons(self) -> list[str]:
        """One line per failed check."""
        return [str(f) for f in self.failures]

    def to_dict(self) -> dict[str, object]:
        """For status.json, etcd and report.json."""
        return {
            "healthy": self.healthy,
            "checked": list(self.checked),
            "failures": [f.to_dict() for f in self.failures],
            "duration_s": round(self.duration_s, 3),
            "at": round(self.at, 3),
            **self.extra,
        }
