"""How long a rank under --hetauto waits for the others: one timeout for every wait between ranks (the world's
rendezvous, the process groups' collectives, the cross-cluster exchange, the exit).

It is HETAUTO_TIMEOUT_S (600 s by default, which the launch scripts pass on), or Megatron-LM's own
--distributed-timeout-minutes where the launch types it: without --hetauto that flag is the timeout of Megatron's
process groups, and NVIDIA's example scripts give 60 for long dataset builds and checkpoint loads; under --hetauto
the process groups are hetauto's, so the flag was ignored and a rank waiting longer than 600 s for rank 0's index
build stopped. Megatron's --distributed-timeout-seconds-after-init changes the timeout of its own process groups
after the first iteration (parallel_state.update_pg_timeout): under --hetauto it has none, and every rank stopped
there with a TypeError traceback (measured on the 2-cluster tiny plan), so it is refused.
"""
from __future__ import annotations

import math
import os

from ..emit.megatron import DEFAULT_TIMEOUT_S, MAX_TIMEOUT_S
from ..errors import InputError
from .args import ParserDefaultInt

DEFAULT_S = float(DEFAULT_TIMEOUT_S)


def env_timeout_s() -> float:
    """HETAUTO_TIMEOUT_S in seconds (default 600); a value that is not a positive finite number is refused."""
    raw = os.environ.get("HETAUTO_TIMEOUT_S", str(int(DEFAULT_S)))
    try:
        value = float(raw)
    except ValueError:
        value = -1
    if not 0 < value < math.inf:      # NaN and inf too: the process groups' timedelta cannot hold them
        raise InputError(f"HETAUTO_TIMEOUT_S={raw!r} is not a positive number of seconds", field="HETAUTO_TIMEOUT_S",
                         fix="unset it (default 600) or give seconds, e.g. 600")
    if value > MAX_TIMEOUT_S:
        raise InputError(f"HETAUTO_TIMEOUT_S={raw!r} is more than a week ({MAX_TIMEOUT_S} s), the longest wait "
                         "between ranks a run may set (torch's deadlines overflow not far above)",
                         field="HETAUTO_TIMEOUT_S", fix=f"give at most {MAX_TIMEOUT_S}, or unset it (default 600)")
    return value


def job_timeout_s(args) -> tuple[float, str]:
    """(seconds, where they come from) of every wait between ranks for this launch's parsed (not yet validated)
    Megatron arguments: a typed --distributed-timeout-minutes (not Megatron's default, marked by args.py), else
    HETAUTO_TIMEOUT_S."""
    if getattr(args, "distributed_timeout_seconds_after_init", None) is not None:
        raise InputError("--distributed-timeout-seconds-after-init changes the timeout of Megatron-LM's own process "
                         "groups after the first iteration; under --hetauto the process groups are hetauto's, "
                         "and one timeout bounds every wait between ranks for the whole run (Megatron stopped "
                         "every rank after the first iteration with a TypeError)",
                         field="--distributed-timeout-seconds-after-init",
                         fix="drop it; give the run's timeout with --distributed-timeout-minutes or "
                             "HETAUTO_TIMEOUT_S (seconds)")
    minutes = getattr(args, "distributed_timeout_minutes", None)
    if minutes is None or isinstance(minutes, ParserDefaultInt):
        return env_timeout_s(), "HETAUTO_TIMEOUT_S"
    if minutes > MAX_TIMEOUT_S / 60:
        raise InputError(f"--distributed-timeout-minutes {minutes}: more than a week ({MAX_TIMEOUT_S // 60} minutes), "
                         "the longest wait between ranks a run may set (torch's deadlines overflow not far above)",
                         field="--distributed-timeout-minutes",
                         fix=f"give at most {MAX_TIMEOUT_S // 60} minutes, or drop the flag (HETAUTO_TIMEOUT_S, "
                             "default 600 s, then applies)")
    if minutes <= 0:
        raise InputError(f"--distributed-timeout-minutes {minutes}: a timeout must be a positive number of minutes",
                         field="--distributed-timeout-minutes",
                         fix="give the minutes a rank may wait for the others (Megatron-LM's default is 10), or "
                             "drop the flag (HETAUTO_TIMEOUT_S, default 600 s, then applies)")
    return 60.0 * minutes, f"--distributed-timeout-minutes {minutes}"
