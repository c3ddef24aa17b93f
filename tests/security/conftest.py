"""Fixtures shared by the security tests."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest


@pytest.fixture
def usual_umask() -> Iterator[None]:
    """The umask most nodes run with: what is private must be made private by our code itself."""
    previous = os.umask(0o022)
    yield
    os.umask(previous)
