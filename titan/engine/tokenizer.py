"""The model's tokenizer (HF ``tokenizers``) and chat template, loaded from its HF directory."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as HFTokenizer

from titan.engine.chat_template import CHATML_TEMPLATE, ChatTemplate
from titan.engine.segment_cache import SegmentCache
from titan.errors import ModelLoadError

log = logging.getLogger(__name__)

_BYTE_FALLBACK = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


def _byte_level_decoder() -> dict[str, int]:
    """GPT-2's byte-to-printable-character table, inverted."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars = printable[:]
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


class Tokenizer:
    def __init__(self, hf_dir: Path, eos_token_ids: tuple[int, ...], bos_token_id: int | None):
        try:
            self._tokenizer = HFTokenizer.from_file(str(hf_dir / "tokenizer.json"))
        except Exception as exc:  # tokenizers raises a bare Exception on bad files
            raise ModelLoadError(f"{hf_dir}/tokenizer.json: {exc}") from exc
        settings = _read_json(hf_dir / "tokenizer_config.json")
        self.vocab_size = self._tokenizer.get_vocab_size(with_added_tokens=True)
        self.bos_token_id = bos_token_id
        eos_ids = set(eos_token_ids)
        eos_token = _token_content(settings.get("eos_token"))
        if eos_token is not None and (eos_id := self._tokenizer.token_to_id(eos_token)) is not None:
            eos_ids.add(eos_id)
        self.eos_token_ids = tuple(sorted(eos_ids))
        self.special_token_ids = frozenset(
            token_id
            for token_id, added in self._tokenizer.get_added_tokens_decoder().items()
            if added.special
        )
        self.add_bos_token = bool(settings.get("add_bos_token", False))
        self.chat_template = ChatTemplate(
            _chat_template_source(hf_dir, settings),
            {
                "bos_token": _token_content(settings.get("bos_token")) or "",
                "eos_token": eos_token or "",
            },
        )
        decoder = json.loads(self._tokenizer.to_str()).get("decoder") or {}
        self._is_byte_level = _is_byte_level(decoder)
        self._byte_decoder = _byte_level_decoder() if self._is_byte_level else {}
        self._segments = SegmentCache.for_tokenizer(self._tokenizer)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        if not add_special_tokens and self._segments is not None:
            return self._segments.encode(text)
        ids = self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids
        wants_bos = add_special_tokens and self.add_bos_token and self.bos_token_id is not None
        if wants_bos and (not ids or ids[0] != self.bos_token_id):
            ids = [self.bos_token_id, *ids]
        return ids

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tokenizer.decode(token_ids, skip_special_tokens=skip_special_tokens)

    def token_bytes(self, token_id: int) -> bytes:
        """The raw bytes a token stands for (a token may hold part of a UTF-8 character)."""
        piece = self._tokenizer.id_to_token(token_id)
        if piece is None:
            return b""
        if token_id in self.special_token_ids:
            return piece.encode()
        if self._is_byte_level:
            try:
                return bytes(self._byte_decoder[c] for c in piece)
            except KeyError:
                return piece.encode()
        if match := _BYTE_FALLBACK.match(piece):
            return bytes([int(match.group(1), 16)])
        return piece.replace("▁", " ").encode()

    def token_text(self, token_id: int) -> str:
        return self.token_bytes(token_id).decode("utf-8", errors="replace")

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        **template_kwargs: Any,
    ) -> str:
        return self.chat_template.render(messages, add_generation_prompt, **template_kwargs)


def _read_json(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    try:
        return json.loads(path.read_text())
    except ValueError as exc:
        raise ModelLoadError(f"{path}: {exc}") from exc


def _token_content(token: Any) -> str | None:
    """tokenizer_config.json spells special tokens as strings or as AddedToken dicts."""
    if isinstance(token, dict):
        return token.get("content")
    return token if isinstance(token, str) else None


def _chat_template_source(hf_dir: Path, settings: dict[str, Any]) -> str:
    template = settings.get("chat_template")
    if isinstance(template, list):  # named templates: take "default"
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default") or next(iter(named.values()), None)
    if not template and (hf_dir / "chat_template.jinja").exists():
        template = (hf_dir / "chat_template.jinja").read_text()
    if not template and (hf_dir / "chat_template.json").exists():
        template = _read_json(hf_dir / "chat_template.json").get("chat_template")
    if not template:
        log.warning("%s has no chat template; using ChatML", hf_dir)
        template = CHATML_TEMPLATE
    return template


def _is_byte_level(decoder: dict[str, Any]) -> bool:
    if decoder.get("type") == "ByteLevel":
        return True
    return any(_is_byte_level(d) for d in decoder.get("decoders") or [])
