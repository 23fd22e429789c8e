/*
 * constrain.h - the grammars that hold a reply to what the request asked
 * for: response_format (json_object, json_schema) and forced tool calls
 * (tool_choice "required" or a named function), whose names are limited to
 * the declared tools and whose arguments are held to each tool's
 * `parameters` schema (server/jschema.h says which keywords are enforced).
 */
#ifndef SP_SERVER_CONSTRAIN_H
#define SP_SERVER_CONSTRAIN_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>

#include "runtime/grammar.h"
#include "server/chat_parse.h"

/* The grammar response_format asks for: NULL for {"type": "text"}, any
 * JSON object for json_object, the schema's values for json_schema
 * ({"type": "json_schema", "json_schema": {"name", "schema", "strict"}}; no
 * schema: any JSON object). false with a message naming the field when the
 * value is malformed or the schema is outside the subset. */
bool sp_response_format_grammar(const cJSON *rf, struct sp_grammar **out, char *msg, size_t cap);

/* The grammar of what the model writes after the start of a forced tool
 * call in `format` (server.c writes that start into the prompt): with
 * `name`, that function's arguments; without, one of the declared
 * functions' names and then its arguments, up to where the format's
 * closing text begins. tools is the chat request's "tools" array. false
 * with a message naming the offending field. */
bool sp_tool_call_grammar(enum sp_chat_format format, const cJSON *tools, const char *name, struct sp_grammar **out,
                          char *msg, size_t cap);

#endif
