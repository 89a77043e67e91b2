package kds.streamspeer;

import java.nio.charset.StandardCharsets;

import org.apache.kafka.common.header.Header;
import org.apache.kafka.streams.processor.RecordContext;
import org.apache.kafka.streams.processor.TopicNameExtractor;

/**
 * The sink's topic per record (the Streams documentation's "dynamic routing" with a
 * TopicNameExtractor): the due record carries its target in the {@link #HEADER} header that
 * {@link DelayProcessor} adds when it forwards it. The sink hands the extractor the very Headers
 * it then sends, so the header is removed here: the delivered record carries only the user's
 * headers, {@code delay.id} and {@code delay.deliver-at}, as the sidecar's does.
 */
final class TargetExtractor implements TopicNameExtractor<byte[], byte[]> {
    static final String HEADER = "delay.target-topic";

    @Override
    public String extract(byte[] key, byte[] value, RecordContext ctx) {
        Header h = ctx.headers().lastHeader(HEADER);
        ctx.headers().remove(HEADER);
        return new String(h.value(), StandardCharsets.UTF_8);
    }
}
