/* Generated from sidecar/store/native_layouts.py (python -m sidecar.store.native_layouts): do
 * not edit. The file layouts C and Python share; that module says what each is. */
#ifndef KDS_LAYOUTS_H
#define KDS_LAYOUTS_H

#define HEAD_SIZE 72 /* a record's fixed head; then id | topic | key | value | headers, padded */
#define ALIGN 8 /* records start and end at multiples of this */
#define VERSION 1 /* the record format's version byte */
#define FLAG_KEY_NULL 1 /* record flag: the key is null */
#define FLAG_VALUE_NULL 2 /* record flag: the value is null */
#define REC_MESSAGE 1 /* record type: deliver to its target */
#define REC_CANCEL 2 /* record type: a cancel command */
#define REC_DEAD 3 /* record type: a dead letter, to the DLQ */
#define REC_RECURRING 4 /* record type: a recurring schedule's next firing */
#define WL_SIZE 32 /* timer-log entry: due i64 | loc i64 | next i64 | 0 u8 | flags u8 | level u16 | tag */
#define WL_SLOT_SIZE 32 /* wheel slot: time i64 | first i64 | last i64 | count u32 | min_off u16 | 0 u16 */
#define WL_PENDING 0 /* timer-log entry state */
#define WL_CANCELLED 1 /* timer-log entry state */
#define WL_DONE 2 /* timer-log entry state */
#define WL_DROPPED 3 /* timer-log entry state */
#define WL_LATE 1 /* entry flag: on the late chain */
#define WL_BUCKET_BIT (4611686018427387904LL) /* a loc in a bucket file, not the commit log */
#define WL_MAX_DUE (4611686018427387903LL) /* the latest due time the wheel stores */
#define WL_MIN_DUE (-4611686018427387904LL) /* the earliest due time the wheel stores */
#define LV_SIZE 24 /* queue entry: log_pos u64 | due i64 | state u8 | 7 zero bytes */
#define LV_PENDING 0 /* queue entry state */
#define LV_DELIVERED 1 /* queue entry state */
#define LV_CANCELLED 2 /* queue entry state */
#define LV_DROPPED 3 /* queue entry state */
#define LV_IDX_BITS 48 /* a ref: level << LV_IDX_BITS | index */
#define IDX_SLOT_SIZE 16 /* id index slot: hash u64 | ref u64 */
#define IDX_EMPTY 0 /* id index: the hash of an empty slot */
#define IDX_TOMB 1 /* id index: the hash of a tombstone */
#define IDX_PRECANCEL 9223372036854775808ULL /* id index: a ref's bit, a cancel stored before its record */

/* every name above, for X-macros (the module's LAYOUTS dict) */
#define KDS_LAYOUTS(X) \
    X(HEAD_SIZE) \
    X(ALIGN) \
    X(VERSION) \
    X(FLAG_KEY_NULL) \
    X(FLAG_VALUE_NULL) \
    X(REC_MESSAGE) \
    X(REC_CANCEL) \
    X(REC_DEAD) \
    X(REC_RECURRING) \
    X(WL_SIZE) \
    X(WL_SLOT_SIZE) \
    X(WL_PENDING) \
    X(WL_CANCELLED) \
    X(WL_DONE) \
    X(WL_DROPPED) \
    X(WL_LATE) \
    X(WL_BUCKET_BIT) \
    X(WL_MAX_DUE) \
    X(WL_MIN_DUE) \
    X(LV_SIZE) \
    X(LV_PENDING) \
    X(LV_DELIVERED) \
    X(LV_CANCELLED) \
    X(LV_DROPPED) \
    X(LV_IDX_BITS) \
    X(IDX_SLOT_SIZE) \
    X(IDX_EMPTY) \
    X(IDX_TOMB) \
    X(IDX_PRECANCEL)

#endif
