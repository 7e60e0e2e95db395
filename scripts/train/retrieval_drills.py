#!/usr/bin/python3
"""Writes the first stage of the house models' curriculum: chat conversations
whose answers can only come from the context, so that training forms the
retrieval circuits (copy, key lookup) before it sees the task mix.

    retrieval_drills.py CORPUS OUT N_CONVERSATIONS [SEED [KINDS]]

CORPUS is a text file to draw words from (those seen at least 5 times in it);
OUT the file written: chat text, or a kvl eval suite (prompts and expected
answers, scored by exact match) when its name ends in .jsonl. Each
conversation draws its words from a pool of 16, 64 or 512 corpus words, or
from all of them: a small pool makes copying pay off early
(experiments/copy_vs_vocabulary/copy_probe.sh, docs/training.md), a large one makes it general.
KINDS is a comma-separated list (default copy,recall,next), drawn in equal
shares:
  copy     "Repeat after me: X" -> "X"
  recall   "k1 is v1. k2 is v2. ... What is k3?" -> "v3"
  next     "Remember: w1 w2 ... wn. What comes after w3?" -> "w4"
  records  "key-a1b2: v1\nkey-c3d4: v2 ..." then "What is the value of key-c3d4?"
           -> "v2": lookup by a key of several tokens, in the record layout of
           the kv task (docs/data.md), sometimes asked in a second user turn
Deterministic for a given CORPUS, N, SEED and KINDS.
"""
import collections
import json
import random
import re
import sys


KINDS = ("copy", "recall", "next", "records")
KEY_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789"
RECORD_INTROS = ("Please study these records.", "Here are some records.",
                 "Below is a list of entries.", "Records:", "Keep these in mind.")
RECORD_QUESTIONS = ("What is the value of {}?", "Look up {} and tell me its value.",
                    "Which value does {} have?", "{}?")


def records(rng, pool):
    """Returns (messages, answer): key lines, then a question about one key."""
    prefix = rng.choice(("key", "key", "key", "id", "item", "code"))
    keys = set()
    n = rng.randint(2, 48)
    while len(keys) < n:
        keys.add(prefix + "-" + "".join(rng.choice(KEY_CHARS) for _ in range(4)))
    keys = sorted(keys)  # a set's order varies between runs (string hashing)
    rng.shuffle(keys)
    values = [rng.choice(pool) if rng.random() < 0.8 else str(rng.randint(0, 999)) for _ in keys]
    lines = "\n".join(f"{k}: {v}" for k, v in zip(keys, values))
    i = rng.randrange(len(keys))
    question = rng.choice(RECORD_QUESTIONS).format(keys[i])
    intro = rng.choice(RECORD_INTROS)
    if rng.random() < 0.5:
        return [("user", f"{intro}\n{lines}\n\n{question}")], values[i]
    return [("user", f"{intro}\n{lines}"), ("assistant", "I have read the records."),
            ("user", question)], values[i]


def conversation(rng, words, kinds):
    """Returns (kind, messages, answer); messages are (role, text) pairs."""
    pool_size = rng.choice((16, 64, 512, len(words)))
    pool = words if pool_size >= len(words) else rng.sample(words, pool_size)
    kind = KINDS.index(kinds[rng.randrange(len(kinds))])
    if kind == 3:
        messages, answer = records(rng, pool)
        return "records", messages, answer
    if kind == 0:
        x = " ".join(rng.choice(pool) for _ in range(rng.randint(3, 24)))
        user, answer = f"Repeat after me: {x}", x
    elif kind == 1:
        n = rng.randint(2, 12)
        keys = rng.sample(pool, min(n, len(pool)))
        values = [str(rng.randint(0, 999)) if rng.random() < 0.5 else rng.choice(pool)
                  for _ in keys]
        facts = " ".join(f"{k} is {v}." for k, v in zip(keys, values))
        i = rng.randrange(len(keys))
        user, answer = f"{facts} What is {keys[i]}?", values[i]
    else:
        seq = rng.sample(pool, min(rng.randint(3, 16), len(pool)))
        i = rng.randrange(len(seq) - 1)
        user, answer = f"Remember: {' '.join(seq)}. What comes after {seq[i]}?", seq[i + 1]
    return KINDS[kind], [("user", user)], answer


def main():
    if len(sys.argv) not in (4, 5, 6):
        sys.exit(__doc__)
    corpus, out, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    seed = int(sys.argv[4]) if len(sys.argv) >= 5 else 1
    kinds = sys.argv[5].split(",") if len(sys.argv) == 6 else ["copy", "recall", "next"]
    unknown = [k for k in kinds if k not in KINDS]
    if unknown or not kinds:
        sys.exit(f"unknown drill kind(s) {unknown}; known: {', '.join(KINDS)}")
    counts = collections.Counter(re.findall(r"[A-Za-z]{2,}", open(corpus, encoding="utf-8").read()))
    words = sorted(w for w, c in counts.items() if c >= 5)
    rng = random.Random(seed)
    with open(out, "w", encoding="utf-8") as f:
        for i in range(n):
            kind, messages, answer = conversation(rng, words, kinds)
            if out.endswith(".jsonl"):  # a kvl eval suite
                f.write(json.dumps({"id": f"drill-{i}", "task": f"drill_{kind}", "difficulty": 1,
                                    "messages": [{"role": r, "content": t} for r, t in messages],
                                    "answer": answer, "scoring": "exact"}) + "\n")
            else:
                f.write("".join(f"<|im_start|>{r}\n{t}<|im_end|>\n" for r, t in messages) +
                        f"<|im_start|>assistant\n{answer}<|im_end|>\n\n")


if __name__ == "__main__":
    main()
