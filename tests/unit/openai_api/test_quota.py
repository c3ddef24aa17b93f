"""The quota's ranking and verification on their own (pure); the API under concurrent requests is in
tests/security/test_openai_quotas.py."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_provider_raybatch.openai_api.quota import (
    RESERVATION_TTL_SECONDS,
    Reservation,
    Usage,
    first_come,
    has_room,
    stays_within,
    verdict,
)
from airflow_provider_raybatch.openai_api.store import FILE_ID

reservations = st.builds(
    Reservation,
    # Few distinct times, so that ties (two hosts reading the same nanosecond) are common.
    reserved_ns=st.one_of(st.integers(0, 3), st.integers(0, 10**20 - 2)),  # 20 digits: until the year 5138
    object_id=st.from_regex(FILE_ID, fullmatch=True),
)


def _ids(count: int) -> frozenset[str]:
    """Objects already kept (ids of no generated reservation)."""
    return frozenset(f"kept-{index}" for index in range(count))


@given(pending=st.sets(reservations, max_size=15), counted=st.integers(0, 6), limit=st.integers(0, 20))
def test_exactly_the_rooms_worth_of_the_earliest_pass_whoever_asks(
    pending: set[Reservation], counted: int, limit: int
) -> None:
    usage = Usage(counted=_ids(counted), existing=_ids(counted), reservations=frozenset(pending))
    passing = {mine for mine in pending if has_room(usage, mine, limit)}
    assert len(passing) == min(max(limit - counted, 0), len(pending))
    assert (
        passing
        == first_come(pending, limit - counted)
        == first_come(reversed(list(pending)), limit - counted)
    )
    assert all(kept < refused for kept in passing for refused in pending - passing)


@given(pending=st.sets(reservations, min_size=1, max_size=15), limit=st.integers(1, 20))
def test_reservations_of_existing_objects_are_not_ranked_twice(pending: set[Reservation], limit: int) -> None:
    """An object whose request has not released its reservation yet counts once, as an object."""
    written = sorted(pending)[0]
    counted = frozenset({written.object_id})
    usage = Usage(counted=counted, existing=counted, reservations=frozenset(pending))
    passing = {mine for mine in pending - {written} if has_room(usage, mine, limit)}
    assert len(passing) == min(limit - 1, len(pending) - 1)


@given(reservation=reservations)
def test_a_reservations_name_reads_back_and_sorts_as_it_ranks(reservation: Reservation) -> None:
    assert Reservation.parse(reservation.name) == reservation
    later = Reservation(reservation.reserved_ns + 1, reservation.object_id)
    assert (reservation.name < later.name) == (reservation < later)


@pytest.mark.parametrize("name", ["reserved", "file-" + "0" * 32, "123-file-x", "", "x" * 20 + "-file-1"])
def test_other_names_are_no_reservations(name: str) -> None:
    assert Reservation.parse(name) is None


def test_a_reservation_expires_after_its_ttl() -> None:
    reservation = Reservation(0, "file-" + "0" * 32)
    assert not reservation.expired(RESERVATION_TTL_SECONDS * 10**9)
    assert reservation.expired(RESERVATION_TTL_SECONDS * 10**9 + 1)


EARLY, LATE = Reservation(1, "file-" + "a" * 32), Reservation(2, "file-" + "b" * 32)


def _written(*mine: Reservation, settled: int = 0) -> Usage:
    """Objects written for ``mine`` (their reservations still held) beside ``settled`` others."""
    counted = frozenset({r.object_id for r in mine}) | _ids(settled)
    return Usage(counted=counted, existing=counted, reservations=frozenset(mine))


def test_of_two_requests_that_both_passed_the_ranking_the_later_withdraws_and_the_earlier_waits() -> None:
    """The ranking's gap: EARLY's reservation landed after LATE had listed, so both passed it."""
    assert verdict(_written(EARLY, LATE), LATE, limit=1) == "withdraw"
    assert verdict(_written(EARLY, LATE), EARLY, limit=1) == "wait"
    assert verdict(_written(EARLY), EARLY, limit=1) == "keep"  # once LATE has gone


def test_objects_already_kept_leave_no_room_to_wait_for() -> None:
    assert verdict(_written(EARLY, settled=1), EARLY, limit=1) == "withdraw"
    assert verdict(_written(EARLY, LATE, settled=1), EARLY, limit=2) == "wait"
    assert verdict(_written(EARLY, LATE, settled=1), LATE, limit=2) == "withdraw"


def test_a_request_waits_for_the_others_to_withdraw_and_gives_up_at_its_deadline() -> None:
    listings = iter([_written(EARLY, LATE), _written(EARLY, LATE), _written(EARLY)])
    assert stays_within(lambda: next(listings), EARLY, limit=1, settle_seconds=10)
    assert not stays_within(lambda: _written(EARLY, LATE), EARLY, limit=1, settle_seconds=0.1)
