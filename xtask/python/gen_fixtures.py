"""Writes tiny random Hugging Face checkpoints and transformers' reference outputs for the
parity tests (run by `cargo xtask fixtures`; needs torch and transformers, not part of CI).

For each model: <out>/<name>/config.json + model.safetensors (the checkpoint),
inputs.safetensors (input_ids, attention_mask, labels, gen_input_ids, gen_attention_mask)
and reference.safetensors (logits, loss, grad.<param>, generated_ids)."""
import argparse
import os

import torch
from safetensors.torch import save_file


def llama(out):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, rope_theta=500000.0,
        rms_norm_eps=1e-5, max_position_embeddings=64, tie_word_embeddings=False,
        attn_implementation="eager",
    )
    model = LlamaForCausalLM(cfg).float().eval()
    # larger-than-default weights so that every layer matters numerically
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.2)
            else:
                p.uniform_(0.8, 1.2)
    d = os.path.join(out, "llama-tiny")
    os.makedirs(d, exist_ok=True)
    model.save_pretrained(d, safe_serialization=True)
    ids = torch.tensor([[5, 9, 13, 2, 40, 33, 7], [0, 0, 11, 3, 21, 60, 8]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1, 1]])
    labels = ids.clone()
    labels[mask == 0] = -100
    outp = model(input_ids=ids, attention_mask=mask, labels=labels)
    outp.loss.backward()
    ref = {"logits": outp.logits.detach().contiguous(), "loss": outp.loss.detach().reshape(1)}
    for n, p in model.named_parameters():
        ref["grad." + n] = p.grad.detach().contiguous()
    gen_ids = torch.tensor([[5, 9, 13, 2], [0, 0, 11, 3]])
    gen_mask = torch.tensor([[1, 1, 1, 1], [0, 0, 1, 1]])
    with torch.no_grad():
        g = model.generate(input_ids=gen_ids, attention_mask=gen_mask, max_new_tokens=8, do_sample=False, pad_token_id=0)
    ref["generated_ids"] = g.contiguous()
    save_file({"input_ids": ids, "attention_mask": mask, "labels": labels, "gen_input_ids": gen_ids, "gen_attention_mask": gen_mask},
              os.path.join(d, "inputs.safetensors"))
    save_file(ref, os.path.join(d, "reference.safetensors"))
    print("wrote", d)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    llama(ap.parse_args().out)
