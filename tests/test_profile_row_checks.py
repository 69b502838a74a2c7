"""A profile row whose operator or layer shape was edited by hand (a dimension as text, 0, negative, huge, a fraction,
true; a layer's TP degree 0 or one that does not divide its heads) is refused naming the file, the line and the
field (exit 2), as a bad time is. Before, `hetauto fit` and `validate-cost-model --profile` failed with a
traceback (TypeError, ZeroDivisionError), said the model's field without the file, or fitted the row silently: a
dimension of 10^30 priced plans 10^25 times too slow."""
import json
import os

import pytest

from hetauto_megatron.cli import main

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "hetauto_megatron", "data", "h200")
OPS, LAYERS = os.path.join(DATA, "profile-h200.jsonl"), os.path.join(DATA, "layers-h200.jsonl")


def _corrupt(src: str, dst, section: str, kind: str, field: str, value) -> int:
    """`dst`: `src` with `field` of the first row whose `section` is of `kind` set to `value`; its line number."""
    lines = open(src, encoding="utf-8").read().splitlines()
    for no, line in enumerate(lines[1:], 2):
        row = json.loads(line)
        if row[section]["kind"] == kind:
            row[section][field] = value
            lines[no - 1] = json.dumps(row)
            dst.write_text("\n".join(lines) + "\n")
            return no
    raise AssertionError(f"no {kind} row in {src}")


def _refused(capsys, args, path, line: int, field: str, words: str):
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert f"{path}: field '{field}'" in err and f"line {line} (row " in err and "Fix: " in err, err
    assert words in err, err


@pytest.mark.parametrize("kind, field, value, words", [
    ("activation", "n", "2048", "a JSON string"),
    ("activation", "n", True, "a JSON boolean"),
    ("gemm", "k", 2048.5, "a number with a fraction"),
    ("gemm", "n", -5, "not from 1"),
    ("activation", "n", 0, "not from 1"),
    ("attention", "heads", 10 ** 30, "not from 1"),
    ("activation", "gated", 2, "not 0 or 1"),
], ids=["text", "bool", "fraction", "negative", "zero-sized", "huge", "flag"])
def test_an_edited_operator_dimension_is_named(tmp_path, capsys, kind, field, value, words):
    bad = tmp_path / "profile-h200.jsonl"
    line = _corrupt(OPS, bad, "op", kind, field, value)
    _refused(capsys, ["fit", str(bad), "-o", str(tmp_path / "m")], str(bad), line, f"op.{field}", words)


@pytest.mark.parametrize("field, value, words", [
    ("tp", 0, "not from 1"),
    ("hidden", "128", "a JSON string"),
    ("heads", 0, "not from 1"),
    ("kv_heads", 3, "must divide num_attention_heads"),     # ModelSpec's rule, named by the row's field
    ("tp", 5, "does not divide its heads"),
], ids=["tp-zero", "text", "no-heads", "groups", "tp-not-dividing"])
def test_an_edited_layer_shape_is_named(tmp_path, capsys, field, value, words):
    bad = tmp_path / "layers-h200.jsonl"
    line = _corrupt(LAYERS, bad, "layer", "transformer", field, value)
    _refused(capsys, ["fit", OPS, str(bad), "-o", str(tmp_path / "m")], str(bad), line, f"layer.{field}", words)
