"""The pipeline communicator for heterogeneous plans: a drop-in for Megatron's `P2PCommunicator`.

Megatron's schedules call `recv_forward`, `send_forward_recv_backward`, ... which all end in `_communicate`.
This class replaces `_communicate`:

- between two stages of the same mesh it does what Megatron does: the whole local tensor to the partner with
  the same (tp, dp) position in the next/previous stage;
- at a boundary between meshes it executes `compute_transfers` (each block crosses once, spread over the TP
  ranks of both sides; boundary.py says which blocks are this rank's). With sequence parallelism (the mesh's
  `settings.sequence_parallel`) a rank's tensor is its own sequence shard: it sends from it and receives exactly
  it. Receivers without sequence parallelism reassemble their full tensor with an all-gather over their own TP
  group; activation gradients coming back across a DP mismatch are rescaled (gradients.py);
- when the two meshes are in different clusters the blocks are staged through host memory and sent on the
  boundary's gloo group (NCCL, HCCL and RCCL cannot talk to each other), off the compute stream
  (host_staging.py: copies on a copy stream into pinned buffers, sends posted by a communication thread),
  blocking or overlapped as the plan's boundary schedule says (cross_link.py: sends completed late, receives
  posted ahead; optional link emulation); before an overlapped boundary the warm-up grows by its depth
  (`total_stages`, which Megatron's 1F1B reads for nothing else).

Every wait has a timeout; a peer that is gone or silent raises `PeerError` naming it instead of hanging.
`bytes_sent` counts this rank's bytes per link class ("intra_cluster", "inter_cluster") and per direction of a
link between clusters ("between A->B"); `exposed_s()` the time
this rank waited on cross-cluster transfers (not on its peers' compute). Call `begin_step(num_micro_batches)`
before and `end_step()` after each schedule run so receives are posted ahead and sends completed.
"""
from __future__ import annotations

import concurrent.futures
import datetime
import functools
import time

import torch
import torch.distributed as dist
from megatron.core.pipeline_parallel.p2p_communication import P2PCommunicator

from .boundary import Crossing, crossing, neighbour
from .cross_link import CrossLink, LinkEmulator, covered, now, posted_tag, sleep_until, stamp_tag, tag
from .host_staging import HostStaging
from .peers import PeerError, failure, wait_all
from .ranks import describe_rank
from .seq_gather import allgather_seq


class HeteroP2PCommunicator(P2PCommunicator):
    """P2P communicator for a rank of a plan. `ctx` is the rank's `RankContext`, `config` its model config."""

    def __init__(self, ctx, config, *, timeout_s: float | None = None):
        super().__init__(pp_group=ctx.pg.pp, config=config)
        self.ctx = ctx
        self.timeout = datetime.timedelta(seconds=timeout_s if timeout_s is not None else ctx.timeout_s)
        self.bytes_sent = {"intra_cluster": 0, "inter_cluster": 0}
        self._crossings = {}             # (other mesh, shape) -> boundary.Crossing
        self._links = {}                 # (other mesh, grad) -> CrossLink
        self._emulation = None           # (scale, inventory) once emulate_links() was called
        self._micro_batches = None
        self._held, self._on_way, self._exposed = [], [], 0.0
        self.meter = None                # a memory_meter.SavedTensorMeter while a measured step runs
        self.staging = HostStaging(ctx.device)
        self._total_stages = ctx.coords.stage + 1 + ctx.layout.warmup_forwards[ctx.coords.stage]
        mesh = ctx.mesh
        if bool(getattr(config, "sequence_parallel", False)) != mesh.settings.sequence_parallel:
            # The partner meshes cut what they send by this mesh's setting in the plan; the model must hold the
            # activations the same way or every boundary block lands in the wrong place.
            raise ValueError(f"the model of mesh {ctx.coords.mesh_index} (cluster {mesh.cluster}) runs with "
                             f"sequence_parallel={bool(getattr(config, 'sequence_parallel', False))} but the plan "
                             f"says {mesh.settings.sequence_parallel} (meshes[{ctx.coords.mesh_index}].settings)")

    # ---- schedule ----------------------------------------------------------------------------------
    @property
    def total_stages(self) -> int:
        """What Megatron's 1F1B derives this stage's warm-up from (total_stages - current_stage - 1, capped at
        the micro-batches): the planner's warm-up rule (`PipelineLayout.warmup_forwards`: the stages after this
        one plus the depth of every overlapped boundary after it)."""
        return self._total_stages

    def emulate_links(self, scale: float, inventory) -> None:
        """Cross-cluster transfers take the inventory link's time x `scale` (bandwidth / scale, latency x scale)."""
        self._emulation = (scale, inventory)

    def begin_step(self, num_micro_batches: int) -> None:
        self._micro_batches = num_micro_batches
        for link in self._links.values():
            link.begin_step(num_micro_batches)

    def end_step(self) -> None:
        for link in self._links.values():
            link.flush(self._finish_send)

    def exposed_s(self) -> float:
        """Seconds this rank waited on cross-cluster transfers: in a call, while one of its messages was on
        its way (sent and not yet arrived), plus waits for overlapped sends to finish."""
        return self._exposed + sum(link.exposed_s for link in self._links.values())

    def _link(self, other: int, grad: bool, shape) -> CrossLink:
        key = (other, grad)
        if key not in self._links:
            plan, layout, me = self.ctx.plan, self.ctx.layout, self.ctx.coords.mesh_index
            before = min(me, other)                       # the mesh whose boundary this is
            a, b = plan.meshes[before], plan.meshes[max(me, other)]
            # its schedule as the layout has it (plan/shapes.py boundary_depth, the rule the planner prices)
            depth = layout.boundary_depths[layout.first_stage(before) + a.num_stages - 1]
            boundary = self._crossing(other, shape)
            # what crosses between the two meshes per micro-batch in this direction (the whole step's activation
            # when each side is one mesh)
            nbytes = sum(tr.numel(shape[2]) for _, tr in boundary.blocks(grad)) * \
                self.config.pipeline_dtype.itemsize
            emulator = None
            if self._emulation is not None:
                scale, inventory = self._emulation
                spec = inventory.link(a.cluster, b.cluster)
                # as the planner prices it: one connection per rank pair (link_costs.boundary_pairs)
                pairs = len({(tr.src_mesh, tr.src_dp, tr.src_tp, tr.dst_mesh, tr.dst_dp, tr.dst_tp)
                             for _, tr in boundary.blocks(grad)})
                emulator = LinkEmulator(spec.bytes_per_s_over(pairs) / scale, spec.latency_s * scale)
            link = CrossLink(overlapped=depth is not None, depth=depth or 0,
                             emulator=emulator, boundary_bytes=nbytes)
            link.begin_step(self._micro_batches)
            self._links[key] = link
        return self._links[key]

    def _crossing(self, other: int, shape) -> Crossing:
        """boundary.crossing, once per other mesh and tensor shape (every call of a step asks again)."""
        key = (other, tuple(shape))
        if key not in self._crossings:
            self._crossings[key] = crossing(self.ctx, other, shape)
        return self._crossings[key]

    # ---- the one method Megatron's public API funnels into -------------------------------------------
    def _communicate(self, *, tensor_send_next, tensor_send_prev, recv_prev, recv_next, tensor_shape,
                     wait_on_reqs=True):
        if tensor_shape is None:  # send-only calls pass no shape: every tensor of a call has the same one
            tensor_shape = (tensor_send_next if tensor_send_next is not None else tensor_send_prev).shape
        shape = tuple(tensor_shape)
        for link in self._links.values():
            link.complete_sends(self._finish_send)
        if self.staging.accelerator:
            self._start_early_copies()
        works, finish = [], []
        self._held = []                  # blocking cross-cluster sends of this call (communication-thread futures)
        self._on_way = []                # (from, to): cross-cluster messages of this call on their way
        call_start = time.monotonic()
        recv_prev_t = recv_next_t = None
        if tensor_send_next is not None:
            self._send(+1, tensor_send_next, shape, works, grad=False)
        if tensor_send_prev is not None:
            self._send(-1, tensor_send_prev, shape, works, grad=True)
        if recv_prev:
            recv_prev_t = self._recv(-1, shape, works, finish, grad=False)
        if recv_next:
            recv_next_t = self._recv(+1, shape, works, finish, grad=True)
        held = [self._posted(fut) for fut in self._held]    # (works, sent at, arrival, host buffers)
        held = [(w, at, a() if callable(a) else a, h) for w, at, a, h in held]   # (cross_link.CrossLink.send)
        for _, _, arrive, _ in held:
            if arrive is not None:
                sleep_until(arrive)      # the emulated link holds a blocking sender until it delivered
        self._wait(works + [w for h in held for w in h[0]])
        if self._on_way or held:
            end = time.monotonic()
            self._on_way += [(sent_at, end if arrive is None else min(arrive, end)) for _, sent_at, arrive, _ in held]
            self._exposed += covered(call_start, end, self._on_way)
        for _, _, _, hosts in held:   # the sends completed with the call: their host buffers are free
            for host in hosts:
                self.staging.release(host)
        for step in finish:
            step()
        return recv_prev_t, recv_next_t, None

    def _post(self, op, tensor, peer, group, tag, works, what):
        try:
            work = op(tensor, peer, group=group, tag=tag)
        except RuntimeError as exc:  # gloo refuses to even post on a connection the peer already closed
            raise failure(self.ctx, exc, peer, what) from None
        works.append((work, peer, what))

    def _send(self, direction, tensor, shape, works, *, grad):
        side = neighbour(self.ctx, direction)
        what = "gradient" if grad else "activation"
        if side is None:
            return
        if side[0] == "mesh":
            self._post(dist.isend, tensor.detach().contiguous(), side[1], None, 0, works, f"send {what}")
            self.bytes_sent["intra_cluster"] += tensor.numel() * tensor.element_size()
            return
        for other in side[1]:
            self._send_to(other, tensor, shape, works, grad=grad, what=what)
            if not grad:
                self._gradients_ahead(other, shape)

    def _send_to(self, other, tensor, shape, works, *, grad, what):
        """Send this rank's blocks for mesh `other` (at the neighbouring stage)."""
        boundary = self._crossing(other, shape)
        c, plan = self.ctx.coords, self.ctx.plan
        transfers = boundary.blocks(grad)
        peer, pieces, copied = None, [], []
        for k, tr in transfers:
            if (tr.src_tp, tr.src_dp) != (c.tp_rank, c.dp_rank):
                continue
            piece = tensor.detach()[tr.src_seq, tr.src_batch]
            if boundary.inter:   # host staging for the gloo inter-cluster path, asynchronous on accelerators
                piece, event = self.staging.to_host(piece)
                copied.append(event)
            else:
                piece = piece.contiguous()
            peer = boundary.peer_rank(plan, tr.dst_dp, tr.dst_tp)
            pieces.append((k, piece, peer))
            nbytes = piece.numel() * piece.element_size()
            self.bytes_sent["inter_cluster" if boundary.inter else "intra_cluster"] += nbytes
            if boundary.inter:      # per direction of each link between clusters, too
                key = f"between {c.cluster}->{plan.meshes[other].cluster}"
                self.bytes_sent[key] = self.bytes_sent.get(key, 0) + nbytes
        if not pieces:
            return
        if not boundary.inter:
            for k, piece, peer in pieces:
                self._post(dist.isend, piece, peer, None, tag(grad, 0, k), works, f"send {what} block {k}")
            return
        link = self._link(other, grad, shape)

        def post_all(j):
            """On the communication thread: once the blocks are on the host, post the message."""
            for event in copied:
                if event is not None:
                    event.synchronize()
            sent_at, out = now(), []
            for peer in sorted({peer for _, _, peer in pieces}):
                self._post(dist.isend, torch.tensor([sent_at], dtype=torch.float64), peer, boundary.group,
                           stamp_tag(grad, j), out, f"send {what}")
            for k, piece, peer in pieces:
                self._post(dist.isend, piece, peer, boundary.group, tag(grad, j, k), out, f"send {what} block {k}")
            # an emulated blocking link: each receiving peer sends back its receive's post time (cross_link.py),
            # waited for apart from the sends (a gloo receive waited for again waits for another message)
            back, got = ({p: torch.empty(1, dtype=torch.float64) for _, _, p in pieces}
                         if link.emulator and not link.overlapped else {}), []
            for peer, t in sorted(back.items()):
                self._post(dist.irecv, t, peer, boundary.group, posted_tag(grad, j), got, f"send {what}")
            return out, sent_at, [piece for _, piece, _ in pieces], \
                (lambda: self._wait(got) or max(float(t.item()) for t in back.values())) if back else None

        # On CPU a send in flight keeps its blocks, the very storage of the stage's output (or input gradient),
        # which Megatron's schedule has let go (deallocate_output_tensor), or a contiguous copy of it: the
        # process's own memory until the send completes (measured memory). An accelerator's are pinned host copies.
        meter = self.meter
        kept = (lambda: [meter.hold(piece) for _, piece, _ in pieces]) \
            if link.overlapped and meter is not None and not self.staging.accelerator else None
        held = link.send(post_all, self.staging.submit, self._finish_send, kept)
        if held is not None:           # blocking: waited for with the call's other transfers (_communicate)
            self._held.append(held)

    def _recv(self, direction, shape, works, finish, *, grad):
        side = neighbour(self.ctx, direction)
        what = "gradient" if grad else "activation"
        if side[0] == "mesh":
            buf = torch.empty(shape, dtype=self.config.pipeline_dtype, device=self.ctx.device)
            self._post(dist.irecv, buf, side[1], None, 0, works, f"receive {what}")
            finish.append(lambda: buf.requires_grad_(True))
            return buf
        # Every mesh holding the neighbouring stage fills its blocks of one buffer (several only when meshes stand
        # side by side, whose boundaries are blocking: the buffer is then posted at once).
        buf, fills = None, []
        for other in side[1]:
            buf, fill = self._recv_from(other, shape, works, buf, grad=grad)
            if fill is not None:
                fills.append(fill)

        def assemble():
            with torch.no_grad():
                for fill in fills:
                    fill()
                if not self.ctx.mesh.settings.sequence_parallel:  # with SP the shard is all this rank holds
                    self.bytes_sent["intra_cluster"] += allgather_seq(buf, self.ctx.mesh.tp, self.ctx.coords.tp_rank,
                                                                      self.ctx.pg.tp)
            buf.requires_grad_(True)

        finish.append(assemble)
        return buf

    def _recv_from(self, other, shape, works, into, *, grad):
        """Post the receives of this rank's blocks from mesh `other` into `into` (a fresh buffer when None).
        Returns (buffer, fill): fill() puts the received blocks in place and scales gradients (None when this rank
        receives nothing from `other`)."""
        boundary = self._crossing(other, shape)
        mine = self._incoming(boundary, grad)
        if into is None and not (boundary.inter and mine):
            into = torch.empty(shape, dtype=self.config.pipeline_dtype, device=self.ctx.device)
        if not mine:
            return into, None
        if boundary.inter:
            link = self._link(other, grad, shape)
            post = functools.partial(self._post_link_message, boundary, mine, shape, grad, link, into)
            (buf, copies, started, _), on_way = link.receive(post, self._wait)   # taken: its holds dropped
            self._on_way.append(on_way)
            staged = []
        else:
            buf, staged, _ = self._post_message(boundary, mine, shape, grad, 0, works, into)

        def fill():
            if boundary.inter:   # host -> device on the copy stream; the compute stream waits for it
                if copies:
                    self.staging.to_device(copies)
                else:
                    self.staging.wait_on_device(started)     # started early (_start_early_copies)
            else:
                for tr, piece in staged:
                    buf[tr.dst_seq, tr.dst_batch] = piece
            if grad and boundary.scale != 1.0:
                for _, tr, _ in mine:
                    buf[tr.dst_seq, tr.dst_batch] *= boundary.scale

        return buf, fill

    def _incoming(self, boundary: Crossing, grad: bool) -> list:
        """This rank's blocks of `boundary` in one direction: [(k, block, sending rank)]."""
        c, plan = self.ctx.coords, self.ctx.plan
        return [(k, tr, boundary.peer_rank(plan, tr.src_dp, tr.src_tp))
                for k, tr in boundary.blocks(grad) if (tr.dst_tp, tr.dst_dp) == (c.tp_rank, c.dp_rank)]

    def _post_message(self, boundary, mine, shape, grad, j, out, buf):
        """Post the receives of message `j`'s blocks `mine` (`_incoming`) into `buf` (a fresh buffer when None),
        appending them to `out`: (buffer, staged blocks, send times)."""
        what = "gradient" if grad else "activation"
        staging = torch.device("cpu" if boundary.inter else self.ctx.device)
        if buf is None:
            buf = torch.empty(shape, dtype=self.config.pipeline_dtype, device=self.ctx.device)
        staged, stamps = [], []
        if boundary.inter:
            for peer in sorted({peer for _, _, peer in mine}):
                stamps.append(torch.empty(1, dtype=torch.float64))
                self._post(dist.irecv, stamps[-1], peer, boundary.group, stamp_tag(grad, j), out,
                           f"receive {what}")
        for k, tr, peer in mine:
            t = tag(grad, j, k)       # one message per call inside a cluster: j = 0
            view = buf[tr.dst_seq, tr.dst_batch]
            if view.is_contiguous() and view.device == staging:
                # The block is one contiguous run of the buffer on the right device: receive in place.
                self._post(dist.irecv, view, peer, boundary.group, t, out, f"receive {what} block {k}")
                continue
            size = (tr.seq_stop - tr.seq_start, tr.batch_stop - tr.batch_start, shape[2])
            piece = (self.staging.receive_buffer(size, buf.dtype) if boundary.inter
                     else torch.empty(size, dtype=buf.dtype, device=staging))
            self._post(dist.irecv, piece, peer, boundary.group, t, out, f"receive {what} block {k}")
            staged.append((tr, piece))
        return buf, staged, stamps

    def _post_link_message(self, boundary, mine, shape, grad, link, into, j, posted=None):
        """`CrossLink.receive`'s post_message for a boundary between clusters: an overlapped link posts messages
        ahead, each into its own buffer; a blocking one this call's message only, into `into` (and `posted` back)."""
        out = []
        buf, staged, stamps = self._post_message(boundary, mine, shape, grad, j, out,
                                                 None if link.overlapped else into)
        for peer in sorted({peer for _, _, peer in mine}) if posted is not None else ():
            self._post(dist.isend, torch.tensor([posted], dtype=torch.float64), peer, boundary.group,
                       posted_tag(grad, j), out, "receive")
        # a message posted ahead is held outside autograd until the stage takes it (measured memory)
        holds = [self.meter.hold(t) for t in [buf] + [piece for _, piece in staged]] \
            if link.overlapped and self.meter is not None else None
        return out, stamps, [buf, [(piece, buf[tr.dst_seq, tr.dst_batch]) for tr, piece in staged], None, holds]

    def _gradients_ahead(self, other, shape) -> None:
        """Post the gradient receives of an overlapped boundary to mesh `other` ahead (depth + 1), called as the
        stage sends an activation across it (a gradient has its shape). gloo moves a message only once its receive
        is posted: left to the first recv_backward, a slow stage before the boundary would wait one more link time
        than plan/pipeline.py prices (receives posted early)."""
        boundary = self._crossing(other, shape)
        mine = self._incoming(boundary, True)
        if not (boundary.inter and mine):
            return
        link = self._link(other, True, shape)
        if link.overlapped:
            link.post_ahead(functools.partial(self._post_link_message, boundary, mine, shape, True, link, None))

    def _start_early_copies(self) -> None:
        """Received messages posted ahead that have already arrived start their host-to-device copy now, so it is
        done by the time the stage takes them (not with link emulation: there a message counts as arrived only
        at its emulated time, which the link computes when the message is taken)."""
        for link in self._links.values():
            if link.emulator is not None:
                continue
            for works, _, payload in link.ahead:
                if payload[1] and all(w[0].is_completed() for w in works):
                    payload[2] = self.staging.start_to_device(payload[1])
                    payload[1] = []

    def _posted(self, fut):
        """The result of a send job of the communication thread (its PeerError, if posting failed, raised here)."""
        try:
            return fut.result(timeout=self.timeout.total_seconds())
        except concurrent.futures.TimeoutError:
            raise PeerError(f"{describe_rank(self.ctx.plan, self.ctx.coords.rank)}: a cross-cluster send was not "
                            f"posted within {self.timeout.total_seconds():.0f}s (device-to-host copy stuck)") from None

    def _finish_send(self, fut) -> None:
        """Wait for a cross-cluster send to complete and give its host buffers back."""
        works, _, _, hosts = self._posted(fut)
        self._wait(works)
        for host in hosts:
            self.staging.release(host)

    def _wait(self, works):
        wait_all(works, self.ctx, self.timeout)
