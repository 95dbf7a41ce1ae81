"""The Titan configs shown in the deployment docs are ones Titan accepts: every ```yaml block
with a top-level ``models`` key goes through Titan's own config loader (``${VAR}`` references
filled with placeholders)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from titan.config import loading

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "docs" / "vllm.md", ROOT / "docs" / "deploy-kubernetes.md"]
_YAML_BLOCK = re.compile(r"^```yaml\n(.*?)^```", re.MULTILINE | re.DOTALL)
_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)")


def titan_configs() -> list[tuple[str, str]]:
    found = []
    for path in DOCS:
        for index, block in enumerate(_YAML_BLOCK.findall(path.read_text())):
            document = yaml.safe_load(block)
            if isinstance(document, dict) and "models" in document:
                found.append((f"{path.name}#{index}", block))
    return found


@pytest.mark.parametrize(("where", "block"), titan_configs())
def test_documented_config_is_valid(where: str, block: str) -> None:
    environ = {name: "placeholder" for name in _REFERENCE.findall(block)}
    loading.config_from_mapping(yaml.safe_load(block), where, environ)


def test_docs_show_a_config() -> None:
    assert [where for where, _ in titan_configs()] == ["vllm.md#0"]
