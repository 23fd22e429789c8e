#!/usr/bin/env node
// template_refs.mjs - renders every test conversation with every model's chat
// template through @huggingface/jinja and writes the results as fixtures for
// tests/test_chat.c.
//
//   npm install && node tools/template_refs.mjs
//
// Inputs:  tests/data/templates/models/<model>/   chat_template.jinja or
//                                                 tokenizer_config.json
//          tests/data/templates/conversations/<name>.json
//            {messages, tools?, add_generation_prompt, kwargs?}
// Outputs: tests/data/templates/expected/<model>/<name>.txt        rendered text
//          tests/data/templates/expected/<model>/<name>.error.txt  the error, when
//                                                                  the template refuses
//
// The variables are the ones transformers' apply_chat_template passes:
// messages, tools (null when absent), add_generation_prompt, the tokenizer's
// bos_token / eos_token when set, and the chat_template_kwargs. strftime_now
// formats a fixed date (2026-01-15) so the fixtures do not change daily.
import { Template } from "@huggingface/jinja";
import fs from "node:fs";
import path from "node:path";

const root = path.resolve(path.dirname(new URL(import.meta.url).pathname), "..");
const dataDir = path.join(root, "tests/data/templates");

// @huggingface/jinja's strftime_now formats `new Date()` and cannot be
// overridden from the context, so the clock itself is pinned (local time).
const RealDate = Date;
globalThis.Date = class extends RealDate {
  constructor(...args) {
    if (args.length === 0) super(2026, 0, 15, 0, 0, 0);
    else super(...args);
  }
};

function tokenString(tok) {
  if (typeof tok === "string") return tok;
  if (tok && typeof tok === "object" && typeof tok.content === "string") return tok.content;
  return undefined;
}

export function loadModel(dir) {
  const cfgPath = path.join(dir, "tokenizer_config.json");
  const cfg = fs.existsSync(cfgPath) ? JSON.parse(fs.readFileSync(cfgPath, "utf8")) : {};
  const jinjaPath = path.join(dir, "chat_template.jinja");
  let template = fs.existsSync(jinjaPath) ? fs.readFileSync(jinjaPath, "utf8") : cfg.chat_template;
  if (Array.isArray(template)) template = template.find((t) => t.name === "default")?.template;
  if (typeof template !== "string") throw new Error(`${dir}: no chat template`);
  return { template, bos: tokenString(cfg.bos_token), eos: tokenString(cfg.eos_token) };
}

export function context(model, conv) {
  const ctx = {
    messages: conv.messages,
    tools: conv.tools ?? null,
    add_generation_prompt: conv.add_generation_prompt ?? true,
    ...(conv.kwargs ?? {}),
  };
  if (model.bos !== undefined) ctx.bos_token = model.bos;
  if (model.eos !== undefined) ctx.eos_token = model.eos;
  return ctx;
}

function main() {
  const models = fs.readdirSync(path.join(dataDir, "models")).sort();
  const convs = fs
    .readdirSync(path.join(dataDir, "conversations"))
    .filter((f) => f.endsWith(".json"))
    .sort();
  let ok = 0;
  let errors = 0;
  for (const name of models) {
    const model = loadModel(path.join(dataDir, "models", name));
    const tmpl = new Template(model.template);
    const outDir = path.join(dataDir, "expected", name);
    fs.mkdirSync(outDir, { recursive: true });
    for (const file of convs) {
      const conv = JSON.parse(fs.readFileSync(path.join(dataDir, "conversations", file), "utf8"));
      const base = path.join(outDir, file.replace(/\.json$/, ""));
      for (const stale of [".txt", ".error.txt"]) fs.rmSync(base + stale, { force: true });
      const ctx = context(model, conv);
      try {
        fs.writeFileSync(base + ".txt", tmpl.render(ctx));
        ok++;
      } catch (e) {
        fs.writeFileSync(base + ".error.txt", String(e.message ?? e) + "\n");
        errors++;
      }
    }
  }
  console.log(`${models.length} templates x ${convs.length} conversations: ${ok} rendered, ${errors} errors`);
}

if (process.argv[1] && path.resolve(process.argv[1]) === path.resolve(new URL(import.meta.url).pathname)) main();
