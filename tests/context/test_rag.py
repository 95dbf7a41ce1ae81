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


async def make_stores() -> VectorStores:
    return VectorStores(MemoryDocuments(), WordEmbedder(), lambda: 1_700_000_000.0)


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


async def test_files_leave_stores_and_the_index_is_rebuilt_from_storage():
    stores = await make_stores()
    first, second = [await upload(stores, "", n) for n in ("holidays.txt", "equipment.md")]
    store = await stores.create("", file_ids=[first["id"]])
    added = await stores.add_file("", store["id"], second["id"])
    assert added["object"] == "vector_store.file" and added["status"] == "completed"
    assert await stores.add_file("", store["id"], second["id"]) == added  # idempotent
    listed = await stores.list_files("", store["id"])
    assert {f["id"] for f in listed["data"]} == {first["id"], second["id"]}

    query = "borrow oscilloscopes from the hardware lab"
    before = await stores.search("", store["id"], query, max_num_results=2)
    again = VectorStores(stores.documents, WordEmbedder(), stores.now)
    assert await again.rebuild() == len(stores.index)
    assert await again.search("", store["id"], query, max_num_results=2) == before

    await stores.remove_file("", store["id"], second["id"])
    after = await stores.search("", store["id"], query)
    assert {r["file_id"] for r in after["data"]} == {first["id"]}
    assert (await stores.get("", store["id"]))["file_counts"]["total"] == 1
    await stores.delete("", store["id"])
    assert len(stores.index) == 0
    assert await stores.documents.list("vector_store_chunks") == []
    with pytest.raises(NotFoundError):
        await stores.search("", store["id"], "x")


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

    stores = VectorStores(MemoryDocuments(), minilm, lambda: 1_700_000_000.0)
    ids = [(await upload(stores, "t", path.name))["id"] for path in sorted(CORPUS.glob("*.*"))]
    store = await stores.create("t", name="handbook", file_ids=ids)
    assert store["file_counts"]["completed"] == len(ids)
    first = 0
    for question, answer in QUESTIONS:
        found = await stores.search("t", store["id"], question, max_num_results=3)
        texts = [r["content"][0]["text"] for r in found["data"]]
        assert any(answer in text for text in texts), question  # among the top 3
        first += answer in texts[0]
        scores = [r["score"] for r in found["data"]]
        assert scores == sorted(scores, reverse=True)
    assert first >= len(QUESTIONS) - 2  # and mostly the best one


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
        assert a.vector_stores.delete(store.id).deleted
        assert a.files.delete(file.id).deleted
