"""`hetauto-torchrun`: torch's launcher, torchrun (torch.distributed.run, every option of it), as the launch scripts
'hetauto emit megatron' writes start it. Two differences. When the workers stop on a failure they reported in one
paragraph, the launch ends with one line pointing at that paragraph instead of torchrun's ChildFailedError
traceback: a user error (exit 2 after its paragraph: a refused argument, a plan that does not match the launch;
megatron/hook.py) ends it with exit 2, a rank of the job that went away or stopped answering under them
(runtime/liveness.py LOST_PEER_EXIT, after the paragraph naming it) with exit 1, torchrun's status for a failed
launch. Any other failure (a crash: a traceback, exit 1; a signal; another exit status) is torchrun's own report.
Before the workers, the launch's own rendezvous (megatron/cluster_rendezvous.py): its address is checked, it waits
for the launch's nodes HETAUTO_TIMEOUT_S (torch's static rendezvous waited 600 s whatever the job said), and nodes
that never joined end it with one paragraph naming them, exit 2.
And at the end of a launch of several nodes that succeeded, node 0's agent, which hosts the launch's store, waits
until every agent is through torch's exit barrier (`hold_the_store_at_exit`), so that no node of a job that
succeeded logs an error there.
"""
from __future__ import annotations

import re
import signal
import sys
import time

USER_ERROR = 2
FAILED = 1                       # torchrun's own exit status for a launch whose workers failed
_THROUGH_KEY = "hetauto/through_exit_barrier"     # counter: agents through torch's exit barrier
HOLD_S = 30.0                    # the most node 0's agent waits for the others there


def main(argv: list[str] | None = None) -> int:
    from torch.distributed import DistNetworkError, run
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, record

    from ..errors import InputError
    from .cluster_rendezvous import ClusterRendezvousFailed, catch_rendezvous_failure, failed_paragraph, prepare

    hold_the_store_at_exit()
    catch_rendezvous_failure()
    args = run.parse_args(argv)         # (torchrun.main's own first step: its usage errors stay its own)
    try:
        rdzv_timeout_s = prepare(args)
    except InputError as exc:
        print(f"hetauto-torchrun: error: {exc.message}", file=sys.stderr)
        return USER_ERROR
    try:
        record(run.run)(args)           # what torchrun.main runs, with the parsed arguments prepare() completed
    except ClusterRendezvousFailed as exc:
        print(f"hetauto-torchrun: error: {failed_paragraph(exc, args, rdzv_timeout_s)}", file=sys.stderr)
        return USER_ERROR
    except DistNetworkError as exc:
        # the agent's own rendezvous store (node 0 of the launch, --master-addr/--master-port) could not listen:
        # a user's environment (a port taken), said in one paragraph, not torchrun's 40-line traceback
        text = str(exc)
        if "EADDRINUSE" not in text and "address already in use" not in text.lower():
            raise
        found = re.search(r"port: (\d+)", text)
        port = found.group(1) if found else None
        where = f"port {port}" if port else "its port"
        print(f"hetauto-torchrun: error: field '--master-port' (CLUSTER_MASTER_PORT in the launch script): this "
              f"launch's rendezvous could not listen on {where} of this node, which another process already uses "
              f"({text.splitlines()[0][:200]}). Fix: set CLUSTER_MASTER_PORT to a port free on this cluster's node "
              "0, other than HETAUTO_MASTER_PORT and other launches' ports, or stop what holds it "
              f"(e.g. 'ss -ltnp | grep {port or 'PORT'}').", file=sys.stderr)
        return USER_ERROR
    except ChildFailedError as exc:
        ended = reported(exc.failures)
        if ended is None:
            raise
        line, status = ended
        print(f"hetauto-torchrun: {line}", file=sys.stderr)
        return status
    return 0


def hold_the_store_at_exit() -> None:
    """torch's agents end a launch that succeeded with a barrier on the launch's store (torch.distributed.elastic
    SimpleElasticAgent._exit_barrier), which node 0's agent hosts (static rendezvous: --master-addr, --node-rank 0).
    Node 0 left as soon as the last agent had checked in, while that agent still waited on the store for the
    barrier's key, so now and then a node of a job that succeeded logged "Error waiting on exit barrier" with a
    traceback and a page of C++ frames (pytorch/pytorch#69520; seen on 1 of 4 two-node launches here). Each agent
    now counts itself through the barrier, and node 0's agent leaves once all have, or after HOLD_S."""
    from torch.distributed.elastic.agent.server import api

    original = api.SimpleElasticAgent._exit_barrier
    if getattr(original, "_hetauto", False):
        return

    def _exit_barrier(self):
        original(self)
        group = self._worker_group
        try:
            through = self._store.add(_THROUGH_KEY, 1)
            deadline = time.monotonic() + HOLD_S
            while group.group_rank == 0 and through < group.group_world_size and time.monotonic() < deadline:
                time.sleep(0.05)
                through = self._store.add(_THROUGH_KEY, 0)
        except Exception:   # noqa: BLE001  (a store already gone: the launch's result stands, as torch's barrier's)
            pass

    _exit_barrier._hetauto = True
    api.SimpleElasticAgent._exit_barrier = _exit_barrier


def reported(failures: dict) -> tuple[str, int] | None:
    """(the line ending the launch, its exit status) where every worker that failed on its own stopped on one
    failure it reported in a paragraph; None (torchrun's report) where any crashed. Workers torchrun itself ended
    once the first one stopped (SIGTERM: -15) are not counted; any other signal is a crash (the out-of-memory
    killer's SIGKILL, a segmentation fault)."""
    from ..runtime.liveness import LOST_PEER_EXIT

    stopped = {rank: f.exitcode for rank, f in failures.items() if f.exitcode != -signal.SIGTERM}
    codes = set(stopped.values())
    if codes not in ({USER_ERROR}, {LOST_PEER_EXIT}):
        return None
    ranks = ", ".join(map(str, sorted(stopped)))
    if codes == {USER_ERROR}:
        return (f"worker rank(s) {ranks} of this launch stopped on invalid input (exit 2): the paragraph above names "
                "the file, the field and the fix", USER_ERROR)
    return (f"worker rank(s) {ranks} of this launch stopped because a rank of the job went away or stopped answering "
            f"(exit {LOST_PEER_EXIT}): the paragraph above ('hetauto: error: ...') names it and what to do", FAILED)


if __name__ == "__main__":
    sys.exit(main())
