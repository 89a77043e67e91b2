"""The id index's slot and journal-record layout, shared by the index (idindex.py), its merge pass
(idmerge.py) and the offline inspector.

A slot is 16 bytes, little-endian: ``u64 hash`` (``EMPTY`` 0, ``TOMB`` 1, else an id's 64-bit
digest forced >= 2), ``u64 ref``. A ref with ``PRECANCEL`` (the top bit) set is a pre-cancel whose
low bits are its time (epoch ms). A journal record has the slot's layout; ``REMOVE`` set in its
ref makes it a remove of the pair (scheduler refs and pre-cancel times stay below 2^62).
"""

import struct

SLOT = struct.Struct("<QQ")
SLOT_SIZE = SLOT.size
EMPTY, TOMB = 0, 1
PRECANCEL = 1 << 63
REMOVE = 1 << 62
