"""Build the echo model: a tiny Llama whose weights are constructed, not trained, so that it
repeats the token K positions back, for as long as it generates.

    python scripts/make_echo_model.py --out DIR [--only hf|gguf]

writes DIR/hf (a Hugging Face Llama folder that vLLM serves: config, bf16 safetensors, a
byte-level tokenizer, a chat template) and DIR/echo.gguf (llama architecture, F32, the same
tokenizer as a GGUF "gpt2" vocabulary, for llama-server). Both come from one weight construction
(`construct`). `hf` needs torch, safetensors and tokenizers (the vLLM venv); `gguf` needs gguf and
numpy (either engine venv). Nothing is downloaded.

Why it echoes the probes' canaries: the tokenizer has no merges, so every byte is one token and
the tenant probes' prompt, "KVPF-TENANTA-<24 hex> " back to back, has a period of exactly
CANARY_PERIOD tokens. One attention head attends K = CANARY_PERIOD positions back and copies that
token, so the answer continues the prompt exactly: the canary comes back whole, never spliced.
The model reads whatever KV the engine hands it: a stale page shows up in the answer.

The construction (one layer, MLP zero):
* embedding: token byte b -> a +-1 Hadamard code in dims A (128 dims, the code of b), plus a
  constant in dim C; the residual has RMS 1, so the input RMSNorm changes nothing;
* attention heads 0 and 3 (one per KV head): q and k read only dim C. Per rotary frequency f, k is
  real and q is pre-rotated by -theta_f*(K-1), so the score at relative offset d is
  sum_f w cos(theta_f*(d-(K-1))): its peak at d = K-1 leads every other offset up to
  MAX_POSITIONS by SCORE_GAP nats (w is chosen for that), so the head reads one position;
* v copies dims A (64 per KV head), o_proj writes them to dims B; lm_head reads only dims B.
HF Llama rotates pairs (i, i+32) of a head ("rotate half"), GGUF llama pairs (2i, 2i+1): q and k
are laid out for each (`_rope_rows`); the frequencies are the same.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

CANARY_PERIOD = len("KVPF-TENANTA-") + 24 + 1  # kvpreflight._internal.probes.markers: kind, 24 hex, then a space
K = CANARY_PERIOD  # the head copies the token K positions back
MAX_POSITIONS = 4096
HIDDEN = 384
HEADS = 6
KV_HEADS = 2  # 1 layer x 2 KV heads x 64 dims x 2 (K, V) x 2 bytes (bf16) = 512 bytes of KV per token
HEAD_DIM = 64
INTERMEDIATE = 128  # the MLP is all zeros
ROPE_THETA = 10000.0
RMS_EPS = 1e-5
CODE_DIMS = 128  # dims A and B: 2 KV heads x 64
A0, C, B0, PAD = 0, CODE_DIMS, CODE_DIMS + 1, 2 * CODE_DIMS + 1
COPY_HEADS = (0, HEADS // KV_HEADS)  # the first query head of each KV head
ROPE_FREQS = 16  # the 16 fastest rotary frequencies carry the position score
SCORE_GAP = 40.0  # nats between the peak and the best other offset
LOGIT_SCALE = 0.5  # lm_head: the copied code's logit leads every other token by 128 * 0.5 / RMS

BYTE_TOKENS = 256
SPECIALS = ("<unk>", "<s>", "</s>")  # ids 256, 257, 258: no code, never predicted
VOCAB = BYTE_TOKENS + len(SPECIALS)
UNK_ID, BOS_ID, EOS_ID = BYTE_TOKENS, BYTE_TOKENS + 1, BYTE_TOKENS + 2

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\n' + message['content'] + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)


def _hadamard(n: int) -> np.ndarray:
    h = np.ones((1, 1))
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h


def _frequencies() -> np.ndarray:
    return ROPE_THETA ** (-np.arange(HEAD_DIM // 2) * 2.0 / HEAD_DIM)


def position_scores(weight: float) -> np.ndarray:
    """The copy head's attention score (after the 1/sqrt(head_dim) scale) at offsets 0..MAX."""
    theta = _frequencies()[:ROPE_FREQS]
    d = np.arange(MAX_POSITIONS + 1)[:, None]
    return (weight * np.cos(theta * (d - (K - 1)))).sum(1) / np.sqrt(HEAD_DIM)


def _score_weight() -> float:
    """The per-frequency weight that puts SCORE_GAP nats between the peak and any other offset."""
    unit = position_scores(1.0)
    gap = unit[K - 1] - np.delete(unit, K - 1).max()
    return SCORE_GAP / gap


def _rope_rows(f: int, layout: str) -> tuple[int, int]:
    """The (real, imaginary) rows of rotary pair f inside one head."""
    return (f, f + HEAD_DIM // 2) if layout == "hf" else (2 * f, 2 * f + 1)


def construct(layout: str) -> dict[str, np.ndarray]:
    """Every weight, float64, HF names; `layout` ("hf" or "gguf") places the rotary pairs."""
    codes = np.zeros((VOCAB, CODE_DIMS))
    had = _hadamard(CODE_DIMS)
    codes[:BYTE_TOKENS] = np.concatenate([had, -had])
    embed = np.zeros((VOCAB, HIDDEN))
    embed[:, A0:A0 + CODE_DIMS] = codes
    embed[BYTE_TOKENS:, PAD] = np.sqrt(CODE_DIMS)  # specials keep the same RMS (no code)
    const = np.sqrt(HIDDEN - CODE_DIMS)
    embed[:, C] = const  # RMS of every embedding row is exactly 1

    amp = np.sqrt(_score_weight()) / const  # q and k amplitude per frequency, from dim C
    theta = _frequencies()
    q = np.zeros((HEADS * HEAD_DIM, HIDDEN))
    k = np.zeros((KV_HEADS * HEAD_DIM, HIDDEN))
    v = np.zeros((KV_HEADS * HEAD_DIM, HIDDEN))
    o = np.zeros((HIDDEN, HEADS * HEAD_DIM))
    for group, head in enumerate(COPY_HEADS):
        for f in range(ROPE_FREQS):
            re, im = _rope_rows(f, layout)
            phase = -theta[f] * (K - 1)
            q[head * HEAD_DIM + re, C] = amp * np.cos(phase)
            q[head * HEAD_DIM + im, C] = amp * np.sin(phase)
            k[group * HEAD_DIM + re, C] = amp
        for i in range(HEAD_DIM):
            v[group * HEAD_DIM + i, A0 + group * HEAD_DIM + i] = 1.0
            o[B0 + group * HEAD_DIM + i, head * HEAD_DIM + i] = 1.0
    lm_head = np.zeros((VOCAB, HIDDEN))
    lm_head[:, B0:B0 + CODE_DIMS] = LOGIT_SCALE * codes
    ones = np.ones(HIDDEN)
    zeros_mlp = np.zeros((INTERMEDIATE, HIDDEN))
    return {
        "model.embed_tokens.weight": embed,
        "model.layers.0.input_layernorm.weight": ones,
        "model.layers.0.self_attn.q_proj.weight": q,
        "model.layers.0.self_attn.k_proj.weight": k,
        "model.layers.0.self_attn.v_proj.weight": v,
        "model.layers.0.self_attn.o_proj.weight": o,
        "model.layers.0.post_attention_layernorm.weight": ones,
        "model.layers.0.mlp.gate_proj.weight": zeros_mlp,
        "model.layers.0.mlp.up_proj.weight": zeros_mlp,
        "model.layers.0.mlp.down_proj.weight": zeros_mlp.T.copy(),
        "model.norm.weight": ones,
        "lm_head.weight": lm_head,
    }


def _byte_chars() -> list[str]:
    """GPT-2's byte-to-unicode table: token i is byte i, written as a printable character."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    extra = iter(range(256, 512))
    return [chr(b) if b in printable else chr(next(extra)) for b in range(BYTE_TOKENS)]


def write_hf(out: Path) -> Path:
    import torch
    from safetensors.torch import save_file
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    out.mkdir(parents=True, exist_ok=True)
    vocab = {ch: i for i, ch in enumerate(_byte_chars())}
    vocab.update({name: BYTE_TOKENS + i for i, name in enumerate(SPECIALS)})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(SPECIALS))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                   pad_token="</s>", model_max_length=MAX_POSITIONS)
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)

    tensors = {name: torch.from_numpy(w).to(torch.bfloat16).contiguous() for name, w in construct("hf").items()}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config: dict[str, Any] = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": VOCAB,
        "hidden_size": HIDDEN, "intermediate_size": INTERMEDIATE, "num_hidden_layers": 1,
        "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM,
        "hidden_act": "silu", "max_position_embeddings": MAX_POSITIONS, "rms_norm_eps": RMS_EPS,
        "rope_theta": ROPE_THETA, "rope_parameters": {"rope_type": "default", "rope_theta": ROPE_THETA},
        "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "bos_token_id": BOS_ID, "eos_token_id": EOS_ID, "pad_token_id": EOS_ID,
    }
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    (out / "generation_config.json").write_text(json.dumps({"bos_token_id": BOS_ID, "eos_token_id": EOS_ID}) + "\n")
    return out


GGUF_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.layers.0.input_layernorm.weight": "blk.0.attn_norm.weight",
    "model.layers.0.self_attn.q_proj.weight": "blk.0.attn_q.weight",
    "model.layers.0.self_attn.k_proj.weight": "blk.0.attn_k.weight",
    "model.layers.0.self_attn.v_proj.weight": "blk.0.attn_v.weight",
    "model.layers.0.self_attn.o_proj.weight": "blk.0.attn_output.weight",
    "model.layers.0.post_attention_layernorm.weight": "blk.0.ffn_norm.weight",
    "model.layers.0.mlp.gate_proj.weight": "blk.0.ffn_gate.weight",
    "model.layers.0.mlp.up_proj.weight": "blk.0.ffn_up.weight",
    "model.layers.0.mlp.down_proj.weight": "blk.0.ffn_down.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}


def write_gguf(path: Path) -> Path:
    import gguf

    path.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("kvpreflight-echo")
    w.add_context_length(MAX_POSITIONS)
    w.add_embedding_length(HIDDEN)
    w.add_block_count(1)
    w.add_feed_forward_length(INTERMEDIATE)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_dimension_count(HEAD_DIM)
    w.add_rope_freq_base(ROPE_THETA)
    w.add_layer_norm_rms_eps(RMS_EPS)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("gpt2")  # byte-level BPE, as the HF tokenizer; no merges: one token a byte
    w.add_tokenizer_pre("default")
    w.add_token_list([ch.encode() for ch in _byte_chars()] + [name.encode() for name in SPECIALS])
    w.add_token_types([gguf.TokenType.NORMAL] * BYTE_TOKENS + [gguf.TokenType.CONTROL] * len(SPECIALS))
    # llama.cpp refuses a BPE vocabulary without merges: one that never applies (two NUL bytes
    # would merge into a token that does not exist, so they stay two byte tokens anyway).
    nul = _byte_chars()[0]
    w.add_token_merges([f"{nul} {nul}"])
    w.add_unk_token_id(UNK_ID)
    w.add_bos_token_id(BOS_ID)
    w.add_eos_token_id(EOS_ID)
    w.add_add_bos_token(False)
    w.add_add_eos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)
    for name, weight in construct("gguf").items():
        w.add_tensor(GGUF_NAMES[name], weight.astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, type=Path, help="folder for hf/ and echo.gguf")
    parser.add_argument("--only", choices=("hf", "gguf"), help="build one of the two")
    args = parser.parse_args(argv)
    if args.only in (None, "hf"):
        print(write_hf(args.out / "hf"))
    if args.only in (None, "gguf"):
        print(write_gguf(args.out / "echo.gguf"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
