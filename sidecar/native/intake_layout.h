/* Generated from sidecar/store/intake_layout.py (python -m sidecar.store.intake_layout): do not
 * edit. The intake state's layout (ingest_run's st, intake.c); that module says what it is. */
#ifndef KDS_INTAKE_LAYOUT_H
#define KDS_INTAKE_LAYOUT_H

/* Common. Fields every call uses, from index 0. */
#define IN_KIND 0 /* which scheduler part follows: IN_KIND_WHEEL or IN_KIND_LEVELS */
#define IN_HEAD 1 /* commit-log head, the next append position (moved by the loop) */
#define IN_SEG_BYTES 2 /* commit-log segment size */
#define IN_HEADER_SIZE 3 /* mapped-file header size: the first record, slot or entry of every file */
#define IN_NEXT_OFFSET 4 /* ingress offset after the last record stored (-1 before the first) */
#define IN_MAX_RECORD_BYTES 5 /* Rules.max_record_bytes */
#define IN_MAX_DELAY_MS 6 /* Rules.max_delay_ms */
#define IN_IDX_MASK 7 /* id index: capacity - 1 */
#define IN_IDX_LIVE 8 /* id index: live slots (moved by the loop) */
#define IN_IDX_TOMBS 9 /* id index: tombstone slots (moved by the loop) */
#define IN_IDX_OLD_MASK 10 /* id index: a table probed for presence only, capacity - 1 (-1: none) */
#define IN_RESTORED_BYTES 11 /* restore_run: bytes of the changelog values it stored (moved by the loop) */
#define IN_MAX_SRC_OFFSET 12 /* restore_run: highest source offset of the records it stored (-1: none) */
#define IN_IDX_OLD2_MASK 13 /* id index: a second table probed for presence only, capacity - 1 (-1: none) */
#define IN_IDX_JNL_AT 14 /* id index: bytes of the journal buffer used (moved by the loop; -1: no journal) */
#define IN_IDX_RESIDENT 15 /* id index: 1: stop at a slot to read whose table page is not in memory */
#define IN_IDX_WAIT 16 /* id index: the table slot it stopped for, its page not in memory (-1: none) */
#define IN_SCHED_AT 17 /* first index of the scheduler's part */

/* Kind. Values of ``Common.KIND``. */
#define IN_KIND_WHEEL 0 /* the wheel's part follows */
#define IN_KIND_LEVELS 1 /* the levels' part follows */

/* Wheel. The wheel's part (sidecar/wheel/scheduler.py, ``intake_begin`` / ``intake_end``). */
#define IN_W_P 17 /* precision: ms per slot */
#define IN_W_N 18 /* slots in the ring */
#define IN_W_LATE_BELOW 19 /* slot numbers below this are already due: the late chain */
#define IN_W_S_K 20 /* reader's slot number */
#define IN_W_S_O 21 /* reader's offset within its slot (-1: none) */
#define IN_W_GUARD 22 /* ring guard: slot numbers from GUARD + N go to a bucket */
#define IN_W_HEAD 23 /* next timer-log entry index (moved by the loop) */
#define IN_W_PER_FILE 24 /* timer-log entries per file */
#define IN_W_F0 25 /* first entry of the head's timer-log file (-1: not mapped) */
#define IN_W_APP_LO 26 /* timer log: appended range start (-1: none; moved by the loop) */
#define IN_W_APP_HI 27 /* timer log: appended range end (moved by the loop) */
#define IN_W_SLOT_DIRTY_LO 28 /* slot file: dirty byte range start (-1: none; moved by the loop) */
#define IN_W_SLOT_DIRTY_HI 29 /* slot file: dirty byte range end (moved by the loop) */
#define IN_W_MARK_LO 30 /* timer log: patched old tails, byte range start (-1: none; set by the loop) */
#define IN_W_MARK_HI 31 /* timer log: patched old tails, byte range end (set by the loop) */
#define IN_W_WIDTH 32 /* bucket width, ms */
#define IN_W_LATE_HEAD 33 /* late chain's first entry (-1: empty; moved by the loop) */
#define IN_W_LATE_TAIL 34 /* late chain's last entry (-1: empty; moved by the loop) */
#define IN_W_NEW_CHAINS 35 /* slot chains the loop started (occ_send flags set): the search memo is stale */
#define IN_W_SIZE 36 /* length of the array with the wheel's part */

/* Levels. The levels' header (sidecar/levels/scheduler.py, ``intake_begin`` / ``intake_end``). */
#define IN_L_COUNT 17 /* levels, level 0 (no delay) included */
#define IN_L_PER_FILE 18 /* queue entries per file */
#define IN_L_BASE 25 /* first index of level 0's block */
#define IN_L_STRIDE 5 /* values per level */

/* Level. One level's block: offsets from ``level_at(n)``. */
#define IN_LV_WRITE 0 /* next queue index (moved by the loop) */
#define IN_LV_FIRST 1 /* first index of the queue file holding WRITE (-1: not created yet) */
#define IN_LV_DIRTY_FROM 2 /* queue dirty range start (-1: none; moved by the loop) */
#define IN_LV_DIRTY_TO 3 /* queue dirty range end (moved by the loop) */
#define IN_LV_DELAY_MS 4 /* the level's delay (0 for level 0) */

/* every name above, for X-macros (the module's INTAKE_LAYOUT dict) */
#define KDS_INTAKE_LAYOUT(X) \
    X(IN_KIND) \
    X(IN_HEAD) \
    X(IN_SEG_BYTES) \
    X(IN_HEADER_SIZE) \
    X(IN_NEXT_OFFSET) \
    X(IN_MAX_RECORD_BYTES) \
    X(IN_MAX_DELAY_MS) \
    X(IN_IDX_MASK) \
    X(IN_IDX_LIVE) \
    X(IN_IDX_TOMBS) \
    X(IN_IDX_OLD_MASK) \
    X(IN_RESTORED_BYTES) \
    X(IN_MAX_SRC_OFFSET) \
    X(IN_IDX_OLD2_MASK) \
    X(IN_IDX_JNL_AT) \
    X(IN_IDX_RESIDENT) \
    X(IN_IDX_WAIT) \
    X(IN_KIND_WHEEL) \
    X(IN_KIND_LEVELS) \
    X(IN_W_P) \
    X(IN_W_N) \
    X(IN_W_LATE_BELOW) \
    X(IN_W_S_K) \
    X(IN_W_S_O) \
    X(IN_W_GUARD) \
    X(IN_W_HEAD) \
    X(IN_W_PER_FILE) \
    X(IN_W_F0) \
    X(IN_W_APP_LO) \
    X(IN_W_APP_HI) \
    X(IN_W_SLOT_DIRTY_LO) \
    X(IN_W_SLOT_DIRTY_HI) \
    X(IN_W_MARK_LO) \
    X(IN_W_MARK_HI) \
    X(IN_W_WIDTH) \
    X(IN_W_LATE_HEAD) \
    X(IN_W_LATE_TAIL) \
    X(IN_W_NEW_CHAINS) \
    X(IN_L_COUNT) \
    X(IN_L_PER_FILE) \
    X(IN_LV_WRITE) \
    X(IN_LV_FIRST) \
    X(IN_LV_DIRTY_FROM) \
    X(IN_LV_DIRTY_TO) \
    X(IN_LV_DELAY_MS) \
    X(IN_SCHED_AT) \
    X(IN_W_SIZE) \
    X(IN_L_BASE) \
    X(IN_L_STRIDE)

#endif
