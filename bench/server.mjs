// Server throughput: one client, then 8 concurrent clients, streaming chat
// completions of a fixed length; and the prefix cache on a multi-turn chat
// (time to first token of the next turn, warm against a cold server).
//   node bench/server.mjs MODEL_DIR [--threads N] [--tokens N]
// Prints one JSON line per result.
import { spawn } from 'node:child_process';
import path from 'node:path';

const args = process.argv.slice(2);
const model = args[0];
const opt = (name, def) => { const i = args.indexOf(name); return i >= 0 ? args[i + 1] : def; };
const threads = opt('--threads', '2'), maxTokens = Number(opt('--tokens', '64'));
const SPARROW = path.resolve(process.env.BUILD || 'build', 'sparrow');

function start(extra) {
  return new Promise((resolve, reject) => {
    const p = spawn(SPARROW, ['serve', '--model', model, '--port', '0', '--threads', threads, '--ctx', '4096', ...extra],
      { stdio: ['ignore', 'pipe', 'inherit'] });
    let out = '';
    p.stdout.on('data', (d) => {
      out += d;
      const line = out.split('\n').find((l) => l.startsWith('{"event":"ready"'));
      if (line) resolve({ p, url: `http://127.0.0.1:${JSON.parse(line).port}` });
    });
    p.on('exit', (c) => reject(new Error(`server exited ${c}`)));
  });
}

async function chat(url, messages, max_tokens, seed) {
  const t0 = performance.now();
  const res = await fetch(`${url}/v1/chat/completions`, { method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ messages, max_tokens, temperature: 0.7, seed, stream: true, stream_options: { include_usage: true } }) });
  const reader = res.body.getReader();
  const dec = new TextDecoder();
  let ttft = null, usage = null, text = '', buf = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += dec.decode(value, { stream: true });
    let i;
    while ((i = buf.indexOf('\n\n')) >= 0) {
      const ev = buf.slice(0, i); buf = buf.slice(i + 2);
      if (!ev.startsWith('data: ') || ev === 'data: [DONE]') continue;
      const c = JSON.parse(ev.slice(6));
      if (c.usage) usage = c.usage;
      const d = c.choices[0]?.delta?.content;
      if (d) { if (ttft === null) ttft = performance.now() - t0; text += d; }
    }
  }
  return { ms: performance.now() - t0, ttft, usage, text };
}

const s = await start(['--parallel', '8']);
const msg = (i) => [{ role: 'user', content: `Request number ${i}: write something.` }];
await chat(s.url, msg(0), 8, 1);  // warm up
let t0 = performance.now();
const one = await chat(s.url, msg(1), maxTokens, 1);
console.log(JSON.stringify({ bench: 'server_single', tokens: one.usage.completion_tokens, seconds: one.ms / 1000,
  tok_s: one.usage.completion_tokens / (one.ms / 1000), ttft_ms: one.ttft }));
t0 = performance.now();
const many = await Promise.all(Array.from({ length: 8 }, (_, i) => chat(s.url, msg(10 + i), maxTokens, i)));
const secs = (performance.now() - t0) / 1000, toks = many.reduce((a, r) => a + r.usage.completion_tokens, 0);
console.log(JSON.stringify({ bench: 'server_8_clients', tokens: toks, seconds: secs, aggregate_tok_s: toks / secs,
  per_client_tok_s: toks / 8 / secs }));

// prefix cache: a long first turn, then the next turn on the warm server and on a cold one
const long = Array.from({ length: 120 }, (_, i) => `Paragraph ${i}: the quick brown fox jumps over the lazy dog.`).join('\n');
const turn1 = [{ role: 'user', content: long }];
const r1 = await chat(s.url, turn1, 16, 5);
const turn2 = [...turn1, { role: 'assistant', content: r1.text }, { role: 'user', content: 'And then?' }];
const warm = await chat(s.url, turn2, 16, 6);
s.p.kill('SIGTERM');
const c = await start(['--parallel', '1']);
const cold = await chat(c.url, turn2, 16, 6);
c.p.kill('SIGTERM');
console.log(JSON.stringify({ bench: 'prefix_cache', prompt_tokens: warm.usage.prompt_tokens,
  cached_tokens: warm.usage.prompt_tokens_details.cached_tokens, ttft_warm_ms: warm.ttft, ttft_cold_ms: cold.ttft,
  speedup: cold.ttft / warm.ttft, same_text: warm.text === cold.text }));
