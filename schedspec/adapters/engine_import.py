"""A real engine imported into this process: once, offline and quiet, with its tiny model
folders written. What adapters/vllm/runtime.py and adapters/sglang/runtime.py share; each
says what it imports, which loggers it quiets and which tiny models it writes.

- Once: the first engine built imports the engine and writes the folders (`ImportedOnce`);
  later ones reuse them. An import that fails is the adapter's EngineMissingError, naming
  the install step, and is tried again the next time.
- Offline: HF_HUB_OFFLINE=1 unless the user set it, before the engine is imported
  (huggingface_hub reads it when imported): a tiny model is a local folder, and nothing
  may be downloaded.
- Quiet: the loggers an adapter names keep only the records it names, unless the user
  configured the engine's logging (one of the engine's variables set) or gave that
  logger a level: an engine warns about every tiny config, which says nothing here.
- Tiny models: Llama-shaped Hugging Face configs (`tiny_llama`), small enough that
  building the engine's model costs nothing, each the only file of its folder (no
  tokenizer, no weights), under one temporary folder that goes when the process exits.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Generic, TypeVar

T = TypeVar("T")
# The tiny models' vocabulary: the harness's token ids (FakeModel's default vocab_size)
# must be below it, since an engine checks stop token ids against it.
TINY_VOCAB_SIZE = 32000
# The tiny models' max_position_embeddings: the longest context an engine can be asked for.
TINY_MAX_POSITIONS = 1 << 20


class EngineMissingError(ImportError):
    """A real engine is not importable in this environment."""


class ImportedOnce(Generic[T]):
    """An engine's names, imported by `load` the first time they are asked for."""

    def __init__(self, load: Callable[[], T]) -> None:
        self._load = load
        self.loaded: T | None = None

    def get(self) -> T:
        if self.loaded is None:
            self.loaded = self._load()
        return self.loaded

    def available(self) -> bool:
        """Whether the engine can be imported (and so an engine built)."""
        try:
            self.get()
        except EngineMissingError:
            return False
        return True


@contextmanager
def importing(
    engine: str, install: str, missing: Callable[[str], EngineMissingError]
) -> Iterator[None]:
    """The block imports `engine` offline; an ImportError in it is `missing`, saying how to
    install the engine (`install`: where, and the command)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        yield
    except ImportError as err:
        raise missing(
            f"the {engine} adapter needs {engine}, which cannot be imported here ({err}); "
            f"install it {install}"
        ) from err


def quiet_loggers(names: Sequence[str], level: int, variables: Sequence[str]) -> bool:
    """Each logger of `names` without a level of its own gets `level`, unless the user
    configured the engine's logging (one of `variables` set). Whether it did."""
    if any(name in os.environ for name in variables):
        return False
    for name in names:
        logger = logging.getLogger(name)
        if logger.level == logging.NOTSET:
            logger.setLevel(level)
    return True


def tiny_llama(architecture: str, **fields: object) -> dict[str, object]:
    """The Hugging Face config of a tiny Llama-shaped model of the architecture named
    (the class the engine builds for it), with `fields` added or replaced."""
    return {
        "architectures": [architecture],
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "num_hidden_layers": 2,
        "vocab_size": TINY_VOCAB_SIZE,
        "max_position_embeddings": TINY_MAX_POSITIONS,
        "torch_dtype": "float32",
        **fields,
    }


def tiny_model_folders(prefix: str, configs: Mapping[str, Mapping[str, object]]) -> dict[str, str]:
    """A folder per name of `configs` holding only its config.json, under a new temporary
    folder (its name starts with `prefix`) removed at exit: the folders, by name."""
    root = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, root, True)
    folders = {}
    for name, hf_config in configs.items():
        folder = os.path.join(root, name)
        os.mkdir(folder)
        with open(os.path.join(folder, "config.json"), "w") as f:
            json.dump(hf_config, f)
        folders[name] = folder
    return folders
