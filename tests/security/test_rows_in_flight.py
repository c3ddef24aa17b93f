"""A shared replica holds each row sent to it in its memory until the engine answers it, for every
job on the pool (issue 45): a stage actor's rows in flight were bounded by count alone, and 2,048 rows
near the input bound (32 MiB each) were 64 GiB in a replica other DAGs' rows share. A stage actor now
admits its rows, in order, within a count and a byte bound (scaled down here)."""

from __future__ import annotations

import asyncio

import pytest

from airflow_provider_raybatch.pipeline.generate.rows_in_flight import RowsInFlight, row_bytes


async def _send(bound: RowsInFlight, sizes: list[int]) -> tuple[int, int, list[int]]:
    """Send rows of ``sizes`` at once, each held a moment once admitted: the most bytes and rows in
    flight together, and the order they went in."""
    inside = {"bytes": 0, "rows": 0}
    most = {"bytes": 0, "rows": 0}
    order: list[int] = []

    async def one(index: int, size: int) -> None:
        async with bound.admitted(size):
            order.append(index)
            inside["bytes"] += size
            inside["rows"] += 1
            most["bytes"] = max(most["bytes"], inside["bytes"])
            most["rows"] = max(most["rows"], inside["rows"])
            await asyncio.sleep(0.01)
            inside["bytes"] -= size
            inside["rows"] -= 1

    await asyncio.gather(*(one(index, size) for index, size in enumerate(sizes)))
    return most["bytes"], most["rows"], order


def test_rows_in_flight_stay_within_their_bytes_and_go_in_in_order() -> None:
    most_bytes, most_rows, order = asyncio.run(_send(RowsInFlight(100, 1_000), [400] * 10))

    assert most_bytes <= 1_000 and most_rows == 2
    assert order == list(range(10))


def test_rows_in_flight_stay_within_their_count() -> None:
    _, most_rows, _ = asyncio.run(_send(RowsInFlight(3, 1_000_000), [10] * 12))

    assert most_rows == 3


def test_a_row_larger_than_the_bound_goes_alone_and_is_not_passed_by_smaller_ones() -> None:
    most_bytes, _, order = asyncio.run(_send(RowsInFlight(100, 1_000), [300, 5_000, 300, 300]))

    assert most_bytes == 5_000  # alone
    assert order == [0, 1, 2, 3]


def test_a_row_cancelled_while_it_waits_leaves_the_line() -> None:
    async def main() -> list[str]:
        bound = RowsInFlight(1, 1_000)
        went: list[str] = []

        async def row(name: str) -> None:
            async with bound.admitted(10):
                went.append(name)
                await asyncio.sleep(0.05)

        first = asyncio.create_task(row("first"))
        await asyncio.sleep(0)
        waiting = asyncio.create_task(row("cancelled"))
        behind = asyncio.create_task(row("behind"))
        await asyncio.sleep(0.01)
        waiting.cancel()
        await asyncio.wait_for(asyncio.gather(first, behind), timeout=5)
        return went

    assert asyncio.run(main()) == ["first", "behind"]


@pytest.mark.parametrize(
    ("row", "at_least"),
    [
        ({"prompt": "x" * 1_000_000}, 1_000_000),
        ({"messages": [{"role": "user", "content": "y" * 500_000}] * 4}, 2_000_000),
        ({"image": b"\x00" * 300_000}, 300_000),
    ],
)
def test_a_rows_bytes_count_its_texts_at_any_depth(row: dict[str, object], at_least: int) -> None:
    assert at_least <= row_bytes(row) <= at_least + 2_000


def test_a_decoded_image_counts_its_pixels() -> None:
    from PIL import Image

    row = {"multi_modal_data": {"image": [Image.new("RGB", (1_000, 500))]}}
    assert 2_000_000 <= row_bytes(row) <= 2_002_000  # PIL keeps RGB at 4 bytes a pixel


def test_a_rows_texts_count_as_python_holds_them_in_ray_datas_shapes() -> None:
    """Ray Data hands a row's messages to the stage as a numpy object array, whose ``nbytes`` is 8 bytes
    a pointer (a 4 MiB message was charged 208 B); a text with a character past U+FFFF is held at
    4 bytes a character (4 Mi characters: 16 MiB)."""
    import pyarrow as pa

    as_ray_gives = pa.array([{"messages": [{"role": "user", "content": "a" * 4_000_000}]}])
    row = as_ray_gives.to_numpy(zero_copy_only=False).tolist()[0]
    assert type(row["messages"]).__name__ == "ndarray"

    assert row_bytes(row) >= 4_000_000
    assert row_bytes({"prompt": "a" * 4_000_000 + "\U0001f600"}) >= 16_000_000
