"""`hetauto plan`'s objective and constraints from the command line, what an engine cannot run of them (refused by
name), the clusters they leave out, and the search that names the binding constraint when nothing is feasible."""
from __future__ import annotations

import argparse
import sys


class NameList(argparse.Action):
    """A comma-separated list of clusters whose repeats add up (--exclude-clusters a --exclude-clusters b is a,b;
    with argparse's default the last one alone was kept, silently)."""

    def __call__(self, parser, namespace, values, option_string=None):
        # --use-clusters ',' or '' (an empty shell variable) ran as "every cluster"; an empty --exclude-clusters
        # "$DOWN" excludes none, as meant
        if self.dest == "use_clusters" and not any(x.strip() for x in values.split(",")):
            raise argparse.ArgumentError(self, f"{values!r} names no cluster: give cluster names separated by commas, "
                                               "e.g. h800,mi300x, or leave the flag out")
        before = getattr(namespace, self.dest, None)
        setattr(namespace, self.dest, f"{before},{values}" if before else values)


def without_excluded_unable(inventory, args):
    """The inventory without the clusters --exclude-clusters names, or that --use-clusters leaves free to join,
    whose device cannot train at --precision (their links too; taken off --exclude-clusters, said on stderr): the
    search never sees them (they could not join), and every cluster the plan file's inventory keeps is priced at
    the job's precision. Without either flag such a cluster is refused, naming both fixes."""
    from ..plan.constraints import parse_names
    excluded = parse_names(args.exclude_clusters)
    used = parse_names(args.use_clusters)
    unable = [n for n in inventory.unable_at(args.precision) if n in excluded or (used and n not in used)]
    if not unable or len(unable) == len(inventory.clusters):
        return inventory      # (nothing to leave out, or nothing would be left: the usual errors say why)
    print(f"hetauto plan: left out of the inventory: {', '.join(unable)} (excluded, or not among --use-clusters "
          f"and so only allowed to join, and cannot train in "
          f"{args.precision})", file=sys.stderr)
    args.exclude_clusters = ",".join(n for n in excluded if n not in unable) or None
    return inventory.without(unable)


def constraints_from_args(args):
    """The objective and constraints the command line asks for (plan/constraints.py checks them on the inputs)."""
    from ..errors import InputError
    from ..plan.constraints import Constraints, parse_names, parse_pins
    tp = []
    for name, value in parse_pins(args.tp, "--tp", "h800=8"):
        if not value.isdecimal():       # what int() reads ("²" is a digit it refuses)
            raise InputError(f"{name}={value}: the TP degree must be a whole number", field="--tp",
                             fix=f"write e.g. --tp {name}=8")
        tp.append((name, int(value)))
    return Constraints(objective=args.objective or "throughput", max_devices=args.max_devices,
                       use_clusters=parse_names(args.use_clusters), exclude_clusters=parse_names(args.exclude_clusters),
                       tp=tuple(tp), recompute=parse_pins(args.recompute, "--recompute", "a100=full"),
                       max_pp=args.max_pp, micro_batch_size=args.micro_batch_size,
                       max_iteration_s=args.max_iteration_s)


def search_explained(model, inventory, gbs, cost_model, cfg, shapes="all"):
    """The search (plan/multi_search.py: the single pipeline and, unless shapes is "simple", the new shapes);
    when nothing is feasible under constraints, says which one binds: each constraint is lifted in turn, and
    those whose lifting lets a plan fit are named (a short search each: only on failure)."""
    import dataclasses as dc

    from ..errors import InfeasibleError
    from ..plan.constraints import FLAGS, check_floor, describe
    from ..plan.multi_search import search_shapes
    from ..plan.search import search
    try:
        return search_shapes(model, inventory, gbs, cost_model, cfg, shapes)
    except InfeasibleError as exc:
        con = cfg.constraints
        if not con.active:
            raise
        binding, flags = [], []
        for name in con.active:
            trial = dc.replace(cfg, constraints=con.without(name), iterations=min(cfg.iterations or 400, 400),
                               progress=False, local_search=False)
            try:
                check_floor(model, trial.constraints, search(model, inventory, gbs, cost_model, trial).iteration_time_s)
                binding.append(describe(con, name))
                flags.append(FLAGS.get(name, name))
            except InfeasibleError:
                pass
        where = (f"the constraint that binds: {'; '.join(binding)} (without it a plan fits)" if len(binding) == 1
                 else f"each of these alone binds: {'; '.join(binding)}" if binding
                 else "no single constraint binds: lifting any one of them alone still leaves nothing feasible")
        # The binding constraint is the news; the closest miss under the constraints follows as detail.
        under = f"under the constraints {'; '.join(describe(con, n) for n in con.active)}, {where}"
        if binding and exc.field is None:
            # a miss that points nowhere (memory: its fix, "add devices", would not help under --max-devices 1): the
            # binding constraint is what to change, the paragraph's fix and, for scripts, the field
            fix = (f"loosen or drop {flags[0]} (without it a plan fits)" if len(flags) == 1
                   else f"loosen or drop any one of {', '.join(flags)} (without any one of them a plan fits)")
            raise InfeasibleError(f"{under}. Within them: {exc.reason.rstrip('.')}.", file=exc.file, field=flags[0],
                                  fix=fix) from None
        if binding:         # the miss points at its input (an inventory's links): quoted whole, its fix with it
            if exc.fix:
                raise exc.reworded(f"{under}. Within them: {exc.reason}", said=f"{exc.said}.") from None
            raise exc.reworded(f"{under}. Within them: {exc.reason.rstrip('.')}.") from None
        # none binds: the constraints are said before the miss's own fix, which ends the paragraph ("Fix: ...")
        raise exc.reworded(f"{exc.reason.rstrip('.')}. {under[0].upper()}{under[1:]}.") from None


def check_selective_runs(con, model, engine: str | None) -> None:
    """--recompute CLUSTER=selective where the engine cannot run it for this model (plan/engines.py
    selective_runs): refused by name, not planned around in silence."""
    from ..errors import InputError
    from ..plan.engines import DEFAULT_ENGINE, selective_runs
    for name, mode in con.recompute:
        if mode == "selective" and not selective_runs(model, engine or DEFAULT_ENGINE):
            raise InputError(f"{name}=selective: Megatron-Core 0.19 cannot re-run the MLP of a model with linear "
                             f"biases ({model.name}; plan/engines.py selective_runs says why)", field="--recompute",
                             fix=f"use --recompute {name}=full or none")


def check_deepspeed_constraints(con, inventory, schedule_given, shapes_given=None) -> None:
    """What DeepSpeed's pipeline engine cannot run, refused by name rather than planned around in silence (the
    search would leave a cluster pinned to selective recomputation out, or find nothing and blame the links)."""
    from ..errors import InputError
    fix = "drop it, or plan with --engine megatron"
    for name, mode in con.recompute:
        if mode == "selective":
            raise InputError(f"{name}=selective: DeepSpeed's engine checkpoints whole layers only", field="--recompute",
                             fix=f"use --recompute {name}=full or none, or plan with --engine megatron")
    if schedule_given == "overlapped":
        raise InputError("DeepSpeed's engine blocks on every pipeline transfer", field="--boundary-schedule", fix=fix)
    if shapes_given == "all":
        raise InputError("DeepSpeed's engine runs one pipeline of one mesh per cluster (--shapes simple), not several "
                         "pipelines or side-by-side meshes", field="--shapes", fix=fix)
    vendors = {inventory.cluster(c).device.vendor: c for c in con.use_clusters}
    if len(vendors) > 1:
        raise InputError("DeepSpeed's engine runs one collective library, so one vendor's devices; "
                         + ", ".join(f"{c} is {v}" for v, c in vendors.items()), field="--use-clusters",
                         fix="use clusters of one vendor, or plan with --engine megatron")
