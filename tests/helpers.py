"""Helpers shared by the tests: run the real `hetauto` process, and build small plan dictionaries."""
from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The two CPU clusters the tiny example plan (examples/llama/plans/tiny-2clusters-cpu.yaml) is written for.
CPU_INVENTORY = """\
clusters:
  - {name: cluster-a, device: cpu, nodes: 1, devices_per_node: 4}
  - {name: cluster-b, device: cpu, nodes: 1, devices_per_node: 2}
links:
  - {between: [cluster-a, cluster-b], bandwidth_gbps: 10, latency_ms: 0.1}
"""


def run_hetauto(*argv: str, cwd: str = ROOT, timeout: float = 300) -> subprocess.CompletedProcess:
    """`hetauto ARGV...` as a user starts it (a fresh interpreter), from the repository root by default."""
    return subprocess.run([sys.executable, "-m", "hetauto_megatron.cli", *argv], capture_output=True, text=True,
                          cwd=cwd, timeout=timeout)


def mesh(cluster, tp, dp, mbs, layers, recompute="none", device="cpu") -> dict:
    """One mesh of a plan file."""
    return {"cluster": cluster, "device_type": device, "tp": tp, "dp": dp, "micro_batch_size": mbs,
            "recompute": recompute, "stage_layers": layers}
