"""A --timeout too small for the dry run's ranks: one paragraph naming --timeout and its fix, exit 2, whichever
wait runs out first. On 2 cores `hetauto dryrun --tiny --timeout 0.1` ran out at the rendezvous on some runs (exit
2, after eight of gloo's own "[.../gloo/transport/tcp/debug_logger.cc:9] ERROR failed to connect, willRetry=1"
lines on stderr) and in the optimizer's first collective on others (exit 1, six ranks' paragraphs, then a note on
--timeout). On a faster machine every wait of the run fitted in 0.1 s and it trained (exit 0), so the test gives 1 ms:
forking six ranks, their connecting, and each stage's forward pass ahead of its neighbour's receive take longer on
any machine, whichever of those waits runs out first."""
import pytest
from helpers import run_hetauto

from hetauto_megatron.runtime.dryrun import first_timeout, waits_timed_out

pytestmark = pytest.mark.ranks     # starts several rank processes: one such module at a time (conftest)

PLAN = "examples/llama/plans/tiny-2clusters-cpu.yaml"

# what the six ranks reported when the optimizer's first collective ran past --timeout 0.1 (the run above): one
# rank's send timed out, and the ranks it gave up on saw their connections closed
_COLLECTIVE = ("PeerError: rank {r} (cluster cluster-a, stage 0) stopped: one of Megatron's collectives "
               "(_get_param_groups in megatron/core/optimizer/__init__.py:364) failed (gloo: {why}); every other "
               "rank still answers, so one of them is stuck or a connection between the clusters broke.")


def test_a_small_timeout_is_one_paragraph_whatever_wait_runs_out():
    run = run_hetauto("dryrun", "--plan", PLAN, "--tiny", "--timeout", "0.001")
    err = run.stderr
    assert run.returncode == 2 and run.stdout == "", (run.returncode, err)
    assert err.count("\n") == 1 and err.startswith("hetauto dryrun: error: field '--timeout': "), err
    assert "Fix: give a larger --timeout" in err, err
    # (no native log line of gloo's or c10d's: where the wait ran out may quote gloo's error, "(gloo: Timed out ...")
    assert "Traceback" not in err and "willRetry" not in err and "gloo/" not in err and "[c10d]" not in err, err


def test_which_failures_are_waits_past_the_timeout():
    """The reports of a collective that timed out (above) are a timeout; a rank that died, failed on its own or
    hung (the launch killed it) keeps the launch's report even where its peers' waits then time out."""
    timed = {r: _COLLECTIVE.format(r=r, why="Connection closed by peer [127.0.0.1]:21897") for r in (0, 1, 3, 4)}
    timed.update({r: _COLLECTIVE.format(r=r, why="Timed out waiting 100ms for send operation to complete")
                  for r in (2, 5)})
    assert waits_timed_out(timed)
    assert first_timeout(timed).startswith("rank 2: PeerError: rank 2 (cluster cluster-a, stage 0) stopped: one of ")
    assert not waits_timed_out({r: _COLLECTIVE.format(r=r, why="Connection closed by peer [127.0.0.1]:2")
                                for r in range(4)})                       # no wait timed out: a peer broke
    died = {**timed, 3: "process died (exit code -9) without reporting a result (killed by SIGKILL: most often the "
                        "machine ran out of memory)"}
    assert not waits_timed_out(died)
    assert not waits_timed_out({**timed, 0: "ValueError: a rank's own failure"})
    assert not waits_timed_out({r: "still running after the launch timeout of 64s; killed" for r in range(6)})
    stuck = {**timed, 2: "still running 10s after another rank failed; killed (it was probably waiting on the "
                         "failed rank)"}        # (test_runtime_launch.py's silent peer: the others' waits time out)
    assert not waits_timed_out(stuck)
