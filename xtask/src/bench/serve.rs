//! `cargo xtask bench serve`: `redco serve` on loopback under a fixed set of requests at
//! several concurrencies, as a user's clients would load it (the binary beside this
//! program: `cargo build --release -p redco`).
//!
//! The model: `--preset` (default llama-134m) with the weights of one training step,
//! written by `redco train`. The requests: prompt lengths and output lengths drawn from a
//! fixed seed (prompts as token ids, `max_tokens` fixed per request, greedy, no stop), each
//! streamed, so the client sees its first token and every later one. At each concurrency
//! (`--concurrency 1,8,32,128`), that many clients send `--requests` each (bounded by
//! `--max-seconds` per level). Printed per level: requests/s, output tokens/s, time to first
//! token and the time between tokens (p50, p99), output tokens/s against concurrency 1's,
//! the most KV blocks in use (sampled from `/metrics`) and the server's peak RSS; then the
//! preemptions the run needed (a small `--kv-memory` makes the engine preempt). `--mesh 1xN` serves over N tensor-parallel thread ranks. With `--soak SECONDS`, one more level after the
//! others: `--soak-concurrency` clients (default 8) send requests until the time is up,
//! and the server's RSS is sampled every 5 s (printed: first, largest, last). Not yet:
//! `--peer PY` (transformers serve).

use super::memory::redco_beside;
use crate::args::Args;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// One request's timings: first token (s after sending), the gaps between tokens (s), tokens.
struct Timing {
    first: f64,
    gaps: Vec<f64>,
    tokens: usize,
}

/// A small deterministic generator (the request set is the same in every run).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (self.0 >> 33) % n.max(1)
    }
}

/// Streams one completion of `prompt` (`max_tokens` new tokens): its timings.
fn stream_one(addr: &str, prompt: &[i64], max_tokens: usize) -> Result<Timing, String> {
    let body = serde_json::json!({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": true,
        "stream_options": {"include_usage": true}})
    .to_string();
    let mut c = TcpStream::connect(addr).map_err(|e| format!("{addr}: {e}"))?;
    c.set_read_timeout(Some(Duration::from_secs(600))).map_err(|e| e.to_string())?;
    let t0 = Instant::now();
    write!(
        c,
        "POST /v1/completions HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .map_err(|e| e.to_string())?;
    let mut r = BufReader::new(c);
    let (mut first, mut last, mut gaps, mut tokens) = (None, 0.0, Vec::new(), 0);
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
            tokens = n as usize;
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
    Ok(Timing { first, gaps, tokens })
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * p).round() as usize]
}

/// A metric of `/metrics`.
/// One client's timings, or why it stopped.
type ClientTimings = Result<Vec<Timing>, String>;

/// Process `pid`'s resident set, kB.
fn rss_kb(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines().find_map(|l| l.strip_prefix("VmRSS:")?.trim().strip_suffix("kB")?.trim().parse().ok())
}

fn metric(addr: &str, name: &str) -> Option<u64> {
    let mut c = TcpStream::connect(addr).ok()?;
    write!(c, "GET /metrics HTTP/1.0\r\n\r\n").ok()?;
    let mut s = String::new();
    std::io::Read::read_to_string(&mut c, &mut s).ok()?;
    s.lines().find_map(|l| l.strip_prefix(&format!("{name} "))?.parse().ok())
}

/// The server, killed when dropped.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs the benchmark.
pub fn run(argv: &[String]) -> Result<(), String> {
    let a = Args::parse(argv, &[])?;
    a.only(&[
        "preset",
        "concurrency",
        "requests",
        "max-seconds",
        "kv-memory",
        "max-batch-tokens",
        "json",
        "soak",
        "soak-concurrency",
        "mesh",
    ])?;
    let mesh = a.get("mesh").unwrap_or("1x1").to_string();
    let preset = a.get("preset").unwrap_or("llama-134m").to_string();
    let levels: Vec<usize> = a
        .get("concurrency")
        .unwrap_or("1,8,32,128")
        .split(',')
        .map(|x| x.trim().parse().map_err(|_| format!("--concurrency: `{x}` is not a number")))
        .collect::<Result<_, _>>()?;
    let per_client = a.num("requests", 2)?;
    let max_s = a.num("max-seconds", 300)? as f64;
    let redco = redco_beside("cargo build --release -p redco", "bench serve")?;
    let dir = std::env::temp_dir().join(format!("redco-bench-serve-{}", std::process::id()));
    println!("machine: {}", crate::machine::describe());
    eprintln!("xtask: writing the {preset} model (one training step)");
    let o = Command::new(&redco)
        .args([
            "train",
            "--preset",
            &preset,
            "--steps",
            "1",
            "--batch-size",
            "1",
            "--seq-len",
            "8",
            "--sample-tokens",
            "0",
        ])
        .arg("--workdir")
        .arg(&dir)
        .output()
        .map_err(|e| format!("{}: {e}", redco.display()))?;
    if !o.status.success() {
        return Err(format!("redco train failed: {}", String::from_utf8_lossy(&o.stderr).trim()));
    }
    let cfg: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("config.json")).map_err(|e| format!("{}: {e}", dir.display()))?,
    )
    .map_err(|e| e.to_string())?;
    let vocab = cfg["vocab_size"].as_u64().unwrap_or(2).max(2);
    let mut child = Command::new(&redco)
        .args(["serve", "--model"])
        .arg(&dir)
        .args(["--port", "0", "--kv-memory", a.get("kv-memory").unwrap_or("2GB"), "--mesh", &mesh])
        .args([
            "--max-batch-tokens",
            a.get("max-batch-tokens").unwrap_or("256"),
            "--max-running",
            "256",
            "--max-queue",
            "1024",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("{}: {e}", redco.display()))?;
    let mut line = String::new();
    BufReader::new(child.stdout.take().ok_or("no stdout")?).read_line(&mut line).map_err(|e| e.to_string())?;
    let server = Server(child);
    let addr =
        line.split("http://").nth(1).and_then(|r| r.split_whitespace().next()).ok_or(format!("no address: {line}"))?;
    println!("{}", line.trim());
    println!("redco serve --model {preset} (random weights), greedy, streamed; prompts 16-128 tokens, outputs 16-64");
    let pid = server.0.id();
    let mut rows = Vec::new();
    for &c in &levels {
        // the same request set at every level: client i's requests from seed i
        let reqs: Vec<Vec<(Vec<i64>, usize)>> = (0..c)
            .map(|i| {
                let mut g = Lcg(1000 + i as u64);
                (0..per_client)
                    .map(|_| {
                        let len = 16 + g.next(113) as usize;
                        ((0..len).map(|_| g.next(vocab) as i64).collect(), 16 + g.next(49) as usize)
                    })
                    .collect()
            })
            .collect();
        eprintln!("xtask: concurrency {c}: {} requests", c * per_client);
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
                            out.push(stream_one(addr, p, *n)?);
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
        rows.push((
            c,
            all.len(),
            all.len() as f64 / wall,
            tokens as f64 / wall,
            [percentile(&mut firsts, 0.5), percentile(&mut firsts, 0.99)],
            [percentile(&mut gaps, 0.5), percentile(&mut gaps, 0.99)],
            blocks,
            rss,
        ));
    }
    let soak = a.num("soak", 0)? as f64;
    if soak > 0.0 {
        let c = a.num("soak-concurrency", 8)?;
        eprintln!("xtask: soak: {c} clients for {soak} s");
        let rss = || rss_kb(pid);
        let t0 = Instant::now();
        let (samples, served) = std::thread::scope(|sc| {
            let clients: Vec<_> = (0..c)
                .map(|i| {
                    sc.spawn(move || {
                        let mut g = Lcg(5000 + i as u64);
                        let mut n = 0usize;
                        while t0.elapsed().as_secs_f64() < soak {
                            let len = 16 + g.next(113) as usize;
                            let p: Vec<i64> = (0..len).map(|_| g.next(vocab) as i64).collect();
                            if stream_one(addr, &p, 16 + g.next(49) as usize).is_ok() {
                                n += 1;
                            }
                        }
                        n
                    })
                })
                .collect();
            let mut samples = Vec::new();
            while t0.elapsed().as_secs_f64() < soak {
                samples.push((t0.elapsed().as_secs_f64(), rss().unwrap_or(0)));
                std::thread::sleep(Duration::from_secs(5));
            }
            let served: usize = clients.into_iter().map(|h| h.join().unwrap_or(0)).sum();
            (samples, served)
        });
        let mb = |k: u64| k as f64 / 1024.0;
        let first = samples.first().map_or(0, |s| s.1);
        let last = samples.last().map_or(0, |s| s.1);
        let max = samples.iter().map(|s| s.1).max().unwrap_or(0);
        // after the first minute (the pool and the allocator warmed up)
        let warm: Vec<u64> = samples.iter().filter(|s| s.0 >= 60.0).map(|s| s.1).collect();
        let (wmin, wmax) = (warm.iter().min().copied().unwrap_or(0), warm.iter().max().copied().unwrap_or(0));
        println!(
            "soak: {served} requests by {c} clients in {soak:.0} s; server RSS first {:.1} MB, largest {:.1} MB, last {:.1} MB; after the first minute {:.1}-{:.1} MB",
            mb(first), mb(max), mb(last), mb(wmin), mb(wmax)
        );
    }
    let preempted = metric(addr, "redco_preemptions_total").unwrap_or(0);
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
    println!(
        "\n{:>5} {:>8} {:>8} {:>10} {:>9} {:>9} {:>9} {:>9} {:>8} {:>10} {:>9}",
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
    let base = rows.first().map_or(f64::NAN, |r| r.3);
    for (c, n, rps, tps, ttft, itl, blocks, rss) in &rows {
        println!(
            "{c:>5} {n:>8} {rps:>8.2} {tps:>10.1} {:>8.3}s {:>8.3}s {:>8.3}s {:>8.3}s {:>8.2} {blocks:>10} {:>6.0} MB",
            ttft[0],
            ttft[1],
            itl[0],
            itl[1],
            tps / base,
            *rss as f64 / 1024.0
        );
    }
    println!("preemptions: {preempted}");
    if let Some(path) = a.get("json") {
        let rows: Vec<serde_json::Value> = rows
            .iter()
            .map(|(c, n, rps, tps, ttft, itl, blocks, rss)| {
                serde_json::json!({"concurrency": c, "requests": n,
                "requests_per_s": rps, "output_tokens_per_s": tps, "ttft_p50_s": ttft[0], "ttft_p99_s": ttft[1],
                "itl_p50_s": itl[0], "itl_p99_s": itl[1], "kv_blocks_used_peak": blocks, "peak_rss_kb": rss})
            })
            .collect();
        let doc =
            serde_json::json!({"machine": crate::machine::describe(), "preset": preset, "mesh": mesh, "rows": rows});
        std::fs::write(path, doc.to_string()).map_err(|e| format!("{path}: {e}"))?;
    }
    Ok(())
}
