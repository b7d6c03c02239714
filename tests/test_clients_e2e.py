"""Clients that need the model to follow the request (structured output, tool loops, streamed
tool calls, embedding dimensions) work through the whole stack against the simulator's guided decoding.
Each test asserts on the result, not only on success."""
from __future__ import annotations

import json
from pathlib import Path
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


# --- other clients -------------------------------------------------------------------------------

def test_langchain_openai(gateway: Gateway, org: tuple[str, str, str]) -> None:
    from langchain_core.messages import ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI, OpenAIEmbeddings

    llm = ChatOpenAI(model="polish-pro", base_url=gateway.v1, api_key=org[2], max_retries=0)
    assert llm.invoke("Cześć").content
    assert "".join(str(c.content) for c in llm.stream("Cześć"))
    trip = llm.with_structured_output(Trip).invoke("Plan a trip")
    assert isinstance(trip, Trip) and isinstance(trip.stops[0], City)

    @tool
    def get_weather(city: str) -> str:
        """Weather in a city."""
        return f"słonecznie w {city}"

    bound = llm.bind_tools([get_weather])
    messages: list = [("user", "Pogoda w Krakowie?")]
    ai = bound.invoke(messages)
    (call,) = ai.tool_calls
    assert call["name"] == "get_weather" and isinstance(call["args"]["city"], str)
    messages += [ai, ToolMessage(get_weather.invoke(call["args"]), tool_call_id=call["id"])]
    final = bound.invoke(messages)
    assert not final.tool_calls and "słonecznie" in str(final.content)
    emb = OpenAIEmbeddings(model="embed", base_url=gateway.v1, api_key=org[2], dimensions=256,
                           check_embedding_ctx_length=False)
    assert len(emb.embed_query("Ala ma kota")) == 256


def test_instructor_tools_and_json(gateway: Gateway, org: tuple[str, str, str]) -> None:
    import instructor

    for mode in (instructor.Mode.TOOLS, instructor.Mode.JSON):
        client = instructor.from_openai(openai.OpenAI(base_url=gateway.v1, api_key=org[2], max_retries=0),
                                        mode=mode)
        city = client.chat.completions.create(model="polish-pro", response_model=City, max_retries=0,
                                              messages=[{"role": "user", "content": "A city"}])
        assert isinstance(city, City) and city.country in ("PL", "DE", "CZ")


def test_pydantic_ai_output_type_and_tool(gateway: Gateway, org: tuple[str, str, str]) -> None:
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    model = OpenAIChatModel("polish-pro", provider=OpenAIProvider(base_url=gateway.v1, api_key=org[2]))
    agent = Agent(model, output_type=City)
    assert isinstance(agent.run_sync("A city").output, City)

    calls: list[str] = []
    tool_agent = Agent(model)

    @tool_agent.tool_plain
    def get_weather(city: str) -> str:
        """Weather in a city."""
        calls.append(city)
        return "pada deszcz"

    result = tool_agent.run_sync("Pogoda w Gdańsku?")
    assert len(calls) == 1 and "pada deszcz" in result.output


def test_llm_cli(gateway: Gateway, org: tuple[str, str, str], tmp_path) -> None:
    import os
    import subprocess
    import sys

    (tmp_path / "extra-openai-models.yaml").write_text(
        f"- model_id: gw-pro\n  model_name: polish-pro\n  api_base: {gateway.v1}\n  api_key_name: gw\n")
    (tmp_path / "keys.json").write_text(json.dumps({"gw": org[2]}))
    llm_bin = Path(sys.executable).parent / "llm"
    out = subprocess.run([str(llm_bin), "-m", "gw-pro", "--no-log", "Cześć"], capture_output=True, text=True,
                         timeout=60, env={**os.environ, "LLM_USER_PATH": str(tmp_path)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip()


# --- the README's quickstart and docs/clients.md's snippets, run as written ------------------------

def _snippets() -> dict[str, str]:
    from docs_blocks import marked

    return {b.marker.removeprefix("client-snippet: "): b.text for b in marked("client-snippet: ")}


def _run(args: list[str], env: dict[str, str]) -> str:
    import os
    import subprocess
    import sys

    bindir = str(Path(sys.executable).parent)
    out = subprocess.run(args, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PATH": bindir + os.pathsep + os.environ.get("PATH", ""), **env})
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


@pytest.mark.parametrize("name", ["openai", "langchain", "pydantic-ai", "instructor"])
def test_readme_python_snippet(gateway: Gateway, org: tuple[str, str, str], name: str) -> None:
    import sys

    code = _snippets()[name]
    out = _run([sys.executable, "-c", code], {"OPENAI_BASE_URL": gateway.v1, "OPENAI_API_KEY": org[2]})
    assert "name=" in out and "population=" in out, out
    if name == "openai":
        assert out.strip().splitlines()[-1].endswith("słonecznie, 21 °C")
    if name == "langchain":
        assert out.strip().splitlines()[-1] == "256"


def test_readme_llm_snippet(gateway: Gateway, org: tuple[str, str, str], tmp_path) -> None:
    snippets = _snippets()
    yaml_text = snippets["llm-yaml"].replace("http://127.0.0.1:8080/v1", gateway.v1)
    assert yaml_text != snippets["llm-yaml"]
    (tmp_path / "extra-openai-models.yaml").write_text(yaml_text)
    (tmp_path / "keys.json").write_text(json.dumps({"gateway": org[2]}))
    out = _run(["sh", "-c", snippets["llm-sh"]], {"LLM_USER_PATH": str(tmp_path)})
    assert out.strip()


def test_readme_openai_quickstart(gateway: Gateway, org: tuple[str, str, str]) -> None:
    """The first snippet names the address and key `make run` prints: the test's stand in for them."""
    import sys

    code = _snippets()["openai-quickstart"]
    assert 'base_url="http://127.0.0.1:8080/v1", api_key="sk-service-…"' in code
    code = code.replace("http://127.0.0.1:8080/v1", gateway.v1).replace("sk-service-…", org[2])
    out = _run([sys.executable, "-c", code], {}).strip().splitlines()
    assert "prompt_tokens=" in out[0] and "completion_tokens=" in out[0], out
    assert "CompletionUsage(" in out[-2] and out[-1].startswith("[") and len(out) > 4, out


def _records(gateway: Gateway, org_id: str, n: int) -> list[tuple[str, str, int]]:
    """The organisation's first ``n`` usage records (alias, endpoint, status), once written."""
    from conftest import wait_for

    q = "SELECT alias, endpoint, status FROM usage_records WHERE org_id = $1 ORDER BY started_at"
    wait_for(lambda: len(gateway.sql(q, org_id)) >= n, timeout=10, interval=0.1)
    return [(r["alias"], r["endpoint"], r["status"]) for r in gateway.sql(q, org_id)]


def test_readme_openai_agents_snippet(gateway: Gateway) -> None:
    """openai-agents in its chat-completions mode: the agent calls the tool and answers with its result."""
    import sys

    org, _, key = gateway.new_org(10_000_000)
    out = _run([sys.executable, "-c", _snippets()["openai-agents"]], {"OPENAI_BASE_URL": gateway.v1, "OPENAI_API_KEY": key})
    assert out.strip().endswith("słonecznie, 21 °C"), out
    # the turn that calls the tool, then the answer: both chat completions, none to the Responses API
    assert _records(gateway, org, 2) == [("polish-pro", "chat", 200)] * 2


def _node_clients() -> Path:
    """The Vercel AI SDK, installed from npm by `make test` (make node-clients) into .venv/node-clients."""
    import shutil

    where = Path(__file__).resolve().parent.parent / ".venv" / "node-clients"
    if shutil.which("node") is None or not (where / "node_modules" / "@ai-sdk" / "openai").is_dir():
        pytest.skip("the Vercel AI SDK is not installed (make node-clients: needs node and npm)")
    return where


def test_readme_vercel_ai_snippet(gateway: Gateway) -> None:
    """The Vercel AI SDK through openai.chat(): text, a stream with its usage, and an embedding."""
    where = _node_clients()
    script = where / "snippet.mjs"
    script.write_text(_snippets()["vercel-ai"])
    org, _, key = gateway.new_org(10_000_000)
    out = _run(["node", str(script)], {"OPENAI_BASE_URL": gateway.v1, "OPENAI_API_KEY": key}).strip().splitlines()
    first = out[0].rsplit(" ", 2)
    assert first[0].strip() and int(first[1]) > 0 and int(first[2]) > 0, out
    assert int(out[-2]) > 0 and out[-1] == "1024", out
    assert _records(gateway, org, 3) == [("polish-pro", "chat", 200), ("polish-fast", "chat", 200),
                                         ("embed", "embeddings", 200)]



def _costs_shown_are_billed(gateway: Gateway, lines: list[str]) -> None:
    """Each "<request id> <cost>" line a snippet printed: the usage record and the ledger debit of that
    request id hold the same integer."""
    from conftest import wait_for

    for line in lines:
        request_id, cost = line.split()
        [rec] = wait_for(lambda: gateway.sql("SELECT * FROM usage_records WHERE request_id = $1", request_id),
                         timeout=10, interval=0.05)
        ledger = gateway.sql("SELECT amount_micro_pln FROM ledger WHERE ref = $1", "usage:" + request_id)
        assert cost.isdigit() and int(cost) > 0, lines
        assert int(cost) == rec["cost_micro_pln"] == -ledger[0]["amount_micro_pln"], (line, rec)


def test_readme_cost_python_snippet(gateway: Gateway, monkeypatch: pytest.MonkeyPatch,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    """The openai SDK (a reply, a stream's usage chunk) and langchain read cost_micro_pln.  Run in this
    process (a new interpreter importing langchain takes seconds): only the environment is the snippet's."""
    org, _, key = gateway.new_org(10_000_000)
    monkeypatch.setenv("OPENAI_BASE_URL", gateway.v1)
    monkeypatch.setenv("OPENAI_API_KEY", key)
    capsys.readouterr()
    exec(compile(_snippets()["cost-python"], "docs/clients.md", "exec"), {})  # noqa: S102
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 3, out
    _costs_shown_are_billed(gateway, out[:2])
    q = "SELECT cost_micro_pln FROM usage_records WHERE org_id = $1 ORDER BY started_at"
    from conftest import wait_for
    rows = wait_for(lambda: len(gateway.sql(q, org)) == 3 and gateway.sql(q, org), timeout=10, interval=0.05)
    assert int(out[2]) == rows[2]["cost_micro_pln"] > 0, (out, rows)  # langchain's, the third request


def test_readme_cost_vercel_ai_snippet(gateway: Gateway) -> None:
    """The Vercel AI SDK's usage keeps only the token counts; the reply's own usage, with its
    cost_micro_pln, is in ``response.body`` (generateText with ``include: {responseBody: true}``, embed)
    and in the stream's raw chunks (``includeRawChunks``)."""
    where = _node_clients()
    script = where / "cost.mjs"
    script.write_text(_snippets()["cost-vercel-ai"])
    _, _, key = gateway.new_org(10_000_000)
    out = _run(["node", str(script)], {"OPENAI_BASE_URL": gateway.v1, "OPENAI_API_KEY": key}).strip().splitlines()
    assert len(out) == 3, out
    _costs_shown_are_billed(gateway, out)
