"""Two grids of one device in one profile file: the grids its header lists, the rule saying whether a grid is among
them, and the fit's paragraph for two operator profiles of one device (the fit takes one per device; a second grid
is profiled into the first file, which `hetauto profile` resumes: measure/profile.py)."""
from __future__ import annotations

import os

from ...errors import InputError
from .samples import read_profile


def profile_grids(header: dict) -> list[dict]:
    """Every grid a profile's rows were measured over, as {"grid": name, "seed": n} in the order they were profiled:
    a profile resumed with another --grid or --seed adds that grid's rows to the file, and its header's "grids"
    lists them all. A file written before that list existed names one "grid" and no seed (None: not recorded); a
    layer grid's entry has no seed either (its shapes do not depend on it: measure/grids.py `grid_entry`)."""
    grids = header.get("grids")
    if isinstance(grids, list):
        return [g for g in grids if isinstance(g, dict)]
    return [{"grid": header["grid"], "seed": None}] if "grid" in header else []


def holds_grid(grids: list[dict], entry: dict) -> bool:
    """Whether `entry` (a grid and seed) is among `grids` (profile_grids): the same grid name, and the same seed
    where both say one; a seed not recorded (None or left out) matches any, so that a file older than the list, or
    a grid whose shapes the seed does not pick, gains no second entry for the same rows."""
    seed = entry.get("seed")
    return any(g.get("grid") == entry.get("grid") and (None in (g.get("seed"), seed) or g.get("seed") == seed)
               for g in grids)


# what a resume must match (measure/profile.py refuses another), and the words for it; tf32 follows from --dtype
# and the device (profile takes no flag for it), threads count on CPU only (accelerator kernels do not depend on it)
def _settings(header: dict) -> dict:
    cpu = header.get("torch_device") == "cpu"
    return {"dtype": header.get("dtype"), "tf32": bool(header.get("tf32", False)),
            "threads": header.get("threads") if cpu else None}


def _words(settings: dict, keys: list[str]) -> str:
    return ", ".join(f"{k} {str(settings[k]).lower() if k == 'tf32' else settings[k]}" for k in keys)


def two_operator_profiles(device: str, first: str, second: str) -> InputError:
    """The paragraph for two operator profiles of one device type given to the fit, which takes one per device: it
    gives the command that measures the second file's grids (profile_grids) into the first, with the first's own
    --dtype and --threads (a resume at others is refused)."""
    why = f"device type {device} comes from two operator profiles, {first} and this one"
    first_header, second_header = (read_profile(p, header_only=True)[0] for p in (first, second))
    held = profile_grids(first_header)
    grids = [g for g in profile_grids(second_header) if not holds_grid(held, g)]
    if not grids:
        return InputError(why, file=second, field="device_type",
                          fix=f"pass one of them: {first} was profiled over this one's grids too")
    # 'hetauto profile --out DIR' resumes DIR/profile-<device>.jsonl: a file of another name is copied there first
    named = os.path.basename(first) == f"profile-{device}.jsonl"
    copy = "" if named else f"copy {first} to DIR/profile-{device}.jsonl, then run "
    out = (os.path.dirname(first) or ".") if named else "DIR"
    ours, theirs = _settings(first_header), _settings(second_header)
    flags = "".join(f" --{k} {ours[k]}" for k in ("dtype", "threads") if ours[k] is not None)
    runs = ", then ".join(f"'hetauto profile --device-type {device} --grid {g.get('grid')}"
                          + (f" --seed {g['seed']}" if g.get("seed") not in (None, 0) else "") + f"{flags} --out {out}'"
                          for g in grids)
    fix = (f"pass one of them, or measure both files' grids into one: {copy}{runs} to resume "
           f"{first if named else 'that copy'} at its own settings: the rows it lacks are measured and its header "
           "lists every grid")
    # a header without a field (written before it existed) is not taken for a difference
    differ = [k for k in ours if None not in (ours[k], theirs[k]) and ours[k] != theirs[k]]
    if differ:
        fix += (f" (this one was timed with {_words(theirs, differ)}, {first} with {_words(ours, differ)}: its rows "
                "cannot be merged as they are, so its grids are re-measured at the first's settings)")
    return InputError(why, file=second, field="device_type", fix=fix)
