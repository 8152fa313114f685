"""Byte-level tokenizer: ids 0-255 are bytes, so any text round-trips; a few specials above."""

from __future__ import annotations

PAD_ID = 256
BOS_ID = 257
EOS_ID = 258
# What the pre-0.5.21 abort path (fault reject-continues) puts in place of a refused prompt.
PLACEHOLDER_ID = 259
VOCAB_SIZE = 260


def encode(text: str) -> list[int]:
    # No BOS is added: a prompt of N bytes is exactly N tokens, so probes can aim at a boundary.
    return list(text.encode("utf-8"))


def decode(ids: list[int]) -> str:
    # Specials are skipped, as SGLang does with skip_special_tokens (its default).
    return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")


def token_text(token_id: int) -> str | None:
    if 0 <= token_id < 256:
        return bytes([token_id]).decode("utf-8", errors="replace")
    return None
