"""``delay-sidecar list``: the records pending in a due-time range, merged across the sidecars.

Each sidecar answers for the partitions it owns (``GET /pending``: ``sidecar.engine.listing``);
the command finds the members of the consumer group and their HTTP addresses as ``status`` does
(``sidecar.status.group_members``: the address each advertises in its client id or its commits'
metadata), asks every one of them the same question, and merges their pages.

Order and paging. Every entry has the key ``(due_ms, partition, ref)`` (``sidecar.store.listing``),
one order across all partitions and sidecars. A page is the first ``limit`` keys of the range after
the cursor; each member returns its own first ``limit`` after the cursor, so their merge holds the
global first ``limit``. The cursor (``next``) is the last key shown, written ``DUE.PARTITION.REF``:
any sidecar can continue from it, so paging goes on across a rebalance (a partition that moved is
asked of its new owner). ``next`` is absent on the last page.

A member that does not answer makes the listing fail (exit status 1, naming it): a merged page
without one owner's records would look complete and not be.
"""

from __future__ import annotations

import http.client
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from sidecar.status import Member, StatusError, get_json
from sidecar.store.listing import Key, Query
from sidecar.store.listing_params import CURSOR_FORM as CURSOR_FORM  # the command's, re-exported
from sidecar.store.listing_params import PATH, cursor_text, to_params
from sidecar.store.listing_params import parse_cursor as parse_cursor


def ask(address: str, q: Query, timeout_s: float) -> tuple[int, dict[str, Any]]:
    """``GET http://<address>/pending?...`` -> (status, JSON document)."""
    return get_json(address, PATH + "?" + to_params(q), timeout_s)


def _key(e: dict[str, Any]) -> Key:
    return int(e["due_ms"]), int(e["partition"]), int(e["ref"])


def list_across(members: list[Member], q: Query, timeout_s: float) -> dict[str, Any]:
    """One page over every member: ``{"entries": [...], "next": cursor or absent, "members": [...]}``.
    Raises StatusError when a member cannot be asked or does not answer."""
    silent = [m for m in members if m.address is None]
    if silent:
        raise StatusError(f"member(s) {', '.join(m.client_id for m in silent)} advertise no HTTP address: run "
                          "every sidecar with --http-port (and --advertised-address if the broker sees them at "
                          "another host)")

    def one(m: Member) -> tuple[Member, int, dict[str, Any]] | tuple[Member, Exception]:
        assert m.address is not None
        try:
            return (m, *ask(m.address, q, timeout_s))
        except (OSError, http.client.HTTPException) as e:
            return m, e

    with ThreadPoolExecutor(max_workers=min(16, len(members))) as pool:
        results = list(pool.map(one, members))
    failures, entries, more, restoring = [], [], False, []
    for r in results:
        if len(r) == 2:
            failures.append(f"{r[0].address}: {r[1]}")
            continue
        m, status, doc = r
        if status != 200:
            failures.append(f"{m.address}: HTTP {status} {doc.get('error', '')}".strip())
            continue
        got = doc.get("entries", [])
        for e in got:
            e["member"] = m.address
        entries.extend(got)
        more = more or doc.get("next") is not None
        restoring += doc.get("restoring_partitions", [])
    if failures:
        raise StatusError("no answer from " + "; ".join(failures))
    entries.sort(key=_key)
    more = more or len(entries) > q.limit
    page = entries[: q.limit]
    out: dict[str, Any] = {"entries": page, "members": sorted(str(m.address) for m in members)}
    if more and page:
        out["next"] = cursor_text(_key(page[-1]))
    if restoring:
        out["restoring_partitions"] = sorted(restoring)
    return out
