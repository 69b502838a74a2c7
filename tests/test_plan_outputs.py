"""`hetauto plan`'s outputs checked against one another before any is written: -o (the plan), --emit (a folder of
launch material, whose file names come from the plan) and --timeline. A clash is one paragraph naming both
options, exit 2, and leaves the disk as it was (it wrote the plan, then refused the folder or the script)."""
import os

from helpers import run_cli

TINY2 = os.path.join(os.path.dirname(__file__), "..", "examples", "llama", "inventory-cpu-tiny-2clusters.yaml")
BASE = ["plan", "--model", "tiny", "--inventory", TINY2, "--quiet", "--workers", "1"]


def refused(capsys, *argv) -> str:
    rc, out, err = run_cli(BASE + list(argv), capsys)
    assert rc == 2 and "Traceback" not in err, err
    assert len([x for x in err.splitlines() if x.strip()]) == 1, err
    assert "field '--emit'" in err and "Fix: " in err, err
    return err


def test_plan_file_and_emit_folder_of_the_same_name(tmp_path, capsys):
    """-o out --emit out, and --emit out/launch under the plan file: refused naming both, nothing written."""
    out = str(tmp_path / "out")
    for emit in (out, os.path.join(out, "launch")):
        err = refused(capsys, "-o", out, "--emit", emit)
        assert "-o" in err and repr(out) in err
        assert os.listdir(tmp_path) == []
    trace = str(tmp_path / "t.json")           # a --timeline file is written before the folder too
    err = refused(capsys, "--timeline", trace, "-o", str(tmp_path / "p.yaml"), "--emit", trace)
    assert "--timeline" in err and os.listdir(tmp_path) == []


def test_plan_file_named_as_an_emitted_script(tmp_path, capsys):
    """--emit D -o D/<a cluster's launch script> (D existing): the plan was written, then the script refused to
    overwrite it; now refused before either. The script's name is read from an emit of the same plan elsewhere."""
    first = tmp_path / "first"
    # (--shapes simple: a plan of one pipeline of single meshes, which DeepSpeed's configs are emitted for)
    rc, _, err = run_cli(BASE + ["--shapes", "simple", "-o", str(tmp_path / "p.yaml"), "--emit", str(first)], capsys)
    assert rc == 0, err
    script = sorted(n for n in os.listdir(first) if n.endswith(".sh"))[0]
    launch = tmp_path / "launch"
    launch.mkdir()
    err = refused(capsys, "--shapes", "simple", "--emit", str(launch), "-o", str(launch / script))
    assert "-o" in err and script in err and "overwrite" in err
    assert os.listdir(launch) == []
    # a --timeline named as an emitted file: refused too, before the plan file is written
    config = sorted(n for n in os.listdir(first) if n.startswith("ds_config."))[0]
    err = refused(capsys, "--shapes", "simple", "--emit", str(launch), "-o", str(tmp_path / "q.yaml"), "--timeline",
                  str(launch / config))
    assert "--timeline" in err and config in err
    assert os.listdir(launch) == [] and not (tmp_path / "q.yaml").exists()


def test_plan_file_named_json_in_capitals_reads_back(tmp_path, capsys):
    """-o P.JSON: written as YAML (the writer took only a lower-case .json for JSON) while every reader took the
    name for JSON, so no command could read the plan back; now one rule decides both."""
    import json
    plan = str(tmp_path / "P.JSON")
    rc, _, err = run_cli(BASE + ["--global-batch-size", "4", "-o", plan], capsys)
    assert rc == 0, err
    with open(plan) as fh:
        assert json.load(fh)["version"]
    rc, out, err = run_cli(["simulate", "--plan", plan], capsys)
    assert rc == 0 and "iteration" in out, err
    # a model's config.json named in capitals is read as JSON too (the model reader took only '.json': "it looks
    # like a model file (what --model reads), not the file this option reads")
    import os
    from helpers import ROOT
    hf = tmp_path / "HF.JSON"
    hf.write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64,
                              "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 100,
                              "max_position_embeddings": 128}))
    rc, out, err = run_cli(["simulate", "--model", str(hf), "--cluster", "h800", "--tp", "1", "--pp", "1", "--dp",
                            "1", "--micro-batch-size", "1", "--global-batch-size", "8", "--inventory",
                            os.path.join(ROOT, "examples", "llama", "inventory-2clusters.yaml")], capsys)
    assert rc == 0 and "(2 layers)" in out, err
