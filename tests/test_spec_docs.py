"""docs/inputs.md stays in step with the built-in device catalog and the presets; docs/plan-format.md's example
plans are plans the commands take."""
from __future__ import annotations

import os
import re

import pytest

from hetauto_megatron.cli import main

from hetauto_megatron.spec.devices import CATALOG
from hetauto_megatron.spec.model import PRESETS

DOCS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs")
DOC = os.path.join(DOCS, "inputs.md")


def test_inputs_doc_lists_every_catalog_device_and_preset():
    text = open(DOC).read()
    missing = [n for n in list(CATALOG) + list(PRESETS) if f"`{n}`" not in text]
    assert not missing, f"docs/inputs.md does not list: {missing}"


def plan_format_examples() -> list[str]:
    """The complete plan files of docs/plan-format.md's version-3 section (the abridged ones start otherwise)."""
    text = open(os.path.join(DOCS, "plan-format.md")).read()
    return [b for b in re.findall(r"```yaml\n(.*?)```", text, re.S) if b.startswith("version: 3")]


@pytest.mark.parametrize("per_node", [8, 4])
def test_plan_format_examples_launch_on_whole_nodes(per_node, tmp_path, capsys):
    """A user copying the examples gets launch scripts, not exit 2: the first needs 8-device nodes (the A100
    pipeline ran 12 processes), the second also starts on 4-GPU VMs (its A100 mesh ran 6)."""
    examples = plan_format_examples()
    assert len(examples) == 2
    for i, text in enumerate(examples if per_node == 8 else examples[1:]):
        plan = tmp_path / f"example{i}.yaml"
        plan.write_text(text)
        rc = main(["emit", "megatron", "--plan", str(plan), "-o", str(tmp_path / f"launch{i}"),
                   "--devices-per-node", str(per_node)])
        assert rc == 0, capsys.readouterr().err
