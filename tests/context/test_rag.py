"""Files and vector stores: token chunking, tenant isolation (with a stand-in embedder), search
over a small policy corpus with the real MiniLM model, and the HTTP API with the openai SDK."""

from __future__ import annotations

import hashlib
import math
import re
from pathlib import Path

import pytest

from titan.context.rag import Files, VectorStores, chunk_text
from titan.context.rag.files import MAX_FILE_BYTES, FileTooLargeError
from titan.errors import InvalidRequestError, NotFoundError
from titan.storage.memory import MemoryDocuments

CORPUS = Path(__file__).resolve().parents[1] / "data" / "rag_corpus"
WORD = re.compile(r"\S+")


def word_offsets(text: str) -> list[tuple[int, int]]:
    return [match.span() for match in WORD.finditer(text)]


class WordEmbedder:
    """Bag of hashed words: texts sharing words are close. Enough to test storage and scoping
    without loading the model."""

    dim = 64

    def token_offsets(self, text: str) -> list[tuple[int, int]]:
        return word_offsets(text)

    def encode(self, texts: list[str]) -> list[tuple[float, ...]]:
        vectors = []
        for text in texts:
            vector = [0.0] * self.dim
            for word in WORD.findall(text.lower()):
                vector[hashlib.sha256(word.encode()).digest()[0] % self.dim] += 1.0
            norm = math.sqrt(sum(x * x for x in vector)) or 1.0
            vectors.append(tuple(x / norm for x in vector) if norm else vector)
        return vectors


def test_chunks_are_exact_token_windows_with_overlap():
    text = " ".join(f"w{i}" for i in range(500))
    offsets = word_offsets(text)
    chunks = chunk_text(text, offsets, max_tokens=200, overlap=40)
    assert [(c.first_token, c.num_tokens) for c in chunks] == [(0, 200), (160, 200), (320, 180)]
    for chunk in chunks:
        words = [f"w{i}" for i in range(chunk.first_token, chunk.first_token + chunk.num_tokens)]
        assert chunk.text == " ".join(words) == text[chunk.start : chunk.end]
    # The last 40 tokens of a chunk open the next one.
    assert chunks[0].text.split()[-40:] == chunks[1].text.split()[:40]


def test_chunking_edges():
    assert chunk_text("", []) == []
    assert [c.text for c in chunk_text("  one  two ", word_offsets("  one  two "))] == ["one  two"]
    exact = " ".join(["x"] * 200)  # exactly one window: no trailing chunk of overlap only
    assert len(chunk_text(exact, word_offsets(exact))) == 1
    with pytest.raises(ValueError):
        chunk_text("a", [(0, 1)], max_tokens=100, overlap=60)
    with pytest.raises(ValueError):
        chunk_text("a", [(0, 1)], max_tokens=300)  # beyond the model's window


def loader(embedder):
    async def load():
        return embedder

    return load


async def make_stores(documents=None, **options) -> VectorStores:
    documents = documents or MemoryDocuments()
    return VectorStores(documents, loader(WordEmbedder()), lambda: 1_700_000_000.0, **options)


async def upload(stores: VectorStores, tenant: str, name: str) -> dict:
    data = (CORPUS / name).read_bytes()
    return await stores.files.create(tenant, name, "assistants", data, "text/markdown")


async def test_files_round_trip_and_refusals():
    files = Files(MemoryDocuments(), lambda: 1_700_000_000.0)
    created = await files.create("a", "notes.md", "assistants", b"# Hi\ncaf\xc3\xa9", None)
    assert created["object"] == "file" and created["bytes"] == 10
    assert created["id"].startswith("file-") and created["filename"] == "notes.md"
    assert await files.get("a", created["id"]) == created
    assert await files.content("a", created["id"]) == "# Hi\ncafé"
    assert [f["id"] for f in (await files.list("a"))["data"]] == [created["id"]]
    for data, kind in [(b"\xff\xfe\x00binary", None), (b"%PDF", "application/pdf")]:
        with pytest.raises(InvalidRequestError):
            await files.create("a", "x", "assistants", data, kind)
    with pytest.raises(InvalidRequestError):
        await files.create("a", "x", "nonsense", b"text", None)
    with pytest.raises(FileTooLargeError) as too_large:
        await files.create("a", "x", "assistants", b"a" * (MAX_FILE_BYTES + 1), None)
    assert too_large.value.status_code == 413 and "4 MiB" in too_large.value.message
    assert (await files.delete("a", created["id"]))["deleted"] is True
    with pytest.raises(NotFoundError):
        await files.get("a", created["id"])


async def test_tenants_see_only_their_own_files_and_stores():
    stores = await make_stores()
    mine = await upload(stores, "a", "remote_work.md")
    store = await stores.create("a", name="policies", file_ids=[mine["id"]])
    assert store["file_counts"]["completed"] == 1 and store["usage_bytes"] > 0

    with pytest.raises(NotFoundError):
        await stores.files.get("b", mine["id"])
    with pytest.raises(NotFoundError):
        await stores.files.content("b", mine["id"])
    assert (await stores.files.list("b"))["data"] == []
    assert (await stores.list("b"))["data"] == []
    for call in (
        stores.get("b", store["id"]),
        stores.search("b", store["id"], "anchor day"),
        stores.list_files("b", store["id"]),
        stores.delete("b", store["id"]),
        stores.create("b", file_ids=[mine["id"]]),
    ):
        with pytest.raises(NotFoundError):
            await call
    theirs = await stores.create("b", name="theirs")
    with pytest.raises(NotFoundError):  # b's store cannot take a's file
        await stores.add_file("b", theirs["id"], mine["id"])
    assert (await stores.search("b", theirs["id"], "anchor day"))["data"] == []

    found = await stores.search("a", store["id"], "anchor day of the hardware lab")
    assert found["data"][0]["file_id"] == mine["id"]
    assert found["data"][0]["filename"] == "remote_work.md"


async def test_files_leave_stores_and_every_replica_follows_storage():
    stores = await make_stores()
    first, second = [await upload(stores, "", n) for n in ("holidays.txt", "equipment.md")]
    store = await stores.create("", file_ids=[first["id"]])
    added = await stores.add_file("", store["id"], second["id"])
    assert added["object"] == "vector_store.file" and added["status"] == "completed"
    assert await stores.add_file("", store["id"], second["id"]) == added  # idempotent
    listed = await stores.list_files("", store["id"])
    assert {f["id"] for f in listed["data"]} == {first["id"], second["id"]}

    # Another replica on the same storage: no rebuild step, it loads what it lacks.
    query = "borrow oscilloscopes from the hardware lab"
    before = await stores.search("", store["id"], query, max_num_results=2)
    replica = await make_stores(stores.documents)
    assert await replica.search("", store["id"], query, max_num_results=2) == before
    assert before["data"][0]["file_id"] == second["id"]

    await stores.remove_file("", store["id"], second["id"])  # on the first replica...
    for searcher in (stores, replica):  # ...and both stop finding it
        after = await searcher.search("", store["id"], query)
        assert {r["file_id"] for r in after["data"]} == {first["id"]}
    assert (await stores.get("", store["id"]))["file_counts"]["total"] == 1
    await replica.delete("", store["id"])
    with pytest.raises(NotFoundError):
        await stores.search("", store["id"], "x")
    assert await stores.documents.list(f"vector_store_chunks:{store['id']}:{first['id']}") == []
    assert len(replica.index) == 0


async def test_deleting_a_file_takes_it_out_of_every_store():
    stores = await make_stores()
    file = await upload(stores, "a", "holidays.txt")
    kept = await upload(stores, "a", "equipment.md")
    one = await stores.create("a", file_ids=[file["id"], kept["id"]])
    two = await stores.create("a", file_ids=[file["id"]])
    await stores.forget_file("a", file["id"])
    assert [f["id"] for f in (await stores.list_files("a", one["id"]))["data"]] == [kept["id"]]
    assert (await stores.list_files("a", two["id"]))["data"] == []
    assert (await stores.get("a", two["id"]))["file_counts"]["total"] == 0
    found = await stores.search("a", one["id"], "public holidays")
    assert {r["file_id"] for r in found["data"]} == {kept["id"]}


class SlowEmbedder(WordEmbedder):
    """Blocks each batch until the test lets it go."""

    def __init__(self):
        import threading

        self.go = threading.Event()

    def encode(self, texts):
        assert self.go.wait(10)
        return super().encode(texts)


async def test_a_slow_file_answers_in_progress_and_completes_in_the_background():
    import asyncio

    embedder = SlowEmbedder()
    stores = VectorStores(MemoryDocuments(), loader(embedder), lambda: 1e9, wait_s=0.05)
    file = await upload(stores, "", "travel_policy.md")
    store = await stores.create("")
    added = await stores.add_file("", store["id"], file["id"])
    assert added["status"] == "in_progress"
    pending = await stores.get("", store["id"])
    assert pending["status"] == "in_progress" and pending["file_counts"]["in_progress"] == 1
    embedder.go.set()
    for _ in range(200):
        if (await stores.get_file("", store["id"], file["id"]))["status"] == "completed":
            break
        await asyncio.sleep(0.01)
    done = await stores.get("", store["id"])
    assert done["status"] == "completed"
    assert done["file_counts"] == {**pending["file_counts"], "in_progress": 0, "completed": 1}
    assert (await stores.search("", store["id"], "hotel night"))["data"]


async def test_removing_a_file_being_embedded_stops_it_and_leaves_no_chunks():
    import asyncio

    embedder = SlowEmbedder()
    stores = VectorStores(MemoryDocuments(), loader(embedder), lambda: 1e9, wait_s=0.05)
    file = await upload(stores, "", "travel_policy.md")
    store = await stores.create("")
    await stores.add_file("", store["id"], file["id"])
    await stores.remove_file("", store["id"], file["id"])
    embedder.go.set()
    await asyncio.gather(*stores._tasks)
    namespace = f"vector_store_chunks:{store['id']}:{file['id']}"
    assert await stores.documents.list(namespace) == []
    assert (await stores.get("", store["id"]))["file_counts"]["total"] == 0


async def test_a_file_whose_replica_died_reads_failed_and_can_be_added_again():
    clock = [1000.0]
    documents = MemoryDocuments()
    embedder = SlowEmbedder()
    dying = VectorStores(documents, loader(embedder), lambda: clock[0], wait_s=0.01)
    file = await upload(dying, "", "holidays.txt")
    store = await dying.create("")
    await dying.add_file("", store["id"], file["id"])
    await dying.close()  # the replica goes away mid-file
    embedder.go.set()  # (its embedding thread, which nothing can cancel, may end now)
    survivor = VectorStores(documents, loader(WordEmbedder()), lambda: clock[0])
    assert (await survivor.get_file("", store["id"], file["id"]))["status"] == "in_progress"
    clock[0] += 1000
    failed = await survivor.get_file("", store["id"], file["id"])
    assert failed["status"] == "failed" and "again" in failed["last_error"]["message"]
    assert (await survivor.get("", store["id"]))["file_counts"]["failed"] == 1
    again = await survivor.add_file("", store["id"], file["id"])
    assert again["status"] == "completed"
    counts = (await survivor.get("", store["id"]))["file_counts"]
    assert counts == {"in_progress": 0, "completed": 1, "failed": 0, "cancelled": 0, "total": 1}


async def test_replicas_adding_files_to_one_store_keep_exact_counts():
    import asyncio

    documents = MemoryDocuments()
    replicas = [await make_stores(documents) for _ in range(2)]
    names = sorted(path.name for path in CORPUS.glob("*.*"))
    files = [await upload(replicas[0], "", name) for name in names]
    store = await replicas[0].create("")
    await asyncio.gather(*(
        replicas[i % 2].add_file("", store["id"], file["id"]) for i, file in enumerate(files)
    ))  # fmt: skip
    counts = (await replicas[1].get("", store["id"]))["file_counts"]
    assert counts["completed"] == counts["total"] == len(files)


async def test_ranking_options_are_checked_and_the_threshold_filters():
    stores = await make_stores()
    file = await upload(stores, "", "holidays.txt")
    store = await stores.create("", file_ids=[file["id"]])
    for bad in ({"ranker": "magic"}, {"score_threshold": 2}, {"score_threshold": "x"}, "auto"):
        with pytest.raises(InvalidRequestError):
            await stores.search("", store["id"], "holidays", ranking=bad)
    found = await stores.search("", store["id"], "public holidays", ranking={"ranker": "none"})
    assert found["data"]
    best = found["data"][0]["score"]
    strict = await stores.search(
        "", store["id"], "public holidays", ranking={"ranker": "none", "score_threshold": best}
    )
    assert [r["score"] for r in strict["data"]] == [best]


def test_the_reranker_rewards_the_exact_words_of_the_query():
    from titan.context.rag.ranking import bm25, rerank

    texts = ["Call extension 4477 for a stolen laptop.", "Laptops are replaced every three years."]
    lexical = bm25("stolen laptop extension", texts)
    assert lexical[0] > lexical[1] == 0.0  # words match exactly: "Laptops" is not "laptop"
    # Equal cosines: the words decide; a much better cosine still wins over the words.
    tied = rerank("stolen laptop", texts, [0.5, 0.5])
    assert tied[0] > tied[1]
    scores = rerank("extension", texts, [0.2, 0.9])
    assert scores[1] > scores[0] and all(0 <= s <= 1 for s in scores)


@pytest.fixture(scope="module")
def minilm():
    from titan.cache.embedder import Embedder

    return Embedder.load()


QUESTIONS = [
    ("How much can I spend on a hotel night in Europe?", "210 euros per night"),
    ("What is the daily meal allowance when travelling?", "per diem) is 55 euros"),
    ("How long must passwords be?", "at least 16 characters"),
    ("How many weeks of leave do adoptive parents get?", "16 weeks"),
    ("Can I carry unused vacation days into next year?", "5 unused vacation days"),
    ("What is the limit on gifts from suppliers?", "up to 50 euros per year"),
    ("Which extension do I call when my laptop is stolen?", "extension 4477"),
    ("How much is the yearly learning budget?", "1,500 euros"),
]


@pytest.mark.slow
async def test_search_finds_the_chunk_holding_the_answer(minilm):
    text = (CORPUS / "travel_policy.md").read_text()
    chunks = chunk_text(text, minilm.token_offsets(text))
    assert len(chunks) > 1 and all(c.text == text[c.start : c.end] for c in chunks)
    assert all(len(minilm.token_offsets(c.text)) == c.num_tokens <= 200 for c in chunks)

    stores = VectorStores(MemoryDocuments(), loader(minilm), lambda: 1_700_000_000.0)
    ids = [(await upload(stores, "t", path.name))["id"] for path in sorted(CORPUS.glob("*.*"))]
    store = await stores.create("t", name="handbook", file_ids=ids)
    assert store["file_counts"]["completed"] == len(ids)
    for ranker in ("auto", "none"):  # with and without the reranking step
        first = 0
        for question, answer in QUESTIONS:
            found = await stores.search(
                "t", store["id"], question, max_num_results=3, ranking={"ranker": ranker}
            )
            texts = [r["content"][0]["text"] for r in found["data"]]
            assert any(answer in text for text in texts), (ranker, question)  # in the top 3
            first += answer in texts[0]
            scores = [r["score"] for r in found["data"]]
            assert scores == sorted(scores, reverse=True)
        assert first >= len(QUESTIONS) - 2, ranker  # and mostly the best one


@pytest.mark.slow
def test_http_api_with_the_openai_sdk():
    import httpx
    import openai

    from tests.integration.harness import running_titan
    from tests.integration.test_admission import MASTER

    config = {
        "models": [{"name": "sim", "deployments": [{"backend": "simulated"}]}],
        "probes": {"enabled": False},
        "auth": {"master_key": MASTER, "key_cache_s": 0},
    }
    with running_titan(config) as titan:

        def key(tenant: str) -> str:
            response = httpx.post(
                f"{titan}/admin/keys",
                json={"tenant": tenant},
                headers={"Authorization": f"Bearer {MASTER}"},
            )
            return response.json()["key"]

        a = openai.OpenAI(base_url=f"{titan}/v1", api_key=key("a"), max_retries=0)
        b = openai.OpenAI(base_url=f"{titan}/v1", api_key=key("b"), max_retries=0)
        path = CORPUS / "security.md"
        with path.open("rb") as handle:
            file = a.files.create(file=handle, purpose="assistants")
        assert file.filename == "security.md" and file.bytes == path.stat().st_size
        assert a.files.content(file.id).text == path.read_text()
        store = a.vector_stores.create(name="handbook")
        added = a.vector_stores.files.create(vector_store_id=store.id, file_id=file.id)
        assert added.status == "completed"
        page = a.vector_stores.search(store.id, query="Where do I forward phishing emails?")
        assert "phish@brambleworth.example" in page.data[0].content[0].text
        assert page.data[0].file_id == file.id

        with pytest.raises(openai.NotFoundError):
            b.vector_stores.retrieve(store.id)
        with pytest.raises(openai.NotFoundError):
            b.files.retrieve(file.id)
        assert b.files.list().data == []
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=f"{titan}/v1", api_key="nope", max_retries=0).files.list()
        with pytest.raises(openai.BadRequestError):
            a.files.create(file=("x.bin", b"\x00\x01\x02\xff"), purpose="assistants")
        with pytest.raises(openai.APIStatusError) as too_large:
            a.files.create(file=("big.txt", b"a" * (MAX_FILE_BYTES + 1)), purpose="assistants")
        assert too_large.value.status_code == 413
        plain = a.vector_stores.search(
            store.id, query="phishing", ranking_options={"ranker": "none", "score_threshold": 0.2}
        )
        assert plain.data and all(hit.score >= 0.2 for hit in plain.data)
        with pytest.raises(openai.BadRequestError):
            a.vector_stores.search(store.id, query="x", ranking_options={"ranker": "magic"})
        assert a.files.delete(file.id).deleted  # and it leaves the store
        assert a.vector_stores.files.list(store.id).data == []
        assert a.vector_stores.retrieve(store.id).file_counts.total == 0
        polled = a.vector_stores.files.upload_and_poll(
            vector_store_id=store.id, file=(path.name, path.read_bytes())
        )
        assert polled.status == "completed"
        assert a.vector_stores.delete(store.id).deleted


async def test_replicas_on_redis_share_stores_and_follow_each_other(redis_url, redis_prefix):
    from redis.asyncio import Redis

    from titan.storage.redis import RedisDocuments

    clients = [Redis.from_url(redis_url) for _ in range(2)]
    try:
        one, two = [
            await make_stores(RedisDocuments(client, prefix=redis_prefix)) for client in clients
        ]
        holidays = await upload(one, "t", "holidays.txt")
        store = await one.create("t", file_ids=[holidays["id"]])
        equipment = await upload(two, "t", "equipment.md")
        await two.add_file("t", store["id"], equipment["id"])
        query = "borrow oscilloscopes from the hardware lab"
        for replica in (one, two):
            found = await replica.search("t", store["id"], query, max_num_results=1)
            assert found["data"][0]["file_id"] == equipment["id"]
        await two.files.get("t", holidays["id"])  # files are shared too
        counts = (await one.get("t", store["id"]))["file_counts"]
        assert counts["completed"] == counts["total"] == 2
        with pytest.raises(NotFoundError):  # and still scoped to their tenant
            await two.get("other", store["id"])
    finally:
        for client in clients:
            await client.aclose()
