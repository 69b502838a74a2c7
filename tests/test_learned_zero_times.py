"""A time of 0 in a file of measurements (a `hetauto profile` file of operators or whole layers, Sailor's
profiles_tmp.json) is a timer that read nothing: the reading is left out, and one line on stderr per file counts
them and names the first (they were left out without a word). A negative or non-finite time is no time at all:
refused, exit 2, naming the file, the row and the field (a profile's already were; Sailor's were left out without
a word too). The expected counts and rows are the ones each test writes into its copy of the packaged data."""
from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil

import pytest

from helpers import run_cli

from hetauto_megatron.cost import learned as L

H200 = L.H200_DATA


def _zeroed(src: str, dst, edits: dict[int, str]) -> tuple[str, list[str]]:
    """A copy of the profile `src` with the field edits[line] of those lines set to 0; (path, their row keys)."""
    lines = open(src).read().splitlines()
    keys = []
    for no, field in edits.items():
        row = json.loads(lines[no])
        row[field] = 0.0
        lines[no] = json.dumps(row)
        keys.append(row["key"])
    dst.write_text("\n".join(lines) + "\n")
    return str(dst), keys


def _warnings(err: str) -> list[str]:
    return [line for line in err.splitlines() if "warning" in line]


def test_zero_times_in_profiles_are_left_out_and_counted(tmp_path, capsys):
    ops, op_keys = _zeroed(os.path.join(H200, "profile-h200.jsonl"), tmp_path / "ops.jsonl",
                           {3: "fwd_p10_s", 7: "bwd_p10_s"})
    layers, layer_keys = _zeroed(os.path.join(H200, "layers-h200.jsonl"), tmp_path / "layers.jsonl", {2: "bwd_p10_s"})
    rc, whole, err = run_cli(["fit", os.path.join(H200, "profile-h200.jsonl"), os.path.join(H200, "layers-h200.jsonl"),
                              "-o", str(tmp_path / "whole"), "--holdout", "0"], capsys)
    assert rc == 0 and not _warnings(err), err
    rc, out, err = run_cli(["fit", ops, layers, "-o", str(tmp_path / "m"), "--holdout", "0"], capsys)
    assert rc == 0, err
    rows = [int(re.search(r"fitted (\d+) rows", text).group(1)) for text in (whole, out)]
    assert rows[1] == rows[0] - 2, rows
    assert _warnings(err) == [
        f"hetauto: warning: {ops}: left out 2 readings whose time is 0, a broken measurement (first: row "
        f"{op_keys[0]} fwd_p10_s); to measure again: delete those rows, and 'hetauto profile' resumes into the file",
        f"hetauto: warning: {layers}: left out 1 reading whose time is 0, a broken measurement (first: row "
        f"{layer_keys[0]} bwd_p10_s); to measure again: delete those rows, and 'hetauto profile' resumes into the "
        "file"], err
    # the layer validation divided by the measured 0 (a ZeroDivisionError traceback)
    rc, out, err = run_cli(["validate-cost-model", "--cost-model", str(tmp_path / "m"), "--profile", layers,
                            "--json"], capsys)
    assert rc == 0 and len(_warnings(err)) == 1, err
    assert len(json.loads(out)["layers"]["rows"]) == 2 * (len(open(layers).read().splitlines()) - 2)


def _sailor_copy(tmp_path, value):
    d = tmp_path / "sailor"
    shutil.copytree(L.SAILOR_DATA, d)
    data = json.loads((d / "profiles_tmp.json").read_text())
    data["OPT-350"]["RTX-3090"]["16"]["4"]["5"][1] = value
    data["OPT-350"]["RTX-3090"]["16"]["4"]["7"][0] = value
    (d / "profiles_tmp.json").write_text(json.dumps(data))
    return str(d)


def test_zero_times_in_sailor_data_are_left_out_and_counted(tmp_path, capsys):
    d = _sailor_copy(tmp_path, 0.0)
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        layers = L.load_sailor(d)
    assert _warnings(err.getvalue()) == [
        f"hetauto: warning: {d}/profiles_tmp.json: left out 2 readings whose time is 0, a broken measurement "
        "(first: OPT-350 RTX-3090 micro-batch 16 TP 4 entry 5 backward_s); the fit and the validation use the other "
        "readings"]
    rows = L.sailor_layer_samples([r for r in layers if r.model == "OPT-350" and r.gpu == "RTX-3090"])
    packaged = L.sailor_layer_samples([r for r in L.load_sailor(L.SAILOR_DATA)
                                       if r.model == "OPT-350" and r.gpu == "RTX-3090"])
    assert len(rows) == len(packaged) - 2
    # a fit reads the file twice (the layers, the optimizer steps): one warning
    rc, _, err = run_cli(["fit", "-o", str(tmp_path / "m"), "--holdout", "0", f"--sailor={d}"], capsys)
    assert rc == 0 and len(_warnings(err)) == 1 and "left out 2 readings" in err, err


def test_negative_or_nan_times_in_sailor_data_are_refused(tmp_path, capsys):
    for value in (-0.001, float("nan")):
        shutil.rmtree(tmp_path / "sailor", ignore_errors=True)
        d = _sailor_copy(tmp_path, value)
        rc, _, err = run_cli(["fit", "-o", str(tmp_path / "m"), "--holdout", "0", f"--sailor={d}"], capsys)
        assert rc == 2 and "Traceback" not in err, err
        assert f"{d}/profiles_tmp.json" in err and "field 'backward_s'" in err and "Fix: " in err, err
        assert "OPT-350 RTX-3090 micro-batch 16 TP 4 entry 5" in err and str(value) in err, err


def _with_time(name: str, dst, index: int | None, field: str, value: str) -> str:
    """A copy of the packaged H200 file `name` whose `field` reads `value` (JSON text) on line index + 1 of the file
    (index 0: the header), or on every row where index is None (as `sed` edits every line)."""
    lines = open(os.path.join(H200, name)).read().splitlines()
    for i in range(1, len(lines)) if index is None else (index,):
        lines[i], n = re.subn(rf'"{field}": [0-9.e+-]+', f'"{field}": {value}', lines[i])
        assert n == 1, (name, i, field)
    dst.write_text("\n".join(lines) + "\n")
    return str(dst)


@pytest.mark.parametrize("name, index, field, value, words", [
    # every row's forward time 1e300 s (fitted, it predicted iterations of 2.48e+303 s): the first row is refused
    ("profile-h200.jsonl", None, "fwd_p10_s", "1e300", ["1e+300", "more than an hour"]),
    ("profile-h200.jsonl", 3, "fwd_p10_s", "3601.5", ["3601.5", "more than an hour"]),
    ("profile-h200.jsonl", 5, "bwd_p10_s", '"0.001"', ["'0.001'", "JSON string", "no quotes"]),
    ("profile-h200.jsonl", 5, "bwd_p10_s", "true", ["True", "JSON boolean"]),
    ("layers-h200.jsonl", 2, "fwd_p10_s", '"0.0015"', ["'0.0015'", "JSON string"]),
    ("layers-h200.jsonl", 4, "bwd_p10_s", "7200", ["7200", "more than an hour"]),
])
def test_a_time_that_is_no_number_or_above_an_hour_is_refused(name, index, field, value, words, tmp_path, capsys):
    """A measured pass above an hour, or a time written as JSON text or true, was fitted (float() read "0.001");
    refused now as the times under a nanosecond are: exit 2 naming the file, the line and the field, no model
    written."""
    files = {n: os.path.join(H200, n) for n in ("profile-h200.jsonl", "layers-h200.jsonl")}
    files[name] = bad = _with_time(name, tmp_path / name, index, field, value)
    rc, _, err = run_cli(["fit", *files.values(), "-o", str(tmp_path / "m"), "--holdout", "0"], capsys)
    assert rc == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    line = 2 if index is None else index + 1      # the file's line of the first row edited (the header is line 1)
    assert f"{bad}: field '{field}': line {line} " in err and "Fix: " in err, err
    assert all(w in err for w in words), err
    assert not (tmp_path / "m").exists()
