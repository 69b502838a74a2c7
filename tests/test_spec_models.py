"""ModelSpec from Hugging Face config.json files of both MLP families, and the presets, against the
published parameter counts. The fixtures in tests/data/hf/ are the public config.json files (key names and
values as published) of each model."""
from __future__ import annotations

import os

import pytest
import yaml

from hetauto_megatron.spec.model import PRESETS, load_model

HF = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "hf")

# file: (published parameter count, gated_mlp, tie_embeddings, position_embedding, layers, kv heads)
HF_MODELS = {
    "llama-2-7b": (6.74e9, True, False, "rope", 32, 32),
    "mistral-7b": (7.24e9, True, False, "rope", 32, 8),
    "qwen2-7b": (7.62e9, True, False, "rope", 28, 4),
    "gpt2": (124.44e6, False, True, "learned", 12, 12),
    "pythia-160m": (162.32e6, False, False, "rope", 12, 12),
    "opt-125m": (125.24e6, False, True, "learned", 12, 12),
}


@pytest.mark.parametrize("name", sorted(HF_MODELS))
def test_hf_config_parses_and_counts(name):
    published, gated, tie, pos, layers, kv = HF_MODELS[name]
    spec = load_model(os.path.join(HF, f"{name}.json"))
    assert (spec.gated_mlp, spec.tie_embeddings, spec.position_embedding) == (gated, tie, pos)
    assert (spec.num_layers, spec.num_query_groups) == (layers, kv)
    assert spec.total_params == pytest.approx(published, rel=0.02)


def test_hf_exact_counts():
    # to the parameter, as published: LLaMA/Mistral (no biases, RMSNorm) by the model cards' checkpoints; GPT-2
    # (linear biases, LayerNorm, tied) by its checkpoint; Pythia-160M (biases, LayerNorm, untied) by the Pythia
    # paper's table (162,322,944 in all, 85,056,000 outside the embedding and the output layer)
    assert load_model(os.path.join(HF, "llama-2-7b.json")).total_params == 6_738_415_616
    assert load_model(os.path.join(HF, "mistral-7b.json")).total_params == 7_241_732_096
    assert load_model(os.path.join(HF, "gpt2.json")).total_params == 124_439_808
    pythia = load_model(os.path.join(HF, "pythia-160m.json"), seq_length=2048)
    assert pythia.total_params == 162_322_944
    assert pythia.num_layers * pythia.layer_params + pythia.norm_params == 85_056_000


def test_a_config_json_without_a_sequence_length_says_which_one_is_planned():
    """A config.json holds the longest sequence its positions allow (Qwen2-7B: 131,072 tokens), not the one
    trained: planning at it silently would price sequences 32x those of a 4,096-token job. Without
    --seq-length the length planned is said (the file's own value); with it, nothing is said."""
    import json
    path = os.path.join(HF, "qwen2-7b.json")
    with open(path) as f:
        published = json.load(f)["max_position_embeddings"]
    said = []
    assert load_model(path, note=said.append).seq_length == published
    length = [line for line in said if "sequence length" in line]
    assert len(length) == 1 and path in length[0]
    assert f"{published:,} tokens" in length[0] and "--seq-length" in length[0]
    said.clear()
    assert load_model(path, seq_length=4096, note=said.append).seq_length == 4096
    assert not [line for line in said if "sequence length" in line]
    said.clear()
    assert load_model("llama2-7b", note=said.append) and not said      # a preset carries its trained length


def test_what_a_config_describes_beyond_the_planned_shapes_is_said_with_megatrons_flag():
    """Qwen2 has QKV biases and an epsilon of 1e-6, Pythia rotates a quarter of each head: the launch scripts
    build the planned shapes without them, so the commands say so, naming the flag that adds each (checked
    against Megatron-LM's own parser: every flag named is one it has); OPT's ReLU MLP is built with GeLU, which
    Megatron's GPT has no flag for. LLaMA-2's config has nothing more."""
    import argparse
    import json
    import re

    from megatron.training.arguments import add_megatron_arguments

    parser = add_megatron_arguments(argparse.ArgumentParser(allow_abbrev=False))
    dest = {flag: action.dest for action in parser._actions for flag in action.option_strings}
    expected = {"qwen2-7b": ["--add-qkv-bias", "--norm-epsilon 1e-06"], "pythia-160m": ["--rotary-percent 0.25"],
                "llama-2-7b": [], "mistral-7b": [], "gpt2": [], "opt-125m": []}
    for name, flags in expected.items():
        path = os.path.join(HF, f"{name}.json")
        said = []
        load_model(path, seq_length=1024, note=said.append)
        assert ("relu MLP (as OPT's): built with GeLU" in " ".join(said)) == (name == "opt-125m"), (name, said)
        named = re.findall(r"Megatron: (--[a-z-]+(?: [0-9.e+-]+)?)", " ".join(said))
        assert named == flags, (name, said)
        for flag in named:
            option, *value = flag.split()
            assert option in dest, option
            if value:    # the value Megatron would parse is the config's own
                args, _ = parser.parse_known_args([option, value[0]])
                cfg = json.load(open(path))
                mine = cfg.get("rms_norm_eps", cfg.get("rotary_pct"))
                assert getattr(args, dest[option]) == pytest.approx(mine)


def test_hf_gqa_shapes():
    q = load_model(os.path.join(HF, "qwen2-7b.json"))
    assert q.head_dim == 128 and q.kv_hidden == 512 and q.ffn_hidden_size == 18944
    # Sequence length defaults to the position table; --seq-length overrides it (rope: table unchanged).
    assert q.seq_length == 131072
    short = load_model(os.path.join(HF, "qwen2-7b.json"), seq_length=4096)
    assert short.seq_length == 4096 and short.total_params == q.total_params


def test_hf_learned_positions_grow_with_longer_sequences():
    g = load_model(os.path.join(HF, "gpt2.json"), seq_length=2048)
    assert g.max_position_embeddings == 2048
    assert g.total_params - load_model(os.path.join(HF, "gpt2.json")).total_params == 1024 * 768


def test_hf_config_without_positions_plans_at_seq_length(tmp_path):
    # Baichuan-13B's config.json gives only a tokenizer-style model_max_length, no position key: rotary
    # embeddings have no table, so --seq-length is all the planner needs (and the error without it says so).
    from hetauto_megatron.errors import InputError
    (tmp_path / "config.json").write_text(
        '{"model_type": "baichuan", "num_hidden_layers": 40, "hidden_size": 5120, "num_attention_heads": 40, '
        '"intermediate_size": 13696, "vocab_size": 125696, "model_max_length": 4096}')
    m = load_model(str(tmp_path / "config.json"), seq_length=4096)
    assert (m.seq_length, m.max_position_embeddings, m.position_embedding) == (4096, 4096, "rope")
    assert load_model(str(tmp_path), seq_length=2048).seq_length == 2048     # the checkpoint directory too
    with pytest.raises(InputError, match="--seq-length"):
        load_model(str(tmp_path / "config.json"))


def test_hf_family_decides_the_mlp_not_the_activation(tmp_path):
    # Gemma is gated although its activation is a GELU, and ties its head when the key is absent.
    (tmp_path / "config.json").write_text(
        '{"model_type": "gemma", "num_hidden_layers": 18, "hidden_size": 2048, "num_attention_heads": 8, '
        '"num_key_value_heads": 1, "head_dim": 256, "hidden_act": "gelu_pytorch_tanh", "intermediate_size": 16384, '
        '"vocab_size": 256000, "max_position_embeddings": 8192}')
    g = load_model(str(tmp_path / "config.json"))
    assert g.gated_mlp and g.tie_embeddings and g.num_query_groups == 1
    assert g.total_params == pytest.approx(2.51e9, rel=0.02)   # Gemma-2B


def test_json_with_project_keys_reads_like_yaml(tmp_path):
    (tmp_path / "m.json").write_text('{"preset": "tiny", "num_layers": 4}')
    assert load_model(str(tmp_path / "m.json")).num_layers == 4


PRESET_COUNTS = {"llama2-7b": 6.74e9, "llama2-13b": 13.0e9, "llama2-70b": 69.0e9, "llama3-8b": 8.03e9,
                 "llama3-70b": 70.6e9, "mistral-7b": 7.24e9, "gpt3-175b": 175e9}


@pytest.mark.parametrize("name", sorted(PRESET_COUNTS))
def test_preset_counts(name):
    assert PRESETS[name].total_params == pytest.approx(PRESET_COUNTS[name], rel=0.02)


def test_preset_overrides_follow_derived_keys(tmp_path):
    # llama2-7b has no GQA: overriding its heads keeps it without GQA rather than keeping 32 kv heads.
    (tmp_path / "m.yaml").write_text("preset: llama2-7b\nnum_attention_heads: 64\nseq_length: 2048\n")
    m = load_model(str(tmp_path / "m.yaml"))
    assert m.num_query_groups == 64 and m.seq_length == 2048 and m.max_position_embeddings == 2048
    # A GQA preset keeps its kv heads.
    (tmp_path / "g.yaml").write_text("preset: llama2-70b\nnum_layers: 40\n")
    g = load_model(str(tmp_path / "g.yaml"))
    assert g.num_query_groups == 8 and g.num_layers == 40 and g.hidden_size == 8192
    # another model than the preset is named by its file, as docs/inputs.md says (it was reported as llama2-70b);
    # a name written wins
    assert g.name == "g" and m.name == "m"
    (tmp_path / "n.yaml").write_text("preset: llama2-70b\nnum_layers: 40\nname: half-70b\n")
    assert load_model(str(tmp_path / "n.yaml")).name == "half-70b"
    (tmp_path / "j.json").write_text('{"preset": "llama2-70b", "num_layers": 40}')     # a JSON model file too
    assert load_model(str(tmp_path / "j.json")).name == "j"


def test_a_padded_copy_hashes_as_the_equal_model():
    """ModelSpec caches its hash in the instance: a padded copy of a model already hashed kept the unpadded
    model's hash while comparing equal to the same model built anew, so dict, set and lru_cache lookups missed."""
    m = PRESETS["llama2-7b"]
    {m: 1}                                              # (hashes it, as every search does)
    padded, built = m.with_padded_vocab(m.vocab_size + 128), m.replace(vocab_size=m.vocab_size + 128)
    assert padded == built and hash(padded) == hash(built) and built in {padded}


def test_gqa_and_swiglu_in_layer_params():
    m = PRESETS["llama2-70b"]
    h, kv, f = 8192, 1024, 28672
    assert m.layer_params == h * (h + 2 * kv) + h * h + 3 * h * f + 2 * h


def test_a_model_without_output_layer_is_not_a_model_file_key():
    """Only the description of a measured job (Sailor's GPT-Neo, whose fork builds no output layer) sets
    output_layer false: a model file cannot, since hetauto's runtimes always build the output layer, and the
    files hetauto writes for every model it runs are unchanged (the key is written only when false)."""
    from hetauto_megatron.errors import InputError
    from hetauto_megatron.spec.model import model_from_dict
    base = PRESETS["llama2-7b"]
    assert "output_layer" not in base.to_dict()
    headless = base.replace(output_layer=False)
    assert headless.to_dict()["output_layer"] is False
    assert headless.output_params == base.hidden_size and headless.logits_flops_per_token() == 0
    with pytest.raises(InputError, match="output_layer"):
        model_from_dict({**base.to_dict(), "output_layer": False})


def test_a_learned_table_grown_by_seq_length_is_said(tmp_path):
    """GPT-2's config has 1,024 learned positions; --seq-length 2048 plans a 2,048-row table (what training from
    scratch at that length builds), which a pretrained checkpoint cannot fill: the user is told so."""
    from hetauto_megatron.spec.model import load_model
    path = tmp_path / "config.json"
    path.write_text('{"model_type": "gpt2", "n_embd": 768, "n_head": 12, "n_layer": 12, "n_positions": 1024, '
                    '"vocab_size": 50257}')
    notes = []
    spec = load_model(str(path), seq_length=2048, note=notes.append)
    assert spec.max_position_embeddings == 2048
    assert any("1,024 learned positions" in n and "will not load" in n for n in notes), notes
    notes.clear()
    assert load_model(str(path), seq_length=1024, note=notes.append).max_position_embeddings == 1024
    assert not any("learned positions" in n for n in notes), notes


def test_gpt_bigcode_is_read_as_published(tmp_path):
    """StarCoder-1B's config (GPT-BigCode: multi_query, learned positions, a tied head, a GELU MLP of n_inner) was
    planned as an untied, multi-head, rotary, gated model some 24 % larger, without a word."""
    (tmp_path / "config.json").write_text(
        '{"model_type": "gpt_bigcode", "activation_function": "gelu_pytorch_tanh", "multi_query": true, '
        '"n_embd": 2048, "n_head": 16, "n_inner": 8192, "n_layer": 24, "n_positions": 8192, "vocab_size": 49152}')
    m = load_model(str(tmp_path / "config.json"))
    assert (m.num_query_groups, m.position_embedding, m.tie_embeddings, m.gated_mlp) == (1, "learned", True, False)
    assert m.total_params == pytest.approx(1.14e9, rel=0.03)    # StarCoderBase-1B


@pytest.mark.parametrize("model_type, words", [("bloom", "ALiBi"), ("mpt", "ALiBi")])
def test_families_megatrons_gpt_does_not_build_are_refused(tmp_path, model_type, words):
    """BLOOM and MPT (ALiBi) were refused for a missing MLP key, or, given one, planned as another model: they are
    refused for what they are, naming model_type (Falcon's parallel block is planned: test_spec_hf_families.py)."""
    from hetauto_megatron.errors import InputError

    (tmp_path / "config.json").write_text(
        f'{{"model_type": "{model_type}", "hidden_size": 4544, "n_head": 71, "n_layer": 32, "multi_query": true, '
        '"parallel_attn": true, "intermediate_size": 18176, "vocab_size": 65024, "max_position_embeddings": 2048}')
    with pytest.raises(InputError) as info:
        load_model(str(tmp_path / "config.json"))
    assert info.value.field == "model_type" and words in info.value.reason


def test_a_sliding_window_without_its_switch_is_said(tmp_path):
    """Mistral-7B-v0.1 and Phi-3 give sliding_window with no use_sliding_window: Hugging Face applies it, and the
    plan's full causal attention is said (only use_sliding_window: true was); Qwen2's false switch stays silent."""
    from hetauto_megatron.spec.hf_config import not_carried

    mistral = {"model_type": "mistral", "sliding_window": 4096}
    qwen2 = {"model_type": "qwen2", "sliding_window": 131072, "use_sliding_window": False}
    assert any("sliding-window attention (window 4096)" in line for line in not_carried(mistral))
    assert not any("sliding-window" in line for line in not_carried(qwen2))


def test_bias_and_rope_scaling_notes_name_flags_megatron_has():
    """LLaMA's attention_bias covers the output projection too and mlp_bias the MLP (only --add-qkv-bias was
    named, mlp_bias not at all); a linear rope_scaling was pointed at LLaMA-3.1's --use-rope-scaling. Every flag a
    note names is one Megatron-LM's own parser has."""
    import re

    from helpers import megatron_options

    from hetauto_megatron.spec.hf_config import not_carried

    _, options = megatron_options()
    said = " ".join(not_carried({"model_type": "llama", "attention_bias": True,
                                 "rope_scaling": {"type": "linear", "factor": 4}}))
    said += " " + " ".join(not_carried({"model_type": "llama", "mlp_bias": True}))
    assert "output projection" in said and "MLP's projections" in said, said
    # both: every linear layer biased, which --add-bias-linear builds (the plan does): nothing left to say
    assert "bias" not in " ".join(not_carried({"model_type": "llama", "attention_bias": True, "mlp_bias": True}))
    assert "--rotary-seq-len-interpolation-factor 4" in said and "--use-rope-scaling" not in said, said
    llama31 = " ".join(not_carried({"model_type": "llama", "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}))
    assert "--use-rope-scaling --rope-scaling-factor 8.0" in llama31, llama31
    # an epsilon of 0, negative or quoted is said (it passed without a word, where 1e-6 got its flag)
    eps = {v: " ".join(not_carried({"model_type": "llama", "rms_norm_eps": v})) for v in (0, -1e-6, "1e-6", 1e-6, 1e-5)}
    assert all("not a positive number" in eps[v] and "--norm-epsilon" in eps[v] for v in (0, -1e-6, "1e-6")), eps
    assert "--norm-epsilon 1e-06" in eps[1e-6] and "epsilon" not in eps[1e-5], eps
    named = set(re.findall(r"--[a-z][a-z-]+", said + " " + llama31 + " " + eps[0]))
    assert named and named <= options, named - options


def test_a_family_hetauto_does_not_know_ties_its_head_when_the_key_is_absent(tmp_path):
    """transformers' save_pretrained writes tie_word_embeddings unless it is true (PretrainedConfig's default):
    Command-R's config.json (model_type cohere, not in the family table) leaves it out and ties its head. It was
    planned untied, 2.1 B parameters (6 %) above the checkpoint's 34,980,831,232."""
    (tmp_path / "config.json").write_text(
        '{"model_type": "cohere", "hidden_act": "silu", "hidden_size": 8192, "intermediate_size": 22528, '
        '"max_position_embeddings": 8192, "num_attention_heads": 64, "num_hidden_layers": 40, '
        '"num_key_value_heads": 64, "rope_theta": 8000000.0, "use_qk_norm": false, "vocab_size": 256000}')
    m = load_model(str(tmp_path / "config.json"))
    assert m.tie_embeddings and m.gated_mlp
    assert m.total_params == pytest.approx(34_980_831_232, rel=0.001)


def test_opt_with_a_projected_embedding_is_refused(tmp_path):
    """OPT-350m's embeddings are 512 wide, projected to and from its 1,024-wide layers: planned as a GPT it counted
    355.9 M parameters against the checkpoint's 331.2 M (+7.5 %), without a word. It is refused, naming the key."""
    from hetauto_megatron.errors import InputError

    (tmp_path / "config.json").write_text(
        '{"model_type": "opt", "activation_function": "relu", "do_layer_norm_before": false, "ffn_dim": 4096, '
        '"hidden_size": 1024, "max_position_embeddings": 2048, "num_attention_heads": 16, "num_hidden_layers": 24, '
        '"vocab_size": 50272, "word_embed_proj_dim": 512}')
    with pytest.raises(InputError) as info:
        load_model(str(tmp_path / "config.json"))
    assert info.value.field == "word_embed_proj_dim" and "projected" in info.value.reason
    opt_125m = load_model(os.path.join(HF, "opt-125m.json"))      # an OPT whose projection is the hidden size
    assert opt_125m.total_params == pytest.approx(125.24e6, rel=0.02)


def test_parallel_blocks_rotary_dim_and_local_attention_are_said():
    """GPT-J and Phi run attention and the MLP side by side on one input in every layer (no switch says so, unlike
    GPT-NeoX's use_parallel_residual), GPT-J rotates rotary_dim (64) of each 256-wide head, and GPT-Neo's local
    layers attend within a window: the launch builds sequential layers with full rotary embeddings and full causal
    attention, which was not said for any of them."""
    from hetauto_megatron.spec.hf_config import not_carried

    gptj = " ".join(not_carried({"model_type": "gptj", "n_embd": 4096, "n_head": 16, "rotary_dim": 64}))
    assert "side by side" in gptj and "--rotary-percent 0.25" in gptj, gptj
    phi = " ".join(not_carried({"model_type": "phi", "hidden_size": 2560, "num_attention_heads": 32,
                                "partial_rotary_factor": 0.4}))
    assert "side by side" in phi and "--rotary-percent 0.4" in phi, phi
    assert not any("side by side" in line for line in not_carried({"model_type": "llama"}))
    # GPT-Neo-1.3B: every other layer attends within a window of 256 tokens
    neo = " ".join(not_carried({"model_type": "gpt_neo", "attention_layers": ["global", "local"] * 12,
                                "window_size": 256}))
    assert "local attention (window 256) in 12 of 24 layers" in neo, neo


def test_a_fractional_rotary_base_is_launched_at_the_nearest_integer_and_said():
    """StarCoder2-3B's config.json has rope_theta 999999.4420358813; Megatron's --rotary-base takes an integer, and
    the published model was refused (exit 2, 'correct the value'). It is planned at 999,999, which the plan records
    and the launch passes, and the note says so. The rest is StarCoder2's: biases, LayerNorm, a tied head, GQA, to
    the checkpoint's 3,030,371,328 parameters."""
    from hetauto_megatron.spec.hf_config import model_from_hf_config, not_carried

    cfg = {"model_type": "starcoder2", "hidden_act": "gelu_pytorch_tanh", "hidden_size": 3072,
           "intermediate_size": 12288, "max_position_embeddings": 16384, "norm_epsilon": 1e-05,
           "num_attention_heads": 24, "num_hidden_layers": 30, "num_key_value_heads": 2,
           "rope_theta": 999999.4420358813, "sliding_window": 4096, "use_bias": True, "vocab_size": 49152}
    m = model_from_hf_config(cfg)
    assert m.rotary_base == 999_999 and m.tie_embeddings and m.linear_biases and m.num_query_groups == 2
    assert m.total_params == 3_030_371_328
    said = " ".join(not_carried(cfg))
    assert "999999.4420358813" in said and "launched as 999999" in said, said


def test_a_multimodal_config_is_refused():
    """Qwen2-VL-7B's config.json has its language model's keys at the top level and its vision encoder under
    vision_config: it was planned as the language model alone, 7.62 B parameters against the checkpoint's 8.29 B
    (-8 %), without a word. It is refused, naming vision_config."""
    import json

    from hetauto_megatron.errors import InputError
    from hetauto_megatron.spec.hf_config import model_from_hf_config
    with open(os.path.join(HF, "qwen2-7b.json")) as f:
        cfg = json.load(f)
    cfg.update(model_type="qwen2_vl", max_position_embeddings=32768,
               vision_config={"depth": 32, "embed_dim": 1280, "mlp_ratio": 4, "num_heads": 16, "hidden_size": 3584,
                              "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2})
    with pytest.raises(InputError) as info:
        model_from_hf_config(cfg)
    assert info.value.field == "vision_config" and "multimodal" in info.value.reason


def test_linear_biases_is_a_model_field_written_only_where_it_is_not_the_mlp_kinds_rule(tmp_path):
    """A plain MLP without linear biases (Falcon's bias: false, Nemotron's) was built, emitted and priced with them:
    linear_biases was derived from gated_mlp alone. It is a field now: a plan with it set reads back the same; the
    presets' and the example plans' files, which leave it out, read and write as before (no such key); a value that
    is not true or false is refused naming it."""
    from hetauto_megatron.errors import InputError
    from hetauto_megatron.plan.plan_file import plan_from_dict, plan_to_yaml
    from hetauto_megatron.spec.model import PRESETS, model_from_dict

    example = os.path.join(os.path.dirname(os.path.dirname(HF)), "..", "examples", "llama", "plans",
                           "tiny-2clusters-cpu.yaml")
    with open(example) as f:
        written = f.read()
    plan = plan_from_dict(yaml.safe_load(written), file=example)
    assert "linear_biases" not in plan_to_yaml(plan) and not plan.model.linear_biases
    assert all("linear_biases" not in m.to_dict() for m in PRESETS.values())
    assert PRESETS["gpt3-175b"].linear_biases and not PRESETS["llama2-7b"].linear_biases
    # a GPT-3 without biases: the four projections' biases and nothing else go (12,288 x (3 + 1 + 4 + 1) per layer)
    unbiased = model_from_dict({"preset": "gpt3-175b", "linear_biases": False})
    assert PRESETS["gpt3-175b"].total_params - unbiased.total_params == 96 * 12288 * 9
    assert unbiased.replace(gated_mlp=False, name="x").linear_biases is False   # set, it stays set
    # (set against the kind, it is the other kind's rule: a change of kind leaves every model with its new rule)
    assert "linear_biases" not in unbiased.replace(gated_mlp=True).to_dict()
    assert not PRESETS["gpt3-175b"].replace(gated_mlp=True).linear_biases   # derived, it follows the MLP kind
    tiny = model_from_dict({"preset": "tiny", "gated_mlp": False, "linear_biases": False})
    raw = yaml.safe_load(plan_to_yaml(plan))
    raw["model"] = tiny.to_dict()
    assert raw["model"]["linear_biases"] is False
    again = plan_from_dict(yaml.safe_load(plan_to_yaml(plan_from_dict(raw))))
    assert again.model == tiny and not again.model.linear_biases
    # a checkpoint's record of what its weights depend on says it (a resume under the biased model is refused), and
    # says nothing where the field is not written, as records saved before it
    from hetauto_megatron.megatron.checkpoint_plan import resume_layout
    assert resume_layout(again)["weights"]["model"]["linear_biases"] is False
    assert "linear_biases" not in resume_layout(plan)["weights"]["model"]
    raw["model"]["linear_biases"] = "no"
    with pytest.raises(InputError) as info:
        plan_from_dict(raw, file="plan.yaml")
    text = str(info.value)
    assert "plan.yaml" in text and "model.linear_biases" in text and "true or false" in text, text


def test_an_empty_model_name_is_refused(tmp_path):
    """name: '' gave summaries and plans a model without a name (docs/inputs.md: an empty name is exit 2)."""
    from hetauto_megatron.errors import InputError
    from hetauto_megatron.spec.model import load_model
    path = tmp_path / "m.yaml"
    path.write_text("name: ''\npreset: tiny\n")
    with pytest.raises(InputError) as info:
        load_model(str(path))
    assert info.value.field == "name" and info.value.exit_code == 2
