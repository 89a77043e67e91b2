"""Who this sidecar is: one process per data directory, and a group membership that outlives
restarts.

**Lock**: ``<data-dir>/.lock`` is held with ``flock`` for the process's life. Two processes on one
data directory would each append to the same commit logs: the second is refused at start with
the holder's pid. The kernel drops the lock when the process dies, however it dies.

**Stable identity**: without ``group-instance-id`` the sidecar makes one on first start
(``<hostname>-<8 hex>``) and keeps it in ``<data-dir>/instance-id``. Identity and store move
together: a restarted sidecar rejoins the group as the same static member and gets its
partitions (and its local stores) back at once, instead of waiting for its old member's session
to time out and for a rebalance.
"""

from __future__ import annotations

import fcntl
import os
import re
import socket
import uuid
from pathlib import Path
from typing import IO

from sidecar.config import ConfigError

LOCK_FILE = ".lock"
ID_FILE = "instance-id"
_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


class DataDirLock:
    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / LOCK_FILE
        self._f: IO[str] | None = None

    def acquire(self) -> None:
        f = open(self.path, "a+")  # noqa: SIM115 - held for the process's life
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "unknown"
            f.close()
            raise ConfigError(
                f"data directory {self.path.parent} is in use by another sidecar (pid {holder}); "
                "give each sidecar its own --data-dir"
            ) from None
        f.seek(0)
        f.truncate()
        f.write(str(os.getpid()))
        f.flush()
        self._f = f

    def release(self) -> None:
        if self._f is not None:
            fcntl.flock(self._f.fileno(), fcntl.LOCK_UN)
            self._f.close()
            self._f = None


def instance_id(data_dir: Path) -> str:
    """The instance id kept in the data directory, made on first use."""
    path = data_dir / ID_FILE
    try:
        found = path.read_text().strip()
        if found:
            return found
    except FileNotFoundError:
        pass
    made = f"{_SAFE.sub('-', socket.gethostname())[:40]}-{uuid.uuid4().hex[:8]}"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(made + "\n")
    os.replace(tmp, path)
    return made
