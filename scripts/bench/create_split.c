// Empty files created in one directory by THREADS threads (fs_mark -s 0 -S 0's loop: open with
// O_CREAT, close), timing the open and the close of each. The kernel holds the directory's lock
// across a create's lookup and the create itself, which happen inside open(2); the close runs
// outside it. So the share of the threads' time spent inside open bounds what a second thread
// in the same directory can add: at most 1/share times one thread's rate, whatever the
// filesystem below does. Prints one JSON line.
// Usage: create_split DIR FILES [THREADS]
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static const char *dir;
static long per_thread;

struct result {
    int id;
    double open_s, close_s;
    int failed;
};

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void *creator(void *arg) {
    struct result *r = arg;
    char path[4096];
    for (long i = 0; i < per_thread; i++) {
        snprintf(path, sizeof path, "%s/c%d-%ld", dir, r->id, i);
        double t0 = now();
        int fd = open(path, O_CREAT | O_EXCL | O_WRONLY, 0644);
        double t1 = now();
        if (fd < 0) {
            perror(path);
            r->failed = 1;
            return NULL;
        }
        close(fd);
        double t2 = now();
        r->open_s += t1 - t0;
        r->close_s += t2 - t1;
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s DIR FILES [THREADS]\n", argv[0]);
        return 2;
    }
    dir = argv[1];
    long files = atol(argv[2]);
    int threads = argc > 3 ? atoi(argv[3]) : 1;
    if (files <= 0 || threads <= 0 || threads > 64) {
        fprintf(stderr, "create_split: FILES must be positive and THREADS in 1..64\n");
        return 2;
    }
    per_thread = files / threads;
    pthread_t tid[64];
    struct result res[64] = {0};
    double start = now();
    for (int t = 0; t < threads; t++) {
        res[t].id = t;
        if (pthread_create(&tid[t], NULL, creator, &res[t]) != 0) {
            fprintf(stderr, "create_split: cannot start a thread\n");
            return 1;
        }
    }
    double open_s = 0, close_s = 0;
    int failed = 0;
    for (int t = 0; t < threads; t++) {
        pthread_join(tid[t], NULL);
        open_s += res[t].open_s;
        close_s += res[t].close_s;
        failed |= res[t].failed;
    }
    double wall = now() - start;
    if (failed) {
        return 1;
    }
    long made = per_thread * threads;
    printf("{\"files\": %ld, \"threads\": %d, \"seconds\": %.6f, \"files_per_s\": %.1f, "
           "\"open_us\": %.3f, \"close_us\": %.3f, \"open_share\": %.4f}\n",
           made, threads, wall, made / wall, open_s / made * 1e6, close_s / made * 1e6,
           open_s / (wall * threads));
    return 0;
}
