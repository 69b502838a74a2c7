"""Sailor's simulator terms as benchmarks/sailor_terms.py re-derives them, against Sailor's own simulator: the plans
Sailor's planner (and Metis's, as Sailor's artifact wraps it) chose for the peer scenarios, run from Sailor's
artifact, and the it/s its simulator gave each (benchmarks/peer_plans.json, docs/peers.md "The peers' own plans")."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))

import peer_scenarios as P  # noqa: E402


def test_every_scenario_has_sailors_own_plan():
    have = {(p["model"], p["network"]) for p in P.load_peer_plans() if p["peer"] == "Sailor"}
    assert have == {(m, n) for m in P.MODELS for n in P.NETWORKS}


def test_re_derived_terms_give_what_sailors_simulator_gave_each_plan():
    """Target: within 0.5 % of Sailor's simulator for every plan, and every plan fits (Sailor's memory check kept
    each)."""
    plans = P.load_peer_plans()
    assert len(plans) >= 4
    for p in plans:
        za, zv = P.NETWORKS[p["network"]]
        ips, fits, _ = P.sailor_score({"meshes": p["meshes"], "global_batch_size": P.peer_samples(p["meshes"])},
                                      p["model"], {"a100": za, "v100": zv})
        assert fits, p["sailor_plan"]
        assert abs(ips / p["sailor_simulator_it_s"] - 1) <= 0.005, (p["sailor_plan"], ips, p["sailor_simulator_it_s"])
