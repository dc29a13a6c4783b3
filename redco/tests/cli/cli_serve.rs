//! `redco serve` over loopback with a plain HTTP client: greedy text equal to `redco
//! generate`'s (alone, with n > 1, streamed, and under concurrent requests), OpenAI's
//! shapes, a corpus of bad requests and misbehaving clients answered 4xx with the server
//! alive after each, a client that disconnects mid-stream freeing its blocks, the chat
//! template, and SIGTERM draining to exit 0.

use crate::common::{fixture_named, redco, s};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running server and its address.
pub(crate) struct Server {
    child: Child,
    /// The address it listens on.
    pub(crate) addr: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(crate) fn start(model: &std::path::Path, extra: &[&str]) -> Server {
    let mut child = Command::new(env!("CARGO_BIN_EXE_redco"))
        .args(["serve", "--model", s(model), "--port", "0", "--kv-memory", "4MB"])
        .args(if extra.contains(&"--threads") { &[][..] } else { &["--threads", "1"][..] })
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start redco serve");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let addr = line.split("http://").nth(1).and_then(|r| r.split_whitespace().next()).unwrap_or_else(|| {
        let _ = child.kill();
        panic!("no address in {line:?}")
    });
    Server { addr: addr.to_string(), child }
}

/// One HTTP/1.0 exchange (the server closes the connection after it): status, body.
pub(crate) fn http(addr: &str, method: &str, path: &str, body: &[u8]) -> (u16, String) {
    let mut c = TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let head = format!(
        "{method} {path} HTTP/1.0\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    c.write_all(head.as_bytes()).unwrap();
    c.write_all(body).unwrap();
    let mut out = Vec::new();
    c.read_to_end(&mut out).unwrap();
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text.split_whitespace().nth(1).and_then(|x| x.parse().ok()).unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map_or(String::new(), |(_, b)| b.to_string());
    (status, body)
}

pub(crate) fn post(addr: &str, path: &str, v: &Value) -> (u16, Value) {
    let (st, body) = http(addr, "POST", path, v.to_string().as_bytes());
    (st, serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: {e}: {body}")))
}

pub(crate) fn alive(addr: &str) {
    assert_eq!(http(addr, "GET", "/health", b""), (200, "ok".to_string()));
}

/// `redco generate`'s greedy text for `prompt`.
pub(crate) fn generated(model: &std::path::Path, prompt: &str, n: usize) -> String {
    let (code, out, err) =
        redco(&["generate", "--model", s(model), "--prompt", prompt, "--max-new-tokens", &n.to_string()]);
    assert_eq!(code, 0, "{err}");
    out.trim_end_matches('\n').to_string()
}

/// The deltas of a streamed completion, and whether it ended with `[DONE]`.
pub(crate) fn streamed(body: &str) -> (Vec<Value>, bool) {
    let mut chunks = Vec::new();
    let mut done = false;
    for line in body.lines().filter_map(|l| l.strip_prefix("data: ")) {
        if line == "[DONE]" {
            done = true;
        } else {
            chunks.push(serde_json::from_str(line).unwrap());
        }
    }
    (chunks, done)
}

#[test]
fn serve_answers_openai_requests_with_generate_s_greedy_text_and_survives_bad_ones() {
    let model = fixture_named("llama-tiny");
    let srv = start(&model, &[]);
    let a = srv.addr.as_str();
    alive(a);
    let (st, models) = http(a, "GET", "/v1/models", b"");
    assert_eq!(st, 200);
    assert!(models.contains("\"id\":\"llama-tiny\""), "{models}");
    // greedy text equals redco generate's: `generate` prints the prompt and the completion
    for prompt in ["Hello world", "the cat sat"] {
        let want = generated(&model, prompt, 12);
        let (st, r) = post(
            a,
            "/v1/completions",
            &json!({"model": "llama-tiny", "prompt": prompt, "max_tokens": 12,
            "temperature": 0, "n": 2, "echo": true}),
        );
        assert_eq!(st, 200, "{r}");
        assert_eq!(r["object"], "text_completion");
        assert_eq!(r["choices"].as_array().unwrap().len(), 2);
        let prompt_tokens = r["usage"]["prompt_tokens"].as_u64().unwrap();
        assert_eq!(r["usage"]["completion_tokens"], 24, "{r}");
        assert_eq!(r["usage"]["total_tokens"].as_u64().unwrap(), prompt_tokens + 24);
        for c in r["choices"].as_array().unwrap() {
            let text = c["text"].as_str().unwrap();
            assert_eq!(c["finish_reason"], "length");
            // echo: the prompt, then the completion
            assert!(text.starts_with(prompt), "{text:?}");
            assert!(want.ends_with(&text[prompt.len()..]), "served {text:?}, generate printed {want:?}");
        }
        // streamed: the deltas make the same text, then [DONE]
        let (st, body) = http(
            a,
            "POST",
            "/v1/completions",
            json!({"prompt": prompt, "max_tokens": 12,
            "temperature": 0, "stream": true, "stream_options": {"include_usage": true}})
            .to_string()
            .as_bytes(),
        );
        assert_eq!(st, 200);
        let (chunks, done) = streamed(&body);
        assert!(done, "{body}");
        let text: String = chunks.iter().filter_map(|c| c["choices"].get(0)?["text"].as_str()).collect();
        assert!(want.ends_with(&text) && !text.is_empty(), "streamed {text:?}, generate printed {want:?}");
        assert_eq!(chunks.last().unwrap()["usage"]["completion_tokens"], 12, "{body}");
    }
    // logprobs: one per token, the greedy token the most likely of the alternatives
    let (st, r) =
        post(a, "/v1/completions", &json!({"prompt": "Hello world", "max_tokens": 5, "temperature": 0, "logprobs": 2}));
    assert_eq!(st, 200, "{r}");
    let lp = &r["choices"][0]["logprobs"];
    let lps = lp["token_logprobs"].as_array().unwrap();
    assert_eq!(lps.len(), 5, "{r}");
    for (i, tops) in lp["top_logprobs"].as_array().unwrap().iter().enumerate() {
        let tops = tops.as_object().unwrap();
        assert!(!tops.is_empty() && tops.len() <= 2, "{r}");
        let best = tops.values().map(|v| v.as_f64().unwrap()).fold(f64::NEG_INFINITY, f64::max);
        let mine = lps[i].as_f64().unwrap();
        assert!(mine <= 0.0 && (mine - best).abs() < 1e-5, "token {i}: {mine} against {best}: {r}");
    }
    // concurrent clients: each gets the text it gets alone
    let alone: Vec<String> = (0..6)
        .map(|i| {
            post(a, "/v1/completions", &json!({"prompt": format!("request {i}"), "max_tokens": 10, "temperature": 0})).1
                ["choices"][0]["text"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    let together: Vec<String> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..6)
            .map(|i| {
                sc.spawn(move || {
                    post(
                        a,
                        "/v1/completions",
                        &json!({"prompt": format!("request {i}"), "max_tokens": 10, "temperature": 0}),
                    )
                    .1["choices"][0]["text"]
                        .as_str()
                        .unwrap()
                        .to_string()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(together, alone);
    // a stop string cuts the text before it and ends the choice with "stop"
    let full = &alone[0];
    if let Some(cut) = full.char_indices().nth(3).map(|(i, _)| i) {
        let stop = &full[cut..cut + full[cut..].chars().next().unwrap().len_utf8()];
        let (_, r) = post(
            a,
            "/v1/completions",
            &json!({"prompt": "request 0", "max_tokens": 10, "temperature": 0, "stop": [stop]}),
        );
        let text = r["choices"][0]["text"].as_str().unwrap();
        assert_eq!(r["choices"][0]["finish_reason"], "stop", "{r}");
        assert!(full.starts_with(text) && !text.contains(stop), "{text:?} stop {stop:?} of {full:?}");
    }
    // bad requests: 4xx with OpenAI's error JSON, and the server keeps serving
    let huge = vec![b'a'; 3 << 20];
    let cases: Vec<(Vec<u8>, &str, u16)> = vec![
        (b"{not json".to_vec(), "/v1/completions", 400),
        (b"[1, 2]".to_vec(), "/v1/completions", 400),
        (b"".to_vec(), "/v1/completions", 400),
        (json!({"model": "gpt-4", "prompt": "x"}).to_string().into_bytes(), "/v1/completions", 404),
        (json!({"model": 5, "prompt": "x"}).to_string().into_bytes(), "/v1/completions", 400),
        (json!({"prompt": "x", "max_tokens": -1}).to_string().into_bytes(), "/v1/completions", 400),
        (json!({"prompt": "x", "max_tokens": 100000000}).to_string().into_bytes(), "/v1/completions", 400),
        (json!({"prompt": "x", "max_tokens": "ten"}).to_string().into_bytes(), "/v1/completions", 400),
        (json!({"prompt": "x", "temperature": -1}).to_string().into_bytes(), "/v1/completions", 400),
        (json!({"prompt": "x", "top_p": 2}).to_string().into_bytes(), "/v1/completions", 400),
        (json!({"prompt": "x", "n": 0}).to_string().into_bytes(), "/v1/completions", 400),
        (json!({"prompt": "x", "logprobs": 99}).to_string().into_bytes(), "/v1/completions", 400),
        (json!({"prompt": "x", "top_logprobs": 2}).to_string().into_bytes(), "/v1/completions", 400),
        (json!({"prompt": "x", "stop": 7}).to_string().into_bytes(), "/v1/completions", 400),
        (json!({"prompt": "x", "stream": "yes"}).to_string().into_bytes(), "/v1/completions", 400),
        (json!({"prompt": 5}).to_string().into_bytes(), "/v1/completions", 400),
        (json!({"prompt": [1, -2]}).to_string().into_bytes(), "/v1/completions", 400),
        (json!({"prompt": [1, 99999999]}).to_string().into_bytes(), "/v1/completions", 400),
        (json!({"prompt": []}).to_string().into_bytes(), "/v1/completions", 400),
        (json!({}).to_string().into_bytes(), "/v1/completions", 400),
        (json!({"prompt": vec![5; 100]}).to_string().into_bytes(), "/v1/completions", 400),
        (
            json!({"messages": [{"role": "user", "content": "hi"}]}).to_string().into_bytes(),
            "/v1/chat/completions",
            400,
        ),
        (json!({"prompt": "x"}).to_string().into_bytes(), "/v1/nothing", 404),
        (huge, "/v1/completions", 413),
    ];
    for (body, path, want) in &cases {
        let (st, text) = http(a, "POST", path, body);
        assert_eq!(st, *want, "{path} {}: {text}", String::from_utf8_lossy(&body[..body.len().min(60)]));
        if *want != 413 {
            let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
            assert!(v["error"]["message"].is_string(), "{text}");
        }
        alive(a);
    }
    // misbehaving clients: a bare disconnect, half a request, garbage, a huge header
    for raw in
        [&b""[..], b"POST /v1/completions HTTP/1.0\r\nContent-Length: 100\r\n\r\n{\"pro", b"\x00\x01garbage\r\n\r\n"]
    {
        let mut c = TcpStream::connect(a).unwrap();
        c.write_all(raw).unwrap();
        drop(c);
        alive(a);
    }
    let big_header = format!("GET /health HTTP/1.0\r\nX-Big: {}\r\n\r\n", "a".repeat(1 << 20));
    let mut c = TcpStream::connect(a).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let _ = c.write_all(big_header.as_bytes());
    let mut sink = Vec::new();
    let _ = c.read_to_end(&mut sink);
    assert!(!String::from_utf8_lossy(&sink).contains("200 OK"), "a 1 MB header was accepted");
    alive(a);
    // the latency histograms counted the requests
    let (_, m) = http(a, "GET", "/metrics", b"");
    for h in ["redco_time_to_first_token_seconds", "redco_time_per_output_token_seconds"] {
        assert!(
            m.contains(&format!("# TYPE {h} histogram")) && m.contains(&format!("{h}_bucket{{le=\"+Inf\"}}")),
            "{m}"
        );
        let n: u64 = m.lines().find_map(|l| l.strip_prefix(&format!("{h}_count "))?.parse().ok()).unwrap();
        assert!(n > 10, "{h}: {n}");
    }
    assert!(m.contains("redco_output_tokens_per_second "), "{m}");
    // a client that disconnects mid-stream: its sequence and blocks are freed
    let mut c = TcpStream::connect(a).unwrap();
    let body = json!({"prompt": "a long one", "max_tokens": 40, "temperature": 0, "stream": true}).to_string();
    let head = format!("POST /v1/completions HTTP/1.0\r\nContent-Length: {}\r\n\r\n", body.len());
    c.write_all(head.as_bytes()).unwrap();
    c.write_all(body.as_bytes()).unwrap();
    let mut first = [0u8; 64];
    c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let _ = c.read(&mut first).unwrap();
    drop(c);
    let t = Instant::now();
    loop {
        let (_, m) = http(a, "GET", "/metrics", b"");
        let get = |k: &str| m.lines().find_map(|l| l.strip_prefix(&format!("{k} "))?.parse::<u64>().ok()).unwrap();
        if get("redco_running_sequences") == 0 && get("redco_kv_blocks_used") == 0 {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(30), "the disconnected stream still holds its blocks:\n{m}");
        std::thread::sleep(Duration::from_millis(50));
    }
    alive(a);
}

#[test]
fn serve_renders_the_chat_template_and_drains_on_sigterm() {
    // llama-tiny with a chat template added
    let dir = std::env::temp_dir().join(format!("redco-cli-serve-chat-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let src = fixture_named("llama-tiny");
    for f in ["config.json", "generation_config.json", "model.safetensors", "tokenizer.json"] {
        std::fs::copy(src.join(f), dir.join(f)).unwrap();
    }
    // the template where current transformers saves it: chat_template.jinja beside a
    // tokenizer_config.json without one
    std::fs::copy(src.join("tokenizer_config.json"), dir.join("tokenizer_config.json")).unwrap();
    let template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}";
    std::fs::write(dir.join("chat_template.jinja"), template).unwrap();
    let mut srv = start(&dir, &["--served-model-name", "tiny-chat"]);
    let a = srv.addr.clone();
    let msgs = json!([{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]);
    let (st, r) = post(
        &a,
        "/v1/chat/completions",
        &json!({"model": "tiny-chat", "messages": msgs, "max_tokens": 6, "temperature": 0}),
    );
    assert_eq!(st, 200, "{r}");
    assert_eq!(r["object"], "chat.completion");
    assert_eq!(r["choices"][0]["message"]["role"], "assistant");
    let chat_text = r["choices"][0]["message"]["content"].as_str().unwrap();
    assert_eq!(r["usage"]["completion_tokens"], 6, "{r}");
    // the prompt is the template's rendering: its token count is the rendered text's
    let rendered = "system: be brief\nuser: hi\nassistant:";
    let (_, c) = post(&a, "/v1/completions", &json!({"prompt": rendered, "max_tokens": 1, "temperature": 0}));
    let with_bos = c["usage"]["prompt_tokens"].as_u64().unwrap();
    let chat_prompt = r["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(chat_prompt == with_bos || chat_prompt + 1 == with_bos, "chat {chat_prompt}, completions {with_bos}");
    // streamed chat: the first delta names the role
    let (st, body) = http(
        &a,
        "POST",
        "/v1/chat/completions",
        json!({"messages": msgs, "max_tokens": 6, "temperature": 0, "stream": true}).to_string().as_bytes(),
    );
    assert_eq!(st, 200);
    let (chunks, done) = streamed(&body);
    assert!(done && chunks[0]["choices"][0]["delta"]["role"] == "assistant", "{body}");
    let text: String = chunks.iter().filter_map(|c| c["choices"].get(0)?["delta"]["content"].as_str()).collect();
    assert_eq!(text, chat_text);
    let (_, r) = post(
        &a,
        "/v1/chat/completions",
        &json!({"messages": msgs, "max_tokens": 3, "temperature": 0,
        "logprobs": true, "top_logprobs": 2}),
    );
    let content = r["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert_eq!(content.len(), 3, "{r}");
    assert!(
        content
            .iter()
            .all(|c| c["logprob"].as_f64().unwrap() <= 0.0 && c["top_logprobs"].as_array().unwrap().len() == 2),
        "{r}"
    );
    for bad in [json!({"messages": []}), json!({"messages": "hi"}), json!({"messages": [{"content": "no role"}]})] {
        let (st, r) = post(&a, "/v1/chat/completions", &bad);
        assert_eq!(st, 400, "{bad}: {r}");
    }
    // SIGTERM: a request in flight finishes, then the server exits 0
    let pid = srv.child.id().to_string();
    let a2 = a.clone();
    let inflight = std::thread::spawn(move || {
        post(&a2, "/v1/completions", &json!({"prompt": "drain me", "max_tokens": 30, "temperature": 0}))
    });
    std::thread::sleep(Duration::from_millis(300));
    assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    let (st, r) = inflight.join().unwrap();
    assert_eq!((st, r["choices"][0]["finish_reason"].as_str()), (200, Some("length")), "{r}");
    let t = Instant::now();
    let code = loop {
        if let Some(s) = srv.child.try_wait().unwrap() {
            break s.code();
        }
        assert!(t.elapsed() < Duration::from_secs(30), "the server did not exit after SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(code, Some(0));
    let _ = std::fs::remove_dir_all(&dir);
}

/// The server split over two tensor-parallel thread ranks (`--mesh 1x2`), rank 0 leading
/// the other in lockstep: the greedy text of `redco generate` at 1x1 and at 1x2 (alone,
/// with `n: 2`, streamed, and under concurrent requests), the same log-probabilities as
/// the one-rank server (to 1e-4), a disconnected stream freeing its blocks on both ranks
/// (the next requests still meet in the ranks' collectives), and SIGTERM draining to 0.
#[test]
fn serve_over_two_tensor_parallel_ranks_gives_generate_s_text() {
    let model = fixture_named("llama-tiny");
    let one = start(&model, &[]);
    let srv = start(&model, &["--mesh", "1x2", "--threads", "2"]);
    let a = srv.addr.clone();
    alive(&a);
    let prompts = ["Hello world", "the cat sat", "a longer prompt than those"];
    for prompt in prompts {
        let want = generated(&model, prompt, 10);
        let (code, at_1x2, err) = redco(&[
            "generate",
            "--model",
            s(&model),
            "--prompt",
            prompt,
            "--max-new-tokens",
            "10",
            "--mesh",
            "1x2",
            "--threads",
            "2",
        ]);
        assert_eq!(code, 0, "{err}");
        assert_eq!(at_1x2.trim_end_matches('\n'), want, "generate at 1x2 and at 1x1");
        let ask = json!({"prompt": prompt, "max_tokens": 10, "temperature": 0, "n": 2, "logprobs": 3});
        let (st, r) = post(&a, "/v1/completions", &ask);
        assert_eq!(st, 200, "{r}");
        for c in r["choices"].as_array().unwrap() {
            let text = c["text"].as_str().unwrap();
            assert!(!text.is_empty() && want.ends_with(text), "served at 1x2 {text:?}, generate printed {want:?}");
        }
        let (_, r1) = post(&one.addr, "/v1/completions", &ask);
        let lp = |r: &Value| -> Vec<f64> {
            r["choices"][0]["logprobs"]["token_logprobs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap())
                .collect()
        };
        let (x, y) = (lp(&r), lp(&r1));
        assert_eq!(x.len(), 10);
        for (i, (p, q)) in x.iter().zip(&y).enumerate() {
            assert!((p - q).abs() <= 1e-4, "{prompt:?} token {i}: logprob {p} at 1x2, {q} at 1x1");
        }
        let body = json!({"prompt": prompt, "max_tokens": 10, "temperature": 0, "stream": true}).to_string();
        let (st, body) = http(&a, "POST", "/v1/completions", body.as_bytes());
        assert_eq!(st, 200);
        let (chunks, done) = streamed(&body);
        assert!(done, "{body}");
        let text: String = chunks.iter().filter_map(|c| c["choices"].get(0)?["text"].as_str()).collect();
        assert!(want.ends_with(&text) && !text.is_empty(), "streamed at 1x2 {text:?}, generate printed {want:?}");
    }
    // concurrent clients: each gets the text it gets alone
    let alone: Vec<String> = prompts.iter().map(|p| generated(&model, p, 8)).collect();
    let clients: Vec<_> = prompts
        .iter()
        .cycle()
        .take(6)
        .map(|p| {
            let (a, p) = (a.clone(), p.to_string());
            std::thread::spawn(move || {
                let (st, r) = post(&a, "/v1/completions", &json!({"prompt": p, "max_tokens": 8, "temperature": 0}));
                assert_eq!(st, 200, "{r}");
                r["choices"][0]["text"].as_str().unwrap().to_string()
            })
        })
        .collect();
    for (i, c) in clients.into_iter().enumerate() {
        let text = c.join().unwrap();
        assert!(alone[i % 3].ends_with(&text) && !text.is_empty(), "client {i}: {text:?} against {:?}", alone[i % 3]);
    }
    // a client gone mid-stream: cancelled on both ranks, its blocks freed
    let mut c = TcpStream::connect(&a).unwrap();
    let body = json!({"prompt": "a long one", "max_tokens": 40, "temperature": 0, "stream": true}).to_string();
    c.write_all(format!("POST /v1/completions HTTP/1.0\r\nContent-Length: {}\r\n\r\n{body}", body.len()).as_bytes())
        .unwrap();
    c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let _ = c.read(&mut [0u8; 64]).unwrap();
    drop(c);
    let t = Instant::now();
    loop {
        let (_, m) = http(&a, "GET", "/metrics", b"");
        let get = |k: &str| m.lines().find_map(|l| l.strip_prefix(&format!("{k} "))?.parse::<u64>().ok()).unwrap();
        if get("redco_running_sequences") == 0 && get("redco_kv_blocks_used") == 0 {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(30), "the disconnected stream still holds its blocks:\n{m}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let (st, r) = post(&a, "/v1/completions", &json!({"prompt": prompts[0], "max_tokens": 4, "temperature": 0}));
    assert_eq!(st, 200, "{r}");
    // idle for a few of the leader's ticks (empty broadcasts), then serving again
    std::thread::sleep(Duration::from_secs(2));
    alive(&a);
    let (st, again) = post(&a, "/v1/completions", &json!({"prompt": prompts[0], "max_tokens": 4, "temperature": 0}));
    assert_eq!((st, &again["choices"][0]["text"]), (200, &r["choices"][0]["text"]), "{again}");
    // SIGTERM: drained, exit 0
    let mut srv = srv;
    assert!(Command::new("kill").args(["-TERM", &srv.child.id().to_string()]).status().unwrap().success());
    let t = Instant::now();
    let code = loop {
        if let Some(s) = srv.child.try_wait().unwrap() {
            break s.code();
        }
        assert!(t.elapsed() < Duration::from_secs(30), "the server did not exit after SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(code, Some(0));
}

/// GPT-J and OPT serve too (their ragged batches: rotary or learned positions per token),
/// on one rank and over two tensor-parallel thread ranks: the greedy text of `redco
/// generate` for prompts batched together; T5 is refused, naming what runs.
#[test]
fn serve_runs_gptj_and_opt_with_generate_s_text_and_refuses_t5() {
    for name in ["gptj-tiny", "opt-tiny"] {
        let model = fixture_named(name);
        let prompts = ["Hello world", "the cat sat on the mat"];
        let want: Vec<String> = prompts.iter().map(|p| generated(&model, p, 10)).collect();
        for extra in [&[][..], &["--mesh", "1x2", "--threads", "2"][..]] {
            let srv = start(&model, extra);
            let clients: Vec<_> = prompts
                .iter()
                .map(|p| {
                    let (a, p) = (srv.addr.clone(), p.to_string());
                    std::thread::spawn(move || {
                        post(&a, "/v1/completions", &json!({"prompt": p, "max_tokens": 10, "temperature": 0}))
                    })
                })
                .collect();
            for (c, want) in clients.into_iter().zip(&want) {
                let (st, r) = c.join().unwrap();
                assert_eq!(st, 200, "{name} {extra:?}: {r}");
                let text = r["choices"][0]["text"].as_str().unwrap();
                assert!(
                    !text.is_empty() && want.ends_with(text),
                    "{name} {extra:?}: served {text:?}, generate {want:?}"
                );
            }
        }
    }
    let (code, _, err) = redco(&["serve", "--model", s(&fixture_named("t5-tiny")), "--port", "0"]);
    assert_ne!(code, 0);
    assert!(err.contains("decoder-only") && err.contains("t5"), "{err}");
}

/// More of the robustness corpus: 22 further bad requests (wrong types, unsupported
/// sampling fields refused rather than ignored, deep or invalid JSON, wrong methods), each
/// answered 4xx with OpenAI's error JSON and the server alive after it; a client that sends
/// its request a byte at a time while others are served; a stream whose client reads late;
/// and 1,000 requests in a burst from 200 clients against a queue of 32: every one answered
/// 200 or 429 (never a hang or a dropped connection), the queue and the cache empty after,
/// and the greedy text unchanged.
#[test]
fn serve_survives_more_bad_requests_slow_clients_and_a_burst_of_a_thousand() {
    let model = fixture_named("llama-tiny");
    let srv = start(&model, &["--max-queue", "32", "--max-running", "16"]);
    let a = srv.addr.as_str();
    let want = generated(&model, "Hello world", 6);
    let chat = |extra: Value| {
        let mut v = json!({"messages": [{"role": "user", "content": "hi"}]});
        v.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        v
    };
    let deep = format!("{}{}", "[".repeat(2000), "]".repeat(2000));
    let cases: Vec<(&str, &str, Vec<u8>, u16)> = vec![
        ("POST", "/v1/chat/completions", json!({"messages": 5}).to_string().into(), 400),
        ("POST", "/v1/chat/completions", json!({"messages": [{"role": 5, "content": "hi"}]}).to_string().into(), 400),
        ("POST", "/v1/chat/completions", json!({"messages": [{"role": "user", "content": 5}]}).to_string().into(), 400),
        ("POST", "/v1/chat/completions", chat(json!({"model": "nope"})).to_string().into(), 404),
        ("POST", "/v1/chat/completions", chat(json!({"max_tokens": 0})).to_string().into(), 400),
        ("POST", "/v1/chat/completions", chat(json!({"logprobs": true, "top_logprobs": 50})).to_string().into(), 400),
        ("POST", "/v1/completions", json!({"prompt": "x", "top_k": "x"}).to_string().into(), 400),
        ("POST", "/v1/completions", json!({"prompt": "x", "temperature": "hot"}).to_string().into(), 400),
        ("POST", "/v1/completions", json!({"prompt": "x", "seed": "x"}).to_string().into(), 400),
        ("POST", "/v1/completions", json!({"prompt": "x", "n": 100000}).to_string().into(), 400),
        ("POST", "/v1/completions", json!({"prompt": "x", "echo": "yes"}).to_string().into(), 400),
        ("POST", "/v1/completions", json!({"prompt": "x", "stop_token_ids": [-1]}).to_string().into(), 400),
        ("POST", "/v1/completions", json!({"prompt": [[1, 2], [3, -1]]}).to_string().into(), 400),
        ("POST", "/v1/completions", json!({"prompt": "x", "stop": ["a", "b", "c", "d", "e"]}).to_string().into(), 400),
        ("POST", "/v1/completions", json!({"prompt": "x", "max_tokens": 1.5}).to_string().into(), 400),
        (
            "POST",
            "/v1/completions",
            json!({"prompt": "x", "stream_options": {"include_usage": "x"}}).to_string().into(),
            400,
        ),
        ("POST", "/v1/completions", json!({"prompt": "x", "presence_penalty": 0.5}).to_string().into(), 400),
        ("POST", "/v1/completions", json!({"prompt": "x", "logit_bias": {"5": 100}}).to_string().into(), 400),
        ("POST", "/v1/completions", deep.into_bytes(), 400),
        ("POST", "/v1/completions", b"{\"prompt\":\"\xff\xfe\"}".to_vec(), 400),
        ("GET", "/v1/completions", Vec::new(), 405),
        ("DELETE", "/v1/models", Vec::new(), 405),
    ];
    for (method, path, body, code) in &cases {
        let (st, text) = http(a, method, path, body);
        assert_eq!(st, *code, "{method} {path} {}: {text}", String::from_utf8_lossy(&body[..body.len().min(80)]));
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{method} {path}: {e}: {text}"));
        assert!(v["error"]["message"].is_string() && v["error"]["type"].is_string(), "{text}");
        alive(a);
    }
    // fields this server does not implement: a 400 naming each, never an answer that
    // ignores them
    let refused = [
        (
            "/v1/completions",
            json!({"prompt": "x", "tools": [{"type": "function", "function": {"name": "f"}}]}),
            "tools",
        ),
        ("/v1/chat/completions", chat(json!({"tool_choice": "required"})), "tool_choice"),
        ("/v1/chat/completions", chat(json!({"functions": [{"name": "f"}]})), "functions"),
        ("/v1/chat/completions", json!({"messages": [{"role": "wizard", "content": "hi"}]}), "messages[0].role"),
        ("/v1/chat/completions", json!({"messages": [{"role": "function", "content": "4"}]}), "messages[0].role"),
        ("/v1/chat/completions", chat(json!({"prompt": "x"})), "prompt"),
        ("/v1/completions", json!({"prompt": "x", "best_of": 3}), "best_of"),
        ("/v1/completions", json!({"prompt": "x", "suffix": "end"}), "suffix"),
        ("/v1/completions", json!({"prompt": "x", "guided_grammar": "root ::= \"a\""}), "guided_grammar"),
        ("/v1/completions", json!({"prompt": "x", "ignore_eos": true}), "ignore_eos"),
    ];
    for (path, body, param) in &refused {
        let (st, v) = post(a, path, body);
        assert_eq!((st, v["error"]["param"].as_str()), (400, Some(*param)), "{body}: {v}");
        assert!(v["error"]["message"].as_str().unwrap().contains(param.split('.').next().unwrap()), "{v}");
        alive(a);
    }
    // `user` is accepted and ignored (docs/serving.md: the fields accepted and ignored)
    let (st, r) = post(a, "/v1/completions", &json!({"prompt": "x", "max_tokens": 2, "user": "u-17", "best_of": 1}));
    assert_eq!(st, 200, "{r}");
    // neutral values of the refused fields are accepted
    let (st, r) =
        post(a, "/v1/completions", &json!({"prompt": "x", "max_tokens": 2, "presence_penalty": 0, "logit_bias": {}}));
    assert_eq!(st, 200, "{r}");
    // a client sending its request a byte at a time does not hold up the others
    let body = json!({"prompt": "Hello world", "max_tokens": 6, "temperature": 0}).to_string();
    let raw = format!("POST /v1/completions HTTP/1.0\r\nContent-Length: {}\r\n\r\n{body}", body.len());
    let slow_addr = a.to_string();
    let slow = std::thread::spawn(move || {
        let mut c = TcpStream::connect(&slow_addr).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        for b in raw.as_bytes() {
            c.write_all(&[*b]).unwrap();
            std::thread::sleep(Duration::from_millis(15));
        }
        let mut out = String::new();
        c.read_to_string(&mut out).unwrap();
        (Instant::now(), out)
    });
    std::thread::sleep(Duration::from_millis(200));
    let (st, r) = post(a, "/v1/completions", &json!({"prompt": "Hello world", "max_tokens": 6, "temperature": 0}));
    let served = Instant::now();
    assert_eq!(st, 200, "{r}");
    let (slow_done, out) = slow.join().unwrap();
    assert!(served < slow_done, "a byte-at-a-time client held up another request");
    let slow_text: Value = serde_json::from_str(out.split_once("\r\n\r\n").unwrap().1).unwrap();
    assert_eq!(slow_text["choices"][0]["text"], r["choices"][0]["text"]);
    assert!(want.ends_with(r["choices"][0]["text"].as_str().unwrap()), "{r} against {want:?}");
    // a stream whose client reads late still ends with [DONE]
    let mut c = TcpStream::connect(a).unwrap();
    let body = json!({"prompt": "late reader", "max_tokens": 30, "temperature": 0, "stream": true}).to_string();
    c.write_all(format!("POST /v1/completions HTTP/1.0\r\nContent-Length: {}\r\n\r\n{body}", body.len()).as_bytes())
        .unwrap();
    std::thread::sleep(Duration::from_secs(1));
    c.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut out = String::new();
    c.read_to_string(&mut out).unwrap();
    assert!(out.contains("data: [DONE]"), "{out}");
    // a burst of 1,000 requests from 200 clients against a queue of 32
    let (ok, full) = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..200)
            .map(|i| {
                sc.spawn(move || {
                    let (mut ok, mut full) = (0, 0);
                    for j in 0..5 {
                        let ask = json!({"prompt": format!("burst {i} {j}"), "max_tokens": 2, "temperature": 0});
                        let (st, r) = post(a, "/v1/completions", &ask);
                        match st {
                            200 => {
                                assert_eq!(r["usage"]["completion_tokens"], 2, "{r}");
                                ok += 1;
                            }
                            429 => {
                                assert!(r["error"]["message"].as_str().unwrap().contains("queue"), "{r}");
                                full += 1;
                            }
                            other => panic!("burst request answered {other}: {r}"),
                        }
                    }
                    (ok, full)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).fold((0, 0), |(a, b), (c, d)| (a + c, b + d))
    });
    assert_eq!(ok + full, 1000, "every request of the burst answered");
    assert!(ok > 0, "{ok} served, {full} refused");
    let t = Instant::now();
    loop {
        let (_, m) = http(a, "GET", "/metrics", b"");
        let get = |k: &str| m.lines().find_map(|l| l.strip_prefix(&format!("{k} "))?.parse::<u64>().ok()).unwrap();
        if get("redco_queue_length") == 0 && get("redco_running_sequences") == 0 && get("redco_kv_blocks_used") == 0 {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(30), "the burst left work behind:\n{m}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let (st, r) = post(a, "/v1/completions", &json!({"prompt": "Hello world", "max_tokens": 6, "temperature": 0}));
    assert_eq!(st, 200);
    assert!(want.ends_with(r["choices"][0]["text"].as_str().unwrap()), "after the burst: {r} against {want:?}");
}
