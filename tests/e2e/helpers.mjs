// Shared by the e2e files (Responses, Anthropic, structured outputs): the e2e model
// (tools/make-e2e-model.sh), servers started on a free port and stopped with
// SIGTERM (each must exit 0), and a copy of the model whose chat template
// opens a <think> block, so that the random model's output is reasoning.
// Not a test file itself (node --test runs *.test.mjs).
import assert from 'node:assert/strict';
import { spawn, execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync, cpSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';

const BUILD = process.env.BUILD || 'build';
const SPARROW = path.resolve(BUILD, 'sparrow');

export class Servers {
  constructor() {
    this.procs = [];
    this.dirs = [];
  }

  // A fresh e2e model folder; with thinking, its template opens <think> at
  // the start of the reply unless enable_thinking is false.
  model({ thinking = false } = {}) {
    if (!this.base) {
      this.base = mkdtempSync(path.join(tmpdir(), 'sparrow-e2e-api-'));
      this.dirs.push(this.base);
      execFileSync('tools/make-e2e-model.sh', [this.base], { env: { ...process.env, BUILD } });
    }
    if (!thinking) return this.base;
    const dir = mkdtempSync(path.join(tmpdir(), 'sparrow-e2e-think-'));
    this.dirs.push(dir);
    cpSync(this.base, dir, { recursive: true });
    const tmpl = JSON.parse(readFileSync(path.join(dir, 'tokenizer_config.json'), 'utf8')).chat_template;
    const off = "{{- '<think>\\n\\n</think>\\n\\n' }}\n    {%- endif %}";
    assert.ok(tmpl.includes(off), 'the Qwen3 template has its enable_thinking switch');
    writeFileSync(path.join(dir, 'chat_template.jinja'),
      tmpl.replace(off, "{{- '<think>\\n\\n</think>\\n\\n' }}\n    {%- else %}\n        {{- '<think>\\n' }}\n    {%- endif %}"));
    return dir;
  }

  // Resolves with {proc, ready, url, log} once the "ready" line is printed.
  start(model, extra = []) {
    return new Promise((resolve, reject) => {
      const p = spawn(SPARROW, ['serve', '--model', model, '--port', '0', '--ctx', '1024', '--threads', '2', ...extra],
        { stdio: ['ignore', 'pipe', 'pipe'] });
      let out = '', err = '';
      this.procs.push({ proc: p, log: () => err });
      const timer = setTimeout(() => reject(new Error(`server did not start: ${err}`)), 60000);
      p.stdout.on('data', (d) => {
        out += d;
        const line = out.split('\n').find((l) => l.startsWith('{"event":"ready"'));
        if (line) {
          clearTimeout(timer);
          const ready = JSON.parse(line);
          resolve({ proc: p, ready, url: `http://127.0.0.1:${ready.port}`, log: () => err });
        }
      });
      p.stderr.on('data', (d) => { err += d; });
      p.on('exit', (code) => reject(new Error(`server exited with ${code}: ${err}`)));
    });
  }

  // SIGTERM to every server; each must exit 0.
  async stop() {
    const results = await Promise.all(this.procs.map(({ proc, log }) => new Promise((resolve) => {
      if (proc.exitCode !== null) resolve({ code: proc.exitCode, log });
      else proc.on('exit', (code, signal) => resolve({ code: code ?? signal, log }));
      proc.kill('SIGTERM');
    })));
    for (const d of this.dirs) rmSync(d, { recursive: true, force: true });
    for (const r of results) assert.equal(r.code, 0, r.log().slice(-4000));
  }
}

export async function postJson(url, body, headers = {}) {
  const res = await fetch(url, { method: 'POST', headers: { 'Content-Type': 'application/json', ...headers },
    body: typeof body === 'string' ? body : JSON.stringify(body) });
  const text = await res.text();
  let json = null;
  try { json = JSON.parse(text); } catch { /* not JSON */ }
  return { status: res.status, headers: res.headers, text, json };
}

// The SSE events of a response body: [{event, data}] with data parsed.
export function parseSse(text) {
  return text.split('\n\n').filter((b) => b.trim()).map((block) => {
    const ev = /^event: (.*)$/m.exec(block);
    const data = /^data: (.*)$/m.exec(block);
    return { event: ev ? ev[1] : null, data: data ? JSON.parse(data[1]) : null };
  });
}
