"""Why a search found no plan: one paragraph that names the nearest miss and the fix (plan/search.py raises it
when no layout the tree holds fits; the constraints' own check is plan/constraints.py check_floor)."""
from __future__ import annotations

from ..errors import InfeasibleError
from ..spec.inventory import Inventory
from ..spec.model import ModelSpec
from . import space as space_mod
from .evaluator import LayoutEvaluator
from .search_jobs import layout_value
from .space import SearchSpace

EXHAUSTIVE_LEAVES = 15000       # trees this small are cheap to enumerate in full (the report prices their leaves)


def raise_infeasible(model: ModelSpec, inventory: Inventory, ev: LayoutEvaluator, sp: SearchSpace):
    """InfeasibleError for a search that found no layout: the closest memory miss, a cluster that cannot hold one
    layer, pinned clusters no chain of links joins, or the rules (`ev` holds what the search rejected)."""
    if not ev.rejected:                 # the trees ran in other processes: price some layouts here
        value = layout_value(sp, ev)
        for path in space_mod.leaves(sp, limit=EXHAUSTIVE_LEAVES):
            value(path)
    largest = max(c.device.memory_gib for c in inventory.clusters)
    # the devices the search may use: the clusters not excluded, at most --max-devices
    usable = sum(c.num_devices for c in inventory.clusters if c.name not in sp.con.exclude_clusters)
    devices = (f"the {sp.con.max_devices} devices --max-devices allows" if sp.con.max_devices is not None
               and sp.con.max_devices < usable else f"the inventory's {usable} devices"
               + (" not excluded" if sp.con.exclude_clusters else ""))
    # what "full recomputation" means here: everywhere, or where --recompute leaves the choice to the search
    pins = [f"{c}={m}" for c, m in sp.con.recompute if m != "full"]
    even = "even with full recomputation" + (f" where --recompute leaves it free ({', '.join(pins)} pinned)"
                                             if pins else "")
    miss = ev.closest_miss()
    if miss:
        short, where = miss
        depth = sp.max_stages(1)
        fix = said = "Add devices or clusters, or shorten --seq-length"      # (a sentence of its own)
        depth_note = ""
        field = None        # (no one field: the inventory's devices, or the sequence)
        # the batch (or --max-pp) caps the pipeline's depth, not the layers nor the devices (a stage needs one)
        if depth < min(model.num_layers + 2, sp.max_devices):
            # what binds: --max-pp below the batch's micro-batches, else the batch (and --max-pp, if given, next)
            field = "--max-pp" if sp.con.max_pp and depth == sp.con.max_pp < sp.gbs else "--global-batch-size"
            fix = (("a larger --max-pp" if field == "--max-pp" else "a larger --global-batch-size"
                    + (" or --max-pp" if sp.con.max_pp else "")) + " allows deeper "
                   "pipelines; or add devices with more memory, or shorten --seq-length")
            depth_note = (f" The pipeline is at most {depth} stage{'s' if depth != 1 else ''} deep here (no more "
                          f"stages than micro-batches: the global batch is {sp.gbs}"
                          + (f"; --max-pp {sp.con.max_pp}" if sp.con.max_pp else "") + ").")
            said = None
        raise InfeasibleError(
            f"{model.name} does not fit on {devices} {even}: the closest layout misses by {short:.1f} GiB per device (a stage on {where}; the "
            f"largest device has {largest:.0f} GiB).{space_mod.tp_shape_note(model, inventory)}"
            f"{_groups_note(inventory, sp)}{depth_note}", field=field, fix=fix, said=said)
    layer = _one_layer_miss(model, inventory, sp)
    if layer:
        short, need, index, tp, dp = layer
        c = inventory.clusters[index]
        memory = (f'clusters[{index}].memory_gib', f'cluster.{c.name}.memory_gib')
        fix = (f"devices with more memory ({inventory.where(*memory)}), more devices per node for a larger TP, or a "
               "shorter --seq-length")
        file, field = inventory.locate(*memory)
        raise InfeasibleError(
            f"{model.name} does not fit on {devices} {even}: not one transformer layer fits on any device; the closest stage misses by {short:.1f} "
            f"GiB per device (one layer at TP {tp}, DP {dp} on cluster {c.name}: {c.device.name}, "
            f"{c.device.memory_gib:g} GiB, needs {need:.1f} GiB).{space_mod.tp_shape_note(model, inventory)}",
            file=file, field=field, fix=fix)
    apart = _unlinked(inventory, sp.con.use_clusters)
    if apart:
        fix = f"add a link between them ({inventory.where('links')}), or drop --use-clusters"
        file, field = inventory.locate("links")
        raise InfeasibleError(
            f"{model.name}: --use-clusters requires {', '.join(sp.con.use_clusters)} in one pipeline, but the "
            f"inventory links no chain of clusters from {apart[0]} to {apart[1]} (clusters next to each other in "
            f"the pipeline must be linked).", file=file, field=field, fix=fix)
    rules = ("TP divides the heads and the MLP width (and the sequence, with sequence parallelism), the global "
             "batch is a whole number of micro-batch steps of every mesh's DP x micro-batch size, clusters next to "
             "each other in a pipeline are linked")
    # the depth cap of space.max_stages: with --use-clusters naming more clusters than it allows, it is the rule;
    # the paragraph names the bound that gives it (the layers, or the micro-batches and --max-pp)
    samples = sp.con.micro_batch_size or 1
    depth = sp.max_stages(samples)
    if depth < min(sp.gbs // samples, sp.con.max_pp or sp.gbs):
        rules += (f", a pipeline has no more stages than its layers and an embedding and a head stage (here at "
                  f"most {depth}: {model.num_layers} layers)")
    elif sp.con.max_pp and sp.con.max_pp <= sp.gbs // samples:     # (the flag binds, not the micro-batches)
        rules += f", a pipeline has at most --max-pp {sp.con.max_pp} stage{'s' if sp.con.max_pp != 1 else ''}"
    else:
        rules += (f", a pipeline has no more stages than micro-batches (here at most {depth}: global batch {sp.gbs}"
                  + (f", --micro-batch-size {sp.con.micro_batch_size}" if sp.con.micro_batch_size else "") + ")")
    if ev.engine == "deepspeed":
        rules += ", and DeepSpeed's engine runs one TP, DP and micro-batch size in every mesh"
    raise InfeasibleError(f"{model.name}: no layout of this inventory follows the rules ({rules})")


def _groups_note(inventory: Inventory, sp: SearchSpace) -> str:
    """Where no chain of links joins the usable clusters, a plan holds one group of them only, whose devices are
    fewer than the count the paragraph names: say so, with the link that would join them."""
    names = [c.name for c in inventory.clusters if c.name not in sp.con.exclude_clusters]
    groups: list[list[str]] = []
    for name in names:
        if not any(name in g for g in groups):
            reached = [name] + [o for o in names if o != name and _unlinked(inventory, [name, o]) is None]
            groups.append(reached)
    if len(groups) < 2:
        return ""
    return (f" No chain of links joins {' | '.join(', '.join(g) for g in groups)}: a plan uses the devices of one "
            f"of these groups only (a link between them, {inventory.where('links')}, lets it use more).")


def _unlinked(inventory: Inventory, required) -> tuple[str, str] | None:
    """Two of the `required` clusters that no chain of links joins (a pipeline cannot hold both), or None."""
    if len(required) < 2:
        return None
    names = [c.name for c in inventory.clusters]
    reached, todo = {required[0]}, [required[0]]
    while todo:
        a = todo.pop()
        for b in names:
            if b not in reached and inventory.link(a, b) is not None:
                reached.add(b)
                todo.append(b)
    other = next((c for c in required if c not in reached), None)
    return (required[0], other) if other else None


def _one_layer_miss(model: ModelSpec, inventory: Inventory, sp: SearchSpace):
    """When the tree has no leaf because no mesh can hold even one layer (SearchSpace.fits_one_layer prunes
    it), the stage shape that misses by the least: (GiB short, GiB needed, cluster index, TP, DP), or None when some
    one-layer stage fits (the tree is empty for another reason). The shapes are the tree's own: its TP degrees,
    DP dividing a micro-batch step, the pinned micro-batch (else 1) and recomputation (else full)."""
    from .costing import stage_profile
    from .memory_fit import stage_memory_reader
    gib = 1024 ** 3
    best = None
    mb = sp.con.micro_batch_size or 1
    for index, c in enumerate(inventory.clusters):
        for tp in sp.tp.get(c.name, []):
            for dp in [s // mb for s in sp.samples if s >= mb and tp * (s // mb) <= c.num_devices]:
                prof = stage_profile(model, c, tp, dp, mb, sp._rc(c.name), sp.cost, sp.settings_of(tp, c.name))
                need = stage_memory_reader(model, prof, False, False)(1, 1)
                if need <= prof.memory_cap:
                    return None
                short = (need - prof.memory_cap) / gib
                if best is None or short < best[0]:
                    best = (short, need / gib, index, tp, dp)
    return best
