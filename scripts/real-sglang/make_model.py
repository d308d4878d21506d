"""Writes a tiny Llama model directory for the real SGLang server on a CPU: nothing is downloaded.

    python make_model.py DIR

- config.json: a 2-layer LlamaForCausalLM (hidden 128, 4 heads, 2 KV heads, head_dim 32);
  the server runs it with --load-format dummy (random weights, the same in every process).
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


def main(out):
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


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: make_model.py DIR")
    main(sys.argv[1])
