"""Recurring schedules (``delay.cron``, ``delay.every``): the pure policy core.

No clock inside: every time is an argument, in epoch ms UTC. One job per module:

- ``zones``: time zones from the pinned ``tzdata`` package (never the host's), and their offset
  transitions;
- ``cronexpr``: cron syntax, validation, the DST class of an expression, wall-clock matching
  (cronsim);
- ``spec``: a record's headers -> a frozen ``Schedule`` or a ``Rejection`` with a stable reason;
- ``timeline``: ``next_fire``, the next nominal firing time, with the DST rules;
- ``misfire``: ``catch_up``, what fires after downtime or a backlog (``fire-once`` / ``skip``).

The rules and the choice of library: docs/design.md, "Recurring schedules: rules and library".
"""
