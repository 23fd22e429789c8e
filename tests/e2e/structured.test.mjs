// Structured outputs and schema-held tool calls with the official clients:
// openai-node's chat.completions.parse + zodResponseFormat, LangChain's
// withStructuredOutput (JSON schema and function calling), and the AI SDK's
// generateText with tools and toolChoice "required" and generateObject.
// The model has random weights (tools/make-e2e-model.sh): only the
// constraint makes its replies parse, so every reply is checked against its
// schema. Strings are bounded (maxLength, enums) so that a random model
// closes them within max_tokens.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { zodResponseFormat } from 'openai/helpers/zod';
import { z } from 'zod';
import { ChatOpenAI } from '@langchain/openai';
import { createOpenAICompatible } from '@ai-sdk/openai-compatible';
import { generateText, generateObject, tool } from 'ai';
import { Servers } from './helpers.mjs';

const servers = new Servers();
let server;

before(async () => {
  server = await servers.start(servers.model(), ['--parallel', '2']);
});

after(() => servers.stop());

const openai = () => new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'none', maxRetries: 0 });
const chat = (content) => [{ role: 'user', content }];

const Person = z.object({
  name: z.string().max(8),
  age: z.number().int(),
  role: z.enum(['admin', 'user', 'guest']),
  tags: z.array(z.enum(['a', 'b', 'c'])).max(3),
  active: z.boolean(),
  nickname: z.string().max(6).nullable(),
});

const Weather = z.object({ city: z.string().max(10), unit: z.enum(['celsius', 'fahrenheit']), days: z.number().int().min(1) });

test('chat.completions.parse with zodResponseFormat returns an object of the schema', async () => {
  for (const seed of [1, 2, 3, 4]) {
    const r = await openai().chat.completions.parse({
      model: 'x', messages: chat('Describe a user.'), max_tokens: 300, seed,
      response_format: zodResponseFormat(Person, 'person'),
    });
    assert.equal(r.choices[0].finish_reason, 'stop');
    const parsed = r.choices[0].message.parsed;
    assert.ok(parsed, `parsed: ${r.choices[0].message.content}`);
    assert.deepEqual(Person.parse(parsed), parsed);
    // properties come in the schema's order
    assert.deepEqual(Object.keys(JSON.parse(r.choices[0].message.content)), Object.keys(Person.shape));
  }
});

test('json_schema: streamed equals non-streamed, and a bad schema is a 400 naming it', async () => {
  const response_format = zodResponseFormat(Weather, 'weather');
  const req = { model: 'x', messages: chat('Weather?'), max_tokens: 200, seed: 9, response_format };
  const r = await openai().chat.completions.create(req);
  const s = await openai().chat.completions.create({ ...req, stream: true });
  let text = '';
  for await (const chunk of s) text += chunk.choices[0]?.delta?.content ?? '';
  assert.equal(text, r.choices[0].message.content);
  Weather.parse(JSON.parse(text));
  await assert.rejects(openai().chat.completions.create({ ...req,
    response_format: { type: 'json_schema', json_schema: { name: 'w', schema: { $ref: '#/$defs/none' } } } }),
  (e) => e.status === 400 && e.param === 'response_format' && /\$ref/.test(e.message));
  await assert.rejects(openai().chat.completions.create({ ...req, response_format: { type: 'json_schema' } }),
    (e) => e.status === 400 && /json_schema/.test(e.message));
});

test('tool_choice required: a declared function, with arguments of its schema', async () => {
  const tools = [
    { type: 'function', function: { name: 'get_weather', description: 'Weather of a city',
      parameters: { type: 'object', properties: { city: { type: 'string', maxLength: 10 }, days: { type: 'integer', minimum: 1 } },
        required: ['city', 'days'], additionalProperties: false } } },
    { type: 'function', function: { name: 'get_time', description: 'Time in a zone',
      parameters: { type: 'object', properties: { zone: { type: 'string', enum: ['UTC', 'CET'] } }, required: ['zone'],
        additionalProperties: false } } },
  ];
  const names = new Set();
  for (const seed of [1, 2, 3, 4, 5, 6]) {
    for (const stream of [false, true]) {
      const req = { model: 'x', messages: chat('?'), tools, tool_choice: 'required', max_tokens: 120, seed };
      let call, finish, content = '';
      if (!stream) {
        const r = await openai().chat.completions.create(req);
        [call] = r.choices[0].message.tool_calls;
        finish = r.choices[0].finish_reason;
        content = r.choices[0].message.content ?? '';
      } else {
        const s = await openai().chat.completions.create({ ...req, stream: true });
        call = { function: { name: '', arguments: '' } };
        for await (const chunk of s) {
          const d = chunk.choices[0]?.delta;
          content += d?.content ?? '';
          for (const tc of d?.tool_calls ?? []) {
            call.function.name += tc.function?.name ?? '';
            call.function.arguments += tc.function?.arguments ?? '';
          }
          finish = chunk.choices[0]?.finish_reason ?? finish;
        }
      }
      assert.equal(finish, 'tool_calls');
      assert.equal(content, '');
      names.add(call.function.name);
      const args = JSON.parse(call.function.arguments);
      if (call.function.name === 'get_weather') {
        assert.deepEqual(Object.keys(args), ['city', 'days']);
        assert.ok(Number.isInteger(args.days) && args.days >= 0 && args.city.length <= 10);
      } else {
        assert.equal(call.function.name, 'get_time');
        assert.ok(['UTC', 'CET'].includes(args.zone));
      }
    }
  }
  assert.ok(names.size >= 1);
});

test('LangChain withStructuredOutput: JSON schema and function calling', async () => {
  const llm = new ChatOpenAI({ model: 'x', apiKey: 'none', maxTokens: 600, temperature: 1, maxRetries: 0, modelKwargs: { seed: 11 },
    configuration: { baseURL: `${server.url}/v1` } });
  for (const method of ['jsonSchema', 'functionCalling']) {
    const structured = llm.withStructuredOutput(Weather, { name: 'weather', method });
    const out = await structured.invoke('What is the weather in Oslo?');
    assert.deepEqual(Weather.parse(out), out, method);
  }
});

test('AI SDK: generateText with tools and toolChoice required, and generateObject', async () => {
  const provider = createOpenAICompatible({ name: 'sparrow', baseURL: `${server.url}/v1`, apiKey: 'none',
    supportsStructuredOutputs: true });
  const model = provider.chatModel('x');
  const r = await generateText({
    model, prompt: 'Weather in Rome for two days?', toolChoice: 'required', maxOutputTokens: 150, seed: 3,
    tools: { weather: tool({ description: 'Weather of a city', inputSchema: Weather }) },
  });
  assert.equal(r.toolCalls.length, 1);
  assert.equal(r.toolCalls[0].toolName, 'weather');
  Weather.parse(r.toolCalls[0].input);
  const o = await generateObject({ model, schema: Person, prompt: 'A user', maxOutputTokens: 300, seed: 5 });
  assert.deepEqual(Person.parse(o.object), o.object);
});
