// End-to-end tests of POST /v1/messages and /v1/messages/count_tokens (the
// Anthropic Messages API) with the official @anthropic-ai/sdk client:
// messages.create, messages.stream and finalMessage(), tools, tool results,
// stop sequences, thinking, countTokens, x-api-key authentication and
// Anthropic's error shape. The model is random (tools/make-e2e-model.sh):
// tests check protocol, shapes and consistency.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import Anthropic from '@anthropic-ai/sdk';
import { Servers, postJson, parseSse } from './helpers.mjs';

const servers = new Servers();
let main, think, keyed;
const client = (s, key = 'none') => new Anthropic({ baseURL: s.url, apiKey: key, maxRetries: 0 });
const user = (content) => [{ role: 'user', content }];
const tools = [{ name: 'get_weather', description: 'Weather of a city',
  input_schema: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } }];
const textOf = (m) => m.content.filter((b) => b.type === 'text').map((b) => b.text).join('');

before(async () => {
  main = await servers.start(servers.model(), ['--parallel', '2']);
  think = await servers.start(servers.model({ thinking: true }), ['--parallel', '1']);
  keyed = await servers.start(servers.model(), ['--api-key', 'sekrit', '--parallel', '1']);
});

after(() => servers.stop());

test('messages.create: a message with a text block, stop_reason max_tokens and usage', async () => {
  const m = await client(main).messages.create({ model: 'x', max_tokens: 8, messages: user('Hello there'), temperature: 0.5 });
  assert.match(m.id, /^msg_/);
  assert.equal(m.type, 'message');
  assert.equal(m.role, 'assistant');
  assert.equal(m.model, main.ready.model_id);
  assert.equal(m.content.length, 1);
  assert.equal(m.content[0].type, 'text');
  assert.ok(m.content[0].text.length > 0);
  assert.equal(m.stop_reason, 'max_tokens');
  assert.equal(m.stop_sequence, null);
  assert.equal(m.usage.output_tokens, 8);
  assert.equal(m.usage.cache_creation_input_tokens, 0);
  const count = await client(main).messages.countTokens({ model: 'x', messages: user('Hello there') });
  assert.ok(count.input_tokens > 5);
  assert.equal(m.usage.input_tokens + m.usage.cache_read_input_tokens, count.input_tokens,
    'uncached + cached input tokens = the rendered prompt');
});

test('system prompt: a string or text blocks, counted in the prompt', async () => {
  const plain = await client(main).messages.countTokens({ model: 'x', messages: user('Hi') });
  const sys = await client(main).messages.countTokens({ model: 'x', system: 'You answer in French.', messages: user('Hi') });
  const blocks = await client(main).messages.countTokens({ model: 'x', system: [{ type: 'text', text: 'You answer in French.' }],
    messages: user('Hi') });
  assert.ok(sys.input_tokens > plain.input_tokens + 3);
  assert.equal(blocks.input_tokens, sys.input_tokens);
  const m = await client(main).messages.create({ model: 'x', max_tokens: 2, system: 'You answer in French.', messages: user('Hi') });
  assert.equal(m.usage.input_tokens + m.usage.cache_read_input_tokens, sys.input_tokens);
  // content as blocks counts as the same text
  const asBlocks = await client(main).messages.countTokens({ model: 'x', messages: user([{ type: 'text', text: 'Hi' }]) });
  assert.equal(asBlocks.input_tokens, plain.input_tokens);
});

test('messages.stream: finalMessage() matches the text events and the non-streamed message', async () => {
  const req = { model: 'x', max_tokens: 16, messages: user('Stream this'), temperature: 0.9, seed: 11 };
  const whole = await client(main).messages.create(req);
  const s = client(main).messages.stream(req);
  let text = '';
  s.on('text', (delta) => { text += delta; });
  const final = await s.finalMessage();
  assert.equal(text, textOf(whole));
  assert.equal(textOf(final), textOf(whole));
  assert.equal(final.stop_reason, 'max_tokens');
  assert.equal(final.usage.output_tokens, 16);
  assert.equal(final.usage.input_tokens + final.usage.cache_read_input_tokens,
    whole.usage.input_tokens + whole.usage.cache_read_input_tokens);
  assert.match(final.id, /^msg_/);
});

test('stream: true: the event sequence of the Messages API', async () => {
  const stream = await client(main).messages.create({ model: 'x', max_tokens: 6, messages: user('Events'), stream: true });
  const types = [];
  let text = '';
  for await (const ev of stream) {
    types.push(ev.type);
    if (ev.type === 'content_block_delta') {
      assert.equal(ev.delta.type, 'text_delta');
      assert.equal(ev.index, 0);
      text += ev.delta.text;
    }
    if (ev.type === 'message_start') {
      assert.deepEqual(ev.message.content, []);
      assert.equal(ev.message.stop_reason, null);
      assert.ok(ev.message.usage.input_tokens > 0);
    }
    if (ev.type === 'message_delta') {
      assert.equal(ev.delta.stop_reason, 'max_tokens');
      assert.equal(ev.usage.output_tokens, 6);
    }
  }
  assert.ok(text.length > 0);
  assert.equal(types[0], 'message_start');
  assert.equal(types[1], 'content_block_start');
  assert.deepEqual(types.slice(-3), ['content_block_stop', 'message_delta', 'message_stop']);
  // raw SSE: every data line's type is its event line; a ping may come
  const raw = await postJson(`${main.url}/v1/messages`, { max_tokens: 3, messages: user('raw'), stream: true });
  for (const e of parseSse(raw.text)) assert.equal(e.event, e.data.type);
});

test('the same seed gives the same message; another seed another', async () => {
  const req = { model: 'x', max_tokens: 16, messages: user('Seeds'), temperature: 1.0, seed: 5 };
  const a = await client(main).messages.create(req);
  const b = await client(main).messages.create(req);
  const c = await client(main).messages.create({ ...req, seed: 6 });
  assert.equal(textOf(a), textOf(b));
  assert.notEqual(textOf(a), textOf(c));
});

// The random model writes arbitrary JSON input that may not close within
// max_tokens (then stop_reason is max_tokens): seeds are tried until one
// closes it; which do depends on the kernel set's arithmetic.
async function completedToolUse(c, req) {
  for (let seed = 1; seed <= 60; seed++) {
    const m = await c.messages.create({ ...req, seed });
    const uses = m.content.filter((b) => b.type === 'tool_use');
    assert.equal(uses.length, 1, JSON.stringify(m.content).slice(0, 400));
    assert.equal(uses[0].name, 'get_weather');
    assert.equal(typeof uses[0].input, 'object');
    if (m.stop_reason === 'tool_use') return { m, seed };
    assert.equal(m.stop_reason, 'max_tokens');
  }
  assert.fail('no seed of 60 closed the tool input');
}

test('tool_choice any: a tool_use block with an object input and stop_reason tool_use, streamed alike; a tool_result round trip', async () => {
  const req = { model: 'x', max_tokens: 150, messages: user('Weather in Paris?'), tools, tool_choice: { type: 'any' }, temperature: 1 };
  const { m, seed } = await completedToolUse(client(main), req);
  const use = m.content.find((b) => b.type === 'tool_use');
  assert.match(use.id, /^toolu_/);
  assert.ok(use.input !== null && !Array.isArray(use.input));

  const s = client(main).messages.stream({ ...req, seed });
  let json = '';
  s.on('inputJson', (delta) => { json += delta; });
  const final = await s.finalMessage();
  assert.equal(final.stop_reason, 'tool_use');
  const fuse = final.content.find((b) => b.type === 'tool_use');
  assert.deepEqual(fuse.input, use.input);
  assert.deepEqual(JSON.parse(json), use.input);
  assert.equal(fuse.name, 'get_weather');

  // naming the tool gives the same call
  const named = await client(main).messages.create({ ...req, seed, tool_choice: { type: 'tool', name: 'get_weather' } });
  assert.deepEqual(named.content.find((b) => b.type === 'tool_use').input, use.input);

  // the round trip: the assistant's tool_use and the user's tool_result
  const messages = [
    ...user('Weather in Paris?'),
    { role: 'assistant', content: [{ type: 'text', text: 'Let me look.' }, { type: 'tool_use', id: use.id, name: use.name, input: use.input }] },
    { role: 'user', content: [{ type: 'tool_result', tool_use_id: use.id, content: '{"temp": 21}' },
      { type: 'text', text: 'And tomorrow?' }] },
  ];
  const turn2 = await client(main).messages.create({ model: 'x', max_tokens: 8, messages, tools });
  assert.ok(['max_tokens', 'end_turn', 'tool_use'].includes(turn2.stop_reason));
  const n2 = await client(main).messages.countTokens({ model: 'x', messages, tools });
  const n1 = await client(main).messages.countTokens({ model: 'x', messages: user('Weather in Paris?'), tools });
  assert.ok(n2.input_tokens > n1.input_tokens + 10, 'the call and its result are in the prompt');
  assert.ok(n1.input_tokens > (await client(main).messages.countTokens({ model: 'x', messages: user('Weather in Paris?') })).input_tokens,
    'the tool definitions are counted');
  const err = await client(main).messages.create({ model: 'x', max_tokens: 2, tools, messages: [...messages.slice(0, 2),
    { role: 'user', content: [{ type: 'tool_result', tool_use_id: use.id, is_error: true, content: [{ type: 'text', text: 'timeout' }] }] }] });
  assert.equal(err.usage.output_tokens, 2);
  // tool_choice none: no call
  const none = await client(main).messages.create({ ...req, tool_choice: { type: 'none' }, max_tokens: 3 });
  assert.equal(none.content.filter((b) => b.type === 'tool_use').length, 0);
});

test('stop_sequences: stop_reason stop_sequence naming the one that matched', async () => {
  const req = { model: 'x', max_tokens: 30, messages: user('Stop test'), temperature: 0 };
  const full = textOf(await client(main).messages.create(req));
  const at = Math.floor(full.length / 2);
  const stop = full.slice(at, at + 2);
  const m = await client(main).messages.create({ ...req, stop_sequences: ['\u0001never', stop] });
  assert.equal(m.stop_reason, 'stop_sequence');
  assert.equal(m.stop_sequence, stop);
  assert.equal(textOf(m), full.slice(0, full.indexOf(stop)));
  const final = await client(main).messages.stream({ ...req, stop_sequences: [stop] }).finalMessage();
  assert.equal(final.stop_reason, 'stop_sequence');
  assert.equal(final.stop_sequence, stop);
});

test('thinking: thinking blocks from a template that opens <think>; disabled turns them off', async () => {
  const req = { model: 'x', max_tokens: 12, messages: user('Think about it'), temperature: 0.7, seed: 2,
    thinking: { type: 'enabled', budget_tokens: 1024 } };
  const m = await client(think).messages.create(req);
  assert.equal(m.content[0].type, 'thinking');
  assert.ok(m.content[0].thinking.length > 0);
  assert.equal(m.content[0].signature, '');
  const s = client(think).messages.stream(req);
  let thinking = '';
  s.on('thinking', (delta) => { thinking += delta; });
  const final = await s.finalMessage();
  assert.equal(thinking, m.content[0].thinking);
  assert.equal(final.content[0].thinking, m.content[0].thinking);
  const off = await client(think).messages.create({ ...req, thinking: { type: 'disabled' } });
  assert.equal(off.content[0].type, 'text');
  // earlier thinking blocks in the input are accepted and not shown to the model again
  const withThinking = await client(think).messages.countTokens({ model: 'x', messages: [...user('Hi'),
    { role: 'assistant', content: [{ type: 'thinking', thinking: 'hmm', signature: '' }, { type: 'text', text: 'Hello' }] }, ...user('Bye')] });
  const without = await client(think).messages.countTokens({ model: 'x', messages: [...user('Hi'),
    { role: 'assistant', content: 'Hello' }, ...user('Bye')] });
  assert.equal(withThinking.input_tokens, without.input_tokens);
});

test('authentication: x-api-key or a bearer token when the server has --api-key; 401 in Anthropic\'s shape', async () => {
  const ok = await client(keyed, 'sekrit').messages.create({ model: 'x', max_tokens: 2, messages: user('hi') });
  assert.equal(ok.usage.output_tokens, 2);
  const viaHeader = await postJson(`${keyed.url}/v1/messages`, { max_tokens: 2, messages: user('hi') },
    { 'x-api-key': 'sekrit', 'anthropic-version': '2023-06-01' });
  assert.equal(viaHeader.status, 200);
  const sdkHeader = new Anthropic({ baseURL: keyed.url, apiKey: null, defaultHeaders: { 'x-api-key': 'sekrit' }, maxRetries: 0 });
  assert.equal((await sdkHeader.messages.countTokens({ model: 'x', messages: user('hi') })).input_tokens > 0, true);
  const wrong = await postJson(`${keyed.url}/v1/messages`, { max_tokens: 2, messages: user('hi') }, { 'x-api-key': 'nope' });
  assert.equal(wrong.status, 401);
  assert.deepEqual(Object.keys(wrong.json), ['type', 'error']);
  assert.equal(wrong.json.type, 'error');
  assert.equal(wrong.json.error.type, 'authentication_error');
  await assert.rejects(client(keyed, 'nope').messages.create({ model: 'x', max_tokens: 2, messages: user('hi') }),
    (e) => e instanceof Anthropic.AuthenticationError && e.status === 401);
  // the OpenAI routes take x-api-key too
  const models = await fetch(`${keyed.url}/v1/models`, { headers: { 'x-api-key': 'sekrit' } });
  assert.equal(models.status, 200);
});

test('bad requests: 400 in Anthropic\'s error shape; the server keeps serving', async () => {
  const cases = [
    [{ messages: user('x') }, /max_tokens' is required/],
    [{ max_tokens: 0, messages: user('x') }, /max_tokens/],
    [{ max_tokens: 5, messages: [] }, /messages/],
    [{ max_tokens: 5, messages: [{ role: 'system', content: 'x' }] }, /role/],
    [{ max_tokens: 5, messages: user([{ type: 'image', source: { type: 'base64', media_type: 'image/png', data: 'AA==' } }]) }, /image blocks are not supported/],
    [{ max_tokens: 5, messages: user('x'), tools: [{ type: 'web_search_20250305', name: 'web_search' }] }, /web_search_20250305/],
    [{ max_tokens: 5, messages: user('x'), tools, tool_choice: { type: 'tool' } }, /tool_choice/],
    [{ max_tokens: 5, messages: user('x'), tool_choice: { type: 'any' } }, /no 'tools'/],
    [{ max_tokens: 5, messages: user('x'), temperature: 'hot' }, /temperature/],
    [{ max_tokens: 5, messages: user('x'), stop_sequences: 'END' }, /stop_sequences/],
    [{ max_tokens: 5, messages: user('x'), thinking: { type: 'sometimes' } }, /thinking/],
    [{ max_tokens: 5, messages: user('word '.repeat(2000)) }, /context/],
  ];
  for (const [body, message] of cases) {
    const r = await postJson(`${main.url}/v1/messages`, body);
    assert.equal(r.status, 400, JSON.stringify(body).slice(0, 200));
    assert.equal(r.json.type, 'error');
    assert.equal(r.json.error.type, 'invalid_request_error');
    assert.match(r.json.error.message, message);
  }
  await assert.rejects(client(main).messages.create({ model: 'x', messages: user('x') }),
    (e) => e instanceof Anthropic.BadRequestError && e.error.error.type === 'invalid_request_error');
  const notJson = await postJson(`${main.url}/v1/messages`, '{nope');
  assert.equal(notJson.status, 400);
  assert.equal(notJson.json.error.type, 'invalid_request_error');
  const get = await fetch(`${main.url}/v1/messages`);
  assert.equal(get.status, 405);
  assert.equal((await get.json()).type, 'error');
  const count = await postJson(`${main.url}/v1/messages/count_tokens`, { messages: 'x' });
  assert.equal(count.status, 400);
  assert.equal(count.json.error.type, 'invalid_request_error');
  const ok = await client(main).messages.create({ model: 'x', max_tokens: 2, messages: user('still here') });
  assert.equal(ok.usage.output_tokens, 2);
});
