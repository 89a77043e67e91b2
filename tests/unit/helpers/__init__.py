"""What the unit tests share: the Kafka twin's world, stores set up for a test, stand-ins for
consumed messages, hypothesis strategies, probes of resident pages. A test file imports these from
here (never from another test file); fixtures shared by many files are in ``tests/unit/conftest.py``.
"""
