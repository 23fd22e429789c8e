#!/usr/bin/env node
// soak.mjs - load a running `sparrow serve` for a while and check that every
// answer is whole: many clients loop over random chat completions (streamed
// or not, max_tokens 1-64, prompts of varied length with shared prefixes so
// the prompt cache is used, some with a cache_salt) and abort some of them on
// purpose. Starts nothing; tools/soak.sh starts a server and runs this.
//
//   node tools/soak.mjs --url http://127.0.0.1:PORT [--duration S] [--clients N]
//                       [--pid PID] [--warmup S] [--sample S] [--seed N] [--timeout S]
//
// Counts: ok (a whole answer), aborted (ours: intended), busy (503 or 429
// with Retry-After: intended backpressure; the client waits that long) and
// unintended (any other status, a malformed answer or stream, a stream
// without [DONE] or a finish_reason, an error event, a connection error we
// did not cause, no answer within --timeout). With --pid it samples the
// server's resident memory (VmRSS) every --sample seconds, and its heap as
// /metrics counts it. Prints one summary JSON; exits 1 on any unintended error.
import { readFileSync } from 'node:fs';

const args = { url: null, duration: 600, clients: 32, pid: 0, warmup: 60, sample: 10, seed: Date.now() % 1e9, timeout: 300 };
for (let i = 2; i < process.argv.length; i++) {
  const k = process.argv[i].replace(/^--/, '');
  if (!(k in args) || i + 1 >= process.argv.length) {
    console.error(`usage: soak.mjs --url URL [--duration S] [--clients N] [--pid PID] [--warmup S] [--sample S] [--seed N] [--timeout S] (bad: ${process.argv[i]})`);
    process.exit(2);
  }
  const v = process.argv[++i];
  args[k] = k === 'url' ? v.replace(/\/$/, '') : Number(v);
  if (k !== 'url' && !Number.isFinite(args[k])) { console.error(`--${k} wants a number`); process.exit(2); }
}
if (!args.url) { console.error('--url is required'); process.exit(2); }

// mulberry32: reproducible choices per client (timing still varies)
function rng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const WORDS = ('the a of to and in is it you that he was for on are with as his they be at one have this from or had by hot '
  + 'word but what some we can out other were all there when up use your how said an each she which do their time if will '
  + 'way about many then them write would like so these her long make thing see him two has look more day could go come did '
  + 'number sound no most people my over know water than call first who may down side been now find expert cache stream '
  + 'héllo naïve 東京 ключ 🙂 x=1; {"k": [1, 2]} <tag> \\n tab\there').split(' ');
const SYSTEMS = [0, 1, 2, 3].map((k) => {
  const r = rng(1000 + k);
  return `System ${k}: ` + Array.from({ length: 20 + 60 * k }, () => WORDS[Math.floor(r() * WORDS.length)]).join(' ');
});
const SALTS = ['tenant-a', 'tenant-b', 'tenant-c'];

const counts = { requests: 0, ok: 0, ok_streamed: 0, aborted: 0, busy: 0, unintended: 0 };
const errors = {}; // kind -> count
const samples = []; // first few unintended errors, in full
const started = Date.now();
const deadline = started + args.duration * 1000;
const elapsed = () => (Date.now() - started) / 1000;

function unintended(kind, detail, body) {
  counts.unintended++;
  errors[kind] = (errors[kind] || 0) + 1;
  if (samples.length < 20) samples.push({ t: Math.round(elapsed()), kind, detail: String(detail).slice(0, 500), request: body });
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function makeRequest(r) {
  const pick = (a) => a[Math.floor(r() * a.length)];
  const words = (n) => Array.from({ length: n }, () => pick(WORDS)).join(' ');
  const messages = [];
  if (r() < 0.7) messages.push({ role: 'system', content: pick(SYSTEMS) });
  const turns = r() < 0.2 ? 2 : 1;
  for (let t = 0; t < turns; t++) {
    // lengths from a few words to a few hundred: most short, some long
    const n = r() < 0.8 ? 1 + Math.floor(r() * 30) : 50 + Math.floor(r() * 300);
    messages.push({ role: 'user', content: words(n) });
    if (t + 1 < turns) messages.push({ role: 'assistant', content: words(1 + Math.floor(r() * 20)) });
  }
  const body = { model: 'soak', messages, max_tokens: 1 + Math.floor(r() * 64), stream: r() < 0.6 };
  if (r() < 0.3) body.cache_salt = pick(SALTS);
  if (r() < 0.3) body.temperature = 0;
  else if (r() < 0.5) body.temperature = Math.round(r() * 150) / 100;
  if (r() < 0.3) body.seed = Math.floor(r() * 1000);
  if (r() < 0.2) body.top_p = 0.5 + r() / 2;
  if (r() < 0.1) body.stop = [pick(WORDS)];
  if (body.stream && r() < 0.5) body.stream_options = { include_usage: true };
  return body;
}

// Checks a non-streamed answer; returns an error text or null.
function checkJson(body, j) {
  if (j?.object !== 'chat.completion') return 'object is not chat.completion';
  const c = j.choices?.[0];
  if (!c || typeof c.message?.content !== 'string') return 'no choices[0].message.content';
  if (!['stop', 'length'].includes(c.finish_reason)) return `finish_reason ${c.finish_reason}`;
  const u = j.usage;
  if (!u || !(u.prompt_tokens > 0) || !(u.completion_tokens >= 0) || u.completion_tokens > body.max_tokens) return `usage ${JSON.stringify(u)}`;
  return null;
}

// Reads an SSE stream; aborts after abortAfter events when >= 0.
// Returns {error} or {aborted} or {ok}.
async function readStream(body, res, ac, abortAfter) {
  const dec = new TextDecoder();
  let buf = '', events = 0, done = false, finish = null, usage = null;
  try {
    for await (const part of res.body) {
      buf += dec.decode(part, { stream: true });
      let i;
      while ((i = buf.indexOf('\n\n')) >= 0) {
        const ev = buf.slice(0, i);
        buf = buf.slice(i + 2);
        if (done) return { error: ['stream', `data after [DONE]: ${ev}`] };
        if (!ev.startsWith('data: ')) return { error: ['stream', `not a data event: ${ev}`] };
        const data = ev.slice(6);
        if (data === '[DONE]') { done = true; continue; }
        let j;
        try { j = JSON.parse(data); } catch { return { error: ['stream', `bad JSON: ${data}`] }; }
        if (j.error) return { error: ['stream-error-event', data] };
        if (j.object !== 'chat.completion.chunk') return { error: ['stream', `object ${j.object}`] };
        if (j.usage) usage = j.usage;
        const c = j.choices?.[0];
        if (c?.finish_reason) finish = c.finish_reason;
        if (++events === abortAfter) { ac.abort(); return { aborted: true }; }
      }
    }
  } catch (e) {
    if (ac.signal.aborted) return { aborted: true };
    return { error: ['stream-read', `${e.name}: ${e.message} ${e.cause?.code || ''}`] };
  }
  if (buf.trim()) return { error: ['stream', `trailing bytes: ${buf}`] };
  if (!done) return { error: ['stream-no-done', `${events} events, finish ${finish}`] };
  if (!['stop', 'length'].includes(finish)) return { error: ['stream', `finish_reason ${finish}`] };
  // (content deltas are chat-parser events, not tokens: only usage counts them)
  if (body.stream_options?.include_usage && !usage) return { error: ['stream', 'include_usage but no usage chunk'] };
  if (usage && !(usage.completion_tokens <= body.max_tokens)) return { error: ['stream', `usage ${JSON.stringify(usage)} for max_tokens ${body.max_tokens}`] };
  return { ok: true };
}

async function oneRequest(r) {
  const body = makeRequest(r);
  const bad = (kind, detail) => unintended(kind, detail, body);
  const ac = new AbortController();
  // ~20% aborted on purpose: streams after a few events, others after a delay
  const abort = r() < 0.2;
  const abortAfter = abort && body.stream ? Math.floor(r() * 8) + 1 : -1;
  let timer = null, timedOut = false;
  if (abort && !body.stream) timer = setTimeout(() => ac.abort(), Math.floor(r() * 2000));
  const watchdog = setTimeout(() => { timedOut = true; ac.abort(); }, args.timeout * 1000);
  counts.requests++;
  try {
    let res;
    try {
      res = await fetch(`${args.url}/v1/chat/completions`, {
        method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body), signal: ac.signal,
      });
    } catch (e) {
      if (timedOut) return bad('timeout', `no response in ${args.timeout} s`);
      if (ac.signal.aborted) return counts.aborted++;
      return bad('connect', `${e.name}: ${e.message} ${e.cause?.code || ''}`);
    }
    const retry = res.headers.get('retry-after');
    if ((res.status === 503 || res.status === 429) && retry) {
      counts.busy++;
      await res.body?.cancel().catch(() => {});
      await sleep(Math.min(Number(retry) || 1, 10) * 1000);
      return;
    }
    if (res.status !== 200) {
      const text = await res.text().catch((e) => `(body: ${e.message})`);
      if (ac.signal.aborted && !timedOut) return counts.aborted++;
      return bad(`http-${res.status}`, text);
    }
    if (body.stream) {
      if (!(res.headers.get('content-type') || '').startsWith('text/event-stream')) return bad('stream', `content-type ${res.headers.get('content-type')}`);
      const out = await readStream(body, res, ac, abortAfter);
      if (timedOut) return bad('timeout', `stream not ended in ${args.timeout} s`);
      if (out.aborted) return counts.aborted++;
      if (out.error) return bad(...out.error);
      counts.ok++;
      counts.ok_streamed++;
      return;
    }
    let j;
    try {
      j = await res.json();
    } catch (e) {
      if (timedOut) return bad('timeout', `body not ended in ${args.timeout} s`);
      if (ac.signal.aborted) return counts.aborted++;
      return bad('json', `${e.name}: ${e.message} ${e.cause?.code || ''}`);
    }
    const wrong = checkJson(body, j);
    if (wrong) return bad('json', `${wrong}: ${JSON.stringify(j)}`);
    counts.ok++;
  } finally {
    clearTimeout(timer);
    clearTimeout(watchdog);
  }
}

async function client(k) {
  const r = rng(args.seed * 131 + k);
  while (Date.now() < deadline) await oneRequest(r);
}

// --- memory samples ----------------------------------------------------------
function rssKiB() {
  try {
    const m = /^VmRSS:\s+(\d+) kB/m.exec(readFileSync(`/proc/${args.pid}/status`, 'utf8'));
    return m ? Number(m[1]) : null;
  } catch { return null; }
}
async function heapBytes() {
  try {
    const text = await (await fetch(`${args.url}/metrics`, { signal: AbortSignal.timeout(10000) })).text();
    let sum = 0;
    for (const m of text.matchAll(/^sparrow_memory_allocated_bytes\{[^}]*\} (\d+)$/gm)) sum += Number(m[1]);
    return sum;
  } catch { return null; }
}
const mem = [];
let sampling = true;
async function sampler() {
  while (sampling) {
    const t = Math.round(elapsed());
    mem.push({ t, rss_kib: args.pid ? rssKiB() : null, heap_bytes: await heapBytes() });
    const next = started + (Math.floor(elapsed() / args.sample) + 1) * args.sample * 1000;
    while (sampling && Date.now() < next) await sleep(Math.min(250, next - Date.now()));
  }
}

async function metrics() {
  try {
    const text = await (await fetch(`${args.url}/metrics`, { signal: AbortSignal.timeout(10000) })).text();
    const pick = (name) => { const m = new RegExp(`^${name} (\\d+)`, 'm').exec(text); return m ? Number(m[1]) : null; };
    const status = {};
    for (const m of text.matchAll(/^sparrow_requests_total\{status="(\d+)"\} (\d+)$/gm)) if (m[2] !== '0') status[m[1]] = Number(m[2]);
    return {
      responses_by_status: status,
      generation_requests: pick('sparrow_generation_requests_total'),
      prompt_tokens: pick('sparrow_prompt_tokens_total'),
      prompt_tokens_cached: pick('sparrow_prompt_tokens_cached_total'),
      generated_tokens: pick('sparrow_generated_tokens_total'),
      expert_cache_budget_bytes: pick('sparrow_expert_cache_budget_bytes'),
      expert_cache_hits: pick('sparrow_expert_cache_hits_total'),
      expert_cache_misses: pick('sparrow_expert_cache_misses_total'),
      expert_read_bytes: pick('sparrow_expert_read_bytes_total'),
    };
  } catch (e) { return { error: e.message }; }
}

const memTask = sampler();
await Promise.all(Array.from({ length: args.clients }, (_, k) => client(k)));
sampling = false;
await memTask;
mem.push({ t: Math.round(elapsed()), rss_kib: args.pid ? rssKiB() : null, heap_bytes: await heapBytes() });

const atWarm = mem.find((s) => s.t >= args.warmup) || mem[mem.length - 1];
const last = mem[mem.length - 1];
const afterWarm = mem.filter((s) => s.t >= atWarm.t);
const mib = (kib) => (kib == null ? null : Math.round(kib / 102.4) / 10);
const mibB = (b) => (b == null ? null : mib(b / 1024));
const max = (a) => (a.length ? Math.max(...a) : null);
const summary = {
  duration_s: Math.round(elapsed()),
  clients: args.clients,
  seed: args.seed,
  ...counts,
  unintended_by_kind: errors,
  unintended_samples: samples,
  rss_mib: args.pid ? {
    warmup_t: atWarm.t, at_warmup: mib(atWarm.rss_kib), at_end: mib(last.rss_kib),
    max: mib(max(mem.map((s) => s.rss_kib).filter((x) => x != null))),
    max_after_warmup: mib(max(afterWarm.map((s) => s.rss_kib).filter((x) => x != null))),
  } : null,
  heap_mib: {
    at_warmup: mibB(atWarm.heap_bytes), at_end: mibB(last.heap_bytes),
    max: mibB(max(mem.map((s) => s.heap_bytes).filter((x) => x != null))),
  },
  server: await metrics(),
  samples: mem.map((s) => [s.t, mib(s.rss_kib), mibB(s.heap_bytes)]),
};
console.log(JSON.stringify(summary, null, 1).replace(/\[\n\s+([^[\]{}]*?)\n\s+\]/g, (m, a) => `[${a.replace(/\n\s+/g, ' ')}]`));
process.exit(counts.unintended === 0 && counts.ok > 0 ? 0 : 1);
