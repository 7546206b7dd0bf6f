/*
 * thread_priority.c - see thread_priority.h.
 *
 * On Linux a nice value and a scheduling policy belong to a thread
 * (setpriority with a thread id and sched_setscheduler with 0 act on one
 * thread, contrary to POSIX's process-wide wording).
 */
#define _GNU_SOURCE
#include "thread_priority.h"

#include <errno.h>

#ifdef __linux__
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

/* nice offset of LOW */
#define LOW_NICE 10

int cinfer_thread_set_priority(cinfer_thread_prio prio)
{
    if (prio == CINFER_THREAD_PRIO_NORMAL)
        return 0;
#ifdef __linux__
    if (prio == CINFER_THREAD_PRIO_IDLE) {
        struct sched_param sp = {.sched_priority = 0};
        return sched_setscheduler(0, SCHED_IDLE, &sp) == 0 ? 0 : -1;
    }
    if (prio == CINFER_THREAD_PRIO_LOW) {
        id_t tid = (id_t)syscall(SYS_gettid);
        errno = 0;
        int cur = getpriority(PRIO_PROCESS, tid);
        if (cur == -1 && errno != 0)
            return -1;
        int want = cur > 19 - LOW_NICE ? 19 : cur + LOW_NICE;
        return setpriority(PRIO_PROCESS, tid, want) == 0 ? 0 : -1;
    }
#endif
    return -1;
}

const char *cinfer_thread_prio_name(cinfer_thread_prio prio)
{
    switch (prio) {
    case CINFER_THREAD_PRIO_NORMAL: return "normal";
    case CINFER_THREAD_PRIO_LOW: return "low";
    case CINFER_THREAD_PRIO_IDLE: return "idle";
    }
    return NULL;
}
