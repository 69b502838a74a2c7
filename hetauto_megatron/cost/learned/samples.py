"""Measured rows the learned model trains and is judged on: `Sample` (one timed operator or layer pass),
`DeviceInfo`, and the files `hetauto profile` writes (operators, and whole layers with `--layers`)."""
from __future__ import annotations

import bisect
import json
import math
import os
import sys
from dataclasses import dataclass

from ...errors import InputError
from .. import features as F
from ...spec._fields import shorten
from ...spec.files import json_object_pairs
from .profile_checks import (_JSON_TYPES, _REMEASURE, check_dtype_bytes, layer_of_row, op_of_row,
                             row_label)


MODEL_FORMAT = "hetauto-learned-cost/3"   # 3: calibration groups and devices keyed by arithmetic
PROFILE_FORMAT = "hetauto-profile/1"
MANIFEST = "manifest.json"
BOOSTERS = ("op_fwd", "op_bwd", "layer_fwd", "layer_bwd")


@dataclass(frozen=True)
class Sample:
    """One training / validation row."""
    granularity: str       # "op" | "layer"
    phase: str             # "fwd" | "bwd"
    device: str            # device type the measurement comes from
    features: tuple
    prior_s: float
    measured_s: float
    group: str             # rows sharing a group are held out together (one shape, or one model)
    label: str             # for tables
    known_s: float = 0.0   # part of measured_s another model prices (a layer's TP all-reduces): not learned
    arithmetic: str = ""   # F.ARITHMETIC_BYTES key; "" = the element size's (16-bit or fp32), as profiles record
    tp: int = 0            # a layer row's TP degree (its host floor depends on it: host_floor_key); 0 = not a layer

    @property
    def baseline_s(self) -> float:
        """What the analytic side alone predicts: the roofline prior plus the known part."""
        return self.prior_s + self.known_s

    def learned_part_s(self) -> float:
        """The measurement less its known part, kept >= a quarter of the measurement so that an over-estimated
        known part cannot make it vanish."""
        return max(self.measured_s - self.known_s, 0.25 * self.measured_s)

    def calibration_key(self) -> str:
        return calibration_key(self.device, self.granularity, self.phase, self.features, self.arithmetic)


@dataclass(frozen=True)
class DeviceInfo:
    """What the model knows of a device type: the figures its features were computed with, and the arithmetic it
    was measured in (the plans it may price: `LearnedCostModel.coverage`)."""
    name: str
    granularity: str
    dtype_bytes: int
    peak_tflops: float
    hbm_gbps: float
    rows: int
    source: str
    arithmetic: str

    def to_dict(self) -> dict:
        return dict(self.__dict__)


# ---- profiles written by `hetauto profile` -------------------------------------------------------------------
def _whole_json(path: str) -> bool:
    """Whether the file is one JSON document (a manifest, Sailor's profiles), read at most 64 MiB."""
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read(64 << 20)
        json.loads(text)
        return True
    except (OSError, ValueError, RecursionError):
        return False


def read_profile(path: str, *, header_only: bool = False) -> tuple[dict, list[dict]]:
    """(header, rows) of a profile JSON-lines file; malformed files raise InputError naming the line.
    `header_only`: stop after the header (rows come back empty)."""
    header, numbered = read_profile_lines(path, header_only=header_only)
    return header, [row for _, row in numbered]


def read_profile_lines(path: str, *, header_only: bool = False) -> tuple[dict, list[tuple[int, dict]]]:
    """read_profile with each row's line number in the file, (line, row): a row's bad reading is named by its line,
    where the user edits it."""
    if not os.path.isfile(path):
        if os.path.isdir(path):
            raise InputError("is a directory, not a profile file", file=path,
                             fix=f"pass the .jsonl files in it, e.g. {os.path.join(path, '*.jsonl')}")
        if os.path.exists(path):     # /dev/zero, a pipe: "not found" named the wrong fault
            raise InputError("is not a regular file (a device or a pipe), not a profile file", file=path,
                             fix="pass a file written by 'hetauto profile'")
        raise InputError("profile file not found", file=path, fix="pass a file written by 'hetauto profile'")
    header, rows = None, []
    try:
        with open(path, encoding="utf-8") as fh:
            for no, line in enumerate(fh, 1):
                line = line.strip()
                if not line:
                    continue
                try:
                    rec = json.loads(line, object_pairs_hook=json_object_pairs)
                except json.JSONDecodeError as exc:
                    if header is None and _whole_json(path):    # a JSON document, not a profile's JSON lines
                        raise InputError("is one JSON document, not a profile (a header line, then one JSON object "
                                         "per line)", file=path, field="format", fix="pass a file written by 'hetauto profile'; "
                                         "Sailor's measurements are read with 'hetauto fit --sailor[=DIR]'") from None
                    raise InputError(f"line {no} is not JSON ({exc.msg})", file=path, fix="pass a file written by "
                                     "'hetauto profile' (a cut-off last line can be deleted)") from None
                except (RecursionError, ValueError) as exc:    # nested hundreds deep, a key twice, a huge integer
                    raise InputError(f"line {no} cannot be read ({type(exc).__name__}: {str(exc)[:80]})", file=path,
                                     fix="pass a file written by 'hetauto profile' (the line can be deleted: "
                                         "profiling resumes and re-measures it)") from None
                if header is None:
                    if not isinstance(rec, dict) or rec.get("format") != PROFILE_FORMAT:
                        raise InputError(f"does not start with a '{PROFILE_FORMAT}' header line", file=path,
                                         field="format", fix="pass a file written by 'hetauto profile'")
                    header = rec
                    if header_only:
                        break
                elif not isinstance(rec, dict):     # every reader takes a row for a mapping
                    raise InputError(f"line {no} is a JSON {type(rec).__name__}, not an object", file=path,
                                     fix="delete the line (profiling resumes and re-measures the row)")
                else:
                    rows.append((no, rec))
    except UnicodeDecodeError:
        raise InputError("is not a UTF-8 text file", file=path, fix="pass a file written by 'hetauto profile'") from None
    except OSError as exc:
        raise InputError(f"cannot be read: {exc.strerror}", file=path, fix="check the file's permissions") from None
    if header is None:
        raise InputError("is empty", file=path, fix="run 'hetauto profile' to fill it")
    return header, rows


def check_same_threads(ops_path: str, layers_path: str, layers_header: dict) -> None:
    """Operators and whole layers of one CPU timed with different intra-op thread counts: refused. A CPU row's time
    depends on the count (measure/profile.py refuses to resume a file with another one for that reason), so the
    layer composition fitted from the two files would learn the threads' speed-up as the layer's own work. An
    accelerator's kernels do not depend on it (the H200 files say 16: the host's), and a header without the field
    passes."""
    ops_header = read_profile(ops_path, header_only=True)[0]
    ops_threads, layer_threads = ops_header.get("threads"), layers_header.get("threads")
    if "cpu" not in (ops_header.get("torch_device"), layers_header.get("torch_device")) or \
            None in (ops_threads, layer_threads) or ops_threads == layer_threads:
        return
    raise InputError(f"layers were timed with threads {layer_threads!r}, the operators of the same device in "
                     f"{ops_path} with threads {ops_threads!r}: a CPU's times depend on its thread count",
                     file=layers_path, field="threads",
                     fix=f"re-measure one file with the other's thread count: e.g. delete {layers_path} and run "
                         f"'hetauto profile --device-type {layers_header.get('device_type')} --layers --threads "
                         f"{ops_threads}' again with the other options it was made with")


def profile_samples(path: str) -> tuple[DeviceInfo, list[Sample]]:
    header, rows = read_profile_lines(path)
    if header.get("granularity", "op") != "op":
        raise InputError("holds whole-layer timings ('hetauto profile --layers'), not operators", file=path,
                         field="granularity", fix="pass it to 'hetauto fit' together with the same device's operator "
                                                  "profile, or to 'hetauto validate-cost-model --profile'")
    if not rows:
        raise InputError("holds a header but no measured operators", file=path, field="rows",
                         fix="run 'hetauto profile' again to fill it (it resumes into the file)")
    try:
        dev, db = str(header["device_type"]), int(header["dtype_bytes"])
        arithmetic = F.arithmetic_of(db, bool(header.get("tf32", False)))     # fp32 rows on TF32 (measure/profile.py)
        peak, bw = float(header["peak_tflops"]), float(header["hbm_gbps"])
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(f"header lacks or garbles {exc}", file=path, field="header",
                         fix="re-run 'hetauto profile' to write a fresh file")
    check_dtype_bytes(path, header, db)
    for name, value in (("peak_tflops", peak), ("hbm_gbps", bw)):
        if not (math.isfinite(value) and value > 0):    # every feature divides by them
            raise InputError(f"the header's {name} is {value}, not a positive finite number", file=path, field=name,
                             fix="re-run 'hetauto profile' to write a fresh file")
    # 'hetauto profile' times catalog types only, and says the vendor it ran on: a device_type edited to another
    # (a CPU profile relabelled h100-sxm) priced H100 plans from the CPU's times, 700x too slow, as "learned"
    from ...spec.devices import canonical_device_name, get_device
    known = canonical_device_name(dev)
    if known is None:
        raise InputError(f"names device type {dev!r}, which the catalog does not have", file=path,
                         field="device_type", fix="profile a catalog type ('hetauto profile --device-type TYPE', "
                                                  "'hetauto profile --help' lists them)")
    vendor, catalog_vendor = header.get("vendor"), get_device(known).vendor
    if vendor is not None and vendor != catalog_vendor:
        raise InputError(f"says device_type {dev} ({catalog_vendor} hardware), but its header says it was "
                         f"measured on {vendor} hardware", file=path, field="device_type",
                         fix="profile that device type on its own hardware ('hetauto profile --device-type "
                             f"{known}'), or keep the device type it was measured on")
    # ... and writes the catalog's figures of the type it times: another accelerator of the same vendor relabelled
    # (an H200 profile saying h100-sxm) keeps its own memory bandwidth, and priced the H100 from the H200's times
    catalog = get_device(known)
    if catalog.vendor != "cpu" and abs(bw - catalog.hbm_gbps) > 1e-6 * catalog.hbm_gbps:
        measured = header.get("accelerator")
        raise InputError(f"says device_type {dev}, whose memory bandwidth is {catalog.hbm_gbps:g} GB/s, but its "
                         f"header's hbm_gbps is {bw:g}" + (f" (measured on: {measured})" if measured else "")
                         + ": it was timed on another device type", file=path, field="device_type",
                         fix="keep the device type it was measured on, or profile that device type on its own "
                             f"hardware ('hetauto profile --device-type {known}')")
    dev = known         # the catalog's name: an alias in the header (H200) keyed the fitted model apart from it
    samples, zeros = [], []
    for no, r in rows:
        op = op_of_row(r, path=path, line=no)     # each dimension checked: a hand edit is named, not a traceback
        try:
            # The 10th percentile, not the median: on a shared host the median also measures the neighbours
            # (a preempted repetition takes a scheduler slice longer); on a dedicated accelerator both agree.
            phases = {ph: _timing(r, ph, path, no) for ph in ("fwd", "bwd")}
        except KeyError as exc:
            raise InputError(f"{row_label(r, no)} lacks its time", file=path, field=str(exc.args[0]),
                             fix=_REMEASURE) from None
        for phase, t in phases.items():
            if t == 0:
                zeros.append(f"row {r.get('key', '?')} {_time_field(r, phase)}")
                continue
            feats, prior = F.op_row(op, phase, dtype_bytes=db, peak_tflops=peak, hbm_gbps=bw)
            samples.append(Sample("op", phase, dev, tuple(feats), prior, t, op.key(), f"{op.name} {op.key()}",
                                  arithmetic=arithmetic))
    warn_zero_times(path, zeros, _LEFT_OUT)
    info = DeviceInfo(dev, "op", db, peak, bw, len(rows), os.path.basename(path), arithmetic)
    return info, samples


_LEFT_OUT = "to measure again: delete those rows, and 'hetauto profile' resumes into the file"


def _time_field(row: dict, phase: str) -> str:
    """The field a row's time of one pass is read from: the 10th percentile where the row has it, else the median."""
    return f"{phase}_p10_s" if f"{phase}_p10_s" in row else f"{phase}_s"


def _timing(row: dict, phase: str, path: str, line: int) -> float:
    """A row's time of one pass (_time_field), checked by measured_time; `line`: the row's line in the file."""
    name = _time_field(row, phase)
    return measured_time(row[name], file=path, field=name, row=row_label(row, line), fix=_REMEASURE)


# The most one measured pass may take. `hetauto profile` runs each row at least 9 times (2 warm-up, 7 timed:
# measure/profile.py), so a pass of an hour would hold a profile 9 hours on one row; and the largest layer of the
# published models (a 70B layer, ~1.6e13 FLOP forward over 8k tokens) takes minutes at most even on a CPU of 1e11
# FLOP/s. A longer time is a hand edit or a corrupted entry, and the fit would carry it into every plan it prices
# (a layer pass of 1e300 s predicted iterations of 1e303 s).
MAX_MEASURED_S = 3600.0


def measured_time(value, *, file: str, field: str, row: str, fix: str) -> float:
    """A measured time in seconds from a file of measurements (a profile, Sailor's profiles_tmp.json). A NaN,
    infinite or negative one is no time at all (a hand-edited or corrupted entry): refused, naming the file, the row
    and the field (the fit would otherwise fail far from the cause). 0 is a timer that read nothing, a broken
    measurement among many good ones: returned, for the reader to leave out and count (warn_zero_times). A value
    that is no JSON number (text such as "0.001", true) is refused too: every writer of these files writes numbers,
    so a quoted one was edited by hand, and float() took "1e300" or true (1 s) as a time."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        what = _JSON_TYPES.get(type(value), f"a {type(value).__name__}")
        raise InputError(f"{row} has {field} {shorten(repr(value), 40)}, {what}, not a number of seconds", file=file,
                         field=field, fix=f"write the time as a JSON number (no quotes), or {fix}")
    value = float(value)
    if not math.isfinite(value) or value < 0:
        raise InputError(f"{row} has {field} {value}, not a finite, non-negative number of seconds", file=file,
                         field=field, fix=fix)
    if 0 < value < 1e-9:     # no timer reads under a nanosecond: a hand-edited figure (its error overflowed)
        raise InputError(f"{row} has {field} {value:g}, under a nanosecond: no measured time", file=file,
                         field=field, fix=fix)
    if value > MAX_MEASURED_S:
        raise InputError(f"{row} has {field} {value:g} s, more than an hour ({MAX_MEASURED_S:g} s) for one pass: no "
                         "measured time", file=file, field=field, fix=fix)
    return value


def warn_zero_times(path: str, zeros: list[str], fix: str) -> None:
    """One line on stderr for the readings of a measured file left out for a time of 0 (`zeros`: each one's row and
    field), counting them and naming the first."""
    if zeros:
        print(f"hetauto: warning: {path}: left out {len(zeros)} reading{'s' if len(zeros) > 1 else ''} whose time "
              f"is 0, a broken measurement (first: {zeros[0]}); {fix}", file=sys.stderr)


# NVIDIA H200 operator and whole-layer timings measured by `hetauto profile` (data/h200/README.md).
H200_DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "data", "h200")


def host_floor_key(device: str, phase: str, tp: int) -> str:
    """The host floor's key: one per TP degree measured. At TP 1 the host issues no all-reduces (no NCCL calls, none
    of the TP regions' bookkeeping); at TP n > 1 each all-reduce waits for the last of n ranks' hosts, so the floor
    grows with the degree (sailor_host_floor.sailor_host_floors; `host_floor_at` reads a degree not measured)."""
    return f"{device}|{phase}|tp{max(int(tp), 1)}"


def host_floor_at(floors: dict, device: str, phase: str, tp: int) -> float:
    """The host floor of a pass at TP degree `tp` from the floors measured per degree (`floors`: host_floor_key ->
    seconds): the degree's own; else the nearest measured TP > 1 degree below it (the floor grows with the degree,
    so that one is the most a degree above it is known to take at least), else the smallest above; else TP 1's (a
    TP > 1 pass issues all a TP 1 pass does); 0 where none. A model fitted before the floors were kept per degree
    holds "device|phase|tp>1" (or, before that, "device|phase"): read for every TP > 1 degree."""
    tp = max(int(tp), 1)
    hit = floors.get(host_floor_key(device, phase, tp))
    if hit is not None:
        return hit
    one = floors.get(host_floor_key(device, phase, 1))
    if tp == 1:
        return floors.get(f"{device}|{phase}", 0.0) if one is None else one
    head = f"{device}|{phase}|tp"
    degrees = sorted(int(k[len(head):]) for k in floors if k.startswith(head) and k[len(head):].isdecimal()
                     and int(k[len(head):]) > 1)
    below = [d for d in degrees if d < tp]
    if below or degrees:
        return floors[f"{head}{below[-1] if below else degrees[0]}"]
    for legacy in (f"{device}|{phase}|tp>1", f"{device}|{phase}"):
        if legacy in floors:
            return floors[legacy]
    return 0.0 if one is None else one


def tp_allreduce_key(device: str, tp: int) -> str:
    """The key of a device's TP all-reduce rates at degree `tp`: those its layers ran (sailor_tp_allreduce_rates)
    and those the fit set them apart at (sailor_set_apart_rates, what a fitted model keeps)."""
    return f"{device}|tp{tp}"


def allreduce_rate_at(points, nbytes: float | None) -> float:
    """The bus bandwidth (bytes/s) at a message of `nbytes` from the rates measured at several sizes: `points`,
    ((bytes, rate), ...) in increasing bytes (a bare number: one rate for every size, as models fitted before the
    sizes were kept store it). NCCL's bandwidth depends on the message (its protocol and chunking change with the
    size), so between two measured sizes the time per byte is interpolated on the logarithm of the size; outside
    them the nearest size's rate holds. None: the largest size measured (the least latency in it)."""
    if isinstance(points, (int, float)):
        return float(points)
    if nbytes is None or nbytes >= points[-1][0]:
        return points[-1][1]
    if nbytes <= points[0][0]:
        return points[0][1]
    i = bisect.bisect_left([b for b, _ in points], nbytes)       # points[i - 1][0] < nbytes <= points[i][0]
    (b0, r0), (b1, r1) = points[i - 1], points[i]
    w = math.log(nbytes / b0) / math.log(b1 / b0)
    return 1.0 / ((1 - w) / r0 + w / r1)


def calibration_key(device: str, granularity: str, phase: str, features, arithmetic: str = "") -> str:
    """device|granularity|phase|operator or layer kind|arithmetic (F.ARITHMETIC_BYTES; "" = the features' element
    size's). TF32 and CUDA-core fp32 runs move the same 4-byte elements at different rates: separate groups."""
    names = F.OP_FEATURES if granularity == "op" else F.LAYER_FEATURES
    return (f"{device}|{granularity}|{phase}|{int(features[0])}|"
            f"{arithmetic or F.arithmetic_of(int(features[names.index('dtype_bytes')]))}")


# ---- whole layers measured by `hetauto profile --layers` ------------------------------------------------------
@dataclass(frozen=True)
class MeasuredLayer:
    """One row of a layer file: a transformer layer as one TP rank ran it, forward and backward."""
    model: str
    shape: F.LayerShape
    fwd_s: float
    bwd_s: float
    unfused_attention: bool = False     # the layer ran an unfused attention (layer_file_unfused)


def layer_file_unfused(header: dict) -> bool:
    """Whether a layer file's layers ran an unfused attention: its header's "attention" (measure/profile.py
    layer_attention); a file written before the field: Megatron-Core's layers their local unfused one, torch layers
    torch's fused scaled_dot_product_attention."""
    default = "unfused" if header.get("layer_impl") == "megatron" else "fused"
    return header.get("attention", default) == "unfused"


def read_layers(path: str) -> tuple[dict, list[MeasuredLayer]]:
    """(header, rows) of a file written by `hetauto profile --layers`."""
    header, rows = read_profile_lines(path)
    if header.get("granularity") != "layer":
        raise InputError("holds operator timings, not whole layers", file=path, field="granularity",
                         fix="pass a file written by 'hetauto profile --layers'")
    if not rows:
        raise InputError("holds a header but no measured layers", file=path, field="rows",
                         fix="run 'hetauto profile --layers' again to fill it (it resumes into the file)")
    out, zeros = [], []
    unfused = layer_file_unfused(header)
    for no, r in rows:
        shape = layer_of_row(r, path=path, line=no)     # each field checked, as a model's and for its TP degree
        try:
            layer = MeasuredLayer(str(r.get("model", "?")), shape, _timing(r, "fwd", path, no),
                                  _timing(r, "bwd", path, no), unfused)
        except KeyError as exc:
            raise InputError(f"{row_label(r, no)} lacks its time", file=path, field=str(exc.args[0]),
                             fix=_REMEASURE) from None
        if layer.fwd_s == 0 or layer.bwd_s == 0:      # the layer's time is both passes': no half of it is kept
            zeros.append(f"row {r.get('key', '?')} {_time_field(r, 'fwd' if layer.fwd_s == 0 else 'bwd')}")
        else:
            out.append(layer)
    if not out:
        raise InputError(f"every measured layer has a time of 0 ({len(zeros)} rows): no measurements", file=path,
                         field=zeros[0].split()[-1], fix="run 'hetauto profile --layers' again to measure them")
    warn_zero_times(path, zeros, _LEFT_OUT)
    return header, out


def profile_granularity(path: str) -> str:
    """'op' or 'layer': what a file written by `hetauto profile` holds (its header says)."""
    header, _ = read_profile(path, header_only=True)
    return str(header.get("granularity", "op"))


def mape(pred: list[float], meas: list[float]) -> float:
    if not meas:
        return float("nan")
    return 100.0 * sum(abs(p - m) / m for p, m in zip(pred, meas)) / len(meas)
