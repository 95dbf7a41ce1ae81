"""What routing reads from a request: the prompt rendered for the prefix index, role by role."""

from __future__ import annotations

from titan.protocol import ChatCompletionRequest, ClientRequest, CompletionRequest
from titan.service.traits import request_traits


def client_request(endpoint: str, parsed, body: dict) -> ClientRequest:
    return ClientRequest(endpoint=endpoint, parsed=parsed, body=body, request_id="r",
                         headers={}, client_host="127.0.0.1")  # fmt: skip


def test_a_chat_prompt_is_rendered_role_by_role():
    body = {"model": "m", "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
    ]}  # fmt: skip
    traits = request_traits(
        client_request("chat", ChatCompletionRequest.model_validate(body), body), 4
    )
    assert traits.prompt_text == "system: Be brief.\nuser: Hi\n"
    assert traits.prefix_key == "Be b" and traits.prompt_chars == len("Be brief.\nHi")  # unchanged
    # The same words under another role are another prefix.
    body["messages"][0]["role"] = "user"
    other = request_traits(
        client_request("chat", ChatCompletionRequest.model_validate(body), body), 4
    )
    assert other.prompt_text != traits.prompt_text


def test_a_completion_prompt_is_its_text():
    body = {"model": "m", "prompt": "Once upon a time"}
    parsed = CompletionRequest.model_validate(body)
    assert request_traits(client_request("completions", parsed, body), 8).prompt_text == (
        "Once upon a time"
    )
