"""librdkafka's error codes that the engine acts on, by name, without importing the client.

Why a table: the retry policy and the engine's modules other than ``engine/kafka_io.py`` work on
``KafkaErrorLike`` objects (a delivery report's error, a consume error) and must not depend on
confluent-kafka to know what a code means. These numbers are librdkafka's ``rd_kafka_resp_err_t``
values (negative: local errors; positive: the Kafka protocol's), stable across releases;
``tests/unit/test_publish_errors.py`` checks every entry against the installed ``confluent_kafka.KafkaError``.
"""

from __future__ import annotations

CODES: dict[str, int] = {
    '_UNKNOWN_TOPIC': -188,
    'UNKNOWN_TOPIC_OR_PART': 3,
    '_UNKNOWN_PARTITION': -190,
    'MSG_SIZE_TOO_LARGE': 10,
    'INVALID_MSG_SIZE': 4,
    'RECORD_LIST_TOO_LARGE': 18,
    'INVALID_RECORD': 87,
    'INVALID_TIMESTAMP': 32,
    'POLICY_VIOLATION': 44,
    'UNSUPPORTED_FOR_MESSAGE_FORMAT': 43,
    'TOPIC_AUTHORIZATION_FAILED': 29,
    'CLUSTER_AUTHORIZATION_FAILED': 31,
    'TRANSACTIONAL_ID_AUTHORIZATION_FAILED': 53,
    'TOPIC_EXCEPTION': 17,
    '_INVALID_ARG': -186,
    '_BAD_MSG': -199,
    '_INVALID_TYPE': -154,
    '_KEY_SERIALIZATION': -162,
    '_VALUE_SERIALIZATION': -161,
    '_MSG_TIMED_OUT': -192,
    '_TIMED_OUT': -185,
    '_TIMED_OUT_QUEUE': -166,
    'REQUEST_TIMED_OUT': 7,
    '_TRANSPORT': -195,
    '_ALL_BROKERS_DOWN': -187,
    '_FAIL': -196,
    '_RESOLVE': -193,
    'NETWORK_EXCEPTION': 13,
    'BROKER_NOT_AVAILABLE': 8,
    '_AUTHENTICATION': -169,
    'SASL_AUTHENTICATION_FAILED': 58,
    '_SSL': -181,
    'LEADER_NOT_AVAILABLE': 5,
    'NOT_LEADER_FOR_PARTITION': 6,
    'FENCED_LEADER_EPOCH': 74,
    'UNKNOWN_LEADER_EPOCH': 75,
    'REPLICA_NOT_AVAILABLE': 9,
    'NOT_ENOUGH_REPLICAS': 19,
    'NOT_ENOUGH_REPLICAS_AFTER_APPEND': 20,
    '_ISR_INSUFF': -183,
    'KAFKA_STORAGE_ERROR': 56,
    'NOT_CONTROLLER': 41,
    'THROTTLING_QUOTA_EXCEEDED': 89,
    '_QUEUE_FULL': -184,
    '_WAIT_CACHE': -164,
    '_PURGE_QUEUE': -152,
    '_PURGE_INFLIGHT': -151,
    '_DESTROY': -197,
    '_FATAL': -150,
    '_FENCED': -144,
    'OUT_OF_ORDER_SEQUENCE_NUMBER': 45,
    'DUPLICATE_SEQUENCE_NUMBER': 46,
    'UNKNOWN_PRODUCER_ID': 59,
    'INVALID_PRODUCER_EPOCH': 47,
    'PRODUCER_FENCED': 90,
    '_INCONSISTENT': -149,
    '_GAPLESS_GUARANTEE': -148,
    '_PARTITION_EOF': -191,
    'TOPIC_ALREADY_EXISTS': 36,
}

PARTITION_EOF = CODES["_PARTITION_EOF"]
FATAL = CODES["_FATAL"]
TRANSPORT = CODES["_TRANSPORT"]
ALL_BROKERS_DOWN = CODES["_ALL_BROKERS_DOWN"]
MSG_TIMED_OUT = CODES["_MSG_TIMED_OUT"]
TOPIC_ALREADY_EXISTS = CODES["TOPIC_ALREADY_EXISTS"]
