"""A benchmark's measurements as JSON lines: each printed as it is made (flushed, so a run cut
by a timeout keeps what it measured) and appended to the ``--out`` file when one is given."""

from __future__ import annotations

import json


def emit(row: dict, out: str | None = None, **dumps) -> dict:
    """Print ``row`` as one JSON line and append it to ``out`` (None: print only); ``dumps``
    goes to :func:`json.dumps` (e.g. ``default=str``). Returns ``row``."""
    line = json.dumps(row, **dumps)
    print(line, flush=True)
    if out:
        with open(out, "a") as f:
            f.write(line + "\n")
    return row


def append(rows, out: str | None, **dumps) -> None:
    """Append ``rows`` (already printed) to ``out`` as JSON lines (None: nothing)."""
    if out:
        with open(out, "a") as f:
            f.writelines(json.dumps(r, **dumps) + "\n" for r in rows)
