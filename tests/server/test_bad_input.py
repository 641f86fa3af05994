"""Bad requests get OpenAI-style errors naming the field at fault, and the server keeps
serving: after each one a normal request must succeed."""

import json
import socket
import time
from urllib.parse import urlparse

import pytest


def normal_request_succeeds(http, chat_model):
    r = http.post("/v1/chat/completions", json={
        "model": chat_model, "messages": [{"role": "user", "content": "ok?"}], "max_tokens": 2})
    assert r.status_code == 200, r.text


def cases(chat_model, embed_model, context_length):
    msgs = [{"role": "user", "content": "hi"}]
    chat = "/v1/chat/completions"
    long_text = "word " * (context_length + 10)
    return [
        # (name, path, raw body, status, param)
        ("malformed JSON", chat, b'{"model": "x", "messages": [', 400, None),
        ("wrong type: messages", chat, {"model": chat_model, "messages": "hi"}, 400, "messages"),
        ("wrong type: content", chat, {"model": chat_model, "messages": [{"role": "user", "content": 1}]}, 400, "messages[0].content"),
        ("wrong type: max_tokens", chat, {"model": chat_model, "messages": msgs, "max_tokens": "5"}, 400, "max_tokens"),
        ("wrong type: stream", chat, {"model": chat_model, "messages": msgs, "stream": "yes"}, 400, "stream"),
        ("unknown model", chat, {"model": "no-such-model", "messages": msgs}, 404, "model"),
        ("empty messages", chat, {"model": chat_model, "messages": []}, 400, "messages"),
        ("max_tokens zero", chat, {"model": chat_model, "messages": msgs, "max_tokens": 0}, 400, "max_tokens"),
        ("max_tokens negative", chat, {"model": chat_model, "messages": msgs, "max_tokens": -3}, 400, "max_tokens"),
        ("max_tokens past the context", chat, {"model": chat_model, "messages": msgs, "max_tokens": context_length + 1}, 400, "max_tokens"),
        ("prompt longer than the context", chat, {"model": chat_model, "messages": [{"role": "user", "content": long_text}]}, 400, "messages"),
        ("completion prompt longer than the context", "/v1/completions", {"model": chat_model, "prompt": long_text}, 400, "prompt"),
        ("embedding input of the wrong type", "/v1/embeddings", {"model": embed_model, "input": 42}, 400, "input"),
        ("unknown embedding model", "/v1/embeddings", {"model": "nope", "input": "x"}, 404, "model"),
        ("body over 1 MiB", chat, b'{"model": "x", "messages": "' + b"a" * (1 << 20) + b'"}', 413, None),
    ]


@pytest.mark.parametrize("index", range(15))
def test_bad_request(http, chat_model, embed_model, context_length, index):
    name, path, body, status, param = cases(chat_model, embed_model, context_length)[index]
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = http.post(path, content=raw, headers={"Content-Type": "application/json"})
    assert r.status_code == status, f"{name}: {r.status_code} {r.text[:300]}"
    error = r.json()["error"]
    assert set(error) >= {"message", "type", "param", "code"}, name
    assert error["param"] == param, f"{name}: {error}"
    if param:
        assert param.split("[")[0] in error["message"], f"{name}: {error['message']}"
    normal_request_succeeds(http, chat_model)


def test_the_openai_client_raises_typed_errors(client, chat_model):
    import openai
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "x"}])
    assert e.value.body["param"] == "model"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=chat_model, messages=[])
    assert e.value.body["param"] == "messages"


def test_slow_loris_clients_are_dropped_and_others_served(root_url, http, chat_model):
    """The server runs with --header-timeout 2 --body-timeout 2 (run.sh)."""
    url = urlparse(root_url)
    started = time.monotonic()
    slow_headers = socket.create_connection((url.hostname, url.port))
    slow_headers.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n")
    slow_body = socket.create_connection((url.hostname, url.port))
    slow_body.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n"
                      b"Content-Type: application/json\r\nContent-Length: 500\r\n\r\n{\"mod")
    normal_request_succeeds(http, chat_model)
    for s in (slow_headers, slow_body):
        s.settimeout(10)
    # Headers never finished: the connection is closed (perhaps after a 408).
    try:
        data = slow_headers.recv(4096)
    except ConnectionResetError:
        data = b""
    assert data == b"" or data.startswith(b"HTTP/1.1 408"), data[:200]
    reply = slow_body.recv(4096)
    assert reply.startswith(b"HTTP/1.1 408"), reply[:200]
    assert time.monotonic() - started < 8
    normal_request_succeeds(http, chat_model)
