"""The soak's tally and verdict: a run passes only if it tried.

Beyond "no invariant broke", a run fails (exit code 1, naming what is missing) when
- an enabled class never fired with a real target: drawn only while it had none, or never drawn at all (the run was
  too short for its classes), in the run's jobs and in the one make-up job a run gets for such classes (soak.py
  `owed`). A class disabled because the machine lacks a capability (root for the tmpfs, a network
  namespace), or because the soak's other options rule it out (late_join and partition with --nodes 2; named in --classes, such a
  class is refused on the command line), is not enabled: the run reports it as skipped, with the reason, and never
  counts it as fired;
- a fired class was not tested: none of the invariants it brings (an expectation the fault set up: a SIGKILLed
  agent's lease revoked, a killed guard replaced, a paused worker's job going on, ...; or a check at its job's end:
  one world per attempt after an etcd fault) held MIN_HELD times. (Per class, not per invariant: a class with
  branches, stop_worker's pause and stop, fires one branch or the other in a short run.) Every check of an invariant ends one of three ways: it held,
  it broke (the run stops there), or it did not apply (it could not be set up, or its check found it moot: etcd
  could not be read, the agent had already ended, ...); all three are counted and printed, the reasons why one did
  not apply included. A fault that had no effect (a signal to an agent that had already exited) is not injected.

MIN_HELD is 1, and docs/faults.md "Chaos soak" says why: an invariant none of whose checks held was not tested at all,
whatever the other counts say; a higher minimum would make the short soaks of tests/soak/test_chaos.py (each class fires 1
to 3 times there) fail by the luck of the draw, not for a fault of the runner. Long soaks print the counts to read.
"""

from __future__ import annotations

from dataclasses import dataclass, field

MIN_HELD = 1
NOT_IN_CLASSES = "not in --classes"
# Why an expectation's check found it moot when it came due, by invariant (printed in the counts).
MOOT_WHY = {
    "lease_revoked": "etcd could not be read (stopped, frozen, wiped or gone with its host)",
    "guard_replaced": "the agent ended first",
    "etcd_restarted": "the hosting agent ended first, or another agent of its machine took the port meanwhile",
    "late_join_admitted": "the late node ended, got a fault, or the job finished first",
    "lighthouse_restarted": "the agent ended or was signalled first",
    "lease_expired": "etcd could not be read (a member stopped, restarted or wiped)",
    "fenced": "the cut node left its round otherwise first (a restart), got another fault, or the job finished",
}


@dataclass
class ClassCount:
    """One fault class: how often it was drawn, fired with a target, found none, and survived."""

    drawn: int = 0
    injected: int = 0
    no_target: int = 0
    survived: int = 0


@dataclass
class InvariantCount:
    """One invariant: its checks that held, broke, did not apply (by reason); the fired classes that brought it."""

    held: int = 0
    broke: int = 0
    moot: dict[str, int] = field(default_factory=dict)
    classes: set[str] = field(default_factory=set)

    @property
    def did_not_apply(self) -> int:
        """Checks that did not apply, whatever the reason."""
        return sum(self.moot.values())


class Tally:
    """Counts per class and per invariant, and the reasons a run that broke no invariant still fails."""

    def __init__(self, classes: tuple[str, ...], min_held: int = MIN_HELD) -> None:
        self.classes = classes
        self.min_held = min_held
        self.disabled: dict[str, str] = {}  # class -> why it is not enabled
        self.per_class = {c: ClassCount() for c in classes}
        self.per_invariant: dict[str, InvariantCount] = {}

    # ------------------------------------------------------------------ classes

    def disable(self, cls: str, why: str) -> None:
        """`cls` is not enabled in this run (the first reason given stands)."""
        self.disabled.setdefault(cls, why)

    def enabled(self) -> list[str]:
        """The classes this run must fire."""
        return [c for c in self.classes if c not in self.disabled]

    def skipped(self) -> dict[str, str]:
        """Classes disabled for a missing capability (not by --classes), with the reason."""
        return {c: why for c, why in self.disabled.items() if why != NOT_IN_CLASSES and c in self.per_class}

    def drawn(self, cls: str) -> None:
        """A fault of `cls` was drawn (it may yet find no target)."""
        self.per_class[cls].drawn += 1

    def injected(self, cls: str) -> None:
        """A fault of `cls` fired with a real target."""
        self.per_class[cls].injected += 1

    def no_target(self, cls: str) -> None:
        """A draw of `cls` found no target through its retries."""
        self.per_class[cls].no_target += 1

    def survived(self, cls: str) -> None:
        """A fault of `cls` whose job ended with every invariant held."""
        self.per_class[cls].survived += 1

    # ------------------------------------------------------------------ invariants

    def invariant(self, name: str, cls: str = "") -> InvariantCount:
        """The counts of `name`; `cls`, a fired class whose fault brought this check."""
        count = self.per_invariant.setdefault(name, InvariantCount())
        if cls:
            count.classes.add(cls)
        return count

    def held(self, name: str, cls: str = "") -> None:
        """A check of `name` held."""
        self.invariant(name, cls).held += 1

    def broke(self, name: str, cls: str = "") -> None:
        """A check of `name` broke."""
        self.invariant(name, cls).broke += 1

    def moot(self, name: str, why: str, cls: str = "") -> None:
        """A check of `name` did not apply, for `why`."""
        count = self.invariant(name, cls)
        count.moot[why] = count.moot.get(why, 0) + 1

    # ------------------------------------------------------------------ verdict

    def failures(self) -> list[str]:
        """Why a run with no broken invariant still fails: a class that never fired, an invariant tested too little."""
        out = []
        enabled = self.enabled()
        if not any(c.injected for c in self.per_class.values()):  # every class asked for skipped, or none fired
            skipped = ", ".join(f"{cls} ({why})" for cls, why in sorted(self.skipped().items())) or "none"
            out.append(f"no fault fired: the run tested nothing (skipped: {skipped})")
        for cls in enabled:
            c = self.per_class[cls]
            if c.injected:
                continue
            if c.drawn and c.drawn == c.no_target:
                out.append(f"class {cls} never fired: drawn {c.drawn} time(s), no target each time")
            elif c.drawn:
                out.append(f"class {cls} never fired: drawn {c.drawn} time(s), no target {c.no_target} time(s), and "
                           "still looking for one when its job's fault window closed")
            else:
                out.append(f"class {cls} never fired: never drawn (the run was too short for its {len(enabled)} "
                           "enabled classes: lengthen --duration or --job-window, or narrow --classes)")
        # a fired class is tested when one invariant it brings held MIN_HELD times (a class with branches, as
        # stop_worker's pause or stop, need not see each branch's own invariant hold in a short run)
        tested = {cls for c in self.per_invariant.values() if c.held >= self.min_held for cls in c.classes}
        for name, count in sorted(self.per_invariant.items()):
            untested = sorted(count.classes - tested)
            if untested and count.held < self.min_held:
                why = "; ".join(f"{n} {reason}" for reason, n in sorted(count.moot.items())) or "none"
                out.append(f"invariant {name} held {count.held} time(s), fewer than the minimum {self.min_held}, "
                           f"though {', '.join(untested)} fired and brought it, and nothing else it brings held "
                           f"(did not apply: {why})")
        return out

    def class_rows(self) -> list[list[str]]:
        """Per class: drawn, injected, survived, no target, note (a skipped class says why)."""
        rows = []
        for cls in self.classes:
            why = self.disabled.get(cls)
            if why:
                note = "not enabled (--classes)" if why == NOT_IN_CLASSES else f"skipped: {why}"
                rows.append([cls, "-", "-", "-", "-", note])
                continue
            c = self.per_class[cls]
            note = "" if c.injected else "NEVER FIRED"
            rows.append([cls, str(c.drawn), str(c.injected), str(c.survived), str(c.no_target), note])
        return rows

    def invariant_rows(self) -> list[list[str]]:
        """Per invariant: held, broke, did not apply (with the reasons), the minimum, the classes that brought it."""
        rows = []
        for name, c in sorted(self.per_invariant.items()):
            why = "; ".join(f"{n} {reason}" for reason, n in sorted(c.moot.items()))
            rows.append([name, str(c.held), str(c.broke), str(c.did_not_apply) + (f" ({why})" if why else ""),
                         str(self.min_held) if c.classes else "-", ", ".join(sorted(c.classes))])
        return rows


def skipped_from_output(text: str) -> dict[str, str]:
    """The classes a soak's output reports skipped for a missing capability (`class X skipped: why` lines), with
    the reason: what a test that asked for such a class skips with."""
    found = {}
    for line in text.splitlines():
        head, sep, why = line.partition(" skipped: ")
        if sep and head.startswith("class ") and " " not in head.removeprefix("class "):
            found[head.removeprefix("class ")] = why.strip()
    return found
