//! `redco serve` for the clients people already use: an evaluation harness's
//! loglikelihood request (`echo` + `logprobs`) against transformers' numbers, structured
//! output and tool calls on random weights.

use crate::cli_serve::{alive, http, post, start, streamed};
use crate::common::fixture_named;
use serde_json::{json, Value};

/// An evaluation harness's loglikelihood request (lm-evaluation-harness's
/// `local-completions`: token-id prompts, `echo`, `logprobs: 1`, `max_tokens: 1`): every
/// prompt token after the first scored, equal to transformers' log-softmax of its logits
/// (the fixture's), two prompts in one request; the first token's `null`.
#[test]
fn echo_with_logprobs_scores_every_prompt_token_as_transformers_does() {
    let model = fixture_named("llama-tiny");
    let r = redco_models::hf::safetensors::read_all(&model.join("reference.safetensors")).unwrap();
    let logits = r["logits"].data.to_f64_vec();
    let vocab = r["logits"].shape.dims()[2];
    // the fixture's rows: [5 9 13 2 40 33 7], and [11 3 21 60 8] after two padding tokens
    let rows: [(Vec<i64>, usize); 2] = [(vec![5, 9, 13, 2, 40, 33, 7], 0), (vec![11, 3, 21, 60, 8], 2)];
    let seq = 7;
    let srv = start(&model, &[]);
    let body = json!({"prompt": [rows[0].0, rows[1].0], "echo": true, "logprobs": 1, "max_tokens": 1,
        "temperature": 0});
    let (st, v) = post(&srv.addr, "/v1/completions", &body);
    assert_eq!(st, 200, "{v}");
    for (i, (ids, pad)) in rows.iter().enumerate() {
        let lp = &v["choices"][i]["logprobs"];
        let lps = lp["token_logprobs"].as_array().unwrap();
        assert_eq!(lps.len(), ids.len() + 1, "every prompt token and the one generated: {lp}");
        assert!(lps[0].is_null() && lp["top_logprobs"][0].is_null(), "the first token has no log-probability");
        for k in 1..ids.len() {
            let row = &logits[(i * seq + pad + k - 1) * vocab..(i * seq + pad + k) * vocab];
            let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let lse = m + row.iter().map(|x| (x - m).exp()).sum::<f64>().ln();
            let want = row[ids[k] as usize] - lse;
            let got = lps[k].as_f64().unwrap();
            assert!((got - want).abs() < 1e-4, "prompt {i} token {k}: {got} vs transformers' {want}");
            // the one alternative asked for is the most likely token's
            let top: Vec<f64> =
                lp["top_logprobs"][k].as_object().unwrap().values().filter_map(|x| x.as_f64()).collect();
            assert_eq!(top.len(), 1, "{lp}");
            assert!((top[0] - (m - lse)).abs() < 1e-4, "prompt {i} token {k}: top {top:?}");
        }
        assert_eq!(lp["tokens"].as_array().unwrap().len(), ids.len() + 1);
        assert!(lp["text_offset"].as_array().unwrap().windows(2).all(|w| w[0].as_u64() <= w[1].as_u64()));
    }
    // streamed, the prompt's scores come first, with the echoed text
    let mut sbody = body.clone();
    sbody["stream"] = json!(true);
    sbody["prompt"] = json!(rows[0].0);
    let (st, text) = http(&srv.addr, "POST", "/v1/completions", sbody.to_string().as_bytes());
    assert_eq!(st, 200, "{text}");
    let (chunks, done) = streamed(&text);
    assert!(done, "{text}");
    let first = &chunks[0]["choices"][0]["logprobs"]["token_logprobs"];
    assert_eq!(first.as_array().map(Vec::len), Some(rows[0].0.len()), "{text}");
    let whole = &v["choices"][0]["logprobs"]["token_logprobs"];
    for k in 1..rows[0].0.len() {
        assert!((first[k].as_f64().unwrap() - whole[k].as_f64().unwrap()).abs() < 1e-6, "{first} vs {whole}");
    }
}

/// A random-weight LLaMA (the llama-tiny preset's shape) with a byte-level tokenizer, whose
/// vocabulary can spell any text, and a chat template: the model structured output is
/// tested on.
fn byte_model(name: &str) -> std::path::PathBuf {
    let dir = crate::common::scratch_dir("serve", &format!("byte-model-{name}"));
    redco_models::presets::write_byte_tokenizer(&dir).unwrap();
    let vocab = redco_models::hf::tokenizer::Tokenizer::from_dir(&dir).unwrap().vocab_size();
    let raw = redco_models::presets::config("llama-tiny", vocab).unwrap();
    let cfg = redco_models::hf::config::HfConfig::from_json(&raw.to_string()).unwrap();
    let b = redco_cpu::Cpu::new(1);
    let m = redco_models::llama::Llama::new(&b, &cfg, redco_core::DType::F32, 3).unwrap();
    redco_models::hf::save::save_pretrained(&m, &cfg, &dir, 1 << 30, None).unwrap();
    let template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:";
    std::fs::write(dir.join("chat_template.jinja"), template).unwrap();
    dir
}

/// Structured output on random weights: `response_format` (json_object, json_schema) on
/// chat and completions, vLLM's guided_regex and guided_choice, streamed and not; every
/// answer is one its grammar accepts, ended by it; a grammar llguidance refuses is a 400
/// naming the field.
#[test]
fn structured_output_is_valid_whatever_the_weights() {
    let model = byte_model("structured");
    let srv = start(&model, &[]);
    let a = srv.addr.as_str();
    let schema = json!({"type": "object", "properties": {
        "name": {"type": "string", "enum": ["ada", "bob"]},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"type": "string", "enum": ["x", "y"]}, "maxItems": 3}},
        "required": ["name", "age", "tags"], "additionalProperties": false});
    let rf = json!({"type": "json_schema", "json_schema": {"name": "person", "schema": schema, "strict": true}});
    let msgs = json!([{"role": "user", "content": "Who?"}]);
    let check = |text: &str| {
        let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
        assert!(["ada", "bob"].contains(&v["name"].as_str().unwrap_or("")), "{v}");
        assert!((0..=120).contains(&v["age"].as_i64().unwrap_or(-1)), "{v}");
        assert!(v["tags"].as_array().is_some_and(|t| t.len() <= 3), "{v}");
    };
    for temperature in [0.0, 1.0] {
        let body = json!({"messages": msgs, "response_format": rf, "max_tokens": 200, "temperature": temperature,
            "seed": 1});
        let (st, r) = post(a, "/v1/chat/completions", &body);
        assert_eq!(st, 200, "{r}");
        check(r["choices"][0]["message"]["content"].as_str().unwrap());
        assert_eq!(r["choices"][0]["finish_reason"], "stop", "{r}");
        let (st, r) = post(
            a,
            "/v1/completions",
            &json!({"prompt": "Person:", "response_format": rf,
            "max_tokens": 200, "temperature": temperature, "seed": 2}),
        );
        assert_eq!(st, 200, "{r}");
        check(r["choices"][0]["text"].as_str().unwrap());
    }
    // streamed: the deltas make the same valid object
    let body = json!({"messages": msgs, "response_format": rf, "max_tokens": 200, "temperature": 0, "stream": true});
    let (st, text) = http(a, "POST", "/v1/chat/completions", body.to_string().as_bytes());
    assert_eq!(st, 200, "{text}");
    let (chunks, done) = streamed(&text);
    assert!(done);
    let joined: String =
        chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect::<Vec<_>>().concat();
    check(&joined);
    // any JSON object
    let (st, r) = post(
        a,
        "/v1/completions",
        &json!({"prompt": "{", "response_format": {"type": "json_object"},
        "max_tokens": 120, "temperature": 0}),
    );
    assert_eq!(st, 200, "{r}");
    let t = r["choices"][0]["text"].as_str().unwrap();
    if r["choices"][0]["finish_reason"] == "stop" {
        assert!(serde_json::from_str::<Value>(t).is_ok_and(|v| v.is_object()), "{t:?}");
    } else {
        assert!(t.starts_with('{'), "an object cut by max_tokens: {t:?}");
    }
    // a regular expression and a choice
    let (st, r) = post(
        a,
        "/v1/completions",
        &json!({"prompt": "Code:", "guided_regex": "[A-F]{3}-[0-9]{2}",
        "max_tokens": 20, "temperature": 1.0, "seed": 4}),
    );
    assert_eq!(st, 200, "{r}");
    let t = r["choices"][0]["text"].as_str().unwrap();
    let b = t.as_bytes();
    assert!(b.len() == 6 && b[..3].iter().all(|c| (b'A'..=b'F').contains(c)) && b[3] == b'-', "{t:?}");
    assert!(b[4..].iter().all(u8::is_ascii_digit), "{t:?}");
    let (st, r) = post(
        a,
        "/v1/chat/completions",
        &json!({"messages": msgs, "guided_choice": ["left", "right"],
        "max_tokens": 20, "temperature": 0}),
    );
    assert_eq!(st, 200, "{r}");
    assert!(["left", "right"].contains(&r["choices"][0]["message"]["content"].as_str().unwrap()), "{r}");
    // grammars that cannot be: a 400 naming the field
    for (body, param) in [
        (json!({"prompt": "x", "guided_regex": "(", "max_tokens": 4}), "guided_regex"),
        (json!({"prompt": "x", "response_format": {"type": "json_schema"}, "max_tokens": 4}), "response_format"),
        (json!({"prompt": "x", "response_format": {"type": "yaml"}, "max_tokens": 4}), "response_format"),
        (json!({"prompt": "x", "guided_choice": [], "max_tokens": 4}), "guided_choice"),
        (json!({"prompt": "x", "guided_regex": "a", "guided_choice": ["a"], "max_tokens": 4}), "guided_choice"),
    ] {
        let (st, v) = post(a, "/v1/completions", &body);
        assert_eq!((st, v["error"]["param"].as_str()), (400, Some(param)), "{body}: {v}");
    }
    alive(a);
}

/// Tool calling on random weights: a named function and `required` give calls whose
/// arguments validate against the function's schema (`finish_reason` `tool_calls`,
/// streamed as tool-call deltas); the template renders the tools; a conversation with the
/// assistant's calls and the tool's result goes back in; `auto` on a template without a
/// tool-call format is a 400 that says to name a parser.
#[test]
fn tool_calls_are_valid_calls_whatever_the_weights() {
    let model = byte_model("tools");
    // a Hermes-style template: the tools listed, calls in <tool_call> tags
    let template = "{% if tools %}Tools: {% for t in tools %}{{ t.function.name }} {% endfor %}\n{% endif %}\
        {% for m in messages %}{{ m.role }}: {% if m.tool_calls %}{% for c in m.tool_calls %}<tool_call>{{ c.function.name }} \
        {{ c.function.arguments.city }}</tool_call>{% endfor %}{% else %}{{ m.content }}{% endif %}\n{% endfor %}assistant:";
    std::fs::write(model.join("chat_template.jinja"), template).unwrap();
    let srv = start(&model, &[]);
    let a = srv.addr.as_str();
    let weather = json!({"type": "function", "function": {"name": "get_weather", "description": "The weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7}}, "required": ["city", "days"],
        "additionalProperties": false}}});
    let now = json!({"type": "function", "function": {"name": "now", "parameters": {"type": "object",
        "properties": {}, "additionalProperties": false}}});
    let msgs = json!([{"role": "user", "content": "Weather in Paris?"}]);
    let valid = |c: &Value| {
        let name = c["function"]["name"].as_str().unwrap();
        let args: Value = serde_json::from_str(c["function"]["arguments"].as_str().unwrap()).unwrap();
        assert_eq!(c["type"], "function");
        assert!(c["id"].as_str().unwrap().starts_with("call_"), "{c}");
        match name {
            "get_weather" => {
                assert!(["Paris", "Rome"].contains(&args["city"].as_str().unwrap()), "{args}");
                assert!((1..=7).contains(&args["days"].as_i64().unwrap()), "{args}");
            }
            "now" => assert_eq!(args, json!({})),
            other => panic!("a call of {other}"),
        }
        name.to_string()
    };
    for temperature in [0.0, 1.0] {
        let named = json!({"type": "function", "function": {"name": "get_weather"}});
        let body = json!({"messages": msgs, "tools": [weather, now], "tool_choice": named, "max_tokens": 200,
            "temperature": temperature, "seed": 3});
        let (st, r) = post(a, "/v1/chat/completions", &body);
        assert_eq!(st, 200, "{r}");
        let m = &r["choices"][0]["message"];
        assert_eq!((r["choices"][0]["finish_reason"].as_str(), m["content"].is_null()), (Some("tool_calls"), true));
        assert_eq!(m["tool_calls"].as_array().unwrap().len(), 1, "{r}");
        assert_eq!(valid(&m["tool_calls"][0]), "get_weather");
        let body = json!({"messages": msgs, "tools": [weather, now], "tool_choice": "required", "max_tokens": 300,
            "temperature": temperature, "seed": 4, "parallel_tool_calls": false});
        let (st, r) = post(a, "/v1/chat/completions", &body);
        assert_eq!(st, 200, "{r}");
        let calls = r["choices"][0]["message"]["tool_calls"].as_array().unwrap();
        assert!(!calls.is_empty(), "{r}");
        calls.iter().for_each(|c| drop(valid(c)));
    }
    // streamed: a tool-call delta, then the finish reason
    let body = json!({"messages": msgs, "tools": [weather], "tool_choice": "required", "max_tokens": 200,
        "temperature": 0, "stream": true, "parallel_tool_calls": false});
    let (st, text) = http(a, "POST", "/v1/chat/completions", body.to_string().as_bytes());
    assert_eq!(st, 200, "{text}");
    let (chunks, done) = streamed(&text);
    assert!(done, "{text}");
    let deltas: Vec<&Value> = chunks.iter().filter_map(|c| c["choices"][0]["delta"]["tool_calls"].get(0)).collect();
    assert!(!deltas.is_empty() && deltas[0]["index"] == 0, "{text}");
    assert_eq!(valid(deltas[0]), "get_weather");
    assert_eq!(chunks.last().unwrap()["choices"][0]["finish_reason"], "tool_calls", "{text}");
    // the template renders the tools: the prompt grows by them
    let plain = post(a, "/v1/chat/completions", &json!({"messages": msgs, "max_tokens": 1})).1;
    let listed = post(
        a,
        "/v1/chat/completions",
        &json!({"messages": msgs, "tools": [weather], "tool_choice": "none", "max_tokens": 1}),
    )
    .1;
    let tokens = |r: &Value| r["usage"]["prompt_tokens"].as_u64().unwrap();
    assert_eq!(tokens(&listed), tokens(&plain) + "Tools: get_weather \n".len() as u64, "{listed}");
    // the calls and their result sent back (arguments as JSON text, as clients send them)
    let back = json!([{"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"days\": 1}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]);
    let (st, r) = post(
        a,
        "/v1/chat/completions",
        &json!({"messages": back, "tools": [weather], "tool_choice": "none",
        "max_tokens": 4}),
    );
    assert_eq!(st, 200, "{r}");
    // the rendered call names its city: the arguments reached the template as an object
    let again = post(a, "/v1/chat/completions", &json!({"messages": back, "max_tokens": 1})).1;
    let shorter = json!([back[0], {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1",
        "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]}, back[2]]);
    let short = post(a, "/v1/chat/completions", &json!({"messages": shorter, "max_tokens": 1})).1;
    assert_eq!(tokens(&again), tokens(&short) + "Paris".len() as u64, "{again} {short}");
    // auto: the template shows <tool_call>, so calls are parsed as Hermes writes them; on
    // random weights the answer is text
    let (st, r) = post(a, "/v1/chat/completions", &json!({"messages": msgs, "tools": [weather], "max_tokens": 8}));
    assert_eq!(st, 200, "{r}");
    assert!(r["choices"][0]["message"]["content"].is_string() || r["choices"][0]["message"]["tool_calls"].is_array());
    alive(a);
    drop(srv);
    // auto needs a tool-call format: a template without one, and no --tool-call-parser
    std::fs::write(model.join("chat_template.jinja"), "{% for m in messages %}{{ m.content }}{% endfor %}").unwrap();
    let srv = start(&model, &[]);
    let (st, v) =
        post(&srv.addr, "/v1/chat/completions", &json!({"messages": msgs, "tools": [weather], "max_tokens": 4}));
    assert_eq!((st, v["error"]["param"].as_str()), (400, Some("tool_choice")), "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("--tool-call-parser"), "{v}");
    drop(srv);
    // named, the parser is the server's
    let srv = start(&model, &["--tool-call-parser", "hermes"]);
    let (st, r) =
        post(&srv.addr, "/v1/chat/completions", &json!({"messages": msgs, "tools": [weather], "max_tokens": 4}));
    assert_eq!(st, 200, "{r}");
}
