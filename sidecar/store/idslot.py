"""The id index's slot and journal-record layout, shared by the index (idindex.py), its merge pass
(idmerge.py) and the offline inspector. The C side reads journal records with ``kds_jnl_read``
(sidecar/native/native.h).

A slot is 16 bytes, little-endian: ``u64 hash`` (``EMPTY`` 0, ``TOMB`` 1, else an id's 64-bit
digest forced >= 2), ``u64 ref``. A ref with ``PRECANCEL`` (the top bit) set is a pre-cancel whose
low bits are its time (epoch ms).

A table's *tag* of a slot (``tag``; C ``kds_idx_tag``, native.h) is one byte: ``EMPTY`` 0,
``TOMB`` 1, else the hash's top byte with 0 and 1 folded onto 2 and 3 (254 values, so an absent
id's tag matches 1 in 252 occupied slots; with ``0x80`` and 7 bits it was 1 in 128). The tags
live in anonymous memory beside a table on disk (idindex.py, "Tags"), so that a probe reads a slot
only where its tag matches.

A journal record has the slot's layout: ``(hash, ref)`` is an insert. A remove is two records,
``REMOVE_MARK`` (the hash ``TOMB``, ref 0) then ``(hash, ref)``: every bit of a ref belongs to some
scheduler (pre-cancels use bit 63, the wheel's bucket refs bit 62 and the 62 below it), so the
remove is marked by a hash no id has.

A table file (``ids.idx``) is a ``MappedFile`` header (sidecar/store/mapped.py) with ``MAGIC`` and
``VERSION``, then its slots.
"""

from collections.abc import Iterator
from typing import Any

from sidecar.store import native_layouts as _layouts

MAGIC = b"KDSIDX\x00\x01"  # a table file's
VERSION = 2  # 2: a table's header base is the capacity it was migrated from (read, no longer written)
SLOT = _layouts.ID_SLOT
EMPTY, TOMB = _layouts.ID_EMPTY, _layouts.ID_TOMB
PRECANCEL = _layouts.ID_PRECANCEL
SLOT_SIZE = SLOT.size
REMOVE_MARK = SLOT.pack(TOMB, 0)
OP_JOURNAL_BYTES = 2 * SLOT_SIZE  # journal bytes of one operation at most (a remove: the marker, the pair)
# Sizes the index starts from, here so that the store's space budget (space.py) reads the same
# values without importing the index: the table's initial slots, and the operations that cut a
# generation at least (a journal at the initial size holds at most that many).
INITIAL_SLOTS = 1 << 16
CUT_MIN = 1 << 14


def tag(h: int) -> int:
    """The tag byte of a slot whose hash is ``h``."""
    if h <= TOMB:
        return h
    top = h >> 56
    return top + 2 if top <= TOMB else top


def tags_of(hashes: Any) -> bytes:
    """The tag bytes of slots with these hashes, in order."""
    return bytes(tag(h) for h in hashes)


def journal_ops(records: Any) -> Iterator[tuple[int, int, bool]]:
    """A journal's operations in order: (hash, ref, is a remove). ValueError on a malformed record
    (what ``kds_jnl_read`` refuses)."""
    n = len(records) // SLOT_SIZE
    if len(records) % SLOT_SIZE:
        raise ValueError("journal records are 16-byte (hash, ref) pairs")
    k = 0
    while k < n:
        h, ref = SLOT.unpack_from(records, k * SLOT_SIZE)
        if h > TOMB:
            yield h, ref, False
            k += 1
            continue
        if h == TOMB and ref == 0 and k + 1 < n:
            h, ref = SLOT.unpack_from(records, (k + 1) * SLOT_SIZE)
            if h > TOMB:
                yield h, ref, True
                k += 2
                continue
        raise ValueError(f"journal record {k} is malformed (a hash below 2 outside a remove's marker, "
                         "or a marker with a ref or without its pair)")
