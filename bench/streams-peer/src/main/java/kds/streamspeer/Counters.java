package kds.streamspeer;

import java.util.LinkedHashMap;
import java.util.Map;
import java.util.concurrent.atomic.AtomicLong;

/** What the application did, reported in its {@code done} line (read by the benchmark). */
final class Counters {
    static final AtomicLong INGESTED = new AtomicLong();
    static final AtomicLong SCHEDULED = new AtomicLong();
    static final AtomicLong FORWARDED = new AtomicLong();
    static final AtomicLong CANCELLED = new AtomicLong();
    static final AtomicLong DUPLICATES = new AtomicLong();
    static final AtomicLong INVALID = new AtomicLong();
    static final AtomicLong PUNCTUATIONS = new AtomicLong();
    static final AtomicLong MAX_PUNCTUATION_MS = new AtomicLong();

    private Counters() {
    }

    /** Every count back to 0: the warm-up instance's counts are not the measured one's. */
    static void reset() {
        for (AtomicLong c : new AtomicLong[] {INGESTED, SCHEDULED, FORWARDED, CANCELLED, DUPLICATES, INVALID,
                PUNCTUATIONS, MAX_PUNCTUATION_MS}) {
            c.set(0);
        }
    }

    static Map<String, Object> snapshot() {
        Map<String, Object> m = new LinkedHashMap<>();
        m.put("ingested", INGESTED.get());
        m.put("scheduled", SCHEDULED.get());
        m.put("forwarded", FORWARDED.get());
        m.put("cancelled", CANCELLED.get());
        m.put("duplicates", DUPLICATES.get());
        m.put("invalid", INVALID.get());
        m.put("punctuations", PUNCTUATIONS.get());
        m.put("max_punctuation_ms", MAX_PUNCTUATION_MS.get());
        return m;
    }
}
