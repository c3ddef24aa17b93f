"""What a row carries past the row steps: ray.data.llm's error column and the mark of our reasons in
it, and the order of its source, which decides the first row of a repeated id.

A leaf: the stages the rows pass through (our chat template, a warm pool's replica) and the
duplicate-id pass (:mod:`.read.dedupe`) read these here, not from :mod:`.row_steps`, which imports
what they import and them too.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

#: Ray Data LLM's error column (with ``should_continue_on_error=True``): "" for a good row, else why not.
INFERENCE_ERROR: Final = "__inference_error__"
#: Marks a reason of ours in ray.data.llm's error column (set by our steps after prepare: the engine
#: request, the chat template), so that it is not reported as the engine's ("inference failed: ...").
ROW_REASON_MARK = "raybatch row error: "


#: The longest id a row may have (its id column's text, an OpenAI line's ``custom_id``): the driver
#: holds every row's id at once to find repeats (:mod:`.read.dedupe`), so 200,000 rows of 4 KiB ids grew
#: it by 1.6 GiB, and a million rows of longer ones would run it out of memory.
MAX_ID_CHARS = 1024


def source_order(source: str) -> tuple[str, int]:
    """A row's source (``file:line``) as a sort key: its file, then its line as a number."""
    name, _, number = source.rpartition(":")
    return name, int(number) if number.isdigit() else 0


def first_sources_of_duplicates(
    rows: Iterable[tuple[str, str, str | None]],
) -> tuple[dict[str, str], int, int]:
    """For each id that occurs more than once among good rows: the source of its first occurrence
    (in file order); the number of rows that already carry an error; and the number of rows whose id
    another row has too, good or not, less one per id (``rows_in`` less the distinct rows: what
    ``rows_duplicate`` counts, so a repeated id is never a failure of its own, whichever of its rows
    failed and why).

    A row in error whose id is its own source (no id column, a missing id, a line that is no row) has
    no id of its own: it is a distinct row, never matched with a row whose id reads the same.

    :param rows: each prepared row's ``(id, source, error)``.
    """
    first: dict[str, str] = {}
    repeated: set[str] = set()
    failed_ids: set[str] = set()  # ids of rows in error that no good row had when they were read
    errors = repeats = 0
    for row_id_, source, error in rows:
        if error is not None:
            errors += 1
            if row_id_ != source:
                if row_id_ in first or row_id_ in failed_ids:
                    repeats += 1
                else:
                    failed_ids.add(row_id_)
            continue
        if row_id_ in first:
            repeats += 1
            repeated.add(row_id_)
            if source_order(source) < source_order(first[row_id_]):
                first[row_id_] = source
        else:
            repeats += row_id_ in failed_ids
            first[row_id_] = source
    return {row_id_: first[row_id_] for row_id_ in repeated}, errors, repeats
