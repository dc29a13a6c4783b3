"""lm-evaluation-harness's `local-completions` against a running `redco serve` (outside CI:
it needs `pip install lm-eval transformers`; torch is not needed).

Two tasks on local data (no download): a multiple-choice task scored by log-likelihood
(the harness sends each context + choice as token ids with `echo: true`, `logprobs: 1`,
`max_tokens: 1`) and a greedy generation task. Checked:

- every choice's log-likelihood is finite and below zero (the bug this guards against:
  all zeros), and equals the sum of the continuation tokens' log-probabilities that the
  server returns for the same ids (the harness's encoding: context + choice without special
  tokens, the context's ids a prefix) in a request of this script's own (within 1e-4);
- the generated answers equal a plain greedy `/v1/completions` of the same prompt ids (the
  harness sends token ids without a BOS), cut at the harness's stop string.

usage: python lm_eval_check.py --base-url http://127.0.0.1:8000 --model-dir DIR --model NAME
"""

import argparse
import json
import math
import os
import sys
import tempfile
import urllib.request

QUESTIONS = [
    ("The capital of France is", [" Paris", " London", " Rome", " Berlin"], 0),
    ("Two plus two equals", [" four", " five", " three"], 0),
    ("The sun rises in the", [" east", " west", " north", " south"], 0),
    ("Water freezes at zero degrees", [" Celsius", " Kelvin"], 0),
    ("A week has seven", [" days", " hours", " months"], 0),
    ("The opposite of hot is", [" cold", " warm", " loud"], 0),
]
PROMPTS = ["Once upon a time", "The quick brown fox", "In the beginning", "My favourite colour is"]


def post(base, body):
    req = urllib.request.Request(
        base + "/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.load(r)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--model", required=True)
    a = ap.parse_args()
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    import lm_eval
    from transformers import AutoTokenizer

    d = tempfile.mkdtemp(prefix="redco-lm-eval-")
    with open(os.path.join(d, "mc.jsonl"), "w") as f:
        for q, c, ans in QUESTIONS:
            f.write(json.dumps({"question": q, "choices": c, "answer": ans}) + "\n")
    with open(os.path.join(d, "gen.jsonl"), "w") as f:
        for p in PROMPTS:
            f.write(json.dumps({"prompt": p}) + "\n")
    with open(os.path.join(d, "redco_mc.yaml"), "w") as f:
        f.write(
            f"""task: redco_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {d}/mc.jsonl
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
target_delimiter: ""
metric_list:
  - metric: acc
"""
        )
    with open(os.path.join(d, "redco_gen.yaml"), "w") as f:
        f.write(
            f"""task: redco_gen
dataset_path: json
dataset_kwargs:
  data_files:
    test: {d}/gen.jsonl
test_split: test
output_type: generate_until
doc_to_text: "{{{{prompt}}}}"
doc_to_target: ""
generation_kwargs:
  until: ["\\n"]
  max_gen_toks: 12
  do_sample: false
  temperature: 0
metric_list:
  - metric: exact_match
"""
        )
    from lm_eval.tasks import TaskManager

    tm = TaskManager(include_path=d)
    res = lm_eval.simple_evaluate(
        model="local-completions",
        model_args=(
            f"model={a.model},base_url={a.base_url}/v1/completions,tokenizer={a.model_dir},"
            "tokenized_requests=True,num_concurrent=1,max_retries=1"
        ),
        tasks=["redco_mc", "redco_gen"],
        task_manager=tm,
        log_samples=True,
    )
    tok = AutoTokenizer.from_pretrained(a.model_dir)
    failures = []
    n_choices = 0
    for s in res["samples"]["redco_mc"]:
        doc = s["doc"]
        lls = [r[0][0] for r in s["resps"]]
        # the harness's encoding: no special tokens, the context's ids a prefix of the whole's
        ctx = tok(doc["question"], add_special_tokens=False)["input_ids"]
        for choice, ll in zip(doc["choices"], lls):
            n_choices += 1
            full = tok(doc["question"] + choice, add_special_tokens=False)["input_ids"]
            out = post(a.base_url, {"model": a.model, "prompt": full, "echo": True, "logprobs": 1, "max_tokens": 1,
                                    "temperature": 0})
            lp = out["choices"][0]["logprobs"]["token_logprobs"]
            want = sum(lp[len(ctx):len(full)])
            if not (math.isfinite(ll) and ll < 0 and abs(ll - want) <= 1e-4 * (1 + abs(want))):
                failures.append(f"{doc['question']!r}{choice!r}: harness {ll}, server's own sum {want}")
            print(f"  {doc['question']!r} + {choice!r}: {ll:.5f} (server's own sum {want:.5f})")
    for s in res["samples"]["redco_gen"]:
        got = s["resps"][0][0]
        ids = tok(s["doc"]["prompt"], add_special_tokens=False)["input_ids"]
        direct = post(a.base_url, {"model": a.model, "prompt": ids, "max_tokens": 12,
                                   "temperature": 0})["choices"][0]["text"].split("\n")[0]
        print(f"  generate {s['doc']['prompt']!r}: {got!r}")
        if got != direct:
            failures.append(f"generation of {s['doc']['prompt']!r}: harness {got!r}, direct {direct!r}")
    print("results:", json.dumps({k: v for k, v in res["results"].items()}, default=str))
    print(f"lm_eval {lm_eval.__version__}: {n_choices} choices scored, {len(res['samples']['redco_gen'])} generations")
    if failures:
        print("FAILED:\n" + "\n".join(failures))
        sys.exit(1)
    print("lm-evaluation-harness local-completions: ok")


if __name__ == "__main__":
    main()
