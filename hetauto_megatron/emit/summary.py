"""The human summary of a plan: one row per pipeline stage, then the job's totals.

Layout columns come from the plan alone. Time, memory and utilisation columns come from an estimate dict
(the simulator's result, or the `estimate` block a plan file carries):
    {"stages": [{"compute_s", "busy_s", "bubble_s", "send_next_s", "memory_gib", "utilisation"}, ...one per
     stage], "iteration_time_s", "tokens_per_s", "tflops_per_device", "fits"}
"link s" is one micro-batch's activation crossing from the stage to the next (the same again for its gradient
coming back). The bottleneck (plan/explain.py: the largest of the slowest stage's compute, the bubble, the
exposed link time, DP sync and the optimizer) is marked on its stage or boundary and named under the table; for
several pipelines or replica groups side by side it is named under the table as explain and compare name it
(plan/multi_explain.py: the slowest pipeline, its DP reduction, the exchange across holders or the rest).
Missing keys print as "-"; without an estimate only the layout is shown.
"""
from __future__ import annotations

from ..cost.deepspeed_state import deepspeed_optimizer
from ..plan.exchange_roots import describe_roots
from ..plan.explain import breakdown, describe_bottleneck
from ..plan.multi_explain import PARTS, shapes_breakdown
from ..plan.plan import Plan
from ..plan.precision import sixteen_bit_dtype
from ..spec.devices import get_device
from .launches import inventory_cluster
from .vendor_env import fp32_tf32


def _capacity_gib(plan: Plan, mesh_index: int) -> float:
    """Device memory of a mesh: the inventory's (it may override the catalog), else the catalog's."""
    mesh = plan.meshes[mesh_index]
    c = inventory_cluster(plan, mesh.cluster)
    if c is not None and isinstance(c.get("memory_gib"), (int, float)):
        return float(c["memory_gib"])
    return get_device(mesh.device_type).memory_gib


def _cpu_note(plan: Plan) -> str:
    cpu = any(get_device(mesh.device_type).vendor == "cpu" for mesh in plan.meshes)
    return " (fp32 on cpu processes)" if cpu and plan.precision != "fp32" else ""


def _grad_dtype(plan, i: int) -> str:
    """The dtype mesh i reduces gradients in, as it runs: fp32, or its training precision (a CPU mesh trains in
    fp32; fp8 trains on bf16 parameters, so its gradients are bf16: precision.sixteen_bit_dtype)."""
    if plan.meshes[i].settings.grad_reduce_dtype == "fp32":
        return "fp32"
    precision = plan.mesh_precision(i)
    return sixteen_bit_dtype(precision) or precision


def _settings_text(plan: Plan) -> str:
    """Each mesh's runtime settings (plan/settings.py) as the plan's engine runs them, in a few words, meshes with the
    same ones together."""
    groups: dict[str, list[str]] = {}
    for i, mesh in enumerate(plan.meshes):
        st = plan.settings_as_run(i)
        overlap = "+".join(w for w, on in (("grad", st.overlap_grad_reduce), ("param", st.overlap_param_gather)) if on)
        text = ", ".join([("SP" if st.sequence_parallel else "no SP"),
                          _optimizer_words(plan, i, st),
                          (f"overlap {overlap}" if overlap else "no DP overlap"),
                          f"gradients in {_grad_dtype(plan, i)}"]
                         + ([f"dropout hidden {st.hidden_dropout:g}, attention {st.attention_dropout:g}"]
                            if st.hidden_dropout or st.attention_dropout else [])
                         + (["unfused attention"] if _unfused_attention(plan, i, st) else [])
                         + _tf32_words(plan, i))
        groups.setdefault(text, []).append(str(i))
    if len(groups) == 1:
        return next(iter(groups))
    return "; ".join(f"mesh {','.join(idx)}: {text}" for text, idx in groups.items())


# DeepSpeed's optimizers (cost/deepspeed_state.py), in words: whether each shards its state over DP
_DEEPSPEED_OPTIMIZER_WORDS = {"torch": "torch Adam, unsharded", "fp16": "FP16 optimizer, unsharded",
                              "bf16": "BF16 optimizer, sharded", "zero": "ZeRO optimizer, sharded"}


def _optimizer_words(plan: Plan, i: int, st) -> str:
    """The optimizer a mesh runs: Megatron's distributed or plain one; under DeepSpeed's engine its ZeRO stage and
    the optimizer it builds for the mesh's precision (the BF16 optimizer shards at ZeRO-0 too)."""
    if st.optimizer_state == "deepspeed":
        kind = deepspeed_optimizer(plan.mesh_precision(i), st)
        return f"ZeRO-{1 if st.distributed_optimizer else 0} ({_DEEPSPEED_OPTIMIZER_WORDS[kind]})"
    return "distributed optimizer" if st.distributed_optimizer else "plain optimizer"


def _unfused_attention(plan: Plan, i: int, st) -> bool:
    """An accelerator mesh whose engine runs its attention unfused on its device at the plan's precision
    (Transformer Engine in fp32 or on a V100: RuntimeSettings.fused_attention), which the cost and memory models
    price (the s x s scores). CPU processes run Megatron's local spec, unfused at any precision, not flagged."""
    dev = get_device(plan.meshes[i].device_type)
    return dev.vendor != "cpu" and not st.fused_attention(dev.at_precision(plan.precision))


def _tf32_words(plan: Plan, i: int) -> list[str]:
    """An fp32 plan's NVIDIA mesh: whether its GEMMs run on the TF32 tensor cores, as priced and launched."""
    mesh = plan.meshes[i]
    if plan.precision != "fp32" or get_device(mesh.device_type).vendor != "nvidia":
        return []
    return ["TF32 GEMMs" if fp32_tf32(plan, mesh.cluster) else "no TF32"]


def distinct_gib(value: float, against: float) -> str:
    """`value` with one decimal, or as many more (up to 3) as tell it from `against`: a stage over its memory by
    40 MiB showed "75.1 / 75.1" beside "fits: no", its headroom "-0.0 GiB"."""
    digits = 1
    while digits < 3 and value != against and round(value, digits) == round(against, digits):
        digits += 1
    return f"{value:.{digits}f}"


def _num(value, fmt: str) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "-"
    return format(value, fmt)


def _precision_line(plan: Plan) -> str:
    m = plan.model
    return (f"precision {plan.precision}{_cpu_note(plan)}, vocabulary {m.vocab_size} padded to "
            f"{plan.padded_vocab_size}; runtime settings{_engine_note(plan)}: {_settings_text(plan)}")


def _engine_note(plan: Plan) -> str:
    return "" if plan.engine == "megatron" else f" as {plan.engine}'s pipeline engine runs them"


TIGHT_MEMORY = 0.95     # a stage using more of its device's memory is called out: the model's error is up to 10 %


def _estimate_line(est: dict) -> str:
    fits = est.get("fits")
    # the estimate is informational (a file's may be hand-edited): rows that are not stage mappings are skipped
    stages = est.get("stages") if isinstance(est.get("stages"), list) else []
    shares = [(st["memory_gib"] / st["memory_cap_gib"], st.get("stage", i)) for i, st in enumerate(stages)
              if isinstance(st, dict) and isinstance(st.get("memory_gib"), (int, float))
              and isinstance(st.get("memory_cap_gib"), (int, float)) and st["memory_cap_gib"] > 0]
    share, stage = max(shares, default=(0.0, None), key=lambda x: x[0])
    tight = (f" (stage {stage} uses {share:.0%} of its device memory: little headroom, the memory model is within "
             "10 % of measured runs, docs/cost-model.md)" if fits is True and share >= TIGHT_MEMORY else "")
    return (f"iteration {_num(est.get('iteration_time_s'), '.3f')} s, {_num(est.get('tokens_per_s'), ',.0f')} "
            f"tokens/s, {_num(est.get('tflops_per_device'), '.1f')} TFLOP/s per device (model FLOPs), "
            f"fits in memory: {'yes' if fits is True else 'no' if fits is False else '-'}{tight}")


def count_noun(n: int, noun: str) -> str:
    """'1 mesh', '2 meshes', '1 pipeline stage', '16 pipeline stages', '4 micro-batches'."""
    return f"{n:,} {noun}" if n == 1 else f"{n:,} {noun}{'es' if noun.endswith(("sh", "ch", "s", "x")) else 's'}"


def _table(header: list[str], rows: list[list[str]], right: set[int]) -> list[str]:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]

    def line(r):
        return "  ".join(str(c).rjust(w) if i in right else str(c).ljust(w)
                         for i, (c, w) in enumerate(zip(r, widths))).rstrip()
    # (a column without a heading, e.g. the bottleneck mark, gets no rule either)
    return [line(header), line(["-" * w if h else "" for h, w in zip(header, widths)]), *[line(r) for r in rows]]


def format_summary(plan: Plan, estimate: dict | None = None, *, file: str | None = None) -> str:
    """A fixed-width table of the plan's stages plus totals; `estimate` adds time, memory and utilisation. A plan
    of several pipelines or with replica groups side by side gets one row per stage and group, pipeline after
    pipeline."""
    est = estimate if isinstance(estimate, dict) else None
    if not plan.is_simple:
        return _format_shapes(plan, est)
    stages = est.get("stages") if est else None
    if not (isinstance(stages, list) and len(stages) == plan.pipeline_parallel_size):
        stages = None
    header = ["stage", "cluster", "device", "devices", "TP", "DP", "layers", "mbs", "recompute"]
    bd = breakdown(est, plan.num_micro_batches) if est and stages else None
    mark = {}
    if bd and bd["bottleneck"] in ("compute", "dp_sync", "optimizer") and bd["stage"] is not None:
        mark[bd["stage"]] = "<- bottleneck"
    elif bd and bd["bottleneck"] == "link" and bd["boundary"] is not None:
        for b in bd.get("link_boundaries") or [bd["boundary"]]:
            mark[b] = "<- bottleneck (link)"
    if est:
        header += ["compute s", "busy s", "bubble s", "link s", "memory GiB", "util"] + ([""] if mark else [])
    rows = []
    for s in range(plan.pipeline_parallel_size):
        i, _ = plan.stage_owner(s)
        m = plan.meshes[i]
        layers = plan.stage_layers[s]
        extra = (["+emb"] if s == 0 else []) + (["+head"] if s == plan.pipeline_parallel_size - 1 else [])
        row = [str(s), m.cluster, m.device_type, str(m.tp * m.dp), str(m.tp), str(m.dp),
               str(layers) + "".join(extra), str(m.micro_batch_size), m.recompute]
        if est:
            st = stages[s] if stages and isinstance(stages[s], dict) else {}
            mem = _num(st.get("memory_gib"), ".1f")
            if mem != "-":
                # The capacity the estimate was made against (the inventory simulated, which may override the
                # catalog's memory_gib), else the plan's own inventory, else the catalog.
                cap = st.get("memory_cap_gib")
                cap = cap if _num(cap, 'g') != '-' else _capacity_gib(plan, i)
                mem = f"{distinct_gib(st['memory_gib'], cap)} / {cap:g}"
            util = _num(st.get("utilisation"), ".0%")
            last = s == plan.pipeline_parallel_size - 1
            row += [_num(st.get("compute_s"), ".3f"), _num(st.get("busy_s"), ".3f"), _num(st.get("bubble_s"), ".3f"),
                    "-" if last else _num(st.get("send_next_s"), ".4f"), mem, util] + ([mark.get(s, "")] if mark else [])
        rows.append(row)
    right = {0, 3, 4, 5, 7} | ({9, 10, 11, 12, 13, 14} if est else set())
    m = plan.model
    lines = [f"plan: {m.name} ({m.num_layers} layers) on {count_noun(plan.world_size, 'device')} in {count_noun(len(plan.meshes), 'mesh')}"
             f", {count_noun(plan.pipeline_parallel_size, 'pipeline stage')}",
             *_table(header, rows, right),
             _precision_line(plan),
             f"global batch {plan.global_batch_size} = {plan.num_micro_batches} micro-batch steps x "
             f"{plan.samples_per_step} samples (dp x micro-batch in every mesh), sequence {m.seq_length}"]
    if est:
        lines.append(_estimate_line(est))
    if bd:
        others = ", ".join(f"{k.replace('_', ' ')} {v['share']:.0%}" for k, v in bd["parts"].items()
                           if k != bd["bottleneck"])
        lines.append(f"bottleneck: {describe_bottleneck(plan, bd)} ({others}; 'hetauto explain' says more)")
    return "\n".join(lines)


def _format_shapes(plan: Plan, est: dict | None) -> str:
    """Several pipelines and/or mixed replica groups: one row per stage and replica group, pipeline after
    pipeline (the estimate's rows of plan/multi_simulate.py carry `pipeline` and `mesh`)."""
    rows_by_key = {}
    for st in (est or {}).get("stages") or []:
        if isinstance(st, dict):
            rows_by_key[(st.get("mesh"), st.get("stage"))] = st
    header = ["pipe", "stage", "mesh", "cluster", "device", "devices", "TP", "DP", "layers", "mbs", "recompute"]
    if est:
        header += ["compute s", "busy s", "link s", "memory GiB", "util"]
    rows = []
    for p in range(plan.num_pipelines):
        stage = 0
        for pos in plan.positions(p):
            n = plan.meshes[pos[0]].num_stages
            for j in range(n):
                for k, i in enumerate(pos):
                    m = plan.meshes[i]
                    row = [str(p), str(stage + j), str(i) + (" +" if k else ""), m.cluster, m.device_type,
                           str(m.tp * m.dp), str(m.tp), str(m.dp), str(m.stage_layers[j]), str(m.micro_batch_size),
                           m.recompute]
                    if est:
                        st = rows_by_key.get((i, stage + j), {})
                        mem = _num(st.get("memory_gib"), ".1f")
                        if mem != "-" and _num(st.get("memory_cap_gib"), "g") != "-":
                            mem = (f"{distinct_gib(st['memory_gib'], st['memory_cap_gib'])} / "
                                   f"{_num(st['memory_cap_gib'], 'g')}")
                        row += [_num(st.get("compute_s"), ".3f"), _num(st.get("busy_s"), ".3f"),
                                _num(st.get("send_next_s"), ".4f"), mem, _num(st.get("utilisation"), ".0%")]
                    rows.append(row)
            stage += n
    m = plan.model
    parts = [f"pipeline {p}: {n} samples ({plan.pipeline_micro_batches(p)} micro-batch steps x "
             f"{plan.pipeline_step(p)})" for p, n in enumerate(plan.samples_per_pipeline)]
    pipes = ("one pipeline" if plan.num_pipelines == 1 else
             f"{plan.num_pipelines} pipelines joined by data parallelism")
    along = " ('+': a replica group alongside the mesh above it)" if any(x.alongside for x in plan.meshes) else ""
    lines = [f"plan: {m.name} ({m.num_layers} layers) on {plan.world_size} devices in {len(plan.meshes)} meshes, "
             f"{pipes}{along}",
             *_table(header, rows, {0, 1, 5, 6, 7, 9} | ({11, 12, 13, 15} if est else set())),
             _precision_line(plan),
             f"global batch {plan.global_batch_size}: " + "; ".join(parts) + f", sequence {m.seq_length}"]
    if est:
        lines.append(_estimate_line(est) + "; gradients summed across the stages holding the same layers: "
                     f"{_num(est.get('replica_sync_s'), '.3f')} s")
        per = est.get("pipelines")
        if isinstance(per, list) and len(per) == plan.num_pipelines and all(isinstance(x, dict) for x in per):
            lines.append("predicted per pipeline: " + "; ".join(
                f"{p}: 1F1B {_num(x.get('pipeline_s'), '.3f')} s + DP {_num(x.get('dp_exposed_s'), '.3f')} s"
                for p, x in enumerate(per)))
        roots = est.get("exchange_roots")
        if isinstance(roots, list) and roots:
            lines.append(describe_roots(roots))
        bd = _shapes_bottleneck(est)
        if bd:
            # (';' between the parts: one of their names holds commas)
            others = "; ".join(f"{PARTS[k]} {v['share']:.0%}" for k, v in bd["parts"].items() if k != bd["bottleneck"])
            lines.append(f"bottleneck: {bd['text']} ({others}; 'hetauto explain' says more)")
    return "\n".join(lines)


def _shapes_bottleneck(est: dict) -> dict | None:
    """The largest part of the iteration as explain and compare split it (multi_explain.shapes_breakdown), where the
    estimate carries the figures that split needs: a plan file's estimate is informational (it may be hand-edited),
    and one without them gets no bottleneck line rather than an error."""
    def number(v):
        return isinstance(v, (int, float)) and not isinstance(v, bool)
    pipes = est.get("pipelines")
    if not (isinstance(pipes, list) and pipes and all(isinstance(x, dict) and number(x.get("pipeline_s"))
                                                      and number(x.get("before_sync_s")) for x in pipes)
            and all(number(est.get(k)) for k in ("iteration_time_s", "dp_exposed_s", "replica_sync_s"))
            and est["iteration_time_s"] > 0):
        return None
    return shapes_breakdown(est)
