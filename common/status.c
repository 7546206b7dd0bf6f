/* status.c - status names and the thread-local error buffer. */
#include "status.h"

#include <stdarg.h>
#include <stdio.h>

static _Thread_local char last_error[512];

const char *cinfer_status_name(cinfer_status s)
{
    switch (s) {
#define CINFER_STATUS_NAME_(name, value, desc)                                 \
    case name:                                                                 \
        return #name;
        CINFER_STATUS_LIST(CINFER_STATUS_NAME_)
#undef CINFER_STATUS_NAME_
    }
    return "CINFER_E_UNKNOWN";
}

const char *cinfer_status_str(cinfer_status s)
{
    switch (s) {
#define CINFER_STATUS_STR_(name, value, desc)                                  \
    case name:                                                                 \
        return desc;
        CINFER_STATUS_LIST(CINFER_STATUS_STR_)
#undef CINFER_STATUS_STR_
    }
    return "unknown status";
}

cinfer_status cinfer_set_error(cinfer_status s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return s;
}

const char *cinfer_last_error(void) { return last_error; }

void cinfer_clear_error(void) { last_error[0] = '\0'; }
