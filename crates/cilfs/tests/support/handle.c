/* File handles for the export test: `handle save PATH FILE` writes PATH's handle
 * (name_to_handle_at) to FILE; `handle open MOUNTDIR FILE` opens the file the handle in FILE
 * names (open_by_handle_at, needs CAP_DAC_READ_SEARCH) and copies it to stdout (or prints
 * "directory" for one). Exit status 3
 * and the errno name on stderr when open_by_handle_at fails. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: handle save PATH FILE | handle open MOUNTDIR FILE\n");
        return 2;
    }
    if (strcmp(argv[1], "save") == 0) {
        struct file_handle *h = malloc(sizeof(*h) + MAX_HANDLE_SZ);
        int mount_id;
        h->handle_bytes = MAX_HANDLE_SZ;
        if (name_to_handle_at(AT_FDCWD, argv[2], h, &mount_id, 0) != 0) {
            perror("name_to_handle_at");
            return 1;
        }
        FILE *f = fopen(argv[3], "wb");
        if (!f || fwrite(h, sizeof(*h) + h->handle_bytes, 1, f) != 1 || fclose(f) != 0) {
            perror(argv[3]);
            return 1;
        }
        return 0;
    }
    int dir = open(argv[2], O_RDONLY | O_DIRECTORY);
    if (dir < 0) {
        perror(argv[2]);
        return 1;
    }
    struct file_handle *h = malloc(sizeof(*h) + MAX_HANDLE_SZ);
    FILE *f = fopen(argv[3], "rb");
    if (!f || fread(h, 1, sizeof(*h) + MAX_HANDLE_SZ, f) < sizeof(*h)) {
        perror(argv[3]);
        return 1;
    }
    int fd = open_by_handle_at(dir, h, O_RDONLY);
    if (fd < 0) {
        fprintf(stderr, "%s\n", strerrorname_np(errno));
        return 3;
    }
    struct stat st;
    if (fstat(fd, &st) == 0 && S_ISDIR(st.st_mode)) {
        printf("directory\n");
        return 0;
    }
    char buf[4096];
    ssize_t n;
    while ((n = read(fd, buf, sizeof buf)) > 0) {
        if (write(1, buf, n) != n) {
            return 1;
        }
    }
    return n < 0 ? 1 : 0;
}
