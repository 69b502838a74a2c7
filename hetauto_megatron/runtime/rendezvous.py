"""Joining the plan's world: the launch checked, the device layer applied, `init_process_group`, the same plan.

`init_distributed` is what every rank calls first; `check_same_plan` then makes sure every rank loaded the same
plan before any of the plan's groups (groups.py) is built from it. Apart from groups.py because it runs before
any group exists and its failures are the launch's (a rendezvous store that cannot be set up, ranks that never
join), with messages Megatron-LM's --hetauto store (megatron/world_store.py) raises too.
"""
from __future__ import annotations

import datetime
import ipaddress
import os

from ..errors import InputError, first_line
from . import device as devlayer
from .ranks import rank_coords, validate_launch

MISSING_NAMED = 8       # a rendezvous timeout names this many of the ranks that never checked in, then counts


def init_distributed(plan, rank: int, world_size: int, *, timeout_s: float = 60.0, dry_run: bool = False,
                     file: str | None = None, store=None, timeout_flag: str | None = None,
                     timeout_from: str = "HETAUTO_TIMEOUT_S") -> None:
    """Validate the launch, apply the device layer, then `init_process_group` (env:// rendezvous).

    `dry_run=True` runs every rank on CPU/gloo whatever the plan's device type; otherwise the rank's device
    type is checked against this process. `store`: a rendezvous store every rank has already joined
    (megatron/world_store.py) instead of env://. `timeout_flag`: the ranks are one command's local processes
    (hetauto dryrun): a rendezvous that times out names that flag, not the launch scripts. `timeout_from`: otherwise,
    what set the timeout (megatron/timeouts.py: HETAUTO_TIMEOUT_S or --distributed-timeout-minutes N).
    """
    import torch.distributed as dist

    validate_launch(plan, world_size, file=file)
    coords = rank_coords(plan, rank, file=file)
    if dry_run or devlayer.torch_device_for(coords.device_type) == "cpu":
        devlayer.enable_cpu_redirects()
        backend = "gloo"
    else:
        devlayer.check_local_device(coords.device_type, rank=rank, file=file)
        devlayer.select_local_device(coords.device_type, rank=rank)
        backend = devlayer.init_backend([m.device_type for m in plan.meshes])
    try:
        dist.init_process_group(backend=backend, rank=rank, world_size=world_size, store=store,
                                timeout=datetime.timedelta(seconds=timeout_s))
    except dist.DistError as exc:       # the rendezvous timed out, or its store could not be set up
        reason = first_line(exc)
        if "timed out" not in str(exc).lower() and "timeout" not in str(exc).lower():
            raise rendezvous_setup_error(rank, f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}",
                                         reason, file) from None
        if timeout_flag:    # one command's local ranks: no launch scripts, the timeout itself was too short
            raise InputError(f"rank {rank} waited {timeout_s:g} s for the {world_size} local ranks to connect, in "
                             f"vain ({reason[:200]})", file=file, field=timeout_flag,
                             fix=f"give a larger {timeout_flag}") from None
        raise rendezvous_timeout_error(rank, world_size, timeout_s, reason, file, timeout_from=timeout_from) from None
    if backend != "gloo":
        # a collective over the world with an accelerator tensor would span vendors' libraries: through host
        # memory on gloo instead (Megatron-LM's loop issues several, runtime/world_collectives.py)
        from . import world_collectives
        world_collectives.install()
    check_same_plan(plan, rank, world_size, file=file)


def address_mistake(addr: str) -> str | None:
    """What makes a rendezvous address as a launch gives it (HETAUTO_MASTER_ADDR, CLUSTER_MASTER_ADDR) no host,
    before any lookup; None where it may be one (a name, an IPv4 or IPv6 address, the latter perhaps in brackets).
    Blank, torch's rendezvous stopped with a ValueError traceback; with a port (or a URL), a lookup of the whole
    text failed and every try was retried until the timeout, with c10d's "gai error" warnings on the way."""
    text = addr.strip()
    if not text:
        return "is blank"
    if any(c.isspace() for c in text):
        return "has blanks in it"
    if ":" in text:
        try:
            ipaddress.ip_address(text[1:-1] if text.startswith("[") and text.endswith("]") else text)
        except ValueError:
            return "is not a host alone: it has a port or a scheme (host:port, a URL), which torch reads as a name"
    return None


def address_error(name: str, addr: str, mistake: str, fix: str) -> InputError:
    """The paragraph for an address `address_mistake` refused, or one that does not resolve (`mistake` says so)."""
    return InputError(f"{name}={addr!r} {mistake}", field=name, fix=fix)


def rendezvous_setup_error(rank: int, where: str, reason: str, file: str | None) -> InputError:
    """The world's rendezvous store could not be set up (a port in use, an address not of this host)."""
    return InputError(f"rank {rank} could not set up the rendezvous at {where} ({reason[:200]})", file=file,
                      field="HETAUTO_MASTER_PORT",
                      fix="give every cluster one HETAUTO_MASTER_ADDR (node 0 of the first cluster, reachable from "
                          "all) and a HETAUTO_MASTER_PORT free there, other than the clusters' CLUSTER_MASTER_PORT")


def rendezvous_timeout_error(rank: int, world_size: int, timeout_s: float, reason: str, file: str | None, *,
                             missing: list | None = None, describe=None,
                             timeout_from: str = "HETAUTO_TIMEOUT_S") -> InputError:
    """Not every rank of the plan joined within the timeout. `missing`: the global ranks that never checked in, where
    the rendezvous knows them (megatron/world_store.py), each named by `describe(rank)` (its cluster and stage);
    `timeout_from`: what set the timeout (HETAUTO_TIMEOUT_S, or '--distributed-timeout-minutes N'): both a launch
    that never came and one still starting (a slow node, a long first import) end here."""
    describe = describe or (lambda r: f"rank {r}")
    absent = ""
    if missing:
        absent = ("; never checked in: " + ", ".join(describe(r) for r in missing[:MISSING_NAMED])
                  + (f" and {len(missing) - MISSING_NAMED} more" if len(missing) > MISSING_NAMED else ""))
    setting = timeout_from.split()[0]
    whose = "the launch of those ranks' clusters" if missing else "every cluster's launch"
    return InputError(f"rank {rank} waited {timeout_s:g} s for the plan's {world_size} ranks to join, in vain "
                      f"({reason[:200]}){absent}: a cluster's launch did not start or stopped (its log "
                      "says why, e.g. a refused argument), it starts other ranks than the plan's, or it was still "
                      "starting", file=file, field=setting,
                      fix=f"start {whose} with the script 'hetauto emit megatron' wrote (its NODE_RANK in 0..nodes-1 on each node, "
                          "the --nproc-per-node and HETAUTO_RANK_OFFSET it sets, one HETAUTO_MASTER_ADDR/PORT for "
                          f"all); where they start slowly, give a larger {setting} (it gave {timeout_s:g} s)")


def rendezvous_no_host_error(rank: int, where: str, timeout_s: float, file: str | None, *,
                             timeout_from: str = "HETAUTO_TIMEOUT_S") -> InputError:
    """A rank of separately launched clusters (megatron/world_store.py join) reached no rendezvous store at `where`
    (addr:port) within the timeout: nothing listens there. Apart from rendezvous_timeout_error, which ranks that
    reached the store give, naming the ranks that never checked in: a rank that never reached it knows of no rank,
    and that paragraph said only that 'a cluster's launch' did not start, though one launch hosts the store."""
    setting = timeout_from.split()[0]
    return InputError(f"rank {rank} waited {timeout_s:g} s for the world's rendezvous at {where}, but nothing "
                      "accepted a connection there: no process listens at that address and port, so the launch "
                      "holding global rank 0 (node 0 of the first cluster), which hosts it, did not start or "
                      "stopped before (its log says why), or this launch was given another HETAUTO_MASTER_ADDR or "
                      "HETAUTO_MASTER_PORT than that one (or a firewall drops the connection)", file=file,
                      field="HETAUTO_MASTER_ADDR",
                      fix="start the launch holding global rank 0 (every launch script's header names its node 0) "
                          "and give every cluster's launch the same HETAUTO_MASTER_ADDR (that node, reachable from "
                          "all) and HETAUTO_MASTER_PORT; where it starts slowly, give a larger "
                          f"{setting} (it gave {timeout_s:g} s)")


def different_code_error(rank: int, codes: dict, describe, file: str | None) -> InputError:
    """Ranks run other hetauto-megatron code than rank 0: `codes` maps rank 0 and each such rank to its code's
    digest (12 digits; None where that rank's code does not say, an older hetauto-megatron), `describe(rank)` names
    a rank. Said at the world store's join (megatron/world_store.py, before anything else of its protocol) and
    again when the world has joined (check_same_plan), in the same words."""
    other = [r for r in codes if r != 0]
    shown = {r: codes[r] or "(not said: an older hetauto-megatron)" for r in codes}
    return InputError(f"the clusters run different hetauto-megatron code, which every rank must share (this process "
                      f"is rank {rank}): code {shown[0]} on {describe(0)}, {shown[other[0]]} on {describe(other[0])}"
                      + (f" and {len(other) - 1} more rank(s)" if len(other) > 1 else ""),
                      file=file, field="hetauto-megatron",
                      fix="install the same hetauto-megatron on every cluster's machines (the same release or commit, "
                          "unedited; 'hetauto --version' prints the first 12 digits of its code's digest)")


def check_same_plan(plan, rank: int, world_size: int, *, file: str | None = None) -> None:
    """Every rank loaded the same plan (collective over the default group, on CPU tensors: gloo everywhere): a
    cluster launched with a stale or edited copy would build other groups, batches and layers than the rest and
    train silently wrong (or hang). Each rank contributes its plan's fingerprint (plan_file.layout_digest, the
    stored inventory as parsed); where any differs from rank 0's, every rank stops with the same paragraph. Before
    the plan, the code: each cluster's machines have their own install, and one left on another hetauto-megatron
    (another communicator, rewrite or gradient rule) would hang in a transfer or train another model, with nothing to
    say why (an edited checkout keeps the version: the digest of the code is compared, hetauto_megatron.code_digest)."""
    import torch
    import torch.distributed as dist

    from .. import code_digest
    from ..plan.plan_file import layout_digest
    from .ranks import describe_rank
    # (15 hex digits each: a 60-bit integer, which an int64 tensor holds)
    mine = torch.tensor([int(layout_digest(plan, inventory_as_parsed=True)[:15], 16), int(code_digest()[:15], 16)],
                        dtype=torch.int64)
    every = [torch.zeros(2, dtype=torch.int64) for _ in range(world_size)]
    dist.all_gather(every, mine)
    # the code first: another hetauto-megatron may read the same plan file into another fingerprint
    code = [f"{int(e[1]):015x}"[:12] for e in every]
    other = [r for r in range(world_size) if code[r] != code[0]]
    if other:
        raise different_code_error(rank, {r: code[r] for r in [0, *other]}, lambda r: describe_rank(plan, r), file)
    other = [r for r in range(world_size) if int(every[r][0]) != int(every[0][0])]
    if other:
        raise different_plans_error(rank, other, file)


def different_plans_error(rank: int, other: list, file: str | None, detail: str = "") -> InputError:
    """Ranks `other` loaded another plan than rank 0. Said when the world has joined (check_same_plan) and, where the
    clusters launch separately, as each rank checks in at the world store (megatron/world_store.py: a plan of
    another world size never gets to the joined world), in the same words; `detail` adds what this rank knows."""
    ranks = ", ".join(map(str, other[:8])) + (f" and {len(other) - 8} more" if len(other) > 8 else "")
    return InputError(f"the ranks were started with different plans: rank(s) {ranks} loaded another plan than "
                      f"rank 0 (this process is rank {rank}){detail}", file=file, field="--hetauto-plan",
                      fix="give every cluster's launch the same plan file (a copy of one file on each cluster; "
                          "'hetauto emit megatron' writes its path into the scripts)")
