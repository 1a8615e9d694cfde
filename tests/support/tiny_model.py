"""A tiny random-weight Llama and a byte-level BPE tokenizer, built locally for real-vLLM tests.

Why random weights: the tests measure serving (queueing, batching, token timing), not text quality,
so any model with a real architecture will do, and nothing is fetched from a hub. The shape is the
smallest one the vLLM CPU attention kernels accept: head_dim 64 works, head_dim 16 is rejected
(hidden 256, 4 heads, 2 KV heads, 2 layers, vocab 512).

The tokenizer is trained with ``tokenizers`` on a generated corpus of pseudo-words, so the common
filler word ``" the"`` is one token: the replay client builds prompts of an exact length from it.

Usage::

    model_dir = create_tiny_model(tmp_path / "tiny-llama")
"""

from __future__ import annotations

import json
from pathlib import Path

VOCAB_SIZE = 512
HIDDEN = 256
HEADS = 4
KV_HEADS = 2
LAYERS = 2
MAX_POSITIONS = 4096
SPECIAL_TOKENS = ("<unk>", "<s>", "</s>")

# a minimal chat template so /v1/chat/completions and /tokenize with messages work
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "<|{{ message['role'] }}|>{{ message['content'] }}{{ eos_token }}"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def _corpus(seed: int, lines: int = 4000) -> list[str]:
    """Pseudo-English lines: a fixed word list (so BPE learns whole words) plus random syllables."""
    import numpy as np

    rng = np.random.default_rng(seed)
    words = ["the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "with", "was", "on",
             "token", "model", "request", "replica", "queue", "latency", "prefill", "decode", "cache"]
    syllables = ["ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "ze", "qua", "pri", "stel"]
    out = []
    for _ in range(lines):
        n = int(rng.integers(5, 30))
        line = []
        for _ in range(n):
            if rng.random() < 0.7:
                line.append(words[int(rng.integers(len(words)))])
            else:
                k = int(rng.integers(1, 4))
                line.append("".join(syllables[int(i)] for i in rng.integers(len(syllables), size=k)))
        out.append(" ".join(line) + rng.choice([".", ",", "!", "?"]))
    return out


def _train_tokenizer(directory: Path, seed: int) -> None:
    """Train a byte-level BPE (GPT-2 style) and save it as a Hugging Face fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_corpus(seed), trainer=trainer)
    bos = tokenizer.token_to_id("<s>")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
        model_max_length=MAX_POSITIONS,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(directory))


def _save_model(directory: Path, seed: int, vocab_size: int) -> None:
    """Random-weight LlamaForCausalLM saved as safetensors in bfloat16."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=HIDDEN,
        intermediate_size=2 * HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        head_dim=HIDDEN // HEADS,
        max_position_embeddings=MAX_POSITIONS,
        bos_token_id=SPECIAL_TOKENS.index("<s>"),
        eos_token_id=SPECIAL_TOKENS.index("</s>"),
        tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(str(directory), safe_serialization=True)


def create_tiny_model(directory: Path, seed: int = 0) -> Path:
    """Write the tokenizer, config and weights into ``directory`` (created) and return it."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    _train_tokenizer(directory, seed)
    vocab = json.loads((directory / "tokenizer.json").read_text())["model"]["vocab"]
    _save_model(directory, seed, max(VOCAB_SIZE, len(vocab)))
    return directory


if __name__ == "__main__":
    import sys

    print(create_tiny_model(Path(sys.argv[1] if len(sys.argv) > 1 else "tiny-llama")))
