"""Structured output over a suite of fifty JSON Schemas (schema_suite.py): every reply must
parse and validate against its schema (jsonschema, with format checks), greedy and sampled.
The requests run concurrently, as a server's clients would."""

import json
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import pytest

from schema_suite import SUITE


def test_the_suite_is_fifty_valid_schemas():
    assert len(SUITE) >= 50
    assert len({name for name, _, _ in SUITE}) == len(SUITE)
    for name, schema, _ in SUITE:
        jsonschema.Draft202012Validator.check_schema(schema)


def answer(client, model, name, schema, prompt, temperature):
    r = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": prompt + " Answer in JSON."}],
        max_tokens=256,
        temperature=temperature,
        seed=7,
        response_format={"type": "json_schema",
                         "json_schema": {"name": name, "schema": schema, "strict": True}},
    )
    return r.choices[0]


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_every_reply_validates_against_its_schema(client, chat_model, temperature):
    with ThreadPoolExecutor(max_workers=8) as pool:
        choices = list(pool.map(
            lambda case: answer(client, chat_model, *case, temperature), SUITE))
    failures = []
    for (name, schema, _), choice in zip(SUITE, choices):
        text = choice.message.content
        try:
            assert choice.finish_reason == "stop", f"finish_reason {choice.finish_reason}"
            value = json.loads(text)
            jsonschema.validate(value, schema, cls=jsonschema.Draft202012Validator,
                                format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
        except (AssertionError, ValueError, jsonschema.ValidationError) as e:
            failures.append(f"{name}: {e.__class__.__name__}: {str(e)[:200]} in {text!r}")
    print(f"schema suite at temperature {temperature}: "
          f"{len(SUITE) - len(failures)} of {len(SUITE)} replies valid")
    assert not failures, "\n".join(failures)
