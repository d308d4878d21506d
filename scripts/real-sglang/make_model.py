"""Writes a tiny Llama model directory for the real SGLang server on a CPU: nothing is downloaded.

    python make_model.py DIR [SEED] [GIB]

- config.json: a 2-layer LlamaForCausalLM (hidden 128, 4 heads, 2 KV heads, head_dim 32).
- model.safetensors: its weights, random from SEED (default 0) with transformers' own
  initialisation, ~0.7 MB. Real files, not --load-format dummy: SGLang 0.5.23 refuses
  /update_weights_from_disk on a server started with dummy weights ("Failed to get model
  loader: DummyModelLoader"), and pdctl's in-place weights rollout is tested on the real
  server. Two SEEDs give two versions of the same model.
- tokenizer.json + tokenizer_config.json: a byte-level BPE tokenizer built with the
  `tokenizers` library (the 256 byte tokens and three specials, no merges).
vocab_size equals the tokenizer's size: a larger one lets the model emit ids that decode to
nothing. The files are rewritten only when their content changes.

With GIB (the prefetch benchmark, scripts/bench-prefetch): a Llama as wide as a 1B model (hidden
2048, 16 heads, 4 KV heads) with as many layers as make about GIB GiB of bf16 weights, in 1 GiB
shards with their index as a hub checkpoint has them; random normal weights (std 0.02, norms 1)
written tensor by tensor, so the fp32 model never exists in memory. Slow to run on a CPU, and only
there to be read from disk.
"""

import json
import os
import sys

from tokenizers import Tokenizer, decoders, models, pre_tokenizers

SPECIALS = ["<s>", "</s>", "<unk>"]


def tokenizer():
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {tok: i for i, tok in enumerate(SPECIALS)}
    for ch in sorted(alphabet):
        vocab[ch] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return tok, len(vocab)


def write(path, text):
    try:
        with open(path, encoding="utf-8") as f:
            if f.read() == text:
                return
    except FileNotFoundError:
        pass
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def weights(out, config, seed):
    """model.safetensors for `config`, random from `seed` (the same bytes on every run)."""
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(**config)).to(torch.bfloat16)
    tensors = {k: v.contiguous() for k, v in model.state_dict().items()}
    tmp = os.path.join(out, "model.safetensors.tmp")
    save_file(tensors, tmp, metadata={"format": "pt"})
    os.chmod(tmp, 0o644)
    os.replace(tmp, os.path.join(out, "model.safetensors"))


def main(out, seed):
    os.makedirs(out, exist_ok=True)
    tok, size = tokenizer()
    write(os.path.join(out, "tokenizer.json"), tok.to_str())
    write(
        os.path.join(out, "tokenizer_config.json"),
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<s>",
                "eos_token": "</s>",
                "unk_token": "<unk>",
                "model_max_length": 4096,
                "clean_up_tokenization_spaces": False,
            },
            indent=1,
        ),
    )
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "hidden_act": "silu",
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "vocab_size": size,
        "bos_token_id": 0,
        "eos_token_id": 1,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    }
    write(os.path.join(out, "config.json"), json.dumps(config, indent=1))
    write(os.path.join(out, "generation_config.json"), json.dumps({"bos_token_id": 0, "eos_token_id": 1}, indent=1))
    weights(out, config, seed)


def big(out, seed, gib):
    """A checkpoint of about `gib` GiB in 1 GiB safetensors shards with its index."""
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaConfig, LlamaForCausalLM

    os.makedirs(out, exist_ok=True)
    tok, size = tokenizer()
    write(os.path.join(out, "tokenizer.json"), tok.to_str())
    write(os.path.join(out, "tokenizer_config.json"), json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "model_max_length": 4096, "clean_up_tokenization_spaces": False}, indent=1))
    hidden, inter, kv = 2048, 5632, 4
    per_layer = 2 * (2 * hidden * hidden + 2 * hidden * kv * 128 + 3 * hidden * inter + 2 * hidden)
    layers = max(1, round(gib * (1 << 30) / per_layer))
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden, "intermediate_size": inter,
        "num_hidden_layers": layers, "num_attention_heads": 16, "num_key_value_heads": kv, "head_dim": 128, "hidden_act": "silu",
        "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "vocab_size": size, "bos_token_id": 0,
        "eos_token_id": 1, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    }
    write(os.path.join(out, "config.json"), json.dumps(config, indent=1))
    write(os.path.join(out, "generation_config.json"), json.dumps({"bos_token_id": 0, "eos_token_id": 1}, indent=1))
    with torch.device("meta"):
        shapes = [(k, tuple(v.shape)) for k, v in LlamaForCausalLM(LlamaConfig(**config)).state_dict().items()]
    g = torch.Generator().manual_seed(seed)
    shard, shard_bytes, index, n = {}, 0, {}, 0

    def flush():
        nonlocal shard, shard_bytes, n
        if shard:
            n += 1
            name = f"model-{n:05d}.safetensors"
            save_file(shard, os.path.join(out, name), metadata={"format": "pt"})
            index.update({k: name for k in shard})
            shard, shard_bytes = {}, 0

    for k, shape in shapes:
        t = torch.ones(shape) if len(shape) == 1 else torch.randn(shape, generator=g) * 0.02
        shard[k] = t.to(torch.bfloat16)
        shard_bytes += shard[k].numel() * 2
        if shard_bytes >= 1 << 30:
            flush()
    flush()
    write(os.path.join(out, "model.safetensors.index.json"), json.dumps({"metadata": {}, "weight_map": index}, indent=1))


if __name__ == "__main__":
    if len(sys.argv) == 4:
        big(sys.argv[1], int(sys.argv[2]), float(sys.argv[3]))
    elif len(sys.argv) in (2, 3):
        main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) == 3 else 0)
    else:
        sys.exit("usage: make_model.py DIR [SEED] [GIB]")
