"""What-if overrides of an inventory from the command line: `--set KEY=VALUE`, without editing the file.

Keys (units as in the inventory file, docs/inputs.md):
    link.A-B.bandwidth_gbps   link.A-B.latency_ms          the link between clusters A and B
    link.A-B.flow_gbps        what one connection on it reaches alone
    cluster.X.nodes           cluster.X.devices_per_node
    cluster.X.memory_gib      cluster.X.peak_tflops        cluster.X.hbm_gbps
    cluster.X.intra_node.bandwidth_gbps   cluster.X.intra_node.latency_us   (and inter_node.*, inter_node.node_gbps)
    cluster.X.uplink_gbps     what all of X's links to other clusters carry together
    cluster.X.price_per_device_hour   what one device costs per hour (any currency; --objective cost)
Cluster names may themselves contain '-' or '.': a key is matched against the inventory's own names.
"""
from __future__ import annotations

import dataclasses
import math

from ..errors import InputError
from ._fields import MAX_FIGURE, MIN_FIGURE, shorten
from .inventory import MAX_LATENCY_S, Cluster, Inventory, LinkSpec

LINK_FIELDS = ("bandwidth_gbps", "latency_ms", "flow_gbps")
CLUSTER_FIELDS = ("nodes", "devices_per_node", "memory_gib", "peak_tflops", "hbm_gbps", "uplink_gbps",
                  "price_per_device_hour",
                  "intra_node.bandwidth_gbps", "intra_node.latency_us",
                  "inter_node.bandwidth_gbps", "inter_node.latency_us", "inter_node.node_gbps")
_INT_FIELDS = ("nodes", "devices_per_node")
# what --help adds to a field's name where the name alone does not say it
_FIELD_NOTES = {"flow_gbps": "one connection alone", "uplink_gbps": "all its links to other clusters together",
                "inter_node.node_gbps": "all devices of one node together",
                "price_per_device_hour": "any currency; --objective cost"}


def _fields_text(fields: tuple[str, ...]) -> str:
    return ", ".join(f"{f} ({_FIELD_NOTES[f]})" if f in _FIELD_NOTES else f for f in fields)


def keys_help(width: int = 108) -> str:
    """Every --set key (LINK_FIELDS, CLUSTER_FIELDS) as indented lines for a command's --help description."""
    import textwrap
    rows = [("link.A-B.FIELD", "the link between clusters A and B (either order); FIELD: " + _fields_text(LINK_FIELDS)),
            ("cluster.NAME.FIELD", "a cluster; FIELD: " + _fields_text(CLUSTER_FIELDS))]
    return "\n".join(textwrap.fill(text, width, initial_indent=f"  {key:<20}", subsequent_indent=" " * 22)
                     for key, text in rows)


def keys_line() -> str:
    """Every --set key on one line, for an option's help (argparse wraps it)."""
    return (f"link.A-B.FIELD (FIELD: {', '.join(LINK_FIELDS)}) or cluster.NAME.FIELD (FIELD: "
            f"{', '.join(CLUSTER_FIELDS)})")


def _examples(inv: Inventory) -> str:
    names = [c.name for c in inv.clusters]
    ex = [f"cluster.{names[0]}.nodes=8"]
    spelled = next((s for s in (link_spelling(inv, p) for p in inv.links) if s), None)
    if spelled:       # (a link whose names read one way only: the example must set the link it names)
        ex.insert(0, f"link.{spelled}.bandwidth_gbps=100")
    return ("write --set link.A-B.FIELD=V (FIELD: " + ", ".join(LINK_FIELDS) + ") or --set cluster.NAME.FIELD=V "
            "(FIELD: " + ", ".join(CLUSTER_FIELDS) + "), e.g. " + ", ".join(ex)
            + f"; clusters: {', '.join(names)}")


def _number(key: str, text: str, integer: bool, inv: Inventory) -> float:
    shown = shorten(text, 40)
    try:
        value = int(text) if integer else float(text)
    except ValueError:
        raise InputError(f"{key}={shown!r}: the value must be {'a whole number' if integer else 'a number'}",
                         field="--set", fix=f"write e.g. {key}={'8' if integer else '100'}") from None
    # 0 is a latency, and a price (devices one already owns: docs/inputs.md, as --price and the inventory take it)
    latency = key.endswith(("latency_ms", "latency_us", "price_per_device_hour"))
    if not math.isfinite(value):
        raise InputError(f"{key}={shown}: must be a finite number", field="--set",
                         fix=f"write e.g. {key}={'8' if integer else '100'} (NaN and infinity are not figures)")
    if value > MAX_FIGURE:
        raise InputError(f"{key}={shown}: beyond any device or network (at most {MAX_FIGURE:g})", field="--set",
                         fix="check the unit (docs/inputs.md): bandwidths in Gbit/s, memory in GiB, latency in ms/µs")
    seconds = value * (1e-3 if key.endswith("latency_ms") else 1e-6)
    if key.endswith(("latency_ms", "latency_us")) and seconds > MAX_LATENCY_S:
        raise InputError(f"{key}={shown}: more than {MAX_LATENCY_S:g} s one way: no network", field="--set",
                         fix=f"check the unit: the one-way latency in {key.rsplit('_', 1)[1].replace('us', 'µs')}")
    if value < 0 or (value == 0 and not latency):
        raise InputError(f"{key}={shown}: must be {'0 or more' if latency else 'positive'}", field="--set",
                         fix="give a value above zero" + (" (or 0)" if latency else ""))
    if 0 < value < MIN_FIGURE and not latency:
        raise InputError(f"{key}={shown}: below any device or network (at least {MIN_FIGURE:g})", field="--set",
                         fix="check the unit (docs/inputs.md): bandwidths in Gbit/s, memory in GiB")
    return value


def _splits(names, text: str) -> list[tuple[str, str]]:
    """Every (NAME, NAME) of the cluster `names` that `text` spells as NAME-NAME: a '-' inside a name makes
    several."""
    return [(text[:i], text[i + 1:]) for i, ch in enumerate(text)
            if ch == "-" and text[:i] in names and text[i + 1:] in names]


def link_spelling(inv: Inventory, pair: frozenset) -> str | None:
    """A NAME-NAME text that reads as `pair` and nothing else (either order, sorted first), or None where both
    orders read as another pair too (clusters a, b-c, a-b, c, b and c-a: the a to b-c link is a-b-c or b-c-a)."""
    names = {c.name for c in inv.clusters}
    for a, b in (sorted(pair), sorted(pair, reverse=True)):
        if {frozenset(p) for p in _splits(names, f"{a}-{b}")} == {pair}:
            return f"{a}-{b}"
    return None


def _link_keys(inv: Inventory, pairs, field: str, lead: str) -> str:
    """`lead` and the --set keys of `pairs` (links of `inv`) that _link_pair reads back as each and nothing else;
    then the links no key spells, and what to do instead."""
    spelled = [(p, link_spelling(inv, p)) for p in pairs]
    keys = [f"link.{s}.{field}" for _, s in spelled if s]
    none = [" and ".join(sorted(p)) for p, s in spelled if s is None]
    text = lead + ", ".join(keys) if keys else ""
    if none:
        text += ("; " if text else "") + ("no key names the link between " + "; ".join(none) + " alone (its "
                                          "clusters' names joined by '-' spell another pair either way round): "
                                          "edit its figures in the inventory file, or rename a cluster")
    return text


def _link_pair(inv: Inventory, text: str, key: str) -> frozenset:
    names = {c.name for c in inv.clusters}
    pairs = _splits(names, text)
    field = key.rpartition(".")[2]
    if not pairs:
        raise InputError(f"{key}: {text!r} is not two of the inventory's clusters joined by '-'", field="--set",
                         fix=_examples(inv))
    readings = {frozenset(p) for p in pairs}
    if len(readings) > 1:
        # cluster names with '-' in them can split the key two ways: taking either would set a link silently;
        # the fix spells each link among the readings in an order that reads one way only (where one does)
        said = " or ".join(f"{a!r} and {b!r}" for a, b in pairs)
        links = sorted((p for p in readings if p in inv.links), key=sorted)
        raise InputError(f"{key}: {text!r} reads as the link between {said}", field="--set",
                         fix=_link_keys(inv, links, field, "write ") if links else
                         _link_keys(inv, inv.links, field, "no reading is a link of the inventory; override an "
                                                           "existing link: ") if inv.links else
                         "add the link to the inventory's links: first")
    pair = frozenset(pairs[0])
    if pair not in inv.links:
        a, b = pairs[0]
        raise InputError(f"{key}: the inventory has no link between {a} and {b}", field="--set",
                         fix=_link_keys(inv, inv.links, field, "override an existing link: ")
                         if inv.links else "add the link to the inventory's links: first")
    return pair


def apply_overrides(inv: Inventory, settings: list[str] | None) -> Inventory:
    """`inv` with each 'KEY=VALUE' of `settings` applied in order (InputError naming --set for a bad one, or for
    a setting given twice: link.a-b and link.b-a are one link, and a silent last-wins would hide which counts)."""
    seen: dict = {}
    touched: dict = {}      # link -> the last --set item that changed it

    def once(what, item):
        if what in seen:
            raise InputError(f"{seen[what]!r} and {item!r} set the same thing", field="--set",
                             fix="give each setting once")
        seen[what] = item

    for item in settings or []:
        key, sep, text = item.partition("=")
        key, text = key.strip(), text.strip()
        if not sep or not key or not text:
            raise InputError(f"{item!r} is not KEY=VALUE", field="--set", fix=_examples(inv))
        kind, _, rest = key.partition(".")
        if kind == "link":
            target, _, field = rest.rpartition(".")
            if field not in LINK_FIELDS:
                raise InputError(f"unknown key {key!r}", field="--set", fix=_examples(inv))
            pair = _link_pair(inv, target, key)
            once(("link", pair, field), item)
            value = _number(key, text, False, inv)
            old = inv.links[pair]
            new = dataclasses.replace(old, **({"latency_s": value * 1e-3} if field == "latency_ms" else
                                              {field: value}))
            inv = dataclasses.replace(inv, links={**inv.links, pair: new})
            touched[pair] = item
        elif kind == "cluster":
            match = max((c for c in inv.clusters if rest.startswith(c.name + ".")), key=lambda c: len(c.name),
                        default=None)
            field = rest[len(match.name) + 1:] if match else ""
            if match is None or field not in CLUSTER_FIELDS:
                raise InputError(f"unknown key {key!r}", field="--set", fix=_examples(inv))
            once(("cluster", match.name, field), item)
            value = _number(key, text, field in _INT_FIELDS, inv)
            inv = dataclasses.replace(inv, clusters=tuple(_set_cluster(c, field, value) if c is match else c
                                                          for c in inv.clusters))
        else:
            raise InputError(f"unknown key {key!r}: keys start with 'link.' or 'cluster.'", field="--set",
                             fix=_examples(inv))
        inv = dataclasses.replace(inv, overrides=(*inv.overrides, item))
    # once every item is applied: a slower link and its connection, set in either order, are one change
    for pair, item in touched.items():
        link = inv.links[pair]
        if link.flow_gbps is not None and link.flow_gbps > link.bandwidth_gbps:
            raise InputError(f"{item}: one connection ({link.flow_gbps:g} Gbit/s) would be faster than the whole link "
                             f"({link.bandwidth_gbps:g} Gbit/s)", field="--set",
                             fix="keep flow_gbps at most bandwidth_gbps (set both if you change the link)")
    return inv


def _set_cluster(c: Cluster, field: str, value: float) -> Cluster:
    if field in _INT_FIELDS:
        return dataclasses.replace(c, **{field: int(value)})
    if field in ("memory_gib", "peak_tflops", "hbm_gbps"):
        return dataclasses.replace(c, device=c.device.with_overrides(**{field: value}))
    if field in ("uplink_gbps", "price_per_device_hour"):
        return dataclasses.replace(c, **{field: value})
    which, what = field.split(".")
    old: LinkSpec = getattr(c, which)
    new = dataclasses.replace(old, **({"latency_s": value * 1e-6} if what == "latency_us" else {what: value}))
    return dataclasses.replace(c, **{which: new})
