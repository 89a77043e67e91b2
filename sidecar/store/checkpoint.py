"""The per-partition checkpoint: ``<partition-dir>/checkpoint.json``.

Written atomically (temp file, fsync, rename, fsync of the directory) and always *last*: data
(commit log msync) -> index (scheduler files, id index msync) -> checkpoint -> Kafka offset commit.
It never runs ahead of durable data, so recovery can trust everything it names.

Fields: ``version``; ``topic``/``partition`` (refuses to open another partition's store);
``scheduler`` (refuses to open a store written by the other scheduler: its pending records would be
invisible); ``ingress_offset`` (next ingress offset to consume); ``log`` (append head and per-segment
live counts); ``sched`` (the scheduler's cursors); ``ids`` (id index slot counts);
``written_at_ms``; version 2 adds ``direct``, the ingress offsets of records published from the
intake whose delivery was not reported at the snapshot (engine/direct.py; consumed again after a
crash: store/resume.py). Version 1 is written while nothing is published from the intake and
read as before; a sidecar that knows only version 1 refuses a version 2 checkpoint rather than
resume past a record it would not know to consume again (docs/storage.md 2.5).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from sidecar.store.mapped import StoreError, atomic_write

NAME = "checkpoint.json"
VERSION = 2  # the newest: with ``direct``
VERSIONS = (1, 2)  # read: 1 is a checkpoint without ``direct``


def read(directory: Path) -> dict[str, Any] | None:
    path = directory / NAME
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError as e:
        raise StoreError(
            f"{path}: checkpoint is not valid JSON ({e}); it is written atomically, so this is disk damage"
        ) from None
    if not isinstance(doc, dict) or doc.get("version") not in VERSIONS:
        version = doc.get("version") if isinstance(doc, dict) else "?"
        raise StoreError(f"{path}: unsupported checkpoint version {version}")
    return doc


def write(directory: Path, doc: dict[str, Any], durable: bool = True) -> None:
    doc = {"version": VERSION if "direct" in doc else 1, **doc}
    data = orjson.dumps(doc, option=orjson.OPT_INDENT_2)
    if durable:
        atomic_write(directory / NAME, data)
    else:
        tmp = directory / (NAME + ".tmp")
        tmp.write_bytes(data)
        tmp.replace(directory / NAME)
