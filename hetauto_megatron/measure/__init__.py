"""Measuring tools that run torch on the machine at hand: operator and whole-layer timing (`hetauto profile`,
profile.py, layer_timing.py) and link bandwidth/latency (`hetauto probe-link`, probe_link.py). The models they
feed live in cost/; the planner never imports this package."""
