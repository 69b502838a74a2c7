"""A model YAML passed to --model with a Hugging Face key (num_hidden_layers for num_layers, GPT-2's n_embd beside
hidden_size) was told "it looks like a model file (what --model reads), not the file this option reads. Fix: pass
each file to its own option", though it was passed to --model: the key is named with hetauto's name for it (the
names the config.json reader takes, spec/hf_families.py SOURCE_KEYS), and a config.json's whole content written
as YAML is named as such, pointing to how --model reads one."""
from __future__ import annotations

import yaml
from helpers import CPU_INVENTORY, run_cli
from test_spec_inputs import check_error, write

TINY = {"name": "tiny", "num_layers": 8, "hidden_size": 64, "num_attention_heads": 4, "ffn_hidden_size": 256,
        "vocab_size": 128, "seq_length": 32}


def _simulate(tmp_path, capsys, model: dict):
    path = write(tmp_path, "tiny.yaml", yaml.safe_dump(model))
    inv = write(tmp_path, "inv.yaml", CPU_INVENTORY)
    rc, _, err = run_cli(["simulate", "--model", path, "--inventory", inv, "--tp", "1", "--pp", "1", "--dp", "1",
                          "--micro-batch-size", "1", "--global-batch-size", "8"], capsys)
    return path, rc, err


def test_a_hugging_face_key_in_a_model_file_is_named_with_ours(tmp_path, capsys):
    model = {("num_hidden_layers" if k == "num_layers" else k): v for k, v in TINY.items()}
    path, rc, err = _simulate(tmp_path, capsys, model)
    check_error(rc, err, file=path, words=["unknown key(s) num_hidden_layers", "rename 'num_hidden_layers' to "
                                           "'num_layers'"])
    assert "not the file this option reads" not in err and "pass each file to its own option" not in err, err


def test_a_hugging_face_key_beside_ours_is_to_be_dropped(tmp_path, capsys):
    path, rc, err = _simulate(tmp_path, capsys, {**TINY, "n_embd": 64})
    check_error(rc, err, file=path, words=["unknown key(s) n_embd", "drop 'n_embd'", "hidden_size"])
    assert "not the file this option reads" not in err, err


def test_a_config_json_written_as_a_model_yaml_is_named_so(tmp_path, capsys):
    config = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "num_hidden_layers": 8,
              "hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 256, "vocab_size": 128,
              "max_position_embeddings": 32}
    path, rc, err = _simulate(tmp_path, capsys, config)
    check_error(rc, err, file=path, field="model_type", words=["config.json", "docs/inputs.md", "--model"])
    assert "not the file this option reads" not in err, err


def test_a_model_file_passed_to_another_option_is_still_named_a_model_file(tmp_path, capsys):
    path = write(tmp_path, "tiny.yaml", yaml.safe_dump(TINY))
    rc, _, err = run_cli(["simulate", "--model", "tiny", "--inventory", path, "--tp", "1", "--pp", "1", "--dp", "1",
                          "--micro-batch-size", "1", "--global-batch-size", "8"], capsys)
    check_error(rc, err, file=path, words=["looks like a model file", "--model"])
