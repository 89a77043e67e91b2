// The machine's memory latency, sampled beside a benchmark (bench/machine.py runs it, as
// `java MemoryProbe.java PERIOD_MS STEPS MIB`: the JDK's single-file launch, no build step).
//
// A pointer chase: an int array of MIB MiB holds one random cycle through every slot (Sattolo's
// shuffle), so each load's address comes from the load before it; the CPU can neither prefetch it
// nor overlap it with the next, and the array is larger than the caches, so a step costs one
// memory latency (TLB misses included). Every PERIOD_MS the probe chases STEPS steps and prints
// one JSON line: the wall clock around the chase (ms) and the thread's CPU time per step (ns;
// CPU time, so a wait for a core is not counted as memory latency). The work is the same in
// every sample: what moves is the machine's memory system (other tenants of the host, its
// caches' and DRAM's load), the noise floor under any memory-bound process on it.
import java.lang.management.ManagementFactory;
import java.lang.management.ThreadMXBean;
import java.util.SplittableRandom;

public final class MemoryProbe {
    public static void main(String[] args) throws InterruptedException {
        long periodMs = Long.parseLong(args[0]);
        int steps = Integer.parseInt(args[1]);
        int slots = Integer.parseInt(args[2]) << 18; // 4-byte slots per MiB
        int[] next = new int[slots];
        for (int i = 0; i < slots; i++) {
            next[i] = i;
        }
        SplittableRandom rnd = new SplittableRandom(1);
        for (int i = slots - 1; i > 0; i--) {
            int j = rnd.nextInt(i);
            int t = next[i];
            next[i] = next[j];
            next[j] = t;
        }
        ThreadMXBean mx = ManagementFactory.getThreadMXBean();
        int p = 0;
        for (int i = 0; i < 50; i++) { // the chase compiled by C2 before the first sample
            p = chase(next, p, steps);
        }
        System.out.println("{\"event\":\"ready\",\"slots\":" + slots + "}");
        while (true) {
            long w0 = System.currentTimeMillis();
            long c0 = mx.getCurrentThreadCpuTime();
            p = chase(next, p, steps);
            long c1 = mx.getCurrentThreadCpuTime();
            long w1 = System.currentTimeMillis();
            // p is printed so that the chase's result is used and the loop cannot be removed
            System.out.println("{\"event\":\"sample\",\"t0\":" + w0 + ",\"t1\":" + w1 + ",\"ns\":"
                    + (double) (c1 - c0) / steps + ",\"p\":" + (p & 1) + "}");
            Thread.sleep(periodMs);
        }
    }

    static int chase(int[] next, int p, int steps) {
        for (int i = 0; i < steps; i++) {
            p = next[p];
        }
        return p;
    }
}
