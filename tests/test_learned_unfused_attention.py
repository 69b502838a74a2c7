"""CPU meshes run Megatron's local, unfused attention (the dry run's layer spec; `--transformer-impl local`), which
keeps the s x s scores: `hetauto profile` times that attention as its own operator kind where the runtime runs it,
`hetauto fit` learns its rate, and the learned model composes a CPU mesh's layer from it. Checked against Megatron's
own attention and layer as the dry run builds them, timed on this CPU."""
import json

import pytest

from hetauto_megatron.cli import main
from hetauto_megatron.cost import features as F
from hetauto_megatron.cost import learned as L

pytestmark = pytest.mark.ranks     # starts rank processes: one such module at a time (conftest)

TIMING = dict(warmup=2, min_reps=7, max_reps=40, budget_s=0.4)
ROUNDS = 3
# (heads, key/value heads, head_dim, seq): GQA, and a sequence at which the s x s scores dominate the attention
SHAPE = (4, 2, 16, 512)


def _attention_rank(rank, world_size, timing):
    """In a one-rank process: Megatron-Core's core attention as the dry run builds it (runtime/model.py, the layer of
    measure/layer_timing.py), and the profile's two attention operators at the same shape, each timed by the
    profiler's own timer. Returns {name: (fwd p10, bwd p10)}."""
    import torch

    from hetauto_megatron.measure.profile import Runner
    from hetauto_megatron.plan.plan import Mesh, Plan
    from hetauto_megatron.runtime.groups import build_groups, set_megatron_globals
    from hetauto_megatron.runtime.model import build_model, transformer_config
    from hetauto_megatron.runtime.rendezvous import init_distributed
    from hetauto_megatron.spec.model import ModelSpec

    heads, kv, d, s = SHAPE
    torch.set_num_threads(1)
    spec = ModelSpec("attn", 1, heads * d, heads, 4 * heads * d, 128, s, num_query_groups=kv)
    plan = Plan(model=spec, global_batch_size=1, meshes=(Mesh(cluster="c", device_type="cpu", tp=1, dp=1,
                                                              micro_batch_size=1, recompute="none",
                                                              stage_layers=(1,)),))
    init_distributed(plan, rank, world_size, timeout_s=120, dry_run=True)
    ctx = build_groups(plan, rank, world_size, timeout_s=120, dry_run=True)
    set_megatron_globals(ctx)
    model = build_model(ctx, spec, transformer_config(plan, ctx, spec), seed=0)
    core = model.decoder.layers[0].self_attention.core_attention
    mask = torch.tril(torch.ones(1, 1, s, s)) < 0.5          # the dry run's (runtime/train.py)
    q = torch.randn(s, 1, heads, d).mul_(0.1).requires_grad_(True)
    k, v = (torch.randn(s, 1, kv, d).mul_(0.1).requires_grad_(True) for _ in range(2))
    runner = Runner(torch, "cpu", torch.float32)
    subjects = {"megatron": ([q, k, v], lambda: core(q, k, v, mask))}
    for kind in F.ATTENTION_KINDS:
        op = F.Op("attention", kind, s, batch=1, seq=s, heads=heads, kv_heads=kv, head_dim=d)
        subjects[kind] = runner.build(op)
    # Rounds taken in turn, the fastest round's p10 kept: on a shared machine a burst of load lands on one round of
    # one subject, never on every round of it (timed one after the other, a burst made Megatron's look 2x slower).
    best: dict[str, list[float]] = {}
    for _ in range(ROUNDS):
        for name, (inputs, fwd) in subjects.items():
            t = runner.time_fn(inputs, fwd, **timing)
            got = best.setdefault(name, [float("inf")] * 2)
            got[:] = min(got[0], t["fwd_p10_s"]), min(got[1], t["bwd_p10_s"])
    return {name: tuple(t) for name, t in best.items()}


def test_profile_times_the_attention_the_cpu_runtime_runs():
    """The unfused operator the profile times for a CPU is Megatron's local attention: within 35 % of it, forward
    and backward (wall clock on a shared 2-core machine). The fused operator, all a CPU profile timed before, is
    not: more than 1.8x faster than what runs at this sequence."""
    from hetauto_megatron.runtime.dryrun import preload_megatron
    from hetauto_megatron.runtime.launcher import launch
    preload_megatron()

    def misses(t) -> list:
        return [(phase, t) for i, phase in enumerate(("fwd", "bwd"))
                if t["attention_unfused"][i] != pytest.approx(t["megatron"][i], rel=0.35)
                or not t["attention"][i] < t["megatron"][i] / 1.8]
    # Up to three measurements, the first that agrees kept: beside another worker's test, whose load lasts seconds,
    # the unfused operator (its s x s scores, 4 MiB, twice a core's L2 cache here) measured 2.0-2.5x Megatron's in
    # every round of one measurement, and within 35 % alone. A profile timing another operator misses every time
    # (the fused one is 2.7-3.1x faster than Megatron's at this sequence).
    for _ in range(3):
        missed = misses(launch(_attention_rank, 1, args=(TIMING,), timeout_s=300)[0])
        if not missed:
            break
    assert not missed, missed


def test_cpu_profile_times_the_unfused_kind_and_the_learned_model_composes_it(tiny_cpu_model):
    """The CPU profile holds the unfused attention beside the fused one, the fit calibrates both, and a CPU mesh's
    layer is priced with the one its engine runs (RuntimeSettings.fused_attention: Megatron unfused, DeepSpeed's
    torch layers fused)."""
    from hetauto_megatron.plan.costing import stage_profile
    from hetauto_megatron.plan.settings import default_settings
    from hetauto_megatron.spec.inventory import load_inventory
    from hetauto_megatron.spec.model import ModelSpec
    import dataclasses
    import os
    from helpers import ROOT

    profile, model_dir = tiny_cpu_model
    _, rows = L.read_profile(str(profile))
    kinds = {r["op"]["kind"] for r in rows}
    assert {"attention", "attention_unfused"} <= kinds
    model = L.LearnedCostModel(str(model_dir))
    man = json.loads((model_dir / "manifest.json").read_text())
    assert man["feature_version"] == F.FEATURE_VERSION
    unfused = F.OP_KINDS.index("attention_unfused")
    assert {f"cpu|op|{ph}|{unfused}|fp32" for ph in ("fwd", "bwd")} <= set(model.fitted.calibration)
    inv = load_inventory(os.path.join(ROOT, "examples", "llama", "inventory-cpu-dryrun.yaml"))
    cluster = inv.clusters[0]
    spec = ModelSpec("attn", 2, 64, 4, 256, 128, 512, num_query_groups=2)
    megatron = default_settings(1)
    deepspeed = dataclasses.replace(megatron, engine="deepspeed")
    assert not megatron.fused_attention(cluster.device) and deepspeed.fused_attention(cluster.device)
    unf = stage_profile(spec, cluster, 1, 1, 1, "none", model, megatron)
    fused = stage_profile(spec, cluster, 1, 1, 1, "none", model, deepspeed)
    want = model.fitted.composed_layer_times(model.devices["cpu"], F.layer_ops(spec, 1, 1, unfused_attention=True))
    assert (unf.layer_fwd, unf.layer_bwd) == pytest.approx(want)
    assert unf.layer_fwd > fused.layer_fwd and unf.layer_bwd > fused.layer_bwd


def test_a_cpu_profile_without_the_unfused_kind_is_refused_and_resumed(tiny_cpu_model, tmp_path, capsys):
    """A CPU profile written before the unfused kind: `fit` names the kind and the command that completes it (exit 2,
    one paragraph); that command resumes into the file and times only the twins, then the fit runs."""
    src, _ = tiny_cpu_model
    lines = src.read_text().splitlines()
    old = [ln for ln in lines[1:] if json.loads(ln)["op"]["kind"] != "attention_unfused"]
    out = tmp_path / "profile-cpu.jsonl"
    out.write_text("\n".join([lines[0]] + old) + "\n")
    assert main(["fit", str(out), "-o", str(tmp_path / "m"), "--holdout", "0"]) == 2
    err = capsys.readouterr().err
    assert "attention_unfused" in err and "hetauto profile" in err and "Traceback" not in err
    assert main(["profile", "--device-type", "cpu", "--grid", "tiny", "--out", str(tmp_path), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["measured_now"] == len(lines) - 1 - len(old) > 0
    assert main(["fit", str(out), "-o", str(tmp_path / "m"), "--holdout", "0"]) == 0


@pytest.mark.parametrize("edit, field", [({"dtype_bytes": 2}, "dtype_bytes"), ({"dtype": "float64"}, "dtype")])
def test_a_header_whose_dtype_and_dtype_bytes_disagree_is_refused(tiny_cpu_model, tmp_path, capsys, edit, field):
    src, _ = tiny_cpu_model
    lines = src.read_text().splitlines()
    prof = tmp_path / "profile-cpu.jsonl"
    prof.write_text("\n".join([json.dumps({**json.loads(lines[0]), **edit})] + lines[1:]) + "\n")
    assert main(["fit", str(prof), "-o", str(tmp_path / "m"), "--holdout", "0"]) == 2
    err = capsys.readouterr().err
    assert field in err and str(prof) in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
