// Drives kvl-server's OpenAI API with the real `openai` npm client
// (tests/server/openai_http_test.cc runs it and checks what it prints).
//
//   node openai_client.cjs NODE_MODULES BASE_URL API_KEY METRICS_URL
//
// Prints one JSON object: what each scenario saw.
'use strict';
const [modulesDir, baseURL, apiKey, metricsURL] = process.argv.slice(2);
const OpenAI = require(`${modulesDir}/openai`);

const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 60000 });

async function errorOf(promise) {
  try {
    await promise;
    return { thrown: false };
  } catch (e) {
    return {
      thrown: true,
      class: e.constructor.name,
      status: e.status,
      code: e.code ?? null,
      param: e.param ?? null,
      type: e.type ?? null,
      message: e.message,
    };
  }
}

async function complete(model, messages, extra = {}) {
  const r = await client.chat.completions.create({
    model, messages, temperature: 0, max_tokens: 48, ...extra,
  });
  return r;
}

async function repairBacklog() {
  const text = await (await fetch(metricsURL)).text();
  const m = text.match(/^kvlingo_repair_backlog_lines (\S+)$/m);
  return m ? Number(m[1]) : -1;
}

async function main() {
  const out = {};

  // GET /v1/models.
  const models = await client.models.list();
  out.models = models.data.map((m) => m.id);

  // A non-streamed completion.
  const basic = await complete('kvl-small', [{ role: 'user', content: 'Hello! How are you today?' }]);
  out.basic = {
    object: basic.object, model: basic.model, content: basic.choices[0].message.content,
    role: basic.choices[0].message.role, finish_reason: basic.choices[0].finish_reason,
    usage: basic.usage, kvlingo: basic.kvlingo,
  };

  // A streamed one, with the usage chunk.
  const stream = await client.chat.completions.create({
    model: 'kvl-small', temperature: 0, max_tokens: 48, stream: true,
    stream_options: { include_usage: true },
    messages: [{ role: 'user', content: 'Hello! How are you today?' }],
  });
  const chunks = [];
  for await (const chunk of stream) chunks.push(chunk);
  out.stream = {
    n_chunks: chunks.length,
    first_role: chunks[0].choices[0]?.delta?.role ?? null,
    content: chunks.map((c) => c.choices[0]?.delta?.content ?? '').join(''),
    finish_reason: chunks.map((c) => c.choices[0]?.finish_reason).filter((f) => f)[0] ?? null,
    usage: chunks[chunks.length - 1].usage ?? null,
    last_has_choices: chunks[chunks.length - 1].choices.length,
    model: chunks[0].model,
    kvlingo: chunks.map((c) => c.kvlingo).filter((k) => k)[0] ?? null,
  };

  // A stateless conversation that alternates two models: every request
  // carries the whole conversation.
  const facts = Array.from({ length: 10 }, (_, i) =>
    `Fact ${i}: the locker number ${i} holds the code ${1000 + 37 * i}.`).join(' ');
  const messages = [
    { role: 'system', content: 'You are a careful assistant.' },
    { role: 'user', content: `Remember these facts. ${facts}` },
  ];
  const order = ['kvl-small', 'kvl-large', 'kvl-small', 'kvl-large'];
  const questions = ['What does locker 3 hold?', 'And locker 7?', 'Which locker holds 1111?'];
  out.alternate = [];
  for (let t = 0; t < order.length; ++t) {
    const r = await complete(order[t], messages);
    const reply = r.choices[0].message.content;
    out.alternate.push({ model: r.model, finish_reason: r.choices[0].finish_reason,
                         usage: r.usage, kvlingo: r.kvlingo });
    messages.push({ role: 'assistant', content: reply });
    if (t < questions.length) messages.push({ role: 'user', content: questions[t] });
  }

  // After repair, the next turn (kvl-large again) against its twin: the same
  // request with the prefix cache off for it, so kvl-large prefills the whole
  // conversation itself.
  for (let i = 0; i < 600 && (await repairBacklog()) !== 0; ++i) {
    await new Promise((r) => setTimeout(r, 100));
  }
  out.repair_backlog = await repairBacklog();
  messages.push({ role: 'user', content: 'Thank you. Repeat the code of locker 3.' });
  const later = await complete('kvl-large', messages);
  const twin = await complete('kvl-large', messages, { kvlingo: { prefix_cache: false } });
  out.later = { content: later.choices[0].message.content, kvlingo: later.kvlingo };
  out.twin = { content: twin.choices[0].message.content, kvlingo: twin.kvlingo };

  // The router model: the configured policy picks.
  const routed = await complete('kvlingo', [{ role: 'user', content: 'Hi there.' }]);
  out.routed = { model: routed.model, kvlingo: routed.kvlingo };

  // Errors.
  out.errors = {
    temperature: await errorOf(complete('kvl-small', [{ role: 'user', content: 'x' }],
                                        { temperature: 3 })),
    model: await errorOf(complete('no-such-model', [{ role: 'user', content: 'x' }])),
    roles: await errorOf(complete('kvl-small', [{ role: 'assistant', content: 'x' }])),
    n: await errorOf(complete('kvl-small', [{ role: 'user', content: 'x' }], { n: 2 })),
    key: await errorOf(new OpenAI({ baseURL, apiKey: 'not-a-key', maxRetries: 0 })
      .chat.completions.create({ model: 'kvl-small', messages: [{ role: 'user', content: 'x' }] })),
  };
  process.stdout.write(JSON.stringify(out) + '\n');
}

main().catch((e) => {
  process.stderr.write(`${e.stack || e}\n`);
  process.exit(1);
});
