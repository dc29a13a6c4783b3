"""Writes tiny random Hugging Face checkpoints and transformers' reference outputs for the
parity tests (run by `cargo xtask fixtures`; needs torch and transformers, not part of CI).

For each model: <out>/<name>/config.json + model.safetensors (the checkpoint),
inputs.safetensors (input_ids, attention_mask, labels, gen_input_ids, gen_attention_mask)
and reference.safetensors (logits, loss, grad.<param>, generated_ids).

<out>/llama-tiny/ also gets a tokenizer (tokenizer.json, tokenizer_config.json) and
tokenizer_expected.json: what transformers' encode, decode and padded batch give with it."""
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

    # what a user of the saved directory gets
    tok = PreTrainedTokenizerFast.from_pretrained(d)
    texts = [
        "the cat sat on the mat.",
        "a dog ran after the rat",
        "The Zebra ate 42 apples!",  # capitals, digits and '!' are not in the corpus: <unk>
        "  the  hat  ",
    ]
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
    rows = [texts[0], "a rat", texts[2]]  # 7, 3 and 21 tokens
    b = tok(rows, padding=True)
    exp["batch"] = {"texts": rows, "input_ids": b["input_ids"], "attention_mask": b["attention_mask"]}
    with open(os.path.join(d, "tokenizer_expected.json"), "w") as f:
        json.dump(exp, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print("wrote tokenizer of", d)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", choices=["llama", "tokenizer"], help="write one fixture only")
    a = ap.parse_args()
    if a.only in (None, "llama"):
        llama(a.out)
    if a.only in (None, "tokenizer"):
        llama_tokenizer(a.out)
