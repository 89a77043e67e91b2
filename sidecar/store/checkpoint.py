"""The per-partition checkpoint: ``<partition-dir>/checkpoint.json``.

Written atomically (temp file, fsync, rename, fsync of the directory) and always *last*: data
(commit log msync) -> index (scheduler files, id index msync) -> checkpoint -> Kafka offset commit.
It never runs ahead of durable data, so recovery can trust everything it names.

Fields: ``version``; ``topic``/``partition`` (refuses to open another partition's store);
``scheduler`` (refuses to open a store written by the other scheduler: its pending records would be
invisible); ``ingress_offset`` (next ingress offset to consume); ``log`` (append head and per-segment
live counts); ``sched`` (the scheduler's cursors); ``ids`` (id index slot counts);
``written_at_ms``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from sidecar.store.mapped import StoreError, atomic_write

NAME = "checkpoint.json"
VERSION = 1


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
    if not isinstance(doc, dict) or doc.get("version") != VERSION:
        version = doc.get("version") if isinstance(doc, dict) else "?"
        raise StoreError(f"{path}: unsupported checkpoint version {version}")
    return doc


def write(directory: Path, doc: dict[str, Any], durable: bool = True) -> None:
    doc = {"version": VERSION, **doc}
    data = orjson.dumps(doc, option=orjson.OPT_INDENT_2)
    if durable:
        atomic_write(directory / NAME, data)
    else:
        tmp = directory / (NAME + ".tmp")
        tmp.write_bytes(data)
        tmp.replace(directory / NAME)
