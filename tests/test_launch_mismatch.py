"""Clusters whose launches do not match each other, started as the emitted scripts start them (one bash per node, its
hetauto-torchrun inside, the example entry script with --hetauto; two one-rank clusters: test_job_agreement's plan):
every rank must stop at once with one paragraph naming what to fix (exit 2), never wait HETAUTO_TIMEOUT_S, and
never end in gloo's traceback."""
import os
import subprocess
import sys
import time

import pytest
import yaml
from helpers import ROOT, kill_launches, wait_all
from test_job_agreement import PLAN_YAML
from test_megatron_pretrain import job_flags

from hetauto_megatron.emit.megatron import emit_megatron
from hetauto_megatron.plan.plan import load_plan, plan_from_dict
from hetauto_megatron.runtime.launcher import free_port

pytestmark = pytest.mark.ranks     # starts several rank processes: one such module at a time (conftest)

ENTRY = os.path.join(ROOT, "examples", "llama", "pretrain_llama_hetauto.py")
# HETAUTO_TIMEOUT_S: each case must end well before it. Stopping at once takes 5-10 s alone, 20-25 s on a loaded
# machine and up to about 50 s on a CI runner twice as slow: STOPS_AT_ONCE_S leaves room for that and is still half
# the timeout, which a launch that waits it out exceeds.
TIMEOUT_S = 300
STOPS_AT_ONCE_S = 150


def launch_clusters(tmp_path, plans: dict, extra: dict | None = None, *, timeout_s: float = TIMEOUT_S,
                    devices_per_node: int | None = None, env_over: dict | None = None) -> tuple[dict, dict, float]:
    """Run node 0 of cluster X's emitted script from the plan `plans[X]` (YAML text), with `extra[X]` after the job's
    flags and `env_over` over the launch's environment; -> ({cluster: exit code}, {cluster: log}, seconds until the
    last one ended)."""
    env = {k: v for k, v in os.environ.items() if k != "TORCHRUN"}
    env.update(PATH=os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", ""),
               HETAUTO_MASTER_ADDR="127.0.0.1", HETAUTO_MASTER_PORT=str(free_port()),
               HETAUTO_TIMEOUT_S=str(timeout_s), CLUSTER_MASTER_ADDR="127.0.0.1", PYTHONWARNINGS="ignore",
               MEGATRON_SCRIPT=ENTRY, NODE_RANK="0")
    env.update(env_over or {})
    procs, logs = {}, {}
    start = time.monotonic()
    try:
        for cluster, yaml_text in plans.items():
            plan_file = tmp_path / f"plan-{cluster}.yaml"
            plan_file.write_text(yaml_text)
            plan = load_plan(str(plan_file))
            la = next(la for la in emit_megatron(plan, plan_path=str(plan_file), devices_per_node=devices_per_node)
                      if la["cluster"] == cluster)
            script = tmp_path / f"{la['name']}.sh"
            script.write_text(la["script"])
            logs[cluster] = tmp_path / f"{cluster}.log"
            with open(logs[cluster], "w") as fh:
                procs[cluster] = subprocess.Popen(
                    ["bash", str(script), *job_flags(plan, 2), *(extra or {}).get(cluster, [])], stdout=fh,
                    stderr=subprocess.STDOUT, env=dict(env, CLUSTER_MASTER_PORT=str(free_port())),
                    start_new_session=True, cwd=str(tmp_path))
        codes = dict(zip(procs, wait_all(list(procs.values()), timeout=timeout_s + 120)))
    finally:        # (a launch started before something above failed: it and its workers)
        kill_launches(list(procs.values()))
    return codes, {c: path.read_text() for c, path in logs.items()}, time.monotonic() - start


# test_job_agreement's plan with cluster-b at DP 2 (cluster-a's micro-batch 2 to match): 3 ranks where it has 2
WIDER = PLAN_YAML.replace("cluster-a, device_type: cpu, tp: 1, dp: 1, micro_batch_size: 1",
                          "cluster-a, device_type: cpu, tp: 1, dp: 1, micro_batch_size: 2").replace(
    "cluster-b, device_type: cpu, tp: 1, dp: 1,", "cluster-b, device_type: cpu, tp: 1, dp: 2,")


def test_clusters_started_with_plans_of_different_world_sizes_stop_at_once(tmp_path):
    """Cluster-b launched from a copy of the plan with DP 2 there (3 ranks where cluster-a's plan has 2). Before:
    each rank counted the check-ins at the world store against its own plan's world, so all "joined", and every
    rank waited in the plan comparison's all-gather until the timeout, then stopped with gloo's traceback, torchrun's
    ChildFailedError and exit 1. Now each rank of cluster-b compares its plan with global rank 0's as it checks
    in: every rank stops at once with the paragraph a same-size edited plan gets (exit 2)."""
    assert plan_from_dict(yaml.safe_load(WIDER)).world_size == 3
    codes, logs, took = launch_clusters(tmp_path, {"cluster-a": PLAN_YAML, "cluster-b": WIDER})
    assert codes == {"cluster-a": 2, "cluster-b": 2}, {c: text[-2000:] for c, text in logs.items()}
    assert took < STOPS_AT_ONCE_S, took
    for cluster, text in logs.items():
        assert "Traceback" not in text and "ChildFailedError" not in text, text[-3000:]
        assert "field '--hetauto-plan': the ranks were started with different plans" in text, text[-3000:]
    assert "loaded another plan than rank 0 (this process is rank 0)" in logs["cluster-a"], logs["cluster-a"][-3000:]
    assert "rank 0's plan runs 2 ranks, this one's 3" in logs["cluster-b"], logs["cluster-b"][-3000:]


@pytest.mark.parametrize("flag", ["--log-params-norm", "--exit-signal-handler"])
def test_a_flag_that_adds_a_collective_over_the_world_on_one_cluster_only_is_named_at_once(tmp_path, flag):
    """Typed on cluster-b only (the audit's launches): before, both clusters trained until that collective, waited
    HETAUTO_TIMEOUT_S and stopped with exit 4 and a paragraph naming a collective (params_norm_once, Megatron's
    all_gather_item), not the flag. Now every rank stops once the world is joined, naming the flag (exit 2)."""
    codes, logs, took = launch_clusters(tmp_path, {"cluster-a": PLAN_YAML, "cluster-b": PLAN_YAML},
                                        {"cluster-b": [flag]})
    assert codes == {"cluster-a": 2, "cluster-b": 2}, {c: text[-2000:] for c, text in logs.items()}
    assert took < STOPS_AT_ONCE_S, took
    for text in logs.values():
        assert "Traceback" not in text and f"field '{flag}'" in text, text[-3000:]
        assert f"{flag}: False on rank 0 (cluster cluster-a, stage 0), True on rank 1 (cluster cluster-b" in text


def test_a_hand_launch_without_the_worlds_rendezvous_address_is_refused_at_once(tmp_path):
    """Each cluster started by hand with hetauto-torchrun, HETAUTO_WORLD_SIZE and HETAUTO_RANK_OFFSET set but no
    HETAUTO_MASTER_ADDR. Before: the hook fell back to each torchrun's own rendezvous, where the other cluster's
    ranks never came: every rank waited HETAUTO_TIMEOUT_S, then stopped naming HETAUTO_WORLD_SIZE. Now every rank
    stops at once naming HETAUTO_MASTER_ADDR (exit 2)."""
    from test_torchrun_port import HETAUTO_TORCHRUN

    from hetauto_megatron.megatron import demo

    plan_file = tmp_path / "plan.yaml"
    plan_file.write_text(PLAN_YAML)
    plan = load_plan(str(plan_file))
    argv = [ENTRY, *demo.hetauto_argv(str(plan_file), plan, iters=2, seed=1)]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HETAUTO_", "MASTER_"))}
    procs, logs = [], []
    start = time.monotonic()
    try:
        for offset, cluster in enumerate(("cluster-a", "cluster-b")):
            logs.append(tmp_path / f"{cluster}.log")
            with open(logs[-1], "w") as fh:
                procs.append(subprocess.Popen(
                    [HETAUTO_TORCHRUN, "--nnodes=1", "--nproc-per-node=1", "--master-addr=127.0.0.1",
                     f"--master-port={free_port()}", *argv], stdout=fh, stderr=subprocess.STDOUT, cwd=str(tmp_path),
                    env=dict(env, HETAUTO_CLUSTER=cluster, HETAUTO_RANK_OFFSET=str(offset), HETAUTO_WORLD_SIZE="2",
                             HETAUTO_TIMEOUT_S=str(TIMEOUT_S), PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1"),
                    start_new_session=True))
        codes = wait_all(procs, timeout=TIMEOUT_S + 120)
    finally:
        kill_launches(procs)
    took = time.monotonic() - start
    texts = [log.read_text() for log in logs]
    assert codes == [2, 2], [text[-2000:] for text in texts]
    assert took < STOPS_AT_ONCE_S, took
    for text in texts:
        assert "Traceback" not in text and "field 'HETAUTO_MASTER_ADDR': this launch starts 1 of the world's 2 " \
            "ranks" in text, text[-3000:]


# a rendezvous that cannot complete must end within its timeout: short here, with room for a loaded 2-core machine
SHORT_TIMEOUT_S = 25
ENDS_WITHIN_S = SHORT_TIMEOUT_S + 90


def test_a_cluster_started_without_one_of_its_nodes_says_so_within_the_timeout(tmp_path):
    """cluster-b's plan has 2 one-device nodes; only its node 0 is started (and cluster-a's). Before: cluster-b's
    torchrun waited in torch's static rendezvous for node 1 with torch's own 600 s, whatever HETAUTO_TIMEOUT_S said,
    without a word, then ended in the agent's traceback (only cluster-a's rank said, after HETAUTO_TIMEOUT_S, that
    cluster-b's ranks never checked in). Now hetauto-torchrun gives that rendezvous HETAUTO_TIMEOUT_S and ends it
    with one paragraph naming the node that never joined (exit 2)."""
    codes, logs, took = launch_clusters(tmp_path, {"cluster-a": WIDER, "cluster-b": WIDER}, devices_per_node=1,
                                        timeout_s=SHORT_TIMEOUT_S)
    assert codes == {"cluster-a": 2, "cluster-b": 2}, {c: text[-2000:] for c, text in logs.items()}
    assert took < ENDS_WITHIN_S, took
    b = logs["cluster-b"]
    assert "Traceback" not in b and b.count("hetauto-torchrun: error:") == 1, b[-3000:]
    assert ("field 'NODE_RANK': this cluster's plan has 2 nodes; node(s) 1 never joined the torchrun rendezvous of "
            "cluster-b at 127.0.0.1:") in b, b[-3000:]
    assert f"give a larger HETAUTO_TIMEOUT_S (it gave {SHORT_TIMEOUT_S} s)" in b, b[-3000:]
    assert "never checked in: rank 1 (cluster cluster-b" in logs["cluster-a"], logs["cluster-a"][-3000:]


def test_a_node_whose_node_0_never_started_says_so_within_the_timeout(tmp_path):
    """Only node 1 of cluster-b's two started. Before: torch's client retried node 0's rendezvous for 600 s, logging
    each try with a page of C++ frames, then the agent's traceback. Now it waits quietly HETAUTO_TIMEOUT_S and says
    in one paragraph that node 0 of the cluster, which hosts the rendezvous, never answered (exit 2)."""
    codes, logs, took = launch_clusters(tmp_path, {"cluster-b": WIDER}, devices_per_node=1,
                                        timeout_s=SHORT_TIMEOUT_S, env_over={"NODE_RANK": "1"})
    text = logs["cluster-b"]
    assert codes == {"cluster-b": 2}, text[-3000:]
    assert took < ENDS_WITHIN_S, took
    assert "Traceback" not in text and "frame #" not in text and text.count("hetauto-torchrun: error:") == 1, text
    assert ("field 'CLUSTER_MASTER_ADDR': this cluster's plan has 2 nodes; this node (NODE_RANK=1) could not reach "
            "the torchrun rendezvous of cluster-b at 127.0.0.1:") in text, text
    assert "node 0 (NODE_RANK=0), which hosts it, did not start its launch" in text, text


@pytest.mark.parametrize("addr, words", [
    (" ", "CLUSTER_MASTER_ADDR=' ' is blank"),                          # torch's ValueError traceback, exit 1
    ("127.0.0.1:29500", "CLUSTER_MASTER_ADDR='127.0.0.1:29500' is not a host alone: it has a port"),   # (a hang)
    ("no.such.host.invalid", "CLUSTER_MASTER_ADDR='no.such.host.invalid' does not resolve"),   # (a hang; RFC 2606)
])
def test_a_cluster_address_that_is_no_host_is_one_paragraph(tmp_path, addr, words):
    """The launch script's check of CLUSTER_MASTER_ADDR was only that it is set: blank, torchrun stopped with a
    ValueError traceback; with a port or a name that does not resolve, it hung with c10d's "gai error" warnings
    until torch's rendezvous timeout. Now one paragraph naming the variable and the fix, exit 2 (a name that does
    not resolve after HETAUTO_TIMEOUT_S: it may appear once node 0 is up), with the checks HETAUTO_MASTER_ADDR gets."""
    codes, logs, took = launch_clusters(tmp_path, {"cluster-b": WIDER}, devices_per_node=1,
                                        timeout_s=SHORT_TIMEOUT_S, env_over={"CLUSTER_MASTER_ADDR": addr})
    text = logs["cluster-b"]
    assert codes == {"cluster-b": 2}, text[-3000:]
    assert took < ENDS_WITHIN_S, took
    assert "Traceback" not in text and "gai error" not in text, text[-3000:]
    assert f"hetauto-torchrun: error: field 'CLUSTER_MASTER_ADDR': {words}" in text, text[-3000:]
    assert "Fix: set CLUSTER_MASTER_ADDR to the address" in text, text[-3000:]
