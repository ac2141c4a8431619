"""A small model directory that ``transformers serve DIR`` loads with nothing downloaded.

``transformers serve`` loads a model by name through ``AutoProcessor`` / ``from_pretrained``, so the tests
of the launcher under a real OpenAI-compatible server need a complete checkpoint on disk: config, weights,
generation config, a fast tokenizer with a chat template. This module writes one: a random-weight Llama
(2 layers, hidden 64) and a character-level tokenizer built locally with the ``tokenizers`` library.

Two properties the serving tests rely on:

* **every generated token is text**: each of the 256 ordinary tokens is one printable character, so the
  server's incremental decoder (``DecodeStream``) yields a content chunk for every token, and the client's
  first content chunk is the first generated token (a byte-level vocabulary would hold back invalid UTF-8
  fragments and shift the client's time to first chunk);
* **greedy decoding never stops early**: the output rows of the special tokens (``<s>``, ``</s>``,
  ``<pad>``, ``<unk>``) in ``lm_head`` are zero, so their logit is exactly 0 while the largest of the other
  random logits is positive; a request runs to its ``max_tokens`` and its chunks are all content.
"""

from __future__ import annotations

from pathlib import Path

#: Special tokens, after the 256 ordinary ones.
BOS, EOS, PAD, UNK = "<s>", "</s>", "<pad>", "<unk>"
SPECIAL_TOKENS = (BOS, EOS, PAD, UNK)

# ASCII printable, newline and tab, then Latin letters from U+00C0 on: 256 single-character tokens, each
# valid UTF-8 text on its own.
_ASCII = [chr(c) for c in range(32, 127)] + ["\n", "\t"]
CHARACTERS = tuple(_ASCII + [chr(0xC0 + i) for i in range(256 - len(_ASCII))])

#: A prompt template as small as a real one: role-tagged turns opened by ``<s>``, then the assistant's cue.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<s>{{ message['role'] }}: {{ message['content'] }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant: {% endif %}"
)


def build_tokenizer():  # -> transformers.PreTrainedTokenizerFast (imported lazily: heavy)
    """A character-level fast tokenizer over :data:`CHARACTERS` plus the special tokens.

    A BPE model with no merges splits text into single characters and maps each to its id; the ``Fuse``
    decoder concatenates them back (without one, ``tokenizers`` joins tokens with spaces).
    """
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    vocab = {char: index for index, char in enumerate(CHARACTERS)}
    vocab.update({token: len(CHARACTERS) + i for i, token in enumerate(SPECIAL_TOKENS)})
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK))
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens(list(SPECIAL_TOKENS))
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token=BOS, eos_token=EOS, pad_token=PAD, unk_token=UNK
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def write_serve_model(
    directory: Path,
    *,
    seed: int = 0,
    hidden_size: int = 64,
    intermediate_size: int = 128,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    device: str = "cpu",
    dtype: str = "float32",
    max_positions: int = 4096,
) -> Path:
    """Write the model, its generation config and its tokenizer into ``directory``; return it.

    The same ``seed`` gives the same weights. Greedy decoding is the default of the generation config, and
    its ``eos_token_id`` is ``</s>`` (never generated, see the module docstring). ``intermediate_size``
    sets the weight of the model (2 MLPs of ``3 * hidden_size * intermediate_size`` parameters) at almost
    no cost per token: a memory-leak test needs a model whose leaked copies show in the process's RSS.
    ``layers``/``heads``/``kv_heads``, ``device`` (where the weights are made) and ``dtype`` (how they are
    saved) build larger models for the GPU benchmark; ``max_positions`` bounds a request's length.
    """
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    tokenizer = build_tokenizer()
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in SPECIAL_TOKENS}
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=max_positions,
        bos_token_id=ids[BOS],
        eos_token_id=ids[EOS],
        pad_token_id=ids[PAD],
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    with torch.device(device):
        model = LlamaForCausalLM(config).to(getattr(torch, dtype)).eval()
    with torch.no_grad():
        for token_id in ids.values():
            model.lm_head.weight[token_id].zero_()
    model.generation_config = GenerationConfig(
        bos_token_id=ids[BOS], eos_token_id=ids[EOS], pad_token_id=ids[PAD], do_sample=False
    )
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory
