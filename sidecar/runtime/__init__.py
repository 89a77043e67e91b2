"""How the process runs, below the store and the engine: the scheduling policy of helper threads
(``threads``) and giving freed heap back to the OS (``heap``).

Both the store (the id index's merge threads, the page thread) and the engine (the flusher, the
loop's demotion of librdkafka's threads) need these, so they live here, under both: the store
never imports the engine (``tests/unit/test_layers.py``).
"""
