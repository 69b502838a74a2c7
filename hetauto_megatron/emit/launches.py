"""A plan's torchrun launches: its meshes grouped into one job per run of consecutive meshes of one cluster and
one pipeline, with node sizes and the plan's inventory checked (docs/launch.md).

Apart from the launch scripts (emit/megatron.py) because the grouping and its checks are the emitters' common
ground: DeepSpeed's configs are named like the launch scripts (`file_stems`), and `hetauto emit` checks a plan
against its inventory (`check_plan_inventory`) whatever it writes. A cluster whose meshes are not consecutive in
the plan, or that runs meshes of several pipelines, gets one launch per run, each with its own rank offset.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import InputError
from ..plan.plan import Plan, launch_nodes
from ..spec.devices import get_device


@dataclass(frozen=True)
class Launch:
    """One torchrun job: consecutive meshes of one cluster and one pipeline, ranks [rank_offset, rank_offset +
    num_devices)."""
    cluster: str
    mesh_indices: tuple[int, ...]
    rank_offset: int
    num_devices: int
    nproc_per_node: int   # the node size, or all of a launch smaller than one node
    vendor: str
    name: str    # file stem: the cluster, plus ".mesh<i>" when the cluster has several launches
    pipeline: int = 0

    @property
    def nnodes(self) -> int:
        return self.num_devices // self.nproc_per_node


def inventory_cluster(plan: Plan, name: str) -> dict | None:
    """The entry of cluster `name` in the inventory the plan carries (a dict as written), or None."""
    for c in (plan.inventory or {}).get("clusters", []) or []:
        if isinstance(c, dict) and str(c.get("name")) == name:
            return c
    return None


def _devices_per_node(plan: Plan, cluster: str, override: int | None, file: str | None = None) -> tuple[int, str]:
    """(the node size of a cluster, where it came from): the plan's inventory's ("inventory"), else `override`
    (--devices-per-node, "flag"), else 8 ("default"). An override that contradicts the inventory is refused: the
    inventory is what the plan was made (and priced) for."""
    inv = inventory_cluster(plan, cluster)
    if inv and isinstance(inv.get("devices_per_node"), int) and inv["devices_per_node"] > 0:
        if override and override != inv["devices_per_node"]:
            raise InputError(f"the plan's inventory gives cluster {cluster} {inv['devices_per_node']} devices per "
                             f"node, not {override}", file=file, field="--devices-per-node",
                             fix="drop --devices-per-node (it is for plans without an inventory), or edit the "
                                 "inventory's devices_per_node and re-plan")
        return inv["devices_per_node"], "inventory"
    # the common node size; documented in docs/launch.md, override with --devices-per-node
    return (override, "flag") if override else (8, "default")


def plan_launches(plan: Plan, *, devices_per_node: int | None = None, file: str | None = None) -> list[Launch]:
    """Group the plan's meshes into launches and check them against the plan's inventory (when it has one)."""
    from .summary import count_noun
    check_plan_inventory(plan, file)
    groups = []
    for idx in plan.launch_groups():
        i = idx[0]
        mesh = plan.meshes[i]
        n = sum(plan.meshes[k].num_devices for k in idx)
        dpn, source = _devices_per_node(plan, mesh.cluster, devices_per_node, file)
        if launch_nodes(n, dpn) is None:
            reason = (f"cluster {mesh.cluster} runs {count_noun(n, 'process')}, not a whole number of {dpn}-device "
                      f"nodes, so torchrun cannot start them with one --nproc-per-node")
            if source == "flag":
                raise InputError(f"{reason} (--devices-per-node {dpn} sets the node size: the plan has no inventory "
                                 f"for cluster {mesh.cluster})", file=file, field="--devices-per-node",
                                 fix=f"give --devices-per-node the real node size of cluster {mesh.cluster}, one that "
                                     f"divides {n}, or use whole nodes in the plan")
            if source == "inventory":   # the cluster's own node size: --devices-per-node may not differ from it
                fix = (f"use whole {dpn}-device nodes of cluster {mesh.cluster} in the plan (re-plan: the "
                       "planner uses whole nodes; or change the meshes' dp or stages)")
            else:
                fix = ("use whole nodes in the plan, or pass --devices-per-node with the cluster's real node size "
                       f"if it divides {n}")
            raise InputError(reason, file=file, field=f"meshes[{i}]", fix=fix)
        groups.append((idx, n, dpn, source))
    sizes = {plan.meshes[idx[0]].cluster: (dpn, source) for idx, _, dpn, source in groups}
    # launches of one cluster start on nodes of their own: together no more nodes than the inventory's
    plan.check_whole_nodes(lambda c: (sizes[c][0], (inventory_cluster(plan, c) or {}).get("nodes")), file)
    try:
        plan.check_tp_inside_nodes(lambda cluster: sizes[cluster][0], file)
    except InputError as exc:
        # The plan's TP is at fault only against a node size the plan's inventory gives: one that
        # --devices-per-node gave (or the default 8 assumed) is the thing to change.
        k = next((k for k, m in enumerate(plan.meshes) if exc.field == f"meshes[{k}].tp"), None)
        if k is None or sizes[plan.meshes[k].cluster][1] == "inventory":
            raise
        mesh = plan.meshes[k]
        if devices_per_node:
            raise InputError(f"{exc.reason}, and --devices-per-node {devices_per_node} sets the node size (the plan "
                             f"has no inventory for cluster {mesh.cluster})", file=file,
                             field="--devices-per-node",
                             fix=f"give --devices-per-node the real node size of cluster {mesh.cluster}, a multiple "
                                 f"of tp={mesh.tp} (or drop it for 8)") from None
        raise InputError(f"{exc.reason}, and 8 devices per node are assumed (the plan has no inventory for cluster "
                         f"{mesh.cluster})", file=file, field=exc.field,
                         fix=f"pass --devices-per-node with the real node size of cluster {mesh.cluster}, a multiple "
                             f"of tp={mesh.tp}, or use a smaller tp and re-plan") from None
    clusters = [plan.meshes[idx[0]].cluster for idx, *_ in groups]
    launches = []
    stems = file_stems(clusters, [idx[0] for idx, *_ in groups], file)
    for (idx, n, dpn, _), name, stem in zip(groups, clusters, stems):
        launches.append(Launch(name, idx, plan.rank_offset(idx[0]), n, min(n, dpn),
                               get_device(plan.meshes[idx[0]].device_type).vendor, stem, plan.meshes[idx[0]].pipeline))
    return launches


def only_cluster(emitted: list[dict], cluster: str | None) -> list[dict]:
    """The emitted launches or configs (each with its "cluster") of `cluster`, every one for None: the plan is
    rendered once, whole, since `hetauto emit --cluster -o` also names the files of the other clusters (which are
    not stale)."""
    if cluster is None:
        return emitted
    mine = [e for e in emitted if e["cluster"] == cluster]
    if not mine:
        raise InputError(f"the plan has no cluster named {cluster!r}", field="--cluster",
                         fix=f"use one of: {', '.join(sorted({e['cluster'] for e in emitted}))}")
    return mine


def file_stems(clusters: list[str], first_meshes: list[int], file: str | None = None) -> list[str]:
    """The name of each emitted file (launch script, DeepSpeed config) of a list of launches or meshes: its cluster,
    or `<cluster>.mesh<i>` (i: its first mesh) for a cluster with several, to keep their files apart. A cluster
    named like another's such name (`a.mesh1`) would have its file written over: refused, naming it."""
    stems = [c if clusters.count(c) == 1 else f"{c}.mesh{i}" for c, i in zip(clusters, first_meshes)]
    for k, stem in enumerate(stems):
        if stems.index(stem) != k:
            j = stems.index(stem)
            mine, other = (j, k) if clusters[j] == stem else (k, j)
            raise InputError(f"names cluster {stem!r}, the name hetauto gives the files of mesh {first_meshes[other]} "
                             f"of cluster {clusters[other]!r} (a cluster of several launches gets one file per "
                             "launch, named <cluster>.mesh<i>): one would write over the other",
                             file=file, field=f"meshes[{first_meshes[mine]}].cluster",
                             fix=f"rename cluster {stem!r} (in the inventory, and re-plan) to a name not of the "
                                 "form <cluster>.mesh<i>")
    lowered = [stem.lower() for stem in stems]
    for k, low in enumerate(lowered):
        j = lowered.index(low)
        if j != k and stems[j] != stems[k]:
            # one file on the case-insensitive file systems of macOS and Windows (where scripts are often written
            # before they are copied to the clusters): the second would replace the first there
            raise InputError(f"clusters {stems[j]!r} and {stems[k]!r} differ only in case, so their files "
                             f"({stems[j]}.sh and {stems[k]}.sh) are one file on macOS's and Windows' file systems",
                             file=file, field=f"meshes[{first_meshes[k]}].cluster",
                             fix=f"rename one of them (in the inventory, and re-plan)")
    return stems


def check_plan_inventory(plan: Plan, file: str | None) -> None:
    """The plan may carry the inventory it was made for: its clusters must exist and be big enough (every
    'hetauto emit' target checks it: a summary of a plan that cannot run would print stale estimates)."""
    plan.check_precision(file)      # a precision a mesh's device lacks, named with the plan's file
    if not plan.inventory:
        return
    used: dict[str, int] = {}
    for k, mesh in enumerate(plan.meshes):
        inv = inventory_cluster(plan, mesh.cluster)
        if inv is None:
            names = [str(c.get("name")) for c in plan.inventory.get("clusters", []) if isinstance(c, dict)]
            raise InputError(f"names cluster {mesh.cluster!r}, which the plan's inventory does not list",
                             file=file, field=f"meshes[{k}].cluster", fix=f"use one of: {', '.join(names)}")
        inv_dev = inv.get("device")
        if inv_dev is not None and get_device(str(inv_dev)).name != mesh.device_type:
            raise InputError(f"says device_type {mesh.device_type} but cluster {mesh.cluster} has {inv_dev}",
                             file=file, field=f"meshes[{k}].device_type", fix=f"write device_type: {inv_dev}")
        used[mesh.cluster] = used.get(mesh.cluster, 0) + mesh.num_devices
    for name, n in used.items():
        inv = inventory_cluster(plan, name)
        have = int(inv.get("nodes", 0)) * int(inv.get("devices_per_node", 0))
        if have and n > have:
            raise InputError(f"uses {n} devices of cluster {name}, which has only {have}", file=file,
                             field="meshes", fix="reduce tp, dp or the stage count of that cluster's meshes")
    _check_launchable(plan, file)


def _check_launchable(plan: Plan, file: str | None) -> None:
    """What simulate, explain and compare check of a plan against the inventory it stores, for every emit target
    too (a DeepSpeed config or a summary of a layout no launch can start was written): whole nodes, TP groups inside
    a node, and a link between clusters next to each other in a pipeline."""
    from ..plan.simulate import check_plan_against_inventory
    from ..spec.inventory import inventory_from_dict
    try:
        inventory = inventory_from_dict(plan.inventory, file=file)
    except InputError as exc:
        raise exc.within(prefix="inventory") from None
    try:
        check_plan_against_inventory(plan, inventory)
    except InputError as exc:       # a missing link is a field of the stored inventory, the rest of the plan
        raise exc.within(file=file, prefix="inventory" if exc.field == "links" else None) from None
