//go:build cgo

package sandbox

/*
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

// With cgo linked, syscall.AllThreadsSyscall refuses to run (threads
// created by C would be missed), so this does what glibc does for setuid
// and libcap's psx does for capset: signal every thread listed in
// /proc/self/task and make the call in the handler, on that thread.
// Rounds repeat until a listing shows no thread not yet done, because a
// thread created mid-round by a thread not yet done inherits the old state.

#define UT_MAX 4096

static long ut_nr, ut_a[6];
static int ut_tids[UT_MAX];
static atomic_int ut_done[UT_MAX];
static int ut_n;
static atomic_int ut_err;

static void ut_handler(int sig, siginfo_t *si, void *uc) {
	int saved = errno;
	pid_t self = (pid_t)syscall(SYS_gettid);
	// Only our own tgkill asks: a stray signal of this number is ignored.
	if (si->si_code != SI_TKILL || si->si_pid != getpid()) {
		errno = saved;
		return;
	}
	for (int i = 0; i < ut_n; i++) {
		if (ut_tids[i] != self || atomic_load(&ut_done[i])) {
			continue;
		}
		if (syscall(ut_nr, ut_a[0], ut_a[1], ut_a[2], ut_a[3], ut_a[4], ut_a[5]) == -1) {
			int zero = 0;
			atomic_compare_exchange_strong(&ut_err, &zero, errno);
		}
		atomic_store(&ut_done[i], 1);
		break;
	}
	errno = saved;
}

static int ut_known(int tid) {
	for (int i = 0; i < ut_n; i++) {
		if (ut_tids[i] == tid) {
			return 1;
		}
	}
	return 0;
}

// ut_list appends the threads not seen yet; returns how many, or -errno.
static int ut_list(void) {
	DIR *d = opendir("/proc/self/task");
	if (d == NULL) {
		return -errno;
	}
	int added = 0;
	struct dirent *e;
	while ((e = readdir(d)) != NULL) {
		int tid = atoi(e->d_name);
		if (tid <= 0 || ut_known(tid)) {
			continue;
		}
		if (ut_n == UT_MAX) {
			closedir(d);
			return -E2BIG;
		}
		ut_tids[ut_n] = tid;
		atomic_store(&ut_done[ut_n], 0);
		ut_n++;
		added++;
	}
	closedir(d);
	return added;
}

// usernet_all_threads returns 0 or an errno.
static int usernet_all_threads(int sig, long nr, long a1, long a2, long a3, long a4, long a5, long a6) {
	struct sigaction sa, old;
	memset(&sa, 0, sizeof sa);
	sa.sa_sigaction = ut_handler;
	sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART;
	sigfillset(&sa.sa_mask);
	ut_nr = nr;
	ut_a[0] = a1; ut_a[1] = a2; ut_a[2] = a3; ut_a[3] = a4; ut_a[4] = a5; ut_a[5] = a6;
	ut_n = 0;
	atomic_store(&ut_err, 0);
	if (sigaction(sig, &sa, &old) != 0) {
		return errno;
	}
	pid_t pid = getpid(), self = (pid_t)syscall(SYS_gettid);
	int rc = 0;
	int first = 0;
	for (;;) {
		int added = ut_list();
		if (added < 0) {
			rc = -added;
			break;
		}
		if (added == 0) {
			break;
		}
		for (int i = first; i < ut_n; i++) {
			if (ut_tids[i] == self) {
				if (syscall(nr, a1, a2, a3, a4, a5, a6) == -1) {
					int zero = 0;
					atomic_compare_exchange_strong(&ut_err, &zero, errno);
				}
				atomic_store(&ut_done[i], 1);
			} else if (syscall(SYS_tgkill, pid, ut_tids[i], sig) != 0) {
				// Exited since the listing: nothing to change there.
				atomic_store(&ut_done[i], 1);
			}
		}
		// Wait for the handlers; a thread that exits before its handler
		// runs never will, so look for the thread while waiting.
		struct timespec tick = {0, 1000000};
		for (int waited = 0; rc == 0; waited++) {
			int pending = 0;
			for (int i = first; i < ut_n; i++) {
				if (atomic_load(&ut_done[i])) {
					continue;
				}
				if (syscall(SYS_tgkill, pid, ut_tids[i], 0) != 0 && errno == ESRCH) {
					atomic_store(&ut_done[i], 1);
					continue;
				}
				pending++;
			}
			if (pending == 0) {
				break;
			}
			if (waited == 5000) {
				rc = ETIMEDOUT;
			}
			nanosleep(&tick, NULL);
		}
		if (rc != 0) {
			break;
		}
		first = ut_n;
	}
	// A signal still on its way finds Go's handler again, which ignores a
	// real-time signal nobody asked to be notified of.
	sigaction(sig, &old, NULL);
	if (rc == 0) {
		rc = atomic_load(&ut_err);
	}
	return rc;
}
*/
import "C"

import (
	"sync"
	"syscall"
)

// broadcastSignal carries the request to each thread. It must be one that
// no Go thread blocks: the runtime's os/signal thread blocks every signal
// nobody asked to be notified of, except the synchronous ones it must
// always see. SIGSYS is one of those (libcap's psx picks it for the same
// reason), and nothing raises it here: the filter never traps.
const broadcastSignal = int(syscall.SIGSYS)

// allThreadsMu serialises broadcasts: the handler's arguments are global.
var allThreadsMu sync.Mutex

// allThreads runs one system call on every thread of the process.
func allThreads(trap, a1, a2, a3, a4, a5, a6 uintptr) error {
	allThreadsMu.Lock()
	defer allThreadsMu.Unlock()
	rc := C.usernet_all_threads(C.int(broadcastSignal), C.long(trap),
		C.long(a1), C.long(a2), C.long(a3), C.long(a4), C.long(a5), C.long(a6))
	if rc != 0 {
		return syscall.Errno(rc)
	}
	return nil
}

// allThreadsMechanism names how allThreads reaches every thread, for the
// startup log.
const allThreadsMechanism = "signal to every thread in /proc/self/task (cgo build)"
