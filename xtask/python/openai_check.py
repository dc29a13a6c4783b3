"""The official `openai` client against `redco serve` (outside CI: `pip install openai`).

Usage: python openai_check.py BASE_URL MODEL GENERATE_OUTPUT PROMPT

Checks completions and chat, streamed and not, with the fields people use, and that the
greedy completion of PROMPT (12 tokens) ends GENERATE_OUTPUT (what `redco generate
--max-new-tokens 12` printed: the prompt, then the completion). Exits non-zero on the
first failure.
"""
import sys

from openai import OpenAI, BadRequestError, NotFoundError

base, model, generated, prompt = sys.argv[1:5]
client = OpenAI(base_url=base, api_key="none")

assert [m.id for m in client.models.list().data] == [model]

c = client.completions.create(model=model, prompt=prompt, max_tokens=12, temperature=0)
expected = c.choices[0].text
assert expected and generated.endswith(expected), (expected, generated)
assert c.usage.completion_tokens == 12 and c.choices[0].finish_reason == "length", c
print("completion:", repr(c.choices[0].text), c.usage)

parts = [ch.choices[0].text for ch in client.completions.create(
    model=model, prompt=prompt, max_tokens=12, temperature=0, stream=True) if ch.choices]
assert "".join(parts) == expected, parts
print("streamed completion:", len(parts), "chunks")

c = client.completions.create(model=model, prompt=prompt, max_tokens=12, temperature=0.8, top_p=0.9, seed=7, n=3,
                              stop=["\n"], echo=True)
assert len(c.choices) == 3 and all(ch.text.startswith(prompt) for ch in c.choices), c
again = client.completions.create(model=model, prompt=prompt, max_tokens=12, temperature=0.8, top_p=0.9, seed=7, n=3,
                                  stop=["\n"], echo=True)
assert [ch.text for ch in again.choices] == [ch.text for ch in c.choices], "the same seed, the same samples"
print("sampled, n=3, seeded:", [ch.text for ch in c.choices])

msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
r = client.chat.completions.create(model=model, messages=msgs, max_tokens=8, temperature=0)
text = r.choices[0].message.content
assert r.choices[0].message.role == "assistant" and r.usage.completion_tokens == 8, r
deltas = [ch.choices[0].delta.content or "" for ch in client.chat.completions.create(
    model=model, messages=msgs, max_tokens=8, temperature=0, stream=True) if ch.choices]
assert "".join(deltas) == text, (deltas, text)
print("chat:", repr(text), "streamed the same in", len(deltas), "chunks")

try:
    client.completions.create(model=model, prompt=prompt, max_tokens=-5)
    raise AssertionError("negative max_tokens accepted")
except BadRequestError as e:
    print("negative max_tokens:", e.status_code, e.body["message"])
try:
    client.completions.create(model="no-such-model", prompt=prompt, max_tokens=2)
    raise AssertionError("unknown model accepted")
except NotFoundError as e:
    print("unknown model:", e.status_code, e.body["message"])
print("openai client: all checks passed")
