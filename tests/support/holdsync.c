/* A fault injector for fdatasync(2) and fsync(2), for durability tests.
 *
 * Loaded into a service process with LD_PRELOAD, it obeys the control directory that
 * HOLDSYNC_DIR names (tests/support/holdsync.py drives it):
 *
 *   <dir>/hold   while present, every sync waits before it runs; a waiting sync shows
 *                as <dir>/held-<thread id>, holding the path of the file being synced
 *   <dir>/fail   while present, every sync fails with EIO and syncs nothing
 *
 * Without HOLDSYNC_DIR in the environment every call goes straight to the C library.
 * The broker's RocksDB calls these through the C library (rocksdict imports them), so
 * the WAL sync that every flush=sync acknowledgement waits for passes through here.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

typedef int (*sync_fn)(int);

static int present(const char *dir, const char *name) {
    char path[PATH_MAX];
    struct stat st;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return stat(path, &st) == 0;
}

/* Writes <dir>/held-<tid> (via a rename, so a reader never sees it half written). */
static void mark_held(const char *dir, int fd, char *marker, size_t size) {
    char link[64], target[PATH_MAX], tmp[PATH_MAX];
    long tid = syscall(SYS_gettid);
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, target, sizeof target - 1);
    target[n < 0 ? 0 : n] = '\0';
    snprintf(marker, size, "%s/held-%ld", dir, tid);
    snprintf(tmp, sizeof tmp, "%s/.held-%ld", dir, tid);
    int out = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (out >= 0) {
        ssize_t written = write(out, target, strlen(target));
        (void)written;
        close(out);
        rename(tmp, marker);
    }
}

/* 0: go on and sync; -1 (errno EIO): fail this sync. */
static int gate(int fd) {
    const char *dir = getenv("HOLDSYNC_DIR");
    if (dir == NULL) {
        return 0;
    }
    if (present(dir, "hold")) {
        char marker[PATH_MAX];
        struct timespec pause = {0, 200 * 1000};
        int saved = errno;
        mark_held(dir, fd, marker, sizeof marker);
        while (present(dir, "hold")) {
            nanosleep(&pause, NULL);
        }
        unlink(marker);
        errno = saved;
    }
    if (present(dir, "fail")) {
        errno = EIO;
        return -1;
    }
    return 0;
}

static int forward(const char *name, sync_fn *real, int fd) {
    if (*real == NULL) {
        *real = (sync_fn)dlsym(RTLD_NEXT, name);
    }
    if (gate(fd) < 0) {
        return -1;
    }
    return (*real)(fd);
}

int fdatasync(int fd) {
    static sync_fn real;
    return forward("fdatasync", &real, fd);
}

int fsync(int fd) {
    static sync_fn real;
    return forward("fsync", &real, fd);
}
