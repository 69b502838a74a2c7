"""Which model prices each device type of an inventory or a plan, keyed so that no two answers contradict: by device
type, as `cost_model` / `cost_model_why` and the stderr lines say; and where clusters of one type are priced
differently (one says `tf32: false`, or `--set cluster.X.peak_tflops` gives one other figures: the learned model
prices the device as each cluster describes it, LearnedCostModel.coverage), by `cluster_key`, one entry per cluster
of that type. Keying by the type alone kept one cluster's answer and dropped the other's."""
from __future__ import annotations


def cluster_key(device_type: str, cluster: str) -> str:
    """The key of one cluster's answer where the clusters of its device type are priced differently."""
    return f"{device_type} (cluster {cluster})"


def priced_per_device(pairs, price) -> dict:
    """{key: price(device)} over `pairs`, (cluster name, DeviceType) in any order and repeated at will (a plan's
    meshes), sorted by key: the device type's name where every cluster of that type gets one answer, else
    `cluster_key` for each of its clusters. `price`: DeviceType -> a comparable answer (e.g. (source, why))."""
    by_type: dict[str, dict[str, object]] = {}
    for cluster, device in pairs:
        by_type.setdefault(device.name, {})[cluster] = price(device)
    out = {}
    for name in sorted(by_type):
        answers = by_type[name]
        if len({repr(a) for a in answers.values()}) == 1:
            out[name] = next(iter(answers.values()))
        else:
            out.update((cluster_key(name, c), a) for c, a in sorted(answers.items()))
    return out


def sources_and_why(pairs, cost_model) -> tuple[dict, dict]:
    """(cost_model, cost_model_why) of an estimate: each key's source ('learned' / 'analytic') and, from a model that
    says why (`coverage`), the reason; {} for the reasons otherwise."""
    says_why = hasattr(cost_model, "coverage")
    answers = priced_per_device(pairs, lambda d: (cost_model.source(d),
                                                  cost_model.coverage(d)[1] if says_why else None))
    return {k: s for k, (s, _) in answers.items()}, ({k: w for k, (_, w) in answers.items()} if says_why else {})
