"""LangChain against quench (langchain-openai's ChatOpenAI): `bind_tools` gets tool calls
back, `with_structured_output` gets a parsed object, both the JSON-schema and the
tool-calling method."""

from typing import Literal

import langchain_openai
import pytest
from pydantic import BaseModel, Field


class GetWeather(BaseModel):
    """Get the current weather in a city."""

    city: str = Field(max_length=40, description="The city")
    unit: Literal["celsius", "fahrenheit"]


class Person(BaseModel):
    name: str = Field(max_length=24)
    age: int = Field(ge=0, le=120)


@pytest.fixture(scope="module")
def llm(base_url, chat_model):
    return langchain_openai.ChatOpenAI(model=chat_model, base_url=base_url, api_key="unused",
                                       temperature=0, max_tokens=80, max_retries=0, timeout=120)


def test_bind_tools_returns_tool_calls(llm, real_models):
    bound = llm.bind_tools([GetWeather], tool_choice="any")
    reply = bound.invoke("What is the weather in Paris, in celsius?")
    assert reply.tool_calls, reply
    call = reply.tool_calls[0]
    assert call["name"] == "GetWeather"
    args = GetWeather(**call["args"])
    if real_models:
        assert "Paris" in args.city


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_with_structured_output_parses_an_object(llm, method):
    structured = llm.with_structured_output(Person, method=method)
    person = structured.invoke("Invent a person with a name and an age.")
    assert isinstance(person, Person)
    assert 0 <= person.age <= 120 and len(person.name) <= 24
