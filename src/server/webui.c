/*
 * webui.c - embeds src/server/webui.html with the assembler's .incbin: no
 * generator and no tool beyond the compiler. The path is relative to the
 * folder the compiler runs in (the repository root, where the Makefile
 * runs); the Makefile lists the HTML as a prerequisite of this object,
 * since the compiler's dependency files do not see .incbin.
 */
#include "server/webui.h"

__asm__(".pushsection .rodata\n"
        ".global sp_webui_html_start\n"
        ".type sp_webui_html_start, @object\n"
        ".balign 16\n"
        "sp_webui_html_start:\n"
        ".incbin \"src/server/webui.html\"\n"
        ".global sp_webui_html_end\n"
        ".type sp_webui_html_end, @object\n"
        "sp_webui_html_end:\n"
        ".byte 0\n"
        ".popsection\n");

extern const char sp_webui_html_start[], sp_webui_html_end[];

const char *sp_webui_page(size_t *len) {
    *len = (size_t)(sp_webui_html_end - sp_webui_html_start);
    return sp_webui_html_start;
}
