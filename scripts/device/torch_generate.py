"""PyTorch + transformers decode speed on a Hugging Face checkpoint, for the side-by-side
table next to `quench bench --device cuda` (same checkpoint, prompt and lengths).

    python3 torch_generate.py CHECKPOINT_DIR [--prompt-tokens 128] [--gen-tokens 128]
                              [--repeats 3] [--modes eager,static-compiled]

The prompt is the ids (i·7919 + 13) mod vocab, as quench bench feeds; decoding is greedy
with EOS ignored (min_new_tokens), bf16 weights. Each token's time is taken when
generate hands it to the streamer (after a device synchronize), so the decode rate is
(N − 1) / (t(N) − t(1)) as quench reports it. "static-compiled" uses transformers' static
KV cache, with which generate compiles the decoding forward pass (torch.compile); warm-up
runs pay for the compilation. Prints one JSON object."""
import argparse
import json
import statistics
import time

import torch
import transformers
from transformers import AutoModelForCausalLM


class TokenClock:
    """A generate() streamer that records when each new token arrives."""

    def __init__(self):
        self.times = []
        self.prompt_seen = False

    def put(self, value):
        torch.cuda.synchronize()
        now = time.perf_counter()
        if not self.prompt_seen:  # generate() first passes the prompt
            self.prompt_seen = True
            return
        self.times.append(now)

    def end(self):
        pass


def timed_generate(model, ids, gen_tokens, **kwargs):
    clock = TokenClock()
    torch.cuda.synchronize()
    start = time.perf_counter()
    model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=gen_tokens,
        min_new_tokens=gen_tokens,
        do_sample=False,
        streamer=clock,
        **kwargs,
    )
    t = clock.times
    if len(t) != gen_tokens:
        raise RuntimeError(f"generate produced {len(t)} tokens, not {gen_tokens}")
    steps = [(b - a) * 1e3 for a, b in zip(t, t[1:])]
    return {
        "prefill_ms": (t[0] - start) * 1e3,
        "decode_tokens_per_s": (len(t) - 1) / (t[-1] - t[0]),
        "ms_per_token_p50": statistics.median(steps),
    }


def main():
    p = argparse.ArgumentParser()
    p.add_argument("checkpoint")
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--gen-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--modes", default="eager,static-compiled")
    a = p.parse_args()

    model = AutoModelForCausalLM.from_pretrained(a.checkpoint, dtype=torch.bfloat16).to("cuda")
    model.eval()
    vocab = model.config.vocab_size
    ids = torch.tensor(
        [[(i * 7919 + 13) % vocab for i in range(a.prompt_tokens)]], device="cuda"
    )
    out = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device": torch.cuda.get_device_name(0),
        "checkpoint": a.checkpoint,
        "prompt_tokens": a.prompt_tokens,
        "gen_tokens": a.gen_tokens,
        "modes": {},
    }
    for mode in a.modes.split(","):
        kwargs = {"cache_implementation": "static"} if mode == "static-compiled" else {}
        try:
            with torch.inference_mode():
                warm = [timed_generate(model, ids, a.gen_tokens, **kwargs) for _ in range(2)]
                runs = [timed_generate(model, ids, a.gen_tokens, **kwargs) for _ in range(a.repeats)]
            out["modes"][mode] = {
                "decode_tokens_per_s": statistics.median(r["decode_tokens_per_s"] for r in runs),
                "prefill_tokens_per_s": statistics.median(
                    a.prompt_tokens / (r["prefill_ms"] * 1e-3) for r in runs
                ),
                "warm_up_decode_tokens_per_s": [r["decode_tokens_per_s"] for r in warm],
                "runs": runs,
            }
        except Exception as e:  # a mode that fails is reported, not hidden
            out["modes"][mode] = {"error": f"{type(e).__name__}: {e}"}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
