"""The demo's second part (scripts/run_demo.sh): a stateless client of the
OpenAI API (docs/openai-api.md) that sends the whole conversation with every
request and changes model at every request (kvl-small, kvl-large, kvl-small,
kvl-large unless given). Per request it prints the
model that answered, the cache path, the prompt tokens the answering model
found in its own cache, got translated or prefilled, and the server's TTFT.

Standard library only (urllib); usage: demo_openai.py HOST:PORT [MODEL,MODEL,...]
"""
import json
import sys
import urllib.request


def complete(base, model, messages):
    body = json.dumps({"model": model, "messages": messages, "temperature": 0,
                       "max_tokens": 48}).encode()
    req = urllib.request.Request(f"{base}/v1/chat/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        return json.load(resp)


def main():
    base = f"http://{sys.argv[1]}"
    models = (sys.argv[2] if len(sys.argv) > 2 else "kvl-small,kvl-large,kvl-small,kvl-large").split(",")
    facts = " ".join(f"Shelf {i} holds {3 + 2 * i} blue folders." for i in range(12))
    messages = [{"role": "system", "content": "You are a careful office assistant."},
                {"role": "user", "content": f"Please remember this inventory. {facts}"}]
    questions = ["How many blue folders are on shelf 5?", "And on shelf 9?",
                 "Which shelf holds 7 folders?"]
    print("\nThe OpenAI API: one stateless conversation, the whole of it in every request, "
          "alternating models")
    print(f"{'turn':>4}  {'model':<10} {'path':<11} {'own cache':>9} {'translated':>10} "
          f"{'prefilled':>9} {'TTFT ms':>8}  reply")
    for turn, model in enumerate(models):
        out = complete(base, model, messages)
        k = out["kvlingo"]
        reply = out["choices"][0]["message"]["content"]
        print(f"{turn + 1:>4}  {out['model']:<10} {k['path']:<11} {k['prompt_tokens_own_cache']:>9} "
              f"{k['prompt_tokens_translated']:>10} {k['prompt_tokens_prefilled']:>9} "
              f"{k['time_to_first_token_seconds'] * 1e3:>8.1f}  {reply[:40]!r}")
        messages.append({"role": "assistant", "content": reply})
        if turn < len(questions):
            messages.append({"role": "user", "content": questions[turn]})


if __name__ == "__main__":
    main()
