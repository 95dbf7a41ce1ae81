"""The Responses API through the official openai SDK, on a simulated backend (fast): a
response's input items (``responses.input_items.list``, paged both ways, per tenant),
function_call and function_call_output items kept in the conversation, ``include`` checked,
``status: "incomplete"`` when the output is cut, and the stream's events as OpenAI sends them."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.integration.harness import running_titan
from tests.integration.test_admission import create_key
from tests.integration.test_responses_api import SIMULATED, sdk

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def titan() -> Iterator[str]:
    with running_titan(SIMULATED) as base_url:
        yield base_url


@pytest.fixture(scope="module")
def key(titan: str) -> str:
    return create_key(titan)


@pytest.fixture(scope="module")
def client(titan: str, key: str) -> Iterator[openai.OpenAI]:
    with sdk(titan, key) as client:
        yield client


def test_input_items_list_the_conversation_before_each_answer(client: openai.OpenAI):
    first = client.responses.create(model="sim", input="One", instructions="Be brief.")
    second = client.responses.create(
        model="sim",
        previous_response_id=first.id,
        input=[
            {"role": "developer", "content": "Count."},
            {"role": "user", "content": [{"type": "input_text", "text": "Two"}]},
        ],
    )
    listed = client.responses.input_items.list(second.id, order="asc")
    kinds = [(item.type, getattr(item, "role", None)) for item in listed.data]
    assert kinds == [
        ("message", "user"),
        ("message", "assistant"),
        ("message", "developer"),
        ("message", "user"),
    ]  # the instructions are the request's, not an item
    one, answer, _, two = listed.data
    assert one.content[0].type == "input_text" and one.content[0].text == "One"
    assert answer.id == first.output[0].id  # the earlier answer, as it was output
    assert answer.content[0].text == first.output_text
    assert two.content[0].text == "Two"
    # Newest first by default, as at OpenAI; the same ids on every read.
    newest = client.responses.input_items.list(second.id)
    assert [i.id for i in newest.data] == [i.id for i in reversed(listed.data)]
    assert [i.id for i in client.responses.input_items.list(first.id).data] == [one.id]


def test_input_items_page_with_after_and_limit(client: openai.OpenAI):
    previous = None
    for turn in range(4):
        previous = client.responses.create(
            model="sim", input=f"Turn {turn}", previous_response_id=previous and previous.id
        )
    assert previous is not None
    every = client.responses.input_items.list(previous.id, order="asc", limit=100).data
    assert len(every) == 7  # 4 questions, 3 earlier answers
    page = client.responses.input_items.list(previous.id, order="asc", limit=3)
    assert [i.id for i in page.data] == [i.id for i in every[:3]] and page.has_more
    assert page.first_id == every[0].id and page.last_id == every[2].id
    # The SDK's auto-pagination follows 'after' to the end.
    assert [i.id for i in page] == [i.id for i in every]
    tail = client.responses.input_items.list(previous.id, order="desc", after=every[2].id)
    assert [i.id for i in tail.data] == [every[1].id, every[0].id] and not tail.has_more


def test_input_items_are_per_tenant_and_check_their_parameters(
    titan: str, key: str, client: openai.OpenAI
):
    response = client.responses.create(model="sim", input="Mine")
    other = sdk(titan, create_key(titan, tenant="globex"))
    with other, pytest.raises(openai.NotFoundError):
        other.responses.input_items.list(response.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.input_items.list("resp_nope")
    url = f"{titan}/v1/responses/{response.id}/input_items"
    auth = {"Authorization": f"Bearer {key}"}
    for query, param in [
        ({"order": "sideways"}, "order"),
        ({"limit": "0"}, "limit"),
        ({"limit": "101"}, "limit"),
        ({"limit": "ten"}, "limit"),
        ({"after": "msg_nope"}, "after"),
        ({"include[]": "everything"}, "include"),
    ]:
        answer = httpx.get(url, params=query, headers=auth)
        assert answer.status_code == 400, query
        assert answer.json()["error"]["param"] == param
    ok = client.responses.input_items.list(response.id, include=["message.input_image.image_url"])
    assert len(ok.data) == 1


def test_function_call_items_are_kept_in_the_conversation(client: openai.OpenAI):
    """A tool loop sent by hand (the simulated model does not call tools): the calls and their
    results are history, listed back as the items they came in as."""
    first = client.responses.create(model="sim", input="What is 2 plus 3?")
    second = client.responses.create(
        model="sim",
        previous_response_id=first.id,
        input=[
            {
                "type": "function_call",
                "call_id": "call_7",
                "name": "add",
                "arguments": '{"a": 2, "b": 3}',
            },
            {"type": "function_call_output", "call_id": "call_7", "output": "5"},
        ],
    )
    assert second.status == "completed" and second.output_text
    items = client.responses.input_items.list(second.id, order="asc").data
    assert [i.type for i in items] == [
        "message",
        "message",
        "function_call",
        "function_call_output",
    ]
    call, result = items[2], items[3]
    assert (call.call_id, call.name, call.arguments) == ("call_7", "add", '{"a": 2, "b": 3}')
    assert call.id.startswith("fc_") and call.status == "completed"
    assert (result.call_id, result.output) == ("call_7", "5") and result.id.startswith("fco_")


def test_include_is_checked_and_what_it_names_is_accepted(titan: str, key: str, client):
    response = client.responses.create(
        model="sim",
        input="Hi",
        include=["reasoning.encrypted_content", "message.output_text.logprobs"],
        top_logprobs=2,
    )
    assert response.status == "completed" and response.top_logprobs == 2
    for path, body in [
        ("/v1/responses", {"model": "sim", "input": "x", "include": ["everything"]}),
        ("/v1/responses", {"model": "sim", "input": "x", "background": True}),
    ]:
        answer = httpx.post(f"{titan}{path}", json=body, headers={"Authorization": f"Bearer {key}"})
        assert answer.status_code == 400
        assert answer.json()["error"]["param"] in ("include", "background")
    with pytest.raises(openai.BadRequestError) as raised:
        client.responses.retrieve(response.id, include=["nothing.at.all"])  # type: ignore[list-item]
    assert raised.value.body["param"] == "include"
    replay = httpx.get(f"{titan}/v1/responses/{response.id}?stream=true",
                       headers={"Authorization": f"Bearer {key}"})  # fmt: skip
    assert replay.status_code == 400 and replay.json()["error"]["param"] == "stream"


def test_a_cut_answer_is_incomplete_streamed_or_not(client: openai.OpenAI):
    cut = client.responses.create(model="sim", input="Tell me everything", max_output_tokens=2)
    assert cut.status == "incomplete"
    assert cut.incomplete_details is not None
    assert cut.incomplete_details.reason == "max_output_tokens"
    assert cut.output[0].status == "incomplete" and cut.usage.output_tokens == 2
    events = list(
        client.responses.create(
            model="sim", input="Tell me everything", max_output_tokens=2, stream=True
        )
    )
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.incomplete_details.reason == "max_output_tokens"
    assert "response.completed" not in [e.type for e in events]
    whole = client.responses.create(model="sim", input="Hi")
    assert whole.status == "completed" and whole.incomplete_details is None


def test_the_stream_has_openais_events_in_order(client: openai.OpenAI):
    events = list(client.responses.create(model="sim", input="Stream", stream=True))
    kinds = [e.type for e in events]
    deltas = kinds.count("response.output_text.delta")
    assert deltas > 1
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * deltas,
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    item_id = events[2].item.id
    for event in events[3:-2]:
        assert (event.item_id, event.output_index, event.content_index) == (item_id, 0, 0)
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response
    assert final.output_text == text and final.output[0].id == item_id
    assert final.id == events[0].response.id
    assert client.responses.retrieve(final.id).output_text == text
    # The SDK's helper validates the same events and builds the same response.
    with client.responses.stream(model="sim", input="Stream") as stream:
        helper_kinds = [event.type for event in stream]
        built = stream.get_final_response()
    assert helper_kinds[0] == "response.created" and helper_kinds[-1] == "response.completed"
    assert built.output_text and built.status == "completed"
