"""Inventory: the clusters a job may use and the links between them.

Bandwidths in the file are network figures in Gbit/s (what a datasheet or iperf3 prints); intra-node and
inter-node latencies are in microseconds, inter-cluster latency in milliseconds. Internally everything is
bytes/s and seconds.
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field

from ..errors import InputError
from ._fields import MAX_FIGURE, get, positive, reject_unknown, require_mapping, shorten
from .devices import PRECISIONS, DeviceType, get_device
from .files import load_yaml_file
from .overheads import RuntimeOverhead, overhead_from_value


@dataclass(frozen=True)
class LinkSpec:
    bandwidth_gbps: float      # Gbit/s: what the link carries with every connection on it busy (the aggregate)
    latency_s: float
    # Gbit/s one connection (one rank pair's TCP stream) reaches alone; None: no per-connection limit. On a
    # long-haul path a single stream gets far less than the path (window / round trip), concurrent pairs add up
    # until the aggregate: k connections move min(bandwidth, k x flow) (docs/cost-model.md, "Pipeline sends").
    flow_gbps: float | None = None
    # inter_node only: Gbit/s all devices of one node reach together on the network (one NIC shared by the node,
    # as on a cloud VM); None: each device has its own (the bandwidth is per device)
    node_gbps: float | None = None

    @property
    def bytes_per_s(self) -> float:
        return self.bandwidth_gbps * 1e9 / 8

    def bytes_per_s_over(self, flows: int | None = None) -> float:
        """Bytes/s of `flows` concurrent connections (None: the aggregate, as if enough connections ran)."""
        if self.flow_gbps is None or flows is None:
            return self.bytes_per_s
        return min(self.bandwidth_gbps, max(flows, 1) * self.flow_gbps) * 1e9 / 8

    def transfer_time(self, nbytes: float, flows: int | None = None) -> float:
        return self.latency_s + nbytes / self.bytes_per_s_over(flows)


@dataclass(frozen=True)
class Cluster:
    name: str
    device: DeviceType
    nodes: int
    devices_per_node: int
    intra_node: LinkSpec
    inter_node: LinkSpec
    price_per_device_hour: float | None = None   # optional, any currency: 'hetauto compare' reports cost per token
    overhead: RuntimeOverhead | None = None      # measured runtime overheads (`overheads:`); None: the vendor's
    # Gbit/s all of this cluster's links to other clusters carry together, each direction (its site's uplink or
    # gateway; for a cluster of one node, the node's NIC); None: every link has its own path
    uplink_gbps: float | None = None

    def __post_init__(self):
        if self.nodes < 1 or self.devices_per_node < 1:
            raise InputError(f"cluster '{self.name}' needs at least one node and one device per node",
                             field="nodes", fix="set nodes and devices_per_node to 1 or more")

    @property
    def num_devices(self) -> int:
        return self.nodes * self.devices_per_node

    @property
    def uplink_bytes_per_s(self) -> float | None:
        """Bytes/s of the uplink all its links to other clusters share, each direction (None: no shared uplink)."""
        return None if self.uplink_gbps is None else self.uplink_gbps * 1e9 / 8


@dataclass(frozen=True)
class Inventory:
    clusters: tuple[Cluster, ...]
    links: dict = field(default_factory=dict)   # frozenset({a, b}) -> LinkSpec
    source: str | None = None
    # The job's training precision the devices are priced at (with_precision); "" = the catalog's 16-bit peaks.
    # Precision is not a field of the inventory file: it is a property of the job (hetauto plan --precision).
    precision: str = ""
    # Where its figures came from, for messages only: the --set items applied to it (spec/whatif.py), and whether
    # it is a plan file's stored inventory (its fields then sit under the plan's `inventory:`)
    overrides: tuple = field(default=(), compare=False)
    stored_in_plan: bool = field(default=False, compare=False)

    def __post_init__(self):
        names = [c.name for c in self.clusters]
        if not names:
            raise InputError("lists no clusters", file=self.source, field="clusters",
                             fix="add at least one cluster entry (name, device, nodes, devices_per_node)")
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise InputError(f"cluster name(s) {', '.join(dup)} appear more than once", file=self.source,
                             field="clusters", fix="give every cluster a unique name")
        # Lookups the search makes hundreds of thousands of times (a frozen inventory's answers never change):
        # not fields, so equality, repr and the file format ignore them.
        object.__setattr__(self, "_by_name", {c.name: c for c in self.clusters})
        object.__setattr__(self, "_links_seen", {})

    @property
    def num_devices(self) -> int:
        return sum(c.num_devices for c in self.clusters)

    def cluster(self, name: str) -> Cluster:
        c = self._by_name.get(name)
        if c is not None:
            return c
        raise InputError(f"has no cluster named {name!r}", file=self.source, field="clusters",
                         fix=f"use one of the inventory's clusters: {', '.join(c.name for c in self.clusters)}")

    def with_link_time_scale(self, scale: float) -> "Inventory":
        """The inventory whose links between clusters take `scale` times as long (bandwidths, flows and uplinks
        over `scale`, latencies times it): what a dry run's link emulation (--emulate-links SCALE) runs, which its
        prediction must price. The networks inside a cluster are unchanged (the emulation leaves them be)."""
        if scale == 1:
            return self
        links = {k: dataclasses.replace(l, bandwidth_gbps=l.bandwidth_gbps / scale, latency_s=l.latency_s * scale,
                                        flow_gbps=None if l.flow_gbps is None else l.flow_gbps / scale)
                 for k, l in self.links.items()}
        clusters = tuple(dataclasses.replace(c, uplink_gbps=None if c.uplink_gbps is None else c.uplink_gbps / scale)
                         for c in self.clusters)
        return dataclasses.replace(self, clusters=clusters, links=links)

    def where(self, field_name: str, set_key: str | None = None) -> str:
        """Where a user changes the inventory's `field_name` ('clusters[0].memory_gib'): the --set item that gave it
        (`set_key`: 'cluster.h800.memory_gib'), else the file and the field (under `inventory.` in a plan file)."""
        given = [o for o in self.overrides if set_key and o.partition("=")[0].strip() == set_key]
        if given:
            return f"--set {given[-1]}"
        file, name = self.locate(field_name, set_key)
        return f"{file}, field '{name}'" if file else f"field '{name}'"

    def locate(self, field_name: str, set_key: str | None = None) -> tuple[str | None, str]:
        """(file, field) of `where`, as an error's file and field: (None, '--set') where a --set item gave it."""
        if any(set_key and o.partition("=")[0].strip() == set_key for o in self.overrides):
            return None, "--set"
        return self.source or None, ("inventory." if self.stored_in_plan else "") + field_name

    def with_precision(self, precision: str) -> "Inventory":
        """The inventory as a job training in `precision` sees it: every device's peak and element size at that
        precision (spec/devices.py); InputError naming the cluster if a device lacks it."""
        if precision == self.precision:
            return self
        clusters, refused = [], []
        for c in self.clusters:
            try:
                dev = c.device.at_precision(precision, field="--precision")
            except InputError as exc:
                refused.append((c.name, exc))      # every such cluster named at once, not one per attempt
                continue
            clusters.append(dataclasses.replace(c, device=dev))
        if refused:
            exc = refused[0][1]
            # a precision to suggest is one every cluster has (not one the first refused device has: an A100 and a
            # V100 refused fp8 with "choose bf16, fp16, fp32", and the V100 refuses bf16 too)
            common = [p for p in PRECISIONS if p != precision and not self.unable_at(p)]
            them, it = ("that cluster", "it") if len(refused) == 1 else ("those clusters", "them")
            fix = ((f"choose a precision every cluster has: {', '.join(common)}, or " if common else
                    "no precision suits every cluster: ") + f"leave {them} out (hetauto plan --exclude-clusters, or "
                   f"remove {it} from the inventory)")
            raise InputError("; ".join(f"cluster {name}: {e.reason}" for name, e in refused), file=self.source,
                             field=exc.field, fix=fix)
        return dataclasses.replace(self, clusters=tuple(clusters), precision=precision)

    def unable_at(self, precision: str) -> tuple[str, ...]:
        """The clusters whose device cannot train at `precision` (spec/devices.py at_precision)."""
        unable = []
        for c in self.clusters:
            try:
                c.device.at_precision(precision)
            except InputError:
                unable.append(c.name)
        return tuple(unable)

    def without(self, names) -> "Inventory":
        """The inventory without the clusters `names` and their links (the one way to take clusters out)."""
        names = set(names)
        if not names:
            return self
        return dataclasses.replace(self, clusters=tuple(c for c in self.clusters if c.name not in names),
                                   links={k: v for k, v in self.links.items() if not k & names})

    def link(self, a: str, b: str) -> LinkSpec | None:
        """The link pipeline traffic between clusters a and b travels on (inter-node network when a == b): the
        inventory's entry, no faster than either cluster's uplink (`uplink_gbps`) where one is given."""
        if a == b:
            return self.cluster(a).inter_node
        seen = self._links_seen
        if (a, b) not in seen:
            seen[(a, b)] = self._capped_link(a, b)
        return seen[(a, b)]

    def _capped_link(self, a: str, b: str) -> LinkSpec | None:
        link = self.links.get(frozenset((a, b)))
        if link is None:
            return None
        cap = min((c.uplink_gbps for c in (self.cluster(a), self.cluster(b)) if c.uplink_gbps), default=None)
        if cap is None or cap >= link.bandwidth_gbps:
            return link
        return dataclasses.replace(link, bandwidth_gbps=cap,
                                   flow_gbps=min(link.flow_gbps, cap) if link.flow_gbps is not None else None)

    def to_dict(self) -> dict:
        def _as_written(x: float) -> float:
            # a latency read in us or ms is held in seconds; back in its unit, 15 us must not read 14.999999999999998
            return float(f"{x:.12g}")
        return {
            "clusters": [{
                "name": c.name, "device": c.device.name, "nodes": c.nodes, "devices_per_node": c.devices_per_node,
                "memory_gib": c.device.memory_gib, "peak_tflops": c.device.reference_tflops, "hbm_gbps": c.device.hbm_gbps,
                "intra_node": {"bandwidth_gbps": c.intra_node.bandwidth_gbps, "latency_us": _as_written(c.intra_node.latency_s * 1e6)},
                "inter_node": {"bandwidth_gbps": c.inter_node.bandwidth_gbps, "latency_us": _as_written(c.inter_node.latency_s * 1e6),
                               **({"node_gbps": c.inter_node.node_gbps} if c.inter_node.node_gbps else {})},
                **({"price_per_device_hour": c.price_per_device_hour} if c.price_per_device_hour is not None else {}),
                **({"uplink_gbps": c.uplink_gbps} if c.uplink_gbps is not None else {}),
                # written wherever the device has TF32, so a plan file says which arithmetic its fp32 GEMMs ran in
                **({"tf32": c.device.tf32} if c.device.has_tf32 else {}),
                **({"overheads": c.overhead.to_dict()} if c.overhead is not None else {}),
            } for c in self.clusters],
            "links": [{"between": sorted(pair), "bandwidth_gbps": l.bandwidth_gbps, "latency_ms": _as_written(l.latency_s * 1e3),
                       **({"flow_gbps": l.flow_gbps} if l.flow_gbps is not None else {})}
                      for pair, l in sorted(self.links.items(), key=lambda kv: sorted(kv[0]))],
        }


_CLUSTER_KEYS = {"name", "device", "nodes", "devices_per_node", "intra_node", "inter_node", "memory_gib",
                 "peak_tflops", "hbm_gbps", "price_per_device_hour", "tf32", "overheads", "uplink_gbps"}
_DEFAULT_INTER_NODE = {"bandwidth_gbps": 200.0, "latency_us": 10.0}   # one 200 Gbit/s NIC per device pair
_DEFAULT_INTRA_NODE_LATENCY_US = 5.0
# Cluster names become file names of the emitted launch scripts and configs, and words in shell commands.
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def check_cluster_name(name: str, *, file: str | None, field: str) -> str:
    """`name` if it is a usable cluster name (an inventory's, or a plan mesh's: `hetauto emit` writes NAME.sh and
    puts the name into shell scripts), else an InputError."""
    if not _NAME_RE.fullmatch(name):
        raise InputError(f"{name!r} is not a usable cluster name", file=file, field=field,
                         fix="use letters, digits, '.', '_' and '-' only (it names emitted files)")
    return name


MAX_LATENCY_S = 60.0     # one way: a minute is no network (a satellite hop is a quarter of a second)


def _link(data, *, file, prefix, default=None, latency_key="latency_us", scale=1e-6) -> LinkSpec:
    if data is None and default is not None:
        data = default
    data = require_mapping(data, prefix.rstrip("."), file)
    if default is not None:
        data = {**default, **{k: v for k, v in data.items() if v is not None}}   # a partial block keeps the rest
    reject_unknown(data, {"bandwidth_gbps", latency_key}, file=file, prefix=prefix)
    bw = positive(get(data, "bandwidth_gbps", float, file=file, prefix=prefix), prefix + "bandwidth_gbps", file)
    lat = get(data, latency_key, float, default=0.0, file=file, prefix=prefix)
    unit = "ms" if latency_key == "latency_ms" else "µs"
    if lat < 0:
        raise InputError(f"must not be negative, got {lat}", file=file, field=prefix + latency_key,
                         fix=f"give the one-way latency ({unit}), 0 or more")
    if lat * scale > MAX_LATENCY_S:     # (1e300 was taken, and printed tables hundreds of characters wide)
        raise InputError(f"is {lat:g} {unit}, more than {MAX_LATENCY_S:g} s one way: no network", file=file,
                         field=prefix + latency_key, fix=f"check the unit: the one-way latency in {unit}")
    return LinkSpec(bw, lat * scale)


def inventory_from_dict(data: dict, *, file: str | None = None) -> Inventory:
    data = require_mapping(data, "the inventory", file)
    reject_unknown(data, {"clusters", "links", "name", "description"}, file=file)
    # read by people only, but a list or mapping there is a mis-indented block, not a description
    get(data, "name", (str, int), default=None, file=file, fix="write 'name:' as one line of text")
    get(data, "description", str, default=None, file=file, fix="write 'description:' as text (quote it if it "
        "starts with a YAML sign such as '[', '{' or '-')")
    raw_clusters = get(data, "clusters", list, file=file, fix="list the clusters under 'clusters:'")
    if not raw_clusters:        # before the links, which would otherwise be told they name no cluster
        raise InputError("lists no clusters", file=file, field="clusters",
                         fix="add at least one cluster entry (name, device, nodes, devices_per_node)")
    clusters = []
    first_of: dict[str, int] = {}
    for i, raw in enumerate(raw_clusters):
        p = f"clusters[{i}]."
        raw = require_mapping(raw, f"clusters[{i}]", file)
        reject_unknown(raw, _CLUSTER_KEYS, file=file, prefix=p)
        name = check_cluster_name(str(get(raw, "name", (str, int), file=file, prefix=p)), file=file, field=p + "name")
        # here, before the links: a link naming the other cluster would otherwise be reported as the fault
        if name in first_of:
            raise InputError(f"the cluster name {name!r} appears more than once (clusters[{first_of[name]}] has it "
                             "too)", file=file, field=p + "name", fix="give every cluster a unique name")
        other = next((n for n in first_of if n.lower() == name.lower()), None)
        if other is not None:
            # each cluster's launch script is named after it (emit/launches.py), and h800.sh and H800.sh are one
            # file on macOS's and Windows' file systems: said here, not after a search, by a plan no one can emit
            raise InputError(f"the cluster names {other!r} (clusters[{first_of[other]}]) and {name!r} differ only in "
                             "case, and each names a launch script file", file=file, field=p + "name",
                             fix="give the clusters names that differ in more than case")
        first_of[name] = i
        dev = get_device(str(get(raw, "device", (str, int), file=file, prefix=p)), file=file, field=p + "device")
        overrides = {}
        for key in ("memory_gib", "peak_tflops", "hbm_gbps"):
            v = get(raw, key, float, default=None, file=file, prefix=p)
            overrides[key] = positive(v, p + key, file) if v is not None else None
        dev = dev.with_overrides(**overrides)
        # fp32 GEMMs on the TF32 tensor cores: the device's default (spec/devices.py), `false` to turn them off
        tf32 = get(raw, "tf32", bool, default=None, file=file, prefix=p)
        if tf32 and not dev.has_tf32:
            raise InputError(f"device type {dev.name} has no TF32 tensor cores", file=file, field=p + "tf32",
                             fix="leave tf32 out (its fp32 GEMMs run without tensor cores)")
        if tf32 is not None:
            dev = dataclasses.replace(dev, tf32=tf32)
        nodes = get(raw, "nodes", int, file=file, prefix=p)
        dpn = get(raw, "devices_per_node", int, file=file, prefix=p)
        if nodes < 1 or dpn < 1:
            raise InputError(f"nodes ({shorten(str(nodes), 20)}) and devices_per_node ({shorten(str(dpn), 20)}) must be at least 1", file=file,
                             field=p + ("nodes" if nodes < 1 else "devices_per_node"),
                             fix="count the machines and the accelerators in each machine")
        if nodes > MAX_FIGURE or dpn > MAX_FIGURE:      # as --set refuses them; 10^400 nodes overflowed a float
            raise InputError(f"nodes ({shorten(str(nodes), 20)}) and devices_per_node ({shorten(str(dpn), 20)}) must be at most {MAX_FIGURE:g}",
                             file=file, field=p + ("nodes" if nodes > MAX_FIGURE else "devices_per_node"),
                             fix="count the machines and the accelerators in each machine")
        intra = _link(raw.get("intra_node"), file=file, prefix=p + "intra_node.",
                      default={"bandwidth_gbps": dev.intra_node_gbps, "latency_us": _DEFAULT_INTRA_NODE_LATENCY_US})
        raw_inter = raw.get("inter_node")
        if isinstance(raw_inter, dict):     # (its known keys named with node_gbps, which _link does not read)
            reject_unknown(raw_inter, {"bandwidth_gbps", "latency_us", "node_gbps"}, file=file,
                           prefix=p + "inter_node.")
        node_gbps = None
        if isinstance(raw_inter, dict) and "node_gbps" in raw_inter:
            raw_inter = dict(raw_inter)
            node_gbps = positive(get(raw_inter, "node_gbps", float, file=file, prefix=p + "inter_node."),
                                 p + "inter_node.node_gbps", file)
            del raw_inter["node_gbps"]
        inter = _link(raw_inter, file=file, prefix=p + "inter_node.", default=_DEFAULT_INTER_NODE)
        if node_gbps is not None:
            inter = dataclasses.replace(inter, node_gbps=node_gbps)
        price = get(raw, "price_per_device_hour", float, default=None, file=file, prefix=p)
        if price is not None and not 0 <= price <= MAX_FIGURE:     # NaN too; huge ones made costs inf (bad JSON)
            raise InputError(f"must be between 0 and {MAX_FIGURE:g}, got {price}", file=file,
                             field=p + "price_per_device_hour",
                             fix="give what one device-hour costs (any currency), or leave it out")
        overhead = None
        if raw.get("overheads") is not None:
            overhead = overhead_from_value(raw["overheads"], device=dev, file=file, field=p + "overheads")
            if overhead.fixed_gib >= dev.memory_gib:      # no plan could fit: a unit slip, not a search result
                raise InputError(f"leave no memory for the model: {overhead.fixed_gib:g} GiB of fixed overheads "
                                 f"(context {overhead.context_gib:g} + communication {overhead.comm_gib:g} + "
                                 f"workspace {overhead.workspace_gib:g}) on a {dev.memory_gib:g} GiB device",
                                 file=file, field=p + "overheads",
                                 fix="give the figures in GiB per device, as 'hetauto profile --overheads' measures "
                                     "them (a few GiB), or check the cluster's memory_gib")
        uplink = get(raw, "uplink_gbps", float, default=None, file=file, prefix=p)
        if uplink is not None:
            uplink = positive(uplink, p + "uplink_gbps", file)
        clusters.append(Cluster(name, dev, nodes, dpn, intra, inter, price, overhead, uplink))
    names = {c.name for c in clusters}
    links = {}
    for i, raw in enumerate(get(data, "links", list, default=[], file=file)):
        p = f"links[{i}]."
        raw = require_mapping(raw, f"links[{i}]", file)
        reject_unknown(raw, {"between", "bandwidth_gbps", "latency_ms", "flow_gbps"}, file=file, prefix=p)
        pair = get(raw, "between", list, file=file, prefix=p, fix="write between: [cluster_a, cluster_b]")
        if any(x is None for x in pair):        # (an empty or null entry read as the text 'None')
            raise InputError(f"has an empty entry: {pair}", file=file, field=p + "between",
                             fix=f"name both clusters: between: [cluster_a, cluster_b] (the inventory's: "
                                 f"{', '.join(sorted(names))})")
        pair = [str(x) for x in pair]
        if len(pair) != 2 or pair[0] == pair[1]:
            why = "a link from a cluster to itself; its own network is its inter_node entry" \
                if len(pair) == 2 else f"{len(pair)} cluster name(s)"
            raise InputError(f"must name two different clusters, got {pair} ({why})", file=file,
                             field=p + "between", fix="write between: [cluster_a, cluster_b]")
        for n in pair:
            if n not in names:
                raise InputError(f"names cluster {n!r}, which the inventory does not define", file=file,
                                 field=p + "between", fix=f"use the clusters' names: {', '.join(sorted(names))}")
        key = frozenset(pair)
        if key in links:
            raise InputError(f"the link between {pair[0]} and {pair[1]} is given twice (links are undirected)",
                             file=file, field=p + "between", fix="keep one entry per cluster pair")
        link = _link({k: v for k, v in raw.items() if k not in ("between", "flow_gbps")}, file=file, prefix=p,
                     latency_key="latency_ms", scale=1e-3)
        flow = get(raw, "flow_gbps", float, default=None, file=file, prefix=p)
        if flow is not None:
            flow = positive(flow, p + "flow_gbps", file)
            if flow > link.bandwidth_gbps:
                raise InputError(f"one connection ({flow} Gbit/s) cannot be faster than the whole link "
                                 f"({link.bandwidth_gbps} Gbit/s)", file=file, field=p + "flow_gbps",
                                 fix="give flow_gbps as one rank pair's measured rate, at most bandwidth_gbps "
                                     "(all pairs together), or leave it out")
            link = dataclasses.replace(link, flow_gbps=flow)
        links[key] = link
    return Inventory(tuple(clusters), links, source=file)


def load_inventory(path: str) -> Inventory:
    return inventory_from_dict(load_yaml_file(path, "inventory"), file=path)
