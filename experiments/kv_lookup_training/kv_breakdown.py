#!/usr/bin/python3
"""The kv suite's items answered, by kind and by level.

    kv_breakdown.py SUITE EVAL_JSON LABEL

SUITE is a kv suite (kvl make-data's suites/*_kv.jsonl), EVAL_JSON the --json
output of a `kvl eval` run that scored it (other suites may be in it too).
Kinds, from the expected answer: a reverse lookup answers a key ("key-..."),
a forward lookup a number or one of the value words. Prints one line:
    LABEL: kv items correct: forward, words C/N, ..., level 1 C/N, ...
"""
import collections
import json
import sys


def main():
    suite_path, eval_path, label = sys.argv[1:4]
    suite = [json.loads(line) for line in open(suite_path, encoding="utf-8")]
    items = [it for it in json.load(open(eval_path))["items"] if it["task"] == suite[0]["task"]]
    assert [s["id"] for s in suite] == [it["id"] for it in items], "eval items do not match the suite"
    counts = collections.defaultdict(lambda: [0, 0])
    for s, it in zip(suite, items):
        if s["answer"].startswith("key-"):
            kind = "reverse"
        else:
            kind = "forward, numbers" if s["answer"].isdigit() else "forward, words"
        for k in (kind, f"level {s['difficulty']}"):
            counts[k][0] += it["correct"]
            counts[k][1] += 1
    order = ["forward, words", "forward, numbers", "reverse", "level 1", "level 2", "level 3"]
    print(f"{label}: kv items correct: " +
          ", ".join(f"{k} {counts[k][0]}/{counts[k][1]}" for k in order if k in counts))


if __name__ == "__main__":
    main()
