"""The official openai client against quench serve: chat, streaming, completions,
embeddings, models, sessions."""

import json
import math
import uuid

import openai
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

    info = http.get(f"/v1/sessions/{sid}").json()
    assert info["turns"] == 2 and info["cached_tokens"] > 0
    # Without API keys sessions are reached by id only, never listed.
    listing = http.get("/v1/sessions")
    assert listing.status_code == 403
    assert listing.json()["error"]["code"] == "session_listing_needs_api_key"

    assert http.delete(f"/v1/sessions/{sid}").status_code == 200
    assert http.get(f"/v1/sessions/{sid}").status_code == 404
    after = ask(client, chat_model, [second_q], extra_body={"session_id": sid})
    fresh = ask(client, chat_model, [second_q])
    assert after.choices[0].message.content == fresh.choices[0].message.content
    assert after.usage.prompt_tokens == fresh.usage.prompt_tokens
    # Nothing of the forgotten conversation is reused; what the two share with earlier
    # requests (the chat template's opening) may come from the prefix cache, alike.
    cached = after.usage.prompt_tokens_details.cached_tokens
    assert cached == fresh.usage.prompt_tokens_details.cached_tokens
    assert cached < first.usage.prompt_tokens


def test_health_and_metrics(http):
    assert http.get("/health").json()["status"] == "ok"
    text = http.get("/metrics").text
    for family in ("quench_requests_total", "quench_queue_depth", "quench_kv_blocks_used",
                   "quench_time_to_first_token_seconds_bucket",
                   "quench_inter_token_latency_seconds_bucket", "quench_completion_tokens_total"):
        assert family in text, family


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather of a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 40},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}


def check_weather_call(name, arguments):
    args = json.loads(arguments)
    assert name == "get_weather"
    assert set(args) == {"city", "unit"}, args
    assert isinstance(args["city"], str) and len(args["city"]) <= 40
    assert args["unit"] in ("celsius", "fahrenheit")
    return args


def test_tool_calls_whole_streamed_and_answered(client, chat_model, real_models):
    messages = [{"role": "user", "content": "What is the weather in Paris, in celsius?"}]
    kw = dict(tools=[WEATHER], tool_choice="required", parallel_tool_calls=False, max_tokens=60)
    r = ask(client, chat_model, messages, **kw)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    args = check_weather_call(call.function.name, call.function.arguments)
    if real_models:
        assert "Paris" in args["city"], args

    # Streamed: the deltas add up to the same call.
    parts, finish = {}, None
    for chunk in ask(client, chat_model, messages, stream=True, **kw):
        for c in chunk.choices:
            for d in c.delta.tool_calls or []:
                p = parts.setdefault(d.index, {"name": "", "arguments": ""})
                p["name"] += d.function.name or ""
                p["arguments"] += d.function.arguments or ""
            finish = c.finish_reason or finish
    assert finish == "tool_calls"
    assert list(parts) == [0]
    assert check_weather_call(parts[0]["name"], parts[0]["arguments"]) == args

    # The call and its result go back; the model answers in text.
    messages += [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature": 18})},
    ]
    r = ask(client, chat_model, messages, tools=[WEATHER], tool_choice="none", max_tokens=30)
    assert r.choices[0].message.content and not r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason in ("stop", "length")


def test_a_named_tool_choice_and_bad_tools(client, chat_model):
    other = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}
    r = ask(client, chat_model, [{"role": "user", "content": "Weather in Rome?"}],
            tools=[other, WEATHER], max_tokens=60,
            tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert r.choices[0].finish_reason == "tool_calls", r
    [call] = r.choices[0].message.tool_calls
    check_weather_call(call.function.name, call.function.arguments)
    with pytest.raises(openai.BadRequestError) as e:
        ask(client, chat_model, [{"role": "user", "content": "x"}], tools=[WEATHER],
            tool_choice={"type": "function", "function": {"name": "nowhere"}})
    assert e.value.body["param"] == "tool_choice.function.name"


def test_structured_output_follows_its_schema(client, chat_model):
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                               "age": {"type": "integer", "minimum": 0, "maximum": 99}},
              "required": ["name", "age"], "additionalProperties": False}
    r = ask(client, chat_model, [{"role": "user", "content": "Invent a person as JSON."}],
            max_tokens=60,
            response_format={"type": "json_schema",
                             "json_schema": {"name": "person", "schema": schema, "strict": True}})
    assert r.choices[0].finish_reason == "stop", r
    v = json.loads(r.choices[0].message.content)
    assert set(v) == {"name", "age"} and 0 <= v["age"] <= 99 and len(v["name"]) <= 12


def test_several_choices_each_with_its_own_seed(client, chat_model):
    def ask(n, seed):
        return client.chat.completions.create(
            model=chat_model, messages=[{"role": "user", "content": "Name a colour."}],
            max_tokens=8, temperature=1.0, seed=seed, n=n)

    r = ask(3, 11)
    assert [c.index for c in r.choices] == [0, 1, 2]
    for k in range(3):
        assert r.choices[k].message.content == ask(1, 11 + k).choices[0].message.content
    stream = client.chat.completions.create(
        model=chat_model, messages=[{"role": "user", "content": "Name a colour."}],
        max_tokens=8, temperature=1.0, seed=11, n=3, stream=True)
    texts = ["", "", ""]
    for chunk in stream:
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
    assert texts == [c.message.content for c in r.choices]
