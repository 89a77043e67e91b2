"""Benchmarks (GitHub issue 8): ``delay-sidecar bench SCENARIO [--size small|full] --json OUT``.

Every scenario runs against a real broker (a :class:`devkafka.local.LocalKafka` the bench
starts itself, or ``--bootstrap-servers``), runs the sidecar exactly as an operator would
(``python -m sidecar run ...`` as a subprocess), reads what it delivered with plain
confluent-kafka clients, and runs its own baseline in the same invocation, so every figure comes
with the ratio it is judged by; the exception is ``append`` (issue 3), which measures the store's
append throughput in-process, with no broker and no sidecar process. See docs/benchmarks.md for
the method of each scenario.
"""
