#!/usr/bin/env python3
"""Writes the byte-level BPE tokenizer of a GGUF file (its `tokenizer.ggml.*` keys) as a
Hugging Face `tokenizer.json` and `tokenizer_config.json` in DIR, so that a synthetic
checkpoint (`quench synth`) can be given a real model's vocabulary: the structured-output
mask's cost depends on the vocabulary it walks.

Usage: gguf_tokenizer_json.py FILE.gguf DIR   (needs `pip install gguf`)
"""

import json
import sys
from pathlib import Path

from gguf import GGUFReader


def field(reader, key):
    f = reader.fields[key]
    if len(f.types) > 1:  # an array: one part per element
        return [f.contents(i) for i in range(len(f.data))]
    return f.contents()


def main():
    src, out = sys.argv[1], Path(sys.argv[2])
    r = GGUFReader(src)
    if field(r, "tokenizer.ggml.model") != "gpt2":
        sys.exit(f"{src}: not a byte-level BPE tokenizer")
    tokens = field(r, "tokenizer.ggml.tokens")
    types = field(r, "tokenizer.ggml.token_type")
    merges = field(r, "tokenizer.ggml.merges")
    # Token type 3 is a control token (GGUF's llama_token_type).
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True}
             for i, (t, kind) in enumerate(zip(tokens, types)) if kind == 3]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                  "use_regex": True}
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": byte_level,
        "post_processor": None,
        "decoder": byte_level,
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False,
                  "vocab": {t: i for i, t in enumerate(tokens)}, "merges": merges},
    }
    bos = tokens[field(r, "tokenizer.ggml.bos_token_id")]
    eos = tokens[field(r, "tokenizer.ggml.eos_token_id")]
    config = {"bos_token": bos, "eos_token": eos, "add_bos_token": False,
              "model_max_length": 8192,
              "chat_template": field(r, "tokenizer.chat_template")}
    out.mkdir(parents=True, exist_ok=True)
    (out / "tokenizer.json").write_text(json.dumps(tokenizer, ensure_ascii=False))
    (out / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False))
    print(f"{out}: {len(tokens)} tokens, {len(merges)} merges, {len(added)} special")


if __name__ == "__main__":
    main()
