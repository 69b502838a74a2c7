"""Host staging of cross-cluster transfers, off the compute stream.

Cross-cluster bytes travel on gloo through host memory (NCCL, HCCL and RCCL cannot talk to each other). Done
naively that costs the compute twice: a device-to-host copy that waits for the compute stream to drain before
the send can even be posted, and a host-to-device copy the compute stream waits for. Here:

- Sends: the rank's compute thread only enqueues. On an accelerator the device-to-host copy runs on a copy
  stream of its own (after an event recorded on the compute stream, so it copies the finished activation) into a
  pinned host buffer; the communication thread (one per process, `submit`) waits for that copy's event and
  posts the gloo sends, stamping the time the bytes left. The compute thread goes on to the next micro-batch
  at once. On CPU there is nothing to copy: the compute thread posts the sends itself (gloo moves the bytes
  on its own threads either way), through the same futures; `THREAD_ON_CPU` makes CPU processes use the
  thread too (the tests run the accelerator's thread logic that way).
- Receives: posted ahead into pinned host buffers. A message found complete at any later call of the
  communicator starts its host-to-device copy on the copy stream then (`start_to_device`), one still on its
  way when it is needed starts it then; either way the compute stream waits for the copy's event only when
  the stage takes the message (`wait_on_device`), and the compute thread never blocks on the copy.
- Pinned buffers come from a pool and return to it when their send (or host-to-device copy) has completed, so a
  boundary with d micro-batches in flight cycles through about d + 2 buffers per block (double buffering at
  depth 0), allocated once.

Only the communication thread waits on copy events; every wait of the compute thread on a peer keeps the
communicator's timeout (communicator.py).
"""
from __future__ import annotations

import collections
import concurrent.futures

import torch


THREAD_ON_CPU = False    # use the communication thread on CPU processes as well (forked ranks inherit it)


class HostStaging:
    """Copies between a rank's device and host buffers, and the thread that posts cross-cluster sends."""

    def __init__(self, device: torch.device):
        self.device = torch.device(device)
        self.accelerator = self.device.type != "cpu"
        self._pool: dict = collections.defaultdict(list)      # (shape, dtype) -> [(buffer, event or None)]
        self._thread = None
        self.threaded = self.accelerator or THREAD_ON_CPU
        if self.accelerator:
            self.mod = torch.get_device_module(self.device.type)   # torch.cuda, torch.npu (torch_npu), ...
            self.copy_stream = self.mod.Stream(device=self.device)

    # ---- the communication thread -----------------------------------------------------------------
    def submit(self, job) -> concurrent.futures.Future:
        """Run `job()` on the communication thread, in submission order (one thread: a link's messages leave in
        their order, and both ends' link emulation sees the same sequence). Unthreaded: run it now."""
        if not self.threaded:
            fut = concurrent.futures.Future()
            try:
                fut.set_result(job())
            except Exception as exc:     # raised where the caller takes the result, as from the thread
                fut.set_exception(exc)
            return fut
        if self._thread is None:
            self._thread = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="hetauto-comm")
        return self._thread.submit(job)

    def close(self) -> None:
        if self._thread is not None:
            self._thread.shutdown(wait=True)
            self._thread = None

    # ---- pinned buffers ---------------------------------------------------------------------------
    def _acquire(self, shape, dtype) -> torch.Tensor:
        free = self._pool[(tuple(shape), dtype)]
        for i, (buf, event) in enumerate(free):
            if event is None or event.query():
                del free[i]
                return buf
        return torch.empty(shape, dtype=dtype, pin_memory=True)

    def release(self, buf: torch.Tensor, event=None) -> None:
        """Give a pinned buffer back; it is reused once `event` (a copy still reading or writing it) completed."""
        if self.accelerator and buf.is_pinned():
            self._pool[(tuple(buf.shape), buf.dtype)].append((buf, event))

    # ---- device -> host ----------------------------------------------------------------------------
    def to_host(self, piece: torch.Tensor):
        """(host tensor, event the communication thread waits for before sending it, or None)."""
        if not self.accelerator:
            return piece.contiguous(), None
        host = self._acquire(piece.shape, piece.dtype)
        produced = self.mod.Event()
        produced.record(self.mod.current_stream(self.device))
        with self.mod.stream(self.copy_stream):
            self.copy_stream.wait_event(produced)
            host.copy_(piece, non_blocking=True)
            piece.record_stream(self.copy_stream)      # the allocator keeps the activation until copied
            copied = self.mod.Event()
            copied.record(self.copy_stream)
        return host, copied

    def receive_buffer(self, shape, dtype) -> torch.Tensor:
        """Where a received block lands: pinned host memory on an accelerator, plain memory on CPU."""
        if not self.accelerator:
            return torch.empty(shape, dtype=dtype)
        return self._acquire(shape, dtype)

    # ---- host -> device ---------------------------------------------------------------------------
    def to_device(self, pairs) -> None:
        """Copy each (host block, device view) of an arrived message; the compute stream waits for the copies
        (not the compute thread). On CPU a plain copy."""
        self.wait_on_device(self.start_to_device(pairs))

    def wait_on_device(self, event) -> None:
        """Make the compute stream wait for a host-to-device copy started earlier (None: nothing to wait for)."""
        if event is not None:
            self.mod.current_stream(self.device).wait_event(event)

    def start_to_device(self, pairs):
        """Start the host-to-device copies of an arrived message on the copy stream; returns the event the
        compute stream must wait for before it reads the views (None on CPU, where the copy is done)."""
        if not self.accelerator:
            for host, view in pairs:
                view.copy_(host)
            return None
        compute = self.mod.current_stream(self.device)
        allocated = self.mod.Event()
        allocated.record(compute)           # the destination's memory is free on the compute stream from here
        with self.mod.stream(self.copy_stream):
            self.copy_stream.wait_event(allocated)
            for host, view in pairs:
                view.copy_(host, non_blocking=True)
            copied = self.mod.Event()
            copied.record(self.copy_stream)
        for host, view in pairs:
            view.record_stream(self.copy_stream)
            self.release(host, copied)
        return copied
