"""Shared fixtures: the server under test is started by run.sh, which exports its address.

QUENCH_URL          base URL of the OpenAI API (http://127.0.0.1:PORT/v1)
QUENCH_CHAT_MODEL   the model that generates text
QUENCH_EMBED_MODEL  the model that makes embeddings
QUENCH_REAL_MODELS  "1" when those are SmolLM2 and MiniLM (answers can be checked for sense)
"""

import json
import os
import urllib.error
import urllib.request

import openai
import pytest


class Reply:
    def __init__(self, status, headers, body):
        self.status_code = status
        self.headers = headers
        self.content = body
        self.text = body.decode("utf-8", "replace")

    def json(self):
        return json.loads(self.content)


class Http:
    """Plain HTTP requests to the server (the standard library's, so that nothing but the
    openai client is needed)."""

    def __init__(self, root):
        self.root = root

    def request(self, method, path, content=None, json_body=None, headers=None):
        if json_body is not None:
            content = json.dumps(json_body).encode()
        headers = dict(headers or {})
        if content is not None:
            headers.setdefault("Content-Type", "application/json")
        req = urllib.request.Request(self.root + path, data=content, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                return Reply(r.status, r.headers, r.read())
        except urllib.error.HTTPError as e:
            return Reply(e.code, e.headers, e.read())

    def get(self, path):
        return self.request("GET", path)

    def delete(self, path):
        return self.request("DELETE", path)

    def post(self, path, json=None, content=None, headers=None):
        return self.request("POST", path, content=content, json_body=json, headers=headers)


def _env(name):
    value = os.environ.get(name)
    if not value:
        pytest.exit(f"{name} is not set: run tests/server/run.sh", returncode=2)
    return value


@pytest.fixture(scope="session")
def base_url():
    return _env("QUENCH_URL")


@pytest.fixture(scope="session")
def root_url(base_url):
    return base_url.rsplit("/v1", 1)[0]


@pytest.fixture(scope="session")
def chat_model():
    return _env("QUENCH_CHAT_MODEL")


@pytest.fixture(scope="session")
def embed_model():
    return _env("QUENCH_EMBED_MODEL")


@pytest.fixture(scope="session")
def real_models():
    return os.environ.get("QUENCH_REAL_MODELS") == "1"


@pytest.fixture(scope="session")
def client(base_url):
    return openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="session")
def http(root_url):
    return Http(root_url)


@pytest.fixture(scope="session")
def context_length(http, chat_model):
    models = http.get("/v1/models").json()["data"]
    return next(m["context_length"] for m in models if m["id"] == chat_model)
