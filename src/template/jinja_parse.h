/*
 * jinja_parse.h - turns Jinja template text into a syntax tree, with the
 * whitespace rules Hugging Face uses for chat templates (jinja2 with
 * trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=False).
 *
 *     struct sp_jarena a;
 *     sp_jarena_init(&a, 0);
 *     struct sp_jnode *root;
 *     if (sp_jinja_parse(&a, src, len, &root) != SP_OK)
 *         fprintf(stderr, "%s\n", sp_error_msg());   // "line 3: unexpected 'endfor'"
 *     ...
 *     sp_jarena_free(&a);                               // frees the tree
 *
 * Every node, and every string it points to, lives in the arena given to the
 * parser; text nodes may point into the source, which must outlive the tree.
 */
#ifndef SP_TEMPLATE_JINJA_PARSE_H
#define SP_TEMPLATE_JINJA_PARSE_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "template/jinja_value.h"

enum sp_jnode_kind {
    // statements
    SP_JN_BODY,        // kids: statements in order
    SP_JN_TEXT,        // str: literal output
    SP_JN_OUTPUT,      // a: expression to print
    SP_JN_IF,          // a: condition, b: then-body, c: else-body (or NULL; elif nests an IF)
    SP_JN_FOR,         // a: target, b: iterable, c: filter condition or NULL, kids[0]: body, kids[1]: else or NULL
    SP_JN_SET,         // a: target, b: value (NULL for a block set), c: block body; kids: filters of a block set
    SP_JN_MACRO,       // str: name; kids: PARAM nodes; a: body
    SP_JN_CALLBLOCK,   // a: CALL expression; b: body (the caller macro); kids: caller's PARAM nodes
    SP_JN_FILTERBLOCK, // a: body; kids: FILTER nodes (with a NULL operand)
    SP_JN_WITH,        // kids: SET nodes; a: body
    SP_JN_BREAK,
    SP_JN_CONTINUE,
    // expressions
    SP_JN_LITERAL, // val
    SP_JN_NAME,    // str
    SP_JN_ATTR,    // a: object; str: attribute name
    SP_JN_ITEM,    // a: object; b: key
    SP_JN_SLICE,   // a: object; kids[0..2]: start, stop, step (each may be NULL)
    SP_JN_CALL,    // a: callee; kids: arguments (KWARG nodes for keywords)
    SP_JN_KWARG,   // str: name; a: value
    SP_JN_FILTER,  // a: operand; str: filter name; kids: arguments
    SP_JN_TEST,    // a: operand; str: test name; kids: arguments; op: 1 when negated ("is not")
    SP_JN_UNARY,   // op: '-', '+' or 'n' (not); a: operand
    SP_JN_BINARY,  // op: see enum sp_jop; a, b: operands
    SP_JN_COMPARE, // a: first operand; kids: COMPARE_OP nodes (op, a: right operand)
    SP_JN_COMPARE_OP,
    SP_JN_AND,   // a, b
    SP_JN_OR,    // a, b
    SP_JN_COND,  // a: value if true; b: condition; c: value if false (NULL: undefined)
    SP_JN_LIST,  // kids: items
    SP_JN_TUPLE, // kids: items
    SP_JN_DICT,  // kids: pairs, as KWARG-less PAIR nodes
    SP_JN_PAIR,  // a: key; b: value
    SP_JN_PARAM, // str: name; a: default or NULL
    SP_JN_KIND_COUNT
};

enum sp_jop {
    SP_JOP_ADD = 1,
    SP_JOP_SUB,
    SP_JOP_MUL,
    SP_JOP_DIV,
    SP_JOP_FLOORDIV,
    SP_JOP_MOD,
    SP_JOP_POW,
    SP_JOP_CONCAT, // ~
    SP_JOP_EQ,
    SP_JOP_NE,
    SP_JOP_LT,
    SP_JOP_LE,
    SP_JOP_GT,
    SP_JOP_GE,
    SP_JOP_IN,
    SP_JOP_NOTIN,
    SP_JOP_COUNT
};

struct sp_jnode {
    enum sp_jnode_kind kind;
    int op;   // UNARY, BINARY, COMPARE_OP, TEST: the operator; FOR, MACRO, CALLBLOCK:
              // flags the evaluator computes once when compiling
    int line; // 1-based source line
    struct sp_jnode *a, *b, *c;
    struct sp_jnode **kids; // (nkids)
    int64_t nkids;
    const char *str; // NUL-terminated
    size_t len;
    struct sp_jv val;
};

/* Parses len bytes of template text. On failure returns SP_ERR_FORMAT with
 * the detail "line N: what is wrong" recorded. Nesting deeper than the
 * parser's limit is refused rather than followed down the C stack. */
enum sp_status sp_jinja_parse(struct sp_jarena *a, const char *src, size_t len, struct sp_jnode **root);

#endif
