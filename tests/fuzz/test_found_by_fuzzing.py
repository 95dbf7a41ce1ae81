"""What the fuzzer found, kept as plain tests against the same real Titan (memory and Redis)."""

from __future__ import annotations

import httpx
import pytest

pytestmark = pytest.mark.slow

NOT_AN_OBJECT = [[None, None], "auto", 7, True]


@pytest.mark.parametrize("strategy", NOT_AN_OBJECT)
def test_a_chunking_strategy_that_is_not_an_object_is_a_400_naming_it(
    titan: tuple[str, str], strategy: object
):
    base_url, key = titan
    with httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {key}"}) as client:
        created = client.post("/v1/vector_stores", json={"chunking_strategy": strategy})
        store = client.post("/v1/vector_stores", json={"name": "kb"}).json()
        added = client.post(
            f"/v1/vector_stores/{store['id']}/files",
            json={"file_id": "file-missing", "chunking_strategy": strategy},
        )
    for answer in (created, added):
        assert answer.status_code == 400, answer.text
        error = answer.json()["error"]
        assert (error["param"], error["type"]) == ("chunking_strategy", "invalid_request_error")
        assert "{'type': 'auto'}" in error["message"]
