"""Read one image file as a row's image in a fresh interpreter, and say what it cost.

The image layout tests (tests/security/test_image_*_layout.py) build hostile files and show that the
walk refuses them cheaply: the reading process's memory growth and CPU seconds are its own only in an
interpreter that has done nothing else.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

#: What the interpreter adds to a measure beside the file's own cost (allocator, plugins imported).
SLACK_MIB = 12
#: CPU a refused file may cost: a walk reads length bytes and stops at its bound.
REFUSED_CPU_SECONDS = 0.5

_MEASURE = """
import json, resource, sys
from PIL import Image, ImageOps, {plugin}  # not the image's cost
from airflow_provider_raybatch.pipeline.read.images import load_image

data = open(sys.argv[1], "rb").read()
before = resource.getrusage(resource.RUSAGE_SELF)
try:
    result = {{"size": list(load_image(data).size)}}
except ValueError as err:
    result = {{"reason": str(err)}}
after = resource.getrusage(resource.RUSAGE_SELF)
result["cpu_seconds"] = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
result["grown_mib"] = (after.ru_maxrss - before.ru_maxrss) / 1024
print(json.dumps(result))
"""


def measure(path: Path, plugin: str) -> dict[str, Any]:  # Any: JSON from the child.
    """``{"size"}`` or ``{"reason"}`` of the image at ``path``, with ``cpu_seconds`` and ``grown_mib``;
    ``plugin``: Pillow's module for its format (``PngImagePlugin``), imported before the measure."""
    done = subprocess.run(
        [sys.executable, "-c", _MEASURE.format(plugin=plugin), str(path)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)
