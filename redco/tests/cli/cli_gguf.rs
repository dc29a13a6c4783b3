//! `redco convert --to gguf` on the committed transformers LLaMA fixture: the file reads
//! back with llama.cpp's keys and names, its query and key rows in llama.cpp's rotary
//! order, its other tensors bit for bit, its vocabulary tokenizing as the fixture's
//! `tokenizer.json` does, and `convert --to hf` of it gives the fixture back (tensors bit
//! for bit, the same greedy text); `--quantize` writes the blocks load-time quantizing makes (the
//! same logits); another architecture is refused by name.

use super::common::{fixture_named, redco, s, scratch_dir};
use redco_core::DType;
use redco_models::gguf::format::{GgmlType, Gguf, Value};
use redco_models::gguf::vocab;
use redco_models::hf::checkpoint::Checkpoint;
use redco_models::hf::tokenizer::Tokenizer;

/// llama.cpp's Q8_0 blocks of `x` (whole blocks of 32): an f16 scale (the largest
/// magnitude over 127) and the 32 values over it, rounded to signed bytes.
fn q8_0(x: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(x.len() / 32 * 34);
    for b in x.chunks_exact(32) {
        let amax = b.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        out.extend_from_slice(&half::f16::from_f32(d).to_le_bytes());
        let inv = if d == 0.0 { 0.0 } else { 1.0 / d };
        out.extend(b.iter().map(|v| (v * inv).round().clamp(-127.0, 127.0) as i8 as u8));
    }
    out
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
}

#[test]
fn the_llama_fixture_converts_to_a_gguf_llama_cpp_reads() {
    let src = fixture_named("llama-tiny");
    let d = scratch_dir("gguf", "llama");
    std::fs::create_dir_all(&d).unwrap();
    let out = d.join("tiny-f32.gguf");
    let (code, _, err) = redco(&["convert", "--to", "gguf", "--input", s(&src), "--out", s(&out)]);
    assert_eq!(code, 0, "{err}");
    let (g, map) = Gguf::open(&out).unwrap();
    let num = |k: &str| g.get(k).and_then(Value::as_u64).unwrap_or_else(|| panic!("no {k}"));
    assert_eq!(g.get("general.architecture").and_then(Value::as_str), Some("llama"));
    assert_eq!(
        [
            num("llama.block_count"),
            num("llama.embedding_length"),
            num("llama.attention.head_count"),
            num("llama.attention.head_count_kv"),
            num("llama.feed_forward_length"),
            num("llama.vocab_size"),
            num("llama.rope.dimension_count"),
        ],
        [2, 32, 4, 2, 48, 64, 8]
    );
    assert_eq!(g.get("llama.rope.freq_base").and_then(Value::as_f64), Some(500000.0));
    assert_eq!(g.tensors.len(), 2 * 9 + 3, "9 tensors a layer, embedding, final norm, head");
    let ck = Checkpoint::open(&src).unwrap();
    let tensor = |name: &str| g.tensors.iter().find(|t| t.name == name).unwrap_or_else(|| panic!("no {name}"));
    let q = tensor("blk.0.attn_q.weight");
    assert_eq!((q.dims.clone(), q.ty), (vec![32, 32], GgmlType::F32));
    // keys: 2 heads of 8; llama.cpp's row 2j + t of a head is transformers' row t * 4 + j
    let k = tensor("blk.1.attn_k.weight");
    assert_eq!(k.dims, vec![32, 16]);
    let ours = f32s(g.tensor_bytes(&map, k).unwrap());
    let hf = ck.read_as("model.layers.1.self_attn.k_proj.weight", DType::F32).unwrap().data.to_f32_vec();
    for h in 0..2 {
        for j in 0..4 {
            for t in 0..2 {
                let (to, from) = (h * 8 + 2 * j + t, h * 8 + t * 4 + j);
                assert_eq!(&ours[to * 32..(to + 1) * 32], &hf[from * 32..(from + 1) * 32], "row {to}");
            }
        }
    }
    for (gname, hname) in [
        ("token_embd.weight", "model.embed_tokens.weight"),
        ("blk.1.ffn_down.weight", "model.layers.1.mlp.down_proj.weight"),
        ("output_norm.weight", "model.norm.weight"),
        ("output.weight", "lm_head.weight"),
    ] {
        let want = ck.read_as(hname, DType::F32).unwrap().data.to_f32_vec();
        assert_eq!(f32s(g.tensor_bytes(&map, tensor(gname)).unwrap()), want, "{gname}");
    }
    // the vocabulary, read back from the file, tokenizes as the fixture's tokenizer.json
    let v = vocab::spm_from_gguf(&g).unwrap();
    assert_eq!(v.tokens.len(), 64, "62 tokens padded to the model's 64 rows");
    assert_eq!((v.bos, v.eos), (Some(1), Some(2)));
    let tok_dir = d.join("tokenizer");
    std::fs::create_dir_all(&tok_dir).unwrap();
    std::fs::write(tok_dir.join("tokenizer.json"), vocab::hf_json_from_spm(&v).unwrap().to_string()).unwrap();
    std::fs::write(tok_dir.join("tokenizer_config.json"), vocab::hf_config_from_spm(&v).to_string()).unwrap();
    let back = Tokenizer::from_dir(&tok_dir).unwrap();
    let fixture = Tokenizer::from_dir(&src).unwrap();
    for text in ["hello world", "the cat sat on the mat", "abc  def", "zz top"] {
        assert_eq!(back.encode(text, true).unwrap(), fixture.encode(text, true).unwrap(), "{text:?}");
    }

    // and back: `convert --to hf` of the file gives the fixture's tensors bit for bit, its
    // configuration, and the same greedy text
    let back_dir = d.join("back");
    let (code, _, err) = redco(&["convert", "--to", "hf", "--input", s(&out), "--out", s(&back_dir)]);
    assert_eq!(code, 0, "{err}");
    let back_ck = Checkpoint::open(&back_dir).unwrap();
    assert_eq!(back_ck.tensors().count(), ck.tensors().count());
    for (name, shape, _) in ck.tensors() {
        let want = ck.read_as(name, DType::F32).unwrap();
        assert_eq!(back_ck.shape(name), Some(shape), "{name}");
        assert_eq!(back_ck.read(name).unwrap(), want, "{name}");
    }
    let cfg = redco_models::hf::config::HfConfig::from_dir(&back_dir).unwrap();
    let orig = redco_models::hf::config::HfConfig::from_dir(&src).unwrap();
    assert_eq!(
        (cfg.hidden, cfg.layers, cfg.heads, cfg.kv_heads, cfg.intermediate, cfg.vocab, cfg.head_dim),
        (orig.hidden, orig.layers, orig.heads, orig.kv_heads, orig.intermediate, orig.vocab, orig.head_dim)
    );
    assert_eq!((cfg.rope_theta, cfg.norm_eps as f32), (orig.rope_theta, orig.norm_eps as f32));
    let gen = |m: &std::path::Path| {
        let (code, out, err) = redco(&["generate", "--model", s(m), "--prompt", "the cat", "--max-new-tokens", "8"]);
        assert_eq!(code, 0, "{err}");
        out
    };
    assert_eq!(gen(&back_dir), gen(&src), "the same greedy text");
    // `--model FILE.gguf`: the file itself generates the same text (read into a directory
    // once; the second run reuses it)
    let gguf_gen = |m: &std::path::Path| {
        let (code, out, err) = redco(&["generate", "--model", s(m), "--prompt", "the cat", "--max-new-tokens", "8"]);
        assert_eq!(code, 0, "{err}");
        (out, err)
    };
    let (first, said) = gguf_gen(&out);
    assert_eq!(first, gen(&src), "generate --model FILE.gguf");
    assert!(said.contains("reading") || said.is_empty(), "{said}");
    let (again, said) = gguf_gen(&out);
    assert_eq!(again, first);
    assert!(!said.contains("reading"), "the second run reuses the directory: {said}");
    // Q8_0 blocks (the matrices whose rows are whole blocks of 32; llama.cpp's layout:
    // an f16 scale and 32 signed bytes), dequantized at load: it generates, its text a
    // continuation of the prompt
    let q8 = d.join("tiny-q8_0.gguf");
    let mut w = redco_models::gguf::format::Writer::new();
    for (k, v) in &g.metadata {
        w.set(k, v.clone());
    }
    let mut quantized = 0;
    for t in &g.tensors {
        let bytes = g.tensor_bytes(&map, t).unwrap();
        let matrix = t.dims.len() == 2 && t.dims[0] % 32 == 0 && t.name.starts_with("blk.");
        if matrix && t.ty == GgmlType::F32 {
            w.tensor(&t.name, t.dims.clone(), GgmlType::Other(8), q8_0(&f32s(bytes))).unwrap();
            quantized += 1;
        } else {
            w.tensor(&t.name, t.dims.clone(), t.ty, bytes.to_vec()).unwrap();
        }
    }
    assert!(quantized >= 2 * 6, "the attention and gate/up matrices of both layers: {quantized}");
    w.write(&q8).unwrap();
    let (text, said) = gguf_gen(&q8);
    assert!(text.starts_with("the cat") && text.trim_end().len() > "the cat".len() + 3, "{text}");
    assert!(said.contains("blocks kept"), "the CPU reads the blocks in place: {said}");
    // in place, the blocks give the logits of the same file dequantized up to the rounding
    // of the activations to bytes (the integer dot products)
    let deq = d.join("q8-dequantized");
    let (code, _, err) = redco(&["convert", "--to", "hf", "--input", s(&q8), "--out", s(&deq)]);
    assert_eq!(code, 0, "{err}");
    let inputs = src.join("inputs.safetensors");
    let dump = |m: &std::path::Path, out: &std::path::Path| {
        let (code, _, err) = redco(&["eval-dump", "--model", s(m), "--inputs", s(&inputs), "--out", s(out)]);
        assert_eq!(code, 0, "{err}");
        redco_models::hf::safetensors::read_all(out).unwrap()["logits"].data.to_f64_vec()
    };
    let (a, b) = (dump(&q8, &d.join("in-place.safetensors")), dump(&deq, &d.join("deq.safetensors")));
    let num: f64 = a.iter().zip(&b).map(|(x, y)| (x - y).powi(2)).sum();
    let den: f64 = b.iter().map(|y| y * y).sum();
    assert!((num / den).sqrt() < 0.05, "relative L2 {}", (num / den).sqrt());
    assert_ne!(a, b, "the blocks were read in place, not dequantized");
    // over a 1x2 mesh the output projections split along rows of 32 values: 16 a rank is
    // not whole blocks, so they are dequantized as they are read; the rest stay blocks
    let (code, text2, err) =
        redco(&["generate", "--model", s(&q8), "--prompt", "the cat", "--max-new-tokens", "8", "--mesh", "1x2"]);
    assert_eq!(code, 0, "{err}");
    assert!(text2.starts_with("the cat") && text2.split_whitespace().count() >= 4, "{text2}");
    // training refuses a directory of blocks (the file read into a cache of the test's own)
    let cache = d.join("cache");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_redco"))
        .args(["generate", "--model", s(&q8), "--prompt", "the cat", "--max-new-tokens", "1"])
        .env("XDG_CACHE_HOME", &cache)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let blocks_dir = std::fs::read_dir(cache.join("redco").join("gguf"))
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.to_string_lossy().contains("-blocks-"))
        .expect("the directory of blocks");
    let w = d.join("train-blocks");
    let (code, _, err) = redco(&[
        "train",
        "--model",
        s(&blocks_dir),
        "--steps",
        "1",
        "--batch-size",
        "1",
        "--seq-len",
        "8",
        "--workdir",
        s(&w),
    ]);
    assert_ne!(code, 0);
    assert!(err.contains("quantized blocks"), "{err}");
    // a file that is not a LLaMA is refused by name
    let bad = d.join("bad.gguf");
    let mut w = redco_models::gguf::format::Writer::new();
    w.set("general.architecture", Value::Str("rwkv".into()));
    w.write(&bad).unwrap();
    let (code, _, err) = redco(&["generate", "--model", s(&bad), "--prompt", "x", "--max-new-tokens", "1"]);
    assert_ne!(code, 0);
    assert!(err.contains("rwkv") && err.contains("bad.gguf"), "{err}");

    // bf16: the matrices rounded, the norms kept in f32
    let out16 = d.join("tiny-bf16.gguf");
    let (code, _, err) = redco(&["convert", "--to", "gguf", "--input", s(&src), "--out", s(&out16), "--dtype", "bf16"]);
    assert_eq!(code, 0, "{err}");
    let (g16, map16) = Gguf::open(&out16).unwrap();
    let t16 = |n: &str| g16.tensors.iter().find(|t| t.name == n).unwrap().clone();
    assert_eq!(t16("blk.0.ffn_up.weight").ty, GgmlType::BF16);
    assert_eq!(t16("blk.0.attn_norm.weight").ty, GgmlType::F32);
    let up = ck.read_as("model.layers.0.mlp.up_proj.weight", DType::BF16).unwrap().data;
    assert_eq!(g16.tensor_bytes(&map16, &t16("blk.0.ffn_up.weight")).unwrap(), up.as_bytes());
    assert_eq!(g16.get("general.file_type").and_then(Value::as_u64), Some(32));
    std::fs::remove_dir_all(&d).ok();
}

#[test]
fn another_architecture_is_refused_by_name() {
    let d = scratch_dir("gguf", "gptj");
    std::fs::create_dir_all(&d).unwrap();
    let out = d.join("x.gguf");
    let (code, _, err) =
        redco(&["convert", "--to", "gguf", "--input", s(&fixture_named("gptj-tiny")), "--out", s(&out)]);
    assert_ne!(code, 0);
    assert!(err.contains("supports LLaMA") && err.contains("gptj"), "{err}");
    assert!(!out.exists(), "no file is left behind");
    std::fs::remove_dir_all(&d).ok();
}

#[test]
fn convert_quantize_writes_the_blocks_load_time_quantizing_makes() {
    // the GGUF's linear layers are the blocks `--quantize` makes at load: the same logits
    let src = fixture_named("llama-tiny");
    let d = scratch_dir("gguf", "quantize");
    std::fs::create_dir_all(&d).unwrap();
    let inputs = src.join("inputs.safetensors");
    for q in ["q8_0", "q4_1"] {
        let out = d.join(format!("tiny-{q}.gguf"));
        let (code, _, err) = redco(&["convert", "--to", "gguf", "--input", s(&src), "--out", s(&out), "--quantize", q]);
        assert_eq!(code, 0, "{err}");
        // intermediate 48 is not whole blocks of 32: the down projections stay f32
        assert!(err.contains("2 linear layers left in f32") && err.contains("layers.1.mlp.down_proj"), "{err}");
        let (g, _map) = Gguf::open(&out).unwrap();
        let ty = |name: &str| g.tensors.iter().find(|t| t.name == name).unwrap_or_else(|| panic!("no {name}")).ty;
        let fmt = redco_core::quant::QuantFormat::parse(q).unwrap();
        assert_eq!(ty("blk.0.attn_q.weight").quant(), Some(fmt));
        assert_eq!(ty("output.weight").quant(), Some(fmt));
        assert_eq!((ty("blk.0.ffn_down.weight"), ty("token_embd.weight")), (GgmlType::F32, GgmlType::F32));
        let dump = |model: &std::path::Path, extra: &[&str], name: &str| {
            let o = d.join(name);
            let mut args = vec!["eval-dump", "--model", s(model), "--inputs", s(&inputs), "--out", s(&o)];
            args.extend_from_slice(extra);
            let (code, _, err) = redco(&args);
            assert_eq!(code, 0, "{err}");
            redco_models::hf::safetensors::read_all(&o).unwrap()["logits"].data.to_f64_vec()
        };
        let from_file = dump(&out, &[], &format!("{q}-file.safetensors"));
        let at_load = dump(&src, &["--quantize", q], &format!("{q}-load.safetensors"));
        assert_eq!(from_file, at_load, "{q}");
    }
    // rows of 256 are needed for the K formats: none here
    let out = d.join("tiny-q4_k.gguf");
    let (code, _, err) =
        redco(&["convert", "--to", "gguf", "--input", s(&src), "--out", s(&out), "--quantize", "q4_k"]);
    assert_ne!(code, 0);
    assert!(err.contains("Q4_K") && err.contains("256"), "{err}");
    // --quantize writes GGUF only
    let (code, _, err) =
        redco(&["convert", "--to", "redco", "--input", s(&src), "--out", s(&d.join("r")), "--quantize", "q8_0"]);
    assert_ne!(code, 0);
    assert!(err.contains("--to gguf"), "{err}");
    std::fs::remove_dir_all(&d).ok();
}
