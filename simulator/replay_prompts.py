"""Prompts with exactly the trace's input token count, for the model an endpoint serves.

Why the server's ``/tokenize`` and not a local tokenizer: the server is the only authority on what
it will count (its tokenizer revision, the BOS it adds, the chat template of ``/v1/chat/completions``),
and a user replaying against GPU pods often cannot download a gated model's tokenizer where the
replay runs. ``/tokenize`` accepts both a ``prompt`` and chat ``messages``, so one probe per mode
gives the fixed overhead (BOS, template) and the rest is filler.

The filler is a random sequence of words that each encode to exactly one token after a space (probed
once); byte-level BPE tokenizers split on spaces, so ``n`` such words are ``n`` tokens. Random words
also keep requests from sharing a prefix: vLLM's prefix cache would otherwise skip most prefill
(we measured a 90 % hit rate with a repeated filler) and the replay would flatter the server.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import numpy as np

CANDIDATE_WORDS = ("the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "with", "was", "on",
                   "be", "at", "by", "this", "are", "from", "or", "an", "not", "but", "have", "they", "we",
                   "token", "model", "request", "queue", "cache", "time", "one", "all", "can", "more")
MIN_WORDS = 8  # fewer single-token words would make accidental shared prefixes likely

TokenCounter = Callable[[dict], Awaitable[int]]
"""Posts one ``/tokenize`` body (``{"prompt": ...}`` or ``{"messages": [...]}``) and returns ``count``."""


class PromptError(RuntimeError):
    """The served tokenizer does not allow exact-length prompts (names what was probed)."""


@dataclass
class PromptBuilder:
    """Builds request bodies of an exact token count; ``await probe()`` once before ``build``."""

    count_tokens: TokenCounter
    api: str = "completions"
    seed: int = 0
    words: tuple[str, ...] = ()
    overhead: int = 0
    _rng: np.random.Generator = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.api not in ("completions", "chat"):
            raise ValueError(f"api={self.api!r}: allowed values are 'completions', 'chat'")
        self._rng = np.random.default_rng(self.seed)

    def _body(self, text: str) -> dict:
        if self.api == "chat":
            return {"messages": [{"role": "user", "content": text}]}
        return {"prompt": text}

    async def probe(self) -> None:
        """Find single-token words and the fixed overhead of this api's framing."""
        empty = await self.count_tokens(self._body(""))
        words = []
        for word in CANDIDATE_WORDS:
            if await self.count_tokens(self._body(" " + word)) == empty + 1:
                words.append(word)
        if len(words) < MIN_WORDS:
            raise PromptError(f"only {len(words)} of {len(CANDIDATE_WORDS)} probe words encode to one token "
                              f"({words}); need {MIN_WORDS} to build exact-length prompts")
        self.words, self.overhead = tuple(words), empty
        sample = self.text(200)
        got = await self.count_tokens(self._body(sample))
        if got != empty + 200:
            raise PromptError(f"200 filler words counted {got} tokens, expected {empty + 200}: the tokenizer "
                              "merges across words, exact-length prompts are not possible")

    def text(self, n_words: int) -> str:
        """``n_words`` random single-token words, each after a space."""
        if not self.words:
            raise PromptError("PromptBuilder.probe() must run before building prompts")
        idx = self._rng.integers(len(self.words), size=max(0, n_words))
        return "".join(" " + self.words[i] for i in idx)

    def words_for(self, input_tokens: int) -> int:
        """Filler words that make a prompt of ``input_tokens`` tokens (at least one word)."""
        return max(1, int(input_tokens) - self.overhead)

    def build(self, input_tokens: int) -> tuple[dict, int]:
        """The prompt part of a request body and the token count the server will see."""
        n = self.words_for(input_tokens)
        return self._body(self.text(n)), n + self.overhead


def fit_lengths(input_tokens: int, output_tokens: int, max_model_len: int | None,
                min_prompt: int = 1) -> tuple[int, int, bool]:
    """Clip a request to the server's context (prompt first, keeping its output); True if clipped."""
    inp, out = max(min_prompt, int(input_tokens)), max(1, int(output_tokens))
    if max_model_len is None or inp + out <= max_model_len:
        return inp, out, False
    out = min(out, max(1, max_model_len - min_prompt))
    inp = max(min_prompt, min(inp, max_model_len - out))
    return inp, out, True
