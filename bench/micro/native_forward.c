/* native_forward: the passthrough of bench/passthrough.py with librdkafka driven from C.
 *
 * What a forward path costs when no Python object is made per record: the same consume -> produce
 * loop as bench.passthrough (batches of 5 000 consumed records, at most 20 000 unacknowledged, a
 * delivery report per record counted, an asynchronous offset commit every 200 ms), the same client
 * settings (passed as -P / -C key=value by the caller, bench.workload's DELIVERY_PRODUCER and
 * INGRESS_CONSUMER), on the librdkafka the Python client ships (link against its bundled .so).
 * -a N adds N headers to each record, as the sidecar adds its four delay.* headers to a delivered
 * record. It prints the same JSON event lines as bench.passthrough (ready, done with cpu_s), so the
 * bench's measure_passthrough reads either (KDS_BENCH_PASSTHROUGH, bench/throughput.py).
 *
 * Build (docs/benchmarks.md, "A forward path without Python objects"): the header from Debian's
 * librdkafka-dev, the library from the confluent-kafka wheel.
 */
#include <errno.h>
#include <librdkafka/rdkafka.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#define CONSUME_BATCH 5000
#define MAX_IN_FLIGHT 20000
#define MAX_PARTITIONS 256

static long long in_flight, acked, failed;

static long long now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static double mono_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static double cpu_s(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6;
}

static void die(const char *what, const char *detail) {
    fprintf(stderr, "native_forward: %s: %s\n", what, detail);
    exit(2);
}

static void set(rd_kafka_conf_t *conf, const char *kv) {
    char key[256], err[512];
    const char *eq = strchr(kv, '=');
    if (!eq || (size_t)(eq - kv) >= sizeof key) die("expected key=value", kv);
    memcpy(key, kv, eq - kv);
    key[eq - kv] = 0;
    if (rd_kafka_conf_set(conf, key, eq + 1, err, sizeof err) != RD_KAFKA_CONF_OK) die(kv, err);
}

static void on_delivery(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque) {
    (void)rk, (void)opaque;
    in_flight--;
    if (m->err) failed++;
    else acked++;
}

static void on_rebalance(rd_kafka_t *rk, rd_kafka_resp_err_t err, rd_kafka_topic_partition_list_t *parts,
                         void *opaque) {
    (void)opaque;
    int coop = !strcmp(rd_kafka_rebalance_protocol(rk), "COOPERATIVE");
    if (err == RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS) {
        if (coop) rd_kafka_error_destroy(rd_kafka_incremental_assign(rk, parts));
        else rd_kafka_assign(rk, parts);
        printf("{\"event\":\"ready\",\"ts_ms\":%lld,\"partitions\":[", now_ms());
        for (int i = 0; i < parts->cnt; i++) printf("%s%d", i ? "," : "", parts->elems[i].partition);
        printf("]}\n");
        fflush(stdout);
    } else if (coop) {
        rd_kafka_error_destroy(rd_kafka_incremental_unassign(rk, parts));
    } else {
        rd_kafka_assign(rk, NULL);
    }
}

int main(int argc, char **argv) {
    const char *bootstrap = NULL, *source = NULL, *target = NULL, *group = NULL;
    long long count = -1;
    double timeout = 600;
    int add_headers = 0;
    char err[512];
    rd_kafka_conf_t *pconf = rd_kafka_conf_new(), *cconf = rd_kafka_conf_new();
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *f = argv[i], *v = argv[i + 1];
        if (!strcmp(f, "--bootstrap")) bootstrap = v;
        else if (!strcmp(f, "--source")) source = v;
        else if (!strcmp(f, "--target")) target = v;
        else if (!strcmp(f, "--count")) count = atoll(v);
        else if (!strcmp(f, "--group")) group = v;
        else if (!strcmp(f, "--timeout")) timeout = atof(v);
        else if (!strcmp(f, "-a")) add_headers = atoi(v);
        else if (!strcmp(f, "-P")) set(pconf, v);
        else if (!strcmp(f, "-C")) set(cconf, v);
        else die("unknown flag (accepted: --bootstrap --source --target --count --group --timeout -a -P -C)", f);
    }
    if (!bootstrap || !source || !target || !group || count < 0)
        die("usage", "--bootstrap B --source T --target T2 --count N --group G [--timeout S] [-a N] "
                     "[-P k=v]... [-C k=v]...");
    char bs[600];
    snprintf(bs, sizeof bs, "bootstrap.servers=%s", bootstrap);
    set(pconf, bs);
    set(cconf, bs);
    char gid[600];
    snprintf(gid, sizeof gid, "group.id=%s", group);
    set(cconf, gid);
    rd_kafka_conf_set_dr_msg_cb(pconf, on_delivery);
    rd_kafka_conf_set_rebalance_cb(cconf, on_rebalance);
    rd_kafka_t *prod = rd_kafka_new(RD_KAFKA_PRODUCER, pconf, err, sizeof err);
    if (!prod) die("producer", err);
    rd_kafka_t *cons = rd_kafka_new(RD_KAFKA_CONSUMER, cconf, err, sizeof err);
    if (!cons) die("consumer", err);
    rd_kafka_poll_set_consumer(cons);
    rd_kafka_topic_t *rkt = rd_kafka_topic_new(prod, target, NULL);
    rd_kafka_topic_partition_list_t *sub = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(sub, source, RD_KAFKA_PARTITION_UA);
    rd_kafka_resp_err_t e = rd_kafka_subscribe(cons, sub);
    if (e) die("subscribe", rd_kafka_err2str(e));
    rd_kafka_topic_partition_list_destroy(sub);
    rd_kafka_queue_t *q = rd_kafka_queue_get_consumer(cons);

    static rd_kafka_message_t *batch[CONSUME_BATCH];
    static long long positions[MAX_PARTITIONS];
    memset(positions, -1, sizeof positions);
    ssize_t n = 0, pos = 0;
    long long consumed = 0, consume_errors = 0, first_ms = 0;
    double cpu0 = cpu_s(), deadline = mono_s() + timeout, last_commit = mono_s();
    static const char hval[] = "1733500000000"; /* a deliver-at's length, as the sidecar's headers */
    static const char *hnames[] = {"delay.a", "delay.b", "delay.c", "delay.d", "delay.e", "delay.f"};
    if (add_headers > 6) add_headers = 6;
    while (acked + failed < count && mono_s() < deadline) {
        if (pos >= n && consumed < count && in_flight < MAX_IN_FLIGHT) {
            n = rd_kafka_consume_batch_queue(q, 100, batch, CONSUME_BATCH);
            pos = 0;
            if (n < 0) n = 0;
        } else if (pos >= n) {
            /* nothing to forward until reports come back (rd_kafka_poll must not serve a consumer
             * whose queue is the consumer queue: librdkafka asserts) */
            rd_kafka_poll(prod, 1);
        }
        while (pos < n && in_flight < MAX_IN_FLIGHT) {
            rd_kafka_message_t *m = batch[pos];
            if (m->err) {
                consume_errors++;
                rd_kafka_message_destroy(m);
                pos++;
                continue;
            }
            rd_kafka_headers_t *in = NULL, *hdrs = NULL;
            if (rd_kafka_message_headers(m, &in) == RD_KAFKA_RESP_ERR_NO_ERROR) hdrs = rd_kafka_headers_copy(in);
            if (add_headers && !hdrs) hdrs = rd_kafka_headers_new(add_headers);
            for (int h = 0; h < add_headers; h++) rd_kafka_header_add(hdrs, hnames[h], -1, hval, sizeof hval - 1);
            e = rd_kafka_producev(prod, RD_KAFKA_V_RKT(rkt), RD_KAFKA_V_VALUE(m->payload, m->len),
                                  RD_KAFKA_V_KEY(m->key, m->key_len), RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                                  RD_KAFKA_V_HEADERS(hdrs), RD_KAFKA_V_END);
            if (e == RD_KAFKA_RESP_ERR__QUEUE_FULL) {
                if (hdrs) rd_kafka_headers_destroy(hdrs);
                rd_kafka_poll(prod, 10);
                break;
            }
            if (e) die("produce", rd_kafka_err2str(e));
            if (!first_ms) first_ms = now_ms();
            in_flight++;
            consumed++;
            if (m->partition >= 0 && m->partition < MAX_PARTITIONS) positions[m->partition] = m->offset + 1;
            rd_kafka_message_destroy(m);
            pos++;
        }
        rd_kafka_poll(prod, 0);
        double t = mono_s();
        if (t - last_commit >= 0.2) {
            rd_kafka_topic_partition_list_t *offs = rd_kafka_topic_partition_list_new(8);
            for (int p = 0; p < MAX_PARTITIONS; p++)
                if (positions[p] >= 0) rd_kafka_topic_partition_list_add(offs, source, p)->offset = positions[p];
            if (offs->cnt) rd_kafka_commit(cons, offs, 1);
            rd_kafka_topic_partition_list_destroy(offs);
            last_commit = t;
        }
    }
    rd_kafka_flush(prod, 60000);
    printf("{\"event\":\"done\",\"ts_ms\":%lld,\"cpu_s\":%.6f,\"consumed\":%lld,\"acked\":%lld,\"failed\":%lld,"
           "\"consume_errors\":%lld,\"errors\":{},\"first_produce_ms\":%lld}\n",
           now_ms(), cpu_s() - cpu0, consumed, acked, failed, consume_errors, first_ms);
    fflush(stdout);
    while (pos < n) rd_kafka_message_destroy(batch[pos++]);
    rd_kafka_queue_destroy(q);
    rd_kafka_consumer_close(cons);
    rd_kafka_destroy(cons);
    rd_kafka_topic_destroy(rkt);
    rd_kafka_destroy(prod);
    return acked >= count ? 0 : 1;
}
