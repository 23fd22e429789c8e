/*
 * progress.h - the progress of a long load on stderr: bytes done of a
 * total, the percentage, the rate and the time taken. Every path that
 * brings weights in (copies into memory, pages faulted in, copies to a
 * GPU) reports through it, so they all look and behave alike.
 *
 *     struct sp_progress p;
 *     sp_progress_begin(&p, "weights in memory", total_bytes, NULL);
 *     for (each chunk) { copy(chunk); sp_progress_add(&p, chunk_bytes); }
 *     sp_progress_end(&p, true);  // the final line, shown or not before
 *
 * Nothing is written for the first SP_PROGRESS_DELAY_S seconds, so a short
 * load prints at most its final line. Then, on a terminal, one line is
 * rewritten in place (at most every SP_PROGRESS_TTY_S); elsewhere (a log
 * file, a pipe) a plain line is written at most every SP_PROGRESS_LINES_S.
 * The line, in the log's format:
 *
 *     info: weights in memory: 3.21 of 12.00 GiB (26%), 1.85 GB/s, 1.7 s
 *
 * and the final line, which replaces the rewritten one on a terminal:
 *
 *     info: weights in memory: 12884901888 bytes (12.00 GiB) in 6.51 s, 1.98 GB/s
 *
 * Progress is an info message: below SP_LOG_INFO (sp_log_set_level, the
 * CLI's --quiet) nothing at all is written. One thread reports a load; the
 * struct holds no resources and needs no freeing.
 */
#ifndef SP_CORE_PROGRESS_H
#define SP_CORE_PROGRESS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#define SP_PROGRESS_DELAY_S 1.0  // nothing but the final line for loads shorter than this
#define SP_PROGRESS_TTY_S 0.2    // between rewrites of the line on a terminal
#define SP_PROGRESS_LINES_S 5.0  // between plain lines elsewhere

enum sp_progress_mode {
    SP_PROGRESS_AUTO,   // OFF below SP_LOG_INFO, else TTY where the output is a terminal, else LINES
    SP_PROGRESS_TTY,    // one line rewritten in place
    SP_PROGRESS_LINES,  // plain lines
    SP_PROGRESS_OFF,    // nothing, final line included
};

/* Where and how a progress is written (NULL to sp_progress_begin: stderr,
 * AUTO, the monotonic clock). */
struct sp_progress_opts {
    enum sp_progress_mode mode;
    FILE *out;            // NULL: stderr
    double (*now)(void);  // seconds; NULL: sp_now_s
};

struct sp_progress {
    char what[64];
    uint64_t total, done;
    enum sp_progress_mode mode;  // resolved: TTY, LINES or OFF
    FILE *out;
    double (*now)(void);
    double t0, t_last;  // the start, and the last line written
    bool shown;         // a progress line was written
    bool on_line;       // the terminal's cursor is at the end of the rewritten line
};

/* Starts reporting a load of total bytes described by what ("weights in
 * memory"; cut to 63 bytes). */
void sp_progress_begin(struct sp_progress *p, const char *what, uint64_t total, const struct sp_progress_opts *o);
/* Counts bytes more done; writes a line when one is due. */
void sp_progress_add(struct sp_progress *p, uint64_t bytes);
/* Ends the load: the rewritten line is cleared, and the final line is
 * written where `summary` asks for it or a progress line was shown. */
void sp_progress_end(struct sp_progress *p, bool summary);
/* Seconds since sp_progress_begin. */
double sp_progress_elapsed(const struct sp_progress *p);

#endif
