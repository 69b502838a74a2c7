"""The first and last stage's TP collectives outside the transformer layers (plan/costing.py edge_tp_collectives):
Megatron-Core's vocabulary-parallel embedding all-reduces its output over the TP group, the output layer gathers
(or all-reduces the gradient of) its input, and the vocabulary-parallel cross-entropy all-reduces three values
per token. Until they were priced, a first stage's embedding cost the same at every TP degree.

Checked against measurements: Sailor's per-layer profiles (data/sailor/profiles_tmp.json) time the embedding
(entry 0) of its Megatron-DeepSpeed jobs, which run the same vocabulary-parallel embedding (an all-reduce of the
output, no sequence parallelism), at TP 1, 2 and 4 on the A100-40 and the V100-16 for OPT-350M and GPT-Neo-2.7B.
What it costs more at TP t than at TP 1 (the gather itself shrinks with the shard, so the difference is the
collective and whatever goes with it) is measured in all 24 configurations: 0.36-3.95 ms. Ours must be more
than nothing and no more than that: the collective alone, at the peer inventory's intra-node link
(examples/peers/inventory-same-zone.yaml, from Sailor's own 4-GPU all-reduce curves)."""
import dataclasses
import json
import os

import pytest

from hetauto_megatron.cost.analytic import AnalyticCostModel
from hetauto_megatron.cost.learned import SAILOR_MODELS
from hetauto_megatron.plan import costing
from hetauto_megatron.plan.settings import default_settings
from hetauto_megatron.spec.inventory import load_inventory
from hetauto_megatron.spec.model import ModelSpec

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
with open(os.path.join(ROOT, "hetauto_megatron", "data", "sailor", "profiles_tmp.json")) as f:
    PROFILES = json.load(f)
INVENTORY = load_inventory(os.path.join(ROOT, "examples", "peers", "inventory-same-zone.yaml")).with_precision("fp32")
CLUSTER = {"A100-40": "a100", "V100-16": "v100"}

CASES = [(name, gpu, mbs, tp) for name in ("OPT-350", "GPT-Neo-2.7") for gpu in ("A100-40", "V100-16")
         for mbs in (1, 2, 4) for tp in (2, 4)]


def profile(spec, gpu, tp, mbs, sequence_parallel):
    settings = dataclasses.replace(default_settings(tp), sequence_parallel=sequence_parallel and tp > 1)
    return costing.stage_profile(spec, INVENTORY.cluster(CLUSTER[gpu]), tp, 1, mbs, "none", AnalyticCostModel(),
                                 settings)


@pytest.mark.parametrize("name,gpu,mbs,tp", CASES)
def test_embedding_collective_against_sailor_measurements(name, gpu, mbs, tp):
    measured = PROFILES[name][gpu][str(mbs)][str(tp)]["0"][0] - PROFILES[name][gpu][str(mbs)]["1"]["0"][0]
    spec = SAILOR_MODELS[name]
    ours = profile(spec, gpu, tp, mbs, False).emb_fwd - profile(spec, gpu, 1, mbs, False).emb_fwd
    assert measured > 0
    assert 0.1 * measured < ours <= measured, (name, gpu, mbs, tp, ours, measured)


def test_which_collectives():
    """Each pass's collectives as Megatron-Core 0.19 issues them (models/common/embeddings/
    language_model_embedding.py, tensor_parallel/layers.py, models/gpt/gpt_model.py, cross_entropy.py), counted
    here from first principles: a ring all-reduce moves 2 (t-1)/t of the tensor per rank with 2 (t-1) latencies,
    a reduce-scatter or all-gather half of that."""
    link = INVENTORY.cluster("a100").intra_node
    t, act, tokens = 4, 8e6, 1000
    bw, lat = link.bytes_per_s, link.latency_s
    ar = 2 * (t - 1) / t * act / bw + 2 * (t - 1) * lat
    half = (t - 1) / t * act / bw + (t - 1) * lat
    loss = 3 * (2 * (t - 1) / t * 4 * tokens / bw + 2 * (t - 1) * lat)
    rope = ModelSpec(name="m", num_layers=2, hidden_size=64, num_attention_heads=4, ffn_hidden_size=256,
                     vocab_size=1000, seq_length=tokens)
    learned = dataclasses.replace(rope, position_embedding="learned")
    no_head = dataclasses.replace(rope, output_layer=False)
    edge = costing.edge_tp_collectives
    # learned positions: the word embedding all-reduces, then sequence parallelism splits (backward: all-gather)
    assert edge(learned, True, t, act, link, 1) == pytest.approx((ar, half, half + loss, half))
    # no learned table and sequence parallelism: the embedding reduce-scatters (backward: all-gather)
    assert edge(rope, True, t, act, link, 1) == pytest.approx((half, half, half + loss, half))
    # without sequence parallelism: all-reduce forward in the embedding, backward in the output layer
    assert edge(rope, False, t, act, link, 1) == pytest.approx((ar, 0.0, loss, ar))
    # no output layer (Sailor's GPT-Neo build): nothing in the head
    assert edge(no_head, False, t, act, link, 1) == pytest.approx((ar, 0.0, 0.0, 0.0))
    assert edge(learned, True, 1, act, link, 1) == (0.0, 0.0, 0.0, 0.0)
