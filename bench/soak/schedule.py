"""Which class the next fault of a job is drawn from: a seeded deck, so every enabled class comes up early.

The soak used to draw each fault's class independently, so a short run could leave a class undrawn, and a class
drawn while it had no target was dropped. A deck deals every enabled class once per round, in an order shuffled by
the job's own generator (random.Random("SEED:JOB")): a job with as many faults as enabled classes draws each of them.
A class that found no target goes back under the deck and comes up again later in the same round.
"""

from __future__ import annotations

import random
from typing import TypeVar

T = TypeVar("T")


class Deck:
    """The classes of one job's faults, dealt in seeded rounds."""

    def __init__(self, rng: random.Random, classes: tuple[str, ...] | list[str]) -> None:
        self.rng = rng
        self.classes = list(classes)
        self.cards: list[str] = []

    def draw(self) -> str | None:
        """The next class (None when no class is enabled); a new shuffled round once the last one is dealt."""
        if not self.classes:
            return None
        if not self.cards:
            self.cards = list(self.classes)
            self.rng.shuffle(self.cards)
        return self.cards.pop(0)

    def put_back(self, cls: str) -> None:
        """A class that found no target: drawn again after the rest of this round."""
        self.cards.append(cls)


def pick(items: list[T], u: float) -> T | None:
    """items[u * len] (u from the seeded draw); None when there is none."""
    return items[min(int(u * len(items)), len(items) - 1)] if items else None


def one_of(items: list[T], u: float) -> T:
    """pick() from a list known not to be empty."""
    return items[min(int(u * len(items)), len(items) - 1)]
