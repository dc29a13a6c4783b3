"""Writes tiny random Hugging Face checkpoints and transformers' reference outputs for the
parity tests (run by `cargo xtask fixtures`; needs torch and transformers, not part of CI).

For each model: <out>/<name>/config.json + model.safetensors (the checkpoint),
inputs.safetensors (input_ids, attention_mask, labels, gen_input_ids, gen_attention_mask)
and reference.safetensors (logits, loss, grad.<param>, generated_ids).

Models: llama-tiny, mixtral-tiny, qwen3-moe-tiny, gptj-tiny, opt-tiny, opt-350m-shape (OPT with post-layer-norm and
project_in/out, as facebook/opt-350m), t5-tiny (T5 v1.0) and t5-v1_1-tiny (T5 v1.1). All are
float32, eager attention, eval mode (no dropout); every weight re-drawn larger than the default
init so that every layer matters numerically: matrices (and embedding tables) normal std 0.2,
biases normal std 0.2, norm scales uniform 0.8..1.2 (T5's shared embedding and relative position
tables: normal std 1.0, else the tied head's d_model**-0.5 scaling leaves logits near-uniform).
The other models each have a seed picked so that greedy generation stops a row at eos (the rest of
that row is then pad) and, for T5, beam search differs from greedy.
The decoder-only batches have a left-padded second row; `forward` gets no position_ids (so
each model derives them by its own rule), `generate` derives them from the attention mask.

The T5 fixtures (encoder-decoder) have in inputs.safetensors: input_ids, attention_mask (encoder;
the second row is RIGHT-padded with pad id 0, as T5 tokenizers pad), labels ([batch, tgt_len],
-100 at padding), decoder_input_ids (= labels shifted right by transformers' _shift_right:
decoder_start_token_id first, -100 replaced by pad), gen_input_ids, gen_attention_mask; and in
reference.safetensors: logits (decoder), loss, grad.<param>, generated_ids (greedy,
max_new_tokens=8; decoder_start_token_id first, finished rows padded with pad 0) and
beam_generated_ids (num_beams=4, length_penalty=1.0, early_stopping=True; as generate returns it:
a shorter best hypothesis is filled with eos 1, not pad 0, since transformers fills with
`pad_token_id or eos_token_id` and pad 0 is falsy).

grad.<param> uses model.named_parameters() names: a tied weight appears once, under the name
model.safetensors stores it (checked: the file's keys are exactly those names). Tied: OPT's
lm_head.weight = model.decoder.embed_tokens.weight; T5's encoder.embed_tokens.weight and
decoder.embed_tokens.weight = shared.weight, and t5-tiny's lm_head.weight = shared.weight too
(t5-v1_1-tiny has its own lm_head.weight, as real v1.1 checkpoints). GPT-J ties nothing.

Every fixture also gets a tiny tokenizer of its family (tokenizer.json, tokenizer_config.json)
and tokenizer_expected.json: what transformers' encode, decode and padded batch give with it.
llama-tiny: sentencepiece-like BPE; gptj-tiny, opt-tiny, opt-350m-shape: GPT-2's byte-level BPE
(over the corpus' bytes only, with an unknown token); t5-tiny, t5-v1_1-tiny: a Unigram with
Metaspace. The tokenizer's special ids are those of the model's config.json."""
import argparse
import json
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


def mixtral(out):
    """Mixtral (a sparse mixture of experts): 4 experts, 2 per token, a LLaMA attention with
    grouped-query heads, untied head; output_router_logits on with router_aux_loss_coef 0.02, so
    the reference loss is the language-model loss plus 0.02 x the load-balancing loss
    (transformers' load_balancing_loss_func with the attention mask). The checkpoint is what
    current transformers saves: block_sparse_moe.gate and block_sparse_moe.experts.N.w1/w2/w3
    (its in-memory experts are fused as mlp.experts.gate_up_proj [E, 2i, h], gate first, and
    mlp.experts.down_proj [E, h, i]); the reference's grad.<name> use the file's names (each
    fused gradient cut into its experts). reference.safetensors also has aux_loss."""
    from transformers import MixtralConfig, MixtralForCausalLM

    torch.manual_seed(0)
    cfg = MixtralConfig(
        vocab_size=64, hidden_size=32, intermediate_size=24, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
        rope_theta=1000000.0, rms_norm_eps=1e-5, max_position_embeddings=64, tie_word_embeddings=False,
        output_router_logits=True, router_aux_loss_coef=0.02, attn_implementation="eager",
    )
    model = MixtralForCausalLM(cfg).float().eval()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.2)
            else:
                p.uniform_(0.8, 1.2)
    d = os.path.join(out, "mixtral-tiny")
    i = cfg.intermediate_size

    def file_names(n, t):
        """The file's names and tensors for in-memory parameter n holding t."""
        if n.endswith("mlp.experts.gate_up_proj"):
            p = n[: -len("mlp.experts.gate_up_proj")] + "block_sparse_moe.experts."
            return [(f"{p}{e}.w1.weight", t[e, :i]) for e in range(t.shape[0])] + \
                   [(f"{p}{e}.w3.weight", t[e, i:]) for e in range(t.shape[0])]
        if n.endswith("mlp.experts.down_proj"):
            p = n[: -len("mlp.experts.down_proj")] + "block_sparse_moe.experts."
            return [(f"{p}{e}.w2.weight", t[e]) for e in range(t.shape[0])]
        if n.endswith("mlp.gate.weight"):
            return [(n.replace("mlp.gate.weight", "block_sparse_moe.gate.weight"), t)]
        return [(n, t)]

    _moe_fixture(model, d, out, file_names)


def qwen3_moe(out):
    """Qwen3-MoE: QK-norm (an RMSNorm over each head's features of the queries and keys, before
    the rotary embedding), explicit head_dim 16 (heads x head_dim = 64 > hidden 32), 4 experts, 2
    per token WITHOUT renormalising their probabilities (norm_topk_prob false), a dense MLP in
    layer 1 (mlp_only_layers [1]) of intermediate_size 40 beside the experts' moe_intermediate_size
    24; output_router_logits on with router_aux_loss_coef 0.02, as mixtral(). The checkpoint is
    what current transformers saves: mlp.gate and mlp.experts.N.gate_proj/up_proj/down_proj (its
    in-memory experts are fused as mlp.experts.gate_up_proj, gate first, and mlp.experts.down_proj);
    grad.<name> use the file's names. llama-tiny's tokenizer is copied in."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3MoeConfig(
        vocab_size=64, hidden_size=32, intermediate_size=40, moe_intermediate_size=24, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=4, num_experts_per_tok=2,
        norm_topk_prob=False, mlp_only_layers=[1], decoder_sparse_step=1, rope_theta=1000000.0,
        rms_norm_eps=1e-6, max_position_embeddings=64, tie_word_embeddings=False, bos_token_id=1,
        eos_token_id=2, output_router_logits=True, router_aux_loss_coef=0.02, attn_implementation="eager",
    )
    model = Qwen3MoeForCausalLM(cfg).float().eval()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.2)
            else:
                p.uniform_(0.8, 1.2)
    d = os.path.join(out, "qwen3-moe-tiny")
    i = cfg.moe_intermediate_size

    def file_names(n, t):
        """The file's names and tensors for in-memory parameter n holding t."""
        if n.endswith("mlp.experts.gate_up_proj"):
            p = n[: -len("gate_up_proj")]
            return [(f"{p}{e}.gate_proj.weight", t[e, :i]) for e in range(t.shape[0])] + \
                   [(f"{p}{e}.up_proj.weight", t[e, i:]) for e in range(t.shape[0])]
        if n.endswith("mlp.experts.down_proj"):
            p = n[: -len("down_proj")]
            return [(f"{p}{e}.down_proj.weight", t[e]) for e in range(t.shape[0])]
        return [(n, t)]

    _moe_fixture(model, d, out, file_names)


def _moe_fixture(model, d, out, file_names):
    """The llama() recipe for a mixture of experts whose in-memory experts are fused (transformers
    5) while its checkpoint holds one tensor per expert: `file_names(name, tensor)` gives the
    file's names and tensors for an in-memory parameter. Checks that mapping against the saved
    file, writes inputs and reference (with aux_loss; grad.<name> under the file's names), and
    copies llama-tiny's tokenizer (the same vocabulary of 64, bos 1, eos 2) in."""
    import shutil
    from safetensors import safe_open

    os.makedirs(d, exist_ok=True)
    model.save_pretrained(d, safe_serialization=True)
    with safe_open(os.path.join(d, "model.safetensors"), "pt") as f:
        saved = {k: f.get_tensor(k) for k in f.keys()}
    # the conversion is transformers' own: every weight it gives is the file's tensor
    mapped = dict(x for n, p in model.state_dict().items() for x in file_names(n, p))
    assert sorted(mapped) == sorted(saved), (sorted(set(mapped) ^ set(saved)))
    for k, v in saved.items():
        assert torch.equal(mapped[k], v), k
    ids = torch.tensor([[5, 9, 13, 2, 40, 33, 7], [0, 0, 11, 3, 21, 60, 8]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1, 1]])
    labels = ids.clone()
    labels[mask == 0] = -100
    outp = model(input_ids=ids, attention_mask=mask, labels=labels)
    outp.loss.backward()
    ref = {"logits": outp.logits.detach().contiguous(), "loss": outp.loss.detach().reshape(1),
           "aux_loss": outp.aux_loss.detach().reshape(1)}
    for n, p in model.named_parameters():
        for k, g in file_names(n, p.grad.detach()):
            ref["grad." + k] = g.contiguous()
    gen_ids = torch.tensor([[5, 9, 13, 2], [0, 0, 11, 3]])
    gen_mask = torch.tensor([[1, 1, 1, 1], [0, 0, 1, 1]])
    # generation without the router logits (transformers 5.25's aux loss fails on a decode
    # step's mask; generation does not use it)
    model.config.output_router_logits = False
    with torch.no_grad():
        g = model.generate(input_ids=gen_ids, attention_mask=gen_mask, max_new_tokens=8, do_sample=False, pad_token_id=0)
    ref["generated_ids"] = g.contiguous()
    save_file({"input_ids": ids, "attention_mask": mask, "labels": labels, "gen_input_ids": gen_ids,
               "gen_attention_mask": gen_mask}, os.path.join(d, "inputs.safetensors"))
    save_file(ref, os.path.join(d, "reference.safetensors"))
    for f in ("tokenizer.json", "tokenizer_config.json"):
        src = os.path.join(out, "llama-tiny", f)
        if os.path.exists(src):
            shutil.copy(src, os.path.join(d, f))
    print("wrote", d)


def _redraw(model):
    """Re-draws every parameter (in model.parameters() order, from the current seed): larger than
    the default init so that every layer matters numerically."""
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n == "shared.weight" or n.endswith("relative_attention_bias.weight"):
                p.normal_(0.0, 1.0)  # T5: as its own init (std 1.0 for the shared embedding)
            elif p.dim() == 2 or n.endswith(".bias"):
                p.normal_(0.0, 0.2)
            else:
                p.uniform_(0.8, 1.2)


def _check_saved_keys(model, d):
    """model.safetensors must hold exactly the named_parameters() names (tied weights once), so
    that every grad.<name> of the reference has its weight in the checkpoint and vice versa."""
    from safetensors import safe_open

    with safe_open(os.path.join(d, "model.safetensors"), "pt") as f:
        saved = set(f.keys())
    params = {n for n, _ in model.named_parameters()}
    assert saved == params, (sorted(saved - params), sorted(params - saved))
    tied = sorted(set(model.state_dict().keys()) - saved)
    print("  model.safetensors: %d tensors; state_dict keys not saved (tied aliases): %s" % (len(saved), tied))


def _causal_lm_fixture(model, d, ids, mask, gen_ids, gen_mask, pad_id):
    """The llama() recipe for any decoder-only model: checkpoint, inputs and reference."""
    os.makedirs(d, exist_ok=True)
    model.save_pretrained(d, safe_serialization=True)
    _check_saved_keys(model, d)
    labels = ids.clone()
    labels[mask == 0] = -100
    outp = model(input_ids=ids, attention_mask=mask, labels=labels)
    outp.loss.backward()
    ref = {"logits": outp.logits.detach().contiguous(), "loss": outp.loss.detach().reshape(1)}
    for n, p in model.named_parameters():
        ref["grad." + n] = p.grad.detach().contiguous()
    with torch.no_grad():
        g = model.generate(input_ids=gen_ids, attention_mask=gen_mask, max_new_tokens=8, do_sample=False,
                           pad_token_id=pad_id)
    ref["generated_ids"] = g.contiguous()
    save_file({"input_ids": ids, "attention_mask": mask, "labels": labels, "gen_input_ids": gen_ids,
               "gen_attention_mask": gen_mask}, os.path.join(d, "inputs.safetensors"))
    save_file(ref, os.path.join(d, "reference.safetensors"))
    print("wrote", d)


def gptj(out):
    """GPT-J: partial rotary (rotary_dim 4 of head_dim 8, rotate_every_two), parallel residual,
    gelu_new, untied lm_head with a bias. bos 1, eos 2, no pad token (generate pads with 0)."""
    from transformers import GPTJConfig, GPTJForCausalLM

    torch.manual_seed(41)  # a draw whose greedy generation stops one row at eos (then pads) and not the other
    cfg = GPTJConfig(
        vocab_size=64, n_embd=32, n_layer=2, n_head=4, rotary_dim=4, n_positions=64,
        activation_function="gelu_new", tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
        attn_implementation="eager",
    )
    model = GPTJForCausalLM(cfg).float().eval()
    _redraw(model)
    ids = torch.tensor([[5, 9, 13, 2, 40, 33, 7], [0, 0, 11, 3, 21, 60, 8]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1, 1]])
    gen_ids = torch.tensor([[5, 9, 13, 2], [0, 0, 11, 3]])
    gen_mask = torch.tensor([[1, 1, 1, 1], [0, 0, 1, 1]])
    _causal_lm_fixture(model, os.path.join(out, "gptj-tiny"), ids, mask, gen_ids, gen_mask, pad_id=0)


def _opt(out, name, do_layer_norm_before, word_embed_proj_dim, seed):
    """OPT with transformers' default special ids: pad 1, bos = eos 2 (OPT's tokenizer starts
    every sequence with </s> = 2). Inputs start with bos; the second row is left-padded with 1.
    lm_head is tied to embed_tokens (OPT's default)."""
    from transformers import OPTConfig, OPTForCausalLM

    torch.manual_seed(seed)
    cfg = OPTConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=2, ffn_dim=48, num_attention_heads=4,
        max_position_embeddings=64, do_layer_norm_before=do_layer_norm_before,
        word_embed_proj_dim=word_embed_proj_dim, activation_function="relu", dropout=0.0,
        attn_implementation="eager",
    )
    assert (cfg.pad_token_id, cfg.bos_token_id, cfg.eos_token_id) == (1, 2, 2)
    model = OPTForCausalLM(cfg).float().eval()
    _redraw(model)
    ids = torch.tensor([[2, 9, 13, 5, 40, 33, 7], [1, 1, 2, 3, 21, 60, 8]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1, 1]])
    gen_ids = torch.tensor([[2, 9, 13, 5], [1, 1, 2, 3]])
    gen_mask = torch.tensor([[1, 1, 1, 1], [0, 0, 1, 1]])
    _causal_lm_fixture(model, os.path.join(out, name), ids, mask, gen_ids, gen_mask, pad_id=cfg.pad_token_id)


def opt(out):
    """OPT as 125m, 1.3b, ...: pre-layer-norm, final_layer_norm, no projections."""
    # seed: a draw whose greedy generation hits eos in both rows, at different steps (so the batch
    # stops before max_new_tokens, the first row padded with pad id 1)
    _opt(out, "opt-tiny", do_layer_norm_before=True, word_embed_proj_dim=32, seed=44)


def opt_350m_shape(out):
    """OPT as 350m: post-layer-norm (no final_layer_norm) and word_embed_proj_dim != hidden_size
    (project_in / project_out)."""
    # seed: a draw whose greedy generation stops one row at eos (then pads with 1) and not the other
    _opt(out, "opt-350m-shape", do_layer_norm_before=False, word_embed_proj_dim=16, seed=145)


def _t5(out, name, v1_1, seed):
    from torch import nn
    from transformers import T5Config, T5ForConditionalGeneration

    torch.manual_seed(seed)
    cfg = T5Config(
        vocab_size=64, d_model=32, d_kv=8, d_ff=48, num_layers=2, num_decoder_layers=2, num_heads=4,
        relative_attention_num_buckets=8, relative_attention_max_distance=16, dropout_rate=0.0,
        feed_forward_proj="gated-gelu" if v1_1 else "relu", tie_word_embeddings=not v1_1,
        pad_token_id=0, eos_token_id=1, decoder_start_token_id=0, attn_implementation="eager",
    )
    model = T5ForConditionalGeneration(cfg)
    if v1_1:
        # transformers 5.x ties lm_head to shared even for tie_word_embeddings=False (that only turns
        # off the d_model**-0.5 scaling of the decoder output) and then saves no lm_head.weight; real
        # T5 v1.1 checkpoints have their own lm_head.weight and "tie_word_embeddings": false, which
        # from_pretrained loads untied. Untie here so that the fixture is such a checkpoint.
        model.lm_head.weight = nn.Parameter(model.shared.weight.detach().clone())
        model.all_tied_weights_keys.pop("lm_head.weight")
        model.config.tie_word_embeddings = False
    model = model.float().eval()
    assert model.config.scale_decoder_outputs == (not v1_1)
    assert (model.lm_head.weight is model.shared.weight) == (not v1_1)
    _redraw(model)
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    model.save_pretrained(d, safe_serialization=True)
    _check_saved_keys(model, d)
    # encoder inputs end with eos (1), as T5's tokenizer appends it; the second row is right-padded
    ids = torch.tensor([[5, 9, 13, 22, 40, 33, 1], [11, 3, 21, 60, 1, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0, 0]])
    labels = torch.tensor([[7, 14, 25, 44, 1], [30, 8, 1, -100, -100]])
    decoder_input_ids = model._shift_right(labels)  # [[0, 7, 14, 25, 44], [0, 30, 8, 1, 0]]
    outp = model(input_ids=ids, attention_mask=mask, labels=labels)
    outp.loss.backward()
    # forward derived the same decoder inputs from labels
    outp2 = model(input_ids=ids, attention_mask=mask, decoder_input_ids=decoder_input_ids)
    assert torch.equal(outp2.logits, outp.logits)
    ref = {"logits": outp.logits.detach().contiguous(), "loss": outp.loss.detach().reshape(1)}
    for n, p in model.named_parameters():
        ref["grad." + n] = p.grad.detach().contiguous()
    gen_ids = torch.tensor([[5, 9, 13, 1], [11, 3, 1, 0]])
    gen_mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]])
    with torch.no_grad():
        g = model.generate(input_ids=gen_ids, attention_mask=gen_mask, max_new_tokens=8, do_sample=False)
        b = model.generate(input_ids=gen_ids, attention_mask=gen_mask, max_new_tokens=8, do_sample=False,
                           num_beams=4, length_penalty=1.0, early_stopping=True)
    ref["generated_ids"] = g.contiguous()
    ref["beam_generated_ids"] = b.contiguous()
    save_file({"input_ids": ids, "attention_mask": mask, "labels": labels, "decoder_input_ids": decoder_input_ids,
               "gen_input_ids": gen_ids, "gen_attention_mask": gen_mask}, os.path.join(d, "inputs.safetensors"))
    save_file(ref, os.path.join(d, "reference.safetensors"))
    print("wrote", d)


def t5(out):
    """T5 v1.0 (t5-tiny: relu FFN, tied head with the d_model**-0.5 scaling) and T5 v1.1
    (t5-v1_1-tiny: gated-gelu FFN with gelu_new, separate unscaled lm_head)."""
    # seeds: draws whose greedy generation stops one row at eos (then pads with 0) and not the
    # other, and whose beam search differs from greedy and finishes a hypothesis at eos
    _t5(out, "t5-tiny", v1_1=False, seed=415)
    _t5(out, "t5-v1_1-tiny", v1_1=True, seed=128)


TOKENIZER_CORPUS = [
    "the cat sat on the mat.",
    "the dog sat on the log.",
    "a cat and a dog met on the road.",
    "the rat ran to the hat and the cat ran after it.",
]


def llama_tokenizer(out):
    """A LLaMA-style (sentencepiece-like, "\u2581" for spaces) BPE tokenizer trained on
    TOKENIZER_CORPUS, for the llama-tiny model (vocab 64, bos 1, eos 2, no pad token): at most
    64 tokens (62: the corpus runs out of merges before).

    Specials: <unk>=0, <s>=1, </s>=2; every encoding starts with <s> (as LLaMA); characters
    not in the corpus become <unk> (no byte fallback: its 256 byte tokens would not fit).
    The model has no pad token, so the tokenizer pads with eos (pad_token = </s>, the usual
    LLaMA recipe; the attention mask tells padding apart), on the left (padding_side "left")."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    # trained on words (merges never cross a space), then given the layout of Llama 2's
    # tokenizer.json: a normalizer that prepends "\u2581" and replaces spaces, no pre-tokenizer,
    # and a Replace + ByteFallback + Fuse + Strip decoder
    tk = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True))
    tk.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)
    trainer = trainers.BpeTrainer(vocab_size=64, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False)
    tk.train_from_iterator(TOKENIZER_CORPUS, trainer)
    assert tk.get_vocab_size() <= 64, tk.get_vocab_size()
    assert [tk.token_to_id(t) for t in ["<unk>", "<s>", "</s>"]] == [0, 1, 2]
    j = json.loads(tk.to_str())
    j["pre_tokenizer"] = None
    tk = Tokenizer.from_str(json.dumps(j))
    tk.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    tk.decoder = decoders.Sequence([
        decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    tk.post_processor = processors.TemplateProcessing(
        single="<s>:0 $A:0", pair="<s>:0 $A:0 <s>:1 $B:1", special_tokens=[("<s>", 1)])
    tok = PreTrainedTokenizerFast(
        tokenizer_object=tk, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="</s>",
        padding_side="left", clean_up_tokenization_spaces=False, model_max_length=64,
    )
    d = os.path.join(out, "llama-tiny")
    os.makedirs(d, exist_ok=True)
    tok.save_pretrained(d)

    texts = [
        "the cat sat on the mat.",
        "a dog ran after the rat",
        "The Zebra ate 42 apples!",  # capitals, digits and '!' are not in the corpus: <unk>
        "  the  hat  ",
    ]
    _tokenizer_expected(d, texts, [texts[0], "a rat", texts[2]])  # 7, 3 and 21 tokens


def _tokenizer_expected(d, texts, rows):
    """Writes <d>/tokenizer_expected.json: what transformers gives with the tokenizer saved in d
    (loaded back as a user of the directory would): the special ids, len(tokenizer), the padding
    side; for each of `texts` the ids with and without special tokens and the decodes of the ids
    with and without skip_special_tokens; and `rows` as a batch padded to the longest (ids and
    attention mask) on the tokenizer's padding side."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast.from_pretrained(d)
    exp = {"vocab_size": len(tok), "bos_id": tok.bos_token_id, "eos_id": tok.eos_token_id,
           "pad_id": tok.pad_token_id, "unk_id": tok.unk_token_id, "padding_side": tok.padding_side,
           "texts": []}
    for t in texts:
        ids = tok(t)["input_ids"]
        exp["texts"].append({
            "text": t,
            "input_ids": ids,
            "input_ids_no_special": tok(t, add_special_tokens=False)["input_ids"],
            "decode_skip_special": tok.decode(ids, skip_special_tokens=True),
            "decode_with_special": tok.decode(ids, skip_special_tokens=False),
        })
    b = tok(rows, padding=True)
    exp["batch"] = {"texts": rows, "input_ids": b["input_ids"], "attention_mask": b["attention_mask"]}
    # AutoTokenizer (which also sees the model's config.json in d) gives the same
    auto = AutoTokenizer.from_pretrained(d)
    assert [auto(t)["input_ids"] for t in texts] == [c["input_ids"] for c in exp["texts"]], d
    assert auto(rows, padding=True)["input_ids"] == b["input_ids"], d
    with open(os.path.join(d, "tokenizer_expected.json"), "w") as f:
        json.dump(exp, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print("wrote tokenizer of", d)


def _check_against_config(tok, d):
    """The saved tokenizer fits the model next to it (its config.json in d, when written): every
    id < vocab_size, and the special ids config.json names (bos, eos, pad) are the tokenizer's."""
    path = os.path.join(d, "config.json")
    if not os.path.exists(path):
        print("  no", path, "(model not written): special ids not checked against it")
        return
    with open(path) as f:
        cfg = json.load(f)
    assert len(tok) <= cfg["vocab_size"], (d, len(tok), cfg["vocab_size"])
    ids = {k: cfg.get(k + "_token_id") for k in ("bos", "eos", "pad")}
    got = {"bos": tok.bos_token_id, "eos": tok.eos_token_id, "pad": tok.pad_token_id}
    for k, v in ids.items():
        assert v is None or got[k] == v, (d, k, got[k], v)


def _byte_level_bpe(special_tokens, unk_token):
    """A GPT-2-style byte-level BPE (ByteLevel pre-tokenizer without a prefix space, ByteLevel
    decoder) trained on TOKENIZER_CORPUS to at most 64 tokens, `special_tokens` first (ids 0..).
    GPT-2's alphabet is all 256 bytes, which do not fit 64 tokens: here it is only the bytes the
    corpus uses (the trainer gets no initial alphabet), and the BPE model maps any other byte to
    `unk_token` (GPT-2 has no unknown token; it never needs one)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tk = Tokenizer(models.BPE(unk_token=unk_token))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=64, special_tokens=special_tokens, show_progress=False)
    tk.train_from_iterator(TOKENIZER_CORPUS, trainer)
    assert tk.get_vocab_size() <= 64, tk.get_vocab_size()
    assert [tk.token_to_id(t) for t in special_tokens] == list(range(len(special_tokens)))
    return tk


# texts for the expected encodings of the byte-level tokenizers: one as in the corpus, one with a
# space before '.' (clean_up_tokenization would remove it), one with bytes outside the corpus
# (capitals, digits, ',', '!' and the two bytes of 'é': each an unknown token), runs of spaces
GPT_TOKENIZER_TEXTS = [
    "the cat sat on the mat.",
    "a dog ran after the rat .",
    "The Zebra ate 42 apples , café!",
    "  the  hat  ",
]
GPT_TOKENIZER_BATCH = [GPT_TOKENIZER_TEXTS[0], "a rat", GPT_TOKENIZER_TEXTS[1]]  # 7, 2 and 8 tokens (+ OPT's </s>)


def gptj_tokenizer(out):
    """A GPT-J-style tokenizer (GPT-2's byte-level BPE, see _byte_level_bpe) for gptj-tiny
    (vocab 64, bos 1, eos 2, no pad token). Specials: <|unk|>=0, <|startoftext|>=1 (bos),
    <|endoftext|>=2 (eos); nothing is added to an encoding (GPT-J's post-processor is GPT-2's
    ByteLevel one, which only trims offsets). Padding: with eos, on the left (GPT-J has no pad
    token; pad = eos is the usual recipe for batched generation)."""
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast

    tk = _byte_level_bpe(["<|unk|>", "<|startoftext|>", "<|endoftext|>"], "<|unk|>")
    tk.post_processor = processors.ByteLevel(trim_offsets=False)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=tk, bos_token="<|startoftext|>", eos_token="<|endoftext|>", unk_token="<|unk|>",
        pad_token="<|endoftext|>", padding_side="left", clean_up_tokenization_spaces=False, model_max_length=64,
    )
    d = os.path.join(out, "gptj-tiny")
    tok.save_pretrained(d)
    _check_against_config(tok, d)
    _tokenizer_expected(d, GPT_TOKENIZER_TEXTS, GPT_TOKENIZER_BATCH)


def opt_tokenizer(out):
    """An OPT-style tokenizer (GPT-2's byte-level BPE, see _byte_level_bpe) for opt-tiny and
    opt-350m-shape (vocab 64, pad 1, bos = eos 2). Specials as facebook/opt-*: <s>=0 (unused),
    <pad>=1, </s>=2 (bos and eos), <unk>=3 (OPT's unk is </s>; here unknown bytes need their own).
    Every encoding starts with </s>, as OPT's GPT2Tokenizer with add_bos_token: a
    TemplateProcessing post-processor "</s> $A" ("</s> $A </s> $B" for pairs). Padding with
    <pad>, on the left (as the fixtures' batches); clean_up_tokenization_spaces as OPT's config
    (true), which transformers ignores for a BPE model."""
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast

    tk = _byte_level_bpe(["<s>", "<pad>", "</s>", "<unk>"], "<unk>")
    tk.post_processor = processors.TemplateProcessing(
        single="</s>:0 $A:0", pair="</s>:0 $A:0 </s>:1 $B:1", special_tokens=[("</s>", 2)])
    tok = PreTrainedTokenizerFast(
        tokenizer_object=tk, bos_token="</s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>",
        padding_side="left", clean_up_tokenization_spaces=True, model_max_length=64,
    )
    for name in ("opt-tiny", "opt-350m-shape"):
        d = os.path.join(out, name)
        tok.save_pretrained(d)
        _check_against_config(tok, d)
        _tokenizer_expected(d, GPT_TOKENIZER_TEXTS, GPT_TOKENIZER_BATCH)


T5_TOKENIZER_CORPUS = [
    "the cat sat on the mat.",
    "the cats sat on the mats.",
    "the dog played with the dogs.",
    "the dogs are playing in the park.",
    "a cat walked and then walked on.",
    "they are walking, then they play.",
    "the rat ran to the hat and the cat ran after it.",
]


def t5_tokenizer(out):
    """A T5-style tokenizer (sentencepiece Unigram) for t5-tiny and t5-v1_1-tiny (vocab 64,
    pad 0, eos 1, decoder start = pad): a Unigram model trained by the tokenizers library's
    UnigramTrainer on T5_TOKENIZER_CORPUS (44 tokens with the specials; the trainer stops there),
    laid out as t5-small's tokenizer.json: a normalizer collapsing runs of spaces, a WhitespaceSplit + Metaspace
    ("\u2581", prepend always) pre-tokenizer, a Metaspace decoder, and a TemplateProcessing
    post-processor appending </s> ("$A </s>", pairs "$A </s> $B </s>"). Specials <pad>=0,
    </s>=1, <unk>=2 (no bos); characters outside the corpus are <unk> (consecutive ones fused into
    one, as Unigram does). Padding with <pad> on the right; clean_up_tokenization_spaces true (as
    T5's tokenizer), which transformers applies to a Unigram model. t5-small's precompiled
    sentencepiece normalizer and its 100 <extra_id_*> sentinels are left out.

    The trainer is not bit-reproducible across processes (tokenizers iterates Rust hash maps: the
    EM sums in varying order, and the characters it pruned get min_score + k * 1e-4 in varying
    order), so the trained pieces are rebuilt into a Unigram with the scores rounded to 4 decimals,
    those within 0.01 of the lowest all given the lowest, ties ordered by the piece."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "</s>", "<unk>"]
    tk = Tokenizer(models.Unigram())
    tk.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)
    trainer = trainers.UnigramTrainer(vocab_size=64, special_tokens=specials, unk_token="<unk>", show_progress=False)
    tk.train_from_iterator(T5_TOKENIZER_CORPUS, trainer)
    pieces = json.loads(tk.to_str())["model"]["vocab"]
    assert [p for p, _ in pieces[:3]] == specials, pieces[:3]
    pieces = pieces[3:]
    lowest = min(s for _, s in pieces)
    pieces = [(p, round(lowest if s < lowest + 0.01 else s, 4)) for p, s in pieces]
    pieces.sort(key=lambda ps: (-ps[1], ps[0]))
    vocab = [(t, 0.0) for t in specials] + pieces
    assert len(vocab) <= 64, len(vocab)

    tk = Tokenizer(models.Unigram(vocab, unk_id=2, byte_fallback=False))
    tk.add_special_tokens(specials)
    tk.normalizer = normalizers.Replace(Regex(" {2,}"), " ")
    tk.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.WhitespaceSplit(),
        pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)])
    tk.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)
    tk.post_processor = processors.TemplateProcessing(
        single="$A:0 </s>:0", pair="$A:0 </s>:0 $B:1 </s>:1", special_tokens=[("</s>", 1)])
    assert [tk.token_to_id(t) for t in specials] == [0, 1, 2]
    tok = PreTrainedTokenizerFast(
        tokenizer_object=tk, eos_token="</s>", unk_token="<unk>", pad_token="<pad>",
        padding_side="right", clean_up_tokenization_spaces=True, model_max_length=64,
    )
    texts = [
        "the cat sat on the mat.",
        "the dogs are walking in the park .",  # clean_up_tokenization: "park."
        "The Zebra ate 42 apples , café!",  # "T", "Z", "b", "42", "pp", "é", "!": <unk>; clean-up: "apples,"
        "  then  they played  ",
    ]
    for name in ("t5-tiny", "t5-v1_1-tiny"):
        d = os.path.join(out, name)
        tok.save_pretrained(d)
        _check_against_config(tok, d)
        _tokenizer_expected(d, texts, [texts[0], "a cat", texts[3]])  # 9, 2 and 7 tokens + </s>


def llama_1b(out):
    """Not a fixture (2.2 GB, never committed): a randomly initialised 1.1B LLaMA in TinyLlama's
    shape (hidden 2048, 22 layers, 32 heads, 4 kv heads, intermediate 5632, vocab 32000),
    saved by transformers in bf16, for `cargo xtask bench real-size`."""
    import transformers

    d = os.path.join(out, "llama-1.1b")
    torch.manual_seed(0)
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        cfg = transformers.LlamaConfig(
            hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
            num_key_value_heads=4, vocab_size=32000, max_position_embeddings=2048, rms_norm_eps=1e-5,
            tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
        model = transformers.LlamaForCausalLM(cfg)
    finally:
        torch.set_default_dtype(old)
    model.config.torch_dtype = torch.bfloat16
    model.save_pretrained(d, safe_serialization=True, max_shard_size="10GB")
    print(f"wrote {d}")


def llama_7b(out):
    """Not a fixture (13.5 GB, never committed): a random LLaMA-2-7B shape (hidden 4096, 32
    layers, 32 heads, intermediate 11008, vocab 32000) in bf16, written tensor by tensor (never
    whole in memory: made on the meta device, the matrices normal std 0.02 from one pool of draws, norms 1) into
    shards of at most 4 GB, with llama-tiny's tokenizer (its 64 tokens; the other rows are never
    reached), for the 7B rows of docs/benchmarks.md (`redco convert --to gguf --quantize q4_k`,
    then `mpirun -np 2 redco generate --mesh 1x2`)."""
    import shutil

    import transformers

    d = os.path.join(out, "llama-7b")
    os.makedirs(d, exist_ok=True)
    cfg = transformers.LlamaConfig(
        hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=32, vocab_size=32000, max_position_embeddings=4096, rms_norm_eps=1e-5,
        tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(cfg)
    cfg.torch_dtype = torch.bfloat16
    cfg.save_pretrained(d)
    # drawing 6.7e9 normals takes most of an hour on two cores: each matrix is read from
    # one pool of 2^26 draws at its own offset (cyclically), which is all a benchmark of
    # memory and speed needs
    gen = torch.Generator().manual_seed(0)
    pool = (torch.randn(1 << 26, generator=gen) * 0.02).to(torch.bfloat16)
    shard, size, index, n = {}, 0, {}, 0

    def draw(shape, at):
        k = int(torch.tensor(shape).prod())
        reps = (at % pool.numel() + k) // pool.numel() + 1
        return pool.repeat(reps)[at % pool.numel():at % pool.numel() + k].reshape(shape).clone()

    def flush():
        nonlocal shard, size, n
        if shard:
            n += 1
            name = f"model-{n:05d}.safetensors"
            save_file(shard, os.path.join(d, name), metadata={"format": "pt"})
            index.update({k: name for k in shard})
            shard, size = {}, 0

    for i, (name, p) in enumerate(model.named_parameters()):
        t = torch.ones(p.shape, dtype=torch.bfloat16) if p.dim() == 1 else draw(p.shape, 7919 * 1009 * i)
        if size + t.numel() * 2 > 4 << 30:
            flush()
        shard[name] = t
        size += t.numel() * 2
    flush()
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": sum(p.numel() * 2 for p in model.parameters())}, "weight_map": index}, f)
    tok = os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../tests/fixtures/llama-tiny")
    for name in ["tokenizer.json", "tokenizer_config.json"]:
        shutil.copy(os.path.join(tok, name), os.path.join(d, name))
    print(f"wrote {d}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", choices=["llama", "mixtral", "qwen3-moe", "tokenizer", "gptj", "opt", "opt-350m", "t5",
                                       "gptj-tokenizer", "opt-tokenizer", "t5-tokenizer", "llama-1.1b", "llama-7b"],
                    help="write one fixture only (opt: opt-tiny, opt-350m: opt-350m-shape, t5: t5-tiny and t5-v1_1-tiny)"
                    " or one tokenizer only (tokenizer: llama-tiny's, opt-tokenizer: opt-tiny's and"
                    " opt-350m-shape's, t5-tokenizer: t5-tiny's and t5-v1_1-tiny's); llama-1.1b writes"
                    " the benchmark model of `xtask bench real-size`, llama-7b a random 7B shape (neither part of the default set)")
    a = ap.parse_args()
    if a.only in (None, "llama"):
        llama(a.out)
    if a.only in (None, "mixtral"):
        mixtral(a.out)
    if a.only in (None, "qwen3-moe"):
        qwen3_moe(a.out)
    if a.only in (None, "tokenizer"):
        llama_tokenizer(a.out)
    if a.only in (None, "gptj"):
        gptj(a.out)
    if a.only in (None, "opt"):
        opt(a.out)
    if a.only in (None, "opt-350m"):
        opt_350m_shape(a.out)
    if a.only in (None, "t5"):
        t5(a.out)
    if a.only in (None, "gptj-tokenizer"):
        gptj_tokenizer(a.out)
    if a.only in (None, "opt-tokenizer"):
        opt_tokenizer(a.out)
    if a.only in (None, "t5-tokenizer"):
        t5_tokenizer(a.out)
    if a.only == "llama-1.1b":
        llama_1b(a.out)
    if a.only == "llama-7b":
        llama_7b(a.out)
