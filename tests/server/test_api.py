"""The official openai client against quench serve: chat, streaming, completions,
embeddings, models, sessions."""

import math
import uuid

import pytest


def ask(client, model, messages, **kw):
    return client.chat.completions.create(
        model=model, messages=messages, temperature=0, max_tokens=kw.pop("max_tokens", 24), **kw
    )


def test_models_lists_both_kinds(client, chat_model, embed_model):
    ids = [m.id for m in client.models.list().data]
    assert chat_model in ids and embed_model in ids


def test_chat(client, chat_model, real_models):
    question = "What is the capital of France?"
    r = ask(client, chat_model, [{"role": "user", "content": question}], max_tokens=16)
    choice = r.choices[0]
    assert r.object == "chat.completion" and r.model == chat_model
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens > len(question) // 8
    assert 1 <= r.usage.completion_tokens <= 16
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    if real_models:
        assert "Paris" in choice.message.content, choice.message.content


def test_streaming_chat_matches_the_whole_answer(client, chat_model):
    messages = [{"role": "user", "content": "Tell me a short story about a robot."}]
    whole = ask(client, chat_model, messages)
    stream = ask(client, chat_model, messages, stream=True, stream_options={"include_usage": True})
    pieces, finish, usage, roles = [], None, None, []
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for c in chunk.choices:
            if c.delta.role:
                roles.append(c.delta.role)
            if c.delta.content:
                pieces.append(c.delta.content)
            if c.finish_reason:
                finish = c.finish_reason
    assert roles == ["assistant"]
    assert len(pieces) >= 2, "the answer came in one piece: not streamed"
    assert "".join(pieces) == whole.choices[0].message.content
    assert finish == whole.choices[0].finish_reason
    assert usage.completion_tokens == whole.usage.completion_tokens


def test_stop_strings_cut_the_answer(client, chat_model):
    messages = [{"role": "user", "content": "Count from one to twenty."}]
    full = ask(client, chat_model, messages, max_tokens=30).choices[0].message.content
    assert len(full) >= 6
    stop = full[3:5]
    cut = ask(client, chat_model, messages, max_tokens=30, stop=[stop, "\x01unused"])
    assert cut.choices[0].message.content == full[: full.index(stop)]
    assert cut.choices[0].finish_reason == "stop"


def test_logprobs(client, chat_model):
    r = ask(client, chat_model, [{"role": "user", "content": "Hi"}], max_tokens=5,
            logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    for item in content:
        assert item.logprob <= 0 and len(item.top_logprobs) == 3
        assert math.isclose(item.logprob, max(t.logprob for t in item.top_logprobs), abs_tol=1e-5)


def test_completions_plain_and_streamed(client, chat_model):
    kw = dict(model=chat_model, prompt="The quick brown fox", max_tokens=12, temperature=0)
    whole = client.completions.create(**kw)
    assert whole.object == "text_completion" and whole.choices[0].text
    streamed = "".join(c.choices[0].text for c in client.completions.create(stream=True, **kw) if c.choices)
    assert streamed == whole.choices[0].text
    seeded = dict(kw, temperature=1.2, top_p=0.95, seed=7)
    a = client.completions.create(**seeded).choices[0].text
    b = client.completions.create(**seeded).choices[0].text
    assert a == b


def test_embeddings(client, embed_model, real_models):
    texts = ["A cat sits on the mat.", "A kitten rests on a rug.", "Interest rates rose again."]
    r = client.embeddings.create(model=embed_model, input=texts)
    vectors = [d.embedding for d in sorted(r.data, key=lambda d: d.index)]
    assert len(vectors) == 3 and len({len(v) for v in vectors}) == 1
    for v in vectors:
        assert math.isclose(math.sqrt(sum(x * x for x in v)), 1.0, abs_tol=1e-4)
    assert r.usage.prompt_tokens > 6
    one = client.embeddings.create(model=embed_model, input=texts[0]).data[0].embedding
    assert max(abs(a - b) for a, b in zip(one, vectors[0])) < 1e-6
    if real_models:
        cos = lambda a, b: sum(x * y for x, y in zip(a, b))
        assert cos(vectors[0], vectors[1]) > cos(vectors[0], vectors[2]) + 0.2


def test_a_session_continues_a_conversation_and_its_reset_takes_effect(client, http, chat_model):
    sid = f"py-{uuid.uuid4().hex[:12]}"
    first_q = {"role": "user", "content": "My name is Ada. Remember it."}
    second_q = {"role": "user", "content": "What is my name?"}
    first = ask(client, chat_model, [first_q], extra_body={"session_id": sid})
    second = ask(client, chat_model, [second_q], extra_body={"session_id": sid})
    # Only the new turn was computed ...
    assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens
    # ... and the answer is that of the whole conversation sent at once.
    reply1 = first.choices[0].message.content
    whole = ask(client, chat_model, [first_q, {"role": "assistant", "content": reply1}, second_q])
    assert second.choices[0].message.content == whole.choices[0].message.content
    assert second.usage.prompt_tokens == whole.usage.prompt_tokens

    listed = {s["id"]: s for s in http.get("/v1/sessions").json()["data"]}
    assert listed[sid]["turns"] == 2 and listed[sid]["cached_tokens"] > 0

    assert http.delete(f"/v1/sessions/{sid}").status_code == 200
    assert sid not in {s["id"] for s in http.get("/v1/sessions").json()["data"]}
    after = ask(client, chat_model, [second_q], extra_body={"session_id": sid})
    fresh = ask(client, chat_model, [second_q])
    assert after.choices[0].message.content == fresh.choices[0].message.content
    assert after.usage.prompt_tokens == fresh.usage.prompt_tokens
    assert after.usage.prompt_tokens_details.cached_tokens == 0


def test_health_and_metrics(http):
    assert http.get("/health").json()["status"] == "ok"
    text = http.get("/metrics").text
    for family in ("quench_requests_total", "quench_queue_depth", "quench_kv_blocks_used",
                   "quench_time_to_first_token_seconds_bucket",
                   "quench_inter_token_latency_seconds_bucket", "quench_completion_tokens_total"):
        assert family in text, family
