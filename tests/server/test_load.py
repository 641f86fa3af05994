"""32 concurrent streaming clients, 3 requests each: every request completes, greedy answers
equal the same request sent alone, and time to first token and throughput are reported."""

import asyncio
import statistics
import time

import openai

CLIENTS = 32
REQUESTS_EACH = 3
MAX_TOKENS = 12
QUESTIONS = [
    "What is the capital of France?",
    "Name three colors.",
    "Say hello in Spanish.",
    "What is two plus two?",
    "Write one word that rhymes with cat.",
    "What color is the sky?",
    "Name a planet.",
    "What do bees make?",
]


def question(client, request):
    return QUESTIONS[(client * REQUESTS_EACH + request) % len(QUESTIONS)]


async def stream_one(api, model, text):
    started = time.monotonic()
    first = None
    pieces = []
    usage = None
    stream = await api.chat.completions.create(
        model=model, messages=[{"role": "user", "content": text}], max_tokens=MAX_TOKENS,
        temperature=0, stream=True, stream_options={"include_usage": True})
    async for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for c in chunk.choices:
            if c.delta.content:
                if first is None:
                    first = time.monotonic() - started
                pieces.append(c.delta.content)
    return "".join(pieces), first, usage.completion_tokens


def percentile(values, p):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def test_concurrent_streams(base_url, chat_model):
    async def main():
        api = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=600)
        alone = {}
        for q in QUESTIONS:
            alone[q] = (await stream_one(api, chat_model, q))[0]

        results, errors = [], []

        async def client(i):
            for j in range(REQUESTS_EACH):
                q = question(i, j)
                try:
                    results.append((q,) + await stream_one(api, chat_model, q))
                except Exception as e:  # every failure is counted and shown
                    errors.append(f"client {i} request {j}: {e!r}")

        started = time.monotonic()
        await asyncio.gather(*(client(i) for i in range(CLIENTS)))
        wall = time.monotonic() - started
        await api.close()
        return alone, results, errors, wall

    alone, results, errors, wall = asyncio.run(main())
    assert errors == [], errors
    assert len(results) == CLIENTS * REQUESTS_EACH
    different = [(q, a) for q, a, _, _ in results if a != alone[q]]
    assert different == [], f"{len(different)} answers differ from the same request alone"
    ttfts = [t for _, _, t, _ in results if t is not None]
    tokens = sum(n for _, _, _, n in results)
    print(f"\nload: {CLIENTS} clients x {REQUESTS_EACH} requests, {len(results)} completed, 0 errors, "
          f"all {len(results)} greedy answers equal to the request alone")
    print(f"load: TTFT p50 {statistics.median(ttfts) * 1000:.0f} ms, "
          f"p99 {percentile(ttfts, 99) * 1000:.0f} ms; {tokens} tokens in {wall:.1f} s = "
          f"{tokens / wall:.1f} tokens/s")
