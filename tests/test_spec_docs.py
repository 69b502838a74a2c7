"""docs/inputs.md stays in step with the built-in device catalog and the presets."""
from __future__ import annotations

import os

from hetauto_megatron.spec.devices import CATALOG
from hetauto_megatron.spec.model import PRESETS

DOC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "inputs.md")


def test_inputs_doc_lists_every_catalog_device_and_preset():
    text = open(DOC).read()
    missing = [n for n in list(CATALOG) + list(PRESETS) if f"`{n}`" not in text]
    assert not missing, f"docs/inputs.md does not list: {missing}"
