#!/usr/bin/python3
"""Writes the first stage of the house models' curriculum: chat conversations
whose answers can only come from the context, so that training forms the
retrieval circuits (copy, key lookup) before it sees the task mix.

    retrieval_drills.py CORPUS OUT N_CONVERSATIONS [SEED]

CORPUS is a text file to draw words from (those seen at least 5 times in it);
OUT the file written: chat text, or a kvl eval suite (prompts and expected
answers, scored by exact match) when its name ends in .jsonl. Each
conversation draws its words from a pool of 16, 64 or 512 corpus words, or
from all of them: a small pool makes copying pay off early
(scripts/copy_probe.sh, docs/training.md), a large one makes it general.
Three kinds, in equal shares:
  copy    "Repeat after me: X" -> "X"
  recall  "k1 is v1. k2 is v2. ... What is k3?" -> "v3"
  next    "Remember: w1 w2 ... wn. What comes after w3?" -> "w4"
Deterministic for a given CORPUS, N and SEED.
"""
import collections
import json
import random
import re
import sys


def conversation(rng, words):
    pool_size = rng.choice((16, 64, 512, len(words)))
    pool = words if pool_size >= len(words) else rng.sample(words, pool_size)
    kind = rng.randrange(3)
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
    return ("copy", "recall", "next")[kind], user, answer


def main():
    if len(sys.argv) not in (4, 5):
        sys.exit(__doc__)
    corpus, out, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    seed = int(sys.argv[4]) if len(sys.argv) == 5 else 1
    counts = collections.Counter(re.findall(r"[A-Za-z]{2,}", open(corpus, encoding="utf-8").read()))
    words = sorted(w for w, c in counts.items() if c >= 5)
    rng = random.Random(seed)
    with open(out, "w", encoding="utf-8") as f:
        for i in range(n):
            kind, user, answer = conversation(rng, words)
            if out.endswith(".jsonl"):  # a kvl eval suite
                f.write(json.dumps({"id": f"drill-{i}", "task": f"drill_{kind}", "difficulty": 1,
                                    "messages": [{"role": "user", "content": user}],
                                    "answer": answer, "scoring": "exact"}) + "\n")
            else:
                f.write(f"<|im_start|>user\n{user}<|im_end|>\n"
                        f"<|im_start|>assistant\n{answer}<|im_end|>\n\n")


if __name__ == "__main__":
    main()
