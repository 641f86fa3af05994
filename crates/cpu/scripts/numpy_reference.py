#!/usr/bin/env python3
"""An independent llama forward in numpy (float64), for checking quench-cpu's reference.

It reads a GGUF llama model with the `gguf` package, undoes llama.cpp's q/k row permutation to
get Hugging Face's layout back, and runs the Hugging Face computation (rotate-half RoPE), so it
shares neither code nor RoPE convention with quench-cpu's GGUF path.

    python3 numpy_reference.py MODEL.gguf LOGITS.bin TOKEN...

LOGITS.bin holds quench-cpu's f64 logits ([tokens, vocab], from `--example logits`); the
script prints the largest difference and whether the argmax agrees at every position.
"""
import sys

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize


def main():
    path, logits_path, *token_args = sys.argv[1:]
    tokens = [int(t) for t in token_args]
    r = GGUFReader(path)

    def meta(key):
        f = r.fields[key]
        return f.parts[f.data[0]].tolist()[0] if len(f.data) == 1 else None

    arch = bytes(r.fields["general.architecture"].parts[-1]).decode()
    assert arch == "llama", f"only llama here, not {arch}"
    dim = meta("llama.embedding_length")
    n_layers = meta("llama.block_count")
    n_heads = meta("llama.attention.head_count")
    n_kv = meta("llama.attention.head_count_kv")
    eps = meta("llama.attention.layer_norm_rms_epsilon")
    theta = meta("llama.rope.freq_base")
    hd = dim // n_heads

    tensors = {t.name: t for t in r.tensors}

    def weight(name):
        t = tensors[name]
        w = dequantize(t.data, t.tensor_type).astype(np.float64)
        # numpy shape is outermost first: [out, in] for matrices.
        return w.reshape([int(d) for d in reversed(t.shape)]) if w.ndim != len(t.shape) else w

    def unpermute(w, heads):
        # llama.cpp stored row 2j+h of each head from Hugging Face row h*(hd/2)+j.
        return w.reshape(heads, hd // 2, 2, -1).swapaxes(1, 2).reshape(w.shape)

    def rms(x, w):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w

    inv_freq = theta ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)
    pos = np.arange(len(tokens), dtype=np.float64)
    angles = np.outer(pos, inv_freq)
    cos = np.concatenate([np.cos(angles)] * 2, -1)
    sin = np.concatenate([np.sin(angles)] * 2, -1)

    def rope(x):  # x: [heads, seq, hd]
        x1, x2 = x[..., : hd // 2], x[..., hd // 2 :]
        return x * cos + np.concatenate([-x2, x1], -1) * sin

    emb = weight("token_embd.weight")
    x = emb[tokens]
    n = len(tokens)
    mask = np.triu(np.full((n, n), -np.inf), 1)
    for l in range(n_layers):
        p = f"blk.{l}."
        h = rms(x, weight(p + "attn_norm.weight"))
        q = h @ unpermute(weight(p + "attn_q.weight"), n_heads).T
        k = h @ unpermute(weight(p + "attn_k.weight"), n_kv).T
        v = h @ weight(p + "attn_v.weight").T
        q = rope(q.reshape(n, n_heads, hd).transpose(1, 0, 2))
        k = rope(k.reshape(n, n_kv, hd).transpose(1, 0, 2))
        v = v.reshape(n, n_kv, hd).transpose(1, 0, 2)
        k = np.repeat(k, n_heads // n_kv, 0)
        v = np.repeat(v, n_heads // n_kv, 0)
        s = q @ k.transpose(0, 2, 1) / np.sqrt(hd) + mask
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        a = (s @ v).transpose(1, 0, 2).reshape(n, n_heads * hd)
        x = x + a @ weight(p + "attn_output.weight").T
        h = rms(x, weight(p + "ffn_norm.weight"))
        g = h @ weight(p + "ffn_gate.weight").T
        u = h @ weight(p + "ffn_up.weight").T
        x = x + (g / (1 + np.exp(-g)) * u) @ weight(p + "ffn_down.weight").T
    out = weight("output.weight") if "output.weight" in tensors else emb
    ref = rms(x, weight("output_norm.weight")) @ out.T

    got = np.fromfile(logits_path, dtype="<f8").reshape(ref.shape)
    diff = np.abs(got - ref)
    print(f"logits {ref.shape}, |ref| max {np.abs(ref).max():.3f}")
    print(f"max |quench - numpy| = {diff.max():.3e}, max relative {(diff / (1 + np.abs(ref))).max():.3e}")
    print(f"argmax agrees at {(got.argmax(-1) == ref.argmax(-1)).sum()} of {n} positions")


if __name__ == "__main__":
    main()
