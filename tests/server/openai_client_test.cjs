// Drives a running `regolith serve` with the official `openai` npm client (v4): models, chat and
// completions streamed and not, n > 1, logprobs, stop strings, usage accounting, a tool call
// round trip, reasoning_content, structured outputs, and the client's typed errors. Usage: node openai_client_test.cjs
// BASE_URL API_KEY MODEL_ID. Exits non-zero on the first failed check.
'use strict';
const assert = require('node:assert/strict');
const OpenAI = require('openai');

const [baseURL, apiKey, modelId] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 60000 });
const noThink = { chat_template_kwargs: { enable_thinking: false } };
const user = (content) => [{ role: 'user', content }];
let checks = 0;

async function check(name, fn) {
  await fn();
  checks++;
  console.log(`ok ${checks} - ${name}`);
}

async function collect(stream) {
  const chunks = [];
  for await (const chunk of stream) chunks.push(chunk);
  return chunks;
}

function checkUsage(usage, completionTokens) {
  assert.ok(usage.prompt_tokens > 0);
  assert.equal(usage.completion_tokens, completionTokens);
  assert.equal(usage.total_tokens, usage.prompt_tokens + usage.completion_tokens);
  assert.equal(typeof usage.prompt_tokens_details.cached_tokens, 'number');
}

async function main() {
  await check('models.list names the served model', async () => {
    const models = await client.models.list();
    assert.deepEqual(models.data.map((m) => m.id), [modelId]);
    const one = await client.models.retrieve(modelId);
    assert.equal(one.id, modelId);
  });

  let greedy;
  await check('chat completion, not streamed, with usage', async () => {
    const r = await client.chat.completions.create({
      model: modelId, messages: user('Say something.'), max_tokens: 8, temperature: 0, ...noThink,
    });
    assert.equal(r.object, 'chat.completion');
    assert.equal(r.choices.length, 1);
    assert.equal(r.choices[0].message.role, 'assistant');
    assert.equal(typeof r.choices[0].message.content, 'string');
    assert.equal(r.choices[0].finish_reason, 'length');
    checkUsage(r.usage, 8);
    greedy = r.choices[0].message.content;
  });

  await check('chat completion streamed equals the non-streamed one; usage in the last chunk', async () => {
    const chunks = await collect(await client.chat.completions.create({
      model: modelId, messages: user('Say something.'), max_tokens: 8, temperature: 0, stream: true,
      stream_options: { include_usage: true }, ...noThink,
    }));
    assert.equal(chunks[0].choices[0].delta.role, 'assistant');
    const text = chunks.map((c) => (c.choices[0] && c.choices[0].delta.content) || '').join('');
    assert.equal(text, greedy);
    const last = chunks[chunks.length - 1];
    assert.deepEqual(last.choices, []);
    checkUsage(last.usage, 8);
    assert.equal(last.usage.prompt_tokens_details.cached_tokens, last.usage.prompt_tokens, 'the same prompt again is cached whole');
    const finish = chunks.filter((c) => c.choices[0] && c.choices[0].finish_reason);
    assert.equal(finish.length, 1);
    assert.equal(finish[0].choices[0].finish_reason, 'length');
  });

  await check('thinking: the reply goes to reasoning_content', async () => {
    const r = await client.chat.completions.create({
      model: modelId, messages: user('Think first.'), max_tokens: 6, temperature: 0,
    });
    assert.equal(typeof r.choices[0].message.reasoning_content, 'string');
    assert.ok(r.choices[0].message.reasoning_content.length > 0);
  });

  await check('n > 1 with a seed: distinct indices, usage over all choices', async () => {
    const r = await client.chat.completions.create({
      model: modelId, messages: user('Pick a word.'), max_tokens: 5, n: 3, temperature: 1.0, seed: 7, ...noThink,
    });
    assert.deepEqual(r.choices.map((c) => c.index), [0, 1, 2]);
    checkUsage(r.usage, 15);
    const again = await client.chat.completions.create({
      model: modelId, messages: user('Pick a word.'), max_tokens: 5, n: 3, temperature: 1.0, seed: 7, ...noThink,
    });
    assert.deepEqual(again.choices.map((c) => c.message.content), r.choices.map((c) => c.message.content), 'seeded runs repeat');
  });

  await check('logprobs and top_logprobs', async () => {
    const r = await client.chat.completions.create({
      model: modelId, messages: user('Say something.'), max_tokens: 4, temperature: 0, logprobs: true, top_logprobs: 3, ...noThink,
    });
    const lp = r.choices[0].logprobs.content;
    assert.equal(lp.length, 4);
    for (const t of lp) {
      assert.ok(t.logprob <= 0);
      assert.equal(t.top_logprobs.length, 3);
      assert.ok(t.top_logprobs[0].logprob >= t.top_logprobs[2].logprob);
      assert.ok(Array.isArray(t.bytes));
    }
  });

  await check('stop strings cut the reply', async () => {
    const long = await client.chat.completions.create({
      model: modelId, messages: user('Say something.'), max_tokens: 24, temperature: 0, ...noThink,
    });
    const full = long.choices[0].message.content;
    const stop = full.slice(6, 8);
    const r = await client.chat.completions.create({
      model: modelId, messages: user('Say something.'), max_tokens: 24, temperature: 0, stop: [stop], ...noThink,
    });
    assert.equal(r.choices[0].message.content, full.slice(0, full.indexOf(stop)));
    assert.equal(r.choices[0].finish_reason, 'stop');
  });

  await check('completions: text prompt, n = 2, streamed and not', async () => {
    const r = await client.completions.create({ model: modelId, prompt: 'Once upon a time', max_tokens: 6, n: 2, temperature: 0 });
    assert.equal(r.object, 'text_completion');
    assert.equal(r.choices.length, 2);
    assert.equal(r.choices[0].text, r.choices[1].text);
    checkUsage(r.usage, 12);
    const chunks = await collect(await client.completions.create({
      model: modelId, prompt: 'Once upon a time', max_tokens: 6, temperature: 0, stream: true,
    }));
    assert.equal(chunks.map((c) => c.choices[0].text).join(''), r.choices[0].text);
  });

  await check('completions: token-id prompt with logprobs', async () => {
    const r = await client.completions.create({ model: modelId, prompt: [72, 101, 108], max_tokens: 3, temperature: 0, logprobs: 2 });
    assert.equal(r.choices[0].logprobs.tokens.length, 3);
    assert.equal(Object.keys(r.choices[0].logprobs.top_logprobs[0]).length <= 2, true);
    checkUsage(r.usage, 3);
  });

  const tools = [{
    type: 'function',
    function: {
      name: 'get_weather', description: 'Weather of a city',
      parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
    },
  }];
  await check('structured output: a json_schema reply parses and follows the schema', async () => {
    const schema = {
      type: 'object', properties: { color: { enum: ['red', 'green'] }, n: { type: 'integer', enum: [1, 2, 3] } },
      required: ['color', 'n'], additionalProperties: false,
    };  // every reply it allows is under 400 bytes (whitespace is bounded), so each one ends
    for (const temperature of [0, 1]) {
      const r = await client.chat.completions.create({
        model: modelId, messages: user('Pick a color.'), max_tokens: 400, temperature, seed: 3,
        response_format: { type: 'json_schema', json_schema: { name: 'pick', schema, strict: true } },
      });
      const c = r.choices[0];
      assert.equal(c.finish_reason, 'stop', c.message.content);
      const value = JSON.parse(c.message.content);
      assert.ok(['red', 'green'].includes(value.color), c.message.content);
      assert.ok(Number.isInteger(value.n), c.message.content);
      assert.deepEqual(Object.keys(value), ['color', 'n']);
      assert.ok(!c.message.reasoning_content, 'JSON mode closes the reasoning block');
    }
  });

  await check('tool call round trip', async () => {
    const messages = user('What is the weather in Paris?');
    const r = await client.chat.completions.create({
      model: modelId, messages, tools, tool_choice: { type: 'function', function: { name: 'get_weather' } },
      max_tokens: 48, temperature: 0, ...noThink,
    });
    const msg = r.choices[0].message;
    assert.equal(msg.tool_calls.length, 1);
    const call = msg.tool_calls[0];
    assert.equal(call.type, 'function');
    assert.equal(call.function.name, 'get_weather');
    assert.ok(call.id.startsWith('call_'));
    assert.equal(typeof JSON.parse(call.function.arguments), 'object');

    // The same call, streamed: the client sees one tool_calls delta with the whole call.
    const chunks = await collect(await client.chat.completions.create({
      model: modelId, messages, tools, tool_choice: { type: 'function', function: { name: 'get_weather' } },
      max_tokens: 48, temperature: 0, stream: true, ...noThink,
    }));
    const deltas = chunks.flatMap((c) => (c.choices[0] && c.choices[0].delta.tool_calls) || []);
    assert.equal(deltas.length, 1);
    assert.equal(deltas[0].function.name, 'get_weather');

    // Answer the call and continue the conversation.
    const followUp = await client.chat.completions.create({
      model: modelId, tools, max_tokens: 6, temperature: 0, ...noThink,
      messages: [...messages, msg, { role: 'tool', tool_call_id: call.id, content: '{"temperature_c": 21}' }],
    });
    assert.equal(typeof followUp.choices[0].message.content, 'string');
    assert.ok(followUp.usage.prompt_tokens > r.usage.prompt_tokens);
    assert.ok(followUp.usage.prompt_tokens_details.cached_tokens >= r.usage.prompt_tokens - 1,
      `the first turn is reused (cached ${followUp.usage.prompt_tokens_details.cached_tokens}, first prompt ${r.usage.prompt_tokens})`);
  });

  await check('errors arrive as the client\'s typed errors', async () => {
    await assert.rejects(client.chat.completions.create({ model: 'no-such-model', messages: user('x') }),
      (e) => e instanceof OpenAI.NotFoundError && e.status === 404);
    await assert.rejects(client.chat.completions.create({ model: modelId, messages: user('x'), max_tokens: -1 }),
      (e) => e instanceof OpenAI.BadRequestError && e.status === 400 && e.param === 'max_tokens');
    await assert.rejects(client.chat.completions.create({ model: modelId, messages: [] }),
      (e) => e instanceof OpenAI.BadRequestError);
    const wrongKey = new OpenAI({ baseURL, apiKey: 'wrong', maxRetries: 0 });
    await assert.rejects(wrongKey.models.list(), (e) => e instanceof OpenAI.AuthenticationError && e.status === 401);
  });

  console.log(`all ${checks} checks passed`);
}

main().catch((e) => {
  console.error('FAILED:', e);
  process.exit(1);
});
