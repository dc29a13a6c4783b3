"""The official `openai` client against `redco serve` for tool calling, structured output and
loglikelihood scoring (outside CI: `pip install openai`).

Usage: python openai_tools_check.py BASE_URL MODEL

The model may have random weights: what is checked holds whatever they are. It needs a
vocabulary that can spell JSON (a byte-level tokenizer) and a chat template that shows the
Hermes `<tool_call>` format (so `tool_choice: auto` has a parser). Exits non-zero on the
first failure.
"""
import json
import sys

from openai import OpenAI, BadRequestError

base, model = sys.argv[1:3]
client = OpenAI(base_url=base, api_key="none")
msgs = [{"role": "user", "content": "What is the weather in Paris?"}]
weather = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "enum": ["Paris", "Rome"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7}},
        "required": ["city", "days"], "additionalProperties": False}}}


def valid_call(call):
    assert call.type == "function" and call.id.startswith("call_"), call
    assert call.function.name == "get_weather", call
    args = json.loads(call.function.arguments)
    assert args["city"] in ("Paris", "Rome") and 1 <= args["days"] <= 7, args
    return args


# structured output: a JSON-schema answer that validates
schema = {"type": "object", "properties": {
    "name": {"type": "string", "enum": ["ada", "bob"]},
    "age": {"type": "integer", "minimum": 0, "maximum": 120}},
    "required": ["name", "age"], "additionalProperties": False}
r = client.chat.completions.create(model=model, messages=msgs, max_tokens=100, temperature=0,
                                   response_format={"type": "json_schema",
                                                    "json_schema": {"name": "person", "schema": schema, "strict": True}})
person = json.loads(r.choices[0].message.content)
assert person["name"] in ("ada", "bob") and 0 <= person["age"] <= 120, person
print("json_schema:", person)

# a named function and `required`, streamed and not
named = {"type": "function", "function": {"name": "get_weather"}}
for choice in (named, "required"):
    r = client.chat.completions.create(model=model, messages=msgs, tools=[weather], tool_choice=choice,
                                       parallel_tool_calls=False, max_tokens=100, temperature=0.8, seed=3)
    assert r.choices[0].finish_reason == "tool_calls" and r.choices[0].message.content is None, r
    calls = r.choices[0].message.tool_calls
    assert len(calls) == 1, calls
    print(f"tool_choice {choice if isinstance(choice, str) else 'named'}:", valid_call(calls[0]))
    # streamed: the client's accumulation of tool-call deltas
    parts, reason = {}, None
    for ch in client.chat.completions.create(model=model, messages=msgs, tools=[weather], tool_choice=choice,
                                             parallel_tool_calls=False, max_tokens=100, temperature=0, stream=True):
        if not ch.choices:
            continue
        for d in ch.choices[0].delta.tool_calls or []:
            p = parts.setdefault(d.index, {"id": d.id, "name": "", "arguments": ""})
            p["name"] += d.function.name or ""
            p["arguments"] += d.function.arguments or ""
        reason = ch.choices[0].finish_reason or reason
    assert reason == "tool_calls" and len(parts) == 1, (reason, parts)
    args = json.loads(parts[0]["arguments"])
    assert parts[0]["name"] == "get_weather" and args["city"] in ("Paris", "Rome"), parts
    print("  streamed:", parts[0])

# the call and the tool's result sent back
first = client.chat.completions.create(model=model, messages=msgs, tools=[weather], tool_choice=named,
                                       max_tokens=100, temperature=0)
call = first.choices[0].message
back = msgs + [call.model_dump(exclude_none=True),
               {"role": "tool", "tool_call_id": call.tool_calls[0].id, "content": "sunny, 21 C"}]
r = client.chat.completions.create(model=model, messages=back, tools=[weather], tool_choice="none",
                                   max_tokens=8, temperature=0)
assert r.choices[0].message.content is not None and r.choices[0].message.tool_calls is None, r
print("tool result sent back:", repr(r.choices[0].message.content))

# auto: the model decides (random weights: text, or calls that validate)
r = client.chat.completions.create(model=model, messages=msgs, tools=[weather], max_tokens=16, temperature=0)
for c in r.choices[0].message.tool_calls or []:
    valid_call(c)
print("auto:", r.choices[0].finish_reason, repr(r.choices[0].message.content))

# loglikelihood scoring as lm-evaluation-harness's local-completions asks for it
ids = [72, 101, 108, 108, 111]
c = client.completions.create(model=model, prompt=[ids], echo=True, logprobs=1, max_tokens=1, temperature=0)
lp = c.choices[0].logprobs
assert lp.token_logprobs[0] is None and len(lp.token_logprobs) == len(ids) + 1, lp
assert all(isinstance(x, float) and x <= 0 for x in lp.token_logprobs[1:]), lp
print("echo + logprobs:", [round(x, 3) for x in lp.token_logprobs[1:]])

# a field this server does not implement is refused by name
try:
    client.completions.create(model=model, prompt="x", max_tokens=2, suffix="end")
    raise AssertionError("suffix accepted")
except BadRequestError as e:
    assert e.body["param"] == "suffix", e.body
    print("suffix:", e.status_code, e.body["message"])
print("openai client (tools, structured output, echo logprobs): all checks passed")
