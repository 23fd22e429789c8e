#!/usr/bin/env python3
"""jinja_cases.py - records what Python's jinja2, configured as transformers
configures it, makes of the interpreter test cases, for tests/test_jinja.c.

    python3 tools/jinja_cases.py     # needs `pip install jinja2`

Reads tests/data/jinja/cases.txt (one template per line, "##" lines are
comments) with the variables of tests/data/jinja/context.json, adds
whitespace-control templates generated from a fixed seed, and writes
tests/data/jinja/cases.json: [{"template", "context", "output" | "error"}].
"""
import json
import os
import random

from template_refs import make_env

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
DIR = os.path.join(ROOT, "tests", "data", "jinja")


def random_template(rng):
    """A template mixing text, tags and every whitespace-control marker."""
    spaces = ["", " ", "\n", "  ", "\n  ", " \n", "\t", "\n\n", "  \n  "]
    ws = lambda: rng.choice(spaces)
    sign = lambda: rng.choice(["", "", "-", "+"])
    vsign = lambda: rng.choice(["", "", "-"])
    text = lambda: rng.choice(["a", "b c", "x\n", "\n", "  y", "z  \n  w", "", "é"]) + ws()
    expr = lambda: rng.choice(["x", "'s'", "1", "n.v", "m|length", "none", "true", "[1,2]", "x ~ 'q'", "1.5", "m[0]"])

    def block(d):
        out = []
        for _ in range(rng.randint(1, 4)):
            k = rng.randint(0, 7 if d < 3 else 2)
            if k == 0:
                out.append(text())
            elif k == 1:
                out.append("{{%s %s %s}}" % (vsign(), expr(), vsign()) + ws())
            elif k == 2:
                out.append("{#%s c %s#}" % (sign(), sign()) + ws())
            elif k == 3:
                out.append(ws() + "{%%%s if %s %s%%}" % (sign(), rng.choice(["x", "m", "not x", "n.v > 1"]), sign())
                           + ws() + block(d + 1) + ws() + "{%%%s else %s%%}" % (sign(), sign()) + block(d + 1)
                           + ws() + "{%%%s endif %s%%}" % (sign(), sign()) + ws())
            elif k == 4:
                out.append(ws() + "{%%%s for i in m %s%%}" % (sign(), sign()) + ws() + block(d + 1)
                           + "{%%%s endfor %s%%}" % (sign(), sign()) + ws())
            elif k == 5:
                out.append(ws() + "{%%%s set n.v = n.v + 1 %s%%}" % (sign(), sign()) + ws())
            elif k == 6:
                out.append(ws() + "{%%%s macro mm(a) %s%%}" % (sign(), sign()) + block(d + 1)
                           + "{%%%s endmacro %s%%}" % (sign(), sign()) + ws() + "{{ mm(1) }}" + ws())
            else:
                out.append(ws() + "{%%%s set y %s%%}" % (sign(), sign()) + block(d + 1)
                           + "{%%%s endset %s%%}" % (sign(), sign()) + "[{{ y }}]" + ws())
        return "".join(out)

    return "{% set n = namespace(v=1) %}" + block(0) + rng.choice(["", "\n", "\n\n"])


def main():
    env = make_env()
    ctx = json.load(open(os.path.join(DIR, "context.json"), encoding="utf-8"))
    templates = [(l, ctx) for l in open(os.path.join(DIR, "cases.txt"), encoding="utf-8").read().split("\n")
                 if l and not l.startswith("##")]
    rng = random.Random(4)
    small = {"x": "X", "m": [1, 2]}
    templates += [(random_template(rng), small) for _ in range(150)]
    cases = []
    for t, c in templates:
        case = {"template": t, "context": "context.json" if c is ctx else c}
        try:
            case["output"] = env.from_string(t).render(**c)
        except Exception as e:  # the error is the expected result
            case["error"] = "%s: %s" % (type(e).__name__, e)
        cases.append(case)
    with open(os.path.join(DIR, "cases.json"), "w", encoding="utf-8") as f:
        json.dump(cases, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print("%d cases, %d errors" % (len(cases), sum("error" in c for c in cases)))


if __name__ == "__main__":
    main()
