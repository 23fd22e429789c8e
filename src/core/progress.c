/* progress.c - the progress of a long load on stderr (progress.h). */
#include "core/progress.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/clock.h"
#include "core/log.h"

#define GIB 1073741824.0
#define MIB 1048576.0

void sp_progress_begin(struct sp_progress *p, const char *what, uint64_t total, const struct sp_progress_opts *o) {
    memset(p, 0, sizeof *p);
    snprintf(p->what, sizeof p->what, "%s", what);
    p->total = total;
    p->out = o && o->out ? o->out : stderr;
    p->now = o && o->now ? o->now : sp_now_s;
    p->mode = o ? o->mode : SP_PROGRESS_AUTO;
    if (p->mode == SP_PROGRESS_AUTO) {
        if (sp_log_get_level() < SP_LOG_INFO)
            p->mode = SP_PROGRESS_OFF;
        else
            p->mode = isatty(fileno(p->out)) ? SP_PROGRESS_TTY : SP_PROGRESS_LINES;
    }
    p->t0 = p->t_last = p->now();
}

double sp_progress_elapsed(const struct sp_progress *p) { return p->now() - p->t0; }

static double rate_gbs(uint64_t bytes, double s) { return s > 0 ? (double)bytes / s / 1e9 : 0.0; }

/* "3.21 of 12.00 GiB (26%), 1.85 GB/s, 1.7 s" */
static void format_line(const struct sp_progress *p, double t, char *buf, size_t cap) {
    double unit = p->total >= (uint64_t)GIB ? GIB : MIB;
    const char *uname = unit == GIB ? "GiB" : "MiB";
    uint64_t done = p->total && p->done > p->total ? p->total : p->done;
    int n = snprintf(buf, cap, "info: %s: %.2f of %.2f %s", p->what, (double)done / unit, (double)p->total / unit, uname);
    if (n < 0 || (size_t)n >= cap) return;
    if (p->total) n += snprintf(buf + n, cap - (size_t)n, " (%d%%)", (int)(100.0 * (double)done / (double)p->total));
    if ((size_t)n >= cap) return;
    snprintf(buf + n, cap - (size_t)n, ", %.2f GB/s, %.1f s", rate_gbs(p->done, t - p->t0), t - p->t0);
}

void sp_progress_add(struct sp_progress *p, uint64_t bytes) {
    p->done += bytes;
    if (p->mode == SP_PROGRESS_OFF) return;
    double t = p->now();
    if (t - p->t0 < SP_PROGRESS_DELAY_S) return;
    double every = p->mode == SP_PROGRESS_TTY ? SP_PROGRESS_TTY_S : SP_PROGRESS_LINES_S;
    if (p->shown && t - p->t_last < every) return;
    char line[256];
    format_line(p, t, line, sizeof line);
    flockfile(p->out);
    if (p->mode == SP_PROGRESS_TTY) {
        /* back to the line's start, the new text, the rest of the old one erased */
        fprintf(p->out, "\r%s\033[K", line);
        p->on_line = true;
    } else {
        fprintf(p->out, "%s\n", line);
    }
    fflush(p->out);
    funlockfile(p->out);
    p->shown = true;
    p->t_last = t;
}

void sp_progress_end(struct sp_progress *p, bool summary) {
    if (p->mode == SP_PROGRESS_OFF) return;
    double t = p->now(), s = t - p->t0;
    flockfile(p->out);
    if (p->on_line) fputs("\r\033[K", p->out);
    p->on_line = false;
    if (summary || p->shown) {
        double unit = p->done >= (uint64_t)GIB ? GIB : MIB;
        fprintf(p->out, "info: %s: %llu bytes (%.2f %s) in %.2f s, %.2f GB/s\n", p->what, (unsigned long long)p->done,
                (double)p->done / unit, unit == GIB ? "GiB" : "MiB", s, rate_gbs(p->done, s));
    }
    fflush(p->out);
    funlockfile(p->out);
}
