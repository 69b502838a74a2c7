"""`hetauto-torchrun`: torch's launcher, torchrun (torch.distributed.run, every option of it), as the launch scripts
'hetauto emit megatron' writes start it. One difference: when a worker stops on a user error (exit 2, after
printing its one paragraph: a refused argument, a plan that does not match the launch; megatron/hook.py), the
launch ends with exit 2 and one line saying so, instead of torchrun's ChildFailedError traceback and exit 1, so
that a user error reads as one paragraph from the script too. Any other failure (a crash, a signal, exit 1) is
torchrun's own report.
"""
from __future__ import annotations

import re
import sys

USER_ERROR = 2


def main(argv: list[str] | None = None) -> int:
    from torch.distributed import DistNetworkError, run
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    try:
        run.main(argv)
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
        refused = sorted(rank for rank, failure in exc.failures.items() if failure.exitcode == USER_ERROR)
        # only a launch whose every worker that exited on its own (not killed by torchrun: a negative code) stopped
        # on a user error; a crash beside it keeps torchrun's own report
        if not refused or any(f.exitcode >= 0 and f.exitcode != USER_ERROR for f in exc.failures.values()):
            raise
        ranks = ", ".join(map(str, refused))
        print(f"hetauto-torchrun: worker rank(s) {ranks} of this launch stopped on invalid input (exit 2): the "
              "paragraph above names the file, the field and the fix", file=sys.stderr)
        return USER_ERROR
    return 0


if __name__ == "__main__":
    sys.exit(main())
