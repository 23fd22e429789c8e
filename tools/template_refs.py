#!/usr/bin/env python3
"""template_refs.py - cross-checks the @huggingface/jinja fixtures against
Python's jinja2 configured as transformers configures it (the path real
models are served and trained with).

    python3 tools/template_refs.py            # needs `pip install jinja2`

For every template x conversation it renders with jinja2 and compares with
tests/data/templates/expected/<model>/<name>[.error].txt. Where the two
engines disagree, it writes what jinja2 produced to <name>.jinja2.txt (or
<name>.jinja2.error.txt); tests/test_chat.c then checks against that file,
because sparrow follows jinja2. It prints each disagreement.
"""
import json
import os
import sys
from datetime import datetime

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
DATA = os.path.join(ROOT, "tests", "data", "templates")
FIXED_NOW = datetime(2026, 1, 15)


def make_env():
    # Mirrors transformers.utils.chat_template_utils._compile_jinja_template.
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format):
        return FIXED_NOW.strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def token_string(tok):
    if isinstance(tok, str):
        return tok
    if isinstance(tok, dict) and isinstance(tok.get("content"), str):
        return tok["content"]
    return None


def load_model(d):
    cfg_path = os.path.join(d, "tokenizer_config.json")
    cfg = json.load(open(cfg_path, encoding="utf-8")) if os.path.exists(cfg_path) else {}
    jinja_path = os.path.join(d, "chat_template.jinja")
    if os.path.exists(jinja_path):
        template = open(jinja_path, encoding="utf-8").read()
    else:
        template = cfg.get("chat_template")
        if isinstance(template, list):
            template = next(t["template"] for t in template if t.get("name") == "default")
    return template, token_string(cfg.get("bos_token")), token_string(cfg.get("eos_token"))


def main():
    env = make_env()
    models = sorted(os.listdir(os.path.join(DATA, "models")))
    convs = sorted(f for f in os.listdir(os.path.join(DATA, "conversations")) if f.endswith(".json"))
    same = differ = 0
    for name in models:
        template, bos, eos = load_model(os.path.join(DATA, "models", name))
        tmpl = env.from_string(template)
        out_dir = os.path.join(DATA, "expected", name)
        for f in convs:
            conv = json.load(open(os.path.join(DATA, "conversations", f), encoding="utf-8"))
            base = os.path.join(out_dir, f[: -len(".json")])
            for stale in (".jinja2.txt", ".jinja2.error.txt"):
                if os.path.exists(base + stale):
                    os.remove(base + stale)
            ctx = dict(messages=conv["messages"], tools=conv.get("tools"),
                       add_generation_prompt=conv.get("add_generation_prompt", True))
            if bos is not None:
                ctx["bos_token"] = bos
            if eos is not None:
                ctx["eos_token"] = eos
            ctx.update(conv.get("kwargs", {}))
            try:
                text, err = tmpl.render(**ctx), None
            except Exception as e:  # any template failure is a result to compare
                text, err = None, "%s: %s" % (type(e).__name__, e)
            if os.path.exists(base + ".txt"):
                ref_text = open(base + ".txt", encoding="utf-8", newline="").read()
                agree = text == ref_text
            else:
                agree = text is None  # both refused
            if agree:
                same += 1
                continue
            differ += 1
            print("differs: %s / %s (%s)" % (name, f, "jinja2 error: " + err if err else "jinja2 renders"))
            if err is None:
                open(base + ".jinja2.txt", "w", encoding="utf-8", newline="").write(text)
            else:
                open(base + ".jinja2.error.txt", "w", encoding="utf-8").write(err + "\n")
    print("%d agree, %d differ between @huggingface/jinja and jinja2 %s" % (same, differ, jinja2.__version__))


if __name__ == "__main__":
    sys.exit(main())
