#!/usr/bin/env python3
"""Times llama.cpp (through llama-cpp-python) on the workload `quench bench --vs-llama-cpp`
gives it, and prints the raw timings as one JSON object on stdout.

The workload is the one quench times: evaluate the prompt ids in one batch (prefill), then
decode greedily, one token per evaluation, `--gen-tokens` tokens in all, the first from the
prompt's logits. Each run starts from an empty KV cache; one short warm-up run comes first.
quench computes the rates from these timings exactly as it does from its own.

Usage (normally run by quench):
  python3 scripts/bench/llama_cpp_bench.py --model M.gguf --prompt-ids 1,2,3 \
      --gen-tokens 64 --threads 2 --repeats 3
"""

import argparse
import json
import time

import numpy as np
import llama_cpp


def last_logits(llm):
    """The logits of the last token evaluated (Llama.scores is only filled with logits_all)."""
    ptr = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
    return np.ctypeslib.as_array(ptr, shape=(llm.n_vocab(),))


def run(llm, prompt_ids, gen_tokens):
    """Seconds from the start to the end of prefill, and to each generated token."""
    llm.reset()
    start = time.perf_counter()
    llm.eval(prompt_ids)
    prefill = time.perf_counter() - start
    token_times = []
    for k in range(gen_tokens):
        if k > 0:
            llm.eval([token])
        token = int(np.argmax(last_logits(llm)))
        token_times.append(time.perf_counter() - start)
    return {"prefill_s": prefill, "token_times_s": token_times}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompt-ids", required=True, help="comma-separated token ids")
    ap.add_argument("--gen-tokens", type=int, required=True)
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--repeats", type=int, required=True)
    args = ap.parse_args()
    prompt_ids = [int(t) for t in args.prompt_ids.split(",")]

    n_ctx = len(prompt_ids) + args.gen_tokens
    llm = llama_cpp.Llama(
        model_path=args.model,
        n_ctx=n_ctx,
        n_batch=len(prompt_ids),
        n_threads=args.threads,
        n_threads_batch=args.threads,
        logits_all=False,
        verbose=False,
    )
    run(llm, prompt_ids[:16], 4)
    runs = [run(llm, prompt_ids, args.gen_tokens) for _ in range(args.repeats)]
    print(
        json.dumps(
            {
                "llama_cpp_python_version": llama_cpp.__version__,
                "system_info": llama_cpp.llama_print_system_info().decode().strip(),
                "runs": runs,
            }
        )
    )


if __name__ == "__main__":
    main()
