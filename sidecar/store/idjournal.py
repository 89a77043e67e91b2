"""The id index's journal: one append-only file per generation, ``ids.jnl.<g>``.

The staged id index never writes its table from the event loop: an operation goes to an
in-memory stage and to the journal of the current generation ``g``; a background thread later
merges a generation's records into the table (idmerge.py). The journal is what makes the stage
durable between two merges. This module stores opaque records and does not interpret them
(their layout is idslot.py's: 16 bytes, ``u64 hash``, ``u64 ref``).

Format, little-endian::

    0    the store's 64-byte header (mapped.py): header_bytes(MAGIC, VERSION, 16, g, 0)
         geom_a = the record size (16), geom_b = the generation g (it must match the name)
    64   blocks, back to back:  u32 length, u32 crc32c(payload), payload
         (length > 0 and a multiple of 16: whole records only)

Rules:

* **The checkpoint names the durable length.** A block is durable once the file was synced
  (``JournalWriter.note_sync``, then the checkpoint's batch) and the checkpoint written after that
  names a length covering it. Bytes past that length were written after the checkpoint: recovery
  discards them (the replay of the commit log journals those operations again), so a torn or
  corrupt block there is normal after a crash and is ignored.
* **Within the durable length, damage is corruption.** That data was synced before the checkpoint
  named it, so a file shorter than the length, a block whose CRC fails, or blocks that do not end
  exactly at the length is a ``StoreError`` naming the file and the offset: never silently cut.
* **read does not modify the file; truncate does.** ``read`` returns the payloads up to the
  checkpointed length and leaves the file alone (the merge thread and the tests read sealed
  generations too). Before anything is appended to a generation again after a restart, the bytes
  past the checkpointed length must go (``truncate``, or ``JournalWriter.resume``, which does it):
  appended after them, new blocks would be unreachable behind a torn block, or, worse, stale
  blocks from before the crash would be replayed with them.
* **A new file's name is synced with its first sync.** ``JournalWriter`` writes the header without
  syncing it; its first ``note_sync`` syncs the file and the directory, before any checkpoint can
  name the journal. So a journal whose header is not on the disk is one nothing names.
* **A leftover is rewritten.** Creating generation ``g`` while ``ids.jnl.<g>`` exists truncates
  it: the store creates a generation only when no checkpoint names it, so such a file was created
  after the last checkpoint (a crash in between) and holds nothing recovery needs.

The offline inspector uses ``scan``: every whole, CRC-valid block from the start, up to the first
torn or invalid one, without a checkpoint to bound it and without modifying the file.
"""

from __future__ import annotations

import contextlib
import os
import struct
from pathlib import Path

from crc32c import crc32c

from sidecar import logs
from sidecar.store.mapped import (
    HEADER,
    HEADER_SIZE,
    GeometryMismatch,
    StoreError,
    current_batch,
    fsync_dir,
    header_bytes,
    remove_file,
)

MAGIC = b"KDSJNL\x00\x01"
VERSION = 1
RECORD_SIZE = 16
PREFIX = "ids.jnl."
BLOCK = struct.Struct("<II")  # u32 payload length, u32 crc32c(payload)
# the largest payload one block holds (u32 length, whole records): a caller splits anything larger
MAX_PAYLOAD = (1 << 32) - RECORD_SIZE
# pread returns at most ~2 GiB per call on Linux: a long journal is read in chunks
_READ_CHUNK = 1 << 30
log = logs.get("sidecar.store")


def path_of(directory: Path, g: int) -> Path:
    """The journal file of generation ``g`` in the partition directory."""
    if g < 0:
        raise ValueError(f"journal generation {g} is negative")
    return directory / f"{PREFIX}{g}"


def generations(directory: Path) -> list[int]:
    """The generation of every ``ids.jnl.<g>`` file in ``directory``, ascending. Names that are not
    exactly ``path_of`` of some g (``ids.jnl.x``, ``ids.jnl.3.tmp``, ``ids.jnl.007``) are ignored:
    ``read`` and ``remove`` could not reach them by their generation."""
    found: list[int] = []
    with os.scandir(directory) as entries:
        for entry in entries:
            g = _parse_name(entry.name)
            if g is not None and entry.is_file(follow_symlinks=False):
                found.append(g)
    found.sort()
    return found


def _parse_name(name: str) -> int | None:
    if not name.startswith(PREFIX):
        return None
    digits = name[len(PREFIX):]
    # isascii: str.isdigit accepts digits int() refuses ("²"); the round trip refuses leading zeros
    if not (digits.isascii() and digits.isdigit()) or str(int(digits)) != digits:
        return None
    return int(digits)


class JournalWriter:
    """Appends blocks to one generation's journal, through a descriptor held open.

    ``length`` is the bytes written so far (the header included): after ``note_sync`` and the run
    of its batch, the value a checkpoint may name. A failed ``append`` leaves ``length`` where it
    was, so the next one writes over whatever part of the block reached the file."""

    __slots__ = ("_fd", "_name_synced", "directory", "g", "length", "path")

    def __init__(self, directory: Path, g: int) -> None:
        self.directory = directory
        self.g = g
        self.path = path_of(directory, g)
        self._fd = _create(self.path)
        try:
            _pwrite_all(self._fd, [header_bytes(MAGIC, VERSION, RECORD_SIZE, g, 0)], 0)
        except BaseException:
            os.close(self._fd)
            raise
        self.length = HEADER_SIZE
        self._name_synced = False  # the directory entry is synced with the first note_sync

    @classmethod
    def resume(cls, directory: Path, g: int, length: int) -> JournalWriter:
        """Continue appending to an existing journal that a checkpoint names with ``length`` bytes
        (``read`` has verified them): the bytes past ``length`` are cut first (see the module
        docstring). The cut need not be synced on its own: until the next ``note_sync`` (whose
        ``fdatasync`` makes the new size durable) the checkpoint still names ``length``, and
        ``read`` never looks past it."""
        path = path_of(directory, g)
        self = cls.__new__(cls)
        self.directory, self.g, self.path = directory, g, path
        self._fd = os.open(path, os.O_WRONLY)
        try:
            _cut(self._fd, path, length)
        except BaseException:
            os.close(self._fd)
            raise
        self.length = length
        self._name_synced = True  # a checkpoint named it: its first note_sync synced the directory
        return self

    def append(self, payload: bytes | bytearray | memoryview) -> int:
        """Write ``payload`` (whole 16-byte records) as one block at the end; return the new
        ``length``. An empty payload writes nothing."""
        view = memoryview(payload).cast("B")
        n = view.nbytes
        if n == 0:
            return self.length
        if n % RECORD_SIZE or n > MAX_PAYLOAD:
            raise ValueError(f"{self.path}: a block holds whole {RECORD_SIZE}-byte records, at most {MAX_PAYLOAD}"
                             f" bytes; got {n}")
        # pwrite at our own length, not O_APPEND: after a failed write the file's end may hold part
        # of a block, and the next append must write over it
        _pwrite_all(self._open_fd(), [BLOCK.pack(n, crc32c(view)), view], self.length)
        self.length += BLOCK.size + n
        return self.length

    def note_sync(self) -> None:
        """Make everything appended durable: inside ``deferred_sync`` the file (and, the first
        time, its directory) joins the current batch; outside, they are synced now. A checkpoint
        may name ``length`` only after that."""
        fd = self._open_fd()
        batch = current_batch()
        if batch is not None:
            batch.add_path(self.path)  # the batch opens a descriptor of its own: close() may follow
        else:
            os.fdatasync(fd)
        if not self._name_synced:
            # a new file's name must survive a power loss too (the batch syncs directories after
            # files); fsync_dir joins the batch by itself when there is one
            fsync_dir(self.directory)
            self._name_synced = True

    def close(self) -> None:
        """Release the descriptor (twice is harmless). Syncs nothing: see ``note_sync``."""
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)

    def unlink(self) -> None:
        """Close and delete the file (gone already is fine). The directory is not synced: a
        journal nothing names any more that reappears after a power loss is deleted at open."""
        self.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    def _open_fd(self) -> int:
        if self._fd < 0:
            raise ValueError(f"{self.path}: journal writer is closed")
        return self._fd


def _create(path: Path) -> int:
    try:
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        # a leftover from a crash after its creation and before a checkpoint named it (module
        # docstring): nothing in it is needed, rewrite it from the start
        log.info("store.journal_leftover", path=str(path), size=path.stat().st_size)
        return os.open(path, os.O_WRONLY | os.O_TRUNC)


def _pwrite_all(fd: int, parts: list[bytes | memoryview], offset: int) -> None:
    """Write ``parts`` back to back at ``offset``; a short write (a signal, a full disk that a
    retry then reports as ENOSPC) is continued, not left as a hole."""
    total = sum(memoryview(p).nbytes for p in parts)
    done = os.pwritev(fd, parts, offset)
    if done == total:
        return
    rest = memoryview(b"".join(parts))[done:]
    while rest:
        wrote = os.pwrite(fd, rest, offset + done)
        done += wrote
        rest = rest[wrote:]


def read(directory: Path, g: int, length: int) -> bytes:
    """The payloads of every block in the first ``length`` bytes (the length a checkpoint names),
    concatenated. The header must be generation ``g``'s, and the blocks must be whole, CRC-valid
    and end exactly at ``length``, else ``StoreError`` naming the file and the offset (that data
    was synced). Bytes past ``length`` are not read; the file is not modified (``truncate``)."""
    path = path_of(directory, g)
    if length < HEADER_SIZE:
        raise StoreError(f"{path}: the checkpoint names {length} bytes, less than the {HEADER_SIZE}-byte header")
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        raise StoreError(f"{path}: missing, but the checkpoint names {length} bytes of it") from None
    try:
        size = os.fstat(fd).st_size
        if size < length:
            raise StoreError(
                f"{path}: {size} bytes, but the checkpoint names {length}: journal data synced before it is lost"
            )
        data = _pread_all(fd, path, length)
    finally:
        os.close(fd)
    _check_header(path, data, g)
    parts, end, problem = _blocks(data)
    if end != length:
        raise StoreError(f"{path}: {problem} at offset {end}, within the checkpointed length {length}")
    return b"".join(parts)


def truncate(directory: Path, g: int, length: int) -> None:
    """Cut generation ``g``'s journal to ``length`` bytes, the length the checkpoint names: what
    follows was written after it (and the replay journals it again). Not synced: see
    ``JournalWriter.resume``, which does this itself."""
    path = path_of(directory, g)
    fd = os.open(path, os.O_WRONLY)
    try:
        _cut(fd, path, length)
    finally:
        os.close(fd)


def _cut(fd: int, path: Path, length: int) -> None:
    size = os.fstat(fd).st_size
    if length < HEADER_SIZE or length > size:
        raise StoreError(f"{path}: cannot cut the journal to {length} bytes: it has {size}"
                         f" (and a header of {HEADER_SIZE})")
    if size > length:
        os.ftruncate(fd, length)


def scan(directory: Path, g: int) -> tuple[bytes, int]:
    """For the offline inspector: the payloads of every whole, CRC-valid block from the start, up
    to the first torn or invalid one, and the length they end at (the header included, comparable
    with a checkpoint's). A bad header is a ``StoreError``. The file is not modified."""
    path = path_of(directory, g)
    with open(path, "rb") as f:
        data = f.read()
    _check_header(path, data, g)
    parts, end, _problem = _blocks(data)
    return b"".join(parts), end


def remove(directory: Path, g: int) -> None:
    """Delete generation ``g``'s journal (gone already is fine; inside ``deferred_disposal``, on
    the disposal's thread: ``mapped.remove_file``)."""
    remove_file(path_of(directory, g))


def _pread_all(fd: int, path: Path, length: int) -> bytes:
    chunks: list[bytes] = []
    done = 0
    while done < length:
        chunk = os.pread(fd, min(length - done, _READ_CHUNK), done)
        if not chunk:
            raise StoreError(f"{path}: short read at offset {done} of {length}")
        chunks.append(chunk)
        done += len(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _check_header(path: Path, data: bytes, g: int) -> None:
    """Refuse a file whose header is not generation ``g``'s journal header, as ``MappedFile._check``
    does for the mapped files: CRC, magic, version, geometry, then the generation against the name."""
    if len(data) < HEADER_SIZE:
        raise StoreError(f"{path}: {len(data)} bytes, shorter than the {HEADER_SIZE}-byte file header")
    magic, ver, hsize, ga, gb, base, _r, crc = HEADER.unpack_from(data, 0)
    if crc32c(data[:60]) != crc:
        raise StoreError(f"{path}: file header is corrupt (CRC mismatch)")
    if magic != MAGIC:
        raise StoreError(f"{path}: not a {MAGIC!r} file (magic {magic!r})")
    if ver != VERSION or hsize != HEADER_SIZE:
        raise GeometryMismatch(f"{path}: format version {ver}, this build reads {VERSION}")
    if ga != RECORD_SIZE:
        raise GeometryMismatch(f"{path}: record size {ga}, this build's records are {RECORD_SIZE} bytes")
    if gb != g:
        raise StoreError(f"{path}: generation {gb} does not match its name ({g})")
    if base != 0:
        raise StoreError(f"{path}: base {base}, a journal's is 0")


def _blocks(data: bytes) -> tuple[list[memoryview], int, str]:
    """Walk the blocks after the header: the payloads of the whole, CRC-valid ones, the offset the
    walk stopped at, and why it stopped there ("" at the end of ``data``)."""
    view = memoryview(data)
    parts: list[memoryview] = []
    off, end = HEADER_SIZE, len(data)
    while off < end:
        if end - off < BLOCK.size:
            return parts, off, "torn block header"
        n, crc = BLOCK.unpack_from(view, off)
        if n == 0 or n % RECORD_SIZE:
            return parts, off, f"invalid block length {n}"
        start = off + BLOCK.size
        if n > end - start:
            return parts, off, f"torn block ({n} bytes, {end - start} present)"
        payload = view[start:start + n]
        if crc32c(payload) != crc:
            return parts, off, "corrupt block (CRC mismatch)"
        parts.append(payload)
        off = start + n
    return parts, off, ""
