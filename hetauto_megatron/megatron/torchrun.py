"""`hetauto-torchrun`: torch's launcher, torchrun (torch.distributed.run, every option of it), as the launch scripts
'hetauto emit megatron' writes start it. One difference: when a worker stops on a user error (exit 2, after
printing its one paragraph: a refused argument, a plan that does not match the launch; megatron/hook.py), the
launch ends with exit 2 and one line saying so, instead of torchrun's ChildFailedError traceback and exit 1, so
that a user error reads as one paragraph from the script too. Any other failure (a crash, a signal, exit 1) is
torchrun's own report.
"""
from __future__ import annotations

import sys

USER_ERROR = 2


def main(argv: list[str] | None = None) -> int:
    from torch.distributed import run
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    try:
        run.main(argv)
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
