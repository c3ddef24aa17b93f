"""Write the image benchmark's input: N generated photos-like images in Parquet files (issue 19 item 6).

Each row is ``image_id``, ``filename`` and ``image`` in Hugging Face datasets' Image layout
(``{"bytes", "path"}``), as tests/integration/test_image_captions.py and the image-captions example
read them. The images vary as a day's uploads do: JPEG and PNG, RGB and RGBA, 96 to 1024 pixels a
side (most above the job's ``image_max_side``, so the pipeline shrinks them), drawn with gradients
and shapes so that they compress like pictures (~10 KB), not like noise. Every 500th row is broken
on purpose (truncated bytes): an error row with the reason ``bad image``, never a failed job.

usage: python3 bench/gpu/make_images.py OUT_DIR --rows 100000 --rows-per-file 10000
"""

from __future__ import annotations

import argparse
import io
import json
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

BROKEN_EVERY = 500


def _image_bytes(i: int) -> tuple[bytes, str]:
    from PIL import Image, ImageDraw

    width, height = 96 + (i * 37) % 929, 96 + (i * 53) % 929
    mode = "RGBA" if i % 5 == 0 else "RGB"
    image = Image.linear_gradient("L").resize((width, height)).convert(mode)
    draw = ImageDraw.Draw(image)
    for k in range(3):
        x, y = (i * (k + 3) * 31) % width, (i * (k + 5) * 17) % height
        colour = ((i * 7 + 60 * k) % 256, (i * 11 + 90 * k) % 256, (i * 13) % 256)
        draw.ellipse(
            (x, y, x + width // 4, y + height // 4), fill=colour if mode == "RGB" else (*colour, 200)
        )
    buffer = io.BytesIO()
    fmt = "PNG" if mode == "RGBA" or i % 3 == 0 else "JPEG"
    image.save(buffer, format=fmt, **({"quality": 80} if fmt == "JPEG" else {"optimize": False}))
    data = buffer.getvalue()
    if i % BROKEN_EVERY == BROKEN_EVERY - 1:
        data = data[: len(data) // 3]
    return data, fmt.lower()


def _write_file(args: tuple[Path, int, int]) -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path, first, count = args
    rows = []
    for i in range(first, first + count):
        data, ext = _image_bytes(i)
        rows.append(
            {
                "image_id": f"img-{i:07d}",
                "filename": f"img-{i:07d}.{ext}",
                "image": {"bytes": data, "path": None},
            }
        )
    schema = pa.schema(
        [
            ("image_id", pa.string()),
            ("filename", pa.string()),
            ("image", pa.struct([("bytes", pa.binary()), ("path", pa.string())])),
        ]
    )
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
    return path.stat().st_size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--rows-per-file", type=int, default=10_000)
    args = parser.parse_args()
    marker = args.out / "params.json"
    if marker.exists():
        print(f"{args.out}: {marker.read_text()}")
        return
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    files = [
        (args.out / f"images-{n:04d}.parquet", first, min(args.rows_per_file, args.rows - first))
        for n, first in enumerate(range(0, args.rows, args.rows_per_file))
    ]
    with ProcessPoolExecutor() as pool:
        size = sum(pool.map(_write_file, files))
    broken = args.rows // BROKEN_EVERY
    params = {"rows": args.rows, "files": len(files), "broken": broken, "bytes": size}
    marker.write_text(json.dumps(params))
    print(
        f"{args.out}: {args.rows} images ({broken} broken) in {len(files)} files, "
        f"{size / 2**20:.0f} MiB, {time.time() - started:.1f} s"
    )


if __name__ == "__main__":
    main()
