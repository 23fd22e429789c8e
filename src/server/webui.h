/*
 * webui.h - the built-in chat page that `sparrow serve` answers at GET /:
 * one static HTML file (src/server/webui.html, inline CSS and JS) embedded
 * in the binary at build time, so the server needs no files beside it.
 *
 *     size_t len;
 *     const char *html = sp_webui_page(&len);   // static, never freed
 *     send(html, len, "text/html; charset=utf-8");
 */
#ifndef SP_SERVER_WEBUI_H
#define SP_SERVER_WEBUI_H

#include <stddef.h>

/* The page's bytes (static storage, NUL-terminated) and their count. */
const char *sp_webui_page(size_t *len);

#endif
