"""``sidecar/dlq.py`` without a broker: time and reason flags, the redriven-interval bookkeeping,
and the records a dead letter turns back into (the broker side is tests/integration/test_dlq_redrive.py)."""

from __future__ import annotations

import random

import pytest

from sidecar import cli, dlq
from sidecar import contract as c
from sidecar.store.outcomes import dlq_headers

NOW = 1_800_000_000_000


def test_times_take_epoch_ms_iso_and_durations_before_now() -> None:
    assert dlq.parse_time("1767225600000", "--since", NOW) == 1_767_225_600_000
    assert dlq.parse_time("2026-01-01T00:00:00Z", "--since", NOW) == 1_767_225_600_000
    assert dlq.parse_time("2026-01-01T01:00:00+01:00", "--until", NOW) == 1_767_225_600_000
    assert dlq.parse_time("2h", "--since", NOW) == NOW - 7_200_000
    assert dlq.parse_time(" 30m ", "--since", NOW) == NOW - 1_800_000


@pytest.mark.parametrize("text", ["yesterday", "2026-01-01T00:00:00", "2 h", "1.5h", "-5s", ""])
def test_bad_times_name_the_flag_and_the_forms(text: str) -> None:
    with pytest.raises(dlq.DlqInputError) as e:
        dlq.parse_time(text, "--until", NOW)
    msg = str(e.value)
    assert msg.startswith("bad value for --until:") and "ISO-8601" in msg and "duration before now" in msg


def test_reasons_are_contract_codes() -> None:
    assert dlq.parse_reasons(["delivery-failed", "bad-header,too-large", "bad-header"]) == (
        "delivery-failed", "bad-header", "too-large")
    with pytest.raises(dlq.DlqInputError, match="--reason: 'late' is not a reason code; choose from bad-header"):
        dlq.parse_reasons(["late"])
    with pytest.raises(dlq.DlqInputError, match="--reason is required"):
        dlq.parse_reasons([" , "])


def test_intervals_match_a_set_model() -> None:
    rng = random.Random(24)
    for _ in range(200):
        iv, model = dlq.Intervals(), set()
        for _ in range(rng.randrange(1, 12)):
            a = rng.randrange(0, 60)
            b = a + rng.randrange(0, 15)
            iv.add(a, b)
            model.update(range(a, b))
        assert [o for o in range(80) if o in iv] == sorted(model)
        assert iv.count() == len(model)
        assert all(e < s for e, s in zip(iv.ends, iv.starts[1:], strict=False)), "disjoint, not touching"


def test_add_except_leaves_the_holes_out() -> None:
    iv = dlq.Intervals()
    dlq.add_except(iv, 10, 20, [9, 12, 13, 19, 25])
    assert iv.pairs() == [[10, 12], [14, 19]]
    again = dlq.Intervals()
    dlq.add_except(again, 0, 3, [0, 1, 2])
    assert again.pairs() == []


def test_marker_value_round_trip_and_version_check() -> None:
    iv = dlq.Intervals()
    iv.add(5, 9)
    raw = dlq.marker_value("d", 2, {"bad-header": iv, "too-large": dlq.Intervals()}, NOW)
    p, marker = dlq.read_marker_value(raw)
    assert p == 2 and list(marker) == ["bad-header"] and marker["bad-header"].pairs() == [[5, 9]]
    with pytest.raises(dlq.DlqFailed, match="format 2"):
        dlq.read_marker_value(b'{"v": 2, "done": {}}')


def _failed_publish_letter(**extra: bytes) -> list[tuple[str, bytes | None]]:
    """What PartitionStore.dead_letter writes for a failed publish (see test_partition_store)."""
    original: list[tuple[str, bytes | None]] = [
        ("app", b"kept"), (c.ID, b"order-7"), (c.TARGET_TOPIC, b"orders"), *extra.items(),
        (c.DELIVER_AT, b"1700000000000"), (c.ENQUEUED_AT, b"1699999990000")]
    return dlq_headers(original, c.DELIVERY_FAILED, "gone", "delay.ingress", 2, 41, 5)


def test_to_target_restores_the_delivery_headers() -> None:
    out = dlq.to_target(_failed_publish_letter(**{c.TARGET_PARTITION: b"1"}), b"k", b"delay.dlq:0:3")
    assert isinstance(out, dlq.Outgoing)
    assert (out.topic, out.partition, out.key) == ("orders", 1, b"k")
    assert out.headers == [
        ("app", b"kept"), (c.ID, b"order-7"), (c.DELIVER_AT, b"1700000000000"), (c.ENQUEUED_AT, b"1699999990000"),
        (c.SOURCE, b"delay.ingress:2:41"), (c.REDRIVE_ID, b"delay.dlq:0:3")]


def test_a_recurring_firing_redriven_to_its_target_keeps_its_firing_headers() -> None:
    """A failed firing's dead letter (store/outcomes.py): redriven to the target it arrives as it
    would have been delivered, with delay.fire-time / fire-seq / next-at, so consumers deduplicate
    it on (delay.id, delay.fire-time) like any firing."""
    letter = dlq_headers([
        ("app", b"kept"), (c.FIRE_TIME, b"1700000060000"), (c.FIRE_SEQ, b"2"), (c.NEXT_AT, b"1700000120000"),
        (c.ID, b"every-min"), (c.TARGET_TOPIC, b"orders"), (c.DELIVER_AT, b"1700000060000"),
        (c.ENQUEUED_AT, b"1699999990000")], c.DELIVERY_FAILED, "gone", "delay.ingress", 0, 7, 1)
    out = dlq.to_target(letter, b"k", b"delay.dlq:0:9")
    assert isinstance(out, dlq.Outgoing) and out.topic == "orders"
    assert out.headers == [
        ("app", b"kept"), (c.ID, b"every-min"), (c.DELIVER_AT, b"1700000060000"), (c.ENQUEUED_AT, b"1699999990000"),
        (c.FIRE_TIME, b"1700000060000"), (c.FIRE_SEQ, b"2"), (c.NEXT_AT, b"1700000120000"),
        (c.SOURCE, b"delay.ingress:0:7"), (c.REDRIVE_ID, b"delay.dlq:0:9")]


def test_to_target_of_bad_input_uses_the_default_id_and_skips_what_has_no_target() -> None:
    bad = dlq_headers([(c.TARGET_TOPIC, b"t"), (c.DELAY_MS, b"soon"), (c.REDRIVE_ID, b"old")], c.BAD_HEADER, "x",
                      "in", 0, 9, 0)
    out = dlq.to_target(bad, None, b"r")
    assert isinstance(out, dlq.Outgoing)
    assert dict(out.headers)[c.ID] == b"in:0:9" and dict(out.headers)[c.REDRIVE_ID] == b"r"
    assert c.DELAY_MS not in dict(out.headers)
    none = dlq_headers([(c.DELAY_MS, b"5")], c.MISSING_TARGET, "x", "in", 0, 9, 0)
    assert dlq.to_target(none, None, b"r") == "no target topic"


def test_to_ingress_strips_the_dlq_headers_and_keeps_the_control_ones() -> None:
    letter = _failed_publish_letter()
    out = dlq.to_ingress(letter, b"k", b"d:1:2", "delay.ingress", 6, None)
    assert (out.topic, out.partition) == ("delay.ingress", 2)  # the source partition: the key's order holds
    assert [n for n, _v in out.headers] == ["app", c.ID, c.TARGET_TOPIC, c.DELIVER_AT, c.ENQUEUED_AT, c.REDRIVE_ID]
    delayed = dlq.to_ingress(letter, b"k", b"d:1:2", "other.ingress", 6, 5000)
    assert delayed.partition == -1  # another ingress topic: its own partitioner
    h = dict(delayed.headers)
    assert h[c.DELAY_MS] == b"5000" and c.DELIVER_AT not in h and not any(
        n.startswith(c.DLQ_PREFIX) for n in h)


def test_cli_refuses_bad_flags_before_connecting(capsys: pytest.CaptureFixture[str]) -> None:
    cases = {
        ("--reason", "nope", "--to", "target"): "--reason: 'nope' is not a reason code",
        ("--reason", "bad-header", "--to", "dlq"): "--to: 'dlq'; choose ingress or target",
        ("--reason", "bad-header", "--to", "target", "--delay", "5s"): "--delay applies to --to ingress only",
        ("--reason", "bad-header", "--to", "ingress", "--delay", "5"): "--delay: '5' has no unit",
        ("--reason", "bad-header", "--to", "ingress", "--delay", "-5s"): "--delay: '-5s' is negative",
        ("--reason", "bad-header", "--to", "ingress", "--ingress-topic", "d", "--dlq-topic", "d"):
            "refusing to redrive into the DLQ itself",
        ("--reason", "bad-header", "--to", "target", "--since", "2h", "--until", "3h"): "--until: '3h' is not after",
        ("--reason", "bad-header", "--to", "target", "--batch", "0"): "--batch: '0' is below 1",
    }
    for args, expected in cases.items():
        assert cli.main(["dlq", "redrive", *args]) == 2, args
        assert expected in capsys.readouterr().err, args
    assert cli.main(["dlq", "list", "--bucket", "1"]) == 2
    assert "--bucket: '1' has no unit" in capsys.readouterr().err
