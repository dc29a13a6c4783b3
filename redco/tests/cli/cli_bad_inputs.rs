//! The bad-input suite: every command pointed at bad flags, configs, checkpoints,
//! tokenizers, data files, paths and meshes, as a careless or hostile user would. Each case
//! must end with exit code 2 and a message naming its culprit (the flag, field, file or
//! tensor), within a time limit (no hang) and under an address-space limit (no runaway
//! allocation), and without a panic. The test prints the count by class.
//!
//! Cases that need a run to exist first (workdir ownership, corrupt checkpoints, resume
//! identity) are in `cli_workdir.rs`; together the two files hold more than 150 cases.

use crate::common::{fixture_named, s};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The address space each case may use (a run that tries to allocate terabytes fails
/// against it instead of swapping the machine).
const ADDRESS_SPACE_KIB: u64 = 8 << 20;
/// The longest a case may take before it counts as a hang.
const TIME_LIMIT: Duration = Duration::from_secs(120);

/// One bad input: its class, the command line, the exit code it must end with (2, or 0
/// for a stated warning) and what the message must contain.
struct Case {
    class: &'static str,
    args: Vec<String>,
    code: i32,
    says: Vec<String>,
}

/// How a case ended.
enum End {
    Exited(i32, String),
    Killed(String),
    Hung,
}

fn run(args: &[String]) -> End {
    // `ulimit -v` bounds the address space of the command it `exec`s
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(format!("ulimit -v {ADDRESS_SPACE_KIB} && exec \"$0\" \"$@\""))
        .arg(env!("CARGO_BIN_EXE_redco"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start redco");
    let start = Instant::now();
    loop {
        match child.try_wait().expect("wait for redco") {
            Some(status) => {
                let mut err = String::new();
                if let Some(mut e) = child.stderr.take() {
                    let _ = std::io::Read::read_to_string(&mut e, &mut err);
                }
                return match status.code() {
                    Some(c) => End::Exited(c, err),
                    None => End::Killed(err),
                };
            }
            None if start.elapsed() > TIME_LIMIT => {
                let _ = child.kill();
                let _ = child.wait();
                return End::Hung;
            }
            None => std::thread::sleep(Duration::from_millis(5)),
        }
    }
}

/// The suite's scratch directory, with a copy of a fixture made on demand.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Scratch {
        let d = crate::common::scratch_dir("bad-inputs", "all");
        std::fs::create_dir_all(&d).unwrap();
        Scratch(d)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }

    /// A file `name` holding `body`.
    fn file(&self, name: &str, body: &[u8]) -> String {
        let p = self.path(name);
        std::fs::write(&p, body).unwrap();
        s(&p).to_string()
    }

    /// A copy of fixture `fixture` named `name`, then changed by `edit`.
    fn model(&self, fixture: &str, name: &str, edit: impl FnOnce(&Path)) -> String {
        let from = fixture_named(fixture);
        let to = self.path(name);
        std::fs::create_dir_all(&to).unwrap();
        for e in std::fs::read_dir(&from).unwrap() {
            let e = e.unwrap();
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
        edit(&to);
        s(&to).to_string()
    }

    /// A llama-tiny copy whose config.json has `key` set to `value` (or removed: null).
    fn config(&self, name: &str, key: &str, value: serde_json::Value) -> String {
        self.model("llama-tiny", name, |d| {
            let p = d.join("config.json");
            let mut c: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
            if value.is_null() {
                c.as_object_mut().unwrap().remove(key);
            } else {
                c[key] = value;
            }
            std::fs::write(&p, c.to_string()).unwrap();
        })
    }
}

/// A safetensors file of the given header and data.
fn safetensors(header: &serde_json::Value, data: &[u8]) -> Vec<u8> {
    let h = header.to_string().into_bytes();
    let mut v = (h.len() as u64).to_le_bytes().to_vec();
    v.extend(h);
    v.extend(data);
    v
}

/// llama-tiny's weights with one tensor's entry changed by `edit`.
fn edited_weights(d: &Path, tensor: &str, edit: impl FnOnce(&mut serde_json::Value)) {
    let p = d.join("model.safetensors");
    let bytes = std::fs::read(&p).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    edit(&mut header[tensor]);
    std::fs::write(&p, safetensors(&header, &bytes[8 + n..])).unwrap();
}

fn case(class: &'static str, args: &[&str], says: &[&str]) -> Case {
    Case { class, args: strings(args), code: 2, says: strings(says) }
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

/// Every case, built in `t`.
fn cases(t: &Scratch) -> Vec<Case> {
    let good = s(&fixture_named("llama-tiny")).to_string();
    let t5 = s(&fixture_named("t5-tiny")).to_string();
    let g = good.as_str();
    let inputs = s(&fixture_named("llama-tiny").join("inputs.safetensors")).to_string();
    let out = s(&t.path("dump.safetensors")).to_string();
    let w = s(&t.path("w")).to_string();
    // a prompt and two new tokens unless the case says otherwise
    let gen_case = |class, m: &str, extra: &[&str], says: &[&str]| {
        let mut args = strings(&["generate", "--model", m]);
        if !extra.contains(&"--prompts-file") {
            args.extend(strings(&["--prompt", "hello"]));
        }
        if !extra.contains(&"--max-new-tokens") {
            args.extend(strings(&["--max-new-tokens", "2"]));
        }
        args.extend(strings(extra));
        Case { class, args, code: 2, says: strings(says) }
    };
    // one step into a workdir of its own (a case that trained by mistake cannot make the
    // next one fail for the wrong reason)
    let runs = std::cell::Cell::new(0);
    let fresh_workdir = || {
        runs.set(runs.get() + 1);
        s(&t.path(&format!("w{}", runs.get()))).to_string()
    };
    let train_with = |class, model: &[&str], extra: &[&str], says: &[&str]| {
        let mut args = strings(&["train"]);
        args.extend(strings(model));
        args.extend(strings(&["--steps", "1", "--workdir", &fresh_workdir()]));
        args.extend(strings(extra));
        Case { class, args, code: 2, says: strings(says) }
    };
    let train_case = |class, extra: &[&str], says: &[&str]| train_with(class, &["--preset", "llama-tiny"], extra, says);
    let plan = |m: &str, extra: &[&str]| -> Vec<String> {
        let mut v = strings(&["plan", "--model", m, "--seq", "16"]);
        v.extend(strings(extra));
        v
    };
    let plan_case = |class, m: &str, extra: &[&str], says: &[&str]| Case {
        class,
        args: plan(m, extra),
        code: 2,
        says: strings(says),
    };
    let mut v = vec![
        // ---- flags: values out of range, of the wrong kind, or unknown names
        train_case("flag", &["--lr", "inf"], &["--lr"]),
        train_case("flag", &["--lr", "abc"], &["--lr"]),
        train_case("flag", &["--warmup", "-1"], &["--warmup"]),
        train_case("flag", &["--schedule", "step"], &["--schedule", "step"]),
        train_case("flag", &["--optimizer", "lamb"], &["--optimizer", "lamb"]),
        train_case("flag", &["--recompute", "everything"], &["--recompute", "everything"]),
        train_with("flag", &["--model", &t5], &["--zero", "3", "--mesh", "2x1"], &["--zero 3", "t5"]),
        train_case("flag", &["--zero", "4"], &["--zero", "4"]),
        train_case("flag", &["--zero", "1", "--optimizer", "sgd"], &["--zero 1", "sgd"]),
        plan_case("flag", g, &["--recompute", "half"], &["--recompute", "half"]),
        train_case("flag", &["--dtype", "f8"], &["f8"]),
        train_case("flag", &["--steps", "abc"], &["--steps"]),
        train_case("flag", &["--steps", "-5"], &["--steps"]),
        train_case("flag", &["--seed", "-1"], &["--seed"]),
        train_case("flag", &["--batch-size", "1e3"], &["--batch-size"]),
        train_case("flag", &["--backend", "tpu9"], &["tpu9"]),
        train_with("flag", &["--preset", "llama-huge"], &[], &["llama-huge"]),
        train_case("flag", &["--weight-decay", "nan"], &["--weight-decay"]),
        train_case("flag", &["--epochs", "-1"], &["--epochs"]),
        train_case("flag", &["--no-such-flag"], &["--no-such-flag"]),
        gen_case("flag", g, &["--temperature", "nan"], &["--temperature"]),
        gen_case("flag", g, &["--temperature", "inf"], &["--temperature"]),
        gen_case("flag", g, &["--top-p", "0"], &["--top-p"]),
        gen_case("flag", g, &["--top-p=-0.5"], &["--top-p"]),
        gen_case("flag", g, &["--top-k", "-3"], &["--top-k"]),
        gen_case("flag", g, &["--dtype", "int8"], &["int8"]),
        gen_case("flag", g, &["--backend", "cuda9"], &["cuda9"]),
        gen_case("flag", g, &["--threads", "100000"], &["--threads"]),
        gen_case("flag", g, &["--max-new-tokens", "-1"], &["--max-new-tokens"]),
        gen_case("flag", g, &["--seed", "x"], &["--seed"]),
        plan_case("flag", g, &["--dtype", "f8"], &["f8"]),
        plan_case("flag", g, &["--device-memory", "lots"], &["--device-memory", "lots"]),
        plan_case("flag", g, &["--device-memory", "0GB"], &["--device-memory"]),
        plan_case("flag", g, &["--batch", "-1"], &["--batch"]),
        case("flag", &["eval-dump", "--model", g, "--inputs", &inputs, "--out", &out, "--dtype", "f7"], &["f7"]),
        case("flag", &["eval-dump", "--model", g, "--inputs", &inputs, "--out", &out, "--backend", "x"], &["`x`"]),
        case("flag", &["convert", "--to", "onnx", "--input", g, "--out", &w], &["--to", "onnx"]),
        case("flag", &["convert", "--to", "redco", "--input", g, "--out", &w, "--dtype", "f9"], &["f9"]),
        case(
            "flag",
            &["convert", "--to", "redco", "--input", g, "--out", &w, "--max-shard-bytes", "0"],
            &["--max-shard-bytes"],
        ),
        case("flag", &["info", "--verbose"], &["--verbose"]),
        case("flag", &["frobnicate"], &["frobnicate"]),
        // ---- meshes that are malformed or do not fit the model or the machine
        train_case("mesh", &["--mesh", "0x1"], &["0x1"]),
        train_case("mesh", &["--mesh", "2"], &["2"]),
        train_case("mesh", &["--mesh", "axb"], &["axb"]),
        train_case("mesh", &["--mesh", "64x64"], &["64x64"]),
        train_case("mesh", &["--mesh", "2x1", "--batch-size", "3"], &["--batch-size", "3"]),
        train_case("mesh", &["--mesh", "1x2", "--threads", "1"], &["1x2", "--threads 1"]),
        gen_case("mesh", g, &["--mesh", "1x0"], &["1x0"]),
        gen_case("mesh", g, &["--mesh", "99x1"], &["99x1"]),
        plan_case("mesh", g, &["--mesh", "1x3", "--strict"], &["3"]),
        plan_case("mesh", g, &["--mesh", "0x0"], &["0x0"]),
        case("mesh", &["eval-dump", "--model", g, "--inputs", &inputs, "--out", &out, "--mesh", "x2"], &["x2"]),
        case("mesh", &["convert", "--to", "redco", "--input", g, "--out", &w, "--mesh", "0x2"], &["0x2"]),
        // ---- paths that do not exist or are the wrong kind of thing
        case("path", &["generate", "--model", "/nonexistent/model", "--prompt", "a"], &["/nonexistent/model"]),
        plan_case("path", "/nonexistent/model", &[], &["/nonexistent/model"]),
        case(
            "path",
            &["eval-dump", "--model", "/nonexistent/m", "--inputs", &inputs, "--out", &out],
            &["/nonexistent/m"],
        ),
        case(
            "path",
            &["eval-dump", "--model", g, "--inputs", "/nonexistent/in.safetensors", "--out", &out],
            &["/nonexistent/in.safetensors"],
        ),
        case(
            "path",
            &["eval-dump", "--model", g, "--inputs", &inputs, "--out", "/nonexistent/dir/out.safetensors"],
            &["/nonexistent/dir/out.safetensors"],
        ),
        case("path", &["convert", "--to", "hf", "--input", "/nonexistent/w", "--out", &w], &["/nonexistent/w"]),
        case("path", &["convert", "--to", "redco", "--input", "/nonexistent/hf", "--out", &w], &["/nonexistent/hf"]),
        case("path", &["convert", "--to", "hf", "--input", g, "--out", &w], &[g]),
        train_case("path", &["--data", "/nonexistent/data.jsonl"], &["/nonexistent/data.jsonl"]),
        train_with("path", &["--model", "/nonexistent/hf"], &[], &["/nonexistent/hf"]),
        gen_case("path", g, &["--prompts-file", "/nonexistent/prompts.txt"], &["/nonexistent/prompts.txt"]),
        case("path", &["generate", "--model", g], &["--prompt"]),
    ];
    // ---- config.json: missing, not JSON, wrong types, sizes that cannot be, features not implemented
    let cfg_cases: Vec<(&str, &str, serde_json::Value, &[&str])> = vec![
        ("c-heads0", "num_attention_heads", serde_json::json!(0), &["heads"]),
        ("c-heads-div", "num_attention_heads", serde_json::json!(5), &["5"]),
        ("c-hidden-neg", "hidden_size", serde_json::json!(-32), &["hidden_size"]),
        ("c-hidden-float", "hidden_size", serde_json::json!(32.5), &["hidden_size"]),
        ("c-vocab0", "vocab_size", serde_json::json!(0), &["vocab"]),
        ("c-vocab-missing", "vocab_size", serde_json::Value::Null, &["vocab_size"]),
        ("c-layers-str", "num_hidden_layers", serde_json::json!("2"), &["num_hidden_layers"]),
        ("c-layers-huge", "num_hidden_layers", serde_json::json!(1u64 << 50), &["num_hidden_layers"]),
        ("c-inter-huge", "intermediate_size", serde_json::json!(1u64 << 45), &["intermediate_size"]),
        ("c-type", "model_type", serde_json::json!("bert"), &["bert"]),
        ("c-type-num", "model_type", serde_json::json!(7), &["model_type"]),
        ("c-eps", "rms_norm_eps", serde_json::json!(-1.0), &["rms_norm_eps"]),
        ("c-pos0", "max_position_embeddings", serde_json::json!(1u64 << 48), &["max_position"]),
        ("c-rope-dyn", "rope_scaling", serde_json::json!({"rope_type": "dynamic", "factor": 2.0}), &["dynamic"]),
        (
            "c-rope-llama3",
            "rope_parameters",
            serde_json::json!({"rope_type": "llama3", "rope_theta": 1e4}),
            &["llama3"],
        ),
        ("c-tie-str", "tie_word_embeddings", serde_json::json!("yes"), &["tie_word_embeddings"]),
        ("c-headdim0", "head_dim", serde_json::json!(0), &["head"]),
    ];
    for (name, key, value, says) in cfg_cases {
        let m = t.config(name, key, value);
        v.push(plan_case("config", &m, &[], says));
        if name.ends_with("heads0") || name.ends_with("type") || name.ends_with("vocab0") {
            v.push(gen_case("config", &m, &[], says));
        }
    }
    let no_cfg = t.model("llama-tiny", "c-none", |d| std::fs::remove_file(d.join("config.json")).unwrap());
    v.push(plan_case("config", &no_cfg, &[], &["config.json"]));
    v.push(gen_case("config", &no_cfg, &[], &["config.json"]));
    for (name, body) in [("c-garbage", "{\"hidden_size\": 32,"), ("c-array", "[1, 2, 3]"), ("c-empty", "")] {
        let m = t.model("llama-tiny", name, |d| std::fs::write(d.join("config.json"), body).unwrap());
        v.push(plan_case("config", &m, &[], &["config.json"]));
    }
    // ---- checkpoints: truncated, garbage, wrong shapes, dtypes and names
    let cut = t.model("llama-tiny", "k-cut", |d| {
        let p = d.join("model.safetensors");
        let b = std::fs::read(&p).unwrap();
        std::fs::write(&p, &b[..b.len() / 2]).unwrap();
    });
    v.push(gen_case("checkpoint", &cut, &[], &["model.safetensors"]));
    let garbage = t.model("llama-tiny", "k-garbage", |d| {
        std::fs::write(d.join("model.safetensors"), b"not a safetensors file at all").unwrap()
    });
    v.push(gen_case("checkpoint", &garbage, &[], &["model.safetensors"]));
    let huge = t.model("llama-tiny", "k-hdr", |d| {
        let mut b = u64::MAX.to_le_bytes().to_vec();
        b.extend(b"{}");
        std::fs::write(d.join("model.safetensors"), b).unwrap();
    });
    v.push(gen_case("checkpoint", &huge, &[], &["model.safetensors"]));
    let none = t.model("llama-tiny", "k-none", |d| std::fs::remove_file(d.join("model.safetensors")).unwrap());
    v.push(gen_case("checkpoint", &none, &[], &["safetensors"]));
    let shape = t.model("llama-tiny", "k-shape", |d| {
        edited_weights(d, "model.embed_tokens.weight", |e| e["shape"] = serde_json::json!([32, 64]))
    });
    v.push(gen_case("checkpoint", &shape, &[], &["model.embed_tokens.weight"]));
    let dt = t.model("llama-tiny", "k-dtype", |d| {
        edited_weights(d, "model.norm.weight", |e| e["dtype"] = serde_json::json!("I32"))
    });
    v.push(gen_case("checkpoint", &dt, &[], &["model.norm.weight"]));
    let renamed = t.model("llama-tiny", "k-missing", |d| {
        let p = d.join("model.safetensors");
        let bytes = std::fs::read(&p).unwrap();
        let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        let mut header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
        let e = header.as_object_mut().unwrap().remove("model.norm.weight").unwrap();
        header["model.nrom.weight"] = e;
        std::fs::write(&p, safetensors(&header, &bytes[8 + n..])).unwrap();
    });
    v.push(gen_case("checkpoint", &renamed, &[], &["model.norm.weight"]));
    let offsets = t.model("llama-tiny", "k-offsets", |d| {
        edited_weights(d, "model.norm.weight", |e| e["data_offsets"] = serde_json::json!([0, 1u64 << 40]))
    });
    v.push(gen_case("checkpoint", &offsets, &[], &["model.norm.weight"]));
    v.push(case(
        "checkpoint",
        &["eval-dump", "--model", &cut, "--inputs", &inputs, "--out", &out],
        &["model.safetensors"],
    ));
    v.push(case("checkpoint", &["convert", "--to", "redco", "--input", &cut, "--out", &w], &["model.safetensors"]));
    // eval-dump inputs that are not what it reads
    let bad_in = t.file("inputs-garbage.safetensors", b"\x10\x00\x00\x00\x00\x00\x00\x00{\"a\":");
    v.push(case(
        "checkpoint",
        &["eval-dump", "--model", g, "--inputs", &bad_in, "--out", &out],
        &["inputs-garbage.safetensors"],
    ));
    let no_ids = t.file("inputs-empty.safetensors", &safetensors(&serde_json::json!({}), &[]));
    v.push(case("checkpoint", &["eval-dump", "--model", g, "--inputs", &no_ids, "--out", &out], &["input_ids"]));
    let f_ids = t.file(
        "inputs-f32.safetensors",
        &safetensors(
            &serde_json::json!({"input_ids": {"dtype": "F32", "shape": [1, 2], "data_offsets": [0, 8]}}),
            &[0; 8],
        ),
    );
    v.push(case("checkpoint", &["eval-dump", "--model", g, "--inputs", &f_ids, "--out", &out], &["input_ids"]));
    let big_ids = t.file(
        "inputs-vocab.safetensors",
        &safetensors(
            &serde_json::json!({"input_ids": {"dtype": "I64", "shape": [1, 2], "data_offsets": [0, 16]}}),
            &[[0u8; 8], 1000i64.to_le_bytes()].concat(),
        ),
    );
    v.push(case(
        "checkpoint",
        &["eval-dump", "--model", g, "--inputs", &big_ids, "--out", &out],
        &["`input_ids`", "token id 1000", "vocab_size 64"],
    ));
    // ---- tokenizer files
    let no_tok = t.model("llama-tiny", "t-none", |d| std::fs::remove_file(d.join("tokenizer.json")).unwrap());
    v.push(gen_case("tokenizer", &no_tok, &[], &["tokenizer.json"]));
    let bad_tok =
        t.model("llama-tiny", "t-garbage", |d| std::fs::write(d.join("tokenizer.json"), "{\"model\": 3}").unwrap());
    v.push(gen_case("tokenizer", &bad_tok, &[], &["tokenizer.json"]));
    let cut_tok = t.model("llama-tiny", "t-cut", |d| {
        let p = d.join("tokenizer.json");
        let b = std::fs::read(&p).unwrap();
        std::fs::write(&p, &b[..b.len() / 3]).unwrap();
    });
    v.push(gen_case("tokenizer", &cut_tok, &[], &["tokenizer.json"]));
    let bad_tc = t.model("llama-tiny", "t-config", |d| std::fs::write(d.join("tokenizer_config.json"), "[").unwrap());
    v.push(gen_case("tokenizer", &bad_tc, &[], &["tokenizer_config.json"]));
    v.push(train_with("tokenizer", &["--model", &bad_tok], &["--seq-len", "16"], &["tokenizer.json"]));
    // ---- token ids against the model's vocabulary: a tokenizer that is not the model's, an
    // added token past the embedding spelt out in the data or a prompt, a stop id no token
    // has; refused before the first step, naming the source, the id, its token, vocab_size
    let small_vocab = t.config("v-small", "vocab_size", serde_json::json!(40));
    v.push(train_with("vocab", &["--model", &small_vocab], &["--seq-len", "16"], &["tokenizer.json", "vocab_size 40"]));
    v.push(gen_case("vocab", &small_vocab, &[], &["tokenizer.json", "vocab_size 40"]));
    // three added tokens after the 62-entry vocabulary (ids 62, 63, 64): "<extra>" is past
    // the 64-row embedding: a warning at load, an error when a text spells it out
    let extra = t.model("llama-tiny", "v-added", |d| {
        let p = d.join("tokenizer.json");
        let mut j: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
        for (id, content) in [(62, "<e62>"), (63, "<e63>"), (64, "<extra>")] {
            j["added_tokens"].as_array_mut().unwrap().push(serde_json::json!({
                "id": id, "content": content, "single_word": false, "lstrip": false, "rstrip": false,
                "normalized": false, "special": false
            }));
        }
        std::fs::write(&p, j.to_string()).unwrap();
    });
    let spelt = t.file("spelt.jsonl", "{\"text\": \"the cat sat <extra> on the mat.\"}\n".repeat(40).as_bytes());
    v.push(train_with(
        "vocab",
        &["--model", &extra],
        &["--seq-len", "8", "--data", &spelt],
        &["spelt.jsonl", "token id 64", "\"<extra>\"", "vocab_size 64"],
    ));
    let mut prompt = gen_case("vocab", &extra, &[], &["\"<extra>\"", "token id 64", "vocab_size 64", "prompts"]);
    prompt.args = strings(&["generate", "--model", &extra, "--prompt", "the <extra> cat", "--max-new-tokens", "2"]);
    v.push(prompt);
    let mut warned = gen_case("vocab", &extra, &[], &["warning", "<extra>", "added token"]);
    warned.code = 0;
    v.push(warned);
    v.push(gen_case("vocab", g, &["--stop-id", "-1"], &["--stop-id", "-1"]));
    v.push(gen_case("vocab", g, &["--stop-id", "64"], &["--stop-id 64", "vocab_size 64"]));
    // T5's relative-position buckets that give NaN positions
    for (key, value) in [("relative_attention_max_distance", 0), ("relative_attention_num_buckets", 2)] {
        let bad = t.model("t5-tiny", &format!("v-{key}"), |d| {
            let p = d.join("config.json");
            let mut c: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
            c[key] = serde_json::json!(value);
            std::fs::write(&p, c.to_string()).unwrap();
        });
        let t5_inputs = s(&fixture_named("t5-tiny").join("inputs.safetensors")).to_string();
        v.push(case("config", &["eval-dump", "--model", &bad, "--inputs", &t5_inputs, "--out", &out], &[key]));
        v.push(plan_case("config", &bad, &[], &[key]));
    }
    // ---- sizes that cannot fit: refused before allocating
    let long = "word ".repeat(200_000);
    let long_file = t.file("long-prompt.txt", long.as_bytes());
    v.push(gen_case("size", &t5, &["--prompts-file", &long_file], &["needs about", "available"]));
    v.push(gen_case("size", g, &["--prompts-file", &long_file], &["context"]));
    v.push(gen_case("size", g, &["--max-new-tokens", "100000000000"], &["--max-new-tokens", "context"]));
    let many = t.file("many-prompts.txt", "hello there\n".repeat(300_000).as_bytes());
    v.push(gen_case("size", &t5, &["--prompts-file", &many, "--num-beams", "64"], &["needs about"]));
    let wide = t.config("s-wide", "max_position_embeddings", serde_json::json!(1u64 << 22));
    v.push(gen_case("size", &wide, &["--prompts-file", &long_file, "--num-beams", "64"], &["needs about"]));
    v.push(case(
        "size",
        &["plan", "--model", g, "--seq", "1000000000000000", "--batch", "1000000000000000"],
        &["--seq"],
    ));
    v.push(case("size", &["plan", "--model", &wide, "--seq", "4000000", "--batch", "1000000000000"], &["--batch"]));
    v.push(train_case("size", &["--batch-size", "100000000"], &["--batch-size", "needs about"]));
    v.push(train_case("size", &["--seq-len", "100000000"], &["--seq-len"]));
    v.push(case(
        "size",
        &["eval-dump", "--model", g, "--inputs", &inputs, "--out", &out, "--max-new-tokens", "100000000000"],
        &["--max-new-tokens"],
    ));
    // ---- data files
    let bin = t.file("binary.jsonl", &[0xff, 0xfe, 0x00, 0x80, b'\n']);
    v.push(train_case("data", &["--data", &bin], &["binary.jsonl"]));
    let arr = t.file("array.jsonl", b"[\"text\", \"hello\"]\n");
    v.push(train_case("data", &["--data", &arr], &["array.jsonl"]));
    let null = t.file("null.jsonl", b"{\"text\": null}\n");
    v.push(train_case("data", &["--data", &null], &["null.jsonl", "`text`"]));
    let field = t.file("field.jsonl", b"{\"body\": \"hello world\"}\n");
    v.push(train_case("data", &["--data", &field, "--text-field", "content"], &["field.jsonl", "content"]));
    let dir = s(&t.path("data-dir")).to_string();
    std::fs::create_dir_all(&dir).unwrap();
    v.push(train_case("data", &["--data", &dir], &["data-dir"]));
    let empty_prompts = t.file("empty-prompts.txt", b"\n\n  \n");
    v.push(gen_case("data", g, &["--prompts-file", &empty_prompts], &["--prompts-file", "no prompts"]));
    let bin_prompts = t.file("binary-prompts.txt", &[0xff, 0xfe, 0xfd]);
    v.push(gen_case("data", g, &["--prompts-file", &bin_prompts], &["binary-prompts.txt"]));
    // ---- workdirs and checkpoint directories that are not what they must be
    let wfile = t.file("workdir-is-a-file", b"x");
    v.push(case(
        "workdir",
        &["train", "--preset", "llama-tiny", "--steps", "1", "--workdir", &wfile],
        &["workdir-is-a-file"],
    ));
    let fresh = s(&t.path("fresh")).to_string();
    // --resume into a workdir without a checkpoint starts from step 0, and says so
    let mut warned = case(
        "workdir",
        &["train", "--preset", "llama-tiny", "--steps", "1", "--workdir", &fresh, "--resume"],
        &["holds no checkpoint"],
    );
    warned.code = 0;
    v.push(warned);
    let fresh = s(&t.path("fresh2")).to_string();
    v.push(case(
        "workdir",
        &["train", "--preset", "llama-tiny", "--steps", "1", "--workdir", &fresh, "--resume-from", "/tmp"],
        &["/tmp"],
    ));
    v.push(case("workdir", &["convert", "--to", "hf", "--input", &dir, "--out", &w], &["data-dir"]));
    v
}

#[test]
fn every_bad_input_is_refused_naming_its_culprit() {
    let t = Scratch::new();
    let all = cases(&t);
    let mut by_class: BTreeMap<&str, usize> = BTreeMap::new();
    let mut failures = Vec::new();
    let (mut panics, mut hangs, mut killed) = (0, 0, 0);
    for c in &all {
        *by_class.entry(c.class).or_default() += 1;
        let what = format!("[{}] redco {}", c.class, c.args.join(" ").chars().take(300).collect::<String>());
        match run(&c.args) {
            End::Hung => {
                hangs += 1;
                failures.push(format!("{what}: no answer within {TIME_LIMIT:?}"));
            }
            End::Killed(err) => {
                killed += 1;
                failures.push(format!("{what}: killed by a signal (allocation beyond the limit?): {err}"));
            }
            End::Exited(code, err) => {
                if err.contains("panicked") {
                    panics += 1;
                }
                let missing: Vec<&String> = c.says.iter().filter(|x| !err.contains(x.as_str())).collect();
                if code != c.code || err.contains("panicked") || !missing.is_empty() {
                    failures.push(format!("{what}: exit {code}, missing {missing:?} in: {}", err.trim()));
                }
            }
        }
    }
    let classes: Vec<String> = by_class.iter().map(|(k, n)| format!("{k} {n}")).collect();
    eprintln!(
        "bad-input suite: {} cases ({}); {panics} panics, {hangs} hangs, {killed} killed (over {} GiB of address \
         space), {} failing",
        all.len(),
        classes.join(", "),
        ADDRESS_SPACE_KIB >> 20,
        failures.len()
    );
    assert!(failures.is_empty(), "{} of {} cases failed:\n{}", failures.len(), all.len(), failures.join("\n"));
    let _ = std::fs::remove_dir_all(&t.0);
}
