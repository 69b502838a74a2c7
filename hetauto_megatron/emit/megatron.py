"""Megatron-LM arguments and per-cluster launch scripts for a plan (docs/launch.md).

One torch.distributed world spans every cluster of the plan. Each cluster starts its own processes with
torchrun (rendezvous inside the cluster); the HETAUTO_* environment tells the `--hetauto` hook where the
cluster's ranks sit in the global world. A *launch* is one torchrun job: a run of consecutive meshes of one
cluster and one pipeline (their ranks are contiguous). A cluster whose meshes are not consecutive in the plan,
or that runs meshes of several pipelines, gets one launch per run, each with its own rank offset. Each pipeline
of a plan runs its own Megatron pipeline: its launches carry its depth and layout; --global-batch-size is the
job's (the hook gives each mesh its share).

This module writes the argument lists and the scripts; how the meshes group into launches (and the checks against
the plan's inventory) is emit/launches.py, each vendor's environment emit/vendor_env.py, and the Megatron spelling
of the runtime settings and the precision plan/megatron_flags.py. Everything here is plain text generation: no
torch, no megatron import.
"""
from __future__ import annotations

import shlex
from typing import NamedTuple

from ..plan.layout import PipelineLayout, megatron_layout
from ..plan.megatron_flags import job_setting_args, layer_args, megatron_setting_args, precision_args
from ..plan.plan import RECOMPUTE_SETTINGS, Mesh, Plan
from ..spec.model import MAKE_VOCAB_SIZE_DIVISIBLE_BY, ROTARY_BASE
from .launches import Launch, plan_launches
from .vendor_env import launch_env

DEFAULT_SCRIPT = "pretrain_gpt.py"
DEFAULT_CLUSTER_PORT = 29500    # torchrun rendezvous inside one cluster
DEFAULT_GLOBAL_PORT = 29600     # the cross-cluster TCP store; differs so both can live on the same node 0
# what an entry script with --hetauto holds (the patch's import, examples/llama/pretrain_llama_hetauto.py's): grep -E
ENTRY_MARK = r"hetauto_megatron[.]megatron( import hook|[.]hook)"
DEFAULT_TIMEOUT_S = 600
# The longest wait between ranks a job may ask for: a week, beyond any index build or checkpoint load; much
# longer ones break torch (its deadlines, now + timeout in nanoseconds, overflow past about 1e9 s: a store
# connect then timed out at once with a negative timeout, and Python's poll raised OverflowError)
MAX_TIMEOUT_S = 7 * 86_400


# ---- Megatron arguments ------------------------------------------------------------------------------------
def recompute_args(mode: str) -> list[str]:
    """Megatron-LM flags for a mesh's recompute mode, from the one table plan.RECOMPUTE_SETTINGS."""
    out = []
    for key, value in RECOMPUTE_SETTINGS[mode].items():
        if value is None:
            continue
        out.append("--" + key.replace("_", "-"))
        out += [str(v) for v in value] if isinstance(value, list) else [str(value)]
    return out


class ArchitectureArg(NamedTuple):
    dest: str            # Megatron's argument (args.<dest>)
    value: object        # what the plan's model needs
    flags: list[str]     # what gives it on the command line ([]: Megatron's default is the value)
    why: str             # the plan model's property, for messages


def architecture_args(m) -> list[ArchitectureArg]:
    """Megatron's architecture switches for a plan's model, the one table the launch scripts emit and the --hetauto
    rewrite checks (megatron/model_checks.py). Gated MLPs are the LLaMA family: SwiGLU and RMSNorm (as the dry run
    builds them, runtime/model.py); linear biases as the model has them (ModelSpec.linear_biases: a plain MLP's unless
    the model says none, a gated one's never unless it says so); rotary embeddings with the model's base (RoPE
    theta). Megatron's defaults are GPT-2's."""
    gated, rope, untied = m.gated_mlp, m.position_embedding == "rope", not m.tie_embeddings
    position = "rope" if rope else "learned_absolute"
    table = [ArchitectureArg("swiglu", gated, ["--swiglu"] if gated else [],
                             "a gated (SwiGLU) MLP" if gated else "a plain GeLU MLP"),
             ArchitectureArg("normalization", "RMSNorm" if gated else "LayerNorm",
                             ["--normalization", "RMSNorm"] if gated else [], "RMSNorm" if gated else "LayerNorm"),
             ArchitectureArg("add_bias_linear", m.linear_biases, [] if m.linear_biases else ["--disable-bias-linear"],
                             "linear biases" if m.linear_biases else "no linear biases"),
             ArchitectureArg("position_embedding_type", position, ["--position-embedding-type", position],
                             "rotary positions" if rope else "a learned position table")]
    if rope:     # (Megatron ignores the base with learned positions)
        base = m.rotary_base
        table.append(ArchitectureArg("rotary_base", base, ["--rotary-base", str(base)] if base != ROTARY_BASE else [],
                                     f"a rotary base (RoPE theta) of {base:,}"))
    table.append(ArchitectureArg("untie_embeddings_and_output_weights", untied,
                                 ["--untie-embeddings-and-output-weights"] if untied else [],
                                 "an output layer of its own" if untied else "an output layer tied to the embedding"))
    return table


def model_args(plan: Plan) -> list[str]:
    """The network-shape arguments: identical on every rank of the job."""
    m = plan.model
    args = ["--num-layers", str(m.num_layers), "--hidden-size", str(m.hidden_size),
            "--ffn-hidden-size", str(m.ffn_hidden_size), "--num-attention-heads", str(m.num_attention_heads)]
    if m.num_query_groups != m.num_attention_heads:
        args += ["--group-query-attention", "--num-query-groups", str(m.num_query_groups)]
    args += ["--seq-length", str(m.seq_length), "--max-position-embeddings", str(m.max_position_embeddings)]
    for arch in architecture_args(m):
        args += arch.flags
    if m.make_vocab_size_divisible_by != MAKE_VOCAB_SIZE_DIVISIBLE_BY:      # (the --hetauto hook gives every mesh the plan's padded size)
        args += ["--make-vocab-size-divisible-by", str(m.make_vocab_size_divisible_by)]
    return args


def pipeline_args(plan: Plan, pipeline: int = 0) -> list[str]:
    """Whole-pipeline arguments of one pipeline: PP counts its stages; the layout carries the uneven split."""
    layers = PipelineLayout(plan, pipeline).stage_layers
    args = ["--pipeline-model-parallel-size", str(len(layers))]
    if len(layers) > 1:
        args += ["--pipeline-model-parallel-layout", megatron_layout(layers)]
    return args


def mesh_args(mesh: Mesh, precision: str = "bf16") -> list[str]:
    """What differs between meshes: TP, micro-batch, recomputation, the runtime settings (plan/settings.py),
    the precision the mesh trains in (Plan.mesh_precision: the plan's; fp32 on CPU processes), which also
    spells the gradient dtype's flag, and on CPU processes the local, unfused layers (megatron_flags.layer_args);
    DP follows from the device count."""
    return ["--tensor-model-parallel-size", str(mesh.tp), "--micro-batch-size", str(mesh.micro_batch_size),
            *recompute_args(mesh.recompute), *megatron_setting_args(mesh.settings, precision),
            *precision_args(precision), *layer_args(mesh.device_type)]


def job_args(plan: Plan, pipeline: int = 0) -> list[str]:
    """Arguments every rank of one pipeline shares: its pipeline, the model, the job's global batch (the
    --hetauto hook gives each mesh its share of it) and what every launch runs (megatron_flags.JOB_ARGS). The
    padded vocabulary is not a flag: the hook gives every mesh the plan's one padded size."""
    return [*pipeline_args(plan, pipeline), *model_args(plan), "--global-batch-size", str(plan.global_batch_size),
            *job_setting_args()]


def plan_mesh_args(plan: Plan, mesh_index: int) -> list[str]:
    """mesh_args of one mesh of the plan, at the precision that mesh trains in."""
    return mesh_args(plan.meshes[mesh_index], plan.mesh_precision(mesh_index))


def megatron_args(plan: Plan, mesh_index: int, plan_path: str) -> list[str]:
    """The complete Megatron-LM argument list for the ranks of one mesh (data/tokenizer/optimizer excluded)."""
    return [*plan_mesh_args(plan, mesh_index),
            *job_args(plan, plan.meshes[mesh_index].pipeline),
            "--hetauto", "--hetauto-plan", plan_path]


# ---- scripts -----------------------------------------------------------------------------------------------
def _fmt_args(args: list[str], indent: str = "  ") -> str:
    """One flag per line with its values, shell-quoted."""
    lines, cur = [], []
    for a in args:
        if a.startswith("--") and cur:
            lines.append(cur)
            cur = []
        cur.append(a)
    if cur:
        lines.append(cur)
    return "\n".join(indent + " ".join(shlex.quote(x) for x in line) for line in lines)


def _node_ranges(plan: Plan, la: Launch) -> list[tuple[int, int, int]] | None:
    """(first node, last node, mesh) per mesh of a multi-mesh launch, or None if a node holds two meshes."""
    out, start = [], 0
    for k in la.mesh_indices:
        n = plan.meshes[k].num_devices
        if n % la.nproc_per_node:
            return None
        out.append((start, start + n // la.nproc_per_node - 1, k))
        start += n // la.nproc_per_node
    return out


def launch_script(plan: Plan, la: Launch, *, plan_path: str, script: str = DEFAULT_SCRIPT,
                  launches: list[Launch] | None = None) -> str:
    """The shell script of launch `la`; `launches`: every launch of the plan (plan_launches), whose names the
    header gives where a cluster holds several (each a torchrun of its own, on nodes and a rendezvous of its own)."""
    from .summary import count_noun
    launches = launches or [la]
    first = next((x for x in launches if x.rank_offset == 0), la)       # global rank 0: the job's rendezvous
    mine = [x.name for x in launches if x.cluster == la.cluster]
    env, notes = launch_env(plan, la)
    last_rank = la.rank_offset + la.num_devices - 1
    where = (f"node 0 of cluster {first.cluster}" if first.name == first.cluster else
             f"node 0 of launch {first.name} (cluster {first.cluster})")
    unit = "launch" if len(mine) > 1 else "cluster"
    if len(mine) > 1:       # "this cluster's node 0" sent every launch's torchrun to one address and port
        run = [f"# One of {len(mine)} launches on cluster {la.cluster} ({', '.join(n + '.sh' for n in mine)}), each a "
               "torchrun of its own on nodes of its own.",
               f"# Run this one once on every node of its {count_noun(la.nnodes, 'node')} with "
               f"NODE_RANK=0..{la.nnodes - 1} and CLUSTER_MASTER_ADDR set to",
               f"# this launch's node 0. HETAUTO_MASTER_ADDR is the same on every cluster: {where}."]
    else:
        run = [f"# Run it once on every node of this cluster with NODE_RANK=0..{la.nnodes - 1} and CLUSTER_MASTER_ADDR "
               "set to",
               f"# this cluster's node 0. HETAUTO_MASTER_ADDR is the same on every cluster: {where}."]
    lines = [
        "#!/usr/bin/env bash",
        f"# hetauto launch for cluster {la.cluster}: global ranks {la.rank_offset}-{last_rank} of {plan.world_size}, "
        f"{count_noun(la.nnodes, 'node')} x {la.nproc_per_node} {plan.meshes[la.mesh_indices[0]].device_type} ({la.vendor}).",
        *run,
        "# Extra arguments (data, tokenizer, optimizer, checkpoints) are passed through to Megatron.",
    ]
    if plan.num_pipelines > 1:
        lines.append(f"# pipeline {la.pipeline} of {plan.num_pipelines}: {plan.samples_per_pipeline[la.pipeline]} of "
                     f"the {plan.global_batch_size} samples of each global batch, "
                     f"{PipelineLayout(plan, la.pipeline).num_stages} stage(s)")
    for k in la.mesh_indices:
        m = plan.meshes[k]
        s0 = PipelineLayout(plan, m.pipeline).first_stage(k)
        side = " (alongside the mesh before it)" if m.alongside else ""
        lines.append(f"# mesh {k}{side}: pipeline stages {s0}-{s0 + m.num_stages - 1} (layers {list(m.stage_layers)}), "
                     f"tp {m.tp}, dp {m.dp}, micro-batch {m.micro_batch_size}, recompute {m.recompute}, "
                     f"ranks {plan.rank_offset(k)}-{plan.rank_offset(k) + m.num_devices - 1}")
    lines += [
        "set -euo pipefail",
        # a launch that does not match the plan stops here with exit 2 (invalid input), before torchrun starts: a
        # node rank outside the cluster's nodes would leave every cluster waiting at the rendezvous
        "refuse() { echo \"hetauto launch (cluster $HETAUTO_CLUSTER): $1\" >&2; exit 2; }",
        f"HETAUTO_CLUSTER={shlex.quote(la.cluster)}",
        f'[ -n "${{NODE_RANK:-}}" ] || refuse "set NODE_RANK to the index of this node in the {unit} '
        f'(0..{la.nnodes - 1})"',
        # digits only, at most 9 (a longer number is no index, and overflows the test below); 07 reads as 7
        f'case "$NODE_RANK" in *[!0-9]*|??????????*) refuse "NODE_RANK=$NODE_RANK is not a node index '
        f'(0..{la.nnodes - 1})" ;; esac',
        'NODE_RANK=$((10#$NODE_RANK))',
        f'[ "$NODE_RANK" -lt {la.nnodes} ] || refuse "NODE_RANK=$NODE_RANK, but the plan runs this {unit} on '
        f'{count_noun(la.nnodes, "node")}: 0..{la.nnodes - 1}"',
        # (set, here: its form and lookup and the rendezvous's timeout are hetauto-torchrun's, cluster_rendezvous.py)
        f'[ -n "${{CLUSTER_MASTER_ADDR:-}}" ] || refuse "set CLUSTER_MASTER_ADDR to the address of node 0 of this '
        f'{unit}"',
        f'[ -n "${{HETAUTO_MASTER_ADDR:-}}" ] || refuse "set HETAUTO_MASTER_ADDR to {where}, '
        'reachable from every cluster"',
        # torchrun refuses a port that is no TCP port on every node, with its usage text or a traceback
        f'CLUSTER_MASTER_PORT="${{CLUSTER_MASTER_PORT:-{DEFAULT_CLUSTER_PORT}}}"',
        '[[ $CLUSTER_MASTER_PORT =~ ^[0-9]{1,9}$ ]] && '
        '(( 10#$CLUSTER_MASTER_PORT >= 1 && 10#$CLUSTER_MASTER_PORT <= 65535 )) || refuse '
        f'"CLUSTER_MASTER_PORT=$CLUSTER_MASTER_PORT is not a TCP port: set it to a port from 1 to 65535 that node 0 '
        f'of this {unit} has free, or unset it ({DEFAULT_CLUSTER_PORT})"',
        # every worker refused it (megatron/world_store.py master_port), after torchrun had started on every node
        f'HETAUTO_MASTER_PORT="${{HETAUTO_MASTER_PORT:-{DEFAULT_GLOBAL_PORT}}}"',
        '[[ $HETAUTO_MASTER_PORT =~ ^[0-9]{1,9}$ ]] && '
        '(( 10#$HETAUTO_MASTER_PORT >= 1 && 10#$HETAUTO_MASTER_PORT <= 65535 )) || refuse '
        '"HETAUTO_MASTER_PORT=$HETAUTO_MASTER_PORT is not a TCP port: set it to a port from 1 to 65535 that global '
        f'rank 0\'s host has free, the same on every cluster, or unset it ({DEFAULT_GLOBAL_PORT})"',
    ]
    if la.rank_offset == 0:
        # node 0 of this launch hosts both rendezvous (torchrun's and the world's): one port for both put torchrun's
        # store where the other clusters' ranks looked for the world's, and they stopped with torch's C++ frames
        lines += [
            '(( 10#$CLUSTER_MASTER_PORT != 10#$HETAUTO_MASTER_PORT )) || refuse "CLUSTER_MASTER_PORT and '
            'HETAUTO_MASTER_PORT are both $HETAUTO_MASTER_PORT: node 0 of this launch hosts both rendezvous, so give '
            f'them two free ports (or unset both: {DEFAULT_CLUSTER_PORT} and {DEFAULT_GLOBAL_PORT})"',
        ]
    lines += [
        # every worker refused it (megatron/timeouts.py); its rule: a Python float (digits, a fraction, an exponent,
        # '_' between digits, spaces around) above 0 and at most MAX_TIMEOUT_S
        f'HETAUTO_TIMEOUT_S="${{HETAUTO_TIMEOUT_S:-{DEFAULT_TIMEOUT_S}}}"',
        "digits='[0-9](_?[0-9])*'",
        r'seconds="^[[:space:]]*[+]?($digits(\.($digits)?)?|\.$digits)([eE][+-]?$digits)?[[:space:]]*\$"',
        f'not_seconds="HETAUTO_TIMEOUT_S=$HETAUTO_TIMEOUT_S is not a positive number of seconds: unset it (default '
        f'{DEFAULT_TIMEOUT_S}) or give seconds, e.g. {DEFAULT_TIMEOUT_S}"',
        '[[ $HETAUTO_TIMEOUT_S =~ $seconds && ${HETAUTO_TIMEOUT_S%%[eE]*} == *[1-9]* ]] || refuse "$not_seconds"',
        # its value: awk reads the number without Python's '_', as Python's float does: 1e-400 underflows to 0
        # there (the workers refused it, after torchrun had started on every node) and 1e999 is inf; a node
        # without awk leaves both to the workers, which refuse them too
        'has_awk() { command -v awk >/dev/null 2>&1; }',
        '! has_awk || awk -v s="${HETAUTO_TIMEOUT_S//_/}" \'BEGIN { exit !(s + 0 > 0) }\' || refuse "$not_seconds"',
        f'! has_awk || '
        f'awk -v s="${{HETAUTO_TIMEOUT_S//_/}}" \'BEGIN {{ exit !(s + 0 <= {MAX_TIMEOUT_S}) }}\' || refuse '
        f'"HETAUTO_TIMEOUT_S=$HETAUTO_TIMEOUT_S is more than a week ({MAX_TIMEOUT_S} s), the longest wait between '
        f'ranks a launch may set: give at most {MAX_TIMEOUT_S}, or unset it (default {DEFAULT_TIMEOUT_S})"',
        "",
        "export HETAUTO_CLUSTER",
        f"export HETAUTO_RANK_OFFSET={la.rank_offset}",
        f"export HETAUTO_WORLD_SIZE={plan.world_size}",
        "export HETAUTO_MASTER_ADDR",
        "export HETAUTO_MASTER_PORT",
        "export HETAUTO_TIMEOUT_S",
    ]
    lines += [f"export {k}={shlex.quote(v)}" for k, v in env.items()]
    lines += ["# vendor settings to adapt to the site (not required):"] + [f"# {n}" for n in notes]
    lines.append("")
    ranges = _node_ranges(plan, la) if len(la.mesh_indices) > 1 else None
    common = job_args(plan, la.pipeline)
    if len(la.mesh_indices) == 1:
        lines += ["MESH_ARGS=(", _fmt_args(plan_mesh_args(plan, la.mesh_indices[0])), ")"]
    elif ranges:
        lines.append('case "$NODE_RANK" in')
        for lo, hi, k in ranges:
            pat = "|".join(str(r) for r in range(lo, hi + 1))
            lines += [f"  {pat})  # mesh {k}", "    MESH_ARGS=(",
                      _fmt_args(plan_mesh_args(plan, k), "      "),
                      "    ) ;;"]
        lines += [f'  *) refuse "NODE_RANK must be 0..{la.nnodes - 1}" ;;', "esac"]
    else:
        # A node holds ranks of two meshes: one argument list cannot be right for all of them; the --hetauto
        # hook rewrites TP, micro-batch and recompute per rank from the plan, so list the first mesh's.
        lines += ["# Meshes share a node here: the --hetauto hook sets each rank's own TP/micro-batch/recompute.",
                  "MESH_ARGS=(", _fmt_args(plan_mesh_args(plan, la.mesh_indices[0])), ")"]
    # The paths are the user's words: quoted into variables of their own, since inside "${HETAUTO_PLAN:-...}" a
    # default is expanded ($(...) would run) and single quotes are not quotes; the environment still overrides.
    lines += ["MEGATRON_ARGS=(", _fmt_args(common), ")",
              f"hetauto_plan_default={shlex.quote(plan_path)}",
              f"megatron_script_default={shlex.quote(script)}",
              "HETAUTO_ARGS=(", '  --hetauto --hetauto-plan "${HETAUTO_PLAN:-$hetauto_plan_default}"', ")", ""]
    # hetauto-torchrun: torchrun, ending a worker's user error (exit 2) with exit 2 and no traceback of its own
    # TORCHRUN is a command and its arguments, split on blanks as the shell splits a word, without globbing (a
    # `*` in an argument reached torchrun as the file names it matched), and run as an array; a value that
    # names an executable file whole is that one path, so a path with a space works too (without arguments)
    lines += ['if [ -f "${TORCHRUN:-}" ] && [ -x "$TORCHRUN" ]; then launcher=("$TORCHRUN")',
              'else set -f; launcher=(${TORCHRUN:-hetauto-torchrun}); set +f; fi',
              '[ -n "${TORCHRUN:-}" ] || command -v hetauto-torchrun >/dev/null 2>&1 || refuse "the launcher '
              'hetauto-torchrun is not on PATH: install hetauto (pip install) in the environment that runs torchrun, '
              'or set TORCHRUN"',
              '[ -n "${launcher[0]:-}" ] && command -v "${launcher[0]}" >/dev/null 2>&1 || refuse "TORCHRUN=$TORCHRUN: '
              'its command ${launcher[0]:-(none)} is not on PATH nor an executable file: set TORCHRUN to the '
              'torchrun command, its arguments after blanks (e.g. python -m torch.distributed.run; no quotes), or '
              'to the path of one executable file alone (spaces and all, no arguments)"',
              # (every worker's python found no script and exited 2, which read as a paragraph of hetauto's)
              'entry="${MEGATRON_SCRIPT:-$megatron_script_default}"',
              '[ -f "$entry" ] || refuse "the Megatron-LM entry script $entry is not there (from $PWD): set '
              'MEGATRON_SCRIPT to the patched pretrain_gpt.py (hetauto patch-megatron), or run this in its directory"',
              # (an unpatched script printed Megatron's whole usage text on every worker, "unrecognized arguments:
              # --hetauto", and the other clusters waited out their timeout)
              f'! command -v grep >/dev/null 2>&1 || grep -qE {shlex.quote(ENTRY_MARK)} "$entry" || refuse "the '
              'entry script $entry has no --hetauto (it does not import hetauto_megatron.megatron.hook): patch it '
              'with hetauto patch-megatron /path/to/Megatron-LM, or set MEGATRON_SCRIPT to a patched one"',
              f'exec "${{launcher[@]}}" --nnodes={la.nnodes} --nproc-per-node={la.nproc_per_node} '
              f'--node-rank="$NODE_RANK" \\',
              f'  --master-addr="$CLUSTER_MASTER_ADDR" --master-port="$CLUSTER_MASTER_PORT" \\',
              '  "$entry" "${MESH_ARGS[@]}" "${MEGATRON_ARGS[@]}" '
              '"${HETAUTO_ARGS[@]}" "$@"',
              ""]
    return "\n".join(lines)


def emit_megatron(plan: Plan, *, plan_path: str, script: str = DEFAULT_SCRIPT, devices_per_node: int | None = None,
                  file: str | None = None) -> list[dict]:
    """Per launch: its facts, the exact argument lists and the shell script text (what `hetauto emit megatron`
    prints or writes); every launch of the plan (launches.only_cluster keeps one cluster's)."""
    launches = plan_launches(plan, devices_per_node=devices_per_node, file=file)
    out = []
    for la in launches:
        env, _ = launch_env(plan, la)
        out.append({
            "name": la.name, "cluster": la.cluster, "vendor": la.vendor, "pipeline": la.pipeline,
            "meshes": list(la.mesh_indices),
            "rank_offset": la.rank_offset, "num_devices": la.num_devices, "nnodes": la.nnodes,
            "nproc_per_node": la.nproc_per_node,
            "env": {"HETAUTO_CLUSTER": la.cluster, "HETAUTO_RANK_OFFSET": str(la.rank_offset),
                    "HETAUTO_WORLD_SIZE": str(plan.world_size), **env},
            "megatron_args": {str(k): megatron_args(plan, k, plan_path) for k in la.mesh_indices},
            "script": launch_script(plan, la, plan_path=plan_path, script=script, launches=launches),
        })
    return out

