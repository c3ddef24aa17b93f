"""The fenced code blocks of the README and docs/, as a reader copies them."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def fenced_blocks(language: str) -> list[tuple[str, str]]:
    """(page:line, source) of every ```<language> block, dedented as it sits in a list item."""
    found = []
    for page in PAGES:
        text = page.read_text()
        for match in re.finditer(rf"^( *)```{language}\n(.*?)^ *```", text, flags=re.S | re.M):
            line = text[: match.start()].count("\n") + 1
            found.append((f"{page.relative_to(ROOT)}:{line}", textwrap.dedent(match.group(2))))
    return found
