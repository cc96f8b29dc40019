// Random lookups (fstatat) in one directory grown to 1k, 10k, 100k and 1M names on a kernel
// filesystem, the same shape of measurement as `cilfs bench dir`: the reference for how much of
// a lookup's growth with directory size the machine's memory hierarchy alone accounts for.
// Usage: dir_lookups DIR [ENTRIES] [LOOKUPS]
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static unsigned long long rng = 88172645463325252ull;
static unsigned long long next(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s DIR [ENTRIES] [LOOKUPS]\n", argv[0]);
        return 2;
    }
    long entries = argc > 2 ? atol(argv[2]) : 1000000;
    long lookups = argc > 3 ? atol(argv[3]) : 200000;
    int dfd = open(argv[1], O_RDONLY | O_DIRECTORY);
    if (dfd < 0) {
        perror(argv[1]);
        return 2;
    }
    char name[64];
    struct stat st;
    long made = 0;
    for (long target = 1000; made < entries; target *= 10) {
        if (target > entries)
            target = entries;
        for (; made < target; made++) {
            snprintf(name, sizeof name, "entry-%08ld", made);
            int f = openat(dfd, name, O_CREAT | O_WRONLY, 0644);
            if (f < 0) {
                perror(name);
                return 1;
            }
            close(f);
        }
        // The name formatting alone, timed apart so it can be subtracted.
        double t0 = now();
        for (long i = 0; i < lookups; i++) {
            snprintf(name, sizeof name, "entry-%08ld", (long)(next() % made));
            __asm__ volatile("" ::"r"(name) : "memory");
        }
        double fmt = (now() - t0) / lookups * 1e9;
        t0 = now();
        for (long i = 0; i < lookups; i++) {
            snprintf(name, sizeof name, "entry-%08ld", (long)(next() % made));
            if (fstatat(dfd, name, &st, 0)) {
                perror(name);
                return 1;
            }
        }
        double ns = (now() - t0) / lookups * 1e9 - fmt;
        printf("{\"entries\":%ld,\"lookup_ns_per_entry\":%.0f}\n", made, ns);
        fflush(stdout);
    }
    return 0;
}
