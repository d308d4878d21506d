"""Writes a tiny Llama model directory for the real SGLang server on a CPU: nothing is downloaded.

    python make_model.py DIR [SEED]

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


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit("usage: make_model.py DIR [SEED]")
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) == 3 else 0)
