"""The documented framework recipes are the code CI runs: each ```python block of docs/recipes.md must be,
verbatim, the region between `# --- recipe: NAME ---` and `# --- end recipe ---` of its client script in
tests/clients/ (dedented, without the scripts' `probe.` recording lines). Edit the script, then copy the region to
docs/recipes.md. docs/coming-from-dataloader.md must have a row for every DataLoader argument.
"""
from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RECIPES = {"lightning": "lightning_train.py", "accelerate": "accelerate_train.py", "torchrun": "torchvision_train.py",
           "openclip": "openclip_train.py"}


def recipe(name: str) -> str:
    text = (ROOT / "tests" / "clients" / RECIPES[name]).read_text()
    m = re.search(rf"^[ \t]*# --- recipe: {name} ---\n(.*?)^[ \t]*# --- end recipe ---", text, re.S | re.M)
    assert m, f"no recipe region '{name}' in tests/clients/{RECIPES[name]}"
    lines = [line for line in m.group(1).splitlines(keepends=True) if "probe." not in line]
    return textwrap.dedent("".join(lines)).strip("\n") + "\n"


def recipes_doc_blocks() -> list[str]:
    """Every ```python block of docs/recipes.md."""
    text = (ROOT / "docs" / "recipes.md").read_text()
    return [b.strip("\n") + "\n" for b in re.findall(r"^```python\n(.*?)^```", text, re.S | re.M)]


@pytest.mark.parametrize("name", RECIPES)
def test_the_documented_recipe_is_the_tested_code(name):
    code = recipe(name)
    assert "fastfeed.Loader(" in code
    assert code in recipes_doc_blocks(), f"docs/recipes.md's {name} recipe differs from tests/clients/{RECIPES[name]}"


def test_the_dataloader_page_has_a_row_for_every_dataloader_argument():
    import inspect

    import torch.utils.data

    section = (ROOT / "docs" / "coming-from-dataloader.md").read_text()
    params = [p for p in inspect.signature(torch.utils.data.DataLoader.__init__).parameters if p != "self"]
    missing = [p for p in params if f"`{p}" not in section]
    assert not missing, f"the 'Coming from DataLoader' table lacks {missing}"
