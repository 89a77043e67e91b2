"""Which producer the engine gets (engine/native_client.py): the ``producer`` setting's three values,
and the librdkafka the native one binds to, found in the process's mappings."""

from __future__ import annotations

from pathlib import Path

import pytest

from sidecar.engine import native_client
from sidecar.engine.kafka_io import ConfluentClients
from sidecar.engine.native_client import NativeClients, NativeUnavailable, clients_for, librdkafka_path
from sidecar.store.codec import NATIVE


def test_the_library_is_found_in_the_mappings(tmp_path: Path) -> None:
    maps = tmp_path / "maps"
    maps.write_text(
        "7f00-7f01 r-xp 00000000 fd:01 1 /usr/lib/x86_64-linux-gnu/libc.so.6\n"
        "7f02-7f03 rw-p 00000000 00:00 0 \n"
        "7f04-7f05 r-xp 00000000 fd:01 2 /v/site-packages/confluent_kafka.libs/librdkafka-0cb94173.so.1\n"
    )
    assert librdkafka_path(str(maps)) == "/v/site-packages/confluent_kafka.libs/librdkafka-0cb94173.so.1"
    maps.write_text("7f00-7f01 r-xp 00000000 fd:01 1 /usr/lib/x86_64-linux-gnu/libc.so.6\n")
    assert librdkafka_path(str(maps)) is None


def test_confluent_and_exactly_once_get_confluent_kafkas_producer() -> None:
    assert type(clients_for("confluent")) is ConfluentClients
    assert type(clients_for("auto", exactly_once=True)) is ConfluentClients


@pytest.mark.skipif(not NATIVE, reason="the C extension is not built")
def test_auto_and_native_get_the_native_one_where_it_runs() -> None:
    assert type(clients_for("auto")) is NativeClients
    assert type(clients_for("native")) is NativeClients
    assert native_client.bind() >= 0x010500FF  # librdkafka's version: 1.5.0 at least


def test_auto_falls_back_and_native_refuses_where_it_cannot_run(monkeypatch: pytest.MonkeyPatch) -> None:
    def unavailable() -> int:
        raise NativeUnavailable("--producer native: no librdkafka is mapped into this process")

    monkeypatch.setattr(native_client, "bind", unavailable)
    assert type(clients_for("auto")) is ConfluentClients
    with pytest.raises(NativeUnavailable, match="no librdkafka"):
        clients_for("native")
