/*
 * log.h - leveled logging to stderr.
 *
 *     sp_log_set_level(SP_LOG_DEBUG);
 *     sp_log(SP_LOG_INFO, "loaded %d shards", n);
 */
#ifndef SP_CORE_LOG_H
#define SP_CORE_LOG_H

enum sp_log_level { SP_LOG_ERROR, SP_LOG_WARN, SP_LOG_INFO, SP_LOG_DEBUG, SP_LOG_LEVEL_COUNT };

void sp_log_set_level(enum sp_log_level level);
enum sp_log_level sp_log_get_level(void);
void sp_log(enum sp_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
