// End-to-end tests of POST /v1/responses (the OpenAI Responses API) with the
// official `openai` client: responses.create, streamed events, the
// responses.stream() helper (which accumulates the events and throws on an
// inconsistent stream), function tools, and errors. The model is random
// (tools/make-e2e-model.sh): tests check protocol, shapes and consistency.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { Servers, postJson, parseSse } from './helpers.mjs';

const servers = new Servers();
let main, think;
const client = (s) => new OpenAI({ baseURL: `${s.url}/v1`, apiKey: 'none', maxRetries: 0 });
const tools = [{ type: 'function', name: 'get_weather', description: 'Weather of a city', strict: false,
  parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } }];

before(async () => {
  main = await servers.start(servers.model(), ['--parallel', '2']);
  think = await servers.start(servers.model({ thinking: true }), ['--parallel', '1']);
});

after(() => servers.stop());

const messageText = (r) => r.output.filter((o) => o.type === 'message')
  .flatMap((o) => o.content).filter((c) => c.type === 'output_text').map((c) => c.text).join('');

test('responses.create: a response object with a message, usage and the parameters echoed', async () => {
  const r = await client(main).responses.create({ model: 'x', input: 'Hello there', max_output_tokens: 8, temperature: 0.5,
    top_p: 0.9, metadata: { run: 'e2e' }, store: true });
  assert.match(r.id, /^resp_/);
  assert.equal(r.object, 'response');
  assert.equal(typeof r.created_at, 'number');
  assert.equal(r.status, 'incomplete');
  assert.deepEqual(r.incomplete_details, { reason: 'max_output_tokens' });
  assert.equal(r.error, null);
  assert.equal(r.output.length, 1);
  const m = r.output[0];
  assert.equal(m.type, 'message');
  assert.match(m.id, /^msg_/);
  assert.equal(m.role, 'assistant');
  assert.equal(m.status, 'incomplete');
  assert.equal(m.content.length, 1);
  assert.equal(m.content[0].type, 'output_text');
  assert.deepEqual(m.content[0].annotations, []);
  assert.ok(m.content[0].text.length > 0);
  assert.equal(r.output_text, m.content[0].text);
  assert.equal(r.usage.output_tokens, 8);
  assert.ok(r.usage.input_tokens > 5);
  assert.equal(r.usage.total_tokens, r.usage.input_tokens + 8);
  assert.equal(r.usage.output_tokens_details.reasoning_tokens, 0);
  assert.equal(typeof r.usage.input_tokens_details.cached_tokens, 'number');
  assert.equal(r.max_output_tokens, 8);
  assert.equal(r.temperature, 0.5);
  assert.equal(r.top_p, 0.9);
  assert.deepEqual(r.metadata, { run: 'e2e' });
  assert.equal(r.store, false, 'responses are not stored');
  assert.equal(r.tool_choice, 'auto');
  assert.deepEqual(r.tools, []);
  assert.deepEqual(r.text, { format: { type: 'text' } });
  assert.equal(r.parallel_tool_calls, true);
  assert.equal(r.model, main.ready.model_id);
});

test('instructions become a system message and are echoed; message items as input', async () => {
  const plain = await client(main).responses.create({ model: 'x', input: 'Hi', max_output_tokens: 2 });
  const ins = await client(main).responses.create({ model: 'x', input: 'Hi', instructions: 'Answer in French, briefly.', max_output_tokens: 2 });
  assert.ok(ins.usage.input_tokens > plain.usage.input_tokens + 4, `${ins.usage.input_tokens} vs ${plain.usage.input_tokens}`);
  assert.equal(ins.instructions, 'Answer in French, briefly.');
  assert.equal(plain.instructions, null);
  // a string input and the same text as a message item render the same prompt
  const items = await client(main).responses.create({ model: 'x', max_output_tokens: 2,
    input: [{ role: 'user', content: [{ type: 'input_text', text: 'Hi' }] }] });
  assert.equal(items.usage.input_tokens, plain.usage.input_tokens);
  // a developer message is a system message
  const dev = await client(main).responses.create({ model: 'x', max_output_tokens: 2,
    input: [{ role: 'developer', content: 'Answer in French, briefly.' }, { role: 'user', content: 'Hi' }] });
  assert.equal(dev.usage.input_tokens, ins.usage.input_tokens);
  // an earlier assistant turn as an output_text message
  const turn2 = await client(main).responses.create({ model: 'x', max_output_tokens: 2, input: [
    { role: 'user', content: 'Hi' },
    { type: 'message', role: 'assistant', content: [{ type: 'output_text', text: plain.output_text, annotations: [] }] },
    { role: 'user', content: 'And then?' }] });
  assert.ok(turn2.usage.input_tokens > plain.usage.input_tokens);
});

test('stream: true: ordered events with increasing sequence numbers; deltas add up to the text of response.create', async () => {
  const req = { model: 'x', input: 'Stream this', max_output_tokens: 16, temperature: 0.9, seed: 11 };
  const whole = await client(main).responses.create(req);
  const stream = await client(main).responses.create({ ...req, stream: true });
  const events = [];
  for await (const ev of stream) events.push(ev);
  events.forEach((ev, i) => assert.equal(ev.sequence_number, i, ev.type));
  assert.deepEqual(events.slice(0, 4).map((e) => e.type),
    ['response.created', 'response.in_progress', 'response.output_item.added', 'response.content_part.added']);
  assert.equal(events[0].response.status, 'in_progress');
  assert.deepEqual(events[0].response.output, []);
  const deltas = events.filter((e) => e.type === 'response.output_text.delta');
  assert.ok(deltas.length > 0);
  const text = deltas.map((e) => e.delta).join('');
  assert.equal(text, whole.output_text);
  const done = events.find((e) => e.type === 'response.output_text.done');
  assert.equal(done.text, text);
  const item = events.find((e) => e.type === 'response.output_item.done');
  assert.equal(item.item.content[0].text, text);
  assert.equal(item.item.id, events[2].item.id);
  for (const d of deltas) {
    assert.equal(d.item_id, item.item.id);
    assert.equal(d.output_index, 0);
    assert.equal(d.content_index, 0);
  }
  const last = events.at(-1);
  assert.equal(last.type, 'response.incomplete');
  assert.equal(last.response.status, 'incomplete');
  assert.equal(last.response.usage.output_tokens, 16);
  assert.equal(last.response.output[0].content[0].text, text);
  assert.equal(last.response.id, events[0].response.id);
});

test('responses.stream() helper: finalResponse() matches the streamed deltas and the non-streamed response', async () => {
  const req = { model: 'x', input: 'Helper stream', max_output_tokens: 12, temperature: 0.8, seed: 4 };
  const whole = await client(main).responses.create(req);
  const s = client(main).responses.stream(req);
  let text = '', snapshot = '';
  s.on('response.output_text.delta', (ev) => { text += ev.delta; snapshot = ev.snapshot; });
  const final = await s.finalResponse();
  assert.equal(text, whole.output_text);
  assert.equal(snapshot, text);
  assert.equal(final.output_text, whole.output_text);
  assert.equal(final.status, 'incomplete');
  assert.deepEqual(final.usage.output_tokens, whole.usage.output_tokens);
  assert.equal(final.output.length, 1);
});

test('the same seed gives the same response; another seed another', async () => {
  const req = { model: 'x', input: 'Seeds', max_output_tokens: 16, temperature: 1.0, seed: 5 };
  const a = await client(main).responses.create(req);
  const b = await client(main).responses.create(req);
  const c = await client(main).responses.create({ ...req, seed: 6 });
  assert.equal(a.output_text, b.output_text);
  assert.notEqual(a.output_text, c.output_text);
  assert.notEqual(a.id, b.id);
});

// The random model writes arbitrary JSON arguments that may not close within
// the token limit (then the response is incomplete): seeds are tried until
// one closes them; which do depends on the kernel set's arithmetic.
async function completedCall(c, req) {
  for (let seed = 1; seed <= 60; seed++) {
    const r = await c.responses.create({ ...req, seed });
    const calls = r.output.filter((o) => o.type === 'function_call');
    assert.equal(calls.length, 1, JSON.stringify(r.output).slice(0, 400));
    assert.equal(calls[0].name, 'get_weather');
    assert.equal(calls[0].arguments[0], '{');
    if (r.status === 'completed') return { r, seed };
    assert.equal(r.status, 'incomplete');
    assert.equal(calls[0].status, 'incomplete');
  }
  assert.fail('no seed of 60 closed the arguments');
}

test('a function tool with tool_choice "required" gives a function_call item with JSON arguments; then a second turn', async () => {
  const req = { model: 'x', input: 'Weather in Paris?', tools, tool_choice: 'required', max_output_tokens: 150, temperature: 1 };
  const { r, seed } = await completedCall(client(main), req);
  const call = r.output.find((o) => o.type === 'function_call');
  assert.match(call.id, /^fc_/);
  assert.match(call.call_id, /^call_/);
  assert.equal(call.status, 'completed');
  assert.equal(typeof JSON.parse(call.arguments), 'object');
  assert.equal(r.tool_choice, 'required');
  assert.equal(r.tools[0].name, 'get_weather');

  // streamed, the same call: argument deltas add up, the helper accepts the events
  const s = client(main).responses.stream({ ...req, seed });
  let args = '';
  s.on('response.function_call_arguments.delta', (ev) => { args += ev.delta; });
  const final = await s.finalResponse();
  const fcall = final.output.find((o) => o.type === 'function_call');
  assert.equal(final.status, 'completed');
  assert.equal(args, call.arguments);
  assert.equal(fcall.arguments, call.arguments);
  assert.equal(fcall.name, 'get_weather');

  // the second turn: the call and its output as input items
  const turn2 = await client(main).responses.create({ model: 'x', tools, max_output_tokens: 8, input: [
    { role: 'user', content: 'Weather in Paris?' },
    { type: 'function_call', call_id: call.call_id, name: call.name, arguments: call.arguments },
    { type: 'function_call_output', call_id: call.call_id, output: '{"temp": 21, "sky": "clear"}' },
  ] });
  assert.ok(['completed', 'incomplete'].includes(turn2.status));
  assert.ok(turn2.usage.input_tokens > r.usage.input_tokens, 'the call and its result are in the prompt');
  // tool_choice naming the function; "none" leaves the tools out of the prompt
  const named = await client(main).responses.create({ ...req, seed, tool_choice: { type: 'function', name: 'get_weather' } });
  assert.equal(named.output.find((o) => o.type === 'function_call').arguments, call.arguments);
  const none = await client(main).responses.create({ ...req, tool_choice: 'none', max_output_tokens: 2 });
  assert.equal(none.output.filter((o) => o.type === 'function_call').length, 0);
  assert.ok(none.usage.input_tokens < r.usage.input_tokens);
});

test('max_output_tokens: status incomplete, in the body and as the response.incomplete event', async () => {
  const r = await client(main).responses.create({ model: 'x', input: 'Tell me everything', max_output_tokens: 3 });
  assert.equal(r.status, 'incomplete');
  assert.equal(r.incomplete_details.reason, 'max_output_tokens');
  assert.equal(r.usage.output_tokens, 3);
  const res = await postJson(`${main.url}/v1/responses`, { input: 'Tell me everything', max_output_tokens: 3, stream: true });
  assert.equal(res.status, 200);
  assert.match(res.headers.get('content-type'), /text\/event-stream/);
  const events = parseSse(res.text);
  for (const e of events) assert.equal(e.event, e.data.type, 'each event line names its type');
  assert.equal(events.at(-1).event, 'response.incomplete');
  assert.ok(!res.text.includes('[DONE]'));
});

test('text.format: json_object constrains the text; json_schema holds it to the schema', async () => {
  const obj = await client(main).responses.create({ model: 'x', input: 'JSON please', max_output_tokens: 40, seed: 1,
    text: { format: { type: 'json_object' } } });
  assert.equal(obj.output_text.trimStart()[0], '{');
  assert.deepEqual(obj.text, { format: { type: 'json_object' } });
  const schema = { type: 'object', properties: { ok: { type: 'boolean' } }, required: ['ok'], additionalProperties: false };
  const format = { type: 'json_schema', name: 'answer', schema, strict: true };
  // held to the schema: even the random model's reply parses against it
  const r = await client(main).responses.create({ model: 'x', input: 'JSON please', max_output_tokens: 300, seed: 1,
    text: { format } });
  assert.deepEqual(r.text.format, format);
  assert.equal(r.status, 'completed');
  assert.deepEqual(Object.keys(JSON.parse(r.output_text)), ['ok']);
  assert.equal(typeof JSON.parse(r.output_text).ok, 'boolean');
});

test('reasoning: a template that opens <think> gives a reasoning item, streamed as reasoning_text events', async () => {
  const req = { model: 'x', input: 'Think about it', max_output_tokens: 12, temperature: 0.7, seed: 2 };
  const r = await client(think).responses.create(req);
  const rs = r.output[0];
  assert.equal(rs.type, 'reasoning');
  assert.match(rs.id, /^rs_/);
  assert.deepEqual(rs.summary, []);
  assert.equal(rs.content[0].type, 'reasoning_text');
  assert.ok(rs.content[0].text.length > 0);
  const rt = r.usage.output_tokens_details.reasoning_tokens;
  assert.ok(rt > 0 && rt <= r.usage.output_tokens, `reasoning_tokens ${rt} of ${r.usage.output_tokens}`);
  const s = client(think).responses.stream(req);
  let text = '';
  s.on('response.reasoning_text.delta', (ev) => { text += ev.delta; });
  const final = await s.finalResponse();
  assert.equal(text, rs.content[0].text);
  assert.equal(final.output[0].content[0].text, rs.content[0].text);
  // effort "none" switches the template's thinking off: a message, no reasoning
  const off = await client(think).responses.create({ ...req, reasoning: { effort: 'none' } });
  assert.equal(off.output[0].type, 'message');
  assert.equal(off.usage.output_tokens_details.reasoning_tokens, 0);
  assert.deepEqual(off.reasoning, { effort: 'none' });
});

test('the prompt cache: a repeated input reports cached tokens', async () => {
  const req = { model: 'x', input: 'A long shared beginning about lighthouses, tides and their keepers.', max_output_tokens: 2 };
  await client(main).responses.create(req);
  const again = await client(main).responses.create(req);
  assert.ok(again.usage.input_tokens_details.cached_tokens > 5, JSON.stringify(again.usage));
});

test('bad requests: 400 in OpenAI\'s error shape naming the field; the server keeps serving', async () => {
  const cases = [
    [{ input: 'x', previous_response_id: 'resp_123' }, 'previous_response_id', /not stored/],
    [{ input: 'x', tools: [{ type: 'web_search' }] }, 'tools', /web_search.*only function tools/],
    [{}, 'input', /'input' must be/],
    [{ input: [] }, 'input', /'input' must be/],
    [{ input: [{ role: 'user', content: [{ type: 'input_image', image_url: 'http://x/y.png' }] }] }, 'input', /input_image/],
    [{ input: [{ type: 'item_reference', id: 'x' }] }, 'input', /item_reference/],
    [{ input: 'x', text: { format: { type: 'yaml' } } }, 'text.format', /json_schema/],
    [{ input: 'x', max_output_tokens: 0 }, 'max_output_tokens', /at least 1/],
    [{ input: 'x', tool_choice: { type: 'allowed_tools' } }, 'tool_choice', /tool_choice/],
    [{ input: 'x', tool_choice: 'required' }, 'tool_choice', /no 'tools'/],
    [{ input: 'x', temperature: 'hot' }, 'temperature', /number/],
    [{ input: 'x', reasoning: 'high' }, 'reasoning', /object/],
  ];
  for (const [body, param, message] of cases) {
    const r = await postJson(`${main.url}/v1/responses`, body);
    assert.equal(r.status, 400, JSON.stringify(body));
    assert.equal(r.json.error.type, 'invalid_request_error');
    assert.equal(r.json.error.param, param, JSON.stringify(body));
    assert.match(r.json.error.message, message);
    assert.ok('code' in r.json.error);
  }
  await assert.rejects(client(main).responses.create({ model: 'x', input: 'x', previous_response_id: 'resp_1' }),
    (e) => e.status === 400 && e.param === 'previous_response_id');
  assert.equal((await postJson(`${main.url}/v1/responses`, '{not json')).status, 400);
  assert.equal((await fetch(`${main.url}/v1/responses`)).status, 405);
  const ok = await client(main).responses.create({ model: 'x', input: 'still here', max_output_tokens: 2 });
  assert.equal(ok.usage.output_tokens, 2);
});
