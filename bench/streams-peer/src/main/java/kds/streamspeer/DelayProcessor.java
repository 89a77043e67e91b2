package kds.streamspeer;

import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;

import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.header.Headers;
import org.apache.kafka.common.header.internals.RecordHeaders;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.processor.PunctuationType;
import org.apache.kafka.streams.processor.api.Processor;
import org.apache.kafka.streams.processor.api.ProcessorContext;
import org.apache.kafka.streams.processor.api.Record;
import org.apache.kafka.streams.processor.api.RecordMetadata;
import org.apache.kafka.streams.state.KeyValueIterator;
import org.apache.kafka.streams.state.KeyValueStore;

/**
 * The delay queue: a state store keyed by due time and a wall-clock punctuator.
 *
 * <p>{@link #process} reads the sidecar's ingress headers (README, "Ingress record"):
 * {@code delay.target-topic} (required), {@code delay.ms} (after the record's timestamp) or
 * {@code delay.deliver-at} (absolute; neither: due now), {@code delay.id} (default
 * {@code <topic>:<partition>:<offset>}), {@code delay.replace: true}, and {@code delay.cancel: <id>}.
 * A record is put into the {@code pending} store under the key {@code big-endian due ms (8 bytes)
 * + id}: RocksDB keeps keys in byte order, so the store is ordered by due time and every due record
 * is one range scan from the start. A record with its own {@code delay.id} is also put into the
 * {@code ids} store (id -> due), the index that a cancel, a replace and a duplicate check need; a
 * record with the default id can be named by nobody, so it costs one store write, not two.
 * Anything else (another {@code delay.*} header, an unparsable value, no target) is counted as
 * invalid and dropped (the sidecar sends it to its DLQ).
 *
 * <p>A record already due when it is read is forwarded at once and never stored (what the
 * sidecar does with a due-now record too): a backlog that is all due costs no store write.
 *
 * <p>A scan starts at the last key it forwarded (or at a lower key put since), never at due 0:
 * the keys it forwarded are deleted, and a delete in RocksDB is a tombstone that every iterator
 * over it steps across until a compaction drops it. A scan from due 0 therefore costs every
 * record already delivered between two compactions (docs/benchmarks.md, streams-punctuator).
 *
 * <p>The punctuator (Streams docs, Processor API, "punctuate": {@code ProcessorContext#schedule}
 * with {@link PunctuationType#WALL_CLOCK_TIME}) runs every {@code punctuateMs} of wall-clock time
 * on the stream thread, between batches of polled records: it scans {@code pending} from due 0 to
 * now, forwards each record (the sink sends it to its target with the producer's acks=all), then
 * deletes what it forwarded, at most {@link #MAX_PER_PUNCTUATION} per run so that ingress keeps
 * flowing through a mass expiry. Both stores are changelogged (the Streams default); with
 * at_least_once the input offsets are committed only after the producer flushed the forwarded
 * records and the changelog writes, so a crash delivers a record again but never loses one.
 */
final class DelayProcessor implements Processor<byte[], byte[], byte[], byte[]> {
    static final int MAX_PER_PUNCTUATION = 50_000;
    private static final String PREFIX = "delay.";
    private static final String DELAY_MS = "delay.ms";
    private static final String DELIVER_AT = "delay.deliver-at";
    private static final String ID = "delay.id";
    private static final String REPLACE = "delay.replace";
    private static final String CANCEL = "delay.cancel";

    private final long punctuateMs;
    private ProcessorContext<byte[], byte[]> ctx;
    private KeyValueStore<Bytes, byte[]> pending;
    private KeyValueStore<Bytes, byte[]> ids;
    // where the next scan starts: the last key forwarded, or a lower key put since (null: the
    // start of the store, as after a restore)
    private Bytes scanFrom;

    DelayProcessor(long punctuateMs) {
        this.punctuateMs = punctuateMs;
    }

    @Override
    public void init(ProcessorContext<byte[], byte[]> context) {
        ctx = context;
        pending = context.getStateStore(StreamsPeer.PENDING_STORE);
        ids = context.getStateStore(StreamsPeer.IDS_STORE);
        context.schedule(Duration.ofMillis(punctuateMs), PunctuationType.WALL_CLOCK_TIME, this::forwardDue);
    }

    @Override
    public void process(Record<byte[], byte[]> r) {
        Counters.INGESTED.incrementAndGet();
        byte[] target = null;
        byte[] id = null;
        byte[] cancel = null;
        Long delayMs = null;
        Long deliverAt = null;
        boolean replace = false;
        List<Header> user = new ArrayList<>();
        try {
            for (Header h : r.headers()) {
                String name = h.key();
                if (!name.startsWith(PREFIX)) {
                    user.add(h);
                    continue;
                }
                switch (name) {
                    case TargetExtractor.HEADER -> target = h.value();
                    case DELAY_MS -> delayMs = Long.parseLong(text(h));
                    case DELIVER_AT -> deliverAt = Long.parseLong(text(h));
                    case ID -> id = h.value();
                    case CANCEL -> cancel = h.value();
                    case REPLACE -> replace = "true".equals(text(h));
                    default -> throw new IllegalArgumentException(name);
                }
            }
        } catch (RuntimeException e) {
            Counters.INVALID.incrementAndGet();
            return;
        }
        if (cancel != null) {
            cancel(Bytes.wrap(cancel));
            return;
        }
        if (target == null || target.length == 0 || (delayMs != null && deliverAt != null)) {
            Counters.INVALID.incrementAndGet();
            return;
        }
        long due = Math.max(0, deliverAt != null ? deliverAt : r.timestamp() + (delayMs != null ? delayMs : 0));
        boolean ownId = id != null;
        Bytes idKey = null;
        if (ownId) {
            idKey = Bytes.wrap(id);
            byte[] old = ids.get(idKey);
            if (old != null) {
                if (!replace) {
                    Counters.DUPLICATES.incrementAndGet();
                    return;
                }
                pending.delete(pendingKey(ByteBuffer.wrap(old).getLong(), id));
                ids.delete(idKey);
            }
        } else {
            RecordMetadata m = ctx.recordMetadata().orElseThrow();
            id = (m.topic() + ":" + m.partition() + ":" + m.offset()).getBytes(StandardCharsets.UTF_8);
        }
        Counters.SCHEDULED.incrementAndGet();
        if (due <= System.currentTimeMillis()) {
            // due already: forwarded now, never stored (the input offset is committed only after it
            // is acknowledged, as for a forward from the store)
            Headers headers = new RecordHeaders();
            user.forEach(headers::add);
            send(id, due, target, r.key(), r.value(), headers);
            Counters.FORWARDED.incrementAndGet();
            return;
        }
        if (ownId) {
            ids.put(idKey, ByteBuffer.allocate(8).putLong(due).array());
        }
        Bytes key = pendingKey(due, id);
        pending.put(key, encode(ownId, target, r.key(), r.value(), user));
        if (scanFrom != null && key.compareTo(scanFrom) < 0) {
            scanFrom = key;
        }
    }

    private void cancel(Bytes id) {
        byte[] old = ids.delete(id);
        if (old != null) {
            pending.delete(pendingKey(ByteBuffer.wrap(old).getLong(), id.get()));
            Counters.CANCELLED.incrementAndGet();
        }
    }

    private void forwardDue(long now) {
        long t0 = System.nanoTime();
        List<Bytes> forwarded = new ArrayList<>();
        // range() is inclusive of both ends: every key is longer than 8 bytes, so the upper bound
        // (now + 1, no id) admits exactly the keys due at or before now
        Bytes from = scanFrom != null ? scanFrom : pendingKey(0, new byte[0]);
        try (KeyValueIterator<Bytes, byte[]> it = pending.range(from, pendingKey(now + 1, new byte[0]))) {
            while (it.hasNext() && forwarded.size() < MAX_PER_PUNCTUATION) {
                KeyValue<Bytes, byte[]> kv = it.next();
                forward(kv.key.get(), kv.value);
                forwarded.add(kv.key);
            }
        }
        // deleted after the scan: the iterator is not written to while it is open
        for (Bytes k : forwarded) {
            pending.delete(k);
        }
        if (!forwarded.isEmpty()) {
            scanFrom = forwarded.get(forwarded.size() - 1);
        }
        Counters.FORWARDED.addAndGet(forwarded.size());
        Counters.PUNCTUATIONS.incrementAndGet();
        Counters.MAX_PUNCTUATION_MS.accumulateAndGet((System.nanoTime() - t0) / 1_000_000, Math::max);
    }

    private void forward(byte[] key, byte[] stored) {
        ByteBuffer k = ByteBuffer.wrap(key);
        long due = k.getLong();
        byte[] id = new byte[key.length - 8];
        k.get(id);
        ByteBuffer v = ByteBuffer.wrap(stored);
        boolean ownId = v.get() == 1;
        byte[] target = bytes(v);
        byte[] recKey = bytes(v);
        byte[] value = bytes(v);
        Headers headers = new RecordHeaders();
        for (int n = v.getInt(); n > 0; n--) {
            headers.add(new String(bytes(v), StandardCharsets.UTF_8), bytes(v));
        }
        if (ownId) {
            ids.delete(Bytes.wrap(id));
        }
        send(id, due, target, recKey, value, headers);
    }

    private void send(byte[] id, long due, byte[] target, byte[] key, byte[] value, Headers headers) {
        headers.add(ID, id);
        headers.add(DELIVER_AT, Long.toString(due).getBytes(StandardCharsets.UTF_8));
        headers.add(TargetExtractor.HEADER, target);
        // the record's timestamp is its send time, as the sidecar's: lateness = timestamp - due
        ctx.forward(new Record<>(key, value, System.currentTimeMillis(), headers));
    }

    static Bytes pendingKey(long due, byte[] id) {
        return Bytes.wrap(ByteBuffer.allocate(8 + id.length).putLong(due).put(id).array());
    }

    static byte[] encode(boolean ownId, byte[] target, byte[] key, byte[] value, List<Header> headers) {
        int size = 1 + 4 * 4 + len(target) + len(key) + len(value);
        for (Header h : headers) {
            size += 8 + h.key().getBytes(StandardCharsets.UTF_8).length + len(h.value());
        }
        ByteBuffer b = ByteBuffer.allocate(size).put((byte) (ownId ? 1 : 0));
        put(b, target);
        put(b, key);
        put(b, value);
        b.putInt(headers.size());
        for (Header h : headers) {
            put(b, h.key().getBytes(StandardCharsets.UTF_8));
            put(b, h.value());
        }
        return b.array();
    }

    private static int len(byte[] a) {
        return a == null ? 0 : a.length;
    }

    private static void put(ByteBuffer b, byte[] a) {
        b.putInt(a == null ? -1 : a.length);
        if (a != null) {
            b.put(a);
        }
    }

    private static byte[] bytes(ByteBuffer b) {
        int n = b.getInt();
        if (n < 0) {
            return null;
        }
        byte[] a = new byte[n];
        b.get(a);
        return a;
    }

    private static String text(Header h) {
        return new String(h.value(), StandardCharsets.UTF_8).trim();
    }
}
