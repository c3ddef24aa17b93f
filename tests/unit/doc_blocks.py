"""The fenced code blocks of the README and docs/, as a reader copies them."""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


@dataclass(frozen=True)
class Block:
    """A fenced block and the HTML comment on the line right above it, if any (its text, trimmed):
    how the page says whether the tests run the block (tests/unit/test_docs_commands.py)."""

    where: str  # page:line of the opening fence
    source: str
    marker: str | None


def marked_blocks(language: str) -> list[Block]:
    """Every ```<language> block, dedented as it sits in a list item, with its marker."""
    found = []
    for page in PAGES:
        text = page.read_text()
        for match in re.finditer(rf"^( *)```{language}\n(.*?)^ *```", text, flags=re.S | re.M):
            line = text[: match.start()].count("\n") + 1
            above = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1].strip()
            comment = re.fullmatch(r"<!--(.*)-->", above)
            found.append(
                Block(
                    f"{page.relative_to(ROOT)}:{line}",
                    textwrap.dedent(match.group(2)),
                    comment.group(1).strip() if comment else None,
                )
            )
    return found


def fenced_blocks(language: str) -> list[tuple[str, str]]:
    """(page:line, source) of every ```<language> block, dedented as it sits in a list item."""
    return [(block.where, block.source) for block in marked_blocks(language)]
