"""Tiny random-weight models for the real-engine tests, built locally and deterministically.

Nothing here downloads anything. Two builders:

* ``build_tiny_hf_llama(dir)``: a Hugging Face Llama directory (config, bf16 safetensors, a
  byte-level BPE tokenizer trained here with ``tokenizers``, a chat template) that vLLM on CPU
  serves. Needs ``torch``, ``transformers``, ``tokenizers``: run it with the vLLM venv's Python.
* ``build_tiny_gguf(path)``: a llama-architecture GGUF file (F32, 325-token byte vocabulary) that
  ``llama-server`` serves. Needs ``gguf`` and ``numpy``: run it with the llama venv's Python.

The test fixtures run these builders in a subprocess with the engine venv's interpreter, so the
dev venv needs none of those packages::

    $KVPREFLIGHT_VLLM_PYTHON tests/tiny_models.py hf DIR
    $KVPREFLIGHT_LLAMA_PYTHON tests/tiny_models.py gguf PATH

Shapes are chosen for the engines: vLLM's CPU attention needs head_dim in {32, 64, 80, ...}
(hidden 128 / 4 heads = 32); llama.cpp is happy with 64 dims / 4 heads = 16.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

SEED = 1234

HF_HIDDEN = 128
HF_LAYERS = 2
HF_HEADS = 4
HF_KV_HEADS = 2
HF_VOCAB = 512
HF_MAX_POSITIONS = 4096

GGUF_DIMS = 64
GGUF_LAYERS = 2
GGUF_HEADS = 4
GGUF_KV_HEADS = 2
GGUF_CONTEXT = 4096
GGUF_SPECIALS = ["<unk>", "<s>", "</s>"]
# 3 specials + 256 byte tokens + 66 printable "word" tokens = 325 tokens.
GGUF_VOCAB_SIZE = 325

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\n' + message['content'] + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)

# Local training text for the BPE tokenizer: fixed, so the tokenizer is identical on every run.
_CORPUS_LINES = [
    "The KV cache holds the keys and values of every token a request has seen.",
    "A deployment preflight reads the pool size from the running engine and compares it",
    "with the context length that users are promised; a request longer than the pool must be",
    "rejected with its original error, never answered with somebody else's context.",
    "Tenant isolation: two tenants send canary markers and neither may ever see the other's.",
    "Prefix caching shares blocks between requests with the same prefix and the same salt.",
    "0123456789 abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ .,;:!?'\"()[]{}<>-_=+*/\\|@#$%^&~`",
    "Hello world. The quick brown fox jumps over the lazy dog. Lorem ipsum dolor sit amet.",
]


def _corpus() -> list[str]:
    lines = []
    for i in range(40):
        for j, line in enumerate(_CORPUS_LINES):
            lines.append(f"{line} {i * 31 + j}")
    return lines


def build_tiny_hf_llama(directory: str | Path) -> Path:
    """Write a tiny random-weight Llama model plus tokenizer to ``directory``; return it."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)

    specials = ["<unk>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>"]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=HF_VOCAB,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    bos_id = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos_id)]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="</s>",
        model_max_length=HF_MAX_POSITIONS,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)

    config = LlamaConfig(
        vocab_size=HF_VOCAB,
        hidden_size=HF_HIDDEN,
        intermediate_size=4 * HF_HIDDEN,
        num_hidden_layers=HF_LAYERS,
        num_attention_heads=HF_HEADS,
        num_key_value_heads=HF_KV_HEADS,
        max_position_embeddings=HF_MAX_POSITIONS,
        bos_token_id=bos_id,
        eos_token_id=tok.token_to_id("</s>"),
        pad_token_id=tok.token_to_id("</s>"),
        tie_word_embeddings=False,
        torch_dtype="bfloat16",
    )
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    # transformers may spell the dtype key differently across versions; vLLM reads either.
    cfg_path = out / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["torch_dtype"] = "bfloat16"
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    return out


def _gguf_vocab() -> tuple[list[bytes], list[float], list[int]]:
    import gguf

    tokens: list[bytes] = []
    scores: list[float] = []
    types: list[int] = []
    for name in GGUF_SPECIALS:
        tokens.append(name.encode())
        scores.append(0.0)
        types.append(gguf.TokenType.CONTROL if name != "<unk>" else gguf.TokenType.UNKNOWN)
    for b in range(256):
        tokens.append(f"<0x{b:02X}>".encode())
        scores.append(0.0)
        types.append(gguf.TokenType.BYTE)
    # Printable pieces so ordinary text costs fewer tokens than raw bytes (SentencePiece style).
    words = [chr(c) for c in range(ord("a"), ord("z") + 1)] + [
        chr(c) for c in range(ord("A"), ord("Z") + 1)
    ]
    words += ["\u2581" + w for w in [
        "the", "a", "of", "and", "to", "in", "is", "KV", "cache", "token", "pool", "tenant", "request", "hello",
    ]]
    for i, w in enumerate(words):
        tokens.append(w.encode())
        scores.append(-float(i + 1))
        types.append(gguf.TokenType.NORMAL)
    assert len(tokens) == GGUF_VOCAB_SIZE, len(tokens)
    return tokens, scores, types


def build_tiny_gguf(path: str | Path) -> Path:
    """Write a tiny random-weight llama-architecture GGUF file to ``path``; return it."""
    import gguf
    import numpy as np

    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(SEED)
    head_dim = GGUF_DIMS // GGUF_HEADS
    ffn = 4 * GGUF_DIMS

    w = gguf.GGUFWriter(str(out), "llama")
    w.add_name("kvpreflight-tiny-llama")
    w.add_context_length(GGUF_CONTEXT)
    w.add_embedding_length(GGUF_DIMS)
    w.add_block_count(GGUF_LAYERS)
    w.add_feed_forward_length(ffn)
    w.add_head_count(GGUF_HEADS)
    w.add_head_count_kv(GGUF_KV_HEADS)
    w.add_rope_dimension_count(head_dim)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)

    tokens, scores, types = _gguf_vocab()
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)

    def t(name: str, *shape: int, scale: float = 0.02) -> None:
        w.add_tensor(name, (rng.standard_normal(shape) * scale).astype(np.float32))

    n_vocab = len(tokens)
    kv_dim = head_dim * GGUF_KV_HEADS
    # numpy shapes are (rows, cols) = GGUF ne reversed: token_embd is ne [n_embd, n_vocab].
    t("token_embd.weight", n_vocab, GGUF_DIMS)
    for i in range(GGUF_LAYERS):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(GGUF_DIMS, dtype=np.float32))
        t(f"blk.{i}.attn_q.weight", GGUF_DIMS, GGUF_DIMS)
        t(f"blk.{i}.attn_k.weight", kv_dim, GGUF_DIMS)
        t(f"blk.{i}.attn_v.weight", kv_dim, GGUF_DIMS)
        t(f"blk.{i}.attn_output.weight", GGUF_DIMS, GGUF_DIMS)
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(GGUF_DIMS, dtype=np.float32))
        t(f"blk.{i}.ffn_gate.weight", ffn, GGUF_DIMS)
        t(f"blk.{i}.ffn_up.weight", ffn, GGUF_DIMS)
        t(f"blk.{i}.ffn_down.weight", GGUF_DIMS, ffn)
    w.add_tensor("output_norm.weight", np.ones(GGUF_DIMS, dtype=np.float32))
    t("output.weight", n_vocab, GGUF_DIMS)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("hf", "gguf"):
        print("usage: tiny_models.py hf DIR | gguf PATH", file=sys.stderr)
        return 2
    kind, target = argv
    built = build_tiny_hf_llama(target) if kind == "hf" else build_tiny_gguf(target)
    print(built)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
