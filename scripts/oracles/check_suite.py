#!/usr/bin/python3
"""Independent checker for a `kvl make-data` output directory.

Re-derives the answer of every exact-task item from the conversation text alone
(its own regular expressions and arithmetic, no code shared with the C++
generator) and compares it with the stored answer and scoring rule. Also checks
that the ChatML text files are the rendering of the JSONL files, that the suite
files agree with the conversations, and that no conversation or prose paragraph
appears in two splits.

usage: check_suite.py DATA_DIR [--splits train,valid,test] [--quiet]
exit status: 0 when everything agrees, 1 on any mismatch (listed on stderr).
"""
import argparse
import json
import os
import re
import sys

ORDINALS = ["first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth",
            "ninth", "tenth", "eleventh", "twelfth"]


class Mismatch(Exception):
    pass


def normalize(answer, scoring):
    """The documented normalisation: strip whitespace and one trailing period;
    lower-case for exact_ci; integer value for numeric."""
    a = answer.strip()
    if a.endswith("."):
        a = a[:-1].rstrip()
    if scoring == "exact_ci":
        return a.lower()
    if scoring == "numeric":
        if not re.fullmatch(r"-?\d+", a):
            raise Mismatch("numeric answer %r is not an integer" % answer)
        return int(a)
    return a


def user_texts(messages):
    return [m["content"] for m in messages if m["role"] == "user"]


# ------------------------------------------------------------------ facts
TIME = r"(\d{1,2}(?::\d\d)?[ap]m)"
DAY = r"(Monday|Tuesday|Wednesday|Thursday|Friday|Saturday|Sunday)"
FACT_PATTERNS = [
    ("pet", re.compile(r"\bMy (\w+)'s name is (\w+)\.")),
    ("pet", re.compile(r"\bI have an? (\w+) called (\w+)\.")),
    ("pet", re.compile(r"\bOur (\w+) is named (\w+)\.")),
    ("pet", re.compile(r"\bActually, my (\w+) is now called (\w+)\.")),
    ("event", re.compile(r"\b[Tt]he ([a-z ]+?) is on " + DAY + " at " + TIME + r"\.")),
    ("event", re.compile(r"\bI have the ([a-z ]+?) on " + DAY + " at " + TIME + r"\.")),
    ("event", re.compile(r"\bThe ([a-z ]+?) has been moved to " + DAY + " at " + TIME + r"\.")),
    ("relative", re.compile(r"\bMy (\w+),? ([A-Z]\w+),? lives in (\w+)\.")),
    ("relative", re.compile(r"\bMy (\w+) ([A-Z]\w+) just moved to (\w+)\.")),
    ("number", re.compile(r"\bMy (\w+) number is (\d+)\.")),
    ("number", re.compile(r"\bI got (\w+) number (\d+)\.")),
    ("number", re.compile(r"\bMy (\w+) number changed to (\d+)\.")),
    ("location", re.compile(r"\bI (?:left|put) my (\w+) in the (\w+)\.")),
    ("location", re.compile(r"\bI moved my (\w+) to the (\w+)\.")),
]


def facts_state(texts):
    """(kind, key) -> latest stated value tuple, applying statements in text order."""
    state = {}
    for text in texts:
        hits = []
        for kind, pat in FACT_PATTERNS:
            for m in pat.finditer(text):
                hits.append((m.start(), kind, m.groups()))
        hits.sort()
        for _, kind, g in hits:
            state[(kind, g[0])] = g[1:]
    return state


def check_facts(messages):
    *context, question = user_texts(messages)
    state = facts_state(context)

    def get(kind, key):
        if (kind, key) not in state:
            raise Mismatch("no %s fact about %r" % (kind, key))
        return state[(kind, key)]

    q = question
    m = (re.search(r"What is my (\w+)'s name\?", q) or re.search(r"What is the name of my (\w+)\?", q)
         or re.search(r"What did I say my (\w+) is called\?", q))
    if m:
        key = m.group(1)
        if ("pet", key) in state:
            return state[("pet", key)][0], "exact_ci"
        return get("relative", key)[0], "exact_ci"
    m = re.search(r"(?:What|On which) day is the ([a-z ]+)\?", q)
    if m:
        return get("event", m.group(1))[0], "exact_ci"
    m = re.search(r"(?:What|At what) time is the ([a-z ]+)\?", q)
    if m:
        return get("event", m.group(1))[1], "exact_ci"
    m = re.search(r"Where does my (\w+) live\?", q) or re.search(r"Which city does my (\w+) live in\?", q)
    if m:
        return get("relative", m.group(1))[1], "exact_ci"
    m = re.search(r"In which city does (\w+) live\?", q)
    if m:
        cities = [v[1] for (kind, _), v in state.items() if kind == "relative" and v[0] == m.group(1)]
        if len(cities) != 1:
            raise Mismatch("%d relatives named %s" % (len(cities), m.group(1)))
        return cities[0], "exact_ci"
    m = re.search(r"What is my (\w+) number\?", q) or re.search(r"Which (\w+) number did I get\?", q)
    if m:
        return get("number", m.group(1))[0], "numeric"
    m = re.search(r"Where did I leave my (\w+)\?", q) or re.search(r"Where is my (\w+)\?", q)
    if m:
        return get("location", m.group(1))[0], "exact_ci"
    raise Mismatch("unrecognised facts question %r" % q)


# ------------------------------------------------------------------ key-value
RECORD = re.compile(r"^key-([a-z0-9]+): (\S+)$", re.M)


def check_kv(messages):
    texts = user_texts(messages)
    records = {}
    for text in texts:
        for k, v in RECORD.findall(text):
            if k in records:
                raise Mismatch("key-%s appears twice" % k)
            records[k] = v
    question = texts[-1].split("\n")[-1]
    m = re.fullmatch(r"(?:What is the value of key-(\w+)\?|What value does key-(\w+) have\?|"
                     r"Look up key-(\w+) and tell me its value\.|Which value is stored under key-(\w+)\?)", question)
    if m:
        key = next(g for g in m.groups() if g)
        if key not in records:
            raise Mismatch("asked key-%s is not in the document" % key)
        return records[key], "exact"
    m = re.fullmatch(r"Which key (?:has|stores) the value (\S+)\?", question)
    if m:
        keys = [k for k, v in records.items() if v == m.group(1)]
        if len(keys) != 1:
            raise Mismatch("value %s held by %d keys" % (m.group(1), len(keys)))
        return "key-" + keys[0], "exact"
    raise Mismatch("unrecognised kv question %r" % question)


# ------------------------------------------------------------------ arithmetic
def eval_left_to_right(expr):
    tokens = re.findall(r"\d+|[+-]|plus|minus", expr)
    if re.sub(r"\d+|[+-]|plus|minus|\s", "", expr):
        raise Mismatch("stray text in expression %r" % expr)
    total = int(tokens[0])
    for op, n in zip(tokens[1::2], tokens[2::2]):
        total = total + int(n) if op in ("+", "plus") else total - int(n)
    return total


def check_arith(messages):
    *context, question = user_texts(messages)
    m = re.fullmatch(r"(?:Compute|Calculate) ([\d +-]+)\.", question) or re.fullmatch(
        r"What is (\d[\d a-z]*)\?", question)
    if m and not context:
        return str(eval_left_to_right(m.group(1))), "numeric"
    total = None
    item = None
    for text in context:
        m = re.fullmatch(r"(?:Start with|Let's begin with|Take the number) (\d+)\.", text)
        m2 = re.fullmatch(r"I have (\d+) (\w+)\.", text)
        if m or m2:
            if total is not None:
                raise Mismatch("two starting values")
            total = int((m or m2).group(1))
            item = m2.group(2) if m2 else None
            continue
        ops = [
            (r"(?:Now add|Add|Plus) (\d+)\.", lambda t, n: t + n),
            (r"(?:Now subtract|Subtract|Take away) (\d+)\.", lambda t, n: t - n),
            (r"(?:Multiply by|Now multiply it by) (\d+)\.", lambda t, n: t * n),
            (r"I (?:buy|find) (\d+) more\.", lambda t, n: t + n),
            (r"Someone gives me (\d+) more\.", lambda t, n: t + n),
            (r"I (?:give away|lose|sell) (\d+)\.", lambda t, n: t - n),
        ]
        for pat, fn in ops:
            m = re.fullmatch(pat, text)
            if m:
                if total is None:
                    raise Mismatch("operation before a starting value")
                total = fn(total, int(m.group(1)))
                break
        else:
            if text == "Double it.":
                total *= 2
            elif re.search(r"\d", text):
                raise Mismatch("unparsed user turn with a number: %r" % text)
    if total is None:
        raise Mismatch("no starting value")
    if item is not None:
        m = re.fullmatch(r"How many (\w+) (?:do I have now|are left)\?", question)
        if not m or m.group(1) != item:
            raise Mismatch("unrecognised count question %r" % question)
    elif question not in ("What is the total?", "What number do we have now?", "What is the result?",
                          "What is the running total?"):
        raise Mismatch("unrecognised total question %r" % question)
    return str(total), "numeric"


# ------------------------------------------------------------------ lists
LIST_SENTENCE = re.compile(r"(?:Here is a list|Remember this list|My list is): ([a-z0-9]+(?:, [a-z0-9]+)*)\.")


def check_lists(messages):
    texts = user_texts(messages)
    items = None
    for text in texts:
        m = LIST_SENTENCE.search(text)
        if m:
            if items is not None:
                raise Mismatch("two lists")
            items = m.group(1).split(", ")
            continue
        m = re.fullmatch(r"Add (\w+) to the end of the list\.", text)
        if m:
            items.append(m.group(1))
            continue
        m = re.fullmatch(r"Remove (\w+) from the list\.", text)
        if m:
            items.remove(m.group(1))
    if items is None:
        raise Mismatch("no list")
    q = texts[-1]
    numeric_items = all(re.fullmatch(r"\d+", x) for x in items)
    if re.search(r"Sort the list alphabetically\.$|Put the list in alphabetical order\.$", q):
        return ", ".join(sorted(items)), "exact"
    if re.search(r"Sort the list from smallest to largest\.$|Sort the numbers in ascending order\.$", q):
        if not numeric_items:
            raise Mismatch("numeric sort of words")
        return ", ".join(sorted(items, key=int)), "exact"
    if re.search(r"Reverse the list\.$|Give me the list in reverse order\.$", q):
        return ", ".join(reversed(items)), "exact"
    if re.search(r"How many items (?:are in the list|does the list have)\?$", q):
        return str(len(items)), "numeric"
    m = re.search(r"(?:What is the (\w+) item in the list|Which item is (\w+) in the list)\?$", q)
    if m:
        word = m.group(1) or m.group(2)
        if word == "last":
            return items[-1], "exact"
        k = ORDINALS.index(word)
        return items[k], "exact"
    m = re.search(r"How many times does (\w+) appear in the list\?$", q)
    if m:
        return str(items.count(m.group(1))), "numeric"
    m = re.search(r"What is the (largest|smallest) number in the list\?$", q)
    if m:
        values = [int(x) for x in items]
        return str(max(values) if m.group(1) == "largest" else min(values)), "numeric"
    raise Mismatch("unrecognised list question %r" % q)


# ------------------------------------------------------------------ strings
OPERAND = r'("[a-z0-9]+"|the \w+ code)'


def check_strings(messages):
    *context, q = user_texts(messages)
    codes = {}
    for text in context:
        for label, value in re.findall(r'The (\w+) code is "([a-z0-9]+)"\.', text):
            codes[label] = value

    def resolve(operand):
        if operand.startswith('"'):
            return operand[1:-1]
        label = operand.split()[1]
        if label not in codes:
            raise Mismatch("unknown code %r" % label)
        return codes[label]

    m = re.fullmatch(r"Reverse %s\.|Write %s backwards\." % (OPERAND, OPERAND), q)
    if m:
        return resolve(m.group(1) or m.group(2))[::-1], "exact"
    m = re.fullmatch(r"Convert %s to uppercase\.|Write %s in capital letters\." % (OPERAND, OPERAND), q)
    if m:
        return resolve(m.group(1) or m.group(2)).upper(), "exact"
    m = re.fullmatch(r"Repeat %s (\d+) times, with no spaces\.|Write %s (\d+) times in a row\." % (OPERAND, OPERAND), q)
    if m:
        operand, n = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4))
        return resolve(operand) * int(n), "exact"
    m = re.fullmatch(r'Replace every "(.)" with "(.)" in %s\.' % OPERAND, q)
    if m:
        return resolve(m.group(3)).replace(m.group(1), m.group(2)), "exact"
    m = re.fullmatch(r"How many characters are in %s\?" % OPERAND, q)
    if m:
        return str(len(resolve(m.group(1)))), "numeric"
    m = re.fullmatch(r"What is the (\w+) character of %s\?" % OPERAND, q)
    if m:
        return resolve(m.group(2))[ORDINALS.index(m.group(1))], "exact"
    raise Mismatch("unrecognised string question %r" % q)


CHECKERS = {"facts": check_facts, "kv": check_kv, "arith": check_arith, "lists": check_lists,
            "strings": check_strings}


def check_item(task, messages, answer, scoring):
    if not messages or messages[-1]["role"] != "user":
        raise Mismatch("the prompt does not end with a user turn")
    expected, expected_scoring = CHECKERS[task](messages)
    if scoring != expected_scoring:
        raise Mismatch("scoring %r, expected %r" % (scoring, expected_scoring))
    if normalize(answer, scoring) != normalize(expected, scoring):
        raise Mismatch("answer %r, re-derived %r" % (answer, expected))


def render(messages):
    return "".join("<|im_start|>%s\n%s<|im_end|>\n" % (m["role"], m["content"]) for m in messages)


def read_jsonl(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("data_dir")
    ap.add_argument("--splits", default="train,valid,test")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args()

    errors = []
    n_checked = 0
    conversations = {}
    splits = args.splits.split(",")
    for split in splits:
        convs = read_jsonl(os.path.join(args.data_dir, split + ".jsonl"))
        conversations[split] = {c["id"]: c for c in convs}
        with open(os.path.join(args.data_dir, split + ".txt"), encoding="utf-8") as f:
            text = f.read()
        if text != "".join(render(c["messages"]) + "\n" for c in convs):
            errors.append("%s.txt is not the ChatML rendering of %s.jsonl" % (split, split))
        for c in convs:
            if c["task"] not in CHECKERS:
                continue
            try:
                if c["messages"][-1]["role"] != "assistant":
                    raise Mismatch("conversation does not end with the answer")
                check_item(c["task"], c["messages"][:-1], c["messages"][-1]["content"], c.get("scoring"))
                n_checked += 1
            except (Mismatch, ValueError, IndexError, KeyError, AttributeError) as e:
                errors.append("%s %s (%s): %s" % (split, c["id"], c["task"], e))

    suite_dir = os.path.join(args.data_dir, "suites")
    n_suite = 0
    for name in sorted(os.listdir(suite_dir)):
        split, task = name[:-len(".jsonl")].split("_", 1)
        for item in read_jsonl(os.path.join(suite_dir, name)):
            try:
                if item["task"] != task:
                    raise Mismatch("task %r in file %s" % (item["task"], name))
                check_item(task, item["messages"], item["answer"], item["scoring"])
                conv = conversations.get(split, {}).get(item["id"])
                if split in conversations:
                    if conv is None or conv["messages"][:-1] != item["messages"] or \
                            conv["messages"][-1]["content"] != item["answer"]:
                        raise Mismatch("suite item differs from its conversation")
                n_suite += 1
            except (Mismatch, ValueError, IndexError, KeyError, AttributeError) as e:
                errors.append("suite %s %s: %s" % (name, item.get("id"), e))

    # No conversation, and no prose paragraph, in two splits.
    seen = {}
    for split in splits:
        for c in conversations[split].values():
            key = json.dumps(c["messages"], sort_keys=True)
            if key in seen and seen[key] != split:
                errors.append("conversation %s also in %s" % (c["id"], seen[key]))
            seen.setdefault(key, split)
    paragraphs = {}
    for split in splits:
        for c in conversations[split].values():
            if c["task"] != "prose":
                continue
            for m in c["messages"]:
                for chunk in m["content"].split("\n\n"):
                    if len(chunk) >= 100:
                        other = paragraphs.setdefault(chunk, split)
                        if other != split:
                            errors.append("prose paragraph of %s %s also in %s" % (split, c["id"], other))

    for e in errors[:50]:
        print("MISMATCH " + e, file=sys.stderr)
    if not args.quiet or errors:
        print("checked %d conversations and %d suite items: %d mismatches" % (n_checked, n_suite, len(errors)))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
