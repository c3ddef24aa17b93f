"""Per-user quotas (files kept, batches open) that hold when requests come at once.

Checking a count and then writing lets every request that checked before the others wrote pass
together. There is no lock to take: the API server may run several worker processes, or several
hosts, against one store, and the store (a local folder or S3) offers only writes, deletes and
listings that show what was written (S3 is strongly consistent for both). So each request:

1. *Reserves* before it counts: it writes ``owners/<owner>/reserved/<ns>-<id>``, named by its own
   clock's time and the id of the object it will create (:meth:`.OpenAIStore.reserved`).
2. *Ranks* (:func:`has_room`): it lists its owner's reservations, then their objects. The
   reservations whose object does not exist yet are ranked by (time, id); the first
   ``limit - objects counted`` go on, the others answer 429. Every request ranks the same set the
   same way, so of N requests that reserved before any of them listed, exactly the room's worth pass.
3. *Writes* its object (the file, or the batch record), with the owner marker that counts it.
4. *Verifies* (:func:`stays_within`): it lists again and keeps its object only if fewer than
   ``limit`` other objects count. Step 2 alone has a gap: a request whose clock read earlier but
   whose reservation landed after another request had listed ranks first in its own listing while
   the other never saw it, and both pass. Of any two requests that keep their objects, the one that
   wrote last sees the other's object here, so never more than ``limit`` are kept, whatever the
   clocks say. Should more than ``limit`` show up, the requests ranked outside the room withdraw at
   once and those inside wait up to :data:`SETTLE_SECONDS` for that, so the race does not cost the
   room it was for.
5. *Releases* its reservation, kept or not; one that withdrew or failed deletes its object first.

A reservation left behind by a request that died between 1 and 5 counts for
:data:`RESERVATION_TTL_SECONDS` at most (the next request to list it removes it): it can hold a
slot of its owner for that long, never for good, and as step 4 counts objects only, an expired
reservation never lets more than ``limit`` through.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal

#: How long a reservation counts: longer than any request takes to write its object (an upload is
#: copied from the API server's disk into the store), short enough that a crashed request's
#: reservation frees its owner's slot the same hour.
RESERVATION_TTL_SECONDS = 15 * 60
#: How long a request whose object was written over the limit waits for others to withdraw.
SETTLE_SECONDS = 2.0
_SETTLE_POLL_SECONDS = 0.05
_NAME = re.compile(r"(?P<ns>[0-9]{20})-(?P<id>.+)")

Verdict = Literal["keep", "wait", "withdraw"]


@dataclass(frozen=True, order=True)
class Reservation:
    """A request's claim on one unit of its owner's quota, made before its object exists.

    Ordered by (time, id): a total order that every process reads alike from the marker's name.

    :param reserved_ns: When it was made, in nanoseconds of the reserving host's clock.
    :param object_id: The id of the file or batch it is for.
    """

    reserved_ns: int
    object_id: str

    @property
    def name(self) -> str:
        """The marker's name, ``<ns, 20 digits>-<id>``: names sort as reservations do."""
        return f"{self.reserved_ns:020d}-{self.object_id}"

    @classmethod
    def parse(cls, name: str) -> Reservation | None:
        """The reservation a marker's name stands for; None for a name of another shape."""
        match = _NAME.fullmatch(name)
        return cls(int(match["ns"]), match["id"]) if match else None

    def expired(self, now_ns: int) -> bool:
        return now_ns - self.reserved_ns > RESERVATION_TTL_SECONDS * 1_000_000_000


def first_come(reservations: Iterable[Reservation], room: int) -> frozenset[Reservation]:
    """The ``room`` earliest of ``reservations``: the same ones, whichever request asks."""
    return frozenset(sorted(set(reservations))[: max(room, 0)])


@dataclass(frozen=True)
class Usage:
    """One owner's objects and reservations, as one listing of the store showed them.

    :param counted: The ids of the objects that count against the limit (a batch only while open).
    :param existing: The ids of all the owner's objects, counted or not.
    :param reservations: The owner's live reservations, the objects' that exist included.
    """

    counted: frozenset[str]
    existing: frozenset[str]
    reservations: frozenset[Reservation]

    def pending(self) -> frozenset[Reservation]:
        """The reservations whose object does not exist yet."""
        return frozenset(r for r in self.reservations if r.object_id not in self.existing)

    def in_use(self, mine: Reservation) -> int:
        """What takes room besides ``mine``: the objects counted and the other pending reservations."""
        return len(self.counted - {mine.object_id}) + len(self.pending() - {mine})


def has_room(usage: Usage, mine: Reservation, limit: int) -> bool:
    """Step 2: whether ``mine`` ranks among the pending reservations that fit beside the counted objects."""
    room = limit - len(usage.counted - {mine.object_id})
    return mine in first_come(usage.pending() | {mine}, room)


def verdict(usage: Usage, mine: Reservation, limit: int) -> Verdict:
    """Step 4, once: keep the object written for ``mine`` if fewer than ``limit`` others count;
    else wait for the others still being created to withdraw if ``mine`` ranks within the room among
    them, or withdraw."""
    others = usage.counted - {mine.object_id}
    if len(others) < limit:
        return "keep"
    in_flight = {r for r in usage.reservations if r.object_id in others}
    settled = len(others) - len(in_flight)
    return "wait" if mine in first_come(in_flight | {mine}, limit - settled) else "withdraw"


def stays_within(
    usage: Callable[[], Usage], mine: Reservation, limit: int, settle_seconds: float | None = None
) -> bool:
    """Step 4: whether the object written for ``mine`` may stay (else its request deletes it).

    :param usage: Lists the owner's objects and reservations afresh (each call reads the store).
    :param settle_seconds: How long to wait for other requests to withdraw before giving up;
        default :data:`SETTLE_SECONDS`.
    """
    deadline = time.monotonic() + (SETTLE_SECONDS if settle_seconds is None else settle_seconds)
    while True:
        answer = verdict(usage(), mine, limit)
        if answer != "wait" or time.monotonic() >= deadline:
            return answer == "keep"
        time.sleep(_SETTLE_POLL_SECONDS)
