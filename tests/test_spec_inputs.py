"""Every class of input mistake, through the real `hetauto plan` / `hetauto simulate` command line.

Each case writes a small bad file, runs the CLI and checks the contract: exit code 2 (invalid input) or 3 (no
feasible plan), one message on stderr that names the file and the field, says why and how to fix it, and
never a Python traceback. Most cases call `cli.main` in-process (fast); a few run the installed entry point as
a real subprocess to prove the same holds for the process a user starts.
"""
from __future__ import annotations

import json
import os
import textwrap

import pytest
from helpers import CPU_INVENTORY, ROOT, run_cli, run_hetauto


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
INV_2 = os.path.join(REPO, "examples", "llama", "inventory-2clusters.yaml")

TWO_CLUSTERS = """\
clusters:
  - {name: a, device: h800, nodes: 1, devices_per_node: 8}
  - {name: b, device: a100, nodes: 1, devices_per_node: 8}
"""
MESH_A = "{cluster: cluster-a, device_type: cpu, tp: 2, dp: 1, micro_batch_size: 2, recompute: none, stage_layers: [3, 2]}"
MESH_B = "{cluster: cluster-b, device_type: cpu, tp: 1, dp: 2, micro_batch_size: 1, recompute: none, stage_layers: [3]}"


def plan_text(mesh_a=MESH_A, mesh_b=MESH_B, version=1, model="{preset: tiny}", gbs=8):
    return f"version: {version}\nmodel: {model}\nglobal_batch_size: {gbs}\nmeshes:\n- {mesh_a}\n- {mesh_b}\n"


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


def check_error(rc, err, *, code=2, file=None, field=None, words=(), fix=True):
    assert rc == code, err
    assert "Traceback" not in err
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1, f"expected one paragraph, got: {err!r}"
    if file:
        assert file in err, err
    if field:
        assert f"field '{field}'" in err, err
    for w in words:
        assert w in err, err
    if fix:
        assert "Fix: " in err, err


def plan_inventory(inv, capsys, model="tiny"):
    return run_cli(["plan", "--model", model, "--inventory", inv, "--quiet"], capsys)


# ---- inventory files ----------------------------------------------------------------------------------------
INVENTORY_CASES = {
    # name: (file text, field, words in the message)
    "yaml-syntax": ("clusters:\n  - name: a\n    device: h800\n   nodes: 2\n", None, ["not valid YAML", "line 4"]),
    "missing-field": ("clusters:\n  - {name: a, device: h800, devices_per_node: 8}\n", "clusters[0].nodes",
                      ["is missing", "add 'nodes:'"]),
    "wrong-type": ("clusters:\n  - {name: a, device: h800, nodes: two, devices_per_node: 8}\n", "clusters[0].nodes",
                   ["must be an integer", "'two'"]),
    "bool-as-number": ("clusters:\n  - {name: a, device: h800, nodes: true, devices_per_node: 8}\n",
                       "clusters[0].nodes", ["must be an integer"]),
    "unknown-key": ("clusters:\n  - {name: a, device: h800, nodes: 1, devices_per_node: 8, memory_gb: 80}\n",
                    "clusters[0]", ["unknown key(s) memory_gb", "'memory_gib'"]),
    "unknown-top-key": (TWO_CLUSTERS + "link: []\n", None, ["unknown key(s) link", "'links'"]),
    # overheads above the device's memory (MiB typed as GiB): no plan could fit; was exit 3 blaming the memory
    "overheads-fill-the-device": ("clusters:\n  - {name: a, device: h100, nodes: 1, devices_per_node: 8, "
                                  "overheads: {context_gib: 100}}\n", "clusters[0].overheads",
                                  ["leave no memory for the model", "on a 80 GiB device", "in GiB per device"]),
    # a list or mapping there (a mis-indented block) was accepted
    "description-list": (TWO_CLUSTERS + "description: [a, b]\n", "description", ["must be a string"]),
    "name-mapping": (TWO_CLUSTERS + "name: {x: 1}\n", "name", ["must be a string", "a mapping"]),
    "cluster-name-list": ("clusters:\n  - {name: [a], device: h800, nodes: 1, devices_per_node: 8}\n",
                          "clusters[0].name", ["must be a string", "a list"]),
    "unknown-device": ("clusters:\n  - {name: a, device: b300, nodes: 1, devices_per_node: 8}\n", "clusters[0].device",
                       ["unknown device type 'b300'", "h800", "ascend-910b", "mi300x", "cpu"]),
    "link-unknown-cluster": (TWO_CLUSTERS + "links:\n  - {between: [a, c], bandwidth_gbps: 10, latency_ms: 1}\n",
                             "links[0].between", ["'c'", "a, b"]),
    "link-to-itself": (TWO_CLUSTERS + "links:\n  - {between: [a, a], bandwidth_gbps: 10, latency_ms: 1}\n",
                       "links[0].between", ["two different clusters"]),
    "link-one-end": (TWO_CLUSTERS + "links:\n  - {between: [a], bandwidth_gbps: 10, latency_ms: 1}\n",
                     "links[0].between", ["two different clusters"]),
    "link-duplicate": (TWO_CLUSTERS + "links:\n  - {between: [a, b], bandwidth_gbps: 10, latency_ms: 1}\n"
                       "  - {between: [b, a], bandwidth_gbps: 20, latency_ms: 1}\n", "links[1].between", ["twice"]),
    "link-zero-bandwidth": (TWO_CLUSTERS + "links:\n  - {between: [a, b], bandwidth_gbps: 0, latency_ms: 1}\n",
                            "links[0].bandwidth_gbps", ["must be positive"]),
    "link-negative-bandwidth": (TWO_CLUSTERS + "links:\n  - {between: [a, b], bandwidth_gbps: -5}\n",
                                "links[0].bandwidth_gbps", ["must be positive"]),
    "link-negative-latency": (TWO_CLUSTERS + "links:\n  - {between: [a, b], bandwidth_gbps: 10, latency_ms: -1}\n",
                              "links[0].latency_ms", ["must not be negative"]),
    "intra-node-zero": ("clusters:\n  - {name: a, device: h800, nodes: 1, devices_per_node: 8,"
                        " intra_node: {bandwidth_gbps: 0}}\n", "clusters[0].intra_node.bandwidth_gbps",
                        ["must be positive"]),
    "memory-override-zero": ("clusters:\n  - {name: a, device: h800, nodes: 1, devices_per_node: 8, memory_gib: 0}\n",
                             "clusters[0].memory_gib", ["must be positive"]),
    "zero-nodes": ("clusters:\n  - {name: a, device: h800, nodes: 0, devices_per_node: 8}\n", "clusters[0].nodes",
                   ["at least 1"]),
    "duplicate-cluster": ("clusters:\n  - {name: a, device: h800, nodes: 1, devices_per_node: 8}\n"
                          "  - {name: a, device: a100, nodes: 1, devices_per_node: 8}\n", "clusters[1].name",
                          ["more than once"]),
    # with links, the links were checked first: "links[0].between names cluster 'b', which the inventory does not
    # define", though the fault is the second cluster's name
    "duplicate-cluster-with-links": ("clusters:\n  - {name: a, device: h800, nodes: 1, devices_per_node: 8}\n"
                                     "  - {name: a, device: a100, nodes: 1, devices_per_node: 8}\n"
                                     "links:\n  - {between: [a, b], bandwidth_gbps: 10, latency_ms: 1}\n",
                                     "clusters[1].name", ["'a' appears more than once", "clusters[0]"]),
    "no-clusters": ("clusters: []\n", "clusters", ["no clusters"]),
    "clusters-not-a-list": ("clusters: {a: 1}\n", "clusters", ["must be a list"]),
    "bad-cluster-name": ("clusters:\n  - {name: 'site a/b', device: h800, nodes: 1, devices_per_node: 8}\n",
                         "clusters[0].name", ["not a usable cluster name"]),
    "empty-file": ("", None, ["is empty", "docs/inputs.md"]),
    "not-a-mapping": ("- just\n- a list\n", None, ["expected a mapping"]),
    # YAML keeps the last of two equal keys: the first block of clusters vanished without a word
    "key-twice": (TWO_CLUSTERS + "clusters:\n  - {name: c, device: h100, nodes: 1, devices_per_node: 8}\n",
                  "clusters", ["written twice", "line 4"]),
    "key-twice-in-cluster": ("clusters:\n  - name: a\n    device: h800\n    nodes: 1\n    nodes: 64\n"
                             "    devices_per_node: 8\n", "nodes", ["written twice", "line 5"]),
    # a cost of inf per token, printed as Infinity in --json (not JSON)
    "price-huge": (TWO_CLUSTERS.replace("devices_per_node: 8}", "devices_per_node: 8, price_per_device_hour: 1.0e+308}",
                                        1), "clusters[0].price_per_device_hour", ["between 0 and"]),
    # text where a number is due is named as such (an exponent without its sign is a number: below)
    "text-for-a-number": (TWO_CLUSTERS.replace("devices_per_node: 8}", "devices_per_node: 8, memory_gib: eighty}",
                                               1), "clusters[0].memory_gib", ["a string 'eighty'"]),
    # YAML 1.1 read 1:30 as the base-60 number 90: a 90-device node, planned
    "base-60-number": (TWO_CLUSTERS.replace("devices_per_node: 8}", "devices_per_node: 1:30}", 1),
                       "clusters[0].devices_per_node", ["'1:30'"]),
    # the parser recursed until Python gave up (RecursionError traceback, exit 1)
    "nested-500-deep": ("clusters: " + "[" * 500 + "]" * 500 + "\n", None, ["too deeply"]),
    # the integer conversion refused it (ValueError traceback, exit 1)
    "integer-5000-digits": (TWO_CLUSTERS.replace("nodes: 1,", "nodes: " + "9" * 5000 + ",", 1), None,
                            ["more than 4,300 digits"]),
}


@pytest.mark.parametrize("case", sorted(INVENTORY_CASES))
def test_inventory_errors(case, tmp_path, capsys):
    text, field, words = INVENTORY_CASES[case]
    inv = write(tmp_path, f"{case}.yaml", text)
    rc, out, err = plan_inventory(inv, capsys)
    check_error(rc, err, file=inv, field=field, words=words)
    assert out == ""


def test_inventory_file_missing(tmp_path, capsys):
    rc, _, err = plan_inventory(str(tmp_path / "nope.yaml"), capsys)
    check_error(rc, err, file="nope.yaml", words=["not found"])


def test_partial_link_block_keeps_defaults(tmp_path):
    from hetauto_megatron.spec.devices import CATALOG
    from hetauto_megatron.spec.inventory import load_inventory
    inv = load_inventory(write(tmp_path, "inv.yaml", "clusters:\n  - {name: a, device: H800, nodes: 2, "
                                                     "devices_per_node: 8, intra_node: {latency_us: 3}}\n"))
    c = inv.clusters[0]
    assert c.intra_node.bandwidth_gbps == CATALOG["h800"].intra_node_gbps and c.intra_node.latency_s == 3e-6
    assert c.inter_node.bandwidth_gbps == 200 and c.inter_node.latency_s == pytest.approx(10e-6)
    assert c.device.name == "h800" and c.num_devices == 16


# ---- model inputs -------------------------------------------------------------------------------------------
MODEL_CASES = {
    "yaml-syntax": ("m.yaml", "num_layers: [8\n", None, ["not valid YAML"]),
    "missing-field": ("m.yaml", "num_layers: 8\nhidden_size: 64\nnum_attention_heads: 4\nvocab_size: 128\n"
                      "seq_length: 32\n", "ffn_hidden_size", ["is missing"]),
    "wrong-type": ("m.yaml", "preset: tiny\nnum_layers: 8.5\n", "num_layers", ["must be an integer", "8.5"]),
    "bool-type": ("m.yaml", "preset: tiny\ngated_mlp: maybe\n", "gated_mlp", ["true or false"]),
    "unknown-key": ("m.yaml", "preset: tiny\nseq_lenght: 64\n", None, ["unknown key(s) seq_lenght", "'seq_length'"]),
    "unknown-preset": ("m.yaml", "preset: llama2-8b\n", "preset", ["unknown preset", "llama2-70b"]),
    "heads-not-dividing": ("m.yaml", "preset: tiny\nhidden_size: 66\n", "hidden_size", ["not divisible"]),
    "kv-not-dividing": ("m.yaml", "preset: tiny\nnum_query_groups: 3\n", "num_query_groups", ["must divide"]),
    # 0 silently became the head count (the position table: the sequence length), as if the key were left out
    "kv-zero": ("m.yaml", "preset: tiny\nnum_query_groups: 0\n", "num_query_groups", ["positive", "got 0"]),
    "kv-zero-no-preset": ("m.yaml", "num_layers: 8\nhidden_size: 64\nnum_attention_heads: 4\nvocab_size: 128\n"
                          "ffn_hidden_size: 256\nseq_length: 32\nnum_query_groups: 0\n", "num_query_groups",
                          ["positive"]),
    "positions-zero": ("m.yaml", "preset: tiny\nmax_position_embeddings: 0\n", "max_position_embeddings",
                       ["positive"]),
    "hf-kv-zero": ("config.json", '{"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, '
                   '"num_attention_heads": 4, "num_key_value_heads": 0, "intermediate_size": 128, "vocab_size": 128, '
                   '"max_position_embeddings": 32}', "num_key_value_heads", ["positive"]),
    "hf-heads-zero": ("config.json", '{"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, '
                      '"num_attention_heads": 0, "intermediate_size": 128, "vocab_size": 128, '
                      '"max_position_embeddings": 32}', "num_attention_heads", ["positive"]),
    "positions-short": ("m.yaml", "preset: tiny\nposition_embedding: learned\nmax_position_embeddings: 8\n",
                        "max_position_embeddings", ["fewer learned positions", "32 tokens"]),
    "bad-position": ("m.yaml", "preset: tiny\nposition_embedding: alibi\n", "position_embedding", ["'alibi'"]),
    "rotary-base-with-learned-positions": ("m.yaml", "preset: tiny\nposition_embedding: learned\nrotary_base: 500000\n",
                                           "rotary_base", ["learned positions", "leave rotary_base out"]),
    "rotary-base-one": ("m.yaml", "preset: tiny\nrotary_base: 1\n", "rotary_base", ["above 1", "rope_theta"]),
    "zero-layers": ("m.yaml", "preset: tiny\nnum_layers: 0\n", "num_layers", ["positive"]),
    "invalid-json": ("config.json", '{"model_type": "llama", "num_hidden_layers": 32,', None, ["not valid JSON", "line 1"]),
    "json-not-object": ("config.json", "[1, 2]", None, ["expected a mapping"]),
    "hf-model-type-list": ("config.json", '{"model_type": ["llama"], "num_hidden_layers": 2}', "model_type",
                           ["must be a string"]),
    "hf-head-dim-string": ("config.json", '{"model_type": "llama", "head_dim": "x", "num_hidden_layers": 2}',
                           "head_dim", ["must be an integer", "'x'"]),
    "json-key-twice": ("config.json", '{"model_type": "llama", "num_hidden_layers": 2, "num_hidden_layers": 3}',
                       None, ["'num_hidden_layers' is written twice"]),
    "json-nested-deep": ("config.json", '{"a": ' * 100000 + "1" + "}" * 100000, None, ["too deeply"]),
    "hf-missing-key": ("config.json", '{"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, '
                       '"num_attention_heads": 4, "vocab_size": 128, "max_position_embeddings": 32}',
                       "intermediate_size", ["none of intermediate_size"]),
    "hf-wrong-type": ("config.json", '{"model_type": "llama", "num_hidden_layers": "two", "hidden_size": 64}',
                      "num_hidden_layers", ["must be an integer", "'two'"]),
    "hf-moe": ("config.json", '{"model_type": "mixtral", "num_hidden_layers": 2, "hidden_size": 64, '
               '"num_attention_heads": 4, "intermediate_size": 128, "num_local_experts": 8, "vocab_size": 128, '
               '"max_position_embeddings": 32}', "num_local_experts", ["mixture-of-experts"]),
    "hf-encoder-decoder": ("config.json", '{"model_type": "t5", "is_encoder_decoder": true, "d_model": 512}',
                           "is_encoder_decoder", ["encoder-decoder"]),
    # the config's own key is named, not ModelSpec's (GPT-2 calls the width n_embd), also in the fix
    "hf-gpt2-width-zero": ("config.json", '{"model_type": "gpt2", "n_layer": 2, "n_embd": 0, "n_head": 4, '
                           '"vocab_size": 128, "n_positions": 32}', "n_embd", ["positive", "set n_embd"]),
    "hf-gpt2-layers-huge": ("config.json", '{"model_type": "gpt2", "n_layer": 10000000, "n_embd": 64, "n_head": 4, '
                            '"vocab_size": 128, "n_positions": 32}', "n_layer", ["more than any transformer"]),
    "hf-rope-theta-fraction": ("config.json", '{"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, '
                               '"num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 128, '
                               '"max_position_embeddings": 32, "rope_theta": 1.25}', "rope_theta",
                               ["above 1", "--rotary-base", "1.25"]),
    "hf-head-dim": ("config.json", '{"model_type": "gemma", "num_hidden_layers": 2, "hidden_size": 3072, '
                    '"num_attention_heads": 16, "head_dim": 256, "intermediate_size": 128, "vocab_size": 128, '
                    '"max_position_embeddings": 32}', "head_dim", ["head_dim 256"]),
}


@pytest.mark.parametrize("case", sorted(MODEL_CASES))
def test_model_errors(case, tmp_path, capsys):
    name, text, field, words = MODEL_CASES[case]
    path = write(tmp_path, name, text)
    rc, out, err = run_cli(["plan", "--model", path, "--inventory", INV_2, "--quiet"], capsys)
    check_error(rc, err, file=path, field=field, words=words)
    assert out == ""


def test_model_unknown_preset_name(capsys):
    rc, _, err = run_cli(["plan", "--model", "llama9-1t", "--inventory", INV_2], capsys)
    check_error(rc, err, field="--model", words=["neither a preset nor an existing file", "llama2-70b", "gpt3-175b"])


def test_model_file_missing(tmp_path, capsys):
    path = str(tmp_path / "config.json")
    rc, _, err = run_cli(["plan", "--model", path, "--inventory", INV_2], capsys)
    check_error(rc, err, file=path, field="--model", words=["not found"])


def test_model_directory(tmp_path, capsys):
    rc, _, err = run_cli(["plan", "--model", str(tmp_path), "--inventory", INV_2], capsys)
    check_error(rc, err, file=str(tmp_path), field="--model", words=["without a config.json"])
    # A checkpoint directory stands for its config.json.
    (tmp_path / "config.json").write_text(open(os.path.join(REPO, "tests", "data", "hf", "gpt2.json")).read())
    from hetauto_megatron.spec.model import load_model
    assert load_model(str(tmp_path)).num_layers == 12


def test_bad_seq_length(capsys):
    rc, _, err = run_cli(["plan", "--model", "tiny", "--inventory", INV_2, "--seq-length", "0"], capsys)
    check_error(rc, err, field="--seq-length", words=["at least 1"], fix=False)
    # the model's own check of a length no transformer has names the flag that gave it, not the model's key
    rc, _, err = run_cli(["plan", "--model", "tiny", "--inventory", INV_2, "--seq-length", "100000000"], capsys)
    check_error(rc, err, field="--seq-length", words=["100000000", "more than any transformer"], fix=False)


# ---- plan files ---------------------------------------------------------------------------------------------
PLAN_CASES = {
    # name: (plan text, field, words, whether the message names the plan file)
    "layers-not-summing": (plan_text(mesh_b=MESH_B.replace("[3]", "[4]")), "meshes[*].stage_layers",
                           ["add up to 9", "has 8", "sum to 8"], True),
    "dp-mbs-mismatch": (plan_text(mesh_b=MESH_B.replace("micro_batch_size: 1", "micro_batch_size: 2")), "meshes",
                        ["dp * micro_batch_size", "cluster-a: 1x2", "cluster-b: 2x2", "meshes[0].micro_batch_size: 4"],
                        True),
    "tp-not-dividing-heads": (plan_text(mesh_a=MESH_A.replace("tp: 2", "tp: 3")), "meshes[0].tp",
                              ["tp=3", "4 attention heads", "2 key/value heads", "1, 2"], True),
    # Megatron shards the MLP width evenly over TP ranks, and sequence parallelism (on with TP > 1) the sequence
    "tp-not-dividing-ffn": (plan_text(model="{preset: tiny, ffn_hidden_size: 255}"), "meshes[0].tp",
                            ["tp=2", "ffn_hidden_size 255", "divides it: 1"], True),
    "sp-not-dividing-sequence": (plan_text(model="{preset: tiny, seq_length: 31}"),
                                 "meshes[0].settings.sequence_parallel", ["31-token sequence", "tp=2",
                                                                          "sequence_parallel: false"], True),
    "bad-version": (plan_text(version=7), "version", ["version 7 is not supported", "a newer hetauto"], True),
    # a newer file's new key or value is no mistake in it: the version is named, not "remove them"
    "newer-version-new-key": (plan_text(version=5, mesh_a=MESH_A.replace("tp: 2", "tp: 2, experts: 8")), "version",
                              ["version 5 is not supported", "a newer hetauto"], True),
    "newer-version-new-value": (plan_text(version=5, mesh_a=MESH_A.replace("recompute: none", "recompute: offload")),
                                "version", ["version 5 is not supported"], True),
    # keys no file of that version had: an overlapped boundary (version 2) priced in a version-1 file
    "v1-boundary": (plan_text(mesh_a=MESH_A.replace("}", ", boundary: {schedule: overlapped, depth: 1}}")), "version",
                    ["is 1, but the plan uses version-2 keys (meshes[*].boundary)"], True),
    "v2-engine": (plan_text(version=2) + "engine: deepspeed\n", "version",
                  ["is 2, but the plan uses version-3 keys (engine)"], True),
    "empty-plan": ("", None, ["is empty", "docs/plan-format.md"], True),
    "depth-huge": (plan_text(version=2, mesh_a=MESH_A.replace("}", ", boundary: {schedule: overlapped, depth: 1000000000}}")),
                   "meshes[0].boundary.depth", ["more extra micro-batches in flight than the global batch has"], True),
    "key-twice": (plan_text().replace("global_batch_size: 8\n", "global_batch_size: 8\nglobal_batch_size: 16\n"),
                  "global_batch_size", ["written twice"], True),
    "version-missing": (plan_text().replace("version: 1\n", ""), "version", ["is missing", "version: 4"], True),
    "middle-stage-empty": (plan_text(mesh_a=MESH_A.replace("[3, 2]", "[5, 0]")), "meshes[0].stage_layers[1]",
                           ["stage 1 holds no layers"], True),
    "fractional-layers": (plan_text(mesh_a=MESH_A.replace("[3, 2]", "[2.5, 2.5]")), "meshes[0].stage_layers[0]",
                          ["whole number", "2.5"], True),
    "bad-recompute": (plan_text(mesh_a=MESH_A.replace("recompute: none", "recompute: some")), "meshes[0].recompute",
                      ["'some'", "selective"], True),
    "unknown-device-type": (plan_text(mesh_a=MESH_A.replace("device_type: cpu", "device_type: tpu")),
                            "meshes[0].device_type", ["unknown device type 'tpu'", "h800"], True),
    "unknown-mesh-key": (plan_text(mesh_a=MESH_A.replace("tp: 2", "tp: 2, pp: 2")), "meshes[0]",
                         ["unknown key(s) pp"], True),
    "gbs-not-multiple": (plan_text(gbs=7), "global_batch_size", ["multiple of", "= 2"], True),
    "model-bad-key": (plan_text(model="{preset: tiny, layers: 8}"), "model", ["unknown key(s) layers"], True),
    "model-missing": (plan_text().replace("model: {preset: tiny}\n", ""), "model", ["is missing"], True),
    # Checked against the inventory when the plan is simulated.
    "device-type-not-in-inventory": (plan_text(mesh_a=MESH_A.replace("device_type: cpu", "device_type: h800")),
                                     "meshes[0].device_type", ["says device_type h800", "cpu"], False),
    "more-devices-than-cluster": (plan_text(mesh_a=MESH_A.replace("[3, 2]", "[2, 2, 1]")), "meshes",
                                  ["uses 6 devices of cluster cluster-a, which has 4"], False),
}


@pytest.mark.parametrize("case", sorted(PLAN_CASES))
def test_plan_file_errors(case, tmp_path, capsys):
    text, field, words, names_plan = PLAN_CASES[case]
    inv = write(tmp_path, "inv.yaml", CPU_INVENTORY)
    plan = write(tmp_path, "plan.yaml", text)
    rc, out, err = run_cli(["simulate", "--model", "tiny", "--inventory", inv, "--plan", plan, "--json"], capsys)
    check_error(rc, err, file=plan if names_plan else None, field=field, words=words)
    # under --json stdout holds the same failure as one object, nothing else
    assert json.loads(out)["error"]["message"] in err and json.loads(out)["error"]["field"] == field


def test_a_null_in_a_json_plan_is_not_explained_as_yaml(tmp_path, capsys):
    """`"version": null` in a JSON file was told that "YAML reads an empty value, null and ~ as nothing"."""
    import yaml
    inv = write(tmp_path, "inv.yaml", CPU_INVENTORY)
    data = yaml.safe_load(plan_text())
    for name, text in (("plan.json", json.dumps(dict(data, version=None))),
                       ("plan.yaml", plan_text().replace("version: 1", "version: null"))):
        plan = write(tmp_path, name, text)
        rc, _, err = run_cli(["simulate", "--model", "tiny", "--inventory", inv, "--plan", plan], capsys)
        check_error(rc, err, file=plan, field="version", words=["is missing"])
        assert ("YAML reads" in err) is name.endswith(".yaml") and ("it is null" in err) is name.endswith(".json"), err


def test_a_key_twice_in_a_json_plan_names_its_line(tmp_path, capsys):
    """A JSON plan with a key written twice was refused without the line (a YAML plan's says it): now the key and
    the line of its second writing. Here `tp` twice in the second mesh, below the first mesh's own `tp`."""
    import yaml
    inv = write(tmp_path, "inv.yaml", CPU_INVENTORY)
    lines = json.dumps(yaml.safe_load(plan_text()), indent=2).splitlines()
    second_mesh = lines.index('      "cluster": "cluster-b",')
    first_tp = lines.index('      "tp": 1,', second_mesh)
    lines.insert(first_tp + 1, '      "tp": 2,')
    assert lines.count('      "tp": 2,') == 2      # the first mesh's tp 2, then the one written twice
    plan = write(tmp_path, "plan.json", "\n".join(lines) + "\n")
    rc, out, err = run_cli(["simulate", "--model", "tiny", "--inventory", inv, "--plan", plan, "--json"], capsys)
    check_error(rc, err, file=plan, field="tp", words=["'tp' is written twice", f"(line {first_tp + 2})"])
    assert json.loads(out)["error"]["field"] == "tp"


def test_a_key_twice_in_a_json_model_is_told_its_own_fix_and_read_once(tmp_path, capsys):
    """A model file's key written twice got the model reader's fix ("pass the model's config.json"), not the one for
    a key written twice; and the file was opened a second time to find the line, which waits for ever on a pipe
    (a named FIFO fed once, as `--model <(...)` gives)."""
    import threading
    text = '{"preset": "tiny",\n "seq_length": 32,\n "seq_length": 64}\n'
    model = write(tmp_path, "model.json", text)
    inv = write(tmp_path, "inv.yaml", CPU_INVENTORY)
    rc, _, err = run_cli(["plan", "--model", model, "--inventory", inv, "--global-batch-size", "8"], capsys)
    check_error(rc, err, file=model, words=["'seq_length' is written twice", "(line 3)",
                                            "Fix: delete or rename one of the two"])
    fifo = str(tmp_path / "fifo.json")
    os.mkfifo(fifo)

    def feed():
        with open(fifo, "w") as fh:
            fh.write(text)
    threading.Thread(target=feed, daemon=True).start()
    done = []
    reader = threading.Thread(target=lambda: done.append(run_cli(["plan", "--model", fifo, "--inventory", inv,
                                                                  "--global-batch-size", "8"], capsys)), daemon=True)
    reader.start()
    reader.join(20)
    assert done, "reading a JSON file from a pipe waited for a second writer"
    check_error(done[0][0], done[0][2], file=fifo, words=["'seq_length' is written twice", "(line 3)"])


def test_a_version_1_plan_on_a_device_without_bf16_is_told_how_to_write_its_precision(tmp_path, capsys):
    """A version-1 file (bf16) on V100s was told "choose a precision it has: fp16, fp32"; writing `precision:`
    then was refused as a version-2 key. The fix now says both, and following it emits the plan."""
    text = ("version: 1\nmodel: {preset: llama2-7b}\nglobal_batch_size: 64\nmeshes:\n- {cluster: v100, device_type: "
            "v100-32gb, tp: 8, dp: 1, micro_batch_size: 1, recompute: full, stage_layers: [16, 16]}\n")
    plan = write(tmp_path, "v1.yaml", text)
    rc, _, err = run_cli(["emit", "summary", "--plan", plan, "-o", str(tmp_path / "out")], capsys)
    check_error(rc, err, file=plan, field="precision", words=["cannot train in bf16", "precision: fp16 or fp32",
                                                               "version: 2"])
    fixed = write(tmp_path, "v2.yaml", text.replace("version: 1", "version: 2\nprecision: fp16"))
    assert run_cli(["emit", "summary", "--plan", fixed, "-o", str(tmp_path / "out")], capsys)[0] == 0


def test_no_layer_fits_names_where_the_memory_figure_came_from(tmp_path, capsys):
    """Exit 3 when not one layer fits: the fix named the inventory file's `clusters[0].memory_gib` also where
    --set gave the figure (the file has no memory_gib there); it names the --set item now, and the file's field
    where the file gave it."""
    inv = os.path.join(ROOT, "examples", "llama", "inventory-2clusters.yaml")
    sets = ["--set", "cluster.h800.memory_gib=1", "--set", "cluster.ascend.memory_gib=1"]
    rc, _, err = run_cli(["plan", "--model", "llama2-7b", "--inventory", inv, *sets], capsys)
    check_error(rc, err, code=3, words=["not one transformer layer fits", "(--set cluster.h800.memory_gib=1)"])
    assert "field 'clusters[0].memory_gib'" not in err, err
    import yaml
    raw = yaml.safe_load(open(inv))
    for c in raw["clusters"]:
        c["memory_gib"] = 1
    small = write(tmp_path, "small.yaml", yaml.safe_dump(raw))
    rc, _, err = run_cli(["plan", "--model", "llama2-7b", "--inventory", small], capsys)
    check_error(rc, err, code=3, words=[f"({small}, field 'clusters[0].memory_gib')"])


def test_plan_file_valid_baseline(tmp_path, capsys):
    """The files the error cases corrupt are valid as written: each failure above is the corruption's."""
    inv = write(tmp_path, "inv.yaml", CPU_INVENTORY)
    plan = write(tmp_path, "plan.yaml", plan_text())
    rc, out, err = run_cli(["simulate", "--model", "tiny", "--inventory", inv, "--plan", plan, "--json"], capsys)
    assert rc == 0, err


def test_plan_cluster_not_in_inventory(tmp_path, capsys):
    inv = write(tmp_path, "inv.yaml", CPU_INVENTORY)
    plan = write(tmp_path, "plan.yaml", plan_text(mesh_a=MESH_A.replace("cluster-a", "cluster-z")))
    rc, _, err = run_cli(["simulate", "--model", "tiny", "--inventory", inv, "--plan", plan], capsys)
    check_error(rc, err, words=["'cluster-z'", "cluster-a, cluster-b"])


def test_plan_file_missing(tmp_path, capsys):
    inv = write(tmp_path, "inv.yaml", CPU_INVENTORY)
    rc, _, err = run_cli(["simulate", "--model", "tiny", "--inventory", inv, "--plan", str(tmp_path / "p.yaml")], capsys)
    check_error(rc, err, file="p.yaml", words=["plan file not found"])


# ---- no feasible plan ---------------------------------------------------------------------------------------
def test_infeasible_exit_3(tmp_path, capsys):
    inv = write(tmp_path, "inv.yaml", "clusters:\n  - {name: small, device: a10, nodes: 1, devices_per_node: 8}\n")
    rc, out, err = plan_inventory(inv, capsys, model="llama2-70b")
    check_error(rc, err, code=3, words=["no feasible plan", "misses by", "GiB", "a10"], fix=False)
    assert out == ""


def test_infeasible_names_what_binds_the_batch_or_the_device_budget(tmp_path, capsys):
    """A global batch of 1 allows one pipeline stage (no more stages than micro-batches): exit 3 said 'add devices',
    and under --max-devices it counted the whole inventory. Now the batch is named with its fix, and the devices
    counted are those the search may use. 70B on 32 H800: it fits in 4 stages (simulate prices that layout)."""
    inv = write(tmp_path, "inv.yaml", "clusters:\n  - {name: h800, device: h800, nodes: 4, devices_per_node: 8}\n")
    argv = ["plan", "--model", "llama2-70b", "--inventory", inv, "--quiet"]
    rc, _, err = run_cli(argv + ["--global-batch-size", "1"], capsys)
    check_error(rc, err, code=3, words=["at most 1 stage deep", "global batch is 1", "--global-batch-size"])
    rc, out, err = run_cli(["simulate", "--model", "llama2-70b", "--inventory", inv, "--cluster", "h800", "--tp", "8",
                            "--pp", "4", "--dp", "1", "--micro-batch-size", "1", "--global-batch-size", "4",
                            "--json"], capsys)
    assert rc == 0 and json.loads(out)["fits"] is True, err
    rc, _, err = run_cli(argv + ["--global-batch-size", "64", "--max-devices", "2"], capsys)
    check_error(rc, err, code=3, words=["the 2 devices --max-devices allows"], fix=False)



def test_infeasible_when_not_one_layer_fits(tmp_path, capsys):
    """Devices too small for a single transformer layer: the search's tree has no leaf at all. The message still
    says by how much the closest stage misses and which field to change, and its figure is the threshold: with
    a little more memory than it names, one layer fits (the closest whole layout is reported instead)."""
    import re
    text = "clusters:\n  - {name: small, device: cpu, nodes: 1, devices_per_node: 2, memory_gib: %s}\n"
    inv = write(tmp_path, "inv.yaml", text % 1)
    rc, out, err = plan_inventory(inv, capsys, model="llama2-7b")
    check_error(rc, err, code=3, file=inv, field="clusters[0].memory_gib",
                words=["no feasible plan", "not one transformer layer", "misses by", "cluster small"])
    assert out == ""
    need = float(re.search(r"needs ([0-9.]+) GiB", err).group(1))
    tp = int(re.search(r"one layer at TP (\d+)", err).group(1))
    # A LLaMA-2-7B layer holds 4 x 4096^2 + 3 x 4096 x 11008 parameters; split over TP and trained with Adam
    # unsharded (DP 1), each needs at least a 16-bit weight and gradient and two fp32 moments: 12 bytes.
    assert need >= (4 * 4096 ** 2 + 3 * 4096 * 11008) / tp * 12 / 2 ** 30
    write(tmp_path, "inv.yaml", text % round(need + 0.1, 1))
    rc, _, err = plan_inventory(inv, capsys, model="llama2-7b")
    assert rc == 3 and "not one transformer layer" not in err and "closest layout misses by" in err, err
    write(tmp_path, "inv.yaml", text % round(need - 0.1, 1))
    rc, _, err = plan_inventory(inv, capsys, model="llama2-7b")
    assert rc == 3 and "not one transformer layer" in err, err



def test_infeasible_when_required_clusters_are_not_linked(tmp_path, capsys):
    """--use-clusters a,b on an inventory with no link between them: no pipeline can hold both. Exit 3 naming the
    inventory's 'links' and both ways out, not 'no legal layout exists'."""
    inv = write(tmp_path, "inv.yaml", "clusters:\n  - {name: a, device: h800, nodes: 4, devices_per_node: 8}\n"
                                      "  - {name: b, device: h800, nodes: 4, devices_per_node: 8}\n")
    rc, out, err = run_cli(["plan", "--model", "llama2-7b", "--inventory", inv, "--use-clusters", "a,b", "--quiet"],
                           capsys)
    check_error(rc, err, code=3, file=inv, field="links", words=["no feasible plan", "from a to b", "--use-clusters"])
    assert out == ""
    # the fix works: with the link (or without the constraint) a plan fits
    with open(inv, "a") as fh:
        fh.write("links:\n  - {between: [a, b], bandwidth_gbps: 100, latency_ms: 1}\n")
    rc, _, err = run_cli(["plan", "--model", "llama2-7b", "--inventory", inv, "--use-clusters", "a,b", "--quiet"],
                         capsys)
    assert rc == 0, err


def test_precision_a_listed_cluster_lacks(tmp_path, capsys):
    """fp8 on an inventory with an Ascend 910B (no fp8): exit 2 naming the cluster, and both fixes the message gives
    work: --exclude-clusters leaves it out of the inventory the search sees (said on stderr; the plan file's
    inventory is priced at fp8 throughout, so explain reads it), as removing it from the inventory does."""
    both = "clusters:\n  - {name: h800, device: h800, nodes: 2, devices_per_node: 8}\n" \
           "  - {name: ascend, device: ascend-910b, nodes: 2, devices_per_node: 8}\n" \
           "links:\n  - {between: [h800, ascend], bandwidth_gbps: 25, latency_ms: 2}\n"
    inv = write(tmp_path, "inv.yaml", both)
    argv = ["plan", "--model", "llama2-7b", "--global-batch-size", "64", "--precision", "fp8", "--quiet"]
    rc, out, err = run_cli(argv + ["--inventory", inv], capsys)
    check_error(rc, err, file=inv, field="--precision",
                words=["cluster ascend", "cannot train in fp8", "--exclude-clusters", "remove it from the inventory"])
    assert out == ""
    plan = str(tmp_path / "p.yaml")
    rc, _, err = run_cli(argv + ["--inventory", inv, "--exclude-clusters", "ascend", "-o", plan], capsys)
    assert rc == 0 and "left out of the inventory: ascend" in err, err
    rc, out, err = run_cli(["explain", "--plan", plan, "--no-search"], capsys)
    assert rc == 0 and "h800" in out, err
    alone = write(tmp_path, "h800.yaml", both.split("  - {name: ascend")[0])
    rc, _, err = run_cli(argv + ["--inventory", alone], capsys)
    assert rc == 0, err
    # fp32 (which the 910B lacks too) went through a note that priced every cluster first, and --use-clusters
    # leaving the cluster out was not taken as leaving it out
    fp32 = ["plan", "--model", "llama2-7b", "--global-batch-size", "64", "--precision", "fp32", "--quiet",
            "--inventory", inv]
    for leave_out in (["--exclude-clusters", "ascend"], ["--use-clusters", "h800"]):
        rc, _, err = run_cli(fp32 + leave_out, capsys)
        assert rc == 0 and "left out of the inventory: ascend" in err, (leave_out, err)

# ---- output directories: refused before any work ------------------------------------------------------------
@pytest.mark.parametrize("argv", [["demo", "--skip-training", "--out"], ["fit", "--sailor", "-o"]])
def test_output_directory_that_is_a_file(argv, tmp_path, capsys):
    taken = write(tmp_path, "taken", "a file, not a directory\n")
    rc, out, err = run_cli(argv + [taken], capsys)
    check_error(rc, err, field=argv[-1], words=[taken, "exists and is not a directory"])
    assert out == ""
    rc, _, err = run_cli(argv + [os.path.join(taken, "sub")], capsys)
    check_error(rc, err, field=argv[-1], words=["cannot be created", "is a file"] if argv[0] == "fit" else
                ["cannot be created"])

# ---- the real process: exit code and stderr as a user sees them ---------------------------------------------
def test_subprocess_errors_have_no_traceback(tmp_path):
    bad_yaml = write(tmp_path, "inv.yaml", INVENTORY_CASES["yaml-syntax"][0])
    bad_device = write(tmp_path, "dev.yaml", INVENTORY_CASES["unknown-device"][0])
    bad_json = write(tmp_path, "config.json", MODEL_CASES["invalid-json"][1])
    inv = write(tmp_path, "cpu.yaml", CPU_INVENTORY)
    bad_plan = write(tmp_path, "plan.yaml", plan_text(version=7))
    small = write(tmp_path, "small.yaml", "clusters:\n  - {name: small, device: a10, nodes: 1, devices_per_node: 8}\n")
    runs = [
        (["plan", "--model", "tiny", "--inventory", bad_yaml], 2, bad_yaml),
        (["plan", "--model", "tiny", "--inventory", bad_device], 2, "clusters[0].device"),
        (["plan", "--model", bad_json, "--inventory", INV_2], 2, bad_json),
        (["simulate", "--model", "tiny", "--inventory", inv, "--plan", bad_plan], 2, "field 'version'"),
        (["plan", "--model", "llama2-70b", "--inventory", small, "--quiet"], 3, "misses by"),
    ]
    for argv, code, text in runs:
        res = run_hetauto(*argv, timeout=120)
        assert res.returncode == code, (argv, res.stderr)
        assert "Traceback" not in res.stderr and text in res.stderr, res.stderr
        assert res.stdout == ""


@pytest.mark.parametrize("target", ["megatron", "deepspeed", "summary"])
def test_emit_names_the_plan_whose_precision_a_device_lacks(target, tmp_path, capsys):
    """An fp8 plan of CPU meshes: emit megatron and deepspeed named no file; emit summary took the plan."""
    plan = write(tmp_path, "plan.yaml", plan_text(version=4) + "precision: fp8\n")
    rc, out, err = run_cli(["emit", target, "--plan", plan], capsys)
    check_error(rc, err, file=plan, field="precision", words=["cannot train in fp8"])


def test_messages_that_named_the_wrong_thing(tmp_path, capsys):
    """Each gave a misleading paragraph, or none: a directory of profiles ('profile file not found'), the
    manifest for its model directory ('no manifest.json'), --seq-length 0 (no fix), -o '' (taken in silence),
    --rows -1, profile --overheads on the CPU, probe-link --between with a name no inventory takes."""
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "manifest.json").write_text("{}")
    cases = [(["fit", str(tmp_path), "-o", str(tmp_path / "out")], None, ["is a directory", "*.jsonl"]),
             (["simulate", "--model", "tiny", "--inventory", INV_2, "--cost-model", str(tmp_path / "m" / "manifest.json"),
               "--tp", "1", "--pp", "1", "--dp", "1"], "--cost-model", ["the directory that holds it"]),
             (["plan", "--model", "tiny", "--inventory", INV_2, "--seq-length", "0"], "--seq-length", ["at least 1"]),
             (["plan", "--model", "tiny", "--inventory", INV_2, "-o", ""], "-o", ["empty file name"]),
             (["validate-cost-model", "--published", "--rows", "-1"], "--rows", ["not be negative"]),
             # said the machine had no CPU "that torch can use"
             (["profile", "--device-type", "cpu", "--overheads"], "--overheads", ["CPU processes have no"]),
             # the timing grid's options were taken and did nothing
             (["profile", "--device-type", "h100-sxm", "--overheads", "--quick", "--seed", "3"], "--overheads",
              ["--quick, --seed would do nothing"]),
             # printed a links entry the inventory loader then refused
             (["probe-link", "--local", "--between", "a b", "c"], "--between", ["not a usable cluster name"])]
    for argv, field, words in cases:
        rc, out, err = run_cli(argv, capsys)
        check_error(rc, err, field=field, words=words)


def test_a_file_passed_to_the_wrong_option_is_named_as_what_it_is(tmp_path, capsys):
    """An inventory given as --model (or a plan as --inventory) said 'unknown key(s) clusters, links. Fix: remove
    them'; it now says which kind of file it is and which option takes it."""
    inv = write(tmp_path, "inv.yaml", CPU_INVENTORY)
    rc, _, err = run_cli(["plan", "--model", inv, "--inventory", inv, "--quiet"], capsys)
    check_error(rc, err, file=inv, words=["looks like an inventory file", "--inventory"])
    plan = str(tmp_path / "p.yaml")
    assert run_cli(["plan", "--model", "tiny", "--inventory", inv, "--quiet", "--global-batch-size", "8",
                    "-o", plan], capsys)[0] == 0
    rc, _, err = run_cli(["plan", "--model", "tiny", "--inventory", plan, "--quiet"], capsys)
    check_error(rc, err, file="p.yaml", words=["looks like a plan file", "--plan"])
    # GPT-2's config.json (n_layer, n_embd: none of hetauto's own model keys) said "rename 'model_type' to 'model'"
    gpt2 = write(tmp_path, "config.json", '{"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", '
                                          '"n_embd": 768, "n_head": 12, "n_layer": 12, "vocab_size": 50257}')
    for argv in (["explain", "--plan", gpt2], ["plan", "--model", "tiny", "--inventory", gpt2, "--quiet"]):
        rc, _, err = run_cli(argv, capsys)
        check_error(rc, err, file=gpt2, words=["looks like a model file", "--model"])


def test_numbers_with_an_exponent_are_numbers(tmp_path):
    """YAML 1.1 reads 8e1 and 2.5e1 (an exponent without a decimal point or without its sign) as text: an
    inventory with `memory_gib: 8e1` was refused as 'a string'. They are the numbers they are written as."""
    from hetauto_megatron.spec.inventory import load_inventory

    inv = write(tmp_path, "inv.yaml", "clusters:\n"
                "  - {name: a, device: h800, nodes: 1, devices_per_node: 8, memory_gib: 8e1}\n"
                "  - {name: b, device: a100, nodes: 1, devices_per_node: 8}\n"
                "links:\n  - {between: [a, b], bandwidth_gbps: 2.5e1, latency_ms: 5E-1}\n")
    loaded = load_inventory(inv)
    link = loaded.link("a", "b")
    assert loaded.cluster("a").device.memory_gib == 80.0
    assert link.bandwidth_gbps == 25.0 and abs(link.latency_s - 0.0005) < 1e-12


def test_text_that_looks_like_an_exponent_stays_text(tmp_path, capsys):
    """Only number fields read 1e3 as a number: a cluster named 1e3 round-trips through a plan file (the plan
    writer leaves such text unquoted; a loader reading every 1e3 as a number refused the file it had written)."""
    inv = write(tmp_path, "inv.yaml", "clusters:\n  - {name: 1e3, device: cpu, nodes: 1, devices_per_node: 4}\n")
    plan = str(tmp_path / "p.yaml")
    rc, _, err = run_cli(["plan", "--model", "tiny", "--inventory", inv, "--global-batch-size", "8", "--quiet",
                          "-o", plan], capsys)
    assert rc == 0, err
    rc, _, err = run_cli(["simulate", "--plan", plan], capsys)
    assert rc == 0, err


def test_every_cluster_that_lacks_the_precision_is_named_at_once(tmp_path, capsys):
    """fp8 on an inventory with two clusters that lack it: both named in one message (only the first was, and
    the second came after the first was excluded)."""
    inv = write(tmp_path, "inv.yaml", "clusters:\n"
                "  - {name: h, device: h800, nodes: 1, devices_per_node: 8}\n"
                "  - {name: hw, device: ascend-910b, nodes: 1, devices_per_node: 8}\n"
                "  - {name: old, device: a100, nodes: 1, devices_per_node: 8}\n"
                "links:\n  - {between: [h, hw], bandwidth_gbps: 25, latency_ms: 2}\n"
                "  - {between: [hw, old], bandwidth_gbps: 25, latency_ms: 2}\n")
    rc, out, err = run_cli(["plan", "--model", "llama2-7b", "--inventory", inv, "--precision", "fp8", "--quiet"],
                           capsys)
    check_error(rc, err, file=inv, field="--precision", words=["cluster hw:", "cluster old:", "cannot train in fp8",
                                                                 "leave those clusters out"])


def test_no_cluster_able_to_train_at_the_precision_is_named(tmp_path, capsys):
    """An Ascend-only inventory planned in fp32: the refusal names the cluster and the precision (a note's view of
    the able clusters left none, and said 'lists no clusters')."""
    inv = write(tmp_path, "inv.yaml", "clusters:\n  - {name: ascend, device: ascend-910b, nodes: 1, "
                                      "devices_per_node: 8}\n")
    rc, _, err = run_cli(["plan", "--model", "llama2-7b", "--inventory", inv, "--precision", "fp32", "--quiet"],
                         capsys)
    check_error(rc, err, file=inv, field="--precision", words=["cluster ascend", "cannot train in fp32"])


def test_the_precision_suggested_is_one_every_cluster_has(tmp_path, capsys):
    """An A100 and a V100 refused fp8 with "choose a precision it has: bf16, fp16, fp32" (the A100's), and the V100
    refuses bf16 too; the suggestion is the precisions both have, as their datasheets give them (the V100 has no
    bf16 tensor cores, neither has fp8)."""
    inv = write(tmp_path, "inv.yaml", "clusters:\n"
                "  - {name: a, device: a100-40gb, nodes: 1, devices_per_node: 8}\n"
                "  - {name: v, device: v100-16gb, nodes: 1, devices_per_node: 8}\n"
                "links:\n  - {between: [a, v], bandwidth_gbps: 25, latency_ms: 2}\n")
    rc, out, err = run_cli(["plan", "--model", "llama2-7b", "--inventory", inv, "--precision", "fp8", "--quiet"],
                           capsys)
    check_error(rc, err, file=inv, field="--precision",
                words=["choose a precision every cluster has: fp16, fp32,", "leave those clusters out"])


def test_a_model_name_written_as_a_number_is_kept_as_written(tmp_path):
    """name: 5 was planned as "5.0" (and name: 1e3 as "1000.0"): a name is text, whatever it looks like."""
    from hetauto_megatron.spec.model import load_model
    for written, name in (("5", "5"), ("1e3", "1e3"), ("0.5", "0.5"), ("'007'", "007")):
        path = write(tmp_path, "m.yaml", f"preset: llama2-7b\nname: {written}\n")
        assert load_model(path).name == name
