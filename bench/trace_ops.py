#!/usr/bin/env python3
"""Per-operator self time of a LibTorch Chrome trace (RecordProfile output, as
bench/train_step_bench --trace and bench/model_bench --trace write them).

    /usr/bin/python3 bench/trace_ops.py TRACE.json [--top 15]

An event's self time is its duration minus that of the events nested in it on
the same thread; the table lists the operators with the largest total self
time and their share of all of it.
"""
import argparse
import collections
import json


def self_times(events):
    by_thread = collections.defaultdict(list)
    for e in events:
        if e.get("ph") == "X":
            by_thread[e["tid"]].append(e)
    total = collections.Counter()
    calls = collections.Counter()
    for thread_events in by_thread.values():
        # Parents start no later than their children and last at least as long.
        thread_events.sort(key=lambda e: (e["ts"], -e["dur"]))
        open_events = []
        children = collections.defaultdict(float)
        for e in thread_events:
            while open_events and open_events[-1]["ts"] + open_events[-1]["dur"] <= e["ts"]:
                open_events.pop()
            if open_events:
                children[id(open_events[-1])] += e["dur"]
            open_events.append(e)
        for e in thread_events:
            total[e["name"]] += e["dur"] - children[id(e)]
            calls[e["name"]] += 1
    return total, calls


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace")
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args()
    with open(args.trace, encoding="utf-8") as f:
        total, calls = self_times(json.load(f))
    all_us = sum(total.values())
    print(f"{args.trace}: {all_us / 1e3:.1f} ms of operator self time")
    print("| operator | calls | self ms | share |")
    print("|---|---|---|---|")
    for name, us in total.most_common(args.top):
        print(f"| {name} | {calls[name]} | {us / 1e3:.1f} | {100 * us / all_us:.1f}% |")


if __name__ == "__main__":
    main()
