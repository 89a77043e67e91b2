/* The part of librdkafka's C API the native producer (producer.c) calls, declared here and bound at
 * run time: the extension is not linked against librdkafka. producer.c dlopens, with RTLD_NOLOAD,
 * the library the confluent-kafka module has already loaded (the wheel's
 * confluent_kafka.libs/librdkafka-*.so.1, or a system one), and takes each function below with
 * dlsym, so the producer runs on the same library as the consumer and no header or library is
 * needed at build time.
 *
 * Copied from rdkafka.h (the public header, stable since 1.x for everything here; the event API
 * since 0.9.2, rd_kafka_produceva since 1.5.0, checked at bind time through rd_kafka_version):
 * only declarations, values and the two structs the producer reads or fills. RDK_FUNCS lists the
 * functions once: the pointer table and its loader are generated from it (producer.c). */
#ifndef KDS_RDK_H
#define KDS_RDK_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

typedef struct rd_kafka_s rd_kafka_t;
typedef struct rd_kafka_conf_s rd_kafka_conf_t;
typedef struct rd_kafka_topic_s rd_kafka_topic_t;
typedef struct rd_kafka_queue_s rd_kafka_queue_t;
typedef struct rd_kafka_op_s rd_kafka_event_t;
typedef struct rd_kafka_headers_s rd_kafka_headers_t;
typedef struct rd_kafka_error_s rd_kafka_error_t;
typedef int rd_kafka_resp_err_t; /* an enum in rdkafka.h: int-sized */

#define RDK_PRODUCER 0                /* RD_KAFKA_PRODUCER */
#define RDK_CONF_OK 0                 /* RD_KAFKA_CONF_OK */
#define RDK_PARTITION_UA (-1)         /* RD_KAFKA_PARTITION_UA: the partitioner picks */
#define RDK_MSG_F_COPY 0x2            /* RD_KAFKA_MSG_F_COPY */
#define RDK_PURGE_F_QUEUE 0x1         /* RD_KAFKA_PURGE_F_QUEUE */
#define RDK_PURGE_F_INFLIGHT 0x2      /* RD_KAFKA_PURGE_F_INFLIGHT */
#define RDK_PURGE_F_NON_BLOCKING 0x4  /* RD_KAFKA_PURGE_F_NON_BLOCKING */
#define RDK_EVENT_DR 0x1              /* RD_KAFKA_EVENT_DR: a batch of delivery reports */
#define RDK_EVENT_LOG 0x4             /* RD_KAFKA_EVENT_LOG */
#define RDK_EVENT_ERROR 0x8           /* RD_KAFKA_EVENT_ERROR */
#define RDK_ERR_QUEUE_FULL (-184)     /* RD_KAFKA_RESP_ERR__QUEUE_FULL */
#define RDK_ERR_FATAL (-150)          /* RD_KAFKA_RESP_ERR__FATAL */
#define RDK_ERR_INVALID_ARG (-186)    /* RD_KAFKA_RESP_ERR__INVALID_ARG */
#define RDK_MIN_VERSION 0x010500ff    /* rd_kafka_produceva: 1.5.0 */

typedef struct rd_kafka_message_s { /* rd_kafka_message_t */
    rd_kafka_resp_err_t err;
    rd_kafka_topic_t *rkt;
    int32_t partition;
    void *payload;
    size_t len;
    void *key;
    size_t key_len;
    int64_t offset;
    void *_private; /* producer: the per-message opaque */
} rd_kafka_message_t;

typedef enum { /* rd_kafka_vtype_t */
    RDK_VTYPE_END,
    RDK_VTYPE_TOPIC,
    RDK_VTYPE_RKT,
    RDK_VTYPE_PARTITION,
    RDK_VTYPE_VALUE,
    RDK_VTYPE_KEY,
    RDK_VTYPE_OPAQUE,
    RDK_VTYPE_MSGFLAGS,
    RDK_VTYPE_TIMESTAMP,
    RDK_VTYPE_HEADER,
    RDK_VTYPE_HEADERS,
} rd_kafka_vtype_t;

typedef struct rd_kafka_vu_s { /* rd_kafka_vu_t */
    rd_kafka_vtype_t vtype;
    union {
        const char *cstr;
        rd_kafka_topic_t *rkt;
        int i;
        int32_t i32;
        int64_t i64;
        struct {
            void *ptr;
            size_t size;
        } mem;
        struct {
            const char *name;
            const void *val;
            ssize_t size;
        } header;
        rd_kafka_headers_t *headers;
        void *ptr;
        char _pad[64];
    } u;
} rd_kafka_vu_t;

/* X(return type, name, parameters) */
#define RDK_FUNCS(X)                                                                                   \
    X(int, rd_kafka_version, (void))                                                                   \
    X(rd_kafka_conf_t *, rd_kafka_conf_new, (void))                                                    \
    X(int, rd_kafka_conf_set, (rd_kafka_conf_t *, const char *, const char *, char *, size_t))         \
    X(void, rd_kafka_conf_set_events, (rd_kafka_conf_t *, int))                                        \
    X(void, rd_kafka_conf_destroy, (rd_kafka_conf_t *))                                                \
    X(rd_kafka_t *, rd_kafka_new, (int, rd_kafka_conf_t *, char *, size_t))                            \
    X(void, rd_kafka_destroy, (rd_kafka_t *))                                                          \
    X(const char *, rd_kafka_name, (const rd_kafka_t *))                                               \
    X(rd_kafka_resp_err_t, rd_kafka_set_log_queue, (rd_kafka_t *, rd_kafka_queue_t *))                 \
    X(rd_kafka_queue_t *, rd_kafka_queue_get_main, (rd_kafka_t *))                                     \
    X(void, rd_kafka_queue_destroy, (rd_kafka_queue_t *))                                              \
    X(rd_kafka_event_t *, rd_kafka_queue_poll, (rd_kafka_queue_t *, int))                              \
    X(int, rd_kafka_event_type, (const rd_kafka_event_t *))                                            \
    X(const rd_kafka_message_t *, rd_kafka_event_message_next, (rd_kafka_event_t *))                   \
    X(rd_kafka_resp_err_t, rd_kafka_event_error, (rd_kafka_event_t *))                                 \
    X(const char *, rd_kafka_event_error_string, (rd_kafka_event_t *))                                 \
    X(int, rd_kafka_event_error_is_fatal, (rd_kafka_event_t *))                                        \
    X(int, rd_kafka_event_log, (rd_kafka_event_t *, const char **, const char **, int *))              \
    X(void, rd_kafka_event_destroy, (rd_kafka_event_t *))                                              \
    X(rd_kafka_error_t *, rd_kafka_produceva, (rd_kafka_t *, const rd_kafka_vu_t *, size_t))           \
    X(rd_kafka_resp_err_t, rd_kafka_error_code, (const rd_kafka_error_t *))                            \
    X(const char *, rd_kafka_error_string, (const rd_kafka_error_t *))                                 \
    X(void, rd_kafka_error_destroy, (rd_kafka_error_t *))                                              \
    X(rd_kafka_headers_t *, rd_kafka_headers_new, (size_t))                                            \
    X(rd_kafka_resp_err_t, rd_kafka_header_add, (rd_kafka_headers_t *, const char *, ssize_t,          \
                                                 const void *, ssize_t))                               \
    X(void, rd_kafka_headers_destroy, (rd_kafka_headers_t *))                                          \
    X(int64_t, rd_kafka_message_timestamp, (const rd_kafka_message_t *, int *))                        \
    X(const char *, rd_kafka_topic_name, (const rd_kafka_topic_t *))                                   \
    X(int, rd_kafka_outq_len, (rd_kafka_t *))                                                          \
    X(rd_kafka_resp_err_t, rd_kafka_purge, (rd_kafka_t *, int))                                        \
    X(rd_kafka_resp_err_t, rd_kafka_fatal_error, (rd_kafka_t *, char *, size_t))

#endif
