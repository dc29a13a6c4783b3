"""PyTorch peer for `cargo xtask bench`: reads one JSON request per line on stdin and
answers one JSON line on stdout, so that redco and torch are measured in the same run,
interleaved, with the same thread count. `REDCO_TORCH_DEVICE=cuda` runs the peer on the
GPU (for `cargo xtask gpu-check cuda`), synchronising before every clock read."""
import argparse
import contextlib
import gc
import json
import math
import os
import resource
import sys
import time
import traceback

import torch

DEVICE = os.environ.get("REDCO_TORCH_DEVICE", "cpu")


def _sync():
    if DEVICE != "cpu":
        torch.cuda.synchronize()


def _clock():
    _sync()
    return time.perf_counter()


def gemm(req):
    m, n, k, reps = req["m"], req["n"], req["k"], req["reps"]
    dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[req.get("dtype", "f32")]
    g = torch.Generator().manual_seed(0)
    # a transposed operand is stored transposed and multiplied as a view, as a linear
    # layer's weight (`trans_b`) and its weight gradient (`trans_a`) are
    if req.get("trans_a"):
        a = torch.rand((k, m), generator=g, dtype=torch.float32).to(dtype).to(DEVICE).t()
    else:
        a = torch.rand((m, k), generator=g, dtype=torch.float32).to(dtype).to(DEVICE)
    if req.get("trans_b"):
        b = torch.rand((n, k), generator=g, dtype=torch.float32).to(dtype).to(DEVICE).t()
    else:
        b = torch.rand((k, n), generator=g, dtype=torch.float32).to(dtype).to(DEVICE)
    torch.matmul(a, b)  # warm-up
    times = []
    for _ in range(reps):
        t = _clock()
        torch.matmul(a, b)
        times.append(_clock() - t)
    return {"times": times}


def _transformers_version():
    try:
        import transformers

        return transformers.__version__
    except ImportError:
        return None


_models = {}


def _pretrained(path, dtype):
    """The LlamaForCausalLM saved in directory `path`, loaded once in `dtype` (f32, bf16, f16)."""
    key = json.dumps([path, dtype])
    if key not in _models:
        import transformers

        dt = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[dtype]
        _models[key] = transformers.LlamaForCausalLM.from_pretrained(
            path, dtype=dt, attn_implementation="eager"
        ).to(DEVICE).eval()
    return _models[key]


def _llama(cfg, dtype="f32"):
    """A randomly initialised LlamaForCausalLM (Qwen3MoeForCausalLM where the config's
    `model_type` is `qwen3_moe`) for the config dict, built once per config;
    `dtype` "bf16" gives a bf16 copy of the same weights (for forward and decode)."""
    key = json.dumps(cfg, sort_keys=True)
    if key not in _models:
        import transformers

        torch.manual_seed(0)
        kw = {k: v for k, v in cfg.items() if k != "model_type"}
        if cfg.get("model_type") == "qwen3_moe":
            # a mixture of experts (the MoE rows of `bench decode --moe`)
            c = transformers.Qwen3MoeConfig(**kw, attn_implementation="eager")
            _models[key] = transformers.Qwen3MoeForCausalLM(c).float().to(DEVICE).eval()
        else:
            c = transformers.LlamaConfig(**kw, attn_implementation="eager")
            _models[key] = transformers.LlamaForCausalLM(c).float().to(DEVICE).eval()
    if dtype == "f32":
        return _models[key]
    bkey = key + "|" + dtype
    if bkey not in _models:
        import copy

        _models[bkey] = copy.deepcopy(_models[key]).to(torch.bfloat16).eval()
    return _models[bkey]


def _random_ids(cfg, batch, seq):
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, cfg["vocab_size"], (batch, seq), generator=g, dtype=torch.long).to(DEVICE)


_optimizers = {}


def train(req):
    """Seconds per training step (zero_grad, forward with labels = ids, backward,
    `torch.optim.AdamW.step`) for `warmup` untimed then `reps` timed steps on random ids
    `[batch, seq]`; `dtype` "bf16" runs the forward under `torch.autocast` (bf16 compute,
    f32 weights and optimizer)."""
    cfg = req["config"]
    model = _llama(cfg)
    key = json.dumps(cfg, sort_keys=True)
    if key not in _optimizers:
        _optimizers[key] = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=req.get("weight_decay", 0.01))
    opt = _optimizers[key]
    ids = _random_ids(cfg, req["batch"], req["seq"])
    model.train()
    times, phases, losses = [], [], []
    try:
        for i in range(req.get("warmup", 1) + req["reps"]):
            t = _clock()
            opt.zero_grad(set_to_none=True)
            with torch.autocast(DEVICE, dtype=torch.bfloat16, enabled=req.get("dtype", "f32") == "bf16"):
                loss = model(input_ids=ids, labels=ids, use_cache=False).loss
            losses.append(loss.item())
            t1 = _clock()
            loss.backward()
            t2 = _clock()
            opt.step()
            t3 = _clock()
            if i >= req.get("warmup", 1):
                times.append(t3 - t)
                # forward, backward, gradient sync (none here), optimizer
                phases.append([t1 - t, t2 - t1, 0.0, t3 - t2])
    finally:
        opt.zero_grad(set_to_none=True)
        model.eval()
    return {"times": times, "phases": phases, "losses": losses}


def _driver():
    """The GPU driver as the answer names it: the NVIDIA driver (through NVML, where pynvml
    is installed) and the CUDA driver API version torch sees (`torch._C._cuda_getDriverVersion`,
    private: torch has no public accessor), else the CUDA torch was built with; "none" on cpu."""
    if DEVICE == "cpu":
        return "none"
    parts = []
    try:
        import pynvml

        pynvml.nvmlInit()
        v = pynvml.nvmlSystemGetDriverVersion()
        parts.append("nvidia " + (v.decode() if isinstance(v, bytes) else str(v)))
    except Exception:
        pass
    try:
        v = int(torch._C._cuda_getDriverVersion())
        parts.append(f"cuda driver api {v // 1000}.{v % 1000 // 10}")
    except Exception:
        pass
    if not parts:
        parts.append(f"cuda runtime {torch.version.cuda} (torch build)")
    return ", ".join(parts)


@contextlib.contextmanager
def _stdout_to_stderr():
    """Sends whatever is written to file descriptor 1 (compiler and library chatter, from
    Python or from C) to stderr while it lasts, so stdout carries only the answers."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def train_real(req):
    """Seconds per training step at real sizes, for GPU comparisons: a fresh randomly
    initialised LlamaForCausalLM of `config` (torch.manual_seed(0)), f32 master weights on
    DEVICE, `attn_implementation` `attn` ("sdpa" or "eager"), wrapped in `torch.compile`
    when `compile`; AdamW (`lr`, `weight_decay`; fused on cuda); each step zero_grad, forward
    under bf16 autocast with labels = the random ids `[batch, seq]`, backward, step, for
    `warmup` untimed then `reps` timed steps. Answers the timed steps' seconds, every step's
    loss (null where not finite), the CUDA peak allocated bytes over the timed steps (null
    on cpu), the parameter count, torch, device and driver. The model and optimizer are
    freed before answering, failed or not, so requests never hold two models at once."""
    import transformers

    cfg = req["config"]
    batch, seq, reps = int(req["batch"]), int(req["seq"]), int(req["reps"])
    warmup = int(req.get("warmup", 2))
    attn = req.get("attn", "sdpa")
    if attn not in ("sdpa", "eager"):
        raise ValueError(f"train_real: attn {attn!r} is neither \"sdpa\" nor \"eager\"")
    compiled = bool(req.get("compile", False))
    cuda = DEVICE != "cpu"
    device_type = torch.device(DEVICE).type
    stage = "building the model"
    model = run = opt = ids = loss = None
    try:
        with _stdout_to_stderr():
            torch.manual_seed(0)
            c = transformers.LlamaConfig(**cfg, attn_implementation=attn)
            model = transformers.LlamaForCausalLM(c).float().to(DEVICE)
            model.train()
            params = sum(p.numel() for p in model.parameters())
            stage = "building the optimizer"
            lr, wd = float(req.get("lr", 1e-4)), float(req.get("weight_decay", 0.0))
            if cuda:
                opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=wd, fused=True)
            else:
                opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=wd)
            stage = "torch.compile" if compiled else "preparing the inputs"
            run = torch.compile(model) if compiled else model
            ids = _random_ids(cfg, batch, seq)
            times, losses = [], []
            for i in range(warmup + reps):
                if i == warmup and cuda:
                    torch.cuda.reset_peak_memory_stats()
                if i == 0 and compiled:
                    stage = "the first step (torch.compile compiles the model there)"
                else:
                    stage = f"step {i} ({'warm-up' if i < warmup else 'timed'})"
                t = _clock()
                opt.zero_grad(set_to_none=True)
                with torch.autocast(device_type, dtype=torch.bfloat16):
                    loss = run(input_ids=ids, labels=ids, use_cache=False).loss
                loss.backward()
                opt.step()
                dt = _clock() - t
                if i >= warmup:
                    times.append(dt)
                x = loss.item()
                losses.append(x if math.isfinite(x) else None)
                loss = None
            stage = "reading the device"
            return {
                "times": times,
                "losses": losses,
                "peak_bytes": torch.cuda.max_memory_allocated() if cuda else None,
                "params": params,
                "torch": torch.__version__,
                "device": torch.cuda.get_device_name() if cuda else "cpu",
                "driver": _driver(),
                "compiled": compiled,
            }
    except Exception as e:
        # the failed frames below this one (activations, on an OOM) are let go before the
        # cache is emptied below, not when the caller drops the exception
        traceback.clear_frames(e.__traceback__)
        raise RuntimeError(f"train_real failed in {stage}: {type(e).__name__}: {str(e)[:4000]}") from None
    finally:
        # drop every reference (an exception's traceback keeps this frame alive), then the
        # compiled graphs, then the cached blocks
        model = run = opt = ids = loss = None
        if compiled:
            with contextlib.suppress(Exception):
                torch._dynamo.reset()
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()


def forward(req):
    """Seconds per forward pass (logits `[batch, seq, vocab]`, under inference_mode) for
    `warmup` untimed then `reps` timed passes on random ids `[batch, seq]`."""
    cfg = req["config"]
    model = _llama(cfg, req.get("dtype", "f32"))
    ids = _random_ids(cfg, req["batch"], req["seq"])
    times = []
    with torch.inference_mode():
        for i in range(req.get("warmup", 1) + req["reps"]):
            t = _clock()
            logits = model(input_ids=ids, use_cache=False).logits
            if i >= req.get("warmup", 1):
                times.append(_clock() - t)
            if logits.shape != (ids.shape[0], ids.shape[1], cfg["vocab_size"]):
                raise RuntimeError(f"logits of shape {tuple(logits.shape)}")
    return {"times": times}


def decode(req):
    """Seconds per `model.generate` call (greedy, KV cache, exactly `new` new tokens), for
    `warmup` untimed then `reps` timed calls; on the model saved in `model_dir` (in `dtype`)
    when the request names one, else a random one of `config`."""
    if req.get("model_dir"):
        model = _pretrained(req["model_dir"], req.get("dtype", "f32"))
    else:
        model = _llama(req["config"], req.get("dtype", "f32"))
    ids = torch.tensor([req["ids"]], dtype=torch.long).to(DEVICE)
    new, reps, warmup = req["new"], req["reps"], req.get("warmup", 0)
    times = []
    with torch.inference_mode():
        for i in range(warmup + reps):
            t = _clock()
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=new,
                min_new_tokens=new,
                do_sample=False,
                use_cache=True,
                pad_token_id=0,
                eos_token_id=None,
            )
            if i >= warmup:
                times.append(_clock() - t)
            got = out.shape[1] - ids.shape[1]
            if got != new:
                raise RuntimeError(f"generate made {got} tokens, not {new}")
    return {"times": times}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, required=True)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    for line in sys.stdin:
        req = json.loads(line)
        op = req.get("op")
        try:
            if op == "quit":
                return
            if op == "info":
                out = {
                    "torch": torch.__version__,
                    "threads": torch.get_num_threads(),
                    "mkl": torch.backends.mkl.is_available(),
                    "mkldnn": torch.backends.mkldnn.is_available(),
                    "cpu_capability": torch.backends.cpu.get_cpu_capability(),
                    "transformers": _transformers_version(),
                    "device": torch.cuda.get_device_name(0) if DEVICE != "cpu" else "cpu",
                }
            elif op == "gemm":
                out = gemm(req)
            elif op == "decode":
                out = decode(req)
            elif op == "load":
                # `from_pretrained` of a saved model, timed (the first load: later requests
                # on the same directory and dtype reuse the model)
                t = _clock()
                _pretrained(req["model_dir"], req.get("dtype", "f32"))
                out = {"load_s": _clock() - t}
            elif op == "train":
                out = train(req)
            elif op == "forward":
                out = forward(req)
            elif op == "train_real":
                out = train_real(req)
            else:
                out = {"error": f"unknown op {op}"}
        except Exception as e:  # report, keep serving
            out = {"error": repr(e)}
        # the peer's peak resident set so far (Linux reports KiB)
        out["peak_rss_kib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
