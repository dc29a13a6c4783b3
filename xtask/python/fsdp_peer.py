"""The torch FSDP peer of `cargo xtask bench memory --torch PYTHON`.

Started by the bench as `PYTHON -m torch.distributed.run --standalone --nproc-per-node N
fsdp_peer.py ...` (torchrun): N CPU processes over gloo train a transformers
`LlamaForCausalLM` of the given shape, built on the meta device and sharded with FSDP2
(`fully_shard` on every decoder layer, then on the root), its f32 parameters materialised
only as each rank's shards; with `--recompute`, each decoder layer's activations are
recomputed in backward (transformers' gradient checkpointing, non-reentrant). AdamW, the
gradient norm clipped to 1, the same batch and sequence as redco's row, random token ids.

Each rank writes `OUT/rank-N.json`: its peak resident set (`ru_maxrss`, KiB), the time of
each step, and the losses.
"""

import argparse
import json
import resource
import time

import torch
import torch.distributed as dist


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--hidden", type=int, required=True)
    p.add_argument("--layers", type=int, required=True)
    p.add_argument("--heads", type=int, required=True)
    p.add_argument("--intermediate", type=int, required=True)
    p.add_argument("--vocab", type=int, required=True)
    p.add_argument("--batch", type=int, required=True, help="global batch (split over the ranks)")
    p.add_argument("--seq", type=int, required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--recompute", action="store_true")
    p.add_argument("--out", required=True, help="directory for each rank's rank-N.json")
    a = p.parse_args()

    from torch.distributed.fsdp import fully_shard
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.set_num_threads(a.threads)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    cfg = LlamaConfig(
        hidden_size=a.hidden,
        intermediate_size=a.intermediate,
        num_hidden_layers=a.layers,
        num_attention_heads=a.heads,
        num_key_value_heads=a.heads,
        vocab_size=a.vocab,
        max_position_embeddings=max(2048, a.seq + 1),
        tie_word_embeddings=False,
    )
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg)
    if a.recompute:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    model.to_empty(device="cpu")
    torch.manual_seed(0)
    with torch.no_grad():
        for name, t in model.named_parameters():
            if name.endswith("norm.weight"):
                t.fill_(1.0)
            else:
                t.normal_(0.0, 0.02)
    # the rotary tables are buffers made on the meta device: made again on the host
    model.model.rotary_emb = type(model.model.rotary_emb)(config=cfg)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    g = torch.Generator().manual_seed(1234 + rank)
    per = max(1, a.batch // world)
    times, losses = [], []
    for _ in range(a.steps):
        ids = torch.randint(0, a.vocab, (per, a.seq), generator=g)
        t0 = time.perf_counter()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        dist.barrier()
        times.append(time.perf_counter() - t0)
        losses.append(float(loss.detach()))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    line = json.dumps({"rank": rank, "peak_kib": peak, "step_s": times, "losses": losses, "torch": torch.__version__})
    with open(f"{a.out}/rank-{rank}.json", "w") as f:
        f.write(line + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
