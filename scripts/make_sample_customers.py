"""Write a day's customers CSV in the classic sample shape (random but reproducible per date).

Columns: Index, Customer Id, First Name, Last Name, Company, City, Country, Phone 1, Phone 2,
Email, Subscription Date, Website.

usage: python make_sample_customers.py OUT_CSV --date 2026-11-20 [--rows 250]
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import random
from pathlib import Path

COLUMNS = [
    "Index",
    "Customer Id",
    "First Name",
    "Last Name",
    "Company",
    "City",
    "Country",
    "Phone 1",
    "Phone 2",
    "Email",
    "Subscription Date",
    "Website",
]
_FIRST = ["Ava", "Liam", "Mia", "Noah", "Zoe", "Omar", "Lena", "Ivan", "Sara", "Kenji", "Nia", "Hugo"]
_LAST = ["Garcia", "Smith", "Chen", "Okafor", "Muller", "Rossi", "Tanaka", "Novak", "Silva", "Haddad"]
_COMPANY_STEMS = ["Baker", "Summit", "Blue River", "Northwind", "Crescent", "Ironwood", "Harbor", "Pioneer"]
_COMPANY_KINDS = [
    "& Partners LLP",
    "Health Group",
    "Software Inc",
    "Retail Co",
    "Consulting",
    "Manufacturing Ltd",
    "Capital",
    "Realty",
    "Labs",
    "Foods",
]
_CITIES = [
    ("Lisbon", "Portugal"),
    ("Osaka", "Japan"),
    ("Austin", "United States"),
    ("Lyon", "France"),
    ("Accra", "Ghana"),
    ("Pune", "India"),
    ("Graz", "Austria"),
    ("Quito", "Ecuador"),
]


def _phone(rng: random.Random) -> str:
    return f"+{rng.randint(1, 99)}-{rng.randint(200, 999)}-{rng.randint(100, 999)}-{rng.randint(1000, 9999)}"


def customer_rows(day: str, rows: int) -> list[dict[str, str | int]]:
    seed = int(hashlib.sha256(day.encode()).hexdigest()[:8], 16)
    rng = random.Random(seed)
    out = []
    for index in range(1, rows + 1):
        first, last = rng.choice(_FIRST), rng.choice(_LAST)
        company = f"{rng.choice(_COMPANY_STEMS)} {rng.choice(_COMPANY_KINDS)}"
        city, country = rng.choice(_CITIES)
        domain = company.lower().replace("&", "and").replace(" ", "")[:20]
        out.append(
            {
                "Index": index,
                "Customer Id": hashlib.sha1(f"{day}-{index}".encode()).hexdigest()[:15].upper(),
                "First Name": first,
                "Last Name": last,
                "Company": company,
                "City": city,
                "Country": country,
                "Phone 1": _phone(rng),
                "Phone 2": _phone(rng),
                "Email": f"{first.lower()}.{last.lower()}@{domain}.com",
                "Subscription Date": day,
                "Website": f"https://www.{domain}.com",
            }
        )
    return out


def write_customers_csv(path: Path, day: str, rows: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(customer_rows(day, rows))
    return path


def write_customer_files(
    folder: Path, rows: int, rows_per_file: int, duplicate_every: int = 100, no_id_every: int = 200
) -> tuple[int, int]:
    """Write ``rows`` customers in CSV files of ``rows_per_file``, streaming (for millions of rows).

    Every ``duplicate_every``-th row repeats the previous row's Customer Id, and every
    ``no_id_every``-th has none (which wins where both apply). Returns (duplicate rows, rows without
    an id). The other columns are fixed but for the Company, so writing is fast.
    """
    folder.mkdir(parents=True, exist_ok=True)
    companies = [f"{stem} {kind}" for stem in _COMPANY_STEMS for kind in _COMPANY_KINDS]
    duplicates = bad = 0
    handle = writer = None
    for index in range(1, rows + 1):
        if (index - 1) % rows_per_file == 0:
            if handle is not None:
                handle.close()
            handle = (folder / f"customers-{(index - 1) // rows_per_file:04d}.csv").open("w", newline="")
            writer = csv.writer(handle)
            writer.writerow(COLUMNS)
        without_id = index % no_id_every == 0
        duplicate = index % duplicate_every == 0 and not without_id
        duplicates, bad = duplicates + duplicate, bad + without_id
        customer_id = "" if without_id else f"C{(index - 1 if duplicate else index):012d}"
        company = companies[index % len(companies)]
        phones = ["+1-200-300-4000", "+1-200-300-4001"]
        writer.writerow(
            [
                index,
                customer_id,
                "Ava",
                "Chen",
                company,
                "Lisbon",
                "Portugal",
                *phones,
                "ava.chen@example.com",
                "2026-11-20",
                "https://example.com",
            ]
        )
    if handle is not None:
        handle.close()
    return duplicates, bad


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_csv", type=Path)
    parser.add_argument("--date", required=True, help="logical date, YYYY-MM-DD")
    parser.add_argument("--rows", type=int, default=250)
    args = parser.parse_args()
    print(f"wrote {write_customers_csv(args.out_csv, args.date, args.rows)} ({args.rows} rows)")


if __name__ == "__main__":
    main()
