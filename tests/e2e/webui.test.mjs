// The built-in chat page (GET /) in headless Chromium, driven by
// playwright-core, against a server on the e2e model (a tiny random
// qwen3_moe: its text is gibberish, so these tests check streaming, Stop,
// the prompt cache, escaping and where the page sends requests, not
// meaning). The tests that need a browser skip where /usr/bin/chromium is
// absent (Debian package `chromium`, installed by tools/install-deps.sh).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { chromium } from 'playwright-core';
import { Servers } from './helpers.mjs';

const CHROMIUM = '/usr/bin/chromium';
const skip = existsSync(CHROMIUM) ? false : `${CHROMIUM} is absent (apt-get install chromium): the page is not tested in a browser`;
if (skip) console.log(skip);
const KEY = 'webui-test-key';
// long enough that a reply is still streaming when Stop is clicked
const LONG = 8000;

const servers = new Servers();
let main, keyed, browser;

before(async () => {
  const dir = servers.model();
  main = await servers.start(dir, ['--ctx', String(LONG + 192), '--parallel', '2']);
  // experts stream through a small cache here, so the info has one to report
  keyed = await servers.start(dir, ['--ctx', '512', '--api-key', KEY, '--expert-cache', '60K']);
  if (!skip) browser = await chromium.launch({ executablePath: CHROMIUM, args: ['--no-sandbox'] });
});

after(async () => {
  if (browser) await browser.close();
  await servers.stop();
});

// A page in a fresh context (its own localStorage), with every request it
// makes and every script error recorded; resolves once the model is shown.
async function openPage(srv) {
  const context = await browser.newContext();
  const page = await context.newPage();
  const requests = [], errors = [];
  page.on('request', (r) => requests.push(r));
  page.on('pageerror', (e) => errors.push(e.message));
  await page.goto(`${srv.url}/`);
  return { context, page, requests, errors };
}

// Sets a field of the Settings panel, opening the panel first.
async function setting(page, id, value) {
  if (!(await page.evaluate(() => document.getElementById('settings-panel').open))) await page.click('#settings-panel summary');
  await page.fill(`#${id}`, value);
}

const modelShown = (page) => page.waitForFunction(() => document.getElementById('model').textContent !== '…');

// Types a message, sends it, and waits until the page is ready again;
// returns the reply's usage line's data and the reply as the page keeps it.
async function turn(page, text) {
  await page.fill('#input', text);
  await page.click('#send');
  await page.waitForFunction((n) => document.body.dataset.state === 'ready' &&
    document.querySelectorAll('.usage[data-done]').length === n,
  await page.evaluate(() => document.querySelectorAll('.msg.assistant').length));
  return page.evaluate(() => {
    const usage = [...document.querySelectorAll('.usage')].pop();
    return { ...usage.dataset, reply: window.sparrow.history().pop() };
  });
}

async function metric(srv, name) {
  const text = await (await fetch(`${srv.url}/metrics`)).text();
  const m = new RegExp(`^sparrow_${name} (\\S+)$`, 'm').exec(text);
  assert.ok(m, `metric ${name}`);
  return Number(m[1]);
}

test('GET / and /index.html answer the page without a key; other methods 405', async () => {
  for (const url of ['/', '/index.html']) {
    const r = await fetch(`${keyed.url}${url}`);
    assert.equal(r.status, 200);
    assert.equal(r.headers.get('content-type'), 'text/html; charset=utf-8');
    assert.match(r.headers.get('content-security-policy'), /connect-src 'self'/);
    const html = await r.text();
    assert.match(html, /^<!doctype html>/);
    assert.doesNotMatch(html, /(src|href)="(https?:)?\/\//, 'no external asset');
  }
  const post = await fetch(`${keyed.url}/`, { method: 'POST', body: '{}' });
  assert.equal(post.status, 405);
  assert.equal((await post.json()).error.type, 'invalid_request_error');
  assert.equal((await fetch(`${keyed.url}/nothing-here`)).status, 404);
});

test('/v1/sparrow/info: the model, device and memory plan; /v1/models unchanged; the key is checked', async () => {
  assert.equal((await fetch(`${keyed.url}/v1/sparrow/info`)).status, 401);
  const auth = { Authorization: `Bearer ${KEY}` };
  // the expert cache's counters come with the first forward step
  const one = await fetch(`${keyed.url}/v1/completions`, { method: 'POST', headers: auth, body: JSON.stringify({ prompt: 'Hi', max_tokens: 2 }) });
  assert.equal(one.status, 200);
  const info = await (await fetch(`${keyed.url}/v1/sparrow/info`, { headers: auth })).json();
  assert.equal(info.object, 'sparrow.info');
  assert.equal(info.model_id, keyed.ready.model_id);
  assert.equal(info.architecture, 'qwen3_moe');
  assert.equal(info.device, 'cpu');
  assert.equal(info.kernels, keyed.ready.kernels);
  assert.equal(info.context_length, 512);
  assert.deepEqual(info.plan, keyed.ready.plan);
  assert.equal(info.plan.strategy, 'expert-cache');
  assert.ok(info.plan.resident_weight_bytes > 0);
  assert.ok(info.memory.resident_bytes > 0);
  assert.equal(info.memory.kv_cache_bytes, keyed.ready.memory.kv_cache_bytes);
  assert.ok(info.expert_cache.budget_bytes > 0 && info.expert_cache.budget_bytes <= 60 * 1024, JSON.stringify(info.expert_cache));
  assert.ok(info.expert_cache.misses > 0);
  assert.ok(info.model_bytes.some((c) => c.class === 'routed_experts' && c.placement === 'expert_cache' && c.bytes > 0));
  const resident = await (await fetch(`${main.url}/v1/sparrow/info`)).json();
  assert.equal(resident.plan.strategy, 'resident');
  assert.equal(resident.expert_cache, null);
  const post = await fetch(`${main.url}/v1/sparrow/info`, { method: 'POST', body: '{}' });
  assert.equal(post.status, 405);
  const models = await (await fetch(`${main.url}/v1/models`)).json();
  assert.deepEqual(Object.keys(models.data[0]).sort(), ['architecture', 'context_length', 'created', 'id', 'object', 'owned_by']);
});

test('a reply streams in piece by piece, then is shown whole with its usage', { skip }, async () => {
  const { context, page, errors } = await openPage(main);
  await modelShown(page);
  assert.equal(await page.textContent('#model'), main.ready.model_id);
  assert.match(await page.textContent('#summary'), /cpu .* plan resident .* resident/);
  await setting(page, 'max-tokens', '1000');
  await setting(page, 'temperature', '0');
  // every text the reply shows, in order
  await page.evaluate(() => {
    window.seen = [];
    new MutationObserver(() => {
      const c = [...document.querySelectorAll('.msg.assistant .content')].pop();
      const t = c ? c.textContent : '';
      if (t && window.seen[window.seen.length - 1] !== t) window.seen.push(t);
    }).observe(document.getElementById('log'), { subtree: true, childList: true, characterData: true });
  });
  const u = await turn(page, 'Tell me about sparrows');
  assert.equal(u.done, 'length');
  assert.equal(u.completionTokens, '1000');
  assert.ok(Number(u.promptTokens) > 5);
  const seen = await page.evaluate(() => window.seen);
  const shown = await page.evaluate(() => [...document.querySelectorAll('.msg.assistant .content')].pop().textContent);
  assert.equal(seen[seen.length - 1], shown);
  const reads = await page.evaluate(() => window.sparrow.stats.reads);
  assert.ok(new Set(seen.slice(0, -1)).size >= 2, `partial states before the end: ${seen.length - 1} (${reads} reads)`);
  assert.ok(await page.evaluate(() => window.sparrow.stats.chunks) > 10);
  // the reply the page kept is the one the server gives for the same request
  const same = await (await fetch(`${main.url}/v1/chat/completions`, {
    method: 'POST',
    body: JSON.stringify({ messages: [{ role: 'user', content: 'Tell me about sparrows' }], max_tokens: 1000, temperature: 0 }),
  })).json();
  assert.equal(u.reply.role, 'assistant');
  assert.equal(u.reply.content, same.choices[0].message.content);
  assert.match(await page.textContent('.usage'), /prompt \d+ tokens \(\d+ cached\) · completion 1000 · [\d.]+ tok\/s/);
  assert.deepEqual(errors, []);
  await context.close();
});

test('Stop ends the stream early, keeps what arrived, and the server goes on serving', { skip }, async () => {
  const { context, page, errors } = await openPage(main);
  await modelShown(page);
  await setting(page, 'max-tokens', String(LONG));
  const before = await metric(main, 'generated_tokens_total');
  await page.fill('#input', 'Write a very long story');
  await page.click('#send');
  assert.equal(await page.evaluate(() => document.body.dataset.state), 'busy');
  assert.equal(await page.isDisabled('#send'), true);
  await page.waitForFunction(() => document.querySelector('.msg.assistant .content').textContent.length > 20);
  const t0 = Date.now();
  await page.click('#stop');
  await page.waitForFunction(() => document.body.dataset.state === 'ready', null, { timeout: 5000 });
  assert.ok(Date.now() - t0 < 3000);
  assert.equal(await page.getAttribute('.usage', 'data-done'), 'stopped');
  assert.equal(await page.isDisabled('#stop'), true);
  assert.equal(await page.isEnabled('#send'), true);
  const kept = await page.evaluate(() => window.sparrow.history());
  assert.equal(kept.length, 2);
  assert.ok(kept[1].content.length > 0);
  // the server noticed the client leave and stopped generating
  await new Promise((r) => setTimeout(r, 500));
  const made = (await metric(main, 'generated_tokens_total')) - before;
  assert.ok(made < LONG, `generated ${made} of ${LONG}`);
  assert.equal(await metric(main, 'slots_active'), 0);
  assert.equal((await fetch(`${main.url}/health`)).status, 200);
  // and the same page goes on: the stopped reply is part of the next turn
  await setting(page, 'max-tokens', '6');
  const u = await turn(page, 'Shorter, please');
  assert.equal(u.done, 'length');
  assert.equal(u.completionTokens, '6');
  assert.deepEqual(errors, []);
  await context.close();
});

test('the second turn sends the whole history and reuses the prompt cache', { skip }, async () => {
  const { context, page, requests, errors } = await openPage(main);
  await modelShown(page);
  await setting(page, 'max-tokens', '8');
  const first = await turn(page, 'What is a prompt cache?');
  assert.equal(first.done, 'length');
  const second = await turn(page, 'Go on');
  assert.equal(second.done, 'length');
  assert.ok(Number(second.cachedTokens) > 0, JSON.stringify(second));
  assert.ok(Number(second.cachedTokens) >= Number(first.promptTokens) - 1, JSON.stringify({ first, second }));
  assert.equal(await page.locator('.usage').nth(1).textContent().then((t) => t.includes(`(${second.cachedTokens} cached)`)), true);
  const bodies = requests.filter((r) => r.url().endsWith('/v1/chat/completions')).map((r) => r.postDataJSON());
  assert.equal(bodies.length, 2);
  assert.deepEqual(bodies[1].messages.map((m) => m.role), ['user', 'assistant', 'user']);
  assert.equal(bodies[1].messages[1].content, first.reply.content);
  assert.equal(bodies[1].stream, true);
  assert.deepEqual(bodies[1].stream_options, { include_usage: true });
  // New chat starts over
  await page.click('#new-chat');
  assert.equal(await page.locator('.msg').count(), 0);
  assert.deepEqual(await page.evaluate(() => window.sparrow.history()), []);
  assert.deepEqual(errors, []);
  await context.close();
});

test('model-written HTML is shown as text, never run; the markdown subset renders', { skip }, async () => {
  const { context, page, errors } = await openPage(main);
  await modelShown(page);
  const hostile = [
    '<img src=x onerror="window.pwned=1">',
    '<script>window.pwned=2</script>',
    '## <svg onload="window.pwned=3"></svg>',
    '- <iframe src="javascript:window.pwned=4"></iframe>',
    '`<img src=x onerror=window.pwned=5>`',
    '```html\n<img src=x onerror=window.pwned=6>\n```',
    '[click](javascript:window.pwned=7)',
    '[click](https://example.com/"onmouseover="window.pwned=8)',
    '**<b onclick="window.pwned=9">x</b>** *<i>y</i>* _<u>z</u>_',
    '<a href="https://example.com">a</a> &lt;img&gt; &amp;',
  ];
  const out = await page.evaluate(async (cases) => {
    const box = document.createElement('div');
    document.body.append(box);
    const res = [];
    for (const md of cases) {
      const div = document.createElement('div');
      div.innerHTML = window.sparrow.renderMarkdown(md);
      box.append(div);
      res.push({
        tags: [...div.querySelectorAll('*')].map((e) => e.tagName.toLowerCase()),
        attrs: [...div.querySelectorAll('*')].flatMap((e) => [...e.attributes].map((a) => `${a.name}=${a.value}`)),
        text: div.textContent,
      });
    }
    await new Promise((r) => setTimeout(r, 200));  // an onerror would have fired by now
    box.remove();
    return { res, pwned: window.pwned };
  }, hostile);
  assert.equal(out.pwned, undefined);
  const allowed = new Set(['p', 'br', 'h2', 'ul', 'li', 'code', 'pre', 'figure', 'figcaption', 'strong', 'em', 'a']);
  for (const [i, r] of out.res.entries()) {
    for (const t of r.tags) assert.ok(allowed.has(t), `case ${i}: <${t}> was created`);
    for (const a of r.attrs) assert.match(a, /^(href=https:\/\/|target=_blank$|rel=noopener noreferrer$|class=code$)/, `case ${i}: ${a}`);
  }
  assert.match(out.res[0].text, /<img src=x onerror="window.pwned=1">/);
  assert.match(out.res[1].text, /<script>window.pwned=2<\/script>/);
  assert.deepEqual(out.res[6].tags, ['p']);  // a javascript: link stays text
  assert.ok(out.res[7].attrs.every((a) => !a.startsWith('onmouseover')));
  assert.equal(out.res[9].text, '<a href="https://example.com">a</a> &lt;img&gt; &amp;');

  const good = await page.evaluate(() => {
    const div = document.createElement('div');
    div.innerHTML = window.sparrow.renderMarkdown(
      '# Title\n\nSome **bold**, *italic* and `code`; see [docs](https://example.com/a?b=1&c=2).\n\n' +
      '- one\n- two\n\n3. three\n4. four\n\n```python\nprint("<hi>")\n```\nsnake_case_name stays');
    const q = (s) => [...div.querySelectorAll(s)];
    return {
      h1: q('h1').map((e) => e.textContent), strong: q('strong').map((e) => e.textContent),
      em: q('em').map((e) => e.textContent), code: q('p code').map((e) => e.textContent),
      links: q('a').map((a) => [a.textContent, a.getAttribute('href'), a.rel]),
      ul: q('ul li').map((e) => e.textContent), ol: q('ol li').map((e) => e.textContent), start: q('ol')[0].start,
      lang: q('figcaption').map((e) => e.textContent), pre: q('pre').map((e) => e.textContent),
      last: q('p').pop().textContent,
    };
  });
  assert.deepEqual(good, {
    h1: ['Title'], strong: ['bold'], em: ['italic'], code: ['code'],
    links: [['docs', 'https://example.com/a?b=1&c=2', 'noopener noreferrer']],
    ul: ['one', 'two'], ol: ['three', 'four'], start: 3,
    lang: ['python'], pre: ['print("<hi>")'], last: 'snake_case_name stays',
  });
  assert.deepEqual(errors, []);
  await context.close();
});

test('a streamed reply with reasoning and hostile HTML: reasoning apart, HTML as text', { skip }, async () => {
  const { context, page, errors } = await openPage(main);
  await modelShown(page);
  const chunk = (delta, extra = {}) => `data: ${JSON.stringify({
    id: 'chatcmpl-x', object: 'chat.completion.chunk', created: 1, model: 'm',
    choices: [{ index: 0, delta, finish_reason: null }], ...extra })}\n\n`;
  const body = chunk({ role: 'assistant', reasoning_content: 'Thinking <img src=x onerror="window.pwned=1">' }) +
    chunk({ reasoning_content: ' about it.' }) +
    chunk({ content: 'Answer: <script>window.pwned=2</script>' }) +
    chunk({ content: ' <img src=x onerror="window.pwned=3"> **done**' }) +
    `data: ${JSON.stringify({ id: 'chatcmpl-x', object: 'chat.completion.chunk', created: 1, model: 'm',
      choices: [{ index: 0, delta: {}, finish_reason: 'stop' }] })}\n\n` +
    `data: ${JSON.stringify({ id: 'chatcmpl-x', object: 'chat.completion.chunk', created: 1, model: 'm',
      choices: [], usage: { prompt_tokens: 7, completion_tokens: 5, total_tokens: 12, prompt_tokens_details: { cached_tokens: 3 } } })}\n\n` +
    'data: [DONE]\n\n';
  await page.route('**/v1/chat/completions', (route) => route.fulfill({
    status: 200, headers: { 'Content-Type': 'text/event-stream' }, body }));
  const u = await turn(page, 'Think first');
  assert.equal(u.done, 'stop');
  assert.equal(u.cachedTokens, '3');
  assert.equal(u.completionTokens, '5');
  const view = await page.evaluate(async () => {
    await new Promise((r) => setTimeout(r, 200));
    const box = [...document.querySelectorAll('.msg.assistant')].pop();
    const think = box.querySelector('details.reasoning');
    return {
      pwned: window.pwned, thinkHidden: think.hidden, thinkOpen: think.open,
      thought: think.querySelector('.thought').textContent,
      content: box.querySelector('.content').textContent,
      tags: [...box.querySelectorAll('.content *, .thought *')].map((e) => e.tagName.toLowerCase()),
    };
  });
  assert.equal(view.pwned, undefined);
  assert.equal(view.thinkHidden, false);
  assert.equal(view.thinkOpen, false, 'folded once the answer started');
  assert.equal(view.thought, 'Thinking <img src=x onerror="window.pwned=1"> about it.');
  assert.equal(view.content, 'Answer: <script>window.pwned=2</script> <img src=x onerror="window.pwned=3"> done');
  assert.deepEqual(view.tags, ['p', 'strong']);
  // the reasoning is not sent back as part of the history
  assert.equal(u.reply.content, 'Answer: <script>window.pwned=2</script> <img src=x onerror="window.pwned=3"> **done**');
  assert.deepEqual(errors, []);
  await context.close();
});

test('the page asks nothing of any host but its server', { skip }, async () => {
  const { context, page, requests, errors } = await openPage(main);
  await modelShown(page);
  await setting(page, 'max-tokens', '4');
  await turn(page, 'Hello');
  await page.click('#info-panel summary');
  await page.waitForTimeout(200);
  const urls = requests.map((r) => r.url());
  assert.ok(urls.some((u) => u.endsWith('/v1/sparrow/info')));
  assert.ok(urls.some((u) => u.endsWith('/v1/chat/completions')));
  const elsewhere = urls.filter((u) => !u.startsWith(`${main.url}/`) && !u.startsWith('data:'));
  assert.deepEqual(elsewhere, []);
  assert.deepEqual(errors, []);
  await context.close();
});

test('with --api-key: the page loads without it, asks for it, keeps it and sends it', { skip }, async () => {
  const { context, page, requests, errors } = await openPage(keyed);
  await page.waitForFunction(() => /API key needed/.test(document.getElementById('summary').textContent));
  await setting(page, 'api-key', KEY);
  await page.press('#api-key', 'Tab');  // the change event stores it and loads the info
  await modelShown(page);
  assert.equal(await page.textContent('#model'), keyed.ready.model_id);
  assert.match(await page.textContent('#summary'), /plan expert-cache .* expert cache [\d.]+ KiB/);
  await setting(page, 'max-tokens', '4');
  const u = await turn(page, 'Hello with a key');
  assert.equal(u.done, 'length');
  const chat = requests.find((r) => r.url().endsWith('/v1/chat/completions'));
  assert.equal(await chat.headerValue('authorization'), `Bearer ${KEY}`);
  // kept in localStorage: a reload finds it
  await page.reload();
  await modelShown(page);
  assert.equal(await page.inputValue('#api-key'), KEY);
  assert.deepEqual(errors, []);
  await context.close();
});
