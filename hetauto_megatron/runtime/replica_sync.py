"""Gradients of the parameters that several meshes hold: summed across the holders, weighted by their batch shares.

With several pipelines joined by data parallelism every pipeline holds the whole model, each with its own
stage split, TP and DP, and trains its own slice of the global batch. After each mesh's own DP reduction
(Megatron's DDP: a reduce-scatter with the distributed optimizer, an all-reduce without) a holder's gradient is
the mean over the samples its pipeline trained; the global-batch mean is the sum over the holders of each
holder's gradient times its share of the global batch (`RankContext.batch_share`). Tied embeddings add
holders: the embedding of each pipeline's first stage and the output layer of its last stage are holders of
the same table (the tied head is the same tensor), each with its pipeline's share, so the sum also ties them.

The exchange (shard_regions.py): a parameter with two holders (the tied table of one pipeline, every parameter
of two pipelines) is one phase, "pair": each source sends its reduced elements to the other holder's source of
each element and receives that rank's, both directions at once, and both ends compute w0 x g0 + w1 x g1 in
holder order on the host (`_pair_sums`). A parameter with three or more holders is a gather and a scatter:
every holder's sources send their reduced elements to the source of each element in that element's root (holder
j of the table's j-th run of elements, shard_regions.root_chunks, the runs in proportion to the weights
plan/exchange_roots.py takes from the plan's inventory: equal, the roots taking turns, unless other shares
make the busiest link less busy), that rank sums its own
term and then the others in holder order and sends the sum back to the other holders' sources. The pair phase
runs together with the gather (one message per pair of ranks for both), the scatter after it. Inside each mesh stage the other ranks
then get the sum from their source by a broadcast on the mesh's own DP group (plain optimizer replicas) or TP
group (TP-duplicated parameters).
Elements are paired exactly: TP slices of any degree, SwiGLU's fused fc1, and the shards the distributed
optimizer's reduce-scatter leaves on each DP rank. All messages are
host-staged on one gloo group over all ranks (`RankContext.replica_group`), one message per pair of ranks and
phase, every wait with a timeout that names both ranks. It runs after the backward pass, in
`finalize_model_grads` (gradients.make_finalize_model_grads), after the mesh's DP reduction.

Where the rules of the holders come from: each rank publishes, once (`ReplicaSync(...)`, collective over all
ranks), for each of its parameters its global name, its holder (mesh index, stage in mesh), weight, TP layout
and the interval of the local tensor whose reduced gradient it holds (replica_records.py); every rank derives the
same moves and groups its own into messages once (replica_messages.py `messages_of`): a step only copies
elements into and out of them. The same phases, run once on weights, start every holder from its first
holder's values (replica_weights.py).
"""
from __future__ import annotations

import datetime

from .peers import wait_all
from .replica_messages import Messages, messages_of
from .replica_records import owner_records, owners_from, unwrap_chunk
from .shard_regions import (holders_of, meet, region, root_chunks, root_weights, sync_moves, table_shape, to_local,
                            weights_of)

GATHER_TAG, SCATTER_TAG = 0, 1       # the pair moves travel with the gather's


class ReplicaSync:
    """The exchange of one rank (module doc). Construct it on every rank at the same point, after DDP is built
    (collective over `ctx.replica_group`); call `reduce(model_chunks)` after each DP reduction. `counter`
    (e.g. a communicator's `bytes_sent`) receives the bytes this rank sends to other holders, per link class
    (the broadcasts inside a mesh stage are not counted)."""

    PAIRWISE = True     # two holders exchange both directions at once (shard_regions.sync_moves)
    ROTATE = True       # three or more: each holder is the root of a run of the elements (shard_regions.root_chunks),
                        # by the weights the plan's inventory gives (plan/exchange_roots.py); False: the first all

    def _root_weights(self, keys) -> tuple[int, ...] | None:
        """The roots' weights of a parameter held by `keys` (mesh index, stage), or None (sync_moves' default):
        chosen from the plan's inventory and the holders' clusters, as the planner prices the exchange."""
        if not self.ROTATE or len(keys) < 3:
            return None
        from ..plan.exchange_roots import exchange_weights, source_ranks
        meshes = [self.ctx.plan.meshes[k[0]] for k in keys]
        return exchange_weights(self.inventory, [m.cluster for m in meshes],
                                [source_ranks(m.tp, m.dp, m.settings.distributed_optimizer) for m in meshes])

    def __init__(self, ctx, model_chunks, *, weight: float | None = None, counter: dict | None = None):
        import torch.distributed as dist

        from ..spec.inventory import inventory_from_dict
        self.ctx, self.counter = ctx, counter
        # the links the exchange's roots are chosen on (_root_weights): the plan's stored inventory, if any
        self.inventory = inventory_from_dict(ctx.plan.inventory) if ctx.plan.inventory else None
        mine = owner_records(ctx, model_chunks, weight=ctx.batch_share if weight is None else weight)
        table = [None] * dist.get_world_size(ctx.replica_group)
        dist.all_gather_object(table, mine, group=ctx.replica_group)
        records = [r for rows in table for r in rows]
        self.cluster = {r["rank"]: r["cluster"] for r in records}
        owners = owners_from(records)
        me = ctx.coords.rank
        self.moves, self.weights, self.root_scale = [], {}, []
        self.locals = {r["name"]: r for r in mine}
        norm_roles = set()
        roots = {}          # parameter -> its roots' weights (plan/exchange_roots.py), the same on every rank
        self._owners, self._roots, self._emulation = owners, roots, None    # (emulate_links)
        self.emulated_s = 0.0       # seconds held for the emulated links (exposed: the exchange waits for them)
        for name in sorted(owners):
            roots[name] = self._root_weights(holders_of(owners[name]))
            self.moves += sync_moves(name, owners[name], rank=me, pairwise=self.PAIRWISE, rotate=self.ROTATE,
                                     weights=roots[name])
            if name not in self.locals:
                continue
            keys, rec = holders_of(owners[name]), self.locals[name]
            is_root = tuple(rec["holder"]) == keys[0]
            if not rec["shared"]:     # Megatron leaves the tied output copy out of the norm already
                norm_roles.add(is_root)
            if len(keys) < 2:         # held by one mesh stage only: nothing to sum
                continue
            self.weights[name] = weights = weights_of(owners[name])
            if rec["source"] and rec["lo"] < rec["hi"] and len(keys) > 2:   # a root's own term, of its run
                j = keys.index(tuple(rec["holder"]))
                layout = next(o.layout for o in owners[name] if o.rank == me)
                runs = root_chunks(layout.whole, root_weights(len(keys), self.ROTATE, roots[name]))
                if j < len(runs):
                    for rect in meet(region(layout, rec["lo"], rec["hi"]), runs[j]):
                        self.root_scale.append((name, to_local(layout, rect), weights[j]))
        if len(norm_roles) > 1:
            raise ValueError(f"rank {me} holds parameters whose first holder is its mesh and others whose first "
                             "holder is another mesh: the gradient norm cannot count them once per rank")
        # the global norm counts each parameter once: on the ranks of its first holder (gradients.py rule 4)
        self.counts_in_norm = norm_roles != {False}
        self.layouts = {name: o.layout for name, os_ in owners.items() for o in os_ if o.rank == me}
        self._group_messages()
        self.by_local_name = {r["local_name"]: name for name, r in self.locals.items()}
        self._found = (None, [])      # _shared's: the chunks it looked at, their shared parameters
        # copies inside this mesh stage get the sum from its source by broadcast (module doc)
        synced = sorted(self.weights)
        self.dp_copies = synced if ctx.mesh.dp > 1 and not any(self.locals[n]["sharded"] for n in synced) else []
        self.tp_copies = [n for n in synced if ctx.mesh.tp > 1 and self.locals[n]["partition_dim"] is None]
        for name in self.tp_copies:     # TP ranks of one DP rank hold the same part of a TP-duplicated parameter
            mine_ = self.locals[name]
            parts = {(r["lo"], r["hi"]) for r in records if r["name"] == name and r["holder"] == mine_["holder"]
                     and r["dp_rank"] == mine_["dp_rank"]}
            if len(parts) != 1:
                raise ValueError(f"{name}: the TP ranks of mesh {ctx.mesh_index} hold different parts {parts}")

    def _group_messages(self) -> None:
        """The messages of every step, grouped once (the plan and the parameters are fixed): per exchange, per peer
        the pieces in the order both ends agree on, and which received piece takes part in which sum."""
        me = self.ctx.coords.rank
        self.first_phase = messages_of(self.moves, ("pair", "gather"), me, self.layouts)
        self.scatter_phase = messages_of(self.moves, ("scatter",), me, self.layouts)
        # two holders: each piece received from the partner is summed with this rank's own operand, the same
        # rectangles this rank sent that partner (pair moves go both ways with the same rectangles)
        sent_at = {(peer, p.name, p.rect): (s, p.at)
                   for s, (peer, _, pieces) in enumerate(self.first_phase.sends) for p in pieces}
        self.pair_sums, gathered = [], []
        for k, (peer, _, pieces) in enumerate(self.first_phase.receives):
            for p in pieces:
                if p.move.phase == "pair":
                    s, at = sent_at[(peer, p.name, p.rect)]
                    self.pair_sums.append((k, p, s, at, *self.weights[p.name]))
                else:
                    gathered.append((k, p, self.weights[p.name][p.move.holder]))
        # the root adds the other holders' terms in holder order (a stable sort: the same order on every step)
        self.gather_adds = sorted(gathered, key=lambda g: g[1].move.holder)

    def held_values(self, model_chunks) -> list[dict]:
        """This rank's values of the parameters it shares with other holders, for checking that the holders'
        copies agree: [{"name", "holder", "local", "whole", "segments", "lo", "hi", "dtype", "values"}]
        (JSON-able; values: elements [lo, hi) of the local tensor flattened, exact as Python floats; the shapes
        and `segments` place them in the whole table, shard_regions.Layout). Source ranks only, each its own
        interval: with the distributed optimizer a DP rank's other elements are the last gather's (Megatron
        gathers the updated ones at the next forward pass under overlap_param_gather)."""
        out = []
        for gname, param in self._shared(model_chunks):
            rec = self.locals[gname]
            if gname not in self.weights or not rec["source"] or rec["lo"] >= rec["hi"]:
                continue
            lay = self.layouts[gname]
            out.append({"name": gname, "holder": tuple(rec["holder"]), "local": lay.local, "whole": lay.whole,
                        "segments": lay.segments, "lo": rec["lo"], "hi": rec["hi"],
                        "dtype": str(param.dtype).removeprefix("torch."),
                        "values": param.detach().to("cpu").reshape(-1)[rec["lo"]:rec["hi"]].tolist()})
        return out

    # ---- the exchange ----------------------------------------------------------------------------------
    def _shared(self, model_chunks) -> list:
        """[(global name, parameter)] of this rank's shared parameters in `model_chunks`, found once per set of
        chunks (the model's parameters are fixed: no module walk on every step)."""
        key = tuple(id(c) for c in model_chunks)
        if self._found[0] != key:
            found = [(self.by_local_name[name], param) for chunk in model_chunks
                     for name, param in unwrap_chunk(chunk).named_parameters() if name in self.by_local_name]
            self._found = (key, found)
        return self._found[1]

    def _tables(self, model_chunks) -> dict:
        """name -> this rank's gradient of the parameter as its 2-D table (a view of Megatron's main_grad)."""
        out = {}
        for gname, param in self._shared(model_chunks):
            grad = getattr(param, "main_grad", None)
            if grad is None:
                grad = param.grad
            out[gname] = grad.view(table_shape(grad.shape))
        return out

    def emulate_links(self, scale: float, inventory) -> None:
        """The exchange's messages between clusters take the inventory link's time x `scale`, as the planner
        prices them (cross_link.ExchangeEmulation; every rank's moves of every phase, derived as each rank
        derives its own)."""
        from .cross_link import ExchangeEmulation
        moves = [m for name in sorted(self._owners)
                 for m in sync_moves(name, self._owners[name], pairwise=self.PAIRWISE, rotate=self.ROTATE,
                                     weights=self._roots[name])]
        self._emulation = ExchangeEmulation(scale, inventory, moves, self.cluster)

    def _count(self, peer: int, nbytes: int) -> None:
        if self.counter is not None:
            mine, theirs = self.ctx.coords.cluster, self.cluster[peer]
            keys = ["intra_cluster"] if theirs == mine else ["inter_cluster", f"between {mine}->{theirs}"]
            for key in keys:
                self.counter[key] = self.counter.get(key, 0) + nbytes

    def _exchange(self, messages: Messages, tag: int, tables, what: str) -> tuple[list, list]:
        """Post the sends and receives of one exchange (its messages, grouped at construction) and wait; returns
        (sent, received): the flat host tensors, in the order of `messages.sends` and `messages.receives`."""
        import torch
        import torch.distributed as dist

        group, works, sent, received = self.ctx.replica_group, [], [], []
        for peer, numel, pieces in messages.sends:
            first = tables[pieces[0].name]
            # each element copied once, straight into the message; on an accelerator into one device buffer that
            # then crosses to the host in one copy
            flat = torch.empty(numel, dtype=first.dtype, device=first.device)
            with torch.no_grad():
                for p in pieces:
                    flat[p.at:p.at + p.numel].view(p.shape).copy_(tables[p.name][p.rows, p.cols])
            message = flat.to("cpu")
            works.append((dist.isend(message, peer, group=group, tag=tag), peer, what))
            self._count(peer, message.numel() * message.element_size())
            sent.append(message)
        for peer, numel, pieces in messages.receives:
            inbox = torch.empty(numel, dtype=tables[pieces[0].name].dtype)
            works.append((dist.irecv(inbox, peer, group=group, tag=tag), peer, what))
            received.append(inbox)
        wait_all(works, self.ctx, datetime.timedelta(seconds=self.ctx.timeout_s))
        if self._emulation is not None and (sent or received):
            from .cross_link import now, sleep_until
            itemsize = (sent or received)[0].element_size()
            hold = self._emulation.seconds(tag, self.ctx.coords.rank, [p for p, _, _ in messages.sends],
                                           [p for p, _, _ in messages.receives], itemsize)
            sleep_until(now() + hold)
            self.emulated_s += hold
        return sent, received

    def reduce(self, model_chunks) -> None:
        """Sum every shared parameter's gradient across its holders (module doc); collective over the holders."""
        import torch

        tables = self._tables(model_chunks)
        sent, received = self._exchange(self.first_phase, GATHER_TAG, tables,
                                        "exchange gradients of shared parameters (with the other holder, or to "
                                        "their roots)")
        self._pair_sums(tables, sent, received)
        with torch.no_grad():
            for name, (r0, r1, c0, c1), w in self.root_scale:   # a root's own term, then the others in holder order
                tables[name][r0:r1, c0:c1].mul_(w)
            for k, p, w in self.gather_adds:
                view = tables[p.name][p.rows, p.cols]
                view.add_(received[k][p.at:p.at + p.numel].to(view.device).view(p.shape), alpha=w)
        self.scatter_back(tables,
                          "exchange gradients of shared parameters (the sums back from their roots)")
        self.fill_copies(tables)

    def _pair_sums(self, tables, sent, received) -> None:
        """Two holders: this rank's elements become w0 x g0 + w1 x g1, where g0 is the first holder's gradient
        and g1 the second's, one of them received from the partner and the other this rank's own (the very
        host copy this rank sent the partner: both ends take the same operands).

        The partner computes the same sum for the same elements, and both must get the same bits (each holder
        then steps its own copy of the parameter). So the sum is taken ON THE HOST: both ends hold their
        operands as CPU tensors of the same dtype and run the same three CPU operations in holder order (two
        products, one addition; no fused multiply-add, each operation rounds once as IEEE 754 says), so the two
        copies stay bitwise equal even when the holders' accelerators are of different vendors, whose kernels
        may round or fuse differently."""
        import torch

        with torch.no_grad():
            for k, p, s, at, w0, w1 in self.pair_sums:
                piece = received[k][p.at:p.at + p.numel]
                own = sent[s][at:at + p.numel]
                g0, g1 = (piece, own) if p.move.holder == 0 else (own, piece)   # move.holder: the sender's
                total = torch.mul(g0, w0)
                total.add_(torch.mul(g1, w1))
                view = tables[p.name][p.rows, p.cols]
                view.copy_(total.to(view.device).view(p.shape))

    def scatter_back(self, tables, what: str) -> None:
        """The scatter phase: the roots' sources send their values of `tables` (name -> 2-D table of this rank's
        tensor) to the other holders' sources, which take them."""
        import torch

        _, received = self._exchange(self.scatter_phase, SCATTER_TAG, tables, what)
        with torch.no_grad():
            for inbox, (_, _, pieces) in zip(received, self.scatter_phase.receives):
                for p in pieces:
                    view = tables[p.name][p.rows, p.cols]
                    view.copy_(inbox[p.at:p.at + p.numel].to(view.device).view(p.shape))

    def fill_copies(self, tables) -> None:
        """Inside this mesh stage, the ranks that are not sources take their source's values: DP replicas under
        the plain optimizer (DP group), then the TP ranks of TP-duplicated parameters (TP group)."""
        self._broadcast(tables, self.dp_copies, self.ctx.pg.dp, whole=True)
        self._broadcast(tables, self.tp_copies, self.ctx.pg.tp, whole=False)

    def _broadcast(self, tables, names, group, *, whole: bool) -> None:
        """Rank 0 of `group` (inside this mesh) sends these parameters' summed gradients (the whole tensors, or
        the part this rank holds) to the group's other ranks, in one message."""
        import torch
        import torch.distributed as dist

        if not names:
            return
        views = [tables[n].view(-1) if whole else tables[n].view(-1)[self.locals[n]["lo"]:self.locals[n]["hi"]]
                 for n in names]
        flat = torch.cat(views)
        if flat.numel() == 0:     # the same on every rank of the group: they hold the same parts
            return
        dist.broadcast(flat, src=dist.get_global_rank(group, 0), group=group)
        with torch.no_grad():
            at = 0
            for v in views:
                v.copy_(flat[at:at + v.numel()])
                at += v.numel()
