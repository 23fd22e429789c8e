/*
 * jschema.h - JSON Schema compiled to a grammar (runtime/grammar.h), for
 * structured outputs (response_format json_schema) and tool-call arguments
 * held to the tool's `parameters`.
 *
 * The subset is what structured-output clients send: type (a name or a
 * list), object with properties / required / additionalProperties, array
 * with items / prefixItems / minItems / maxItems, string with minLength /
 * maxLength and the formats date, time, date-time and uuid, number and
 * integer (a minimum >= 0 drops the sign), boolean, null, enum, const, anyOf
 * and oneOf (both as "any of"), allOf over object schemas, nullable, and
 * local $ref ("#", "#/$defs/...", "#/definitions/...", recursion allowed).
 * Keywords outside it (pattern, other formats, multipleOf, numeric bounds
 * other than the sign, uniqueItems, ...) are not enforced.
 *
 * Properties are written in the schema's order, each optional one possibly
 * left out; other keys only when additionalProperties is true or a schema
 * (an object with no properties takes any keys). Whitespace between tokens
 * is allowed in runs of at most 20 bytes. Numbers have at most 16 integer
 * digits, 15 fraction digits and 3 exponent digits, so a model cannot be
 * held in an endless number.
 *
 *     struct sp_gbuild *b = sp_gb_new();
 *     struct sp_jschema *c = sp_jschema_new(b);
 *     int args = sp_jschema_rule(c, schema, "tools[0].function.parameters");
 *     if (args < 0) fail(sp_jschema_error(c));
 *     ... (more rules, literals) ...
 *     sp_jschema_free(c);
 *     sp_gb_finish(b, root, &grammar);
 */
#ifndef SP_SERVER_JSCHEMA_H
#define SP_SERVER_JSCHEMA_H

#include <cjson/cJSON.h>

#include "runtime/grammar.h"

struct sp_jschema;

/* A compiler adding rules to b (NULL when out of memory). */
struct sp_jschema *sp_jschema_new(struct sp_gbuild *b);
void sp_jschema_free(struct sp_jschema *c);
/* The rule of the values the schema allows; `where` names the schema in
 * error messages (e.g. "response_format.json_schema.schema"). -1 on error:
 * sp_jschema_error says what and where. */
int sp_jschema_rule(struct sp_jschema *c, const cJSON *schema, const char *where);
/* Rules of any JSON object, and of optional whitespace. */
int sp_jschema_any_object(struct sp_jschema *c);
int sp_jschema_ws(struct sp_jschema *c);
/* Any UTF-8 text (tab, newline and carriage return included, other control
 * characters not) without the ASCII bytes in `exclude`. */
int sp_jschema_text(struct sp_jschema *c, const char *exclude);
const char *sp_jschema_error(const struct sp_jschema *c);

/* The grammar of optional whitespace and then one value of `schema` (NULL:
 * any JSON object). SP_ERR_ARG with the message set (naming `where`) for a
 * schema outside the subset. */
enum sp_status sp_jschema_grammar(const cJSON *schema, const char *where, struct sp_grammar **out);

#endif
