// The machine's memory latency, sampled beside a benchmark (bench/machine.py runs it, as
// `java MemoryProbe.java PERIOD_MS STEPS MIB CACHE_MIB`: the JDK's single-file launch, no build
// step).
//
// A pointer chase: an int array of MIB MiB holds one random cycle through every slot (Sattolo's
// shuffle), so each load's address comes from the load before it; the CPU can neither prefetch it
// nor overlap it with the next, and the array is larger than the caches, so a step costs one
// memory latency (TLB misses included). Every PERIOD_MS the probe chases STEPS steps and prints
// one JSON line: the wall clock around the chase (ms) and the thread's CPU time per step (ns;
// CPU time, so a wait for a core is not counted as memory latency). The work is the same in
// every sample: what moves is the machine's memory system (other tenants of the host, its
// caches' and DRAM's load), the noise floor under any memory-bound process on it.
//
// A second chase, over CACHE_MIB MiB with one slot per 64-byte line, stands for a working set
// that lives in the shared last-level cache (a server's hash table, a JVM's young generation):
// each sample walks its cycle once unmeasured, so the lines are loaded, then once measured
// (cache_ns). While the cache is this VM's to use, a step costs a cache hit; when other tenants
// of the host take the cache, the lines are evicted between steps and it costs up to a memory
// latency. On this VM, idle, a C build of the two chases saw this one go from 22-27 ns to 134 ns
// a step within minutes while the large one moved by 29 %: the large chase alone understates
// what a cache-resident process feels.
import java.lang.management.ManagementFactory;
import java.lang.management.ThreadMXBean;
import java.util.SplittableRandom;

public final class MemoryProbe {
    public static void main(String[] args) throws InterruptedException {
        long periodMs = Long.parseLong(args[0]);
        int steps = Integer.parseInt(args[1]);
        int slots = Integer.parseInt(args[2]) << 18; // 4-byte slots per MiB
        int[] next = cycle(slots, 1);
        int cacheMib = Integer.parseInt(args[3]);
        int[] near = cycle(cacheMib << 18, 16); // one 4-byte slot in each 64-byte line
        int cacheLines = cacheMib << 14; // 64-byte lines per MiB
        ThreadMXBean mx = ManagementFactory.getThreadMXBean();
        int p = 0;
        int q = 0;
        for (int i = 0; i < 50; i++) { // the chases compiled by C2 before the first sample
            p = chase(next, p, steps);
            q = chase(near, q, cacheLines);
        }
        System.out.println("{\"event\":\"ready\",\"slots\":" + slots + ",\"cache_lines\":" + cacheLines + "}");
        while (true) {
            long w0 = System.currentTimeMillis();
            long c0 = mx.getCurrentThreadCpuTime();
            p = chase(next, p, steps);
            long c1 = mx.getCurrentThreadCpuTime();
            q = chase(near, q, cacheLines); // loads the cache-sized set ...
            long c2 = mx.getCurrentThreadCpuTime();
            q = chase(near, q, cacheLines); // ... and times a walk over it
            long c3 = mx.getCurrentThreadCpuTime();
            long w1 = System.currentTimeMillis();
            // p and q are printed so that the chases' results are used and the loops not removed
            System.out.println("{\"event\":\"sample\",\"t0\":" + w0 + ",\"t1\":" + w1 + ",\"ns\":"
                    + (double) (c1 - c0) / steps + ",\"cache_ns\":" + (double) (c3 - c2) / cacheLines
                    + ",\"p\":" + ((p ^ q) & 1) + "}");
            Thread.sleep(periodMs);
        }
    }

    // An array whose slots at multiples of STRIDE point at one another in one random cycle
    // through all N = length / STRIDE of them (Sattolo's shuffle of the identity, in place: no
    // second array, so the 64 MiB chase fits the probe's heap): from any of them, N steps visit
    // each once.
    static int[] cycle(int length, int stride) {
        int n = length / stride;
        int[] next = new int[length];
        for (int i = 0; i < n; i++) {
            next[i * stride] = i * stride;
        }
        SplittableRandom rnd = new SplittableRandom(1);
        for (int i = n - 1; i > 0; i--) {
            int j = rnd.nextInt(i) * stride;
            int t = next[i * stride];
            next[i * stride] = next[j];
            next[j] = t;
        }
        return next;
    }

    static int chase(int[] next, int p, int steps) {
        for (int i = 0; i < steps; i++) {
            p = next[p];
        }
        return p;
    }
}
