// `cilfs bench fs`'s workloads on a kernel filesystem, as a control for what a second thread can
// add on this machine: each thread in a directory of its own (or, with `shared`, all in one),
// THREADS threads for SECONDS.
//   create  empty files, open(O_CREAT) then close
//   unlink  files the thread created beforehand (not timed)
//   fsync   a 4 KiB write at one of 256 places in the thread's file, then fsync
// Prints one JSON line: operations a second over all threads.
// Usage: dir_ops WORKLOAD DIR THREADS SECONDS [shared]
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

enum workload { CREATE, UNLINK, FSYNC };

static enum workload work;
static const char *root;
static atomic_int stop;
static atomic_int ended; /* workers that returned */
static int shared;       /* every thread in directory t0, as `bench fs --shared-dir` */

/* The directory thread `id` works in. */
static int dir_of(int id) { return shared ? 0 : id; }
// Unlinks need their files made first: enough that no thread runs out within SECONDS.
static long prepared;

struct worker {
    int id;
    long ops;
    int failed;
    pthread_t tid;
};

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static int make_file(const char *path) {
    int fd = open(path, O_CREAT | O_EXCL | O_WRONLY, 0644);
    if (fd < 0) {
        perror(path);
        return -1;
    }
    close(fd);
    return 0;
}

static void *work_until_stopped(struct worker *w) {
    char path[4096];
    char block[4096];
    memset(block, w->id, sizeof block);
    int fd = -1;
    if (work == FSYNC) {
        snprintf(path, sizeof path, "%s/t%d/file%d", root, dir_of(w->id), w->id);
        fd = open(path, O_CREAT | O_RDWR, 0644);
        if (fd < 0) {
            perror(path);
            w->failed = 1;
            return NULL;
        }
    }
    for (long i = 0; !atomic_load_explicit(&stop, memory_order_relaxed); i++) {
        switch (work) {
        case CREATE:
            snprintf(path, sizeof path, "%s/t%d/c%d_%ld", root, dir_of(w->id), w->id, i);
            if (make_file(path) < 0) {
                w->failed = 1;
                return NULL;
            }
            break;
        case UNLINK:
            if (i >= prepared) {
                return NULL;
            }
            snprintf(path, sizeof path, "%s/t%d/u%d_%ld", root, dir_of(w->id), w->id, i);
            if (unlink(path) < 0) {
                perror(path);
                w->failed = 1;
                return NULL;
            }
            break;
        case FSYNC:
            if (pwrite(fd, block, sizeof block, (i % 256) * 4096) != sizeof block || fsync(fd) < 0) {
                perror("write and fsync");
                w->failed = 1;
                close(fd);
                return NULL;
            }
            break;
        }
        w->ops++;
    }
    if (fd >= 0) {
        close(fd);
    }
    return NULL;
}

static void *run(void *arg) {
    void *r = work_until_stopped(arg);
    atomic_fetch_add(&ended, 1);
    return r;
}

int main(int argc, char **argv) {
    if (argc != 5 && !(argc == 6 && !strcmp(argv[5], "shared"))) {
        fprintf(stderr, "usage: %s create|unlink|fsync DIR THREADS SECONDS [shared]\n", argv[0]);
        return 2;
    }
    shared = argc == 6;
    if (!strcmp(argv[1], "create")) {
        work = CREATE;
    } else if (!strcmp(argv[1], "unlink")) {
        work = UNLINK;
    } else if (!strcmp(argv[1], "fsync")) {
        work = FSYNC;
    } else {
        fprintf(stderr, "dir_ops: unknown workload %s\n", argv[1]);
        return 2;
    }
    root = argv[2];
    int threads = atoi(argv[3]);
    double seconds = atof(argv[4]);
    if (threads <= 0 || threads > 64 || seconds <= 0) {
        fprintf(stderr, "dir_ops: THREADS must be in 1..64 and SECONDS positive\n");
        return 2;
    }
    struct worker w[64] = {0};
    char path[4096];
    prepared = work == UNLINK ? 200000 : 0;
    for (int t = 0; t < threads; t++) {
        snprintf(path, sizeof path, "%s/t%d", root, dir_of(t));
        if ((!shared || t == 0) && mkdir(path, 0755) < 0) {
            perror(path);
            return 1;
        }
        for (long i = 0; i < prepared; i++) {
            snprintf(path, sizeof path, "%s/t%d/u%d_%ld", root, dir_of(t), t, i);
            if (make_file(path) < 0) {
                return 1;
            }
        }
    }
    sync();
    double start = now();
    for (int t = 0; t < threads; t++) {
        w[t].id = t;
        if (pthread_create(&w[t].tid, NULL, run, &w[t]) != 0) {
            fprintf(stderr, "dir_ops: cannot start a thread\n");
            return 1;
        }
    }
    struct timespec nap = {0, 5 * 1000 * 1000};
    /* Ends with the last worker too: an unlink worker ends when its files are gone, and
       dividing by the time asked for would count time nobody worked. */
    while (now() - start < seconds && atomic_load(&ended) < threads) {
        nanosleep(&nap, NULL);
    }
    atomic_store(&stop, 1);
    long ops = 0;
    int failed = 0;
    for (int t = 0; t < threads; t++) {
        pthread_join(w[t].tid, NULL);
        ops += w[t].ops;
        failed |= w[t].failed;
    }
    double wall = now() - start;
    if (failed) {
        return 1;
    }
    printf("{\"workload\": \"%s\", \"threads\": %d, \"seconds\": %.6f, \"ops\": %ld, "
           "\"ops_per_s\": %.1f}\n",
           argv[1], threads, wall, ops, ops / wall);
    return 0;
}
