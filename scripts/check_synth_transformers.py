#!/usr/bin/env python3
"""Check quench against Hugging Face transformers on a synthetic checkpoint.

Writes a seeded random checkpoint with `quench synth` (or takes one given with --model),
has `quench generate` continue a prompt greedily while keeping the logits of every step,
then runs transformers' AutoModelForCausalLM on the prompt and the generated tokens
(teacher-forced) and compares:

  - the prompt's token ids (quench's tokenizer against AutoTokenizer);
  - every logit of every step, within 0.05 + 0.003 * |transformers' logit|;
  - the most likely token of every step.

Needs torch and transformers (`pip install torch transformers`). Prints a JSON summary and
exits 1 when a comparison fails.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quench", default="target/release/quench", help="the quench binary")
    p.add_argument("--model", help="an existing checkpoint directory (skips synth)")
    p.add_argument("--arch", default="llama", choices=["llama", "qwen2", "qwen3"])
    p.add_argument("--shape", default="tiny")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--dtype", default="bf16", choices=["bf16", "f16", "f32"])
    p.add_argument("--prompt", default="the cat sat on the mat and then")
    p.add_argument("--steps", type=int, default=8, help="tokens to generate")
    args = p.parse_args()

    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # transformers 5 renamed torch_dtype to dtype.
    dtype_arg = "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = args.model
        if model_dir is None:
            model_dir = os.path.join(tmp, "model")
            subprocess.run(
                [args.quench, "synth", "--arch", args.arch, "--shape", args.shape,
                 "--seed", str(args.seed), "--dtype", args.dtype, model_dir],
                check=True,
            )
        record_path = os.path.join(tmp, "quench.json")
        subprocess.run(
            [args.quench, "generate", "-m", model_dir, "-q", "--temperature", "0",
             "--max-tokens", str(args.steps), "--logits-out", record_path, args.prompt],
            check=True, stdout=subprocess.DEVNULL,
        )
        with open(record_path) as f:
            record = json.load(f)

        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        hf_prompt = tokenizer(args.prompt)["input_ids"]
        model = AutoModelForCausalLM.from_pretrained(model_dir, **{dtype_arg: torch.float32})
        model.eval()
        tokens = record["prompt_tokens"] + record["tokens"]
        with torch.no_grad():
            logits = model(torch.tensor([tokens])).logits[0].double()

    failures = []
    if hf_prompt != record["prompt_tokens"]:
        failures.append(f"prompt tokens differ: quench {record['prompt_tokens']}, "
                        f"transformers {hf_prompt}")
    start = len(record["prompt_tokens"]) - 1
    worst, out_of_bound, top1_differ = 0.0, 0, []
    for step, row in enumerate(record["logits"]):
        ours = torch.tensor(row, dtype=torch.float64)
        ref = logits[start + step]
        diff = (ours - ref).abs()
        bound = 0.05 + 0.003 * ref.abs()
        out_of_bound += int((diff > bound).sum())
        worst = max(worst, float(diff.max()))
        if int(ours.argmax()) != int(ref.argmax()):
            top1_differ.append(step)
    if out_of_bound:
        failures.append(f"{out_of_bound} logits outside 0.05 + 0.003|ref|")
    if top1_differ:
        failures.append(f"most likely token differs at steps {top1_differ}")

    print(json.dumps({
        "checkpoint": args.model or f"synth {args.arch} {args.shape} seed {args.seed} {args.dtype}",
        "prompt_tokens": len(record["prompt_tokens"]),
        "steps": len(record["logits"]),
        "max_abs_logit_difference": worst,
        "bound": "0.05 + 0.003 * |transformers logit|",
        "passed": not failures,
        "failures": failures,
    }, indent=2))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
