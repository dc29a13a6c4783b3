"""Writes the AWQ and GPTQ int4 fixtures (tests/fixtures/llama-awq-tiny, llama-gptq-tiny,
llama-gptq-actorder-tiny) with the quantizing libraries' own packing and unpacking code, and
transformers' logits of the float model whose linear weights are what those libraries unpack.

Not part of CI; run by hand with torch and transformers installed and the two libraries'
sources unpacked (their CUDA kernels are not needed: only their pure-torch code is imported):

    pip download --no-deps autoawq==0.2.9 -d /tmp/awq && tar xzf /tmp/awq/autoawq-0.2.9.tar.gz -C /tmp/awq
    pip download --no-deps auto-gptq==0.7.1 -d /tmp/gptq && (cd /tmp/gptq && unzip -q auto_gptq-*.whl)
    python xtask/python/gen_int4_fixtures.py --out tests/fixtures \\
        --awq-src /tmp/awq/autoawq-0.2.9 --gptq-src /tmp/gptq

The model: a LLaMA with hidden 64, intermediate 128, 2 layers, 4 heads (2 key/value heads of
16), vocabulary 64 (llama-tiny's tokenizer), weights normal std 0.2, norms uniform 0.8..1.2,
stored in float16 as AutoAWQ and AutoGPTQ save them. Every decoder projection is quantized to
4 bits in groups of 32 inputs, asymmetric (per group and output: scale (max - min) / 15, zero
round(-min / scale), clamped to 1..15 so that GPTQ's stored `zero - 1` never wraps):
- llama-awq-tiny: AutoAWQ's `WQLinear_GEMM.from_linear` packs (quant_method awq, version
  gemm); the reference weights are its `dequantize_gemm` of the stored tensors.
- llama-gptq-tiny: AutoGPTQ's `QuantLinear.pack` (qlinear_cuda, checkpoint_format gptq, zeros
  stored minus one, desc_act false); the reference weights are its forward on the identity.
- llama-gptq-actorder-tiny: as llama-gptq-tiny with desc_act true: `g_idx` a random
  permutation's groups, so no block of 32 inputs shares one group (redco reads it as floats).

inputs.safetensors: input_ids [2, 16] (the second row left-padded by 3), attention_mask.
reference.safetensors: logits [2, 16, 64] of transformers' LlamaForCausalLM in float32 with
those weights, and `weight.<name>` for every quantized layer (the unpacked float weights)."""
import argparse
import importlib.util
import json
import os
import shutil
import sys
import types

import torch
from safetensors.torch import save_file

GROUP = 32


def _load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def _awq(src):
    # the `awq` package's __init__ imports its calibration stack; only the linear module is needed
    pkg = types.ModuleType("awq")
    pkg.__path__ = [os.path.join(src, "awq")]
    sys.modules["awq"] = pkg
    for sub in ["utils", "modules", "modules.linear"]:
        m = types.ModuleType("awq." + sub)
        m.__path__ = [os.path.join(src, "awq", *sub.split("."))]
        sys.modules["awq." + sub] = m
    gemm = _load(os.path.join(src, "awq/modules/linear/gemm.py"), "awq.modules.linear.gemm")
    packing = sys.modules["awq.utils.packing_utils"]
    return gemm.WQLinear_GEMM, packing.dequantize_gemm


def _gptq(src):
    return _load(os.path.join(src, "auto_gptq/nn_modules/qlinear/qlinear_cuda.py"), "qlinear_cuda").QuantLinear


def _model():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(11)
    cfg = LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, rope_theta=10000.0,
                      rms_norm_eps=1e-5, max_position_embeddings=64, tie_word_embeddings=False,
                      attn_implementation="eager")
    model = LlamaForCausalLM(cfg).float().eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.2)
            else:
                p.uniform_(0.8, 1.2)
        for p in model.parameters():
            p.copy_(p.half().float())  # the checkpoint is float16
    return model


def _scales_zeros(w, g_of, groups):
    """Per group and output: scale and zero of the asymmetric 4-bit grid ([out, groups])."""
    out = w.shape[0]
    s = torch.zeros(out, groups)
    z = torch.zeros(out, groups)
    for g in range(groups):
        cols = w[:, g_of == g]
        lo, hi = cols.min(dim=1).values.clamp(max=0), cols.max(dim=1).values.clamp(min=0)
        sc = ((hi - lo) / 15).half().float()
        s[:, g] = sc
        z[:, g] = torch.round(-lo / sc).clamp(1, 15)
    return s, z


def _projections(model):
    for n, m in model.named_modules():
        if isinstance(m, torch.nn.Linear) and ".layers." in n and n.endswith("_proj"):
            yield n, m


def _write(model, d, tensors, qcfg, reference, tok_src):
    os.makedirs(d, exist_ok=True)
    cfg = model.config.to_dict()
    cfg["torch_dtype"] = "float16"
    cfg.pop("dtype", None)
    cfg["quantization_config"] = qcfg
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(d, "model.safetensors"),
              metadata={"format": "pt"})
    for name in ["tokenizer.json", "tokenizer_config.json"]:
        shutil.copy(os.path.join(tok_src, name), os.path.join(d, name))
    ids = torch.tensor([[5, 9, 13, 2, 40, 33, 7, 21, 3, 60, 8, 11, 17, 29, 31, 44],
                        [0, 0, 0, 11, 3, 21, 60, 8, 5, 9, 13, 40, 33, 7, 50, 12]])
    mask = (torch.arange(16)[None, :] >= torch.tensor([[0], [3]])).long()
    with torch.no_grad():
        ref = model(input_ids=ids, attention_mask=mask).logits
    save_file({"input_ids": ids, "attention_mask": mask}, os.path.join(d, "inputs.safetensors"))
    reference["logits"] = ref.contiguous()
    save_file(reference, os.path.join(d, "reference.safetensors"))
    print("wrote", d)


def _float_tensors(model):
    quant = {n for n, _ in _projections(model)}
    return {n: p.detach().half() for n, p in model.named_parameters() if n[: -len(".weight")] not in quant}


def awq_fixture(out, src, tok_src):
    WQLinear_GEMM, dequantize_gemm = _awq(src)
    model = _model()
    tensors, reference = _float_tensors(model), {}
    for n, lin in list(_projections(model)):
        w = lin.weight.detach()
        g_of = torch.arange(w.shape[1]) // GROUP
        s, z = _scales_zeros(w, g_of, w.shape[1] // GROUP)
        q = WQLinear_GEMM.from_linear(lin.half(), 4, GROUP, scales=s.t().contiguous().half(), zeros=z.t().contiguous())
        for part in ["qweight", "qzeros", "scales"]:
            tensors[f"{n}.{part}"] = getattr(q, part).detach()
        back = dequantize_gemm(q.qweight, q.qzeros, q.scales, 4, GROUP).float().t().contiguous()  # [out, in]
        reference[f"weight.{n}.weight"] = back
        with torch.no_grad():
            lin.float().weight.copy_(back)
    qcfg = {"bits": 4, "group_size": GROUP, "modules_to_not_convert": None, "quant_method": "awq",
            "version": "gemm", "zero_point": True}
    _write(model, os.path.join(out, "llama-awq-tiny"), tensors, qcfg, reference, tok_src)


def gptq_fixture(out, src, tok_src, act_order):
    QuantLinear = _gptq(src)
    model = _model()
    tensors, reference = _float_tensors(model), {}
    gen = torch.Generator().manual_seed(5)
    for n, lin in list(_projections(model)):
        w = lin.weight.detach()
        inp, outf = w.shape[1], w.shape[0]
        if act_order:
            g_idx = (torch.randperm(inp, generator=gen) // GROUP).int()
        else:
            g_idx = (torch.arange(inp) // GROUP).int()
        s, z = _scales_zeros(w, g_idx, inp // GROUP)
        q = QuantLinear(4, GROUP, inp, outf, False, weight_dtype=torch.float16)
        q.pack(lin.half(), s.half(), z, g_idx)
        for part in ["qweight", "qzeros", "scales", "g_idx"]:
            tensors[f"{n}.{part}"] = getattr(q, part).detach()
        with torch.no_grad():
            back = q(torch.eye(inp, dtype=torch.float16)).float().t().contiguous()  # [out, in]
        reference[f"weight.{n}.weight"] = back
        with torch.no_grad():
            lin.float().weight.copy_(back)
    qcfg = {"bits": 4, "checkpoint_format": "gptq", "damp_percent": 0.1, "desc_act": act_order,
            "group_size": GROUP, "lm_head": False, "quant_method": "gptq", "static_groups": False,
            "sym": False, "true_sequential": True}
    name = "llama-gptq-actorder-tiny" if act_order else "llama-gptq-tiny"
    _write(model, os.path.join(out, name), tensors, qcfg, reference, tok_src)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--awq-src", required=True, help="autoawq's unpacked source (the sdist's directory)")
    ap.add_argument("--gptq-src", required=True, help="auto-gptq's unpacked wheel")
    a = ap.parse_args()
    tok = os.path.join(a.out, "llama-tiny")
    awq_fixture(a.out, a.awq_src, tok)
    gptq_fixture(a.out, a.gptq_src, tok, act_order=False)
    gptq_fixture(a.out, a.gptq_src, tok, act_order=True)
