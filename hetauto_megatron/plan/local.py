"""Local search around the tree's best leaves: change one decision at a time while it helps.

Moves: TP and DP of a mesh together (the common trade: same devices, other shard shapes; at the most stages its
devices allow, and under the cost objective also at its stage count or its device count), its stage count (under
the cost objective also the nearest counts whole nodes can start, and one mesh a step up while another takes a
step down), its recomputation, any other order of the same meshes (adjacent swaps beyond four meshes), dropping a
mesh, adding an unused cluster anywhere (at its largest TP and the most stages its devices allow; under the cost
objective also at every TP with one stage, the cheapest mesh the cost objective's tree gives it, alone or in place
of a step down of the stages of a mesh beside it), and S halved or
doubled: each mesh absorbs the change in its DP (giving up
stages where its devices run out) or its micro-batch, or one mesh takes any TP/DP at the new S while the others
absorb it in their micro-batch or refit (their DP scaled, the stages their devices allow) (the TP/DP move across
an S step: without it a climb stalls at a small S whose best reshaping needs the larger S first). Each climb is independent of the others (its own
record of what it tried; the evaluator's caches make repeats cheap), so climbs can run in any order or in
parallel and give the same result.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import replace

from .plan import RECOMPUTE_MODES
from .space import SearchSpace, divisors
from .stop import out_of_time


def cluster_order(layout: tuple) -> tuple:
    return tuple(m.cluster for m in layout)


def starts(ranked: list, count: int, kind=cluster_order) -> list[tuple]:
    """The best leaf of each of the best `count` kinds of layout (by default cluster orders), so the climbs
    explore different pipelines rather than polishing one."""
    out, orders = [], set()
    for _, k in ranked:
        order = kind(k)
        if order not in orders:
            orders.add(order)
            out.append(k)
        if len(out) == count:
            break
    return out


def climb(space: SearchSpace, resolve, start: tuple, deadline: float | None = None, bound=None) -> list:
    """Hill-climb from `start`; -> every feasible layout priced on the way, as (seconds, layout). `bound(layout)`,
    if given, is a lower bound on `resolve(layout)`: a neighbour it puts no better than the current layout
    cannot be a step, and is not priced (the climb takes the same steps)."""
    found, seen = [], {start}
    cur, cur_t = start, resolve(start)
    improved = True
    while improved:
        improved = False
        for cand in neighbours(space, cur):
            if out_of_time(deadline):
                return found
            if cand in seen or not space.legal(cand):
                continue
            seen.add(cand)
            if bound is not None and bound(cand) >= cur_t:
                continue
            t = resolve(cand)
            if math.isfinite(t):
                found.append((t, cand))
            if t < cur_t - 1e-12:
                cur, cur_t, improved = cand, t, True
    return found


def stage_steps(space: SearchSpace, m) -> tuple:
    """(the next smaller, the next larger) stage count of mesh `m` that whole nodes of its cluster can start
    (`SearchSpace.whole_nodes`), None where there is none (at least one stage, at most the cluster's devices)."""
    n = space.inventory.cluster(m.cluster).num_devices // (m.tp * m.dp)
    down = next((k for k in range(m.num_stages - 1, 0, -1) if space.whole_nodes(m.cluster, m.tp * m.dp * k)), None)
    up = next((k for k in range(m.num_stages + 1, n + 1) if space.whole_nodes(m.cluster, m.tp * m.dp * k)), None)
    return down, up


def step_neighbours(samples: list[int], S: int) -> list[int]:
    """The micro-batch steps one prime factor away from S (S / p, S x p) that the tree offers: halving and doubling,
    and a factor 3 where the global batch and a cluster's devices have one (a DP of 32 -> 96)."""
    return [S2 for S2 in samples if S2 != S and (S2 % S == 0 and _prime(S2 // S) or S % S2 == 0 and _prime(S // S2))]


def _prime(n: int) -> bool:
    return n > 1 and all(n % d for d in range(2, math.isqrt(n) + 1))


def neighbours(space: SearchSpace, choices: tuple) -> list[tuple]:
    S = choices[0].dp * choices[0].micro_batch_size
    out = []

    def with_mesh(i, m):
        return choices[:i] + (m,) + choices[i + 1:]

    # devices in use: a changed or added mesh takes what --max-devices leaves it
    devices_used = sum(x.tp * x.dp * x.num_stages for x in choices)
    # each mesh's nearest whole-node stage counts (the cost objective's stage moves below read them)
    steps = [stage_steps(space, x) for x in choices] if space.stage_decision else []
    for i, m in enumerate(choices):
        before = sum(x.num_stages for x in choices[:i])
        for tp in space.tp[m.cluster]:
            for dp in divisors(S):
                if (tp, dp) != (m.tp, m.dp):
                    out.append(with_mesh(i, space.mesh(m.cluster, tp, dp, S, before, len(choices) - i - 1,
                                                       devices_used - m.tp * m.dp * m.num_stages)))
                    if space.stage_decision:
                        # the cost objective's mesh may hold fewer stages than its devices allow: the new shape
                        # also keeps the mesh's stages, or its devices (what the plan pays for). At the most
                        # stages alone, 16 H800 at TP 2 x DP 8 x 1 stage became TP 1 x DP 16 x 16 stages, never
                        # x 1 (a cheaper and faster head stage of the 736-device example under
                        # --max-iteration-s 30), and the stage moves reach it only through dearer layouts
                        keep = [m.num_stages]
                        if m.tp * m.dp * m.num_stages % (tp * dp) == 0:
                            keep.append(m.tp * m.dp * m.num_stages // (tp * dp))
                        for k in dict.fromkeys(keep):
                            out.append(with_mesh(i, space.mesh(m.cluster, tp, dp, S, before, len(choices) - i - 1,
                                                               devices_used - m.tp * m.dp * m.num_stages,
                                                               stages=k)))
        for k in (m.num_stages - 1, m.num_stages + 1, (m.num_stages + 1) // 2):
            if k != m.num_stages:
                out.append(with_mesh(i, replace(m, num_stages=k)))
        if space.stage_decision:
            # the nearest counts whole nodes can start (a mesh of two stages a node steps by two: one stage more or
            # fewer is not legal), and one mesh a step up while another takes a step down: layers move between
            # clusters at about the same depth. Where the memory fills every stage (a time cap's plans), a stage
            # fewer alone cannot hold the layers and a stage more alone only costs: 96 MI300X at 9 stages and 256
            # H800 at 64 stood there, 0.6610 per 1M tokens, three such steps from 12 and 58 stages at 0.6470
            down, up = steps[i]
            for k in (down, up):
                if k is not None and k not in (m.num_stages - 1, m.num_stages + 1):
                    out.append(with_mesh(i, replace(m, num_stages=k)))
            for j in range(len(choices) if up is not None else 0):
                lower = steps[j][0]
                if j != i and lower is not None:
                    out.append(tuple(replace(x, num_stages=up) if n == i else replace(x, num_stages=lower) if n == j
                                     else x for n, x in enumerate(choices)))
        for rc in RECOMPUTE_MODES:
            if rc != m.recompute:
                out.append(with_mesh(i, replace(m, recompute=rc)))
    if len(choices) <= 4:
        out += [perm for perm in itertools.permutations(choices) if perm != choices]
    else:
        out += [choices[:i] + (choices[i + 1], choices[i]) + choices[i + 2:] for i in range(len(choices) - 1)]
    if len(choices) > 1:
        out += [choices[:i] + choices[i + 1:] for i in range(len(choices))]
    used = {m.cluster for m in choices}
    for cl in space.inventory.clusters:
        if cl.name in used or not space.tp[cl.name]:
            continue
        for dp in divisors(S):
            added = [space.mesh(cl.name, max(space.tp[cl.name]), dp, S, 0, 0, devices_used)]
            if space.stage_decision:
                # the cost objective's tree also gives a mesh fewer stages than its devices allow (a plan pays for
                # the devices it uses): the cheapest mesh of the cluster, one stage at every TP, is a move too (one
                # device of a cheap cluster holding the head: the 736-device example's cheapest plan, which adding
                # the cluster at its largest TP and most stages never reaches)
                added += [space.mesh(cl.name, tp, dp, S, 0, 0, devices_used, stages=1) for tp in space.tp[cl.name]]
            for mesh in dict.fromkeys(added):
                for i in range(len(choices) + 1):
                    out.append(choices[:i] + (mesh,) + choices[i:])
            if space.stage_decision:
                # the cluster's one-stage meshes in place of a step of the stages of a mesh beside it (a cheap stage
                # taking the head or a few layers off a neighbour whose stages are full: 4 910B holding the head after
                # 256 H800 at 1 layer a stage, which take two stages fewer; either step alone is dearer)
                lower = [down for down, _ in steps]
                for mesh in dict.fromkeys(added[1:]):
                    for i in range(len(choices) + 1):
                        for j in (i - 1, i):        # the meshes beside it
                            if 0 <= j < len(choices) and (k := lower[j]) is not None:
                                fewer = choices[:j] + (replace(choices[j], num_stages=k),) + choices[j + 1:]
                                out.append(fewer[:i] + (mesh,) + fewer[i:])
    for S2 in step_neighbours(space.samples, S):
        # each mesh absorbs the change in its DP or in its micro-batch (every combination up to four meshes)
        per_mesh = []
        for m in choices:
            opts = []
            if m.dp * S2 % S == 0:
                opts.append(replace(m, dp=m.dp * S2 // S))
            if m.micro_batch_size * S2 % S == 0:
                opts.append(replace(m, micro_batch_size=m.micro_batch_size * S2 // S))
            per_mesh.append(opts)
        if any(not o for o in per_mesh):
            continue
        if len(choices) <= 4:
            out += list(itertools.product(*per_mesh))
        else:
            out += [tuple(o[0] for o in per_mesh), tuple(o[-1] for o in per_mesh)]
        # or every mesh keeps its TP and micro-batch, scales its DP with S and takes the stages its devices allow
        # (the tree's rule): DP 128 x 4 stages -> DP 64 x 8 in one step, which the moves above (stages +-1 or
        # halved, DP absorbed with the devices of half the stages idle) would need several climbs for
        if all(m.dp * S2 % S == 0 for m in choices):
            refit = space.refit([(m.cluster, m.tp, m.dp * S2 // S) for m in choices], S2)
            out.append(tuple(replace(r, recompute=m.recompute) for r, m in zip(refit, choices)))
        # or one mesh takes another shape at the new S (stages as its devices allow, as the tree gives them)
        # while the others absorb the change in their micro-batch: the TP/DP move across an S step
        if all(m.micro_batch_size * S2 % S == 0 for m in choices):
            absorbed = [replace(m, micro_batch_size=m.micro_batch_size * S2 // S) for m in choices]
            for i, m in enumerate(choices):
                before = sum(x.num_stages for x in choices[:i])
                for tp in space.tp[m.cluster]:
                    for dp in divisors(S2):
                        out.append(absorbed[:i] + [space.mesh(m.cluster, tp, dp, S2, before, len(choices) - i - 1,
                                                              devices_used - m.tp * m.dp * m.num_stages)]
                                   + absorbed[i + 1:])
        # or one mesh takes another shape at the new S while the others refit (their DP scaled with S, the stages
        # their devices allow): the refit above where one mesh's devices cannot take its DP scaled (8 devices at
        # TP 4 x DP 2 -> DP 4), so that mesh must reshape too (TP 2 x DP 4)
        scaled = [(x.cluster, x.tp, x.dp * S2 // S) for x in choices]
        for i, m in enumerate(choices):
            if not all(x.dp * S2 % S == 0 for j, x in enumerate(choices) if j != i):
                continue
            for tp in space.tp[m.cluster]:
                for dp in divisors(S2):
                    shapes = list(scaled)
                    shapes[i] = (m.cluster, tp, dp)
                    refit = space.refit(shapes, S2)
                    out.append(tuple(r if j == i else replace(r, recompute=x.recompute)
                                     for j, (r, x) in enumerate(zip(refit, choices))))
    return [tuple(c) for c in out]
