"""Timelines as a PNG picture (matplotlib, imported only here and only when a picture is drawn).

One panel per timeline, stacked on the same time axis (predicted above measured): a row per stage or rank
and per link direction between clusters. Forward and backward take their cluster's colour (backward
darker), a link's transfers and sends are grey, waiting to receive is pink, DP sync red, the optimizer black, the fixed per-iteration
overhead olive, the gradient exchange across holders (its steps, the links it keeps busy: lanes of their own)
dark red and hatched, the scalars all-reduced over the world (Megatron-LM's result check and the global gradient
norm, a lane each) dark violet; idle time is left blank. A span shorter than a pixel is drawn a pixel wide, beneath the
spans drawn to scale.
"""
from __future__ import annotations

import os

from ..plan.timeline import Timeline

# Cluster colours keep clear of the kinds' (grey link/send, pink receive, red sync, black, olive): the 8-cluster
# inventories of examples/gpt3 draw a grey or pink cluster otherwise. Beyond the list, hues spread evenly.
CLUSTER_COLOURS = ["#4c72b0", "#55a868", "#dd8452", "#8172b3", "#937860", "#64b5cd", "#1b9e77", "#e7298a",
                   "#a6761d", "#66a61e", "#7570b3", "#d95f02"]


def cluster_colour(i: int) -> str:
    """The i-th cluster's forward colour: the list, then evenly spread hues at the list's saturation."""
    if i < len(CLUSTER_COLOURS):
        return CLUSTER_COLOURS[i]
    import colorsys
    h = ((i - len(CLUSTER_COLOURS)) * 0.618033988749895 + 0.05) % 1.0
    r, g, b = colorsys.hsv_to_rgb(h, 0.65, 0.75)
    return "#%02x%02x%02x" % (round(r * 255), round(g * 255), round(b * 255))
KIND_COLOURS = {"send": "#9e9e9e", "receive": "#f4b6c2", "dp-sync": "#c44e52", "optimizer": "#222222",
                "overhead": "#c8b560", "exchange": "#7f1d1d",
                "norm": "#3b0f70"}


def _darker(hex_colour: str, f: float = 0.6) -> tuple:
    r, g, b = (int(hex_colour[i:i + 2], 16) / 255 for i in (1, 3, 5))
    return (r * f, g * f, b * f)


def _rows(tl: Timeline, all_links: bool) -> list[int]:
    """Lanes drawn: every stage/rank, the links between clusters (every link with all_links)."""
    return [i for i, lane in enumerate(tl.lanes) if lane.kind != "link" or lane.inter_cluster or all_links]


def draw_timelines(timelines: list[Timeline], path: str, *, all_links: bool = False, dpi: int = 100) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_hex
    from matplotlib.patches import Patch

    clusters = list(dict.fromkeys(c for tl in timelines for c in tl.clusters))
    colour = {c: cluster_colour(i) for i, c in enumerate(clusters)}
    rows = [_rows(tl, all_links) for tl in timelines]
    heights = [max(2, len(r)) * 0.32 + 0.9 for r in rows]
    fig, axes = plt.subplots(len(timelines), 1, figsize=(12, sum(heights) + 0.8), sharex=True, squeeze=False,
                             gridspec_kw={"height_ratios": heights})
    # a pixel or two of the shared time axis, which spans the longest timeline (a measured one beside its prediction)
    sliver = max([tl.iteration_s for tl in timelines] + [s.end for tl in timelines for s in tl.spans]) / 600
    drawn: set = set()          # the colours drawn: the legend names only what the picture shows
    for ax, tl, lanes in zip(axes[:, 0], timelines, rows):
        y_of = {lane: len(lanes) - 1 - k for k, lane in enumerate(lanes)}
        bars: dict = {}
        for s in tl.spans:
            if s.lane not in y_of or s.kind == "idle":
                continue
            lane = tl.lanes[s.lane]
            if s.kind in ("forward", "backward") and lane.kind != "link":
                base = colour.get(lane.cluster, CLUSTER_COLOURS[-1])
                c = base if s.kind == "forward" else _darker(base)
            else:
                c = KIND_COLOURS.get(s.kind, "#9e9e9e")
            # a span far shorter than a pixel (a 13 us transfer, a scalar's all-reduce in a second-long iteration)
            # is drawn at least a pixel wide, or a lane of them looks empty; beneath the spans drawn to scale, so
            # a sliver shows only where nothing else is (the trace keeps every span's own times)
            width = max(s.duration, sliver)
            bars.setdefault((y_of[s.lane], c, width > s.duration), []).append((s.start, width))
            drawn.add(c)
        for (y, c, widened), xr in bars.items():
            # the exchange's steps follow each other: edges show where (a sliver has neither edges nor hatching,
            # which would leave it white)
            hatched = c == KIND_COLOURS["exchange"] and not widened
            ax.broken_barh(xr, (y - 0.4, 0.8), facecolors=[c], edgecolor="white",
                           linewidth=0.0 if widened else 0.8 if hatched else 0.2, hatch="////" if hatched else None,
                           zorder=0.9 if widened else 1)
        ax.set_yticks(range(len(lanes)))
        ax.set_yticklabels([tl.lanes[i].name + (f"  [{tl.lanes[i].cluster}]" if tl.lanes[i].kind in ("stage", "rank")
                                                else "")
                            for i in reversed(lanes)], fontsize=7)
        ax.set_ylim(-0.6, len(lanes) - 0.4)
        ax.axvline(tl.iteration_s, color="#c44e52", linewidth=0.8, linestyle="--")
        ax.set_title(tl.title, fontsize=9, loc="left")
        ax.grid(axis="x", linewidth=0.3, alpha=0.5)
    axes[-1, 0].set_xlabel("seconds from the start of the iteration (dashed: iteration end)")
    handles = []
    for c in clusters:
        handles += [Patch(color=colour[c], label=f"{c} forward"), Patch(color=_darker(colour[c]), label=f"{c} backward")]
    kinds = [Patch(color=KIND_COLOURS["send"], label="link transfer / send"),
                Patch(color=KIND_COLOURS["receive"], label="receive: waiting for a link / peer"),
                Patch(color=KIND_COLOURS["dp-sync"], label="gradient sync: DP, across holders"),
                Patch(facecolor=KIND_COLOURS["exchange"], hatch="////", edgecolor="white",
                      label="gradient exchange across holders"),
                Patch(color=KIND_COLOURS["norm"], label="result check, global gradient norm"),
                Patch(color=KIND_COLOURS["optimizer"], label="optimizer"),
                Patch(color=KIND_COLOURS["overhead"], label="per-iteration overhead")]
    # (an untied plan has no exchange across holders, a plan of one stage no link transfer: not listed)
    shown = {to_hex(c) for c in drawn}
    handles += [h for h in kinds if to_hex(h.get_facecolor()) in shown]
    fig.legend(handles=handles, loc="lower center", ncol=min(6, len(handles)), fontsize=7, frameon=False)
    fig.tight_layout(rect=(0, 0.06 if len(handles) <= 6 else 0.09, 1, 1))
    # the same picture, byte for byte, for the same timeline: no creation date, and a fixed salt for the SVG's ids
    stamp = {".svg": {"Date": None}, ".pdf": {"CreationDate": None}}.get(os.path.splitext(path)[1].lower())
    with plt.rc_context({"svg.hashsalt": "hetauto"}):
        fig.savefig(path, dpi=dpi, **({"metadata": stamp} if stamp else {}))
    plt.close(fig)


def write_timeline(timelines: list[Timeline], path: str) -> None:
    """Chrome trace for a .json path, a picture for .png (or .svg/.pdf)."""
    if path.lower().endswith(".json"):
        from .trace import write_trace
        write_trace(timelines, path)
    else:
        draw_timelines(timelines, path)
