"""The README's Python examples run as written, in order, in one namespace (as a reader pastes them), on the
machine's device: they stay in step with the API. On a CPU they use the small sizes they choose there."""

from __future__ import annotations

import re
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def python_blocks(markdown: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", markdown, flags=re.S)


def test_the_readme_has_its_examples():
    blocks = python_blocks((ROOT / "README.md").read_text(encoding="utf-8"))
    assert len(blocks) >= 3
    assert any("mta.conv_attention(" in b for b in blocks) and any("conv_decode_attention(" in b for b in blocks)


def test_the_readme_examples_run():
    namespace = {"__name__": "readme"}
    for block in python_blocks((ROOT / "README.md").read_text(encoding="utf-8")):
        exec(compile(block, "README.md", "exec"), namespace)
    # What the examples promise: finite outputs, gradients for every input, decode rows of the right shape.
    assert torch.isfinite(namespace["mta_out"]).all()
    assert all(t.grad is not None and torch.isfinite(t.grad).all() for t in (namespace[n] for n in "qkv"))
    assert namespace["out"].shape == (2, 8, 1, 64) and namespace["y_next"].shape == (2, 1, 512)
