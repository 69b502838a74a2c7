"""--hetauto flags, per-rank rewrite of Megatron's arguments from a plan, version check (no processes)."""
import argparse
import os
import sys

import pytest

from hetauto_megatron.errors import InputError
from hetauto_megatron.megatron import rewrite
from hetauto_megatron.megatron.args import add_hetauto_args, hetauto_args_provider
from hetauto_megatron.megatron.hook import check_megatron_version, megatron_core_version
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
    ident = rewrite.identity_from_env({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1",
                                       "HETAUTO_RANK_OFFSET": "4", "HETAUTO_WORLD_SIZE": "6",
                                       "HETAUTO_CLUSTER": "b"})
    assert (ident.rank, ident.world_size, ident.local_rank, ident.cluster) == (5, 6, 1, "b")
    single = rewrite.identity_from_env({"RANK": "3", "WORLD_SIZE": "6"})
    assert (single.rank, single.world_size, single.cluster) == (3, 6, None)


@pytest.mark.parametrize("env,field", [
    ({"RANK": "x"}, "RANK"),
    ({"RANK": "0", "HETAUTO_RANK_OFFSET": "4"}, "HETAUTO_WORLD_SIZE"),
])
def test_identity_errors(env, field):
    with pytest.raises(InputError) as exc:
        rewrite.identity_from_env(env)
    assert exc.value.field == field


def test_check_launch_places_ranks_and_rejects_mismatches():
    ident = rewrite.LaunchIdentity(rank=5, world_size=6, cluster=None)
    c = rewrite.check_launch(PLAN, ident, "b")
    assert (c.mesh_index, c.stage, c.tp_rank, c.dp_rank) == (1, 2, 0, 1)
    with pytest.raises(InputError, match="launched with 4 processes but the plan needs 6"):
        rewrite.check_launch(PLAN, rewrite.LaunchIdentity(rank=0, world_size=4, cluster=None), None, file="p.yaml")
    with pytest.raises(InputError) as exc:
        rewrite.check_launch(PLAN, ident, "a", file="p.yaml")
    assert exc.value.field == "meshes[1].cluster" and "cluster 'a'" in exc.value.reason
    with pytest.raises(InputError, match="outside the plan's 6 ranks"):
        rewrite.check_launch(PLAN, rewrite.LaunchIdentity(rank=7, world_size=6, cluster=None, rank_offset=6), None)


# ---- per-rank layout ---------------------------------------------------------------------------------------
def test_layout_overrides_per_mesh():
    a = rewrite.layout_overrides(PLAN, rewrite.check_launch(PLAN, rewrite.LaunchIdentity(1, 6, None), None))
    b = rewrite.layout_overrides(PLAN, rewrite.check_launch(PLAN, rewrite.LaunchIdentity(4, 6, None), None))
    assert a["tensor_model_parallel_size"] == 2 and b["tensor_model_parallel_size"] == 1
    assert a["micro_batch_size"] == 2 and b["micro_batch_size"] == 1
    assert a["pipeline_model_parallel_size"] == b["pipeline_model_parallel_size"] == 3
    assert a["pipeline_model_parallel_layout"] == b["pipeline_model_parallel_layout"] == "Ettt|tt|tttL"
    assert a["global_batch_size"] == b["global_batch_size"] == 8
    assert (a["recompute_granularity"], a["recompute_method"]) == (None, None)
    assert (b["recompute_granularity"], b["recompute_method"], b["recompute_num_layers"]) == ("full", "uniform", 1)
    assert a["recompute_modules"] is None
    assert a["decoder_first_pipeline_num_layers"] is None


def test_single_stage_plan_has_no_layout():
    plan = make_plan([{"cluster": "a", "device_type": "cpu", "tp": 1, "dp": 2, "micro_batch_size": 2,
                       "recompute": "selective", "stage_layers": [8]}])
    o = rewrite.layout_overrides(plan, rewrite.check_launch(plan, rewrite.LaunchIdentity(1, 2, None), None))
    assert o["pipeline_model_parallel_layout"] is None and o["pipeline_model_parallel_size"] == 1
    assert (o["recompute_granularity"], o["recompute_method"], o["recompute_modules"]) == ("selective", None, ["mlp"])


def test_validation_world_size_yields_mesh_dp():
    for rank, dp in [(0, 1), (3, 1), (4, 2), (5, 2)]:
        c = rewrite.check_launch(PLAN, rewrite.LaunchIdentity(rank, 6, None), None)
        mesh = PLAN.meshes[c.mesh_index]
        assert rewrite.validation_world_size(PLAN, c) // (mesh.tp * PLAN.pipeline_parallel_size) == dp


# ---- model arguments ---------------------------------------------------------------------------------------
def ns(**kw):
    base = dict(num_layers=None, hidden_size=None, num_attention_heads=None, ffn_hidden_size=None, seq_length=None,
                group_query_attention=False, num_query_groups=None, context_parallel_size=1, num_experts=None)
    base.update(kw)
    return argparse.Namespace(**base)


def test_model_args_are_filled_from_the_plan():
    fill = rewrite.check_model_args(ns(), PLAN)
    assert fill == {"num_layers": 8, "hidden_size": 64, "num_attention_heads": 4, "ffn_hidden_size": 256,
                    "seq_length": 32, "group_query_attention": True, "num_query_groups": 2}
    assert rewrite.check_model_args(ns(num_layers=8, hidden_size=64, group_query_attention=True,
                                       num_query_groups=2), PLAN) == {
        "num_attention_heads": 4, "ffn_hidden_size": 256, "seq_length": 32}


def test_model_args_that_contradict_the_plan_are_listed():
    with pytest.raises(InputError) as exc:
        rewrite.check_model_args(ns(num_layers=12, hidden_size=64, group_query_attention=True, num_query_groups=4),
                                 PLAN, file="plan.yaml")
    msg = exc.value.message
    assert "--num-layers 12 (plan: 8)" in msg and "--num-query-groups 4 (plan: 2)" in msg
    assert msg.startswith("plan.yaml: field 'model'")


def test_rewrite_rejects_context_parallel_and_experts():
    c = rewrite.check_launch(PLAN, rewrite.LaunchIdentity(0, 6, None), None)
    with pytest.raises(InputError, match="context-parallel"):
        rewrite.rewrite_args(ns(context_parallel_size=2), PLAN, c)
    with pytest.raises(InputError, match="mixture-of-experts"):
        rewrite.rewrite_args(ns(num_experts=8), PLAN, c)


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
        monkeypatch.setattr(sys, "argv", ["x", "--hetauto", "--hetauto-plan", PLAN_FILE, "--micro-batch-size", "7",
                                          "--tensor-model-parallel-size", "4", "--tokenizer-type", "NullTokenizer",
                                          "--vocab-size", "128", "--max-position-embeddings", "32",
                                          "--transformer-impl", "local", "--no-gradient-accumulation-fusion",
                                          "--no-persist-layer-norm", "--mock-data", "--train-iters", "1",
                                          "--lr", "1e-3"])
        args = margs.parse_args(hetauto_args_provider())
        c = rewrite.check_launch(plan, rewrite.LaunchIdentity(rank, plan.world_size, None), None)
        rewrite.rewrite_args(args, plan, c)
        margs.validate_args(args, {})
        mesh = plan.meshes[c.mesh_index]
        assert args.tensor_model_parallel_size == mesh.tp
        assert args.data_parallel_size == mesh.dp
        assert args.micro_batch_size == mesh.micro_batch_size
        assert args.global_batch_size // (args.micro_batch_size * args.data_parallel_size) == plan.num_micro_batches
        assert args.pipeline_model_parallel_layout == "Ettt|tt|tttL"
        assert args.num_layers == 8 and args.num_query_groups == 2


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
    c = rewrite.check_launch(PLAN, rewrite.LaunchIdentity(0, 6, None), None)
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
                         rewrite.check_launch(same_tp, rewrite.LaunchIdentity(0, 4, None), None))
