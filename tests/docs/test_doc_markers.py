"""Every command block of README.md and docs/*.md says whether the doc walk runs it
(tests/docs/test_doc_walk.py), and a skipped one says why."""

from __future__ import annotations

from tests.docs.blocks import Block, blocks, documents


def command_blocks() -> list[Block]:
    return [block for path in documents() for block in blocks(path) if block.is_command]


def test_every_command_block_is_marked_run_or_skip_with_a_reason():
    unmarked = [block.where for block in command_blocks() if block.marker is None]
    assert not unmarked, f"mark these <!-- doc-run --> or <!-- doc-skip: why -->: {unmarked}"
    no_reason = [b.where for b in command_blocks() if b.marker == "skip" and len(b.args) < 10]
    assert not no_reason, f"a skipped block says why it cannot run: {no_reason}"


def test_run_markers_are_plain_or_name_the_url_they_serve():
    for block in command_blocks():
        if block.marker == "run" and block.args:
            assert block.ready_url is not None, f"{block.where}: 'background, ready URL'"


def test_the_readme_walk_starts_a_server_and_runs_most_of_its_blocks():
    readme = [block for block in command_blocks() if block.path.name == "README.md"]
    assert any(block.ready_url for block in readme)  # `make serve`, in the background
    ran = [block for block in readme if block.marker == "run"]
    assert len(ran) >= len(readme) * 2 // 3, [b.where for b in readme if b.marker == "skip"]


def test_the_parser_finds_fences_markers_and_indented_blocks(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "text\n\n<!-- doc-run -->\n```sh\necho one\n```\n\n"
        "- item\n\n  <!-- doc-skip: needs a Kubernetes cluster -->\n"
        "  ```bash\n  kubectl get pods\n  ```\n"
        "\n```python\nprint(1)\n```\n"
        "<!-- doc-run: background, ready http://127.0.0.1:8000/ready -->\n```sh\nmake serve\n```\n"
    )
    found = blocks(page)
    assert [(b.language, b.marker, b.body) for b in found] == [
        ("sh", "run", "echo one\n"),
        ("bash", "skip", "kubectl get pods\n"),
        ("python", None, "print(1)\n"),
        ("sh", "run", "make serve\n"),
    ]
    assert found[1].args == "needs a Kubernetes cluster"
    assert found[3].ready_url == "http://127.0.0.1:8000/ready" and found[0].ready_url is None
