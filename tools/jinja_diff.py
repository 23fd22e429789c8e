#!/usr/bin/env python3
"""jinja_diff.py - differential test of sparrow's Jinja interpreter against
Python's jinja2 (configured as transformers configures it) on randomly
generated expressions.

    make build/tools/jinja_render && python3 tools/jinja_diff.py [SEED] [COUNT]

Prints every template whose output differs, unless both engines raise.
Known, accepted differences: jinja2's lazy generators print their address
(`<generator object ...>`) and raise only when consumed, and jinja2 folds
constant subscripts at compile time (`{{ 3[1:] }}` is empty there).
"""
import json
import os
import random
import subprocess
import sys
import tempfile
import warnings

from template_refs import make_env

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
RENDER = os.path.join(ROOT, "build", "tools", "jinja_render")
CONTEXT = os.path.join(ROOT, "tests", "data", "jinja", "context.json")

LIT = ["0", "1", "-2", "3", "7", "1.5", "-0.5", "2.0", "'a'", "'héllo'", "''", "' x y '", "'A,b,,C'",
       "'<think>x</think>y'", "none", "true", "false", "[1, 2, 3]", "['b', 'a']", "[]", "{'k': 1, 'j': 'v'}", "{}",
       "(1, 'a')", "'%s-%d'", "'\\n a \\n'"]
VARS = ["messages", "messages[0]", "messages[1].content", "tools", "u", "messages[2].tool_calls", "tools[0].function"]
FILTERS = ["length", "trim", "upper", "lower", "title", "capitalize", "first", "last", "list", "string", "tojson",
           "tojson(indent=2)", "join(',')", "join", "default('d')", "default('d', true)", "reverse", "sort", "unique",
           "items", "int", "float", "abs", "round", "replace('a', 'b')", "select", "reject", "map('string')",
           "selectattr('role')", "map(attribute='role')", "sum", "max", "min", "wordcount", "indent(2)", "escape",
           "safe", "count", "dictsort", "batch(2)", "list | length"]
TESTS = ["defined", "undefined", "none", "string", "number", "integer", "float", "mapping", "sequence", "iterable",
         "odd", "even", "divisibleby(2)", "eq(1)", "lt 3", "true", "false", "boolean", "in([1, 'a'])", "lower", "upper",
         "callable", "sameas none"]
METHODS = ["startswith('a')", "endswith('y')", "split(',')", "split()", "rsplit(',', 1)", "strip()", "lstrip('a')",
           "rstrip('\\n')", "upper()", "lower()", "title()", "replace('a', 'z')", "find('l')", "count('a')", "get('k')",
           "get('x', 5)", "items()", "keys()", "values()", "split('</think>')[-1]", "startswith(('<', 'h'))",
           "isdigit()", "format(1)"]
OPS = ["+", "-", "*", "/", "//", "%", "~", "==", "!=", "<", ">=", "in", "not in", "and", "or", "**"]


def expr(rng, d=0):
    k = rng.randint(0, 9 if d < 3 else 1)
    if k == 0:
        return rng.choice(LIT)
    if k == 1:
        return rng.choice(VARS)
    if k == 2:
        return "(%s %s %s)" % (expr(rng, d + 1), rng.choice(OPS), expr(rng, d + 1))
    if k == 3:
        return "%s | %s" % (expr(rng, d + 1), rng.choice(FILTERS))
    if k == 4:
        return "(%s is %s%s)" % (expr(rng, d + 1), rng.choice(["", "not "]), rng.choice(TESTS))
    if k == 5:
        return "%s.%s" % (rng.choice(LIT[7:14] + VARS), rng.choice(METHODS))
    if k == 6:
        return "%s[%s]" % (rng.choice(LIT + VARS), rng.choice(["0", "-1", "1:", "::-1", ":2", "'k'", "'role'", "1::2"]))
    if k == 7:
        return "(%s if %s else %s)" % (expr(rng, d + 1), expr(rng, d + 1), expr(rng, d + 1))
    if k == 8:
        return "(not %s)" % expr(rng, d + 1)
    return "[%s, %s]" % (expr(rng, d + 1), expr(rng, d + 1))


def main():
    seed = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 500
    rng = random.Random(seed)
    warnings.filterwarnings("ignore")  # Python's own warnings about `3[1:]` and the like
    env = make_env()
    differ = 0
    with tempfile.NamedTemporaryFile("w", suffix=".jinja", delete=False) as f:
        path = f.name
    try:
        for _ in range(count):
            src = "{{ %s }}" % expr(rng)
            try:
                want = env.from_string(src).render(**json.load(open(CONTEXT, encoding="utf-8")))
            except Exception as e:  # a raise is a result to compare
                want = "ERROR: %s: %s" % (type(e).__name__, e)
            with open(path, "w", encoding="utf-8") as f:
                f.write(src)
            got = subprocess.run([RENDER, path, CONTEXT], capture_output=True).stdout.decode("utf-8", "replace")
            if want.startswith("ERROR") and got.startswith("ERROR") or want == got:
                continue
            differ += 1
            print("template: %r\n  jinja2:  %r\n  sparrow: %r" % (src, want, got))
    finally:
        os.unlink(path)
    print("%d of %d differ" % (differ, count))


if __name__ == "__main__":
    main()
