"""The response cache over real HTTP with the openai SDK: exact and semantic hits, directives,
streaming replay, tenant isolation, admin, and a Redis-backed cache shared by two replicas."""

from __future__ import annotations

import time
import uuid

import httpx
import openai
import pytest

from tests.integration.harness import running_titan
from tests.integration.test_admission import MASTER, create_key

QUESTION = "What is the best way to learn to play the guitar as an adult?"


# A fixed threshold, no error budget: a near question is served at once.
# A fixed threshold, no error budget, no pair verifier: the guards alone decide.
FIXED = {"enabled": True, "max_error_rate": None, "pair_verifier": False}


def cache_config(**cache) -> dict:
    return {
        "models": [{"name": "sim", "deployments": [{"backend": "simulated"}]}],
        "probes": {"enabled": False},
        "auth": {"master_key": MASTER, "key_cache_s": 0},
        "cache": cache,
    }


def ask(base_url: str, question: str = QUESTION, key: str = "none", **extra):
    headers = extra.pop("headers", {})
    with openai.OpenAI(base_url=f"{base_url}/v1", api_key=key, max_retries=0) as client:
        return client.chat.completions.with_raw_response.create(
            model="sim",
            messages=[{"role": "user", "content": question}],
            temperature=extra.pop("temperature", 0),
            extra_headers=headers,
            **extra,
        )


def backend_requests(base_url: str) -> int:
    deployments = httpx.get(f"{base_url}/stats").json()["models"]["sim"]["deployments"]
    return sum(d["backend"]["requests"] for d in deployments.values())


def test_exact_hits_directives_and_admin():
    with running_titan(cache_config()) as titan:
        first = ask(titan)
        assert first.headers["x-titan-cache"] == "miss"
        second = ask(titan)
        assert second.headers["x-titan-cache"] == "hit-exact"
        assert second.headers["x-titan-deployment"] == "cache"
        answer, again = first.parse(), second.parse()
        assert again.choices[0].message.content == answer.choices[0].message.content
        assert again.usage == answer.usage
        assert again.id != answer.id
        assert backend_requests(titan) == 1

        sampled = [ask(titan, temperature=0.8) for _ in range(2)]
        assert [r.headers["x-titan-cache"] for r in sampled] == ["miss", "miss"]

        assert ask(titan, headers={"x-titan-cache": "no-cache"}).headers["x-titan-cache"] == "miss"
        stored_elsewhere = "And what about the piano?"
        ask(titan, stored_elsewhere, extra_body={"cache": "no-store"})
        with pytest.raises(openai.APIStatusError) as not_cached:
            ask(titan, stored_elsewhere, headers={"x-titan-cache": "only-if-cached"})
        assert not_cached.value.status_code == 504
        hit = ask(titan, headers={"x-titan-cache": "only-if-cached"})
        assert hit.headers["x-titan-cache"] == "hit-exact"
        with pytest.raises(openai.BadRequestError):
            ask(titan, headers={"x-titan-cache": "sometimes"})

        admin = {"Authorization": f"Bearer {MASTER}"}
        stats = httpx.get(f"{titan}/admin/cache", headers=admin).json()
        assert stats["exact"]["entries"] == 1  # the no-store answer was not kept
        assert stats["hits"]["exact"] == 2
        flushed = httpx.delete(f"{titan}/admin/cache?model=sim", headers=admin).json()
        assert flushed["deleted"] == 1
        assert ask(titan).headers["x-titan-cache"] == "miss"


def test_a_cached_stream_replays_with_its_original_usage():
    with (
        running_titan(cache_config()) as titan,
        openai.OpenAI(base_url=f"{titan}/v1", api_key="none", max_retries=0) as client,
    ):

        def stream(include_usage: bool):
            options = {"include_usage": True} if include_usage else None
            response = client.chat.completions.with_raw_response.create(
                model="sim",
                messages=[{"role": "user", "content": QUESTION}],
                temperature=0,
                stream=True,
                stream_options=options,
            )
            chunks = list(response.parse())
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            usage = [c.usage for c in chunks if c.usage is not None]
            return response.headers["x-titan-cache"], text, usage

        cache, text, usage = stream(include_usage=False)  # stored with the usage it had
        assert (cache, usage) == ("miss", [])  # which this client did not ask to see
        replay_cache, replay_text, replay_usage = stream(include_usage=True)
        assert replay_cache == "hit-exact"
        assert replay_text == text
        assert replay_usage and replay_usage[0].completion_tokens > 0
        whole = ask(titan)
        assert whole.headers["x-titan-cache"] == "hit-exact"  # a stream's answer serves JSON too
        assert whole.parse().choices[0].message.content == text


def test_tenants_never_share_entries():
    with running_titan(cache_config()) as titan:
        acme = create_key(titan)
        other = httpx.post(
            f"{titan}/admin/keys",
            json={"tenant": "globex"},
            headers={"Authorization": f"Bearer {MASTER}"},
        ).json()["key"]
        assert ask(titan, key=acme).headers["x-titan-cache"] == "miss"
        assert ask(titan, key=acme).headers["x-titan-cache"] == "hit-exact"
        assert ask(titan, key=other).headers["x-titan-cache"] == "miss"


@pytest.mark.slow
def test_paraphrases_hit_by_meaning_and_guarded_near_misses_do_not():
    with running_titan(cache_config(semantic=FIXED)) as titan:
        assert ask(titan).headers["x-titan-cache"] == "miss"
        paraphrase = ask(titan, "What's the best way for an adult to learn to play the guitar?")
        assert paraphrase.headers["x-titan-cache"] == "hit-semantic"
        assert float(paraphrase.headers["x-titan-cache-similarity"]) >= 0.86
        near_miss = ask(titan, "What is the best way to learn to play the piano as an adult?")
        assert near_miss.headers["x-titan-cache"] == "miss"
        negated = ask(titan, "What is not the best way to learn to play the guitar as an adult?")
        assert negated.headers["x-titan-cache"] == "miss"


def wait_for_the_verifier(titan: str) -> None:
    """The pair verifier loads in the background after startup."""
    stats: dict = {}
    for _ in range(200):
        admin = {"Authorization": f"Bearer {MASTER}"}
        stats = httpx.get(f"{titan}/admin/cache", headers=admin).json()
        if stats["pair_verifier"] != "preparing":
            break
        time.sleep(0.05)
    assert stats["pair_verifier"] == "ready"


@pytest.mark.slow
@pytest.mark.parametrize(("threshold", "outcome", "refusals"), [
    (0.0, "hit-semantic", {}), (1.01, "miss", {"verifier": 1}),
])  # fmt: skip
def test_the_pair_verifier_decides_in_the_server(
    tiny_verifier_weights, monkeypatch, threshold, outcome, refusals
):
    # The real cross-encoder on the CPU kernels, with weights trained in seconds: its
    # probability is whatever it is, so the threshold decides (0: always above, 1.01: never).
    from titan.cache import pair_verifier

    monkeypatch.setattr(pair_verifier, "THRESHOLD", threshold)
    semantic = {**FIXED, "pair_verifier": True, "pair_verifier_weights": str(tiny_verifier_weights)}
    story = "Write a bedtime story about a dragon who is afraid of the dark."
    admin = {"Authorization": f"Bearer {MASTER}"}
    with running_titan(cache_config(semantic=semantic, threshold=0.85)) as titan:
        wait_for_the_verifier(titan)
        assert ask(titan, story).headers["x-titan-cache"] == "miss"
        time.sleep(0.3)  # the answer is stored in the background, after the response
        reworded = ask(titan, "Write a bedtime story about a dragon who's scared of the dark.")
        assert reworded.headers["x-titan-cache"] == outcome
        stats = httpx.get(f"{titan}/admin/cache", headers=admin).json()
        assert stats["guard_refusals"] == refusals


@pytest.mark.slow
def test_under_an_error_budget_a_near_question_is_verified_before_any_is_served(
    tiny_verifier_weights, monkeypatch
):
    # The defaults: max_error_rate 0.01. A cold cache serves no semantic hit; the near question
    # runs the model, and the two answers are compared (the simulated model answers each
    # request with other words: they disagree). The pair verifier (weights trained in seconds,
    # its threshold 0) lets the candidate through to the budget.
    from titan.cache import pair_verifier

    monkeypatch.setattr(pair_verifier, "THRESHOLD", 0.0)
    semantic = {"enabled": True, "pair_verifier_weights": str(tiny_verifier_weights)}
    with running_titan(cache_config(semantic=semantic)) as titan:
        wait_for_the_verifier(titan)
        assert ask(titan).headers["x-titan-cache"] == "miss"
        paraphrase = ask(titan, "What's the best way for an adult to learn to play the guitar?")
        assert paraphrase.headers["x-titan-cache"] == "miss"
        admin = {"Authorization": f"Bearer {MASTER}"}
        stats = {}
        for _ in range(50):  # the comparison runs after the response, in the background
            stats = httpx.get(f"{titan}/admin/cache", headers=admin).json()
            if stats["verified"]:
                break
            time.sleep(0.05)
        assert stats["verified"] == {"disagreed": 1}
        budget = stats["error_budget"]["sim"]
        assert budget["threshold"] is None and budget["max_error_rate"] == 0.01
        assert budget["verifications"] == 1 and budget["extra_model_calls"] == 0
        # The entry's first verification: it could not have been served, so it teaches the entry
        # (not eligible until one agrees) but not the model's estimate, which has no evidence.
        assert budget["verified"] == 0 and budget["error_rate_upper_bound"] == 1.0
        metrics = httpx.get(f"{titan}/metrics").text
        assert 'titan_cache_semantic_verifications_total{model="sim"} 1.0' in metrics
        assert 'titan_cache_semantic_error_bound{model="sim"} 1.0' in metrics


@pytest.mark.redis
@pytest.mark.slow
def test_two_replicas_share_one_cache_on_redis(shared_redis: str):
    config = cache_config(semantic=FIXED)
    config["storage"] = shared_redis
    question = f"How do I reset the password of account {uuid.uuid4().hex[:6]}?"
    with running_titan(config) as first, running_titan(config) as second:
        assert ask(first, question).headers["x-titan-cache"] == "miss"
        time.sleep(0.3)  # the answer is stored in the background, after the response
        assert ask(second, question).headers["x-titan-cache"] == "hit-exact"
        time.sleep(2.5)  # the second replica's semantic index follows the shared entries
        reworded = question.replace("How do I reset", "How can I reset")
        assert ask(second, reworded).headers["x-titan-cache"] == "hit-semantic"
