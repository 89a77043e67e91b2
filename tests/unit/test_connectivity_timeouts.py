"""The start-up probe's admin futures that time out mean "no answer now", never a crash.

A sidecar started on a just-started broker on a loaded machine died at start-up: a group's
describe future raised ``concurrent.futures.TimeoutError`` (the builtin ``TimeoutError`` since
Python 3.11), which the probe did not catch. These call the probe's steps with an admin whose
futures never complete in time."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

from sidecar import connectivity


class _SlowAdmin:
    """An admin client whose every request's future is still pending."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def _pending(self, names: Any) -> dict[str, Future[Any]]:
        return {n: Future() for n in names}

    def describe_topics(self, topics: Any, **_: Any) -> dict[str, Future[Any]]:
        self.asked.append("describe_topics")
        return self._pending(topics.topic_names)

    def create_topics(self, new: list[Any], **_: Any) -> dict[str, Future[Any]]:
        self.asked.append("create_topics")
        return self._pending([t.topic for t in new])


def test_a_topic_whose_description_times_out_is_not_called_refused() -> None:
    admin = _SlowAdmin()
    assert connectivity.refused(admin, "Write", "t", 0.01, {}) is None
    assert admin.asked == ["describe_topics"]


def test_a_create_check_that_times_out_is_not_called_refused() -> None:
    admin = _SlowAdmin()
    assert connectivity._can_create(admin, ["a", "b"], 0.01) is None
    assert admin.asked == ["create_topics"]
