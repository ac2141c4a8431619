"""Built-in model configurations: small transformers causal LMs built locally, nothing downloaded.

The demo, the benchmarks, the tests and ``inferwatch bench`` all need real models without network access.
These are real ``transformers`` architectures (Llama and GPT-2 families) with randomly initialised weights
from a fixed seed, so every build of a name gives bit-identical weights. Text is encoded byte-wise
(:func:`encode_text`), which is why every built-in vocabulary has at least 256 + 3 entries.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

# Byte-level text: ids 0..255 are bytes; the three ids after them are the special tokens.
BOS_TOKEN_ID = 256
EOS_TOKEN_ID = 257
PAD_TOKEN_ID = 258
BYTE_VOCAB_SIZE = 259


@dataclass(frozen=True)
class BuiltinModel:
    """A named architecture and its config arguments."""

    family: str  # "llama" or "gpt2"
    description: str
    config: dict[str, Any]


_LLAMA_COMMON = {
    "bos_token_id": BOS_TOKEN_ID,
    "eos_token_id": EOS_TOKEN_ID,
    "pad_token_id": PAD_TOKEN_ID,
    "tie_word_embeddings": False,
}

BUILTIN_MODELS: dict[str, BuiltinModel] = {
    "tiny-llama": BuiltinModel(
        "llama",
        "2-layer Llama, hidden 64: unit tests",
        dict(
            _LLAMA_COMMON,
            vocab_size=BYTE_VOCAB_SIZE,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=4096,
        ),
    ),
    "small-llama": BuiltinModel(
        "llama",
        "4-layer Llama, hidden 512 (~17M params): the CPU demo and benchmarks",
        dict(
            _LLAMA_COMMON,
            vocab_size=8192,
            hidden_size=512,
            intermediate_size=1408,
            num_hidden_layers=4,
            num_attention_heads=8,
            num_key_value_heads=4,
            max_position_embeddings=4096,
        ),
    ),
    "llama-1b": BuiltinModel(
        "llama",
        "Llama-3.2-1B shape (~1.2B params): GPU benchmarks",
        dict(
            _LLAMA_COMMON,
            vocab_size=128256,
            hidden_size=2048,
            intermediate_size=8192,
            num_hidden_layers=16,
            num_attention_heads=32,
            num_key_value_heads=8,
            max_position_embeddings=8192,
            rope_theta=500000.0,
        ),
    ),
    "tiny-gpt2": BuiltinModel(
        "gpt2",
        "2-layer GPT-2, hidden 64: unit tests of the GPT-2 family",
        dict(
            vocab_size=BYTE_VOCAB_SIZE,
            n_embd=64,
            n_layer=2,
            n_head=4,
            n_positions=4096,
            bos_token_id=BOS_TOKEN_ID,
            eos_token_id=EOS_TOKEN_ID,
            pad_token_id=PAD_TOKEN_ID,
        ),
    ),
}


class UnknownModelError(ValueError):
    """A model spec that is neither a built-in name nor a local model directory."""


def build_config(name: str) -> Any:
    """The ``transformers`` config object of a built-in model."""
    import transformers

    try:
        spec = BUILTIN_MODELS[name]
    except KeyError:
        raise UnknownModelError(
            f"unknown model {name!r}: built-in models are {', '.join(BUILTIN_MODELS)}"
        ) from None
    config_class = {"llama": transformers.LlamaConfig, "gpt2": transformers.GPT2Config}[spec.family]
    return config_class(**spec.config)


def build_model(name: str, *, device: str | None = None, dtype: Any = None, seed: int = 0) -> Any:
    """Build a built-in model with weights from ``seed``; eval mode, on ``device`` in ``dtype``."""
    import torch
    import transformers

    config = build_config(name)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config)
    if dtype is not None:
        model = model.to(dtype=dtype)
    if device is not None:
        model = model.to(device)
    return model.eval()


def load_model(spec: str, *, device: str | None = None, dtype: Any = None, seed: int = 0) -> Any:
    """A built-in model by name, or a model saved locally (``save_pretrained``) by directory path."""
    if spec in BUILTIN_MODELS:
        return build_model(spec, device=device, dtype=dtype, seed=seed)
    if os.path.isdir(spec):
        import transformers

        model = transformers.AutoModelForCausalLM.from_pretrained(spec, local_files_only=True, dtype=dtype)
        if device is not None:
            model = model.to(device)
        return model.eval()
    raise UnknownModelError(
        f"unknown model {spec!r}: not a local directory, and built-in models are {', '.join(BUILTIN_MODELS)}"
    )


def encode_text(text: str) -> list[int]:
    """Byte-level encoding used with the built-in vocabularies: BOS, then one id per UTF-8 byte."""
    return [BOS_TOKEN_ID, *text.encode("utf-8")]


def default_device() -> str:
    """``cuda`` when a GPU is usable, else ``cpu``."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"
