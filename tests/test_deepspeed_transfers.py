"""What DeepSpeed's pipeline engine puts between two stages of TP 2, measured, against what
`simulate(engine="deepspeed")` prices (plan/deepspeed_schedule.py, docs/deepspeed.md "What DeepSpeed's engine sends
between stages").

DeepSpeed's own PipelineEngine runs 4 gloo processes on a pipe x model topology (2 stages, TP 2, DP 1; the model
axis is what makes it partition, as Megatron-DeepSpeed's topology does) with plain torch layers over activations of
the tiny preset's shape, in fp32 (the `cpu` device's element). Every point-to-point send and every all-gather of the
run is recorded with the pipeline instruction running it; the pricing functions are asked on links of 1 byte/s, so
their seconds are bytes.
"""
import pytest
from helpers import record_calls, record_instructions

from hetauto_megatron.spec.model import PRESETS

pytestmark = pytest.mark.ranks     # starts several rank processes: one such module at a time (conftest)

MODEL, MICRO, MICRO_BATCHES, TP = PRESETS["tiny"], 2, 4, 2


def _rank(rank, world_size):
    import torch
    import torch.distributed as dist

    from hetauto_megatron.runtime import deepspeed_pipeline as dsp

    deepspeed = dsp.import_deepspeed()
    where, log = ["init"], []
    first = {"send": "tensor", "all_gather_into_tensor": "output_tensor", "all_gather": "tensor_list"}

    def entry(name, args, kwargs):
        t = kwargs[first[name]] if first[name] in kwargs else args[0]        # what is sent / the gathered whole
        ts = t if isinstance(t, (list, tuple)) else [t]
        log.append((where[0], "send" if name == "send" else "gather", sum(x.numel() * x.element_size() for x in ts)))

    record_calls(dist, first, entry)      # (before DeepSpeed's backend binds them)
    deepspeed.init_distributed(dist_backend="gloo")
    from deepspeed.pipe import PipelineModule
    from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology

    h = MODEL.hidden_size
    torch.manual_seed(0)
    layers = [torch.nn.Linear(h, h) for _ in range(4)]
    topo = PipeModelDataParallelTopology(num_pp=2, num_mp=TP, num_dp=1)
    module = PipelineModule(layers=layers, topology=topo, loss_fn=lambda out, y: ((out - y) ** 2).mean())
    cfg = {"train_batch_size": MICRO * MICRO_BATCHES, "train_micro_batch_size_per_gpu": MICRO,
           "gradient_accumulation_steps": MICRO_BATCHES, "steps_per_print": 10 ** 6}
    engine, *_ = deepspeed.initialize(model=module, config=cfg,
                                      optimizer=torch.optim.SGD(module.parameters(), lr=1e-3))
    record_instructions(engine, where)
    gen = torch.Generator().manual_seed(1)
    data = iter([(torch.randn(MICRO, MODEL.seq_length, h, generator=gen),
                  torch.randn(MICRO, MODEL.seq_length, h, generator=gen)) for _ in range(2 * MICRO_BATCHES)])
    for _ in range(2):                                  # the second step: no first-send buffer description
        start = len(log)
        engine.train_batch(data_iter=data)
    out = {"stage": engine.stage_id, "partitioned": [engine.is_pipe_partitioned, engine.is_grad_partitioned],
           "log": log[start:]}
    dist.barrier()
    dist.destroy_process_group()
    return out


@pytest.fixture(scope="module")
def run():
    from hetauto_megatron.runtime.deepspeed_pipeline import import_deepspeed
    from hetauto_megatron.runtime.launcher import free_port, launch

    import_deepspeed()
    return launch(_rank, 2 * TP, timeout_s=300, env={"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())})


def _priced():
    """(bytes per SendActivation / SendGrad, bytes of one all-gather's whole tensor) as the pricing says them."""
    from hetauto_megatron.cost.analytic import AnalyticCostModel
    from hetauto_megatron.plan import costing
    from hetauto_megatron.plan.deepspeed_schedule import deepspeed_transfer_time, partition_gather_time
    from hetauto_megatron.plan.engines import as_run_by
    from hetauto_megatron.plan.settings import default_settings
    from hetauto_megatron.spec.inventory import inventory_from_dict

    byte_per_s = {"bandwidth_gbps": 8e-9, "latency_us": 0}
    inv = inventory_from_dict({"clusters": [{"name": "c", "device": "cpu", "nodes": 1, "devices_per_node": 4,
                                             "intra_node": byte_per_s, "inter_node": byte_per_s}]})
    cl = inv.clusters[0]
    prof = costing.stage_profile(MODEL, cl, TP, 1, MICRO, "none", AnalyticCostModel(),
                                 as_run_by(default_settings(TP), "deepspeed"))
    send = deepspeed_transfer_time(MODEL, prof, prof, cl.intra_node, True, MICRO)
    return send, partition_gather_time(MODEL, prof) * TP / (TP - 1)     # the ring moves (TP - 1) / TP of it


def test_deepspeed_partitions_sends_and_gathers_as_priced(run):
    send, whole = _priced()
    whole_activation = 4 * MICRO * MODEL.seq_length * MODEL.hidden_size
    assert whole == pytest.approx(whole_activation)
    for r in run:
        assert r["partitioned"] == [True, True]
        per = {}
        for instr, op, nbytes in r["log"]:
            per.setdefault((instr, op), []).append(nbytes)
        sends = per.get(("SendActivation" if r["stage"] == 0 else "SendGrad", "send"), [])
        # each send instruction: the partition meta, then the 1/TP slice; their bytes together are the priced send
        assert len(sends) == 2 * MICRO_BATCHES
        assert sum(sends) / MICRO_BATCHES == pytest.approx(send, rel=1e-12)
        assert max(sends) == whole_activation / TP
        gathers = per.get(("ForwardPass" if r["stage"] == 1 else "BackwardPass", "gather"), [])
        # the receiving stage: one all-gather of the whole activation per forward, two per backward
        assert gathers == [whole_activation] * (MICRO_BATCHES * (1 if r["stage"] == 1 else 2))
        assert not per.get(("ForwardPass" if r["stage"] == 0 else "BackwardPass", "gather"))
