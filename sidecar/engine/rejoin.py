"""A consumer that lost its partitions and never rejoins the group: noticed, and replaced.

After ``partitions.lost`` (its session expired, e.g. in a broker outage) librdkafka rejoins the
group by itself, and every rebalance it completes calls the assign callback, with an empty list
when the member gets nothing (the cooperative protocol; checked against the broker). A static
member (``group.instance.id``) can instead hang: no assignment and no fatal error, ever
(librdkafka issue 3437; CI, 2026-12-07: 90 s of neither after a 12 s outage, while the broker was
back). The sidecar then owns no partition for good and only its ``/readyz`` says so.

The watch (:class:`RejoinWatch`, no clock inside: the loop passes its monotonic time):

1. armed when partitions are lost and when a consumer is replaced; disarmed by the next assign
   callback (empty or not);
2. armed for ``limit_s`` (``REJOIN_SESSIONS`` session timeouts, at least ``REJOIN_MIN_S``): the
   cluster is asked whether it answers (``KafkaIO.cluster_answers``: a metadata request of the
   admin client, at most ``ASK_TIMEOUT_S``; not the stuck consumer's own handle, and not the
   admin API's group description: a first version of this module's live test asked with it, and
   librdkafka 2.16.0 aborted the process in two runs of three when the broker stopped
   (``rd_kafka_enq_once_del_source_return``: an assertion);
3. an answer: the consumer gets another ``limit_s``, and if the cluster answers again at its end
   with still no assignment, the consumer is declared dead. The loop then replaces it as it does
   after a fatal error (``Sidecar._replace_consumer``): the new consumer joins under the same
   instance id, which the coordinator lets take the old member's place at once. No answer (the
   broker is down) starts step 2 again: an outage is a reason not to rejoin, not a hang.

Two answers ``limit_s`` apart, rather than one, because the first may come just after the broker
returned: the consumer then had no time to rejoin. What a false alarm costs is one more join under
the same instance id, with no partitions to hand over (they were lost already); the question
blocks the loop for up to ``ASK_TIMEOUT_S``, at a time it owns no partition.
"""

from __future__ import annotations

from collections.abc import Callable

REJOIN_SESSIONS = 2  # how many session timeouts a rejoin may take once the cluster answers
REJOIN_MIN_S = 20.0
DEFAULT_SESSION_MS = 45_000  # librdkafka's session.timeout.ms
ASK_TIMEOUT_S = 2.0  # the question's wait for a broker


def rejoin_limit_s(kafka: dict[str, str]) -> float:
    """The wait before each question to the cluster, from the consumer's session timeout."""
    try:
        session_ms = int(kafka.get("session.timeout.ms", DEFAULT_SESSION_MS))
    except ValueError:  # librdkafka refuses it when the consumer is made, naming the property
        session_ms = DEFAULT_SESSION_MS
    return max(REJOIN_MIN_S, REJOIN_SESSIONS * session_ms / 1000)


class RejoinWatch:
    """Armed while the consumer holds no assignment it was told of (module docstring)."""

    __slots__ = ("answers", "armed", "limit_s", "since")

    def __init__(self, limit_s: float) -> None:
        self.limit_s = limit_s
        self.armed = False
        self.since = 0.0  # when the current wait began
        self.answers = 0  # the cluster's answers since the watch was armed

    def lost(self, now: float) -> None:
        """Partitions were lost, or a new consumer joins: an assignment must follow."""
        self.armed, self.since, self.answers = True, now, 0

    def assigned(self) -> None:
        """An assign callback: the consumer is in the group."""
        self.armed = False

    def step(self, now: float, answers: Callable[[], bool]) -> str:
        """Called now and then by the loop. When a wait is over, asks whether the cluster
        ``answers``; returns why the consumer is dead, or "" while it may still rejoin."""
        if not self.armed or now - self.since < self.limit_s:
            return ""
        self.since = now
        if not answers():
            self.answers = 0  # the cluster is unreachable: wait again
            return ""
        self.answers += 1
        if self.answers < 2:
            return ""
        self.armed = False
        return (
            f"no assignment since partitions were lost or the consumer joined, and the cluster "
            f"answered twice {round(self.limit_s)} s apart (at least {round(2 * self.limit_s)} s): "
            f"a consumer stuck outside its group (librdkafka issue 3437)"
        )
