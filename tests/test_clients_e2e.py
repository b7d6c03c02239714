"""Issue 20: clients that need the model to follow the request (structured output, tool loops, streamed
tool calls, embedding dimensions) work through the whole stack against the simulator's guided decoding.
Each test asserts on the result, not only on success."""
from __future__ import annotations

import json
from typing import Literal

import openai
import pytest
from pydantic import BaseModel

from conftest import Gateway


class City(BaseModel):
    name: str
    population: int
    country: Literal["PL", "DE", "CZ"]


class Trip(BaseModel):
    title: str
    stops: list[City]
    note: str | None


WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "unit": {"type": "string", "enum": ["C", "F"]}},
        "required": ["city", "unit"], "additionalProperties": False}, "strict": True}}


@pytest.fixture
def sdk(gateway: Gateway, org: tuple[str, str, str]) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.v1, api_key=org[2], max_retries=0, timeout=30)


def test_openai_parse_pydantic(sdk: openai.OpenAI) -> None:
    done = sdk.chat.completions.parse(model="polish-pro", response_format=Trip,
                                      messages=[{"role": "user", "content": "Plan a trip"}])
    trip = done.choices[0].message.parsed
    assert isinstance(trip, Trip) and trip.stops and isinstance(trip.stops[0], City)
    assert trip.stops[0].country in ("PL", "DE", "CZ")
    assert done.usage is not None and done.usage.completion_tokens > 5


def test_openai_two_turn_tool_loop(sdk: openai.OpenAI) -> None:
    messages: list = [{"role": "user", "content": "Weather in Kraków?"}]
    first = sdk.chat.completions.create(model="polish-pro", messages=messages, tools=[WEATHER_TOOL])
    assert first.choices[0].finish_reason == "tool_calls"
    (call,) = first.choices[0].message.tool_calls or []
    args = json.loads(call.function.arguments)
    assert call.function.name == "get_weather" and isinstance(args["city"], str) and args["unit"] in ("C", "F")
    messages += [first.choices[0].message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": "21 stopni"}]
    second = sdk.chat.completions.create(model="polish-pro", messages=messages, tools=[WEATHER_TOOL])
    assert second.choices[0].finish_reason == "stop"
    assert "21 stopni" in (second.choices[0].message.content or "")


def test_openai_streamed_tool_calls(sdk: openai.OpenAI) -> None:
    with sdk.chat.completions.stream(model="polish-pro", tools=[openai.pydantic_function_tool(City)],
                                     tool_choice="required",
                                     messages=[{"role": "user", "content": "A city"}]) as stream:
        final = stream.get_final_completion()
    (call,) = final.choices[0].message.tool_calls or []
    assert call.function.name == "City" and isinstance(call.function.parsed_arguments, City)
    assert final.choices[0].finish_reason == "tool_calls"


def test_openai_embedding_dimensions(sdk: openai.OpenAI) -> None:
    e = sdk.embeddings.create(model="embed", input=["Ala ma kota"], dimensions=256)
    assert len(e.data[0].embedding) == 256
    assert abs(sum(v * v for v in e.data[0].embedding) - 1) < 1e-6
