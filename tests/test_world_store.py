"""The world's rendezvous of separately launched clusters (megatron/world_store.py) on torch's real TCP store, in
one process (a rank that finds no host: in a process of its own): a refusal reaches the ranks waiting at once; a
missing host, a missing rank and a taken port are one paragraph each (exit 2), never a hang or torch's traceback."""
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from hetauto_megatron.errors import InputError
from hetauto_megatron.megatron import world_store
from hetauto_megatron.runtime.launcher import free_port

pytestmark = pytest.mark.ranks     # starts several rank processes: one such module at a time (conftest)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_a_refusal_posted_by_another_rank_stops_the_host_at_once():
    port, caught = free_port(), {}

    def host():
        try:
            world_store.join(0, 2, "127.0.0.1", port, 60.0)
        except InputError as exc:
            caught["exc"] = exc

    t = threading.Thread(target=host)
    start = time.monotonic()
    t.start()
    time.sleep(0.5)
    world_store.post_refusal("--global-batch-size 16 is not the plan's 8", env={
        "HETAUTO_MASTER_ADDR": "127.0.0.1", "HETAUTO_MASTER_PORT": str(port), "HETAUTO_WORLD_SIZE": "2",
        "HETAUTO_RANK_OFFSET": "1", "RANK": "0", "HETAUTO_CLUSTER": "cluster-b"})
    t.join(30)
    assert not t.is_alive() and time.monotonic() - start < 20
    exc = caught["exc"]
    assert exc.exit_code == 2 and "rank 1 (cluster cluster-b): --global-batch-size 16" in exc.message
    assert getattr(exc, "from_world_store", False)       # the host stopping on it posts nothing of its own


def test_a_rank_stopped_by_another_clusters_refusal_names_that_cluster_not_the_address(monkeypatch):
    """The ranks that stop because another cluster refused the job: their paragraph named HETAUTO_MASTER_ADDR as its
    field, as if the rendezvous address (which had just worked) were wrong. It names the refusing cluster and where
    its reason is (that cluster's log), and no field of this rank's own."""
    monkeypatch.setenv("HETAUTO_CLUSTER", "cluster-a")
    port, caught = free_port(), {}

    def host():
        try:
            world_store.join(0, 2, "127.0.0.1", port, 60.0, file="plan.yaml")
        except InputError as exc:
            caught["exc"] = exc

    t = threading.Thread(target=host)
    t.start()
    time.sleep(0.5)
    world_store.post_refusal("plan.yaml: field 'meshes': the job was launched with 2 processes but the plan needs 4",
                             env={"HETAUTO_MASTER_ADDR": "127.0.0.1", "HETAUTO_MASTER_PORT": str(port),
                                  "HETAUTO_WORLD_SIZE": "2", "HETAUTO_RANK_OFFSET": "1", "RANK": "0",
                                  "HETAUTO_CLUSTER": "cluster-b"})
    t.join(30)
    exc = caught["exc"]
    assert exc.field is None and "HETAUTO_MASTER_ADDR" not in exc.message, exc.message
    assert "so this rank (0) stops too: cluster cluster-b refused the job" in exc.message, exc.message
    assert "the launch of this cluster (cluster-a) and the rendezvous address are not at fault" in exc.message
    assert "rank 1 (cluster cluster-b): plan.yaml: field 'meshes'" in exc.message
    assert "Fix: fix the launch of cluster cluster-b as the refusal says (the log of global rank 1 on cluster " \
           "cluster-b has it in full)" in exc.message, exc.message


def test_a_rank_stopped_by_a_refusal_of_its_own_cluster_does_not_say_its_launch_is_not_at_fault(monkeypatch):
    """After the join a rank of the same cluster can refuse (its machine lacks the training data: only some ranks
    read it); the others of that cluster said "another cluster's launch was refused ... cluster cluster-a refused
    the job; the launch of this cluster (cluster-a) ... not at fault". They name the rank of this cluster."""
    monkeypatch.setenv("HETAUTO_CLUSTER", "cluster-a")
    exc = world_store.refused_elsewhere("rank 0 (cluster cluster-a): field '--data-path': no data", 1,
                                        after_join=True)
    assert exc.message.startswith("rank 0 of this cluster (cluster-a) refused the job after the clusters had "
                                  "joined, so this rank (1) stops too"), exc.message
    assert "another cluster" not in exc.message and "this cluster (cluster-a) and" not in exc.message
    assert "The refusal: rank 0 (cluster cluster-a): field '--data-path'" in exc.message
    assert exc.fix.startswith("fix what the refusal says (the log of global rank 0 on cluster cluster-a")
    monkeypatch.setenv("HETAUTO_CLUSTER", "cluster-b")
    assert "cluster cluster-a refused the job" in world_store.refused_elsewhere(
        "rank 0 (cluster cluster-a): field '--data-path': no data", 4, after_join=True).message


def test_nobody_hosting_names_the_address_and_the_launch_of_global_rank_0():
    """A rank (a process of its own) joins a port where nothing listens: the launch holding global rank 0 never
    started, or this one was given another address or port. It said it waited for 'the plan's 2 ranks', that 'a
    cluster's launch' did not start, and to raise HETAUTO_TIMEOUT_S, where the ranks that reach the store name the
    ranks missing. Now one paragraph names the address and port tried, that nothing listens there, whose launch
    hosts it and the variables to make the same on every cluster."""
    with socket.socket() as held:       # bound, never listening: a connection is refused, and no one else takes it
        held.bind(("127.0.0.1", 0))
        port = held.getsockname()[1]
        code = ("import sys\n"
                "from hetauto_megatron.megatron import world_store as w\n"
                "from hetauto_megatron.errors import InputError\n"
                "try:\n"
                f"    w.join(1, 2, '127.0.0.1', {port}, 3.0, file='plan.yaml')\n"
                "except InputError as exc:\n"
                "    print(exc.message, file=sys.stderr)\n"
                "    raise SystemExit(exc.exit_code)\n")
        start = time.monotonic()
        try:
            r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=90, cwd=ROOT)
        except subprocess.TimeoutExpired:
            raise AssertionError("the join waited past 90 s with a 3 s timeout") from None
    assert r.returncode == 2 and time.monotonic() - start < 60, r.stderr
    said = r.stderr.strip()
    assert said.startswith("plan.yaml: field 'HETAUTO_MASTER_ADDR': rank 1 waited 3 s for the world's rendezvous "
                           f"at 127.0.0.1:{port}, but nothing accepted a connection there: no process listens"), said
    assert "the launch holding global rank 0" in said and "did not start" in said, said
    assert "another HETAUTO_MASTER_ADDR or HETAUTO_MASTER_PORT" in said and "give a larger HETAUTO_TIMEOUT_S" in said
    assert "Traceback" not in said and len(said.splitlines()) == 1, said


def test_a_rank_missing_is_a_timeout_paragraph_that_counts_who_came():
    with pytest.raises(InputError) as info:
        world_store.join(0, 3, "127.0.0.1", free_port(), 1.5)
    assert "1 of 3 ranks checked in" in info.value.message


def test_a_timeout_names_the_ranks_that_never_checked_in_and_the_timeout_to_raise():
    """Ranks 0 and 2 of 3 check in, rank 1 never comes. Both named only a count and told to fix HETAUTO_WORLD_SIZE
    and NODE_RANK, though the store knew who came and a launch still starting needs only a longer wait. Now each
    names the missing rank as the plan describes it, and the setting its wait came from in the fix."""
    port, caught = free_port(), {}
    describe = {0: "rank 0 (cluster a, stage 0)", 1: "rank 1 (cluster b, stage 0)", 2: "rank 2 (cluster b, stage 1)"}

    def rank(r, timeout_from):
        try:
            world_store.join(r, 3, "127.0.0.1", port, 4.0, file="plan.yaml", describe=describe.get,
                             timeout_from=timeout_from)
        except InputError as exc:
            caught[r] = exc

    threads = [threading.Thread(target=rank, args=(0, "HETAUTO_TIMEOUT_S")),
               threading.Thread(target=rank, args=(2, "--distributed-timeout-minutes 1"))]
    threads[0].start()
    time.sleep(0.5)         # (the host's store first)
    threads[1].start()
    for t in threads:
        t.join(60)
    for r, setting in ((0, "HETAUTO_TIMEOUT_S"), (2, "--distributed-timeout-minutes")):
        exc = caught[r]
        assert "(2 of 3 ranks checked in); never checked in: rank 1 (cluster b, stage 0):" in exc.message, exc.message
        assert "rank 0 (" not in exc.message and "rank 2 (" not in exc.message
        assert exc.field == setting and f"give a larger {setting}" in exc.fix, exc.fix
        assert exc.exit_code == 2 and "plan.yaml" in str(exc)


def test_a_taken_port_is_named():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(InputError) as info:
            world_store.join(0, 2, "127.0.0.1", port, 5.0)
    assert "could not set up the rendezvous" in info.value.message and "HETAUTO_MASTER_PORT" in str(info.value)


def test_post_refusal_outside_a_multi_cluster_launch_does_nothing():
    start = time.monotonic()
    world_store.post_refusal("x", env={})
    world_store.post_refusal("x", env={"HETAUTO_MASTER_ADDR": "127.0.0.1"})     # one launch: no world size
    assert time.monotonic() - start < 1


def test_a_refused_host_and_its_sibling_wait_until_a_late_rank_has_read_the_refusal():
    """Ranks 0 and 1 (one launch: torchrun stops the other as soon as one exits) both refused; rank 2 (another
    cluster) starts 2 s later. Neither refused rank may return before rank 2 has read the refusal, and rank 2 stops
    on it at once (before: rank 1 returned at once, its torchrun took rank 0 and the store down, rank 2 waited its
    whole timeout)."""
    port, done = free_port(), {}

    def env(rank):
        return {"HETAUTO_MASTER_ADDR": "127.0.0.1", "HETAUTO_MASTER_PORT": str(port), "HETAUTO_WORLD_SIZE": "3",
                "HETAUTO_RANK_OFFSET": "0", "RANK": str(rank), "HETAUTO_CLUSTER": "cluster-a"}

    def refuse(rank):
        world_store.post_refusal(f"rank {rank}'s --global-batch-size is not the plan's", env=env(rank))
        done[rank] = time.monotonic()

    threads = [threading.Thread(target=refuse, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    time.sleep(2.0)
    start = time.monotonic()
    with pytest.raises(InputError) as info:
        world_store.join(2, 3, "127.0.0.1", port, 60.0)
    read = time.monotonic()
    for t in threads:
        t.join(30)
    assert read - start < 10 and "(cluster cluster-a)" in info.value.message
    # both stayed for rank 2, which joined 2 s after they posted (and is released only once it has read): before,
    # rank 1 returned at once
    assert min(done.values()) >= start, (done, start)


def test_the_host_going_away_is_a_paragraph():
    """Rank 0's process stops (a crash, or its launcher stopped it) while a rank waits: one paragraph naming where
    to look, exit 2, not torch's network traceback. Rank 0 is a child process here, killed while rank 1 waits."""
    import subprocess
    import sys

    port = free_port()
    host = subprocess.Popen([sys.executable, "-c", (
        "from hetauto_megatron.megatron import world_store as w; "
        f"w.join(0, 3, '127.0.0.1', {port}, 60.0)")])
    try:
        up = time.monotonic() + 60
        while not world_store._host_up("127.0.0.1", port, 1.0) and time.monotonic() < up:
            time.sleep(0.2)             # (its interpreter's start-up takes seconds on a loaded machine)
        def kill_once_checked_in():      # once rank 1 has checked in (the host counts itself): a fixed delay let
            client = world_store._connect("127.0.0.1", port, time.monotonic() + 60)
            until = time.monotonic() + 60
            while client is not None and client.add(world_store.JOINED, 0) < 2 and time.monotonic() < until:
                time.sleep(0.1)
            host.kill()                  # the host go before a slow rank 1 had connected

        threading.Thread(target=kill_once_checked_in, daemon=True).start()
        start = time.monotonic()
        with pytest.raises(InputError) as info:
            world_store.join(1, 3, "127.0.0.1", port, 60.0)
        assert time.monotonic() - start < 20
    finally:
        host.kill()
        host.wait()
    assert "lost the rendezvous" in info.value.message and "global rank 0" in info.value.message


def _indented(tail: str) -> str:
    return "".join(f"    {line}\n" for line in tail.splitlines() if line.strip())


def _joined_ranks(tails: list, env: dict | list | None = None, timeout: float = 90,
                  plan_file: str | None = None, before_join: str = "") -> list:
    """One process per rank: each joins the world store (a refusal there is its paragraph and exit 2, as the
    patched script's guard gives it; `plan_file`: the plan that names the ranks in it), makes torch's gloo group on
    it (collectives time out after 120 s) and runs its tail, with `env` added to its environment (a list: one for
    each rank), and `before_join` run before its join; -> [(exit code, stderr, seconds from the start)]."""
    import os
    import subprocess
    import sys

    port, world = free_port(), len(tails)
    describe = (f"(lambda plan: lambda r: describe_rank(plan, r))(load_plan({plan_file!r}))" if plan_file else "None")
    # each rank ends as under the patched script with --hetauto: the hook in charge of its exit before the join
    # (hook.pretrain_kwargs), main_guard turning a refusal into its paragraph and exit 2, a finished rank's groups
    # destroyed at its exit (clean_exit.destroy_groups_at_exit)
    common = ("import datetime, time; import torch.distributed as dist; "
              "from hetauto_megatron.megatron import hook, world_store as w; "
              "from hetauto_megatron.errors import InputError; "
              "from hetauto_megatron.plan.plan import load_plan; "
              "from hetauto_megatron.runtime.ranks import describe_rank; "
              "from hetauto_megatron.megatron.script_guard import main_guard\n"
              f"{before_join}\n"
              "def main():\n"
              f"    store = w.join({{rank}}, {world}, '127.0.0.1', {port}, 60.0, describe={describe})\n"
              f"    dist.init_process_group('gloo', rank={{rank}}, world_size={world}, store=store, "
              "timeout=datetime.timedelta(seconds=120))\n")
    end = "\nhook._take_charge_of_exit(60.0)\nmain_guard(main)\n"
    start = time.monotonic()
    procs = [subprocess.Popen([sys.executable, "-c", common.format(rank=r) + _indented(tail) + end], stderr=subprocess.PIPE,
                              text=True, env={**os.environ, "HETAUTO_CLUSTER": f"cluster-{r}",
                                              **((env[r] if isinstance(env, list) else env) or {})})
             for r, tail in enumerate(tails)]
    out = []
    try:
        for p in procs:
            _, err = p.communicate(timeout=timeout)
            out.append((p.returncode, err, time.monotonic() - start))
    finally:
        for p in procs:
            p.kill()
    return out


REFUSE = ("time.sleep(1); raise InputError('the checkpoint was saved under another plan layout', "
          "field='--load', fix='resume with the plan it was saved under')")


@pytest.mark.parametrize("refusing", [0, 1])
def test_a_refusal_after_the_join_stops_the_ranks_waiting_in_a_collective(refusing):
    """Each cluster reads its own files after the join (its checkpoint under --load, its tokenizer), so one cluster
    may refuse while the others already wait in a collective. Three ranks: the others wait in a real gloo barrier
    that the refusing rank never enters; it refuses through the hook's exit path. Every rank must stop at once
    with the refusing rank's paragraph (exit 2), not after the collective's timeout (120 s here; 600 s by default)
    and not with gloo's traceback as the others' connections close (the host's watcher, lingering for the others,
    met that when rank 1 refused)."""
    tails = ["dist.barrier()"] * 3
    tails[refusing] = REFUSE
    for rank, (code, err, seconds) in enumerate(_joined_ranks(tails)):
        assert code == 2 and seconds < 60 and "Traceback" not in err, (rank, err)
        if rank == refusing:
            assert "hetauto: error: field '--load': the checkpoint was saved" in err, err
        else:
            assert f"refused after the clusters had joined, so this rank ({rank}) stops too" in err, err
            assert (f"rank {refusing} (cluster cluster-{refusing}): field '--load': the checkpoint was saved under "
                    "another plan") in err, err
            assert f"cluster cluster-{refusing} refused the job" in err and "HETAUTO_MASTER_ADDR" not in err, err


def test_a_job_that_ends_normally_ends_quietly_on_every_rank():
    """Rank 0 (the store's host) finishes first; the watchers of the ranks still working met the closed store and
    torch logged its C++ stack on each (13 lines per rank)."""
    for rank, (code, err, _) in enumerate(_joined_ranks(["dist.barrier()", "dist.barrier(); time.sleep(5)",
                                                          "dist.barrier(); time.sleep(2.5)"])):
        assert code == 0 and "frame #" not in err and "TCPStore" not in err, (rank, err[:2000])


def test_no_watcher_reads_the_store_as_its_host_ends_a_job_that_went_well():
    """A watcher found the host up, then read the store as rank 0 ended: the closed connection made torch log its
    C++ stack (some 60 lines) on that rank; rank 0's own watcher met its store closing under it the same way, at
    the end of a job that went well. Here the watchers read without pause (WATCH_S 0), so that every end meets a
    read: rank 0 ends at once, the others 2 s later. Each rank stops its watcher as it ends, and the host stays
    until the others have ended or have seen it leave (world_store.end_of_job)."""
    for rank, (code, err, _) in enumerate(_joined_ranks(["dist.barrier()", "dist.barrier(); time.sleep(2)",
                                                          "dist.barrier(); time.sleep(2)"],
                                                         before_join="w.WATCH_S = 0.0")):
        assert code == 0 and "frame #" not in err and "TCPStore" not in err, (rank, err[:2000])


def test_an_address_that_does_not_resolve_is_said_at_once_and_named(capfd):
    """HETAUTO_MASTER_ADDR=no-such-host.invalid waited the whole rendezvous timeout without a word, printing torch's
    C++ stack for every try, then named HETAUTO_WORLD_SIZE. A name may appear only once rank 0's node is up, so it
    is retried, but said at once, and the paragraph at the timeout names the address."""
    start = time.monotonic()
    with pytest.raises(InputError) as info:
        world_store.join(1, 2, "no-such-host.invalid", free_port(), 3.0)
    assert time.monotonic() - start < 15
    assert info.value.field == "HETAUTO_MASTER_ADDR" and "does not resolve" in info.value.message
    err = capfd.readouterr().err
    assert err.count("does not resolve") == 1 and "retrying until the rendezvous timeout (3 s)" in err, err


@pytest.mark.parametrize("rank", [0, 1])
@pytest.mark.parametrize("addr", [" ", "127.0.0.1:29600", "http://node0"])
def test_an_address_that_is_no_host_is_refused_at_once(capfd, rank, addr):
    """HETAUTO_MASTER_ADDR blank or with a port (or a URL): torch's lookup of the whole text failed, and the rank
    retried it until the rendezvous timeout, then said it did not resolve. It is no host at all, so refused at once
    (the check CLUSTER_MASTER_ADDR gets in hetauto-torchrun, megatron/cluster_rendezvous.py); an IPv6 address is a
    host."""
    start = time.monotonic()
    with pytest.raises(InputError) as info:
        world_store.join(rank, 2, addr, free_port(), 30.0)
    assert time.monotonic() - start < 5
    assert info.value.field == "HETAUTO_MASTER_ADDR" and f"HETAUTO_MASTER_ADDR={addr!r} " in info.value.message
    assert "does not resolve" not in capfd.readouterr().err


def test_waiting_for_a_host_not_up_yet_prints_nothing(capfd):
    """A rank whose host is not up yet retries quietly (torch's client logged some 60 lines of C++ stack per try)."""
    with pytest.raises(InputError):
        world_store.join(1, 2, "127.0.0.1", free_port(), 3.0)
    err = capfd.readouterr().err
    assert "frame #" not in err and "TCPStore" not in err, err[:2000]
