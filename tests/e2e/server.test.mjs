// End-to-end tests of `sparrow serve` with the official `openai` client.
// The model is a tiny random qwen3_moe carrying the real Qwen3 tokenizer and
// chat template (tools/make-e2e-model.sh): its text is gibberish, so these
// tests check protocol, shapes and determinism, not meaning.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync, cpSync, statSync, truncateSync } from 'node:fs';
import net from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import OpenAI from 'openai';

const BUILD = process.env.BUILD || 'build';
const SPARROW = path.resolve(BUILD, 'sparrow');
const servers = [];
let dir, main, cold;

// Starts a server on a free port; resolves with its base URL once the
// "ready" JSON line is printed.
function startServer(extra = []) {
  return new Promise((resolve, reject) => {
    const p = spawn(SPARROW, ['serve', '--model', dir, '--port', '0', '--ctx', '512', '--threads', '2', ...extra],
      { stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '', err = '';
    servers.push({ proc: p, log: () => err });
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

const client = (s, key = 'none') => new OpenAI({ baseURL: `${s.url}/v1`, apiKey: key, maxRetries: 0 });
const chat = (content) => [{ role: 'user', content }];

before(async () => {
  dir = mkdtempSync(path.join(tmpdir(), 'sparrow-e2e-'));
  execFileSync('tools/make-e2e-model.sh', [dir], { env: { ...process.env, BUILD } });
  main = await startServer(['--parallel', '4']);
  cold = await startServer(['--parallel', '1']);
});

// Every server must shut down cleanly on SIGTERM: exit code 0 (under the
// asan build a leak would make it non-zero), or the code its test expects.
after(async () => {
  const exits = servers.map(({ proc, log, expect }) => new Promise((resolve) => {
    if (proc.exitCode !== null) resolve({ code: proc.exitCode, log, expect });
    else proc.on('exit', (code, signal) => resolve({ code: code ?? signal, log, expect }));
    proc.kill('SIGTERM');
  }));
  const results = await Promise.all(exits);
  rmSync(dir, { recursive: true, force: true });
  for (const r of results) assert.equal(r.code, r.expect ?? 0, r.log().slice(-4000));
});

test('models lists the model with its context length', async () => {
  const list = await client(main).models.list();
  assert.equal(list.data.length, 1);
  assert.equal(list.data[0].object, 'model');
  assert.equal(list.data[0].owned_by, 'sparrow');
  assert.equal(list.data[0].context_length, 512);
  assert.equal(main.ready.architecture, 'qwen3_moe');
  assert.equal(list.data[0].architecture, 'qwen3_moe');
});

test('chat completion: message, usage, finish_reason length', async () => {
  const r = await client(main).chat.completions.create({ model: 'x', messages: chat('Hello there'), max_tokens: 12, temperature: 0 });
  assert.match(r.id, /^chatcmpl-/);
  assert.equal(r.object, 'chat.completion');
  assert.equal(r.choices.length, 1);
  assert.equal(r.choices[0].message.role, 'assistant');
  assert.equal(typeof r.choices[0].message.content, 'string');
  assert.ok(r.choices[0].message.content.length > 0);
  assert.equal(r.choices[0].finish_reason, 'length');
  assert.equal(r.usage.completion_tokens, 12);
  assert.ok(r.usage.prompt_tokens > 5);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + 12);
});

test('streaming deltas add up to the non-streaming text; usage chunk; [DONE]', async () => {
  const req = { model: 'x', messages: chat('Stream this'), max_tokens: 16, temperature: 0.9, seed: 11 };
  const whole = await client(main).chat.completions.create(req);
  const stream = await client(main).chat.completions.create({ ...req, stream: true, stream_options: { include_usage: true } });
  let text = '', finish = null, usage = null, first = true;
  for await (const chunk of stream) {
    assert.equal(chunk.object, 'chat.completion.chunk');
    if (chunk.usage) usage = chunk.usage;
    if (!chunk.choices.length) continue;
    if (first) { assert.equal(chunk.choices[0].delta.role, 'assistant'); first = false; }
    text += chunk.choices[0].delta.content ?? '';
    if (chunk.choices[0].finish_reason) finish = chunk.choices[0].finish_reason;
  }
  assert.equal(text, whole.choices[0].message.content);
  assert.equal(finish, 'length');
  assert.equal(usage.completion_tokens, 16);
});

test('the same seed gives the same text; another seed another', async () => {
  const req = { model: 'x', messages: chat('Seeds'), max_tokens: 24, temperature: 1.0, top_p: 1, seed: 5 };
  const a = await client(main).chat.completions.create(req);
  const b = await client(main).chat.completions.create(req);
  const c = await client(main).chat.completions.create({ ...req, seed: 6 });
  assert.equal(a.choices[0].message.content, b.choices[0].message.content);
  assert.notEqual(a.choices[0].message.content, c.choices[0].message.content);
});

// Sampling with a top-k (the server's default 40) draws from each row's
// best logits, which the forward pass hands back instead of the
// vocabulary's; a request for log-probabilities reads every logit. The
// same seeds give the same texts either way, requests batched together
// (a greedy one among them) or alone.
test('sampling from the best logits gives the text sampling from every logit gives', async () => {
  const reqs = [0.8, 1.3, 0].map((temperature, i) => ({ model: 'x', prompt: 'Candidates', max_tokens: 24,
    temperature, seed: 30 + i }));
  const batched = await Promise.all(reqs.map((r) => client(main).completions.create(r)));
  for (const [i, r] of reqs.entries()) {
    const full = await client(main).completions.create({ ...r, logprobs: 1 });
    assert.equal(batched[i].choices[0].text, full.choices[0].text, `temperature ${r.temperature}`);
  }
  const a = await client(main).completions.create({ ...reqs[0], top_k: 64, top_p: 0.9 });
  const b = await client(main).completions.create({ ...reqs[0], top_k: 64, top_p: 0.9, logprobs: 1 });
  assert.equal(a.choices[0].text, b.choices[0].text, 'top_k 64');
});

// Text completions: the raw text (chat content also passes through the
// output parser, which may drop whitespace around tags).
test('stop strings end the text before them with finish_reason stop', async () => {
  const req = { model: 'x', prompt: 'Stop test', max_tokens: 30, temperature: 0 };
  const full = (await client(main).completions.create(req)).choices[0].text;
  const stop = full.slice(Math.floor(full.length / 2), Math.floor(full.length / 2) + 2);
  const cut = full.slice(0, full.indexOf(stop));
  const r = await client(main).completions.create({ ...req, stop: [stop] });
  assert.equal(r.choices[0].text, cut);
  assert.equal(r.choices[0].finish_reason, 'stop');
  const s = await client(main).completions.create({ ...req, stop, stream: true });
  let text = '';
  for await (const chunk of s) text += chunk.choices[0]?.text ?? '';
  assert.equal(text, cut);
  const c = await client(main).chat.completions.create({ model: 'x', messages: chat('Stop test'), max_tokens: 30, temperature: 0, stop: ['e'] });
  assert.ok(!c.choices[0].message.content.includes('e'));
});

test('prompt cache: the second turn reuses the first and matches a cold run', async () => {
  const turn1 = chat('Tell me a story about caches');
  const r1 = await client(main).chat.completions.create({ model: 'x', messages: turn1, max_tokens: 8, temperature: 0 });
  const turn2 = [...turn1, { role: 'assistant', content: r1.choices[0].message.content }, { role: 'user', content: 'Go on' }];
  const req = { model: 'x', messages: turn2, max_tokens: 10, temperature: 0.7, seed: 3 };
  const warm = await client(main).chat.completions.create(req);
  assert.ok(warm.usage.prompt_tokens_details.cached_tokens > 10, JSON.stringify(warm.usage));
  const coldRun = await client(cold).chat.completions.create(req);
  assert.equal(coldRun.usage.prompt_tokens_details.cached_tokens, 0);
  assert.equal(warm.choices[0].message.content, coldRun.choices[0].message.content);
});

test('text completions: string and token-array prompts, streaming', async () => {
  const r = await client(main).completions.create({ model: 'x', prompt: 'Once upon a time', max_tokens: 6, temperature: 0 });
  assert.equal(r.object, 'text_completion');
  assert.equal(r.usage.completion_tokens, 6);
  const ids = await client(main).completions.create({ model: 'x', prompt: [9707, 11, 1879], max_tokens: 4, temperature: 0 });
  assert.equal(ids.usage.prompt_tokens, 3);
  const s = await client(main).completions.create({ model: 'x', prompt: 'Once upon a time', max_tokens: 6, temperature: 0, stream: true });
  let text = '';
  for await (const chunk of s) text += chunk.choices[0]?.text ?? '';
  assert.equal(text, r.choices[0].text);
});

test('logprobs: one entry per token with top alternatives', async () => {
  const r = await client(main).chat.completions.create({ model: 'x', messages: chat('probs'), max_tokens: 5, temperature: 0, logprobs: true, top_logprobs: 3 });
  const lp = r.choices[0].logprobs.content;
  assert.equal(lp.length, 5);
  for (const t of lp) {
    assert.ok(t.logprob <= 0);
    assert.equal(t.top_logprobs.length, 3);
    for (let k = 1; k < 3; k++) assert.ok(t.top_logprobs[k - 1].logprob >= t.top_logprobs[k].logprob);
    assert.ok(Math.abs(t.top_logprobs[0].logprob - t.logprob) < 1e-4, 'greedy picks the most likely token');
  }
  const c = await client(main).completions.create({ model: 'x', prompt: 'probs', max_tokens: 4, temperature: 0, logprobs: 2 });
  const l = c.choices[0].logprobs;
  assert.equal(l.tokens.length, 4);
  assert.equal(l.token_logprobs.length, 4);
  assert.equal(l.tokens.join(''), c.choices[0].text);
  assert.deepEqual(l.text_offset[0], 0);
  for (const top of l.top_logprobs) assert.equal(Object.keys(top).length, 2);
});

// The random model writes arbitrary JSON and can run out of tokens inside a
// long string: every output opens an object with whitespace runs capped
// (sp_jsonv's 65 bytes), and those that finish are one JSON object. Which of
// the seeds finish depends on the kernel set's arithmetic (4-6 of these 40
// with each x86 set and the portable one on a Zen 4), so forty are asked.
test('response_format json_object constrains the output to one JSON object', async () => {
  let closed = 0;
  for (let seed = 1; seed <= 40; seed++) {
    const r = await client(main).chat.completions.create({ model: 'x', messages: chat('Reply in JSON'), max_tokens: 300,
      seed, response_format: { type: 'json_object' } });
    const text = r.choices[0].message.content;
    assert.equal(text.trimStart()[0], '{');
    assert.ok(!/^[ \t\r\n]{66}/.test(text), 'no more than 65 whitespace bytes before the object');
    if (r.choices[0].finish_reason === 'length') continue;
    assert.equal(r.choices[0].finish_reason, 'stop');
    const v = JSON.parse(text);
    assert.equal(typeof v, 'object');
    assert.ok(v !== null && !Array.isArray(v));
    closed++;
  }
  assert.ok(closed >= 2, `${closed} of 40 objects closed within 300 tokens`);
});

test('tools in the request are rendered by the template and accepted', async () => {
  const tools = [{ type: 'function', function: { name: 'get_weather', description: 'Weather of a city',
    parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } }];
  const messages = [
    { role: 'user', content: 'Weather in Paris?' },
    { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Paris"}' } }] },
    { role: 'tool', tool_call_id: 'call_1', content: '{"temp": 21}' },
  ];
  const r = await client(main).chat.completions.create({ model: 'x', messages, tools, tool_choice: 'auto', max_tokens: 4, temperature: 0 });
  assert.ok(r.usage.prompt_tokens > 60, 'the tool definitions are in the prompt');
  const none = await client(main).chat.completions.create({ model: 'x', messages, tools, tool_choice: 'none', max_tokens: 4, temperature: 0 });
  assert.ok(none.usage.prompt_tokens < r.usage.prompt_tokens);
});

// A random model writes arbitrary (valid) JSON: the arguments object may not
// close within max_tokens, so the test checks both endings.
test('tool_choice naming a function gives that call with JSON arguments, streamed or not', async () => {
  const tools = [{ type: 'function', function: { name: 'get_weather', description: 'Weather of a city',
    parameters: { type: 'object', properties: { city: { type: 'string' } } } } }];
  const req = { model: 'x', messages: chat('weather?'), tools, max_tokens: 64, temperature: 0,
    tool_choice: { type: 'function', function: { name: 'get_weather' } } };
  const r = await client(main).chat.completions.create(req);
  const call = r.choices[0].message.tool_calls[0];
  assert.equal(r.choices[0].message.tool_calls.length, 1);
  assert.equal(call.type, 'function');
  assert.equal(call.function.name, 'get_weather');
  assert.match(call.id, /^call_/);
  if (r.choices[0].finish_reason === 'tool_calls') assert.equal(typeof JSON.parse(call.function.arguments), 'object');
  else assert.equal(r.choices[0].finish_reason, 'length');
  const s = await client(main).chat.completions.create({ ...req, stream: true });
  let name = '', argText = '', finish = null;
  for await (const chunk of s) {
    for (const tc of chunk.choices[0]?.delta?.tool_calls ?? []) {
      assert.equal(tc.index, 0);
      if (tc.function?.name) name += tc.function.name;
      if (tc.function?.arguments) argText += tc.function.arguments;
    }
    if (chunk.choices[0]?.finish_reason) finish = chunk.choices[0].finish_reason;
  }
  assert.equal(name, 'get_weather');
  assert.equal(argText, call.function.arguments);
  assert.equal(finish, r.choices[0].finish_reason);
  const required = await client(main).chat.completions.create({ ...req, tool_choice: 'required', max_tokens: 8 });
  assert.equal(required.choices.length, 1);
  await assert.rejects(client(main).chat.completions.create({ ...req, tool_choice: { type: 'function', function: { name: 'nope' } } }),
    (e) => e.status === 400);
  await assert.rejects(client(main).chat.completions.create({ ...req, tools: undefined }), (e) => e.status === 400);
});

test('aborting a stream cancels the generation and frees the slot', async () => {
  const ac = new AbortController();
  const s = await client(main).chat.completions.create({ model: 'x', messages: chat('long'), max_tokens: 400, stream: true }, { signal: ac.signal });
  let n = 0;
  try {
    for await (const _ of s) { if (++n === 3) ac.abort(); }
  } catch (e) {
    assert.match(String(e.name), /Abort/);  // the client sees the abort as an error, or as the end of the stream
  }
  assert.ok(n >= 3 && n < 100, `read ${n} chunks`);
  let active = -1;
  for (let i = 0; i < 50 && active !== 0; i++) {
    await new Promise((r) => setTimeout(r, 100));
    const m = await (await fetch(`${main.url}/metrics`)).text();
    active = Number(/^sparrow_slots_active (\d+)/m.exec(m)[1]);
  }
  assert.equal(active, 0);
  const gen = Number(/^sparrow_generated_tokens_total (\d+)/m.exec(await (await fetch(`${main.url}/metrics`)).text())[1]);
  await new Promise((r) => setTimeout(r, 300));
  const gen2 = Number(/^sparrow_generated_tokens_total (\d+)/m.exec(await (await fetch(`${main.url}/metrics`)).text())[1]);
  assert.equal(gen2, gen, 'nothing is generated after the abort');
});

// n > 1: n choices sampled independently (choice i with a seed derived
// from the request's), their prompt prefilled once and shared.
test('n = 3: three choices with their indices, usage over all of them, reproducible with a seed', async () => {
  const req = { model: 'x', messages: chat('Three ways to say it'), max_tokens: 10, temperature: 1.0, top_p: 1, seed: 21, n: 3 };
  const a = await client(main).chat.completions.create(req);
  assert.deepEqual(a.choices.map((c) => c.index), [0, 1, 2]);
  for (const c of a.choices) {
    assert.equal(c.message.role, 'assistant');
    assert.equal(typeof c.message.content, 'string');
    assert.equal(c.finish_reason, 'length');
  }
  const one = await client(main).chat.completions.create({ ...req, n: 1 });
  assert.equal(a.usage.prompt_tokens, one.usage.prompt_tokens, 'the prompt counts once');
  assert.equal(a.usage.completion_tokens, 30);
  assert.equal(a.usage.total_tokens, a.usage.prompt_tokens + 30);
  assert.equal(a.choices[0].message.content, one.choices[0].message.content, 'choice 0 uses the seed itself');
  const texts = a.choices.map((c) => c.message.content);
  assert.equal(new Set(texts).size, 3, `the choices differ: ${JSON.stringify(texts)}`);
  const b = await client(main).chat.completions.create(req);
  assert.deepEqual(b.choices.map((c) => c.message.content), texts, 'the same seed gives the same choices');
  const other = await client(main).chat.completions.create({ ...req, seed: 22 });
  assert.notDeepEqual(other.choices.map((c) => c.message.content), texts);

  // text completions: the same, with logprobs per choice
  const t = await client(main).completions.create({ model: 'x', prompt: 'Once upon a time', max_tokens: 6, temperature: 1,
    seed: 4, n: 2, logprobs: 1 });
  assert.deepEqual(t.choices.map((c) => c.index), [0, 1]);
  for (const c of t.choices) assert.equal(c.logprobs.tokens.join(''), c.text);
  assert.equal(t.usage.completion_tokens, 12);
});

test('n = 3 streamed: each chunk carries its choice\'s index, each choice its own finish chunk', async () => {
  const req = { model: 'x', messages: chat('Three streams'), max_tokens: 12, temperature: 1.0, top_p: 1, seed: 8, n: 3 };
  const whole = await client(main).chat.completions.create(req);
  const stream = await client(main).chat.completions.create({ ...req, stream: true, stream_options: { include_usage: true } });
  const text = ['', '', ''], finish = [[], [], []], roles = [0, 0, 0];
  let usage = null;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      assert.equal(chunk.choices.length, 1);
      if (c.delta.role) roles[c.index]++;
      text[c.index] += c.delta.content ?? '';
      if (c.finish_reason) finish[c.index].push(c.finish_reason);
    }
  }
  assert.deepEqual(roles, [1, 1, 1], 'each choice starts with the role once');
  assert.deepEqual(finish, [['length'], ['length'], ['length']]);
  assert.deepEqual(text, whole.choices.map((c) => c.message.content));
  assert.equal(usage.completion_tokens, 36);
  assert.equal(usage.prompt_tokens, whole.usage.prompt_tokens);

  const s = await client(main).completions.create({ model: 'x', prompt: 'Two streams', max_tokens: 5, temperature: 1, seed: 3,
    n: 2, stream: true });
  const parts = ['', ''];
  const ends = [0, 0];
  for await (const chunk of s) for (const c of chunk.choices) { parts[c.index] += c.text; if (c.finish_reason) ends[c.index]++; }
  const t = await client(main).completions.create({ model: 'x', prompt: 'Two streams', max_tokens: 5, temperature: 1, seed: 3, n: 2 });
  assert.deepEqual(parts, t.choices.map((c) => c.text));
  assert.deepEqual(ends, [1, 1]);
});

test('n = 4 prefills the prompt once: the other choices copy its KV and compute its last token', async () => {
  const prefilled = async () => Number(/^sparrow_prefill_tokens_total (\d+)$/m.exec(await (await fetch(`${main.url}/metrics`)).text())[1]);
  const ask = (n, salt) => client(main).chat.completions.create({ model: 'x', n, max_tokens: 3, seed: 1, cache_salt: salt,
    messages: chat('A prompt long enough to matter: about lighthouses, tides, keepers, storms and the long nights they watched.') });
  let before = await prefilled();
  const one = await ask(1, `one-${Date.now()}`);
  const P = one.usage.prompt_tokens;
  assert.equal(one.usage.prompt_tokens_details.cached_tokens, 0);
  assert.equal(await prefilled() - before, P);
  before = await prefilled();
  const four = await ask(4, `four-${Date.now()}`);
  assert.equal(four.choices.length, 4);
  assert.equal(four.usage.prompt_tokens, P);
  assert.equal(four.usage.prompt_tokens_details.cached_tokens, 0);
  assert.equal(await prefilled() - before, P + 3, 'the prompt once, plus its last token for each other choice');
  assert.match(main.log(), new RegExp(`srv  ${four.id} \\| prompt ${P} tokens .*\\| n 4 \\|`));
});

test('n out of range is a 400 naming n', async () => {
  for (const n of [5, 0, -1]) {
    await assert.rejects(client(main).chat.completions.create({ model: 'x', messages: chat('x'), n }), (e) =>
      e instanceof OpenAI.BadRequestError && e.param === 'n' && e.code === 'invalid_value' &&
      e.error.message === `'n' must be between 1 and 4 (the server's --parallel), got ${n}`);
  }
  await assert.rejects(client(main).completions.create({ model: 'x', prompt: 'x', n: 'two' }), (e) =>
    e.status === 400 && e.param === 'n' && e.code === 'invalid_type');
  await assert.rejects(client(cold).completions.create({ model: 'x', prompt: 'x', n: 2 }), (e) =>
    e.status === 400 && e.param === 'n' && /between 1 and 1/.test(e.error.message));
});

test('metrics are Prometheus text', async () => {
  const res = await fetch(`${main.url}/metrics`);
  assert.equal(res.status, 200);
  const text = await res.text();
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    assert.match(line, /^[a-zA-Z_:][a-zA-Z0-9_:]*(\{[a-zA-Z_][a-zA-Z0-9_]*="[^"]*"(,[a-zA-Z_][a-zA-Z0-9_]*="[^"]*")*\})? -?[0-9.eE+-]+$|\+Inf/, line);
  }
  for (const name of ['sparrow_requests_total', 'sparrow_time_to_first_token_seconds_bucket', 'sparrow_queue_depth',
    'sparrow_slots_active', 'sparrow_kv_cache_tokens', 'sparrow_memory_allocated_bytes', 'sparrow_prompt_tokens_total',
    'sparrow_generated_tokens_total', 'sparrow_decode_tokens_per_second', 'sparrow_resident_bytes']) {
    assert.ok(text.includes(name), name);
  }
  assert.ok(Number(/^sparrow_generated_tokens_total (\d+)/m.exec(text)[1]) > 0);
  assert.match(text, /^sparrow_model_bytes\{class="routed_experts",placement="mapped"\} [1-9]\d*$/m);
  assert.match(text, /^sparrow_model_file_bytes [1-9]\d*$/m);
});

test('an expert cache smaller than the experts gives the same text, and its counters move', async () => {
  const small = await startServer(['--expert-cache', '60K']);
  const req = { model: 'x', messages: chat('experts from disk'), max_tokens: 12, temperature: 0.8, seed: 9 };
  const a = await client(small).chat.completions.create(req);
  const b = await client(main).chat.completions.create(req);
  assert.equal(a.choices[0].message.content, b.choices[0].message.content);
  const m = await (await fetch(`${small.url}/metrics`)).text();
  const num = (name) => Number(new RegExp(`^${name} (\\d+)`, 'm').exec(m)[1]);
  assert.ok(num('sparrow_expert_cache_misses_total') > 0);
  assert.ok(num('sparrow_expert_read_bytes_total') > 0);
  assert.ok(num('sparrow_expert_cache_budget_bytes') <= 60 * 1024);
  assert.match(m, /^sparrow_expert_cache_layer_misses_total\{layer="0"\} \d+/m);
  assert.match(m, /^sparrow_model_bytes\{class="routed_experts",placement="expert_cache"\} [1-9]\d*$/m);
  assert.equal(small.ready.plan.strategy, 'expert-cache');
});

test('API key: missing or wrong is 401, right is 200', async () => {
  const keyed = await startServer(['--api-key', 'sekrit']);
  await assert.rejects(client(keyed, 'wrong').models.list(), (e) => e.status === 401);
  const res = await fetch(`${keyed.url}/v1/models`);
  assert.equal(res.status, 401);
  assert.deepEqual((await res.json()).error, { message: 'missing or incorrect API key', type: 'invalid_request_error',
    param: null, code: 'invalid_api_key' });
  await assert.rejects(client(keyed, 'wrong').chat.completions.create({ model: 'x', messages: chat('x') }), (e) =>
    e instanceof OpenAI.AuthenticationError && e.code === 'invalid_api_key' && e.type === 'invalid_request_error' && e.param === null);
  const ok = await client(keyed, 'sekrit').models.list();
  assert.equal(ok.data.length, 1);
  assert.equal((await fetch(`${keyed.url}/health`)).status, 200);
});

async function post(route, body, headers = {}) {
  const res = await fetch(`${main.url}${route}`, { method: 'POST', body, headers: { 'Content-Type': 'application/json', ...headers } });
  return { status: res.status, json: await res.json().catch(() => null) };
}

test('bad input: clear 4xx errors in OpenAI shape, and the server keeps serving', async () => {
  // [body, status, param, code]: code is a string (or null), never the HTTP status
  const cases = [
    ['{not json', 400, null, 'invalid_json'],
    ['[1,2]', 400, null, 'invalid_type'],
    [JSON.stringify({ max_tokens: 2 }), 400, 'messages', 'missing_required_parameter'],
    [JSON.stringify({ messages: 'hi' }), 400, 'messages', 'invalid_type'],
    [JSON.stringify({ messages: [] }), 400, 'messages', 'invalid_value'],
    [JSON.stringify({ messages: chat('x'), temperature: 'hot' }), 400, 'temperature', 'invalid_type'],
    [JSON.stringify({ messages: chat('x'), temperature: 7 }), 400, 'temperature', 'invalid_value'],
    [JSON.stringify({ messages: chat('x'), max_tokens: -5 }), 400, 'max_tokens', 'invalid_value'],
    [JSON.stringify({ messages: chat('x'), max_tokens: 2.5 }), 400, 'max_tokens', 'invalid_value'],
    [JSON.stringify({ messages: chat('x'), stream: 'yes' }), 400, 'stream', 'invalid_type'],
    [JSON.stringify({ messages: chat('x'), stop: [1, 2] }), 400, 'stop', 'invalid_type'],
    [JSON.stringify({ messages: [{ role: 'user', content: [{ type: 'image_url', image_url: { url: 'x' } }] }] }), 400, 'messages', 'unsupported_value'],
    [JSON.stringify({ messages: chat('x'), response_format: { type: 'yaml' } }), 400, 'response_format', 'invalid_value'],
    [JSON.stringify({ messages: chat('x'), tools: {} }), 400, 'tools', 'invalid_type'],
    ['['.repeat(5000) + ']'.repeat(5000), 400, null, 'invalid_json'],
    [JSON.stringify({ messages: chat('word '.repeat(2000)) }), 400, 'messages', 'context_length_exceeded'],
  ];
  for (const [body, status, param, code] of cases) {
    const r = await post('/v1/chat/completions', body);
    assert.equal(r.status, status, body.slice(0, 80));
    assert.deepEqual(Object.keys(r.json.error).sort(), ['code', 'message', 'param', 'type']);
    assert.equal(typeof r.json.error.message, 'string');
    assert.equal(r.json.error.type, 'invalid_request_error', body.slice(0, 80));
    assert.equal(r.json.error.param, param, body.slice(0, 80));
    assert.equal(r.json.error.code, code, body.slice(0, 80));
  }
  const textCases = [
    [{ max_tokens: 2 }, 'missing_required_parameter'],
    [{ prompt: 5 }, 'invalid_type'],
    [{ prompt: [1, -2] }, 'invalid_value'],
    [{ prompt: [1, 'a'] }, 'invalid_type'],
    [{ prompt: [1, 2, 1e9] }, 'invalid_value'],
    [{ prompt: Array(600).fill(1) }, 'context_length_exceeded'],
    [{ prompt: 'word '.repeat(2000) }, 'context_length_exceeded'],
  ];
  for (const [body, code] of textCases) {
    const r = await post('/v1/completions', JSON.stringify(body));
    assert.equal(r.status, 400, JSON.stringify(body).slice(0, 80));
    assert.equal(r.json.error.param, 'prompt');
    assert.equal(r.json.error.code, code, JSON.stringify(body).slice(0, 80));
  }
  const big = await post('/v1/chat/completions', JSON.stringify({ messages: chat('x'.repeat(9 << 20)) }));
  assert.equal(big.status, 413);
  assert.equal(big.json.error.code, 'request_too_large');
  const bad = await fetch(`${main.url}/v1/chat/completions`, { method: 'POST',
    body: Buffer.concat([Buffer.from('{"messages":[{"role":"user","content":"'), Buffer.from([0xff, 0xfe, 0xc3]), Buffer.from('"}],"max_tokens":2}')]) });
  assert.ok(bad.status === 200 || bad.status === 400, `invalid UTF-8 gave ${bad.status}`);
  const unknown = await post('/v1/chat/completions', JSON.stringify({ messages: chat('x'), max_tokens: 2, frobnicate: true }));
  assert.equal(unknown.status, 200, 'unknown fields are ignored');
  const nope = await fetch(`${main.url}/v1/nope`);
  assert.equal(nope.status, 404);
  assert.deepEqual((await nope.json()).error, { message: 'no route GET /v1/nope', type: 'invalid_request_error', param: null, code: 'not_found' });
  const get = await fetch(`${main.url}/v1/chat/completions`);
  assert.equal(get.status, 405);
  assert.equal((await get.json()).error.code, 'method_not_allowed');
  assert.equal((await fetch(`${main.url}/health`)).status, 200);
});

// The official client reads the error object: APIError's code, param and type.
test('errors through the openai client: code, param and type', async () => {
  const expectError = (promise, status, fields) => assert.rejects(promise, (e) => {
    assert.ok(e instanceof OpenAI.APIError, String(e));
    assert.equal(e.status, status);
    for (const [k, v] of Object.entries(fields)) assert.equal(e[k], v, `${k} of ${e.message}`);
    return true;
  });
  const c = client(main);
  await expectError(c.chat.completions.create({ model: 'x', messages: chat('x'), temperature: 'hot' }), 400,
    { type: 'invalid_request_error', param: 'temperature', code: 'invalid_type' });
  await expectError(c.chat.completions.create({ model: 'x', messages: chat('x'), top_p: 3 }), 400,
    { type: 'invalid_request_error', param: 'top_p', code: 'invalid_value' });
  await expectError(c.chat.completions.create({ model: 'x', messages: chat('word '.repeat(2000)) }), 400,
    { type: 'invalid_request_error', param: 'messages', code: 'context_length_exceeded' });
  await expectError(c.completions.create({ model: 'x', prompt: 'hi', stream: true, logprobs: 99 }), 400,
    { type: 'invalid_request_error', param: 'logprobs', code: 'invalid_value' });
  await expectError(c.chat.completions.create({ model: 'x', messages: chat('x'), tool_choice: 'required' }), 400,
    { type: 'invalid_request_error', param: 'tool_choice', code: 'invalid_value' });
  const e400 = await c.chat.completions.create({ model: 'x', messages: chat('x'), max_tokens: 0 }).catch((e) => e);
  assert.ok(e400 instanceof OpenAI.BadRequestError);
  assert.equal(e400.error.message, "'max_tokens' must be between 1 and 1073741824, got 0");
});

// Sends raw bytes and collects everything the server writes until it closes
// the connection (or 5 s pass): the responses, split at their status lines.
function rawHttp(s, text) {
  return new Promise((resolve) => {
    const sock = net.connect(Number(new URL(s.url).port), '127.0.0.1');
    let data = '';
    const done = (closed) => {
      clearTimeout(timer);
      sock.destroy();
      const responses = data.split(/(?=HTTP\/1\.[01] \d{3} )/).filter(Boolean).map((r) => {
        const status = Number(r.slice(9, 12));
        const body = r.slice(r.indexOf('\r\n\r\n') + 4);
        let json = null;
        try { json = JSON.parse(body); } catch { /* not JSON */ }
        return { status, head: r.slice(0, r.indexOf('\r\n\r\n')), json };
      });
      resolve({ closed, responses });
    };
    const timer = setTimeout(() => done(false), 5000);
    sock.on('data', (d) => { data += d; });
    sock.on('end', () => done(true));
    sock.on('error', () => done(true));
    sock.write(text);
  });
}

test('HTTP framing: duplicate Content-Length, or Transfer-Encoding with Content-Length, is a 400 and ends the connection', async () => {
  const body = JSON.stringify({ prompt: 'hi', max_tokens: 2 });
  const L = body.length;
  // a second request hidden in the body: a server reading the other length would answer it too
  const hidden = 'GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n';
  const post = (headers, payload) => `POST /v1/completions HTTP/1.1\r\nHost: x\r\n${headers.map((h) => `${h}\r\n`).join('')}\r\n${payload}`;
  const chunked = `${L.toString(16)}\r\n${body}\r\n0\r\n\r\n`;
  const cases = [
    [post([`Content-Length: ${L}`, `Content-Length: ${L + hidden.length}`], body + hidden), /2 Content-Length/],
    [post([`Content-Length: ${L + hidden.length}`, `Content-Length: ${L}`], body + hidden), /2 Content-Length/],
    [post([`Content-Length: ${L}`, `Content-Length: ${L}`], body), /2 Content-Length/],
    [post([`Content-Length: ${L}`, 'Transfer-Encoding: chunked'], chunked), /both Content-Length and Transfer-Encoding/],
    [post(['Transfer-Encoding: chunked', `Content-Length: ${chunked.length}`], chunked), /both Content-Length and Transfer-Encoding/],
    [post(['Transfer-Encoding: chunked', 'Transfer-Encoding: chunked'], chunked), /2 Transfer-Encoding/],
    [post(['Transfer-Encoding: gzip, chunked'], chunked), /not supported/],
  ];
  for (const [text, message] of cases) {
    const r = await rawHttp(main, text);
    const head = text.split('\r\n\r\n')[0];
    assert.ok(r.closed, `the server closes the connection: ${head}`);
    assert.equal(r.responses.length, 1, `one response, nothing smuggled: ${head}`);
    assert.equal(r.responses[0].status, 400, head);
    assert.equal(r.responses[0].json.error.type, 'invalid_request_error', head);
    assert.equal(r.responses[0].json.error.code, 'bad_framing', head);
    assert.match(r.responses[0].json.error.message, message);
  }
  // a Content-Length that is not one number: libmicrohttpd answers 400 itself
  const list = await rawHttp(main, post([`Content-Length: ${L}, ${L}`], body));
  assert.equal(list.responses[0].status, 400);
  assert.ok(list.closed);
  // well-framed requests, either way, still work
  const ok1 = await rawHttp(main, post([`Content-Length: ${L}`, 'Connection: close'], body));
  assert.equal(ok1.responses[0].status, 200);
  const ok2 = await rawHttp(main, post(['Transfer-Encoding: chunked', 'Connection: close'], chunked));
  assert.equal(ok2.responses[0].status, 200);
  assert.equal(ok2.responses[0].json.usage.completion_tokens, 2);
});

test('--max-tokens bounds requests that give no max_tokens; a full queue is a 503 with Retry-After', async () => {
  const s = await startServer(['--parallel', '1', '--queue', '1', '--max-tokens', '5']);
  const c = await client(s).chat.completions.create({ model: 'x', messages: chat('no limit given'), temperature: 0 });
  assert.ok(c.usage.completion_tokens <= 5, JSON.stringify(c.usage));
  const t = await client(s).completions.create({ model: 'x', prompt: 'no limit given', temperature: 0 });
  assert.ok(t.usage.completion_tokens <= 5, JSON.stringify(t.usage));
  let streamed = 0;
  for await (const ch of await client(s).completions.create({ model: 'x', prompt: 'no limit', stream: true })) {
    if (ch.choices[0]?.text) streamed++;
  }
  assert.ok(streamed <= 5, `${streamed} chunks`);
  const given = await client(s).completions.create({ model: 'x', prompt: 'a limit given', max_tokens: 9, temperature: 0 });
  assert.ok(given.usage.completion_tokens > 5 || given.choices[0].finish_reason === 'stop', 'a request\'s own max_tokens wins');

  // one generating (its first chunk is out), one waiting; the third finds the queue full
  const ac = new AbortController();
  const long = await client(s).completions.create({ model: 'x', prompt: 'long', max_tokens: 400, stream: true }, { signal: ac.signal });
  const it = long[Symbol.asyncIterator]();
  await it.next();
  const waiting = client(s).completions.create({ model: 'x', prompt: 'waits', max_tokens: 2 });
  let depth = 0;
  for (let i = 0; i < 100 && depth < 1; i++) {
    await new Promise((r) => setTimeout(r, 20));
    depth = Number(/^sparrow_queue_depth (\d+)/m.exec(await (await fetch(`${s.url}/metrics`)).text())[1]);
  }
  assert.equal(depth, 1);
  const busy = await fetch(`${s.url}/v1/completions`, { method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ prompt: 'third', max_tokens: 2 }) });
  assert.equal(busy.status, 503);
  assert.equal(busy.headers.get('retry-after'), '1');
  assert.deepEqual((await busy.json()).error, { message: 'the server is busy: 1 requests are already waiting',
    type: 'server_error', param: null, code: 'server_busy' });
  ac.abort();
  await it.return?.().catch(() => {});
  assert.equal((await waiting).usage.completion_tokens <= 2, true);
});

// Reads an SSE response to its end; resolves with the text.
async function readAll(res) {
  const dec = new TextDecoder();
  let text = '';
  for await (const part of res.body) text += dec.decode(part, { stream: true });
  return text;
}

test('SIGTERM: no new connections, short requests finish, long ones end with an error and [DONE], exit 0', async () => {
  const s = await startServer(['--ctx', '4096', '--parallel', '3', '--shutdown-timeout', '1']);
  const postJson = (body) => fetch(`${s.url}/v1/completions`, { method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify(body) });
  const active = async () => Number(/^sparrow_slots_active (\d+)/m.exec(await (await fetch(`${s.url}/metrics`)).text())[1]);
  const stream = await postJson({ prompt: 'a long stream', max_tokens: 3000, stream: true, stream_options: { include_usage: true } });
  const streamText = readAll(stream);
  const long = postJson({ prompt: 'a long answer', max_tokens: 3000 });
  for (let i = 0; i < 200 && await active() < 2; i++) await new Promise((r) => setTimeout(r, 20));
  assert.equal(await active(), 2);
  let shortDone = false;
  const short = postJson({ prompt: 'a short answer', max_tokens: 20 }).finally(() => { shortDone = true; });
  for (let i = 0; i < 200 && !shortDone && await active() < 3; i++) await new Promise((r) => setTimeout(r, 10));
  const exited = new Promise((resolve) => s.proc.on('exit', (code, signal) => resolve({ code, signal, at: Date.now() })));
  const t0 = Date.now();
  s.proc.kill('SIGTERM');
  await new Promise((r) => setTimeout(r, 300));
  // (fetch would reuse a kept-alive connection: a fresh socket)
  const connect = await new Promise((resolve) => {
    const sock = net.connect(Number(new URL(s.url).port), '127.0.0.1');
    sock.on('connect', () => { sock.destroy(); resolve('connected'); });
    sock.on('error', (e) => resolve(e.code));
  });
  assert.equal(connect, 'ECONNREFUSED', 'a new connection is refused while draining');

  const shortRes = await short;
  assert.equal(shortRes.status, 200, 'a request that fits in --shutdown-timeout completes');
  const shortBody = await shortRes.json();
  assert.ok(shortBody.usage.completion_tokens > 0 && shortBody.usage.completion_tokens <= 20);
  assert.notEqual(shortBody.choices[0].finish_reason, null);
  const longRes = await long;
  assert.equal(longRes.status, 503);
  const longBody = await longRes.json();
  assert.equal(longBody.error.code, 'server_shutdown');
  assert.match(longBody.error.message, /shutting down/);
  const text = await streamText;
  assert.match(text, /^data: \{"error":\{"message":"the server is shutting down[^\n]*"code":"server_shutdown"\}\}$/m);
  assert.ok(text.endsWith('data: [DONE]\n\n'), text.slice(-200));
  const usage = text.split('\n').filter((l) => l.startsWith('data: {"id"')).map((l) => JSON.parse(l.slice(6))).find((c) => c.usage);
  assert.ok(usage && usage.usage.completion_tokens > 0, 'the usage chunk still comes');

  const { code, signal, at } = await exited;
  assert.equal(code, 0, `exit ${code} ${signal}: ${s.log().slice(-2000)}`);
  assert.ok(at - t0 < 1000 + 4000, `exited ${at - t0} ms after SIGTERM`);
  assert.match(s.log(), /shutting down; [23] requests in flight, waiting up to 1 s/);
  assert.match(s.log(), /ending 2 requests still in flight/);
});

// A stream that fails after its first chunks ends with an error event in
// OpenAI's shape, which the official client throws as an APIError.
test('a streamed error: the openai client throws it with code, param and type', async () => {
  const s = await startServer(['--ctx', '4096', '--shutdown-timeout', '0']);
  const exited = new Promise((resolve) => s.proc.on('exit', (code, signal) => resolve({ code, signal })));
  const stream = await client(s).chat.completions.create({ model: 'x', messages: chat('a long stream'), max_tokens: 3000,
    stream: true });
  let chunks = 0;
  const caught = await (async () => {
    for await (const ch of stream) {
      assert.equal(ch.object, 'chat.completion.chunk');
      if (chunks++ === 0) s.proc.kill('SIGTERM');
    }
    return null;
  })().catch((e) => e);
  assert.ok(chunks > 0);
  assert.ok(caught instanceof OpenAI.APIError, `the stream ended without an error: ${caught}`);
  assert.equal(caught.type, 'server_error');
  assert.equal(caught.code, 'server_shutdown');
  assert.equal(caught.param, null);
  assert.match(caught.message, /the server is shutting down: the generation was stopped after \d+ tokens/);
  const { code, signal } = await exited;
  assert.equal(code, 0, `exit ${code} ${signal}: ${s.log().slice(-2000)}`);
});

// A client that closes its connection before the response is complete
// cancels the generation; the log says so in exactly one line per request.
test('a client that hangs up mid-generation: cancelled, and logged once', async () => {
  const s = await startServer(['--ctx', '4096', '--parallel', '2']);
  const active = async () => Number(/^sparrow_slots_active (\d+)/m.exec(await (await fetch(`${s.url}/metrics`)).text())[1]);
  const gone = () => s.log().split('\n').filter((l) => /client went away/.test(l));
  // streamed: hang up after the first chunk
  const ac = new AbortController();
  const stream = await client(s).chat.completions.create({ model: 'x', messages: chat('hang up on me'), max_tokens: 3000,
    stream: true }, { signal: ac.signal });
  let id = null;
  for await (const ch of stream) {
    id = ch.id;
    ac.abort();
    break;
  }
  assert.match(id, /^chatcmpl-/);
  // not streamed: hang up while it generates
  const ac2 = new AbortController();
  const blocking = fetch(`${s.url}/v1/completions`, { method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ prompt: 'hang up on me too', max_tokens: 3000 }), signal: ac2.signal }).catch((e) => e);
  for (let i = 0; i < 200 && await active() < 1; i++) await settle(10);
  ac2.abort();
  assert.equal((await blocking).name, 'AbortError');
  for (let i = 0; i < 100 && (gone().length < 2 || await active() > 0); i++) await settle(50);
  await settle(300);  // time for a second line, were there one
  assert.equal(await active(), 0, 'both generations were cancelled');
  const lines = gone();
  assert.equal(lines.length, 2, s.log().slice(-3000));
  for (const l of lines) assert.match(l, /srv {2}(chatcmpl|cmpl)-[0-9a-f]+ \| client went away after \d+ tokens; generation cancelled$/);
  const ofStream = s.log().split('\n').filter((l) => l.includes(id));
  assert.equal(ofStream.length, 1, ofStream.join('\n'));
  assert.match(ofStream[0], /client went away/);
  const m = await (await fetch(`${s.url}/metrics`)).text();
  assert.ok(Number(/^sparrow_generated_tokens_total (\d+)/m.exec(m)[1]) < 2 * 3000, 'neither ran to its max_tokens');
});

// Opens n TCP connections that send nothing, from the given local loopback
// addresses in turn; resolves once each has connected or been closed. Each
// entry records whether and when the server closed it.
async function idleSockets(s, n, addrs) {
  const port = Number(new URL(s.url).port);
  const socks = await Promise.all(Array.from({ length: n }, (_, i) => new Promise((resolve) => {
    const e = { closedAt: 0, sock: null };
    e.sock = net.connect({ port, host: '127.0.0.1', localAddress: addrs[i % addrs.length] });
    e.sock.on('close', () => { e.closedAt = Date.now(); resolve(e); });
    e.sock.on('error', () => {});
    e.sock.on('connect', () => resolve(e));
    e.sock.setTimeout(20000, () => e.sock.destroy());
  })));
  return socks;
}
const closedCount = (socks) => socks.filter((e) => e.closedAt).length;
const destroyAll = (socks) => { for (const e of socks) e.sock.destroy(); };
const settle = (ms) => new Promise((r) => setTimeout(r, ms));

async function timedHealth(s) {
  const t0 = Date.now();
  const res = await fetch(`${s.url}/health`, { signal: AbortSignal.timeout(5000) });
  return { status: res.status, ms: Date.now() - t0 };
}

test('600 idle connections: /health still answers; one address is held to its limit; idle and trickling connections are closed', async () => {
  const s = await startServer(['--max-connections-per-ip', '64', '--request-timeout', '3']);
  // one address: 64 held, the rest closed at once, none left waiting
  const one = await idleSockets(s, 600, ['127.0.0.2']);
  await settle(500);
  assert.equal(600 - closedCount(one), 64, 'connections from one address beyond its limit are closed');
  let h = await timedHealth(s);
  assert.equal(h.status, 200);
  assert.ok(h.ms < 3000, `/health took ${h.ms} ms`);
  destroyAll(one);
  await settle(300);

  // many addresses, 600 connections: all held, and /health and a completion still answer
  const addrs = Array.from({ length: 30 }, (_, i) => `127.0.0.${10 + i}`);
  const t0 = Date.now();
  const many = await idleSockets(s, 600, addrs);
  await settle(300);
  assert.equal(closedCount(many), 0, 'under both limits, idle connections are kept for a while');
  h = await timedHealth(s);
  assert.equal(h.status, 200);
  assert.ok(h.ms < 3000, `/health took ${h.ms} ms`);
  const r = await client(s).completions.create({ model: 'x', prompt: 'still here', max_tokens: 2 });
  assert.equal(r.usage.completion_tokens, 2);

  // a client trickling its headers a byte at a time is cut at --request-timeout too
  const port = Number(new URL(s.url).port);
  const slow = net.connect({ port, host: '127.0.0.1', localAddress: '127.0.0.3' });
  let slowClosed = 0;
  slow.on('error', () => {});
  slow.on('close', () => { slowClosed = Date.now(); });
  const slowStart = Date.now();
  slow.write('GET /health HTTP/1.1\r\nHost: x\r\n');
  const drip = setInterval(() => { if (!slow.destroyed) slow.write('X'); }, 200);
  for (let i = 0; i < 60 && (!slowClosed || closedCount(many) < 600); i++) await settle(100);
  clearInterval(drip);
  slow.destroy();
  assert.ok(slowClosed && slowClosed - slowStart < 5000, 'a trickling request is closed');
  assert.equal(closedCount(many), 600, 'idle connections are closed after --request-timeout');
  const last = Math.max(...many.map((e) => e.closedAt));
  assert.ok(last - t0 < 6000, `the last idle connection closed ${last - t0} ms after opening`);
  destroyAll(many);
  assert.equal((await timedHealth(s)).status, 200);
});

test('past --max-connections a new client is closed at once, never left waiting', async () => {
  const s = await startServer(['--max-connections', '40', '--max-connections-per-ip', '0']);
  const held = await idleSockets(s, 40, ['127.0.0.2']);
  await settle(300);
  assert.equal(closedCount(held), 0);
  const extra = await idleSockets(s, 5, ['127.0.0.4']);
  await settle(500);
  assert.equal(closedCount(extra), 5, 'connections past the limit are closed');
  const t0 = Date.now();
  await assert.rejects(fetch(`${s.url}/health`, { signal: AbortSignal.timeout(5000) }), (e) => e.name !== 'TimeoutError');
  assert.ok(Date.now() - t0 < 2000, 'refused, not left in the backlog');
  destroyAll(held);
  destroyAll(extra);
  await settle(300);
  assert.equal((await timedHealth(s)).status, 200);
});

// The oracle of the issue: a client learning, from cached_tokens, how much of
// its prompt matches what another client sent. Each API key is a cache scope.
test('prompt cache: one API key never reuses, nor learns of, another key\'s prompt', async () => {
  const s = await startServer(['--api-key', 'key-one', '--api-key', 'key-two', '--parallel', '1']);
  const secret = 'Remember this: the vault code is 4821. Then write a poem about rivers and stones and rain.';
  const ask = (key, content) => client(s, key).chat.completions.create({ model: 'x', messages: chat(content), max_tokens: 2, temperature: 0 });
  await ask('key-one', secret);
  const own = await ask('key-one', `${secret} And one more line.`);
  assert.ok(own.usage.prompt_tokens_details.cached_tokens > 20, `the same key reuses its prefix: ${JSON.stringify(own.usage)}`);
  for (const guess of ['4821', '1234']) {
    const other = await ask('key-two', `Remember this: the vault code is ${guess}. Then write a poem about rivers and stones and rain.`);
    assert.equal(other.usage.prompt_tokens_details.cached_tokens, 0, `another key's guess ${guess}`);
    await ask('key-one', secret);  // the secret back in the cache for the next guess
  }
  await assert.rejects(ask('key-three', secret), (e) => e.status === 401);
});

test('prompt cache: cache_salt scopes it without keys; bad salts are 400', async () => {
  const s = await startServer(['--parallel', '3']);
  const base = 'A long shared beginning about lighthouses, tides and the keepers who watched them through the night.';
  const ask = async (content, salt) => (await client(s).completions.create({ model: 'x', prompt: content, max_tokens: 2,
    temperature: 0, ...(salt ? { cache_salt: salt } : {}) })).usage;
  await ask(base, 'alpha-salt');
  const again = await ask(`${base} More.`, 'alpha-salt');
  assert.ok(again.prompt_tokens_details.cached_tokens > 10, JSON.stringify(again));
  assert.equal((await ask(`${base} Other.`, 'beta-salt')).prompt_tokens_details.cached_tokens, 0, 'another salt');
  assert.equal((await ask(`${base} Plain.`)).prompt_tokens_details.cached_tokens, 0, 'no salt');
  const back = await ask(`${base} Back.`, 'alpha-salt');
  assert.ok(back.prompt_tokens_details.cached_tokens > 10, `the first salt's cache is still there: ${JSON.stringify(back)}`);
  const chatSalt = await client(s).chat.completions.create({ model: 'x', messages: chat(base), max_tokens: 1, cache_salt: 'c' });
  assert.equal(chatSalt.usage.prompt_tokens_details.cached_tokens, 0);
  for (const bad of [5, '', 'x'.repeat(257)]) {
    const res = await fetch(`${s.url}/v1/completions`, { method: 'POST', headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({ prompt: base, max_tokens: 1, cache_salt: bad }) });
    assert.equal(res.status, 400);
    assert.equal((await res.json()).error.param, 'cache_salt');
  }
});

test('a prompt far past the context is refused early; tokenizations are bounded by --max-tokenizing', async () => {
  const s = await startServer(['--max-tokenizing', '1']);
  const huge = 'alpha beta gamma delta, epsilon.\n'.repeat(230000);  // 7.6 MB, some 1.4 M tokens
  const send = (route, body) => fetch(`${s.url}/v1/${route}`, { method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify(body) });
  for (const [route, body] of [['completions', { prompt: huge, max_tokens: 1 }], ['chat/completions', { messages: chat(huge), max_tokens: 1 }]]) {
    const res = await send(route, body);
    assert.equal(res.status, 400);
    const err = (await res.json()).error;
    // the count stops at the context: no exact count of a prompt tokenized in full
    assert.equal(err.message, 'the prompt has more than 511 tokens; the context holds 512');
  }
  let maxActive = 0, sampling = true;
  const sampler = (async () => {
    while (sampling) {
      const m = await (await fetch(`${s.url}/metrics`)).text();
      maxActive = Math.max(maxActive, Number(/^sparrow_tokenizing (\d+)/m.exec(m)[1]));
      await settle(2);
    }
  })();
  const results = await Promise.all(Array.from({ length: 8 }, (_, i) =>
    send(i % 2 ? 'chat/completions' : 'completions', i % 2 ? { messages: chat(huge), max_tokens: 1 } : { prompt: huge, max_tokens: 1 })));
  sampling = false;
  await sampler;
  assert.deepEqual(results.map((r) => r.status), Array(8).fill(400));
  assert.ok(maxActive <= 1, `${maxActive} prompts tokenized at once`);
  const m = await (await fetch(`${s.url}/metrics`)).text();
  assert.match(m, /^sparrow_tokenizing 0$/m);
  assert.match(m, /^sparrow_tokenizing_waiting 0$/m);
  const ok = await client(s).completions.create({ model: 'x', prompt: 'fits', max_tokens: 2 });
  assert.equal(ok.usage.completion_tokens, 2);
});

// A model file that shrinks under a running server (truncate, or a copy
// rewriting it in place): resident weights stay mapped with an expert cache,
// and everything with --mmap. The fault guard turns the SIGBUS into a failed
// request naming the file, then a clean stop, exit 1.
for (const mode of [['--expert-cache', '60K'], ['--mmap']]) {
  test(`a model file truncated under the server (${mode[0]}): an error naming the file, then a clean stop`, async () => {
    const copy = mkdtempSync(path.join(tmpdir(), 'sparrow-e2e-trunc-'));
    try {
      cpSync(dir, copy, { recursive: true });
      const s = await startServer(['--model', copy, '--ctx', '4096', ...mode]);
      servers.find((x) => x.proc === s.proc).expect = 1;  // it stops with an error
      const exited = new Promise((resolve) => s.proc.on('exit', (code, signal) => resolve({ code, signal })));
      const res = await fetch(`${s.url}/v1/completions`, { method: 'POST', headers: { 'Content-Type': 'application/json' },
        body: JSON.stringify({ prompt: 'a long stream', max_tokens: 3000, stream: true }) });
      const reader = res.body.getReader();
      const dec = new TextDecoder();
      let text = dec.decode((await reader.read()).value);
      const file = path.join(copy, 'model.safetensors');
      truncateSync(file, Math.floor(statSync(file).size / 2));
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        text += dec.decode(value, { stream: true });
      }
      assert.match(text, /^data: \{"error":\{"message":"generation failed: the model's files changed while in use \([^)]*model\.safetensors[^"]*"/m);
      assert.match(text, /^data: \{"error":\{"message":"generation failed: [^\n]*","type":"server_error","param":null,"code":"model_files_changed"\}\}$/m);
      assert.ok(text.endsWith('data: [DONE]\n\n'), text.slice(-300));
      const { code, signal } = await exited;
      assert.equal(signal, null, `killed by ${signal}: ${s.log().slice(-2000)}`);
      assert.equal(code, 1, s.log().slice(-2000));
      assert.match(s.log(), /error: the model's files changed while in use \(.*model\.safetensors: (a read went past its end|its size changed)/);
    } finally {
      rmSync(copy, { recursive: true, force: true });
    }
  });
}

test('load: 32 concurrent streaming clients, 3 requests each, all complete', async () => {
  const one = async (i) => {
    for (let k = 0; k < 3; k++) {
      const s = await client(main).chat.completions.create({ model: 'x', messages: chat(`client ${i} request ${k}`),
        max_tokens: 8, temperature: 0.5, seed: i, stream: true, stream_options: { include_usage: true } });
      let finish = null, usage = null;
      for await (const c of s) {
        if (c.usage) usage = c.usage;
        if (c.choices[0]?.finish_reason) finish = c.choices[0].finish_reason;
      }
      assert.equal(finish, 'length');
      assert.equal(usage.completion_tokens, 8);
    }
  };
  await Promise.all(Array.from({ length: 32 }, (_, i) => one(i)));
});
