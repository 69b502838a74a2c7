"""`LearnedCostModel`: the planner's cost-model interface over a fitted model (fitted.py) read from its directory
(manifest.py). It answers for the device types measured in the arithmetic the plan trains in and hands every other
device type to the analytic model, saying which answered and why (`coverage`, `source`)."""
from __future__ import annotations

import dataclasses

from ..comm import allreduce_time
from ...spec.devices import CATALOG, DeviceType, canonical_device_name
from ...spec.inventory import LinkSpec
from ...spec.model import ModelSpec
from .. import features as F
from ..priced_by import sources_and_why
from .manifest import read_model_dir
from .samples import DeviceInfo, allreduce_rate_at, calibration_key, tp_allreduce_key


_ARITHMETIC_WORDS = {"16-bit": "16-bit precision (bf16/fp16)", "fp32": "fp32 without tensor cores",
                     "tf32": "fp32 with TF32 GEMMs"}


class LearnedCostModel:
    """Same interface as AnalyticCostModel; learned where the model directory covers the device type."""

    name = "learned"
    # The attention the priced layers run: fused (the profile's "attention" operator) or, False, the unfused one that
    # keeps the s x s scores ("attention_unfused": CPU meshes, Transformer Engine in fp32 or on a V100). Set per mesh
    # as for the analytic model (plan/costing.py _as_mesh_runs, from RuntimeSettings.fused_attention).
    flash_attention = True

    def __init__(self, model_dir: str, fallback=None):
        if fallback is None:
            from ..analytic import AnalyticCostModel
            fallback = AnalyticCostModel()
        self.fallback = fallback
        self.model_dir = model_dir
        self.manifest, self.devices, self.fitted = read_model_dir(model_dir)
        # Covered: measured in both phases at its granularity, in the arithmetic its DeviceInfo states (the
        # calibration has groups for both phases in it).
        groups = {(d, g, ph, a) for d, g, ph, _, a in (k.split("|") for k in self.fitted.calibration)}
        self._covered = {d for d, i in self.devices.items()
                         if all((i.name, i.granularity, ph, i.arithmetic) in groups for ph in ("fwd", "bwd"))}
        self._cache: dict[tuple, tuple[float, float]] = {}

    def coverage(self, device: DeviceType) -> tuple[DeviceInfo | None, str]:
        """(what the model knows of `device`, None if the analytic model prices it; and why, in words).

        A device type is priced by the learned model only with its own measurements in the arithmetic it trains in
        (F.device_arithmetic: 16-bit, fp32, or fp32 with TF32 GEMMs, e.g. Sailor's tensor-core runs): no rate is
        borrowed from another device type or another precision."""
        name = canonical_device_name(device.name) or device.name
        name = name if name in self.devices else device.name
        covered = ", ".join(self.covered_devices()) or "none"
        info = self.devices.get(name)
        if info is None or name not in self._covered:
            kin = [d for d in self.covered_devices() if d != name and _same_chip(d, name)]
            hint = (f"; {' / '.join(kin)}: the same chip (another memory or variant), if yours are those write "
                    "that name in the inventory") if kin else ""
            return None, f"no measurements of {name} in the learned model (it covers: {covered}){hint}"
        want = F.device_arithmetic(device)
        if info.arithmetic != want:
            return None, (f"the learned model measured {name} in {_ARITHMETIC_WORDS[info.arithmetic]}, the plan trains "
                          f"in {_ARITHMETIC_WORDS[want]}: no rate is borrowed from another precision"
                          + ("; an fp32 plan runs on TF32 unless the inventory says 'tf32: false' for the cluster"
                             if info.arithmetic == "tf32" and device.precision == "fp32"
                             and device.peak_tflops_at("tf32") is not None else ""))
        if device.precision == "fp8":   # same element size as bf16, another GEMM rate: measured never in fp8
            return None, (f"the learned model measured {name} in 16-bit, the plan trains in fp8: no rate is "
                          "borrowed from another precision")
        # an inventory that gives the type other figures (`--set cluster.X.peak_tflops=...`, or a catalog type
        # standing in for a device it lacks) describes another device than the one measured: its times were the
        # measured device's, said "learned", while the analytic model followed the figures. Compared with the
        # figures the measurement recorded (the device's peak in the measurement's arithmetic, which the plan's
        # was checked above to be), not with today's catalog; a CPU's are the host's
        peak = device.peak_tflops_at({"16-bit": "bf16"}.get(info.arithmetic, info.arithmetic)) or device.peak_tflops
        changed = [f"{key} {have:g} (measured: {was:g})"
                   for key, have, was in (("peak_tflops", peak, info.peak_tflops),
                                          ("hbm_gbps", device.hbm_gbps, info.hbm_gbps))
                   if device.vendor != "cpu" and was and abs(have - was) > 1e-9 * was]
        if changed:
            return None, (f"the inventory gives {name} other figures than the device the learned model measured "
                          f"({'; '.join(changed)}): the analytic model prices it from them")
        return info, f"measured ({info.source}, {info.rows} rows, {_ARITHMETIC_WORDS[info.arithmetic]})"

    def _info(self, device: DeviceType) -> DeviceInfo | None:
        return self.coverage(device)[0]

    def source(self, device: DeviceType) -> str:
        return "learned" if self._info(device) is not None else "analytic"

    def describe(self, clusters) -> list[str]:
        """One line per device type: which model prices it and why (what the planner says on stderr); one per
        cluster for a type whose clusters it prices differently (priced_by.priced_per_device). `clusters`: the
        inventory's clusters (bare device types are read as clusters of their own name)."""
        sources, why = sources_and_why([(c.name, getattr(c, "device", c)) for c in clusters], self)
        return [f"{key}: {source} ({why[key]})" for key, source in sources.items()]

    def covered_devices(self) -> list[str]:
        """Device types this model predicts for (by name; some need not be in the catalog)."""
        return sorted(self._covered)

    # ---- internals --------------------------------------------------------------------------------------
    def _predict(self, info: DeviceInfo, phase: str, rows: list[tuple[list, float]]) -> float:
        """Sum over rows of (features, prior) of the fitted model's times."""
        keys = [calibration_key(info.name, info.granularity, phase, x, info.arithmetic) for x, _ in rows]
        return sum(self.fitted.times(f"{info.granularity}_{phase}", keys, [p for _, p in rows],
                                     [x for x, _ in rows]))

    def _layer_time(self, info: DeviceInfo, shape: F.LayerShape) -> tuple[float, float]:
        """Compute only: a measured layer's TP all-reduces were set apart when fitting (Sample.known_s), and
        the planner prices them with its communication model; the host floor bounds compute and all-reduces
        together, so the planner applies it where it adds them (`host_floors`)."""
        a = dict(dtype_bytes=info.dtype_bytes, peak_tflops=info.peak_tflops, hbm_gbps=info.hbm_gbps,
                 score_bwd_weight=self.fitted.score_bwd_weight,
                 gemm_bwd_weight=F.backward_gemm_weight(info.name, info.arithmetic, self.fitted.gemm_bwd_weight))
        return tuple(self._predict(info, phase, [F.layer_row(shape, phase, **a)])
                     + F.unfused_softmax_s(shape, phase, info.dtype_bytes, info.hbm_gbps) for phase in ("fwd", "bwd"))

    def _piece(self, piece: str, model: ModelSpec, device: DeviceType, tp: int, mb: int, seq: int | None):
        info = self._info(device)
        if info is None or (info.granularity != "op" and piece in ("embedding", "head")):
            # per-layer data measures transformer layers only (see sailor_samples): the analytic model prices the
            # embedding and head for the device as this plan sees it (its precision, TF32), so not cached by name
            return getattr(self.fallback, f"{piece}_times")(model, device, tp, mb, seq)
        unfused = piece == "layer" and not self.flash_attention
        key = (piece, model, info.name, tp, mb, seq, unfused)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        if info.granularity == "op" and piece == "layer":
            res = self.fitted.composed_layer_times(info, F.layer_ops(model, tp, mb, seq, unfused_attention=unfused))
        elif info.granularity == "op":
            fn = {"head": F.head_ops, "embedding": F.embedding_ops}[piece]
            res = self.fitted.op_sum_times(info, fn(model, tp, mb, seq))
        else:
            res = self._layer_time(info, F.LayerShape.of(model, tp, mb, seq))
        self._cache[key] = res
        return res

    # ---- the cost-model interface -----------------------------------------------------------------------
    def layer_times(self, model: ModelSpec, device: DeviceType, tp: int, micro_batch_size: int,
                    seq_length: int | None = None) -> tuple[float, float]:
        return self._piece("layer", model, device, tp, micro_batch_size, seq_length)

    def head_times(self, model: ModelSpec, device: DeviceType, tp: int, micro_batch_size: int,
                   seq_length: int | None = None) -> tuple[float, float]:
        return self._piece("head", model, device, tp, micro_batch_size, seq_length)

    def embedding_times(self, model: ModelSpec, device: DeviceType, tp: int, micro_batch_size: int,
                        seq_length: int | None = None) -> tuple[float, float]:
        return self._piece("embedding", model, device, tp, micro_batch_size, seq_length)

    def optimizer_calibration(self, device: DeviceType) -> tuple[float, float]:
        """(rate on the optimizer's memory traffic, fixed seconds per optimizer step) of a stage's optimizer step:
        measured for a covered device type where the fit kept it (fit_optimizer), else the analytic model's (1, 0)."""
        info = self._info(device)
        hit = self.fitted.optimizer.get(info.name) if info is not None else None
        return hit if hit is not None else self.fallback.optimizer_calibration(device)

    def host_floors(self, device: DeviceType, tp: int) -> tuple[float, float]:
        """(forward, backward) host floor of a transformer layer's pass at TP degree `tp`, compute and TP
        all-reduces together (F.host_floored; the planner applies it where it adds the all-reduces): the fitted
        one for a device measured per layer, else the fallback's."""
        info = self._info(device)
        if info is None:
            return self.fallback.host_floors(device, tp)
        if info.granularity != "layer":
            return 0.0, 0.0
        return self.fitted.floor_s(info.name, "fwd", tp), self.fitted.floor_s(info.name, "bwd", tp)

    def tp_link(self, device: DeviceType, tp: int, link: LinkSpec, nbytes: float | None = None) -> LinkSpec:
        """The link `device`'s TP collectives of `nbytes` run on at degree `tp`: `link` (the node's), or where the fit
        set this device's measured all-reduces of that size apart at that degree as taking longer than `link` does,
        that rate, with no latency (sailor_set_apart_rates: the learned compute is the measured layer less those
        all-reduces, so the planner adds back what the fit took out; the alpha-beta entry of an inventory fitted to
        Sailor's curve over 1 MB - 1 GB is 10-20 % faster than the curve at the 8-34 MB of the small layers' messages).
        nbytes None: the largest message measured."""
        info = self._info(device)
        points = self.fitted.tp_allreduce.get(tp_allreduce_key(info.name, tp)) if info is not None else None
        rate = allreduce_rate_at(points, nbytes) if points is not None else None
        if rate is None:
            return link
        size = nbytes if nbytes is not None else (None if isinstance(points, (int, float)) else points[-1][0])
        if not size:        # (a model that kept one rate, asked for no size) the bandwidths alone
            return link if rate >= link.bytes_per_s else dataclasses.replace(link, bandwidth_gbps=rate * 8 / 1e9)
        # the all-reduce as the fit set it apart (its latency inside the rate) against the link's, latency and all
        if 2 * (tp - 1) / tp * size / rate <= allreduce_time(size, tp, link):
            return link
        return dataclasses.replace(link, bandwidth_gbps=rate * 8 / 1e9, latency_s=0.0)

    def iteration_overhead_s(self, device: DeviceType) -> float:
        """Per-iteration fixed time: no measurement covers it, the analytic model's constant."""
        return self.fallback.iteration_overhead_s(device)

    def recompute_time(self, model: ModelSpec, device: DeviceType, tp: int, micro_batch_size: int,
                       recompute: str, seq_length: int | None = None) -> float:
        """Full recomputation re-runs the layer's forward; selective re-runs the MLP share of it (the share
        from the analytic model's split, applied to the learned forward time)."""
        if recompute == "none":
            return 0.0
        if recompute == "full":
            return self.layer_times(model, device, tp, micro_batch_size, seq_length)[0]
        if self._info(device) is None:
            return self.fallback.recompute_time(model, device, tp, micro_batch_size, recompute, seq_length)
        fwd = self.layer_times(model, device, tp, micro_batch_size, seq_length)[0]
        parts = self.fallback.layer_parts(model, device, tp, micro_batch_size, seq_length)
        total = sum(p[0] for p in parts.values())
        return fwd * parts["mlp"][0] / total if total > 0 else 0.0


def load_cost_model(path: str | None):
    """The cost model the planner uses: analytic when no directory is given, learned (with analytic fallback)
    otherwise."""
    if path is None:
        from ..analytic import AnalyticCostModel
        return AnalyticCostModel()
    return LearnedCostModel(path)


def _same_chip(a: str, b: str) -> bool:
    """Two catalog types of one chip (V100 16 and 32 GB, A100 40 and 80 GB, H100 and its H800 and H200 variants): the
    same vendor and the same datasheet peaks at every precision. A shared name prefix is not one chip (the RTX 2080, 2080 Ti and
    3090 are three)."""
    x, y = CATALOG.get(a), CATALOG.get(b)
    return x is not None and y is not None and x.vendor == y.vendor and x.peaks == y.peaks
