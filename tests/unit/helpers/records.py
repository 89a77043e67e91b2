"""Stored records and header lists as hypothesis strategies (``records``: the fields of a commit-log
record, every type and size at its limits; ``HEADERS``: Kafka header lists, null values included),
and ``parse_rules``: the ingress rules the header parsers are tested with.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from sidecar.headers import Rules
from sidecar.store import codec
from sidecar.store.partition import compile_rules

I64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
I32 = st.integers(min_value=-(2**31), max_value=2**31 - 1)
U16 = st.integers(min_value=0, max_value=2**16 - 1)
HEADERS = st.lists(
    st.tuples(st.text(max_size=20), st.one_of(st.none(), st.binary(max_size=40))), max_size=6
)


@st.composite
def records(draw: st.DrawFn) -> dict[str, Any]:
    return {
        "rtype": draw(st.sampled_from([codec.MESSAGE, codec.CANCEL, codec.DEAD])),
        "due_ms": draw(I64),
        "enqueue_ms": draw(I64),
        "src_offset": draw(I64),
        "src_partition": draw(I32),
        "target_partition": draw(I32),
        "retry_count": draw(U16),
        "level": draw(U16),
        "rid": draw(st.binary(max_size=255)),
        "topic": draw(st.binary(max_size=249)),
        "key": draw(st.one_of(st.none(), st.binary(max_size=200))),
        "value": draw(st.one_of(st.none(), st.binary(max_size=600))),
        "headers": draw(HEADERS),
    }


def parse_rules(max_record_bytes: int = 1 << 20) -> Rules:
    rules = compile_rules("in", "dlq", (1000, 5000), 86_400_000, (1000, 2000), 3, max_record_bytes, ())
    rules.checked_targets.update({"out", "other"})  # accepted earlier by the full parser
    return rules
