"""schemathesis against a real Titan, driven by Titan's OpenAPI document: valid and invalid
requests to every operation, with the tenant's key (the master key for /admin). Two checks: no
5xx (but the 504s a client asks for), and every 4xx/5xx body is OpenAI's error body. Bounded
here (a few deterministic examples per operation); `make fuzz` runs it long
(TITAN_FUZZ_EXAMPLES)."""

from __future__ import annotations

import pytest
import schemathesis

from tests.fuzz.checks import no_server_error, openai_error_body
from tests.fuzz.conftest import MASTER, titan_schema

pytestmark = pytest.mark.slow

# Built from the routes at collection (pure: no server); tests/api/test_openapi_document.py
# checks that /openapi.json serves the same document.
schema = titan_schema()


@schema.parametrize()
def test_titan_answers_fuzzed_requests_without_5xx_and_with_openai_error_bodies(
    case: schemathesis.Case, titan: tuple[str, str]
) -> None:
    base_url, api_key = titan
    key = MASTER if case.path.startswith("/admin") else api_key
    case.call_and_validate(
        base_url=base_url,
        headers={"Authorization": f"Bearer {key}"},
        checks=[no_server_error, openai_error_body],
    )
