# Type stub of the C accelerator (its sources: sidecar/native/*.c); the Python twins live in
# sidecar/store/codec.py, sidecar/store/idindex.py, sidecar/headers.py, sidecar/wheel/layout.py
# and sidecar/levels/queue.py; the intake fast path's (ingest_run) is Intake.ingest_fields
# (sidecar/store/intake.py), the restore's (restore_run) Restore.put (sidecar/store/restore.py); the publish
# fast path's (Publisher, Delivery, publish_due) are Sidecar._produce / _on_delivery
# (sidecar/engine/loop.py); the changelog writes' (MirrorReport, mirror_puts, mirror_tombstones)
# StoreMirror.put / remove / _on_delivery (sidecar/engine/changelog.py).
from collections.abc import Callable, MutableSequence, Sequence
from typing import Any

# The C types have the fields and methods of their Python twins (read-only for Record), declared
# once there.
from sidecar.engine.publish_state import PublishState as PublishState
from sidecar.store.codec import Record as Record

# The argument structs of the schedulers' walks: C types generated from these classes
# (sidecar/store/native_args.py), with the same fields.
from sidecar.store.native_args import LvDue as LvDue
from sidecar.store.native_args import WlAck as WlAck
from sidecar.store.native_args import WlDone as WlDone
from sidecar.store.native_args import WlLink as WlLink
from sidecar.store.native_args import WlSend as WlSend

HARDWARE_CRC: int
INTAKE_LAYOUT: dict[str, int]  # intake_layout.h's macros as compiled (sidecar/store/intake_layout.py)
LAYOUTS: dict[str, int]  # layouts.h's macros as compiled, signed 64-bit (sidecar/store/native_layouts.py)

def setup(
    corrupt_record: type[Exception], id: str, deliver_at: str, enqueued_at: str, source: str, retry_count: str, /
) -> None: ...
def decode(
    buf: memoryview | bytes | bytearray, offset: int, limit: int | None = None, verify: bool = True
) -> Record: ...
def encode(
    rtype: int, due_ms: int, enqueue_ms: int, src_offset: int, src_partition: int, target_partition: int,
    retry_count: int, level: int, rid: bytes, topic: bytes, key: bytes | None, value: bytes | None,
    headers_blob: bytes, /,
) -> bytes: ...
def append(
    buf: memoryview | bytearray, offset: int, limit: int, rtype: int, due_ms: int, enqueue_ms: int, src_offset: int,
    src_partition: int, target_partition: int, retry_count: int, level: int, rid: bytes, topic: bytes,
    key: bytes | None, value: bytes | None, headers_blob: bytes, /,
) -> int: ...
def encode_headers(headers: Sequence[tuple[str, bytes | None]], /) -> bytes: ...
def decode_headers(blob: memoryview | bytes, /) -> list[tuple[str, bytes | None]]: ...
def delivery_headers(rec: Record, source_topic: bytes, /) -> list[tuple[str, bytes | None]]: ...
def setup_parser(codes: dict[str, int], prefix: str, min_every_ms: int = ..., /) -> None: ...
def parse_request(
    headers: Sequence[tuple[str, bytes | None]] | None, ts: int, now: int, size: int, max_record_bytes: int,
    max_delay_ms: int, checked_targets: set[str], /,
) -> tuple[str, int, bytes | None, int, str, tuple[tuple[str, bytes | None], ...]] | None: ...
def id_hash(rid: bytes | memoryview, /) -> int: ...
def idx_find(buf: memoryview, header_size: int, mask: int, h: int, tags: Any = None, /) -> list[int]: ...
def idx_wait(buf: memoryview, header_size: int, mask: int, h: int, tags: Any, /) -> int: ...
def idx_put(buf: memoryview, header_size: int, mask: int, h: int, ref: int, /) -> int: ...
def idx_remove(buf: memoryview, header_size: int, mask: int, h: int, ref: int, /) -> tuple[int, int] | None: ...
def idx_remove_delivered(
    buf: memoryview, header_size: int, mask: int, pairs: list[tuple[int, Record]], /
) -> tuple[int, int]: ...
def idx_copy(
    old: memoryview, new: memoryview, header_size: int, lo: int, hi: int, new_mask: int, /
) -> tuple[int, int, int]: ...
def idx_expired(buf: memoryview, header_size: int, lo: int, hi: int, cutoff: int, /) -> list[tuple[int, int]]: ...
def idx_apply(
    buf: memoryview | bytearray, header_size: int, mask: int, records: bytes | bytearray | memoryview, /
) -> tuple[int, int]: ...
def idx_delivered_records(pairs: list[tuple[int, Record]], /) -> bytes: ...
def idx_merge_pass(
    fd: int, header_size: int, mask: int, removes: bytes, inserts: bytes, cutoff_ms: int, chunk_slots: int,
    sync: bool, /,
) -> tuple[int, int, int, int, int, int]: ...
def idx_merge_journal(
    fd: int, header_size: int, mask: int, records: bytes, cutoff_ms: int, chunk_slots: int, sync: bool,
    tags: Any = None, /,
) -> tuple[int, int, int, int, int, int]: ...
def idx_rebuild(
    old_fd: int, new_fd: int, header_size: int, old_mask: int, new_mask: int, cutoff_ms: int, chunk_slots: int,
    sync: bool, /,
) -> tuple[int, int, int, int, int]: ...
def idx_pass_idle(on: bool, /) -> None: ...
def populate(buffer: Any, start: int, length: int, /) -> int: ...
def drop(ranges: list[tuple[Any, int, int]], /) -> int: ...
def wl_link(tl_buf: memoryview, slot_buf: memoryview, a: WlLink, /) -> int: ...
def wl_send(buf: memoryview, lst: Any, pend: list[tuple[int, int]], a: WlSend, /) -> int: ...
def wl_read(
    segments: dict[int, Any], seg_bytes: int, pend: list[tuple[int, int]], i: int, out: list[tuple[int, Any]], /
) -> int: ...
def wl_done(buf: memoryview, lst: Any, segs: dict[int, int], blocs: list[int], a: WlDone, /) -> int: ...
def wl_group(
    buf: memoryview, hs: int, f0: int, nent: int, e: int, last: int, base: int, /
) -> tuple[dict[int, bytes], int]: ...
def wl_ack(buf: memoryview, refs: list[int], a: WlAck, /) -> bool: ...
def ingest_run(
    msgs: list[Any], start: int, now: int, partition: int, id_prefix: bytes, checked_targets: set[str],
    no_headers: bytes, seg_buf: memoryview | None, idx_buf: memoryview, st: list[int], sched_bufs: tuple[Any, ...],
    idx_old_buf: memoryview | None = None, idx_old2_buf: memoryview | None = None,
    idx_jnl_buf: memoryview | bytearray | None = None, idx_tags_buf: Any = None, /,
) -> int: ...
def restore_run(
    msgs: list[Any], start: int, partition: int, end: int, seg_buf: memoryview | None, idx_buf: memoryview,
    st: list[int], sched_bufs: tuple[Any, ...], idx_old_buf: memoryview | None = None,
    idx_old2_buf: memoryview | None = None, idx_jnl_buf: memoryview | bytearray | None = None,
    idx_tags_buf: Any = None, /,
) -> int: ...
def lv_due(
    buf: memoryview, segments: dict[int, Any], segs: dict[int, int], out: list[tuple[int, Any]], a: LvDue, /
) -> int: ...
def lv_ack(
    refs: list[int], files: list[dict[int, Any]], per_file: int, hs: int, cur: MutableSequence[int],
    seg_bytes: int, segs: dict[int, int], /,
) -> None: ...
class Publisher:
    """What ``publish_due`` and its ``Delivery`` reports use: the loop's ``PublishState``, its
    ``_on_delivery`` (the reference path) and the exception types ``produce`` hands back."""

    def __init__(
        self, state: PublishState, on_delivery: Callable[..., None], refused: tuple[type[BaseException], ...], /
    ) -> None: ...
    def sync(self) -> None:
        """Add the topic in-flight counts its delivery reports changed to the state (after every poll)."""

class Delivery:
    """A record's delivery-report callable (made by ``publish_due`` only)."""

    def __call__(self, err: Any, msg: Any, /) -> None: ...

def publish_due(
    pub: Publisher, produce: Callable[..., Any], batch: list[tuple[int, Record]], i: int, store: Any, now: int, /
) -> tuple[int, BaseException | None]: ...
class MirrorReport:
    """The delivery-report callable of a ``StoreMirror``'s changelog writes (one per mirror): a
    success is ``StoreMirror._acked``'s work, anything else goes to its ``_on_delivery``."""

    def __init__(self, mirror: Any, /) -> None: ...
    def __call__(self, err: Any, msg: Any, /) -> None: ...

def mirror_puts(
    report: Callable[[Any, Any], None], produce: Callable[..., Any], buf: Any, off: int, count: int,
    refused: tuple[type[BaseException], ...], held: dict[bytes, bytes] | None, now: int, /,
) -> tuple[int, int, BaseException | None]: ...
def mirror_tombstones(
    report: Callable[[Any, Any], None], produce: Callable[..., Any], acked: list[tuple[int, Record]], i: int,
    refused: tuple[type[BaseException], ...], held: dict[bytes, bytes], /,
) -> tuple[int, BaseException | None]: ...
def mirror_writes(
    report: Callable[[Any, Any], None], produce: Callable[..., Any], writes: list[tuple[bytes, bytes | None]], i: int,
    refused: tuple[type[BaseException], ...], held: None, /,
) -> tuple[int, BaseException | None]: ...
def crc32c(data: bytes | bytearray | memoryview, /) -> int: ...
def crc32c_software(data: bytes | bytearray | memoryview, /) -> int: ...
