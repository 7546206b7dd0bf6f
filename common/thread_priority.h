/*
 * thread_priority.h - the scheduling class of the compute threads.
 *
 * The compute threads (the engine thread and the CPU backend's workers)
 * keep every core busy while a batch runs. Network threads that answer or
 * refuse a call need a core for a few microseconds at a time; run at the
 * same priority, they wait for the running thread's slice to end
 * (milliseconds on a busy machine). Lowering the compute threads' priority
 * lets the scheduler run the network threads as soon as they wake, while
 * the compute threads still get every cycle nobody else wants.
 *
 *   NORMAL  unchanged.
 *   LOW     nice +10: a waking thread of normal priority preempts sooner;
 *           a busy process of normal priority still leaves the compute
 *           threads about a tenth of a core each.
 *   IDLE    SCHED_IDLE: a waking thread of any other class preempts at
 *           once; a busy process of normal priority on the same cores (in
 *           the same cgroup) takes nearly all of their time. Meant for a
 *           server that has its cores (its own container) to itself.
 *
 *     cinfer_thread_set_priority(CINFER_THREAD_PRIO_IDLE);  // in the thread
 */
#ifndef CINFER_THREAD_PRIORITY_H
#define CINFER_THREAD_PRIORITY_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    CINFER_THREAD_PRIO_NORMAL = 0,
    CINFER_THREAD_PRIO_LOW,
    CINFER_THREAD_PRIO_IDLE,
} cinfer_thread_prio;

/* Puts the calling thread in the class. Best effort: returns 0 on success,
 * -1 where the system refused or has no per-thread classes (the thread
 * then runs as before). */
int cinfer_thread_set_priority(cinfer_thread_prio prio);

/* "normal", "low", "idle"; NULL for an unknown value. */
const char *cinfer_thread_prio_name(cinfer_thread_prio prio);

#ifdef __cplusplus
}
#endif

#endif /* CINFER_THREAD_PRIORITY_H */
