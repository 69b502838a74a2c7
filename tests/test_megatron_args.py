"""--hetauto flags, per-rank rewrite of Megatron's arguments from a plan, version check (no processes)."""
import argparse
import os
import sys

import pytest

from hetauto_megatron.errors import InputError
from hetauto_megatron.megatron import launch_identity, model_checks, rewrite
from hetauto_megatron.megatron.args import add_hetauto_args, hetauto_args_provider
from hetauto_megatron.megatron.versions import check_megatron_version, megatron_core_version
from hetauto_megatron.plan.plan import load_plan, plan_from_dict
from hetauto_megatron.spec.model import PRESETS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLAN_FILE = os.path.join(ROOT, "examples", "llama", "plans", "tiny-2clusters-cpu.yaml")


def make_plan(meshes, gbs=8, model="tiny"):
    return plan_from_dict({"version": 1, "model": PRESETS[model].to_dict(), "global_batch_size": gbs,
                           "meshes": meshes})


PLAN = make_plan([
    {"cluster": "a", "device_type": "cpu", "tp": 2, "dp": 1, "micro_batch_size": 2, "stage_layers": [3, 2]},
    {"cluster": "b", "device_type": "cpu", "tp": 1, "dp": 2, "micro_batch_size": 1, "recompute": "full",
     "stage_layers": [3]},
])


# ---- flags -------------------------------------------------------------------------------------------------
def test_provider_adds_flags_and_composes_with_an_existing_one():
    def existing(parser):
        parser.add_argument("--foo", type=int, default=1)
        return parser

    parser = hetauto_args_provider(existing)(argparse.ArgumentParser())
    args = parser.parse_args(["--foo", "3", "--hetauto", "--hetauto-plan", "p.yaml", "--hetauto-cluster", "x"])
    assert (args.foo, args.hetauto, args.hetauto_plan, args.hetauto_cluster) == (3, True, "p.yaml", "x")
    add_hetauto_args(parser)  # a second call is harmless
    assert parser.parse_args([]).hetauto is False


def test_provider_accepts_a_provider_that_returns_none():
    def in_place(parser):
        parser.add_argument("--bar")

    args = hetauto_args_provider(in_place)(argparse.ArgumentParser()).parse_args(["--bar", "x", "--hetauto"])
    assert args.bar == "x" and args.hetauto


def test_cluster_flag_defaults_to_environment(monkeypatch):
    monkeypatch.setenv("HETAUTO_CLUSTER", "site-b")
    assert add_hetauto_args(argparse.ArgumentParser()).parse_args([]).hetauto_cluster == "site-b"


# ---- launch identity ---------------------------------------------------------------------------------------
def test_identity_uses_rank_offset_and_plan_world():
    ident = launch_identity.identity_from_env({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1",
                                               "HETAUTO_RANK_OFFSET": "4", "HETAUTO_WORLD_SIZE": "6",
                                               "HETAUTO_CLUSTER": "b"})
    assert (ident.rank, ident.world_size, ident.local_rank, ident.cluster) == (5, 6, 1, "b")
    single = launch_identity.identity_from_env({"RANK": "3", "WORLD_SIZE": "6"})
    assert (single.rank, single.world_size, single.cluster) == (3, 6, None)


def test_a_cluster_launched_with_other_processes_than_the_plans_is_refused():
    """Cluster b's launch runs global ranks 4-5 (2 processes); started with --nproc-per-node 1 it would leave every
    cluster waiting at the rendezvous until the timeout: refused at once, naming the flag."""
    def env(world):
        return {"RANK": "0", "WORLD_SIZE": str(world), "HETAUTO_RANK_OFFSET": "4", "HETAUTO_WORLD_SIZE": "6"}
    assert launch_identity.check_launch(PLAN, launch_identity.identity_from_env(env(2)), "b").mesh_index == 1
    with pytest.raises(InputError) as exc:
        launch_identity.check_launch(PLAN, launch_identity.identity_from_env(env(1)), "b", file="p.yaml")
    assert exc.value.field == "--nproc-per-node" and "started 1 processes" in exc.value.reason
    assert "the plan runs 2 there (global ranks 4-5)" in exc.value.reason
    # one torchrun over the whole job (or over consecutive clusters' launches) with HETAUTO_WORLD_SIZE set runs too
    whole = {"RANK": "5", "WORLD_SIZE": "6", "HETAUTO_WORLD_SIZE": "6"}
    assert launch_identity.check_launch(PLAN, launch_identity.identity_from_env(whole), "b").mesh_index == 1


def test_a_launch_of_some_of_the_worlds_ranks_needs_the_worlds_rendezvous_address():
    """The ranks of one cluster's launch (torchrun's WORLD_SIZE below HETAUTO_WORLD_SIZE) meet the others' only at
    HETAUTO_MASTER_ADDR: without it, refused naming it (tests/test_launch_mismatch.py runs it). One torchrun over the
    whole job, and the address given, pass."""
    def ident(world):
        return launch_identity.identity_from_env({"RANK": "0", "WORLD_SIZE": world, "HETAUTO_RANK_OFFSET": "4",
                                                  "HETAUTO_WORLD_SIZE": "6"})
    with pytest.raises(InputError) as exc:
        launch_identity.check_world_rendezvous(ident("2"), env={})
    assert exc.value.field == "HETAUTO_MASTER_ADDR" and "starts 2 of the world's 6 ranks" in exc.value.reason
    launch_identity.check_world_rendezvous(ident("2"), env={"HETAUTO_MASTER_ADDR": "10.0.0.1"})
    launch_identity.check_world_rendezvous(ident("6"), env={})
    launch_identity.check_world_rendezvous(launch_identity.identity_from_env({"RANK": "3", "WORLD_SIZE": "6"}), env={})


@pytest.mark.parametrize("env,field", [
    ({"RANK": "x"}, "RANK"),
    ({"RANK": "0", "HETAUTO_RANK_OFFSET": "4"}, "HETAUTO_WORLD_SIZE"),
])
def test_identity_errors(env, field):
    with pytest.raises(InputError) as exc:
        launch_identity.identity_from_env(env)
    assert exc.value.field == field


def test_check_launch_places_ranks_and_rejects_mismatches():
    ident = launch_identity.LaunchIdentity(rank=5, world_size=6, cluster=None)
    c = launch_identity.check_launch(PLAN, ident, "b")
    assert (c.mesh_index, c.stage, c.tp_rank, c.dp_rank) == (1, 2, 0, 1)
    with pytest.raises(InputError, match="launched with 4 processes but the plan needs 6"):
        launch_identity.check_launch(PLAN, launch_identity.LaunchIdentity(rank=0, world_size=4, cluster=None), None,
                                     file="p.yaml")
    with pytest.raises(InputError) as exc:
        launch_identity.check_launch(PLAN, ident, "a", file="p.yaml")
    assert exc.value.field == "meshes[1].cluster" and "cluster 'a'" in exc.value.reason
    with pytest.raises(InputError, match="outside the plan's 6 ranks"):
        launch_identity.check_launch(PLAN, launch_identity.LaunchIdentity(rank=7, world_size=6, cluster=None, rank_offset=6), None)


# ---- per-rank layout ---------------------------------------------------------------------------------------
def test_layout_overrides_per_mesh():
    a = rewrite.layout_overrides(PLAN, launch_identity.check_launch(PLAN, launch_identity.LaunchIdentity(1, 6, None), None))
    b = rewrite.layout_overrides(PLAN, launch_identity.check_launch(PLAN, launch_identity.LaunchIdentity(4, 6, None), None))
    assert a["tensor_model_parallel_size"] == 2 and b["tensor_model_parallel_size"] == 1
    assert a["micro_batch_size"] == 2 and b["micro_batch_size"] == 1
    assert a["pipeline_model_parallel_size"] == b["pipeline_model_parallel_size"] == 3
    assert a["pipeline_model_parallel_layout"] == b["pipeline_model_parallel_layout"] == "Et*3|t*2|t*3L"
    assert a["global_batch_size"] == b["global_batch_size"] == 8
    assert (a["recompute_granularity"], a["recompute_method"]) == (None, None)
    assert (b["recompute_granularity"], b["recompute_method"], b["recompute_num_layers"]) == ("full", "uniform", 1)
    assert a["recompute_modules"] is None
    assert a["decoder_first_pipeline_num_layers"] is None


def test_single_stage_plan_has_no_layout():
    plan = make_plan([{"cluster": "a", "device_type": "cpu", "tp": 1, "dp": 2, "micro_batch_size": 2,
                       "recompute": "selective", "stage_layers": [8]}])
    o = rewrite.layout_overrides(plan, launch_identity.check_launch(plan, launch_identity.LaunchIdentity(1, 2, None), None))
    assert o["pipeline_model_parallel_layout"] is None and o["pipeline_model_parallel_size"] == 1
    assert (o["recompute_granularity"], o["recompute_method"], o["recompute_modules"]) == ("selective", None, ["mlp"])


def test_validation_world_size_yields_mesh_dp():
    for rank, dp in [(0, 1), (3, 1), (4, 2), (5, 2)]:
        c = launch_identity.check_launch(PLAN, launch_identity.LaunchIdentity(rank, 6, None), None)
        mesh = PLAN.meshes[c.mesh_index]
        assert rewrite.validation_world_size(PLAN, c) // (mesh.tp * PLAN.pipeline_parallel_size) == dp


# ---- model arguments ---------------------------------------------------------------------------------------
def ns(**kw):
    base = dict(num_layers=None, hidden_size=None, num_attention_heads=None, ffn_hidden_size=None, seq_length=None,
                group_query_attention=False, num_query_groups=None, context_parallel_size=1, num_experts=None,
                mock_data=True, lr=1e-3, train_iters=1)
    base.update(kw)
    return argparse.Namespace(**base)


def test_model_args_are_filled_from_the_plan():
    fill = model_checks.check_model_args(ns(), PLAN)
    assert fill == {"num_layers": 8, "hidden_size": 64, "num_attention_heads": 4, "ffn_hidden_size": 256,
                    "seq_length": 32, "group_query_attention": True, "num_query_groups": 2,
                    "max_position_embeddings": 32}
    assert model_checks.check_model_args(ns(num_layers=8, hidden_size=64, group_query_attention=True,
                                       num_query_groups=2, max_position_embeddings=32), PLAN) == {
        "num_attention_heads": 4, "ffn_hidden_size": 256, "seq_length": 32}


def test_model_args_that_contradict_the_plan_are_listed():
    with pytest.raises(InputError) as exc:
        model_checks.check_model_args(ns(num_layers=12, hidden_size=64, group_query_attention=True, num_query_groups=4),
                                 PLAN, file="plan.yaml")
    msg = exc.value.message
    assert "--num-layers 12 (plan: 8)" in msg and "--num-query-groups 4 (plan: 2)" in msg
    assert msg.startswith("plan.yaml: field 'model'")
    with pytest.raises(InputError, match=r"--kv-channels 32 \(plan: heads of 16"):     # 64 hidden / 4 heads
        model_checks.check_model_args(ns(kv_channels=32), PLAN)
    assert "kv_channels" not in model_checks.check_model_args(ns(kv_channels=16), PLAN)


def test_a_rotary_model_trained_past_its_config_length_passes_megatrons_validation(monkeypatch, tmp_path):
    """LLaMA's config gives 4,096 positions; trained at --seq-length 8192 (here: the tiny model's 32 at 64) the
    launch must carry --max-position-embeddings >= the sequence, or Megatron's validate_args stops every rank with
    an AssertionError. The emitted arguments, rewritten per rank, pass Megatron's own validation."""
    from hetauto_megatron.emit.megatron import model_args
    from hetauto_megatron.spec.model import load_model

    model_file = tmp_path / "model.yaml"
    model_file.write_text("preset: tiny\nmax_position_embeddings: 32\n")   # as examples/llama/models/*.yaml
    spec = load_model(str(model_file), seq_length=64)
    plan = plan_from_dict({"version": 1, "model": spec.to_dict(), "global_batch_size": 8, "meshes": [
        {"cluster": "a", "device_type": "cpu", "tp": 1, "dp": 2, "micro_batch_size": 1, "stage_layers": [8]}]})
    for rank in range(plan.world_size):
        margs, args = _megatron_args(monkeypatch, [*model_args(plan), "--vocab-size", "128"], model=None)
        c = launch_identity.check_launch(plan, launch_identity.LaunchIdentity(rank, plan.world_size, None), None)
        rewrite.rewrite_args(args, plan, c)
        margs.validate_args(args, {})
        assert args.seq_length == 64 <= args.max_position_embeddings
    # a hand-written launch that keeps the config's 32 is refused before Megatron's assertion, naming the flag
    margs, args = _megatron_args(monkeypatch, ["--seq-length", "64", "--max-position-embeddings", "32"])
    with pytest.raises(InputError) as exc:
        rewrite.rewrite_args(args, plan, launch_identity.check_launch(plan, launch_identity.LaunchIdentity(0, 2, None), None),
                             file="plan.yaml")
    assert "--max-position-embeddings 32, shorter than the plan's sequence of 64 tokens" in exc.value.message


def test_the_sequence_as_encoder_seq_length_passes_megatrons_validation_or_is_refused(monkeypatch):
    """--encoder-seq-length is Megatron's other spelling of --seq-length (validate_args copies it, and asserts that
    not both are given): the hook filled in --seq-length beside it, and every rank stopped with an AssertionError
    traceback. The plan's value passes Megatron's own validation; another, or both flags, are one paragraph."""
    from hetauto_megatron.emit.megatron import model_args
    c = launch_identity.check_launch(PLAN, launch_identity.LaunchIdentity(0, PLAN.world_size, None), None)
    argv = model_args(PLAN)
    i = argv.index("--seq-length")
    without_seq = argv[:i] + argv[i + 2:]
    margs, args = _megatron_args(monkeypatch, [*without_seq, "--vocab-size", "128", "--encoder-seq-length",
                                               str(PLAN.model.seq_length)], model=None)
    rewrite.rewrite_args(args, PLAN, c)
    margs.validate_args(args, {})
    assert args.seq_length == PLAN.model.seq_length
    for extra, words in (([*without_seq, "--encoder-seq-length", str(2 * PLAN.model.seq_length)],
                          f"--encoder-seq-length {2 * PLAN.model.seq_length} (plan: {PLAN.model.seq_length})"),
                         ([*argv, "--encoder-seq-length", str(PLAN.model.seq_length)], "drop --encoder-seq-length")):
        _, args = _megatron_args(monkeypatch, [*extra, "--vocab-size", "128"], model=None)
        with pytest.raises(InputError) as exc:
            rewrite.rewrite_args(args, PLAN, c, file="plan.yaml")
        assert words in exc.value.message


def test_a_launch_without_the_plans_architecture_flags_is_refused_naming_each(monkeypatch):
    """Megatron's defaults are GPT-2's: a LLaMA plan (gated MLP, rotary, untied head) launched with only the
    shapes would train another model, with more parameters than were priced. Each missing flag is named; the
    emitted arguments pass. A GPT-3-style plan (plain MLP, learned positions, tied head) needs none of them."""
    from hetauto_megatron.emit.megatron import model_args

    margs, args = _megatron_args(monkeypatch, ["--vocab-size", "128"], model=None)
    c = launch_identity.check_launch(PLAN, launch_identity.LaunchIdentity(0, PLAN.world_size, None), None)
    with pytest.raises(InputError) as exc:
        rewrite.rewrite_args(args, PLAN, c, file="plan.yaml")
    msg = exc.value.message
    for flag in ("add --swiglu", "add --normalization RMSNorm", "add --disable-bias-linear",
                 "add --position-embedding-type rope", "add --untie-embeddings-and-output-weights"):
        assert flag in msg, flag
    assert msg.startswith("plan.yaml: field 'model'") and "hetauto emit megatron" in msg
    margs, args = _megatron_args(monkeypatch, [*model_args(PLAN), "--vocab-size", "128"], model=None)
    rewrite.rewrite_args(args, PLAN, c)
    margs.validate_args(args, {})
    assert args.swiglu and args.normalization == "RMSNorm" and not args.add_bias_linear

    gpt = make_plan([{"cluster": "a", "device_type": "cpu", "tp": 1, "dp": 1, "micro_batch_size": 1,
                      "stage_layers": [8]}], model="tiny")
    gpt = plan_from_dict({**gpt.to_dict(), "model": PRESETS["tiny"].replace(
        gated_mlp=False, position_embedding="learned", tie_embeddings=True).to_dict()})
    margs, args = _megatron_args(monkeypatch, ["--vocab-size", "128", "--swiglu"], model=None)
    with pytest.raises(InputError, match="Megatron's default: leave the flag out"):
        rewrite.rewrite_args(args, gpt, launch_identity.check_launch(gpt, launch_identity.LaunchIdentity(0, 1, None), None))
    margs, args = _megatron_args(monkeypatch, ["--vocab-size", "128"], model=None)
    rewrite.rewrite_args(args, gpt, launch_identity.check_launch(gpt, launch_identity.LaunchIdentity(0, 1, None), None))
    margs.validate_args(args, {})
    assert model_args(gpt)[-2:] == ["--position-embedding-type", "learned_absolute"]
    # a plain MLP without linear biases (Falcon, Nemotron): built by Megatron without them, or refused
    falcon = plan_from_dict({**gpt.to_dict(), "model": {**gpt.model.to_dict(), "linear_biases": False}})
    identity = launch_identity.check_launch(falcon, launch_identity.LaunchIdentity(0, 1, None), None)
    margs, args = _megatron_args(monkeypatch, ["--vocab-size", "128"], model=None)
    with pytest.raises(InputError, match="add --disable-bias-linear"):
        rewrite.rewrite_args(args, falcon, identity)
    assert "--disable-bias-linear" in model_args(falcon) and "--swiglu" not in model_args(falcon)
    margs, args = _megatron_args(monkeypatch, [*model_args(falcon), "--vocab-size", "128"], model=None)
    rewrite.rewrite_args(args, falcon, identity)
    margs.validate_args(args, {})
    assert not args.add_bias_linear and not args.swiglu and args.normalization == "LayerNorm"


def test_a_tokenizer_larger_than_the_plans_vocabulary_is_refused_when_megatron_builds_it(monkeypatch):
    """Megatron-Core's own tokenizer, built by Megatron's own global_vars as initialize_megatron does: more tokens
    than the plan's 128 (a LLaMA-3 tokenizer on a LLaMA-2 plan) would index past the embedding table; fewer runs."""
    import megatron.training.global_vars as global_vars

    from hetauto_megatron.megatron import training_inputs

    monkeypatch.setattr(global_vars, "build_tokenizer", global_vars.build_tokenizer)     # restored afterwards
    monkeypatch.setattr(global_vars, "_GLOBAL_TOKENIZER", None)
    training_inputs.check_tokenizer_when_built(PLAN, "plan.yaml")
    training_inputs.check_tokenizer_when_built(PLAN, "plan.yaml")    # a second --hetauto parse wraps Megatron's once
    for tokens in (128, 100, 200):
        _, args = _megatron_args(monkeypatch, ["--vocab-size", str(tokens)])
        args.rank, args.padded_vocab_size = 0, PLAN.padded_vocab_size      # as the rewrite sets them
        if tokens <= 128:
            assert global_vars.rebuild_tokenizer(args).vocab_size == tokens
            continue
        with pytest.raises(InputError) as exc:
            global_vars.rebuild_tokenizer(args)
        assert exc.value.field == "model.vocab_size"
        assert "the tokenizer has 200 tokens, more than the 128" in str(exc.value)
    monkeypatch.setattr(global_vars, "_GLOBAL_TOKENIZER", None)


def test_rewrite_rejects_context_parallel_and_experts():
    c = launch_identity.check_launch(PLAN, launch_identity.LaunchIdentity(0, 6, None), None)
    with pytest.raises(InputError, match="context-parallel"):
        rewrite.rewrite_args(ns(context_parallel_size=2), PLAN, c)
    with pytest.raises(InputError, match="mixture-of-experts"):
        rewrite.rewrite_args(ns(num_experts=8), PLAN, c)


def test_megatron_features_the_plan_does_not_price_are_refused_through_megatrons_parser(monkeypatch):
    """Each feature of the table, typed as a user would and parsed by Megatron's own parser, is refused by name
    before Megatron validates anything (before: it trained a job the plan never priced, e.g. Megatron FSDP, or
    stopped every rank with one of Megatron's assertions); the table's defaults are Megatron's own (an argument
    left out is not refused). The legacy spellings that Megatron's validate_args turns into checked settings after
    the rewrite: --recompute-activations where the plan runs another recomputation, --use-rotary-position-embeddings
    on a plan of learned positions, are refused."""
    import megatron.training.arguments as margs

    from hetauto_megatron.megatron.unpriced import UNPRICED
    typed = {"context_parallel_size": ["2"], "num_experts": ["8"], "mtp_num_layers": ["1"],
             "expert_model_parallel_size": ["2"], "num_distributed_optimizer_instances": ["2"],
             "hybrid_override_pattern": ["M*"], "hybrid_layer_pattern": ["M*"],
             "heterogeneous_layers_config_path": ["x.json"], "heterogeneous_layers_config_encoded_json": ["{}"],
             "experimental_attention_variant": ["gated_delta_net"], "window_size": ["128,0"],
             "num_layers_per_virtual_pipeline_stage": ["1"], "num_virtual_stages_per_pipeline_rank": ["2"],
             "main_grads_dtype": ["bf16"], "main_params_dtype": ["fp16"], "exp_avg_dtype": ["bf16"],
             "exp_avg_sq_dtype": ["bf16"], "optimizer": ["sgd"], "rerun_mode": ["report_stats"],
             "cuda_graph_impl": ["local"], "cpu_offloading_num_layers": ["2"], "fp4": ["e2m1"],
             "empty_unused_memory_level": ["1"], "tensor_parallel_num_weight_shards": ["2"],
             "mlp_chunks_for_training": ["4"], "ddp_param_name_patterns_for_fp32_local_accumulation": ["all"],
             "spec": ["megatron.core.models.gpt.gpt_layer_specs", "get_gpt_layer_local_spec"]}
    base = ["--num-layers", "8", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
            "--mock-data", "--lr", "1e-3", "--train-iters", "1"]

    def parse(*extra):     # as the patched pretrain_gpt.py parses (hetauto's provider marks Megatron's defaults)
        monkeypatch.setattr(sys, "argv", ["pretrain_gpt.py", *base, *extra])
        return margs.parse_args(hetauto_args_provider())

    plan = plan_from_dict({"version": 2, "model": {"preset": "tiny"}, "global_batch_size": 8,
                           "meshes": [{"cluster": "a", "device_type": "cpu", "micro_batch_size": 1, "dp": 2,
                                       "recompute": "full", "stage_layers": [8]}]})
    c = launch_identity.check_launch(plan, launch_identity.LaunchIdentity(0, 2, None), None)
    plain = parse()
    for u in UNPRICED:
        assert getattr(plain, u.dest) == u.default, u
        flag = [u.flag, *typed.get(u.dest, [])]
        with pytest.raises(InputError) as exc:
            rewrite.rewrite_args(parse(*flag), plan, c)
        assert exc.value.field == u.flag and u.flag in str(exc.value), u
    # the result check left out runs nothing the plan's time depends on (one scalar's ring the plan over-prices)
    from hetauto_megatron.emit.megatron import architecture_args
    architecture = [f for a in architecture_args(plan.model) for f in a.flags]
    rewrite.rewrite_args(parse("--rerun-mode", "disabled", *architecture), plan, c)
    # (Megatron's older spelling of selective recomputation: refused where the mesh runs another, as typed
    # --recompute-granularity is, test_a_launch_that_asks_for_another_recomputation_or_split_is_refused)
    with pytest.raises(InputError, match=r"--recompute-activations \(plan: recompute full "):
        rewrite.rewrite_args(parse("--recompute-activations", *architecture), plan, c)
    learned = plan_from_dict({"version": 2, "global_batch_size": 8, "model": {
        "preset": "tiny", "position_embedding": "learned", "gated_mlp": False},
        "meshes": [{"cluster": "a", "device_type": "cpu", "micro_batch_size": 1, "dp": 2, "stage_layers": [8]}]})
    with pytest.raises(InputError, match="--use-rotary-position-embeddings"):
        model_checks.check_model_args(parse("--use-rotary-position-embeddings"), learned)


def test_rewrite_through_megatrons_own_parser_and_validation(monkeypatch):
    """Every rank's rewritten arguments pass Megatron's real validate_args and give its mesh's DP degree and
    the same number of micro-batches everywhere."""
    import megatron.training.arguments as margs

    from hetauto_megatron.megatron import cpu

    # validate_args queries the GPU architecture when TP > 1; the training-loop redirections answer it.
    # (Megatron-Core's process-wide CUDA redirections are not needed for parsing and are not applied here.)
    monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", "1")
    cpu.apply()
    plan = load_plan(PLAN_FILE)
    for rank in range(plan.world_size):
        # the rank's own mesh's TP and micro-batch as its cluster's launch script gives them (another layout typed
        # is refused: test_a_launch_that_asks_for_another_layout_is_refused)
        here = plan.meshes[launch_identity.check_launch(plan, launch_identity.LaunchIdentity(rank, plan.world_size,
                                                                                           None), None).mesh_index]
        monkeypatch.setattr(sys, "argv", ["x", "--hetauto", "--hetauto-plan", PLAN_FILE, "--micro-batch-size",
                                          str(here.micro_batch_size), "--tensor-model-parallel-size", str(here.tp),
                                          "--tokenizer-type", "NullTokenizer",
                                          "--vocab-size", "128", "--max-position-embeddings", "32",
                                          "--transformer-impl", "local", "--no-gradient-accumulation-fusion",
                                          "--no-persist-layer-norm", "--mock-data", "--train-iters", "1",
                                          "--lr", "1e-3", "--swiglu", "--normalization", "RMSNorm",
                                          "--disable-bias-linear", "--position-embedding-type", "rope",
                                          "--untie-embeddings-and-output-weights"])
        args = margs.parse_args(hetauto_args_provider())
        c = launch_identity.check_launch(plan, launch_identity.LaunchIdentity(rank, plan.world_size, None), None)
        rewrite.rewrite_args(args, plan, c)
        margs.validate_args(args, {})
        mesh = plan.meshes[c.mesh_index]
        assert args.tensor_model_parallel_size == mesh.tp
        assert args.data_parallel_size == mesh.dp
        assert args.micro_batch_size == mesh.micro_batch_size
        assert args.global_batch_size // (args.micro_batch_size * args.data_parallel_size) == plan.num_micro_batches
        assert args.pipeline_model_parallel_layout == "Et*3|t*2|t*3L"
        assert args.num_layers == 8 and args.num_query_groups == 2


def test_a_launch_that_asks_for_another_layout_is_refused(monkeypatch):
    """--tensor-model-parallel-size 4, --micro-batch-size 7, --pipeline-model-parallel-size 5 or an interleaved
    schedule typed on a launch were replaced by the plan's without a word: a launch that does not match the plan is
    one paragraph naming each (exit 2). Each mesh's own values, as its launch script gives them, pass."""
    from hetauto_megatron.emit.megatron import model_args, pipeline_args, plan_mesh_args
    plan = load_plan(PLAN_FILE)
    c = launch_identity.check_launch(plan, launch_identity.LaunchIdentity(0, plan.world_size, None), None)
    emitted = [*pipeline_args(plan), *model_args(plan), *plan_mesh_args(plan, c.mesh_index), "--vocab-size", "128"]
    _, args = _megatron_args(monkeypatch, emitted, model=None)
    rewrite.rewrite_args(args, plan, c)
    for typed, words in ((["--tensor-model-parallel-size", "4"], "--tensor-model-parallel-size 4 (plan: "),
                         (["--micro-batch-size", "7"], "--micro-batch-size 7 (plan: "),
                         (["--pipeline-model-parallel-size", "5"], "--pipeline-model-parallel-size 5 (plan: "),
                         (["--num-layers-per-virtual-pipeline-stage", "1"], "interleaved schedule")):
        _, args = _megatron_args(monkeypatch, [*emitted, *typed], model=None)
        with pytest.raises(InputError) as exc:
            rewrite.rewrite_args(args, plan, c, file="plan.yaml")
        assert words in exc.value.message and exc.value.exit_code == 2, exc.value.message


def test_a_launch_that_asks_for_another_recomputation_or_split_is_refused(monkeypatch):
    """A recomputation no mesh of the rank's cluster runs, or a pipeline split other than the plan's, typed on a
    launch, was replaced by the plan's without a word (the audit's --recompute-granularity full --recompute-method
    block --recompute-num-layers 2): one paragraph naming each (exit 2), as for TP. What the plan runs there passes,
    typed as its launch script types it or spelt otherwise (the layout as Megatron reads it)."""
    from helpers import mesh

    from hetauto_megatron.emit.megatron import megatron_args
    plan = make_plan([mesh("a", 1, 1, 1, [2, 1], "full"), mesh("a", 1, 1, 1, [1], "selective"),
                      mesh("b", 1, 1, 1, [4])], gbs=4)
    for rank, mesh_index in ((0, 0), (2, 1), (3, 2)):       # the launch of cluster a types mesh 0's flags
        c = launch_identity.check_launch(plan, launch_identity.LaunchIdentity(rank, plan.world_size, None), None)
        _, args = _megatron_args(monkeypatch, megatron_args(plan, 0 if rank < 3 else 2, "plan.yaml"), model=None)
        rewrite.rewrite_args(args, plan, c)
        assert args.recompute_granularity == {0: "full", 1: "selective", 2: None}[mesh_index]
    a0 = launch_identity.check_launch(plan, launch_identity.LaunchIdentity(0, plan.world_size, None), None)
    emitted, plain = megatron_args(plan, 0, "plan.yaml"), megatron_args(plan, 2, "plan.yaml")   # (b's: no recompute)
    for typed in (["--recompute-activations"], ["--recompute-granularity", "selective", "--recompute-modules", "mlp"],
                  ["--pipeline-model-parallel-layout", "Ett|t|t|ttttL"], ["--decoder-first-pipeline-num-layers", "2"],
                  ["--decoder-last-pipeline-num-layers", "4"]):
        _, args = _megatron_args(monkeypatch, [*plain, *typed], model=None)
        rewrite.rewrite_args(args, plan, a0)
    for typed, words in (
            (["--recompute-method", "block", "--recompute-num-layers", "2"],
             "--recompute-granularity full --recompute-method block --recompute-num-layers 2 (plan: recompute full "
             "(--recompute-granularity full --recompute-method uniform --recompute-num-layers 1) or selective "
             "(--recompute-granularity selective --recompute-modules mlp) on cluster a)"),
            (["--recompute-modules", "core_attn"], "--recompute-modules core_attn (plan: recompute full"),
            (["--pipeline-model-parallel-layout", "Et|tt|t|ttttL"],
             "--pipeline-model-parallel-layout Et|tt|t|ttttL (plan: Et*2|t|t|t*4L, stage layers [2, 1, 1, 4])"),
            (["--decoder-first-pipeline-num-layers", "3"],
             "--decoder-first-pipeline-num-layers 3 (plan: 2 layers on the first stage"),
            (["--decoder-last-pipeline-num-layers", "2"], "--decoder-last-pipeline-num-layers 2 (plan: 4 layers on"),
            (["--account-for-embedding-in-pipeline-split"], "--account-for-embedding-in-pipeline-split (plan: stage "
             "layers [2, 1, 1, 4], the embedding not counted as a layer)"),
            (["--account-for-loss-in-pipeline-split"], "--account-for-loss-in-pipeline-split (plan: ")):
        _, args = _megatron_args(monkeypatch, [*emitted, *typed], model=None)
        with pytest.raises(InputError) as exc:
            rewrite.rewrite_args(args, plan, a0, file="plan.yaml")
        assert words in exc.value.message and exc.value.exit_code == 2, exc.value.message
    # cluster b runs no recomputation: mesh 0's flags typed on its launch are refused
    b = launch_identity.check_launch(plan, launch_identity.LaunchIdentity(3, plan.world_size, None), None)
    _, args = _megatron_args(monkeypatch, [*megatron_args(plan, 2, "plan.yaml"), "--recompute-granularity", "full"],
                             model=None)
    with pytest.raises(InputError, match=r"--recompute-granularity full \(plan: recompute none on cluster b\)"):
        rewrite.rewrite_args(args, plan, b)
    # the layouts compared as Megatron-Core reads them
    from megatron.core.transformer.enums import LayerType
    from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout
    letter = {LayerType.embedding: "E", LayerType.decoder: "t", LayerType.loss: "L"}
    for text in ("Et*2|t|t|t*4L", "(Et*2|)*1,t*2L", "E|(tt|)*3,L", "Ett|t|t|ttttL"):
        assert rewrite._layout_stages(text) == ["".join(letter[kind] for kind in stage) for stage in
                                                PipelineParallelLayerLayout.parse_str_to_list(text)], text


# ---- version ---------------------------------------------------------------------------------------------
def test_installed_megatron_core_is_supported():
    assert check_megatron_version() == megatron_core_version()


@pytest.mark.parametrize("version", ["0.18.1", "0.20.0", "1.0", "dev"])
def test_unsupported_megatron_core_fails_clearly(version):
    with pytest.raises(InputError) as exc:
        check_megatron_version(version)
    assert f"megatron-core {version} is not supported" in exc.value.message and "0.19" in exc.value.message


def test_recompute_settings_are_the_emitted_ones():
    """The per-rank rewrite (and the dry run's model) use exactly the settings the launch scripts emit, which
    are what the cost model priced: selective = the MLP, full = every layer, uniform, one per checkpoint."""
    from hetauto_megatron.emit.megatron import recompute_args
    from hetauto_megatron.plan.plan import RECOMPUTE_SETTINGS

    for mode, settings in RECOMPUTE_SETTINGS.items():
        emitted, flag = {}, None
        for token in recompute_args(mode):
            if token.startswith("--"):
                flag = token[2:].replace("-", "_")
                emitted[flag] = []
            else:
                emitted[flag].append(token)
        ours = {k: [str(x) for x in (v if isinstance(v, list) else [v])] for k, v in settings.items() if v is not None}
        assert ours == emitted, mode


def test_checkpoints_of_mixed_tp_plans_need_the_torch_format():
    c = launch_identity.check_launch(PLAN, launch_identity.LaunchIdentity(0, 6, None), None)
    for fmt in ("torch_dist", "fsdp_dtensor"):
        with pytest.raises(InputError) as exc:
            rewrite.rewrite_args(ns(save="ck", load=None, ckpt_format=fmt), PLAN, c, file="plan.yaml")
        assert exc.value.field == "--ckpt-format" and "different TP sizes (1, 2)" in exc.value.reason
        assert "--ckpt-format torch" in exc.value.fix
    with pytest.raises(InputError):
        rewrite.rewrite_args(ns(save=None, load="ck", ckpt_format="torch_dist"), PLAN, c)
    rewrite.rewrite_args(ns(save="ck", load="ck", ckpt_format="torch"), PLAN, c)
    rewrite.rewrite_args(ns(save=None, load=None, ckpt_format="torch_dist"), PLAN, c)  # no checkpoints: fine
    same_tp = make_plan([{"cluster": "a", "device_type": "cpu", "tp": 2, "dp": 1, "micro_batch_size": 2,
                          "stage_layers": [4]},
                         {"cluster": "b", "device_type": "cpu", "tp": 2, "dp": 1, "micro_batch_size": 2,
                          "stage_layers": [4]}])
    rewrite.rewrite_args(ns(save="ck", load=None, ckpt_format="torch_dist"), same_tp,
                         launch_identity.check_launch(same_tp, launch_identity.LaunchIdentity(0, 4, None), None))


# ---- runtime settings, precision and vocabulary from the plan (plan/settings.py, plan/megatron_flags.py) ----
def _megatron_args(monkeypatch, extra=(), impl=None, model=PRESETS["tiny"], data=("--mock-data",)):
    """Megatron-LM's own parser on a CPU-friendly command line with `model`'s architecture flags (None: none),
    `data` (the dataset's flags), plus `extra`."""
    import megatron.training.arguments as margs

    from hetauto_megatron.emit.megatron import architecture_args
    from hetauto_megatron.megatron import cpu

    monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", "1")
    cpu.apply()
    monkeypatch.setattr(sys, "argv", ["x", "--tokenizer-type", "NullTokenizer", "--vocab-size", "128",
                                      "--max-position-embeddings", "32",
                                      *(["--transformer-impl", impl] if impl else []),
                                      "--no-persist-layer-norm", *data, "--train-iters", "1", "--lr", "1e-3",
                                      *[f for a in (architecture_args(model) if model else []) for f in a.flags],
                                      *extra])
    return margs, margs.parse_args(hetauto_args_provider())


TIED_50257 = [     # accelerator meshes: the rewrite needs no device, Megatron's parser none either
    {"cluster": "a", "device_type": "h800", "tp": 1, "dp": 2, "micro_batch_size": 1, "stage_layers": [4]},
    {"cluster": "b", "device_type": "mi300x", "tp": 2, "dp": 1, "micro_batch_size": 2, "stage_layers": [4],
     "settings": {"overlap_param_gather": False, "grad_reduce_dtype": "param"}},
]


def test_rewrite_sets_the_plans_settings_and_one_padded_vocabulary(monkeypatch):
    """Every rank gets its mesh's settings and the plan's precision as Megatron's own flags, and Megatron's own
    vocabulary padding (vocab_size_with_padding, which pads to make_vocab_size_divisible_by x TP) gives the
    same table on TP 1 and TP 2: 50257 -> 50432 (alone Megatron would pad to 50304 at TP 1)."""
    from megatron.core.tokenizers.utils.build_tokenizer import vocab_size_with_padding

    d = {"version": 2, "model": PRESETS["tiny"].replace(vocab_size=50257, tie_embeddings=True).to_dict(),
         "global_batch_size": 8, "meshes": TIED_50257}
    plan = plan_from_dict(d)
    assert plan.padded_vocab_size == 50432
    sizes = set()
    for rank in range(plan.world_size):
        margs, args = _megatron_args(monkeypatch, ["--vocab-size", "50257"], model=plan.model)
        c = launch_identity.check_launch(plan, launch_identity.LaunchIdentity(rank, plan.world_size, None), None)
        rewrite.rewrite_args(args, plan, c)
        margs.validate_args(args, {})
        s = plan.meshes[c.mesh_index].settings
        assert (args.sequence_parallel, args.use_distributed_optimizer, args.overlap_grad_reduce,
                args.overlap_param_gather) == (s.sequence_parallel, s.distributed_optimizer, s.overlap_grad_reduce,
                                               s.overlap_param_gather)
        assert args.bf16 and not args.fp16 and args.fp8 is None
        # fp32 gradient reduction is Megatron's bf16 default; mesh b reduces in the training precision
        assert args.accumulate_allreduce_grads_in_fp32 == (s.grad_reduce_dtype == "fp32")
        assert args.padded_vocab_size == plan.padded_vocab_size
        args.padded_vocab_size = None          # what Megatron's tokenizer set-up would compute on this rank
        sizes.add(vocab_size_with_padding(50257, args, logging_enabled=False))
    assert sizes == {50432}
    assert plan.meshes[0].settings.sequence_parallel is False and plan.meshes[1].settings.sequence_parallel


def test_a_vocabulary_divisor_that_builds_another_table_is_refused(monkeypatch):
    """The plan priced one padded table (50257 -> 50432 at TP 1 and 2); Megatron's divisor 64 would build 50304
    rows at TP 1 (its own vocab_size_with_padding, asked below): refused in one paragraph naming the flag. The
    default 128, and the divisor the hook itself writes (which reproduces the table on the rank's TP), run."""
    from megatron.core.tokenizers.utils.build_tokenizer import vocab_size_with_padding

    d = {"version": 2, "model": PRESETS["tiny"].replace(vocab_size=50257, tie_embeddings=True).to_dict(),
         "global_batch_size": 8, "meshes": TIED_50257}
    plan = plan_from_dict(d)
    c = launch_identity.check_launch(plan, launch_identity.LaunchIdentity(0, plan.world_size, None), None)
    margs, args = _megatron_args(monkeypatch, ["--vocab-size", "50257", "--make-vocab-size-divisible-by", "64"],
                                 model=plan.model)
    alone = vocab_size_with_padding(50257, args, logging_enabled=False)
    with pytest.raises(InputError) as exc:
        rewrite.rewrite_args(args, plan, c)
    assert exc.value.field == "--make-vocab-size-divisible-by" and f"{alone} rows" in str(exc.value)
    assert str(plan.padded_vocab_size) in str(exc.value)
    for divisor in ("128", str(plan.padded_vocab_size // plan.meshes[c.mesh_index].tp)):
        margs, args = _megatron_args(monkeypatch, ["--vocab-size", "50257", "--make-vocab-size-divisible-by",
                                                   divisor], model=plan.model)
        rewrite.rewrite_args(args, plan, c)
        assert args.padded_vocab_size == plan.padded_vocab_size


def test_a_model_padded_by_another_divisor_is_priced_and_built_with_it(monkeypatch):
    """A model file with make_vocab_size_divisible_by: 1 (a checkpoint converted from Hugging Face): the plan pads
    50257 to a multiple of 1 x TP for TP 1 and 2, 50258 rows; the emitted arguments pass the divisor; every rank of
    the --hetauto run builds what Megatron's own padding (vocab_size_with_padding) computes from the hook's
    arguments, the plan's size; the cost model prices that table (simulate's padded model); the divisor survives
    the plan file. The divisor 1 on the command line is the plan's and runs; 128, Megatron's default, runs too."""
    from megatron.core.tokenizers.utils.build_tokenizer import vocab_size_with_padding

    from hetauto_megatron.emit.megatron import model_args
    from hetauto_megatron.plan.simulate import padded_model, plan_choices

    model = PRESETS["tiny"].replace(vocab_size=50257, tie_embeddings=True, make_vocab_size_divisible_by=1)
    plan = plan_from_dict({"version": 2, "model": model.to_dict(), "global_batch_size": 8, "meshes": TIED_50257})
    assert plan.model.make_vocab_size_divisible_by == 1 == plan_from_dict(plan.to_dict()).model.make_vocab_size_divisible_by
    assert padded_model(plan.model, plan_choices(plan)).vocab_size == plan.padded_vocab_size
    flags = model_args(plan)
    assert flags[flags.index("--make-vocab-size-divisible-by") + 1] == "1"
    sizes = set()
    for rank in range(plan.world_size):
        c = launch_identity.check_launch(plan, launch_identity.LaunchIdentity(rank, plan.world_size, None), None)
        for given in ([], ["--make-vocab-size-divisible-by", "1"]):
            margs, args = _megatron_args(monkeypatch, ["--vocab-size", "50257", *given], model=plan.model)
            rewrite.rewrite_args(args, plan, c)
            args.padded_vocab_size = None      # what Megatron's tokenizer set-up would compute on this rank
            sizes.add(vocab_size_with_padding(50257, args, logging_enabled=False))
    assert sizes == {plan.padded_vocab_size} == {50258}
    assert PRESETS["tiny"].to_dict() == plan_from_dict({"version": 2, "model": PRESETS["tiny"].to_dict(),
                                                        "global_batch_size": 8, "meshes": TIED_50257}).model.to_dict()
    assert "make_vocab_size_divisible_by" not in PRESETS["tiny"].to_dict()     # files written before stay the same


def test_flags_that_contradict_the_plan_are_refused_naming_both(monkeypatch):
    plan = plan_from_dict({"version": 2, "model": PRESETS["tiny"].to_dict(), "global_batch_size": 8, "meshes": [
        {"cluster": "a", "device_type": "h800", "tp": 2, "dp": 1, "micro_batch_size": 2, "stage_layers": [8],
         "settings": {"sequence_parallel": False, "distributed_optimizer": False, "overlap_param_gather": False}}]})
    c = launch_identity.check_launch(plan, launch_identity.LaunchIdentity(0, 2, None), None)
    # flags the plan runs anyway, or leaves off without being told: filled in, no error
    _, args = _megatron_args(monkeypatch, ["--bf16", "--overlap-grad-reduce"])
    rewrite.rewrite_args(args, plan, c)
    assert args.sequence_parallel is False and args.use_distributed_optimizer is False and args.overlap_grad_reduce
    for flags, field, needle in [
        (["--sequence-parallel"], "meshes[0].settings.sequence_parallel",
         "--sequence-parallel (plan: meshes[0].settings.sequence_parallel is false)"),
        (["--use-distributed-optimizer"], "meshes[0].settings.distributed_optimizer", "--use-distributed-optimizer"),
        (["--fp16"], "precision", "--fp16 (plan: precision is bf16)"),
        (["--fp8-format", "e4m3"], "precision", "--fp8-format e4m3 (plan: precision is bf16)"),
        (["--grad-reduce-in-bf16"], "meshes[0].settings.grad_reduce_dtype", "grad_reduce_dtype is fp32"),
    ]:
        _, args = _megatron_args(monkeypatch, flags)
        with pytest.raises(InputError) as exc:
            rewrite.rewrite_args(args, plan, c, file="plan.yaml")
        assert exc.value.field == field and needle in exc.value.message, exc.value.message
        assert exc.value.exit_code == 2


def test_a_setting_only_another_cluster_runs_is_refused_on_this_clusters_launch(monkeypatch):
    """The audit's launch: cluster b's command line carrying cluster a's settings (--use-distributed-optimizer,
    --overlap-param-gather, a dropout), which b's mesh runs without. Judged against every mesh of the plan they
    passed, and b's ranks trained without them without a word; now they are judged against the meshes of the rank's
    own cluster, as TP is: refused naming each (exit 2). On cluster a, and with b's own flags on b, they pass."""
    plan = plan_from_dict({"version": 2, "model": PRESETS["tiny"].to_dict(), "global_batch_size": 8, "meshes": [
        {"cluster": "a", "device_type": "h800", "tp": 2, "dp": 1, "micro_batch_size": 4, "stage_layers": [4],
         "settings": {"hidden_dropout": 0.1}},
        {"cluster": "b", "device_type": "h800", "tp": 1, "dp": 2, "micro_batch_size": 2, "stage_layers": [4],
         "settings": {"sequence_parallel": False, "distributed_optimizer": False, "overlap_param_gather": False}}]})
    from hetauto_megatron.emit.megatron import plan_mesh_args
    a_flags = plan_mesh_args(plan, 0)
    assert "--use-distributed-optimizer" in a_flags and "--overlap-param-gather" in a_flags
    a = launch_identity.check_launch(plan, launch_identity.LaunchIdentity(0, 4, None), None)
    b = launch_identity.check_launch(plan, launch_identity.LaunchIdentity(2, 4, None), None)
    _, args = _megatron_args(monkeypatch, a_flags)
    rewrite.rewrite_args(args, plan, a)
    assert args.use_distributed_optimizer and args.overlap_param_gather
    _, args = _megatron_args(monkeypatch, plan_mesh_args(plan, 1))
    rewrite.rewrite_args(args, plan, b)
    # (cluster a's TP and micro-batch left out: those are refused on b already, rewrite.check_layout_args)
    settings = [f for f in a_flags if f in ("--use-distributed-optimizer", "--overlap-param-gather")]
    _, args = _megatron_args(monkeypatch, [*plan_mesh_args(plan, 1), *settings, "--hidden-dropout", "0.1"])
    with pytest.raises(InputError) as exc:
        rewrite.rewrite_args(args, plan, b, file="plan.yaml")
    assert exc.value.field == "meshes[1].settings.distributed_optimizer", exc.value.message
    for needle in ("--use-distributed-optimizer (plan: meshes[1].settings.distributed_optimizer is false)",
                   "--overlap-param-gather (plan: meshes[1].settings.overlap_param_gather is false)",
                   "--hidden-dropout 0.1 (plan: meshes[1].settings.hidden_dropout is 0.0)"):
        assert needle in exc.value.message, exc.value.message


def test_sequence_parallel_given_for_a_plan_of_tp_1_passes_and_megatron_turns_it_off(monkeypatch):
    """NVIDIA's example launch scripts pass --sequence-parallel whatever the TP (Megatron-LM's
    examples/llama/train_llama3_8b_h100_fp8.sh at TP 1: "Always enable sequence parallelism with TP_SIZE=2"), and
    Megatron's validate_args turns it off where TP is 1: on a plan whose meshes are all TP 1 the flag builds what the
    plan prices. Before, it was refused there as a flag no mesh runs; a mesh of TP 2 told sequence_parallel: false
    still refuses it (above)."""
    plan = plan_from_dict({"version": 2, "model": PRESETS["tiny"].to_dict(), "global_batch_size": 8, "meshes": [
        {"cluster": "a", "device_type": "h800", "tp": 1, "dp": 1, "micro_batch_size": 2, "stage_layers": [8]}]})
    margs, args = _megatron_args(monkeypatch, ["--sequence-parallel"])
    rewrite.rewrite_args(args, plan, launch_identity.check_launch(plan, launch_identity.LaunchIdentity(0, 1, None),
                                                                  None))
    margs.validate_args(args, {})
    assert args.sequence_parallel is False and args.tensor_model_parallel_size == 1
    # beside a mesh of TP 2 of the rank's cluster, only that mesh can run it: refused on the TP 1 mesh's rank when
    # the TP 2 mesh is told sequence_parallel: false (before, the TP 1 mesh counted as running it and the flag
    # passed, unrun), passed when it runs it. A TP 2 mesh of another cluster is not the rank's: its meshes are all
    # TP 1 there (settings are judged against the rank's own cluster's meshes, as TP is)
    for tp2_cluster, tp2_sp in [("a", False), ("a", True), ("b", False), ("b", True)]:
        mixed = plan_from_dict({"version": 2, "model": PRESETS["tiny"].to_dict(), "global_batch_size": 8, "meshes": [
            {"cluster": "a", "device_type": "h800", "tp": 1, "dp": 1, "micro_batch_size": 2, "stage_layers": [4]},
            {"cluster": tp2_cluster, "device_type": "h800", "tp": 2, "dp": 1, "micro_batch_size": 2,
             "stage_layers": [4], "settings": {"sequence_parallel": tp2_sp}}]})
        for rank in (0, 1):
            _, args = _megatron_args(monkeypatch, ["--sequence-parallel"])
            c = launch_identity.check_launch(mixed, launch_identity.LaunchIdentity(rank, 3, None), None)
            refused = not tp2_sp and (rank == 1 or tp2_cluster == "a")
            if refused:
                with pytest.raises(InputError, match="--sequence-parallel") as exc:
                    rewrite.rewrite_args(args, mixed, c, file="plan.yaml")
                assert exc.value.exit_code == 2
            else:
                rewrite.rewrite_args(args, mixed, c)
                assert args.sequence_parallel is (rank == 1)


def test_a_step_batch_size_schedule_must_end_at_the_plans_batch(monkeypatch):
    """Megatron-Core 0.19's --step-batch-size-schedule (NVIDIA's examples/gpt3/train_gpt3_175b_distributed.sh ramps
    its batch with one) takes the place of --global-batch-size: its last batch must be the plan's, every batch a
    multiple of the pipeline's micro-batch step (DP 2 x micro-batch 2 = 4 samples here). Before, a schedule ending
    at 16 trained at 16 from its last threshold on, a batch the plan never priced; a plan of two pipelines refuses
    the schedule (each mesh's Megatron counts its own share of the batch)."""
    plan = plan_from_dict({"version": 2, "model": PRESETS["tiny"].to_dict(), "global_batch_size": 8, "meshes": [
        {"cluster": "a", "device_type": "h800", "tp": 1, "dp": 2, "micro_batch_size": 2, "stage_layers": [8]}]})
    c = launch_identity.check_launch(plan, launch_identity.LaunchIdentity(0, 2, None), None)
    _, args = _megatron_args(monkeypatch, ["--step-batch-size-schedule", "0:4 2.5K:8"])
    rewrite.rewrite_args(args, plan, c)
    for schedule, needle in [("0:4 1K:16", "ends at a global batch of 16 samples; the plan priced 8"),
                             ("0:2 1K:8", "batches of 2 samples, not multiples of the 4 samples"),
                             ("0:4 soon:8", "entry 'soon:8' is not THRESHOLD:BATCH")]:
        _, args = _megatron_args(monkeypatch, ["--step-batch-size-schedule", schedule])
        with pytest.raises(InputError) as exc:
            rewrite.rewrite_args(args, plan, c, file="plan.yaml")
        assert exc.value.field == "--step-batch-size-schedule" and needle in exc.value.message, exc.value.message
    one = {"cluster": "a", "device_type": "h800", "tp": 1, "dp": 1, "micro_batch_size": 2, "stage_layers": [8]}
    two = plan_from_dict({"version": 3, "model": PRESETS["tiny"].to_dict(), "global_batch_size": 8,
                          "pipelines": [{"samples": 4}, {"samples": 4}], "meshes": [one, {**one, "pipeline": 1}]})
    _, args = _megatron_args(monkeypatch, ["--step-batch-size-schedule", "0:4 1K:8"])
    with pytest.raises(InputError, match="--step-batch-size-schedule is not supported with a plan of several"):
        rewrite.rewrite_args(args, two, launch_identity.check_launch(two, launch_identity.LaunchIdentity(0, 2, None),
                                                                     None))


def test_precision_flags_follow_the_plan(monkeypatch):
    def mesh(device):
        return [{"cluster": "a", "device_type": device, "tp": 1, "dp": 1, "micro_batch_size": 8, "stage_layers": [8]}]
    base = {"version": 2, "model": PRESETS["tiny"].to_dict(), "global_batch_size": 8, "meshes": mesh("h800")}
    for precision, want in [("fp32", (False, False)), ("fp16", (False, True)), ("bf16", (True, False))]:
        plan = plan_from_dict({**base, "precision": precision})
        margs, args = _megatron_args(monkeypatch)
        rewrite.rewrite_args(args, plan, launch_identity.check_launch(plan, launch_identity.LaunchIdentity(0, 1, None), None))
        margs.validate_args(args, {})
        assert (args.bf16, args.fp16) == want, precision
        if precision == "fp16":       # fp16 reduces in fp16 unless told; the plan's default is fp32
            assert args.accumulate_allreduce_grads_in_fp32
    # fp8: Transformer Engine's hybrid format on bf16 parameters
    plan = plan_from_dict({**base, "precision": "fp8"})
    _, args = _megatron_args(monkeypatch)
    rewrite.rewrite_args(args, plan, launch_identity.check_launch(plan, launch_identity.LaunchIdentity(0, 1, None), None))
    assert (args.bf16, args.fp8, args.transformer_impl) == (True, "hybrid", "transformer_engine")
    # the first and last layers in bf16 (Megatron-Core's fp8_utils gives them no fp8 context): not what was priced
    import inspect

    from megatron.core import fp8_utils
    _, args = _megatron_args(monkeypatch, ["--first-last-layers-bf16"])
    assert args.first_last_layers_bf16 and "config.first_last_layers_bf16" in inspect.getsource(fp8_utils)
    with pytest.raises(InputError, match="--first-last-layers-bf16 .plan: precision is fp8"):
        rewrite.rewrite_args(args, plan, launch_identity.check_launch(plan, launch_identity.LaunchIdentity(0, 1, None), None))
    # the weight-gradient GEMMs in bf16 (Megatron-Core's fp8 recipe overrides their precision): refused in fp8, in
    # both of Megatron's spellings; in bf16 no fp8 recipe is built, and the flag runs what the plan priced
    assert "override_linear_precision=(False, False, not config.fp8_wgrad)" in inspect.getsource(fp8_utils)
    rank0 = launch_identity.check_launch(plan, launch_identity.LaunchIdentity(0, 1, None), None)
    for spelling in ("--no-fp8-wgrad", "--disable-fp8-wgrad"):
        _, args = _megatron_args(monkeypatch, [spelling])
        assert args.fp8_wgrad is False
        with pytest.raises(InputError, match="--no-fp8-wgrad .plan: precision is fp8") as exc:
            rewrite.rewrite_args(args, plan, rank0, file="plan.yaml")
        assert exc.value.field == "precision" and exc.value.exit_code == 2
    bf16 = plan_from_dict({**base, "precision": "bf16"})
    margs, args = _megatron_args(monkeypatch, ["--no-fp8-wgrad"])
    rewrite.rewrite_args(args, bf16, launch_identity.check_launch(bf16, launch_identity.LaunchIdentity(0, 1, None),
                                                                  None))
    margs.validate_args(args, {})
    assert args.fp8 is None and args.bf16 and args.fp8_wgrad is False
    # CPU processes (dry runs) train in fp32 whatever the plan's precision: a --bf16 for them is refused
    cpu = {**base, "meshes": mesh("cpu")}
    plan = plan_from_dict(cpu)
    margs, args = _megatron_args(monkeypatch)
    rewrite.rewrite_args(args, plan, launch_identity.check_launch(plan, launch_identity.LaunchIdentity(0, 1, None), None))
    assert not args.bf16 and not args.fp16
    _, args = _megatron_args(monkeypatch, ["--bf16"])
    with pytest.raises(InputError, match="--bf16 .plan: precision is fp32 .a CPU process; the plan says bf16"):
        rewrite.rewrite_args(args, plan, launch_identity.check_launch(plan, launch_identity.LaunchIdentity(0, 1, None), None))
    for device in ("cpu", "a100-80gb"):        # neither has fp8
        plan = plan_from_dict({**base, "meshes": mesh(device), "precision": "fp8"})
        _, args = _megatron_args(monkeypatch)
        with pytest.raises(InputError, match=f"device type {device} .* cannot train in fp8"):
            rewrite.rewrite_args(args, plan, launch_identity.check_launch(plan, launch_identity.LaunchIdentity(0, 1, None), None))


DROPOUT_MESHES = [
    {"cluster": "a", "device_type": "h800", "tp": 1, "dp": 2, "micro_batch_size": 2, "stage_layers": [4],
     "settings": {"hidden_dropout": 0.1, "attention_dropout": 0.05}},
    {"cluster": "b", "device_type": "h800", "tp": 2, "dp": 1, "micro_batch_size": 4, "stage_layers": [4]},
]


def test_dropout_is_emitted_and_rewritten_as_the_memory_model_priced_it(monkeypatch):
    """Each mesh's dropouts (plan/settings.py) are what the memory model prices: with hidden dropout every layer
    keeps two 1-byte masks (after attention and MLP) and the first stage the embedding's, per micro-batch in flight
    (Transformer Engine's flash attention keeps nothing for the attention dropout); without, nothing. The launch
    arguments `hetauto emit megatron` writes, parsed by Megatron-LM's own parser, carry those values (Megatron's
    default would be 0.1 for both), and the --hetauto rewrite gives them to every rank, also when the command line
    leaves the flags out; a value no mesh runs is refused, naming the field."""
    import dataclasses

    from hetauto_megatron.cost.memory import stage_memory_bytes
    from hetauto_megatron.emit.megatron import megatron_args

    plan = plan_from_dict({"version": 2, "model": PRESETS["tiny"].to_dict(), "global_batch_size": 8,
                           "meshes": DROPOUT_MESHES})
    m = plan.model
    for i, in_flight, first in ((0, 2, True), (1, 1, False)):
        mesh = plan.meshes[i]
        kw = dict(layers=4, tp=mesh.tp, dp=mesh.dp, micro_batch_size=mesh.micro_batch_size, recompute="none",
                  in_flight=in_flight, first=first, last=not first)
        priced = stage_memory_bytes(m, settings=mesh.settings, **kw)["activations"]
        without = stage_memory_bytes(m, settings=dataclasses.replace(mesh.settings, hidden_dropout=0.0,
                                                                     attention_dropout=0.0), **kw)["activations"]
        sbh = m.seq_length * mesh.micro_batch_size * m.hidden_size / (mesh.tp if mesh.settings.sequence_parallel
                                                                      else 1)
        masks = in_flight * (4 * 2 * sbh + (sbh if first else 0)) if mesh.settings.hidden_dropout else 0.0
        assert priced - without == pytest.approx(masks), (i, priced, without)
    want = {0: (0.1, 0.05), 1: (0.0, 0.0)}
    assert {i: (mesh.settings.hidden_dropout, mesh.settings.attention_dropout)
            for i, mesh in enumerate(plan.meshes)} == want
    for rank in range(plan.world_size):
        c = launch_identity.check_launch(plan, launch_identity.LaunchIdentity(rank, plan.world_size, None), None)
        emitted = [a for a in megatron_args(plan, c.mesh_index, "plan.yaml") if a != "--hetauto-plan"
                   and a != "plan.yaml"]
        _, args = _megatron_args(monkeypatch, emitted)
        assert (args.hidden_dropout, args.attention_dropout) == want[c.mesh_index], emitted
        _, args = _megatron_args(monkeypatch)                  # flags left out: Megatron's 0.1
        assert (args.hidden_dropout, args.attention_dropout) == (0.1, 0.1)
        rewrite.rewrite_args(args, plan, c)
        assert (args.hidden_dropout, args.attention_dropout) == want[c.mesh_index]
    c = launch_identity.check_launch(plan, launch_identity.LaunchIdentity(0, plan.world_size, None), None)
    _, args = _megatron_args(monkeypatch, ["--hidden-dropout", "0.3"])
    with pytest.raises(InputError) as exc:
        rewrite.rewrite_args(args, plan, c, file="plan.yaml")
    assert exc.value.field == "meshes[0].settings.hidden_dropout" and "--hidden-dropout 0.3" in exc.value.message


def test_a_typed_dropout_the_plan_does_not_run_is_refused_also_megatrons_default(monkeypatch):
    """Megatron's parser gives 0.1 for an absent --hidden-dropout / --attention-dropout; a user who types 0.1 asks
    for dropout the plan (every mesh at 0, the default) neither priced nor runs: refused like a switch no mesh runs,
    one paragraph naming the flag, the plan field and the fix (exit 2). Left out, the flags take the plan's 0."""
    import pickle

    plan = plan_from_dict({"version": 3, "model": PRESETS["tiny"].to_dict(), "global_batch_size": 8,
                           "meshes": [{"cluster": "a", "device_type": "h800", "tp": 1, "dp": 1,
                                       "micro_batch_size": 8, "stage_layers": [8]}]})
    c = launch_identity.check_launch(plan, launch_identity.LaunchIdentity(0, 1, None), None)
    for flag, field in (("--hidden-dropout", "hidden_dropout"), ("--attention-dropout", "attention_dropout")):
        for typed in ("0.1", "0.2"):
            _, args = _megatron_args(monkeypatch, [flag, typed])
            with pytest.raises(InputError) as exc:
                rewrite.rewrite_args(args, plan, c, file="plan.yaml")
            e = exc.value
            assert e.exit_code == 2 and e.field == f"meshes[0].settings.{field}", e.message
            assert f"{flag} {typed} (plan: meshes[0].settings.{field} is 0.0)" in e.message
            text = str(e)
            assert "plan.yaml" in text and "Fix: drop these flags" in text and "\n" not in text, text
        _, args = _megatron_args(monkeypatch, [flag, "0.0"])         # what the plan runs: accepted
        rewrite.rewrite_args(args, plan, c)
        assert getattr(args, field) == 0.0
    margs, args = _megatron_args(monkeypatch)                          # left out: the plan's value
    assert (args.hidden_dropout, args.attention_dropout) == (0.1, 0.1)    # Megatron's default, as parsed
    assert type(pickle.loads(pickle.dumps(args.hidden_dropout))) is float    # saved arguments need no hetauto
    rewrite.rewrite_args(args, plan, c)
    margs.validate_args(args, {})
    assert (args.hidden_dropout, args.attention_dropout) == (0.0, 0.0)
    assert type(args.hidden_dropout) is float and type(args.attention_dropout) is float


def test_hook_sets_the_fp32_plans_tf32_switches_as_priced(monkeypatch, capsys):
    """An fp32 plan's process started by any launcher runs its GEMMs as the plan priced them: PyTorch's matmuls on
    TF32 where the cluster's device has it (the default), off with NVIDIA_TF32_OVERRIDE=0 where the inventory says
    `tf32: false` (Transformer Engine's cuBLASLt GEMMs obey only that); a 16-bit plan is left alone."""
    import torch

    from hetauto_megatron.runtime.device import set_fp32_arithmetic as _set_fp32_arithmetic
    from hetauto_megatron.plan.plan import Mesh, Plan
    inv = {"clusters": [{"name": "a", "device": "a100-80gb", "nodes": 1, "devices_per_node": 8},
                        {"name": "b", "device": "a100-80gb", "nodes": 1, "devices_per_node": 8, "tf32": False}],
           "links": [{"between": ["a", "b"], "bandwidth_gbps": 100, "latency_ms": 1}]}
    meshes = (Mesh("a", "a100-80gb", 1, 8, 1, "none", (16,)), Mesh("b", "a100-80gb", 1, 8, 1, "none", (16,)))
    model = PRESETS["llama2-7b"]
    before = torch.backends.cuda.matmul.allow_tf32
    monkeypatch.delenv("NVIDIA_TF32_OVERRIDE", raising=False)
    try:
        _set_fp32_arithmetic(Plan(model, 64, meshes, inv, precision="fp32"), "a", "a100-80gb")
        assert torch.backends.cuda.matmul.allow_tf32 and "NVIDIA_TF32_OVERRIDE" not in os.environ
        _set_fp32_arithmetic(Plan(model, 64, meshes, inv, precision="fp32"), "b", "a100-80gb")
        assert not torch.backends.cuda.matmul.allow_tf32 and os.environ["NVIDIA_TF32_OVERRIDE"] == "0"
        # an inherited override that turns off what the plan priced is named, not silently run 8x slower
        _set_fp32_arithmetic(Plan(model, 64, meshes, inv, precision="fp32"), "a", "a100-80gb")
        assert "NVIDIA_TF32_OVERRIDE=0" in capsys.readouterr().err
        monkeypatch.delenv("NVIDIA_TF32_OVERRIDE")
        torch.backends.cuda.matmul.allow_tf32 = True
        _set_fp32_arithmetic(Plan(model, 64, meshes, inv, precision="bf16"), "b", "a100-80gb")
        assert torch.backends.cuda.matmul.allow_tf32 and "NVIDIA_TF32_OVERRIDE" not in os.environ
        # AMD devices: not NVIDIA's switches
        amd = {"clusters": [{"name": "m", "device": "mi300x", "nodes": 1, "devices_per_node": 8}], "links": []}
        _set_fp32_arithmetic(Plan(model, 64, (Mesh("m", "mi300x", 1, 8, 1, "none", (32,)),), amd,
                                  precision="fp32"), "m", "mi300x")
        assert torch.backends.cuda.matmul.allow_tf32 and "NVIDIA_TF32_OVERRIDE" not in os.environ
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


@pytest.mark.parametrize("text", ['{"layout": {"weights": {"meshes": [1, 2]}, "data": {}}}',
                                  '{"layout": {"weights": {"meshes": 3}}}', '{"layout": 5}', "not json"])
def test_a_damaged_checkpoint_record_is_named_not_a_traceback(tmp_path, text):
    from hetauto_megatron.megatron.checkpoint_plan import check_resume
    path = tmp_path / "hetauto-plan.json"
    path.write_text(text)
    with pytest.raises(InputError) as exc:     # (was AttributeError / TypeError)
        check_resume(PLAN, str(path))
    assert exc.value.field == "--load" and exc.value.fix


def test_a_transformer_engine_typed_for_a_plan_of_cpu_processes_is_refused(monkeypatch):
    """CPU processes build Megatron's local layers, which the plan priced for them (the --hetauto hook sets them on
    a CPU rank: test_dryrun_config_matches_launch.py); a typed --transformer-impl transformer_engine on a plan
    with no accelerator mesh is one paragraph naming the flag and the mesh. Megatron-LM's default, the same word
    left untyped (marked by args.py, as argparse would otherwise convert it to a plain string), runs."""
    c = launch_identity.check_launch(PLAN, launch_identity.LaunchIdentity(0, PLAN.world_size, None), None)
    _, args = _megatron_args(monkeypatch, ["--vocab-size", "128"], impl="transformer_engine")
    with pytest.raises(InputError) as exc:
        rewrite.rewrite_args(args, PLAN, c, file="plan.yaml")
    assert exc.value.field == "meshes[0].device_type" and exc.value.exit_code == 2
    assert "--transformer-impl transformer_engine (plan: meshes[0] is CPU processes" in exc.value.message
    margs, args = _megatron_args(monkeypatch, ["--vocab-size", "128"])
    assert args.transformer_impl == "transformer_engine"       # Megatron-LM's default, untyped
    rewrite.rewrite_args(args, PLAN, c)
    margs.validate_args(args, {})
    assert args.transformer_impl == "local" and not args.apply_rope_fusion and args.no_persist_layer_norm


def test_a_tokenizer_file_this_machine_lacks_is_refused_before_anything_is_built(monkeypatch, tmp_path):
    """A tokenizer's file the launch names and this machine does not have: Megatron-LM stopped every rank once all
    had initialised ("ValueError: tokenizer_path: ... is invalid" for SentencePiece). Every rank builds the
    tokenizer, so each checks its own machine at the argument stage; what the type does not read, GPT-2's files
    left out (Megatron downloads them) and a model of the hub pass."""
    model = tmp_path / "tok.model"
    model.write_text("x")
    c = launch_identity.check_launch(PLAN, launch_identity.LaunchIdentity(0, PLAN.world_size, None), None)
    refused = [(["--tokenizer-type", "SentencePieceTokenizer", "--tokenizer-model", str(tmp_path / "nope.model")],
                "--tokenizer-model", "does not exist on this machine"),
               (["--tokenizer-type", "Llama2Tokenizer", "--tokenizer-model", str(tmp_path)],
                "--tokenizer-model", "is a directory, not a file"),
               (["--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", str(model), "--merge-file",
                 str(tmp_path / "merges.txt")], "--merge-file", "does not exist"),
               (["--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", "./nope"], "--tokenizer-model",
                "does not exist")]
    for extra, field, words in refused:
        _, args = _megatron_args(monkeypatch, extra)
        with pytest.raises(InputError) as exc:
            rewrite.rewrite_args(args, PLAN, c, file="plan.yaml")
        assert exc.value.field == field and words in exc.value.message, (extra, exc.value.message)
        assert "--tokenizer-type" in exc.value.message and exc.value.exit_code == 2
    for extra in (["--tokenizer-type", "SentencePieceTokenizer", "--tokenizer-model", str(model)],
                  ["--tokenizer-type", "GPT2BPETokenizer"],
                  ["--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", "meta-llama/Llama-2-7b-hf"],
                  ["--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", str(tmp_path)],
                  ["--vocab-file", str(tmp_path / "unread.json")]):       # NullTokenizer reads no file
        _, args = _megatron_args(monkeypatch, extra)
        rewrite.rewrite_args(args, PLAN, c)


def test_a_tokenizer_whose_package_is_missing_is_one_paragraph_where_megatron_builds_it(monkeypatch, tmp_path):
    """Megatron-Core imports a tokenizer's package only if present and fails once it builds the tokenizer ("NameError:
    name 'AutoTokenizer' is not defined" for GPT-2's without transformers, measured here; "sentencepiece library
    should be installed."), on every rank once all had initialised. Megatron's own build (global_vars, as
    initialize_megatron calls it) with the package blocked (None in sys.modules: missing to Python's import system,
    whatever this machine has): one paragraph naming the package, exit 2."""
    import megatron.training.global_vars as global_vars

    from hetauto_megatron.megatron import training_inputs

    model = tmp_path / "tok.model"
    model.write_text("not a SentencePiece model")
    monkeypatch.setattr(global_vars, "build_tokenizer", global_vars.build_tokenizer)     # restored afterwards
    monkeypatch.setattr(global_vars, "_GLOBAL_TOKENIZER", None)
    monkeypatch.setitem(sys.modules, "sentencepiece", None)
    training_inputs.check_tokenizer_when_built(PLAN, "plan.yaml")
    _, args = _megatron_args(monkeypatch, ["--tokenizer-type", "SentencePieceTokenizer", "--tokenizer-model",
                                           str(model)])
    args.rank, args.padded_vocab_size = 0, PLAN.padded_vocab_size
    with pytest.raises(InputError) as exc:
        global_vars.rebuild_tokenizer(args)
    assert exc.value.field == "--tokenizer-type" and exc.value.exit_code == 2
    assert "it is built with the Python package sentencepiece, which the environment of this rank lacks" in \
        exc.value.message, exc.value.message
    assert exc.value.fix.startswith("install it (pip install sentencepiece)")
    monkeypatch.setattr(global_vars, "_GLOBAL_TOKENIZER", None)


def test_a_save_directory_this_machine_cannot_write_is_refused_before_anything_is_built(monkeypatch, tmp_path):
    """--save under a file: NVIDIA's pretrain_gpt.py trained to the first save and then stopped with a
    NotADirectoryError traceback (measured at --save-interval 1). Each rank checks its own machine at the argument
    stage; a directory still to be created, one that exists and object storage pass."""
    (tmp_path / "notes.txt").write_text("x")
    c = launch_identity.check_launch(PLAN, launch_identity.LaunchIdentity(0, PLAN.world_size, None), None)
    for save in (tmp_path / "notes.txt", tmp_path / "notes.txt" / "checkpoints"):
        _, args = _megatron_args(monkeypatch, ["--save", str(save), "--save-interval", "100", "--ckpt-format", "torch"])
        with pytest.raises(InputError) as exc:
            rewrite.rewrite_args(args, PLAN, c, file="plan.yaml")
        assert exc.value.field == "--save" and f"{tmp_path / 'notes.txt'} is a file, not a directory" in \
            exc.value.message, exc.value.message
    for save in (str(tmp_path / "runs" / "a" / "checkpoints"), str(tmp_path), "msc://bucket/checkpoints"):
        _, args = _megatron_args(monkeypatch, ["--save", save, "--ckpt-format", "torch"])
        rewrite.rewrite_args(args, PLAN, c)
    assert not (tmp_path / "runs").exists()         # checked, not created


def test_wandb_logging_the_last_rank_cannot_do_is_refused_before_anything_is_built(monkeypatch, tmp_path):
    """--wandb-project: the job's last rank logs to Weights & Biases (Megatron-LM's _set_wandb_writer as it
    initialises), importing wandb and writing under --wandb-save-dir or --save/wandb. Without the package NVIDIA's
    pretrain_gpt.py stopped that rank with a ModuleNotFoundError traceback (measured); without either directory
    Megatron's os.path.join(None, 'wandb') would be a TypeError. Refused at the argument check on that rank only:
    the other ranks do not log."""
    from megatron.training import global_vars

    from hetauto_megatron.megatron.training_inputs import _installed
    ident = launch_identity.LaunchIdentity
    first = launch_identity.check_launch(PLAN, ident(0, PLAN.world_size, None), None)
    last = launch_identity.check_launch(PLAN, ident(PLAN.world_size - 1, PLAN.world_size, None), None)
    _, args = _megatron_args(monkeypatch, ["--wandb-project", "p"])
    with pytest.raises(InputError) as exc:
        rewrite.rewrite_args(args, PLAN, last, file="plan.yaml")
    assert exc.value.field == "--wandb-save-dir" and "gives neither directory" in exc.value.message
    _, args = _megatron_args(monkeypatch, ["--wandb-project", "p"])
    rewrite.rewrite_args(args, PLAN, first)
    for flags in (["--save", str(tmp_path), "--ckpt-format", "torch"], ["--wandb-save-dir", str(tmp_path)]):
        _, args = _megatron_args(monkeypatch, ["--wandb-project", "p", *flags])
        if _installed("wandb"):
            rewrite.rewrite_args(args, PLAN, last)
            continue
        with pytest.raises(InputError) as exc:
            rewrite.rewrite_args(args, PLAN, last, file="plan.yaml")
        assert exc.value.field == "--wandb-project" and "has no wandb package" in exc.value.message, exc.value.message
        assert f"global rank {PLAN.world_size - 1}" in exc.value.message and "pip install wandb" in exc.value.fix
        args.rank, args.world_size = PLAN.world_size - 1, PLAN.world_size     # what Megatron does on that rank
        with pytest.raises(ModuleNotFoundError):
            global_vars._set_wandb_writer(args)


def test_autoresume_without_its_library_is_refused_where_megatron_would_end_the_job_quietly(monkeypatch, tmp_path):
    """--adlr-autoresume: Megatron-LM's own _set_adlr_autoresume, run on the same namespace, ends the process with
    sys.exit() (exit code 0: the launch reported success, untrained) where the check refuses, and imports
    AutoResume where the check passes: $SUBMIT_SCRIPTS naming a directory with userlib/auto_resume.py."""
    from megatron.training import global_vars

    c = launch_identity.check_launch(PLAN, launch_identity.LaunchIdentity(0, PLAN.world_size, None), None)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SUBMIT_SCRIPTS", raising=False)
    _, args = _megatron_args(monkeypatch, ["--adlr-autoresume"])
    with pytest.raises(InputError) as exc:
        rewrite.rewrite_args(args, PLAN, c, file="plan.yaml")
    assert exc.value.field == "--adlr-autoresume" and exc.value.exit_code == 2
    assert f"nor under the current directory ({tmp_path}" in exc.value.message, exc.value.message
    assert "SUBMIT_SCRIPTS" in exc.value.fix
    monkeypatch.setattr(sys, "path", list(sys.path))        # Megatron appends to it
    monkeypatch.setattr(global_vars, "_GLOBAL_ADLR_AUTORESUME", None)
    with pytest.raises(SystemExit) as ended:
        global_vars._set_adlr_autoresume(args)
    assert ended.value.code is None                          # exit code 0
    scripts = tmp_path / "submit"
    (scripts / "userlib").mkdir(parents=True)
    (scripts / "userlib" / "__init__.py").write_text("")
    (scripts / "userlib" / "auto_resume.py").write_text("class AutoResume:\n    pass\n")
    monkeypatch.setenv("SUBMIT_SCRIPTS", str(scripts))
    monkeypatch.delitem(sys.modules, "userlib", raising=False)
    monkeypatch.delitem(sys.modules, "userlib.auto_resume", raising=False)
    _, args = _megatron_args(monkeypatch, ["--adlr-autoresume"])
    rewrite.rewrite_args(args, PLAN, c)
    assert "userlib" not in sys.modules                       # looked for, not imported
    global_vars._set_adlr_autoresume(args)
    assert global_vars.get_adlr_autoresume().__name__ == "AutoResume"
    monkeypatch.setattr(global_vars, "_GLOBAL_ADLR_AUTORESUME", None)
    for name in ("userlib.auto_resume", "userlib"):
        sys.modules.pop(name, None)


def test_megatrons_timeout_flag_is_the_timeout_of_every_wait_under_hetauto(monkeypatch, tmp_path):
    """--distributed-timeout-minutes (NVIDIA's example scripts give 60, for long dataset builds and checkpoint loads)
    was ignored under --hetauto: hetauto builds the process groups, with HETAUTO_TIMEOUT_S (600 s). Typed, it is now
    the timeout of every wait between ranks; Megatron's default (10, not typed) leaves HETAUTO_TIMEOUT_S; a typed 10
    is taken. The hook keeps it for every wait it starts. --distributed-timeout-seconds-after-init, which stopped
    every rank after the first iteration with a TypeError in Megatron's update_pg_timeout (its process groups are
    not the ones under --hetauto), is refused, and so is a timeout of 0 minutes or of more than a week."""
    from hetauto_megatron.megatron.timeouts import job_timeout_s
    monkeypatch.setenv("HETAUTO_TIMEOUT_S", "90")
    for extra, expected in (([], (90.0, "HETAUTO_TIMEOUT_S")),
                            (["--distributed-timeout-minutes", "60"], (3600.0, "--distributed-timeout-minutes 60")),
                            (["--distributed-timeout-minutes", "10"], (600.0, "--distributed-timeout-minutes 10"))):
        _, args = _megatron_args(monkeypatch, extra)
        assert job_timeout_s(args) == expected, extra
    for extra, field in ((["--distributed-timeout-seconds-after-init", "300"],
                          "--distributed-timeout-seconds-after-init"),
                         (["--distributed-timeout-minutes", "0"], "--distributed-timeout-minutes"),
                         # more than a week: torch's deadlines overflow not far above
                         (["--distributed-timeout-minutes", "10081"], "--distributed-timeout-minutes")):
        _, args = _megatron_args(monkeypatch, extra)
        with pytest.raises(InputError) as exc:
            job_timeout_s(args)
        assert exc.value.field == field and exc.value.exit_code == 2, exc.value.message
    # the hook keeps them for every wait it starts (the rendezvous, runtime.groups.build_groups, the exchange);
    # it wraps Megatron's tokenizer and dataset builds for its plan: put back after the test
    import megatron.training.global_vars as global_vars
    import megatron.training.training as training

    from hetauto_megatron.megatron import hook
    monkeypatch.setattr(global_vars, "build_tokenizer", global_vars.build_tokenizer)
    monkeypatch.setattr(training, "build_train_valid_test_datasets", training.build_train_valid_test_datasets)
    PLAN.save(str(tmp_path / "plan.yaml"))
    for var, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", str(PLAN.world_size))):
        monkeypatch.setenv(var, value)
    _, args = _megatron_args(monkeypatch, ["--distributed-timeout-minutes", "60", "--hetauto", "--hetauto-plan",
                                           str(tmp_path / "plan.yaml")])
    assert hook._prepare_hetauto(args).timeout_s == 3600.0


def test_the_arguments_megatron_saves_in_a_checkpoint_load_with_its_weights_only_loader(monkeypatch, tmp_path):
    """The parser's marked defaults (args.py) stayed in the namespace where nothing replaced them: without --hetauto
    every one (the layout, the dropouts, --transformer-impl), under --hetauto on accelerators --transformer-impl's
    Transformer Engine, and on every launch --distributed-timeout-minutes. Megatron-LM saves its arguments in each
    checkpoint and loads them with torch.load's weights-only unpickler, Megatron-Core's safe globals registered: a
    marked value was refused ("Unsupported global: GLOBAL int", measured on the 2-cluster CPU plan's --load, then
    Megatron's "could not load the checkpoint" and sys.exit() on every rank). The hook makes them plain values
    again once read (before Megatron validates them); both namespaces then load, every value equal."""
    import pickle

    import torch
    from megatron.core.safe_globals import register_safe_globals

    from hetauto_megatron.megatron.args import unmark_parser_defaults
    register_safe_globals()
    plan = plan_from_dict({"version": 2, "model": PRESETS["tiny"].replace(vocab_size=50257).to_dict(),
                           "global_batch_size": 8, "meshes": TIED_50257})
    _, plain_megatron = _megatron_args(monkeypatch, ["--vocab-size", "50257"])
    _, hetauto = _megatron_args(monkeypatch, ["--vocab-size", "50257"], model=plan.model)
    rewrite.rewrite_args(hetauto, plan, launch_identity.check_launch(
        plan, launch_identity.LaunchIdentity(0, plan.world_size, None), None))
    assert type(hetauto.transformer_impl) is not str             # the rewrite left the default marked
    for args in (plain_megatron, hetauto):
        path = tmp_path / "args.pt"
        torch.save({"args": args}, path)
        with pytest.raises(pickle.UnpicklingError, match="Unsupported global"):
            torch.load(path)
        unmark_parser_defaults(args)
        torch.save({"args": args}, path)
        assert vars(torch.load(path)["args"]) == vars(args)
    # what the patched script's parse (hook.parse_and_validate_args) hands Megatron without --hetauto: no mark left
    from hetauto_megatron.runtime.launcher import launch
    saved = launch(_parse_with_the_hook, 1, args=(str(tmp_path / "hook-args.pt"), 1, []), timeout_s=120)[0]
    assert vars(torch.load(saved)["args"])["tensor_model_parallel_size"] == 1


def _parse_with_the_hook(rank, world_size, path, world, extra):
    """A forked process: Megatron's arguments as the patched script parses and validates them (hook.parse_and_
    validate_args; Megatron keeps them in its globals) as rank 0 of `world`: with --hetauto in `extra` the tiny
    model's architecture flags (the plan gives the rest), else a small model's sizes; saved as a checkpoint keeps
    them."""
    import torch

    from hetauto_megatron.emit.megatron import architecture_args
    from hetauto_megatron.megatron import hook
    os.environ.update(RANK="0", WORLD_SIZE=str(world), LOCAL_RANK="0", CUDA_DEVICE_MAX_CONNECTIONS="1")
    sys.argv = ["pretrain_gpt.py", "--tokenizer-type", "NullTokenizer", "--vocab-size", "128", "--mock-data",
                "--train-iters", "1", "--lr", "1e-3", "--no-gradient-accumulation-fusion",
                "--no-persist-layer-norm", "--max-position-embeddings", "32",
                *([f for a in architecture_args(PRESETS["tiny"]) for f in a.flags] if "--hetauto" in extra else
                  ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
                   "--micro-batch-size", "1"]), *extra]
    args = hook.parse_and_validate_args()
    torch.save({"args": args}, path)
    return path


def test_a_flag_megatron_ends_every_rank_for_is_one_paragraph_under_hetauto(tmp_path):
    """--checkpoint-activations (older Megatron-LM scripts): Megatron's validate_args printed "no longer valid" on
    global rank 0 and called exit() on every rank, exit code 0, untrained; without --hetauto it still does, under it
    one paragraph naming the flag and the plan's recomputation (measured through the patched script's parse)."""
    from hetauto_megatron.runtime.launcher import LaunchError, launch
    PLAN.save(str(tmp_path / "plan.yaml"))
    with pytest.raises(LaunchError, match="SystemExit: None"):
        launch(_parse_with_the_hook, 1, args=(str(tmp_path / "a.pt"), 1, ["--checkpoint-activations"]), timeout_s=120)
    with pytest.raises(InputError) as exc:
        launch(_parse_with_the_hook, 1, args=(str(tmp_path / "b.pt"), PLAN.world_size, [
            "--hetauto", "--hetauto-plan", str(tmp_path / "plan.yaml"), "--checkpoint-activations"]), timeout_s=120)
    assert exc.value.field == "--checkpoint-activations" and "recompute" in exc.value.fix, exc.value.message


def test_checkpoint_args_are_refused_under_hetauto_before_megatron_reads_rank_0s_shard(tmp_path):
    """--use-checkpoint-args: Megatron-LM reads the model's arguments from global rank 0's shard on every rank while
    it parses; a machine of another cluster without that shard stopped with a traceback (here a tracker and an empty
    iteration directory: Megatron's "unknown checkpoint format", which it still raises without --hetauto). Under
    --hetauto the model is the plan's: one paragraph, before Megatron reads anything."""
    from hetauto_megatron.runtime.launcher import LaunchError, launch
    PLAN.save(str(tmp_path / "plan.yaml"))
    (tmp_path / "ckpt" / "iter_0000002").mkdir(parents=True)
    (tmp_path / "ckpt" / "latest_checkpointed_iteration.txt").write_text("2\n")
    flags = ["--use-checkpoint-args", "--load", str(tmp_path / "ckpt")]
    with pytest.raises(LaunchError, match="unknown checkpoint format"):
        launch(_parse_with_the_hook, 1, args=(str(tmp_path / "a.pt"), 1, flags), timeout_s=120)
    with pytest.raises(InputError) as exc:
        launch(_parse_with_the_hook, 1, args=(str(tmp_path / "b.pt"), PLAN.world_size,
                                              ["--hetauto", "--hetauto-plan", str(tmp_path / "plan.yaml"), *flags]),
               timeout_s=120)
    assert exc.value.field == "--use-checkpoint-args" and exc.value.fix.startswith("drop --use-checkpoint-args")


def test_a_tracker_megatron_cannot_read_is_one_paragraph_not_a_quiet_exit(tmp_path):
    """A tracker that holds no iteration (a copy cut short): Megatron-LM's own read_metadata prints "Invalid metadata
    file" and calls sys.exit() (exit code 0 on every rank, the launch reported success). Under --hetauto the
    rank's paragraph names the tracker and what it holds (training_seams.install_checkpoint_load_check); a missing
    shard is tested where a checkpoint is loaded (test_megatron_pretrain.py)."""
    from types import SimpleNamespace

    import megatron.training.checkpointing as checkpointing

    from hetauto_megatron.megatron.training_seams import _load_failure
    tracker = tmp_path / "latest_checkpointed_iteration.txt"
    tracker.write_text("iter_00\n")
    with pytest.raises(SystemExit) as ended:
        checkpointing.read_metadata(str(tracker))
    assert ended.value.code is None
    exc = _load_failure((str(tmp_path), "--load"), SimpleNamespace(load=str(tmp_path), ckpt_step=None))
    assert exc.field == "--load" and f"tracker {tracker}" in exc.message and "'iter_00', not an iteration" in \
        exc.message and "--ckpt-step" in exc.fix, exc.message


def test_a_launch_without_data_vocabulary_learning_rate_or_length_is_refused_before_anything_is_built(
        monkeypatch):
    """No dataset and no --mock-data (the emitted launch scripts pass the data arguments through, so they are easy to
    forget): NVIDIA's pretrain_gpt.py built the model and the optimizer on every rank and then stopped in Megatron's
    dataset builder with a traceback (GPTDataset on a path of None). Now one paragraph at the argument check; any
    of Megatron's dataset flags, as its parser names them, passes."""
    c = launch_identity.check_launch(PLAN, launch_identity.LaunchIdentity(0, PLAN.world_size, None), None)
    _, args = _megatron_args(monkeypatch, ["--vocab-size", "128"], data=())
    with pytest.raises(InputError) as exc:
        rewrite.rewrite_args(args, PLAN, c, file="plan.yaml")
    assert exc.value.field == "--data-path" and "names no training data" in exc.value.message
    assert "--mock-data" in exc.value.fix and exc.value.exit_code == 2
    for data in (["--mock-data"], ["--data-path", "corpus_text_document"],
                 ["--train-data-path", "a", "--valid-data-path", "b", "--test-data-path", "c"],
                 ["--data-args-path", "blend.txt"], ["--per-split-data-args-path", "splits.json"]):
        _, args = _megatron_args(monkeypatch, ["--vocab-size", "128"], data=data)
        rewrite.rewrite_args(args, PLAN, c)
    # the tokenizer of mock data (its TypeError traceback once Megatron had initialised every rank, before), the
    # learning rate and the run's length (tracebacks once every rank had built the model and the optimizer)
    for absent, field, fix in (("vocab_size", "--vocab-size", "add --vocab-size 128"), ("lr", "--lr", "add --lr"),
                               ("train_iters", "--train-iters", "add --train-iters N")):
        _, args = _megatron_args(monkeypatch)
        setattr(args, absent, None)             # Megatron's parser's value when the flag is absent
        with pytest.raises(InputError) as exc:
            rewrite.rewrite_args(args, PLAN, c, file="plan.yaml")
        assert exc.value.field == field and exc.value.fix.startswith(fix), exc.value.message
    _, args = _megatron_args(monkeypatch, ["--train-samples", "8"])
    args.train_iters = None
    rewrite.rewrite_args(args, PLAN, c)


@pytest.mark.parametrize("version", [2, 3])
def test_an_older_fp32_plan_without_an_inventory_means_the_same_once_saved_again(tmp_path, version):
    """A version 1-3 plan without an inventory ran its fp32 GEMMs without TF32 (version 4 turns TF32 on where the
    device has it). Saved again it was written as version 4, so the same plan read back ran on TF32: its emitted
    launch exported TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1 where the original's said NVIDIA_TF32_OVERRIDE=0."""
    from hetauto_megatron.emit.megatron import emit_megatron
    from hetauto_megatron.emit.vendor_env import fp32_tf32

    meshes = [{"cluster": c, "device_type": "a100-80gb", "tp": 1, "dp": 8, "micro_batch_size": 1,
               "recompute": "none", "stage_layers": [16]} for c in ("a", "b")]
    old = plan_from_dict({"version": version, "model": PRESETS["llama2-7b"].to_dict(), "global_batch_size": 64,
                          "precision": "fp32", "meshes": meshes}, file="old.yaml")
    path = str(tmp_path / "again.yaml")
    old.save(path)
    again = load_plan(path)
    assert fp32_tf32(old, "a") is False and fp32_tf32(again, "a") is False
    scripts = [{la["cluster"]: la["script"] for la in emit_megatron(p, plan_path="plan.yaml")} for p in (old, again)]
    assert "NVIDIA_TF32_OVERRIDE=0" in scripts[0]["a"] and scripts[0] == scripts[1]
