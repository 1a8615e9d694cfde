"""Prompts with exactly the trace's input token count, for whatever tokenizer an endpoint serves.

Why the server's ``/tokenize`` and not a local tokenizer: the server is the only authority on what
it will count (its tokenizer revision, the BOS it adds, the chat template of ``/v1/chat/completions``),
and a user replaying against GPU pods often cannot download a gated model's tokenizer where the
replay runs. Nothing here assumes an English BPE, or any tokenizer at all beyond ``/tokenize``:

- **completions**: the prompt is a list of token ids (the OpenAI completions API takes one, and vLLM
  feeds it to the model as is, adding nothing), drawn at random from the ids the served tokenizer
  produced for a probe text of random pseudo-words. ``n`` ids are ``n`` prompt tokens, exactly, with
  no ``/tokenize`` call per request.
- **chat**: the content must be text, so its length is found by search: a random pseudo-word text,
  cut at the character where ``/tokenize`` (with the chat template) counts the target, found by
  interpolation then bisection from the probe's characters per token (a handful of calls), and a
  last token made up by trying a few short endings when one character jumps the count by two.

Random ids and random text also keep requests from sharing a prefix: vLLM's prefix cache would
otherwise skip most prefill (we measured a 90 % hit rate with a repeated filler) and the replay
would flatter the server.
"""

from __future__ import annotations

import string
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import numpy as np

MIN_POOL = 16
"""Distinct token ids the probe text must yield: fewer would make accidental shared prefixes likely."""

PROBE_WORDS = 2000
"""Pseudo-words in the probe text (some thousands of tokens for any tokenizer)."""

ENDINGS = (".", "a", "e", "x", "0", "!", " a", " o")
"""Short endings tried when one more character of filler jumps the count past the target."""

MAX_SEARCH_CALLS = 40
"""``/tokenize`` calls one chat prompt may take before the closest length found is used."""

Tokenize = Callable[[dict[str, object]], Awaitable[tuple[int, list[int]]]]
"""Posts one ``/tokenize`` body (``{"prompt": ...}`` or ``{"messages": [...]}``); returns
``(count, tokens)`` as the server answers them."""


class PromptError(RuntimeError):
    """The endpoint's tokenizer cannot give exact-length prompts (names what was probed)."""


def pseudo_words(rng: np.random.Generator, n: int) -> str:
    """``n`` random lowercase pseudo-words of 2–8 letters, each after a space: no language, no shared prefix."""
    letters = np.array(list(string.ascii_lowercase))
    lengths = rng.integers(2, 9, size=n)
    chars = letters[rng.integers(0, letters.size, size=int(lengths.sum()))]
    words, start = [], 0
    for length in lengths:
        words.append("".join(chars[start:start + length]))
        start += int(length)
    return "".join(" " + w for w in words)


@dataclass
class PromptBuilder:
    """Builds request bodies of an exact token count; ``await probe()`` once, then ``await build(n)``."""

    tokenize: Tokenize
    api: str = "completions"
    seed: int = 0
    overhead: int = 0
    """Tokens the framing adds on its own (chat template, BOS); 0 for token-id prompts."""
    pool: tuple[int, ...] = ()
    chars_per_token: float = 0.0
    search_calls: int = 0
    """``/tokenize`` calls spent on chat prompts so far (reported)."""
    _rng: np.random.Generator = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.api not in ("completions", "chat"):
            raise ValueError(f"api={self.api!r}: allowed values are 'completions', 'chat'")
        self._rng = np.random.default_rng(self.seed)

    def _body(self, text: str) -> dict[str, object]:
        if self.api == "chat":
            return {"messages": [{"role": "user", "content": text}]}
        return {"prompt": text}

    async def probe(self) -> None:
        """Learn the framing's overhead, the tokenizer's ordinary ids and its characters per token."""
        empty_count, empty_tokens = await self.tokenize(self._body(""))
        text = pseudo_words(self._rng, PROBE_WORDS)
        count, tokens = await self.tokenize({"prompt": text})
        framing = set(empty_tokens) if self.api == "completions" else set((await self.tokenize({"prompt": ""}))[1])
        pool = sorted(set(tokens) - framing)
        if len(pool) < MIN_POOL:
            raise PromptError(f"/tokenize gave {len(pool)} distinct ordinary token ids for {PROBE_WORDS} random "
                              f"pseudo-words; need {MIN_POOL} to build prompts that share no prefix")
        body_count = count - len(framing & set(tokens)) if tokens else count
        self.pool = tuple(pool)
        self.chars_per_token = len(text) / max(1, body_count)
        self.overhead = 0 if self.api == "completions" else empty_count

    async def build(self, input_tokens: int) -> tuple[dict[str, object], int]:
        """The prompt part of a request body and the token count the server will see (exact, except a
        chat prompt whose framing alone exceeds ``input_tokens``: then one character, counted honestly)."""
        if not self.pool:
            raise PromptError("PromptBuilder.probe() must run before building prompts")
        if self.api == "completions":
            n = max(1, int(input_tokens))
            ids = np.asarray(self.pool)[self._rng.integers(0, len(self.pool), size=n)]
            return {"prompt": [int(i) for i in ids]}, n
        return await self._chat(max(1, int(input_tokens)))

    async def _chat(self, target: int) -> tuple[dict[str, object], int]:
        want = max(1, target - self.overhead)
        text = pseudo_words(self._rng, max(8, int(want * self.chars_per_token / 4) + 16))
        while len(text) < want * self.chars_per_token * 1.5 + 64:
            text += pseudo_words(self._rng, max(8, len(text) // 5))
        memo: dict[int, int] = {}

        async def count(chars: int) -> int:
            if chars not in memo:
                self.search_calls += 1
                memo[chars] = (await self.tokenize(self._body(text[:chars])))[0]
            return memo[chars]

        # bracket: counts rise with the characters kept (a tokenizer that merged across the cut might
        # dip by one; the bracket only needs low below and high at or above the target)
        low, high = 0, min(len(text), max(1, int(want * self.chars_per_token)))
        while await count(high) < target and high < len(text):
            low, high = high, min(len(text), high * 2)
        while high - low > 1 and len(memo) < MAX_SEARCH_CALLS:
            mid = (low + high) // 2
            if await count(mid) < target:
                low = mid
            else:
                high = mid
        best = high if await count(high) == target else low
        if await count(best) == target or best == 0:
            return self._body(text[:best] if best else text[:1]), await count(best or 1)
        for ending in ENDINGS:  # one character jumped the count by two: find a one-token ending
            candidate = text[:best] + ending
            self.search_calls += 1
            got = (await self.tokenize(self._body(candidate)))[0]
            if got == target:
                return self._body(candidate), got
        return self._body(text[:best]), await count(best)


def fit_lengths(input_tokens: int, output_tokens: int, max_model_len: int | None,
                min_prompt: int = 1) -> tuple[int, int, bool]:
    """Clip a request to the server's context (prompt first, keeping its output); True if clipped."""
    inp, out = max(min_prompt, int(input_tokens)), max(1, int(output_tokens))
    if max_model_len is None or inp + out <= max_model_len:
        return inp, out, False
    out = min(out, max(1, max_model_len - min_prompt))
    inp = max(min_prompt, min(inp, max_model_len - out))
    return inp, out, True
