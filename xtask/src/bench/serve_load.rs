//! The load generator of `bench serve`: a fixed set of streamed completion requests sent by
//! concurrent clients to any OpenAI-compatible server (redco's or the peer's), and what each
//! level of concurrency measured.
//!
//! Prompts are text: words of the model's word-level vocabulary joined by spaces, so both
//! servers tokenize them alike (the counts come back in each response's `usage`); the
//! words and the output lengths are drawn from a fixed seed, the same at every level and
//! for every server.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// One request's timings: first token (s after sending), the gaps between text chunks (s),
/// and the output tokens as the server counted them.
pub(super) struct Timing {
    first: f64,
    gaps: Vec<f64>,
    tokens: usize,
}

/// What one level of concurrency measured.
pub(super) struct Level {
    /// Clients sending at once.
    pub concurrency: usize,
    /// Requests completed.
    pub requests: usize,
    /// Requests per second.
    pub rps: f64,
    /// Output tokens per second (the servers' own counts).
    pub tok_s: f64,
    /// Time to first token, p50 and p99 (s).
    pub ttft: [f64; 2],
    /// Time between streamed tokens, p50 and p99 (s).
    pub itl: [f64; 2],
    /// The most KV blocks in use (sampled from `/metrics`; 0 where the server has no such metric).
    pub kv_blocks: u64,
    /// The server's peak resident set while the level ran (kB).
    pub rss_kb: u64,
}

/// A small deterministic generator (the request set is the same in every run).
pub(super) struct Lcg(pub u64);

impl Lcg {
    /// A number below `n`.
    pub fn next(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (self.0 >> 33) % n.max(1)
    }
}

/// The words of a `tokenizer.json`'s vocabulary that are not special tokens (sorted, so
/// the draw does not depend on the file's key order).
pub(super) fn vocabulary_words(tokenizer_json: &str) -> Result<Vec<String>, String> {
    let t: serde_json::Value = serde_json::from_str(tokenizer_json).map_err(|e| format!("tokenizer.json: {e}"))?;
    let special: Vec<&str> = t["added_tokens"]
        .as_array()
        .map(|a| a.iter().filter_map(|x| x["content"].as_str()).collect())
        .unwrap_or_default();
    let mut words: Vec<String> = t["model"]["vocab"]
        .as_object()
        .map(|v| v.keys().filter(|k| !special.contains(&k.as_str()) && !k.contains(' ')).cloned().collect())
        .unwrap_or_default();
    words.sort();
    if words.is_empty() {
        return Err("tokenizer.json has no word-level vocabulary to draw prompts from".into());
    }
    Ok(words)
}

/// One request: the prompt text and the tokens asked for.
pub(super) type Request = (String, usize);

/// A request drawn from `g`: 16-128 words, 16-64 output tokens.
pub(super) fn draw(g: &mut Lcg, words: &[String]) -> Request {
    let len = 16 + g.next(113) as usize;
    let prompt: Vec<&str> = (0..len).map(|_| words[g.next(words.len() as u64) as usize].as_str()).collect();
    (prompt.join(" "), 16 + g.next(49) as usize)
}

/// A connection to `addr` that has sent `body` as `POST /v1/completions` (HTTP/1.0: the
/// server closes it after the answer), reads bounded by 10 minutes.
fn post(addr: &str, body: &str) -> Result<TcpStream, String> {
    let mut c = TcpStream::connect(addr).map_err(|e| format!("{addr}: {e}"))?;
    c.set_read_timeout(Some(Duration::from_secs(600))).map_err(|e| e.to_string())?;
    write!(
        c,
        "POST /v1/completions HTTP/1.0\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .map_err(|e| e.to_string())?;
    Ok(c)
}

/// Streams one completion of `prompt` (`max_tokens` new tokens, greedy, with the fields of
/// `extra` added when it is an object): its timings.
pub(super) fn stream_one(
    addr: &str,
    prompt: &str,
    max_tokens: usize,
    extra: &serde_json::Value,
) -> Result<Timing, String> {
    let mut body = serde_json::json!({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": true,
        "stream_options": {"include_usage": true}});
    if let (Some(b), Some(x)) = (body.as_object_mut(), extra.as_object()) {
        b.extend(x.clone());
    }
    let body = body.to_string();
    let t0 = Instant::now();
    let mut r = BufReader::new(post(addr, &body)?);
    let mut status = String::new();
    r.read_line(&mut status).map_err(|e| e.to_string())?;
    if !status.contains(" 200") {
        let mut rest = String::new();
        let _ = std::io::Read::read_to_string(&mut r, &mut rest);
        return Err(format!("{addr} answered {}: {}", status.trim(), rest.trim()));
    }
    let (mut first, mut last, mut gaps, mut tokens) = (None, 0.0, Vec::new(), None);
    let mut line = String::new();
    loop {
        line.clear();
        if r.read_line(&mut line).map_err(|e| e.to_string())? == 0 {
            break;
        }
        let Some(data) = line.trim_end().strip_prefix("data: ") else { continue };
        if data == "[DONE]" {
            break;
        }
        let v: serde_json::Value = serde_json::from_str(data).map_err(|e| format!("{e}: {data}"))?;
        if v.get("error").is_some() {
            return Err(format!("the server failed a request: {data}"));
        }
        if let Some(n) = v["usage"]["completion_tokens"].as_u64() {
            // the last chunk: the tokens as the server counted them
            tokens = Some(n as usize);
            continue;
        }
        let now = t0.elapsed().as_secs_f64();
        let has_text = v["choices"][0]["text"].as_str().is_some_and(|t| !t.is_empty());
        if has_text {
            match first {
                None => first = Some(now),
                Some(_) => gaps.push(now - last),
            }
            last = now;
        }
    }
    let first = first.ok_or("a request streamed no token")?;
    let tokens = tokens.ok_or("a stream ended without its usage chunk")?;
    Ok(Timing { first, gaps, tokens })
}

/// The `p` quantile of `v` (sorted in place); NaN when empty.
fn percentile(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * p).round() as usize]
}

/// Process `pid`'s resident set, kB.
pub(super) fn rss_kb(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines().find_map(|l| l.strip_prefix("VmRSS:")?.trim().strip_suffix("kB")?.trim().parse().ok())
}

/// A metric of the server's `/metrics` (None where it has no such metric).
pub(super) fn metric(addr: &str, name: &str) -> Option<u64> {
    let mut c = TcpStream::connect(addr).ok()?;
    c.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(c, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut s = String::new();
    std::io::Read::read_to_string(&mut c, &mut s).ok()?;
    s.lines().find_map(|l| l.strip_prefix(&format!("{name} "))?.parse().ok())
}

/// Whether `GET /health` answers 200.
pub(super) fn healthy(addr: &str) -> bool {
    let Ok(mut c) = TcpStream::connect(addr) else { return false };
    if c.set_read_timeout(Some(Duration::from_secs(5))).is_err()
        || write!(c, "GET /health HTTP/1.0\r\nHost: {addr}\r\n\r\n").is_err()
    {
        return false;
    }
    let mut s = String::new();
    let _ = BufReader::new(c).read_line(&mut s);
    s.contains(" 200")
}

/// One client's timings, or why it stopped.
type ClientTimings = Result<Vec<Timing>, String>;

/// Runs one level: `reqs.len()` clients at once, each sending its requests in turn (none
/// started after `max_s`; each with the fields of `extra`), while the server's KV blocks in use and its resident set (process
/// `pid`) are sampled every 250 ms.
pub(super) fn run_level(
    addr: &str,
    pid: u32,
    reqs: &[Vec<Request>],
    max_s: f64,
    extra: &serde_json::Value,
) -> Result<Level, String> {
    let t0 = Instant::now();
    let done = std::sync::atomic::AtomicBool::new(false);
    let (timings, (blocks, rss)): (Vec<ClientTimings>, (u64, u64)) = std::thread::scope(|sc| {
        // the KV blocks in use and the server's RSS, sampled while the level runs: the largest
        let sampler = sc.spawn(|| {
            let (mut blocks, mut rss) = (0, 0);
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                blocks = blocks.max(metric(addr, "redco_kv_blocks_used").unwrap_or(0));
                rss = rss.max(rss_kb(pid).unwrap_or(0));
                std::thread::sleep(Duration::from_millis(250));
            }
            (blocks, rss)
        });
        let hs: Vec<_> = reqs
            .iter()
            .map(|mine| {
                sc.spawn(move || {
                    let mut out = Vec::new();
                    for (p, n) in mine {
                        if t0.elapsed().as_secs_f64() > max_s {
                            break;
                        }
                        out.push(stream_one(addr, p, *n, extra)?);
                    }
                    Ok(out)
                })
            })
            .collect();
        let t: Vec<_> =
            hs.into_iter().map(|h| h.join().unwrap_or_else(|_| Err("a client thread panicked".into()))).collect();
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        (t, sampler.join().unwrap_or((0, 0)))
    });
    let wall = t0.elapsed().as_secs_f64();
    let all: Vec<Timing> = timings.into_iter().collect::<Result<Vec<_>, _>>()?.into_iter().flatten().collect();
    let tokens: usize = all.iter().map(|t| t.tokens).sum();
    let mut firsts: Vec<f64> = all.iter().map(|t| t.first).collect();
    let mut gaps: Vec<f64> = all.iter().flat_map(|t| t.gaps.iter().copied()).collect();
    Ok(Level {
        concurrency: reqs.len(),
        requests: all.len(),
        rps: all.len() as f64 / wall,
        tok_s: tokens as f64 / wall,
        ttft: [percentile(&mut firsts, 0.5), percentile(&mut firsts, 0.99)],
        itl: [percentile(&mut gaps, 0.5), percentile(&mut gaps, 0.99)],
        kv_blocks: blocks,
        rss_kb: rss,
    })
}

/// Prints a table of levels (`x conc 1`: tokens/s against the first level's).
pub(super) fn print_levels(title: &str, rows: &[Level]) {
    println!("\n{title}");
    println!(
        "{:>5} {:>8} {:>8} {:>10} {:>9} {:>9} {:>9} {:>9} {:>8} {:>10} {:>9}",
        "conc",
        "requests",
        "req/s",
        "out tok/s",
        "TTFT p50",
        "TTFT p99",
        "ITL p50",
        "ITL p99",
        "x conc 1",
        "KV blocks",
        "peak RSS"
    );
    let base = rows.first().map_or(f64::NAN, |r| r.tok_s);
    for r in rows {
        println!(
            "{:>5} {:>8} {:>8.2} {:>10.1} {:>8.3}s {:>8.3}s {:>8.3}s {:>8.3}s {:>8.2} {:>10} {:>6.0} MB",
            r.concurrency,
            r.requests,
            r.rps,
            r.tok_s,
            r.ttft[0],
            r.ttft[1],
            r.itl[0],
            r.itl[1],
            r.tok_s / base,
            r.kv_blocks,
            r.rss_kb as f64 / 1024.0
        );
    }
}

/// A level as JSON.
pub(super) fn level_json(r: &Level) -> serde_json::Value {
    serde_json::json!({"concurrency": r.concurrency, "requests": r.requests,
        "requests_per_s": r.rps, "output_tokens_per_s": r.tok_s, "ttft_p50_s": r.ttft[0], "ttft_p99_s": r.ttft[1],
        "itl_p50_s": r.itl[0], "itl_p99_s": r.itl[1], "kv_blocks_used_peak": r.kv_blocks, "peak_rss_kb": r.rss_kb})
}

/// One greedy completion of `prompt`, not streamed: its text.
pub(super) fn complete(addr: &str, prompt: &str, max_tokens: usize) -> Result<String, String> {
    let body = serde_json::json!({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0}).to_string();
    let mut c = post(addr, &body)?;
    let mut s = String::new();
    std::io::Read::read_to_string(&mut c, &mut s).map_err(|e| e.to_string())?;
    let json = s.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    let v: serde_json::Value = serde_json::from_str(json).map_err(|e| format!("{addr}: {e}: {s}"))?;
    v["choices"][0]["text"].as_str().map(str::to_string).ok_or_else(|| format!("{addr}: no text in {json}"))
}
