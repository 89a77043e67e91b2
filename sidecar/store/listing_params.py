"""The wire form of a listing query (``GET /pending``): its parameters and the page cursor.

Both ends use it: the sidecar's endpoint (``sidecar.engine.listing``) reads a query from the
parameters, the command (``sidecar.listing_client``) writes them. A cursor is the last key shown,
``DUE.PARTITION.REF`` (``sidecar.store.listing``: the one order of entries across partitions and
sidecars). Every error names the parameter.
"""

from __future__ import annotations

import re
from urllib.parse import parse_qs, quote, unquote_to_bytes, urlencode

from sidecar.contract import MAX_ID_BYTES
from sidecar.store.listing import MAX_LIMIT, Key, Query

PATH = "/pending"
CURSOR_FORM = "DUE.PARTITION.REF, as a previous page's next"


def cursor_text(key: Key) -> str:
    return f"{key[0]}.{key[1]}.{key[2]}"


def parse_cursor(text: str) -> Key:
    m = re.fullmatch(r"([0-9]{1,16})\.([0-9]{1,9})\.([0-9]{1,19})", text.strip())
    if m is None:
        raise ValueError(f"{text!r} is not a cursor ({CURSOR_FORM})")
    return int(m.group(1)), int(m.group(2)), int(m.group(3))


def check(q: Query) -> Query:
    """Raise ValueError, naming the parameter, for a query no sidecar would answer."""
    if q.after_ms >= q.before_ms:
        raise ValueError(f"due-before ({q.before_ms}) must be after due-after ({q.after_ms})")
    if not 1 <= q.limit <= MAX_LIMIT:
        raise ValueError(f"limit {q.limit} is not between 1 and {MAX_LIMIT}")
    if q.id_prefix is not None and not 1 <= len(q.id_prefix) <= MAX_ID_BYTES:
        raise ValueError(f"id-prefix is 1..{MAX_ID_BYTES} bytes, not {len(q.id_prefix)}")
    if q.target is not None and not q.target:
        raise ValueError("target is an empty topic name")
    return q


def to_params(q: Query) -> str:
    """The query string of ``GET /pending`` for ``q``."""
    params: dict[str, str] = {"after": str(q.after_ms), "before": str(q.before_ms), "limit": str(q.limit)}
    if q.target is not None:
        params["target"] = q.target
    if q.cursor is not None:
        params["cursor"] = cursor_text(q.cursor)
    text = urlencode(params)
    if q.id_prefix is not None:
        text += "&id_prefix=" + quote(q.id_prefix, safe="")
    return text


def from_params(text: str) -> Query:
    """The query of ``GET /pending?<text>``; ValueError naming the bad parameter."""
    got = {k: v[-1] for k, v in parse_qs(text, keep_blank_values=True).items()}
    for name in ("after", "before"):
        if not re.fullmatch(r"[0-9]{1,16}", got.get(name, "")):
            raise ValueError(f"{name}={got.get(name, '')!r}: epoch milliseconds are required")
    limit = got.get("limit", "100")
    if not re.fullmatch(r"[0-9]{1,6}", limit):
        raise ValueError(f"limit={limit!r} is not a whole number")
    cursor = None
    if got.get("cursor"):
        cursor = parse_cursor(got["cursor"])
    prefix = None
    m = re.search(r"(?:^|&)id_prefix=([^&]*)", text)
    if m is not None:
        prefix = unquote_to_bytes(m.group(1))  # raw bytes: an id need not be UTF-8
    return check(Query(int(got["after"]), int(got["before"]), got.get("target"), prefix, int(limit), cursor))
