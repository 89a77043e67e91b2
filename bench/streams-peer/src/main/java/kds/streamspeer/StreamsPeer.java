package kds.streamspeer;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.lang.management.ManagementFactory;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.time.Duration;
import java.util.HashMap;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;

import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.common.Metric;
import org.apache.kafka.common.MetricName;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.state.Stores;

/**
 * The Kafka Streams delay queue a Kafka team writes itself, as the Kafka Streams documentation's
 * Processor API guide lays it out ("Defining a Stream Processor", "Connecting Processors and
 * State Stores"): one source (the ingress topic), one {@link DelayProcessor} with two persistent
 * (RocksDB) key-value stores, changelogged (the Streams default), and one sink whose
 * topic is picked per record ({@link TargetExtractor}, "dynamic routing").
 *
 * <p>Usage: {@code java -cp 'DIR/*' kds.streamspeer.StreamsPeer --bootstrap B --ingress TOPIC
 * --application-id ID --state-dir DIR [--punctuate-ms 20] [--guarantee at_least_once]
 * [--warm-up-ingress TOPIC --warm-up-records N]}, or with {@code --serve true} in place of
 * {@code --ingress} (below).
 * It prints JSON lines on stdout: {@code warmed} after the warm-up (below), {@code ready} once the
 * application is RUNNING (its partitions assigned, its stores restored), {@code done} with its
 * counters when it stops (SIGTERM).
 *
 * <p>Warm-up: with {@code --warm-up-ingress}, the same topology first runs in this JVM as an
 * application of its own ({@code ID-warm}, its own state directory and changelogs) on that topic
 * until it has forwarded N records, and is closed and its state removed; only then does the
 * measured application start. A deployment's JVM has run its hot paths for long (the JIT has
 * compiled them); a JVM started for one benchmark round has not, and its first seconds would
 * measure the compiler, not the design.
 *
 * <p>Serving ({@code --serve true}, no {@code --ingress}): one JVM runs applications one after
 * another, as a deployment's JVM runs its application for long, so that each benchmark round does
 * not measure a JVM of its own (a JVM kept running went on getting faster over its first 3-4M
 * records: a JVM per round measured each round at its own point of that curve). After the
 * warm-up, it reads commands on stdin: {@code start ID TOPIC} starts a fresh application (id
 * {@code ID}, its state under the state directory's {@code ID}) on {@code TOPIC}, and logs
 * {@code ready} with its {@code application_id} once it is RUNNING; {@code stop} closes it,
 * removes its local state and logs {@code done} with its counters; the end of stdin stops the JVM.
 *
 * <p>Settings (each stated because the benchmark compares durability and batching with the
 * sidecar's): processing.guarantee at_least_once (the sidecar's default delivery), the producer
 * with acks=all and idempotence (the sidecar's), linger.ms 2 (the sidecar's), batch.size 256 KiB
 * (a backlog goes out in large batches, as librdkafka's batch.num.messages 10 000 lets the
 * sidecar's); the changelog topics take the broker's default replication factor
 * (replication.factor -1), as the sidecar's changelog does; commit.interval.ms is the Streams
 * default for at_least_once (30 s); the stores have no record cache (a Processor API store's
 * default), so every put and delete reaches RocksDB and its changelog.
 */
public final class StreamsPeer {
    static final String PENDING_STORE = "pending";
    static final String IDS_STORE = "ids";

    private StreamsPeer() {
    }

    static Map<String, String> parse(String[] args) {
        Map<String, String> out = new HashMap<>();
        out.put("punctuate-ms", "20");
        out.put("guarantee", StreamsConfig.AT_LEAST_ONCE);
        for (int i = 0; i < args.length; i += 2) {
            if (!args[i].startsWith("--") || i + 1 >= args.length) {
                throw new IllegalArgumentException("expected --name value pairs, got " + args[i]);
            }
            out.put(args[i].substring(2), args[i + 1]);
        }
        boolean serve = Boolean.parseBoolean(out.getOrDefault("serve", "false"));
        for (String need : serve ? new String[] {"bootstrap", "application-id", "state-dir"}
                : new String[] {"bootstrap", "ingress", "application-id", "state-dir"}) {
            if (!out.containsKey(need)) {
                throw new IllegalArgumentException("--" + need + " is required");
            }
        }
        return out;
    }

    static Topology topology(String ingress, long punctuateMs) {
        Topology t = new Topology();
        t.addSource("ingress", new ByteArrayDeserializer(), new ByteArrayDeserializer(), ingress);
        t.addProcessor("delay", () -> new DelayProcessor(punctuateMs), "ingress");
        t.addStateStore(Stores.keyValueStoreBuilder(Stores.persistentKeyValueStore(PENDING_STORE),
                Serdes.Bytes(), Serdes.ByteArray()), "delay");
        t.addStateStore(Stores.keyValueStoreBuilder(Stores.persistentKeyValueStore(IDS_STORE),
                Serdes.Bytes(), Serdes.ByteArray()), "delay");
        t.addSink("targets", new TargetExtractor(), new ByteArraySerializer(), new ByteArraySerializer(), "delay");
        return t;
    }

    static Properties config(Map<String, String> a) {
        Properties p = new Properties();
        p.put(StreamsConfig.APPLICATION_ID_CONFIG, a.get("application-id"));
        p.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, a.get("bootstrap"));
        p.put(StreamsConfig.STATE_DIR_CONFIG, Path.of(a.get("state-dir")).toAbsolutePath().toString());
        p.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, a.get("guarantee"));
        p.put(StreamsConfig.REPLICATION_FACTOR_CONFIG, -1);
        p.put(StreamsConfig.consumerPrefix(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG), "earliest");
        // Static membership (KIP-345), as a deployment that restarts its instances in place runs it:
        // an instance back under the same id takes its tasks again at once, where a new member would
        // wait for the crashed one's session (45 s by default) to expire before the rebalance.
        p.put(StreamsConfig.consumerPrefix(ConsumerConfig.GROUP_INSTANCE_ID_CONFIG),
                a.get("application-id") + "-0");
        p.put(StreamsConfig.producerPrefix(ProducerConfig.ACKS_CONFIG), "all");
        p.put(StreamsConfig.producerPrefix(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG), true);
        p.put(StreamsConfig.producerPrefix(ProducerConfig.LINGER_MS_CONFIG), 2);
        p.put(StreamsConfig.producerPrefix(ProducerConfig.BATCH_SIZE_CONFIG), 262_144);
        return p;
    }

    static String json(String event, Map<String, Object> fields) {
        StringBuilder sb = new StringBuilder("{\"event\":\"").append(event).append("\",\"ts_ms\":")
                .append(System.currentTimeMillis());
        for (Map.Entry<String, Object> e : fields.entrySet()) {
            sb.append(",\"").append(e.getKey()).append("\":");
            Object v = e.getValue();
            sb.append(v instanceof Number ? v.toString() : "\"" + v + "\"");
        }
        return sb.append('}').toString();
    }

    static synchronized void emit(String event, Map<String, Object> fields) {
        System.out.println(json(event, fields));
        System.out.flush();
    }

    public static void main(String[] args) throws Exception {
        System.setProperty("org.slf4j.simpleLogger.defaultLogLevel", "warn");
        System.setProperty("org.slf4j.simpleLogger.logFile", "System.err");
        Map<String, String> a = parse(args);
        long punctuateMs = Long.parseLong(a.get("punctuate-ms"));
        if (a.containsKey("warm-up-ingress")) {
            warmUp(a, punctuateMs);
        }
        if (Boolean.parseBoolean(a.getOrDefault("serve", "false"))) {
            serve(a, punctuateMs);
            System.exit(0);  // a client thread left behind must not keep the JVM up
        }
        KafkaStreams streams = new KafkaStreams(topology(a.get("ingress"), punctuateMs), config(a));
        CountDownLatch stopped = new CountDownLatch(1);
        boolean[] failed = {false};
        streams.setStateListener((now, before) -> {
            if (now == KafkaStreams.State.RUNNING) {
                emit("ready", Map.of("punctuate_ms", punctuateMs));
            } else if (now == KafkaStreams.State.ERROR) {
                emit("failed", Map.of("state", now.toString()));
                failed[0] = true;
                stopped.countDown();
            }
        });
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            streams.close(Duration.ofSeconds(60));
            Map<String, Object> done = new HashMap<>(Counters.snapshot());
            done.put("cpu_s", cpuSeconds());
            emit("done", done);
            stopped.countDown();
        }));
        streams.start();
        stopped.await();
        if (failed[0]) {
            System.exit(1);
        }
    }

    /** Serving (class comment): applications one after another, as stdin's commands say. */
    static void serve(Map<String, String> a, long punctuateMs) throws Exception {
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        KafkaStreams current = null;
        String currentId = null;
        emit("serving", Map.of("punctuate_ms", punctuateMs));
        for (String line = in.readLine(); line != null; line = in.readLine()) {
            String[] cmd = line.trim().split("\\s+");
            if (cmd[0].equals("start") && cmd.length == 3 && current == null) {
                Map<String, String> app = new HashMap<>(a);
                app.put("application-id", cmd[1]);
                app.put("state-dir", Path.of(a.get("state-dir")).resolve(cmd[1]).toString());
                String id = cmd[1];
                Counters.reset();
                current = new KafkaStreams(topology(cmd[2], punctuateMs), config(app));
                current.setStateListener((now, before) -> {
                    if (now == KafkaStreams.State.RUNNING) {
                        emit("ready", Map.of("punctuate_ms", punctuateMs, "application_id", id));
                    } else if (now == KafkaStreams.State.ERROR) {
                        emit("failed", Map.of("state", now.toString(), "application_id", id));
                    }
                });
                currentId = id;
                current.start();
            } else if (cmd[0].equals("stop") && current != null) {
                Map<String, Object> batching = batching(current);
                current.close(Duration.ofSeconds(60));
                current.cleanUp();
                Map<String, Object> done = new HashMap<>(Counters.snapshot());
                done.put("cpu_s", cpuSeconds());
                done.put("application_id", currentId);
                done.putAll(batching);
                emit("done", done);
                current = null;
                currentId = null;
            } else {
                emit("refused", Map.of("command", line.replace("\"", "'")));
            }
        }
        if (current != null) {
            current.close(Duration.ofSeconds(60));
        }
    }

    /** How the application's clients batched, in its {@code done} line: records and requests
     * produced, fetches and records fetched (totals over the application's life) and the
     * producer's mean batch in bytes (over the metrics' last 30-60 s); the largest over the clients
     * of one kind (the restore consumer fetches little). */
    static Map<String, Object> batching(KafkaStreams streams) {
        Map<String, String> wanted = Map.of(
                "producer-metrics/record-send-total", "producer_records",
                "producer-metrics/request-total", "producer_requests",
                "producer-metrics/batch-size-avg", "producer_batch_size_avg",
                "consumer-fetch-manager-metrics/fetch-total", "fetches",
                "consumer-fetch-manager-metrics/records-consumed-total", "fetched_records");
        Map<String, Object> out = new HashMap<>();
        for (Map.Entry<MetricName, ? extends Metric> e : streams.metrics().entrySet()) {
            String key = wanted.get(e.getKey().group() + "/" + e.getKey().name());
            if (key != null && e.getValue().metricValue() instanceof Double d && !d.isNaN()) {
                out.merge(key, d, (x, y) -> Math.max((Double) x, (Double) y));
            }
        }
        return out;
    }

    /** The warm-up (class comment): the topology on the warm-up topic until N records went out. */
    static void warmUp(Map<String, String> a, long punctuateMs) throws InterruptedException {
        long want = Long.parseLong(a.getOrDefault("warm-up-records", "0"));
        Map<String, String> w = new HashMap<>(a);
        w.put("application-id", a.get("application-id") + "-warm");
        w.put("state-dir", Path.of(a.get("state-dir")).resolve("warm-up").toString());
        long t0 = System.nanoTime();
        KafkaStreams warm = new KafkaStreams(topology(a.get("warm-up-ingress"), punctuateMs), config(w));
        warm.start();
        long deadline = t0 + 300_000_000_000L;
        while (Counters.FORWARDED.get() < want && System.nanoTime() < deadline
                && warm.state() != KafkaStreams.State.ERROR) {
            Thread.sleep(20);
        }
        long forwarded = Counters.FORWARDED.get();
        warm.close(Duration.ofSeconds(60));
        warm.cleanUp();
        Counters.reset();
        emit("warmed", Map.of("records", forwarded, "seconds", (System.nanoTime() - t0) / 1e9));
    }

    static double cpuSeconds() {
        java.lang.management.OperatingSystemMXBean os = ManagementFactory.getOperatingSystemMXBean();
        if (os instanceof com.sun.management.OperatingSystemMXBean sun) {
            return sun.getProcessCpuTime() / 1e9;
        }
        return -1;
    }
}
