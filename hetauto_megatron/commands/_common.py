"""Arguments and loading shared by the planner commands (plan, simulate)."""
from __future__ import annotations


def add_model_inventory_args(parser) -> None:
    parser.add_argument("--model", required=True, metavar="M",
                        help="a preset (llama2-7b, llama2-13b, llama2-70b, llama3-8b, llama3-70b, mistral-7b, "
                             "gpt3-175b, tiny), a model YAML (docs/inputs.md) or a Hugging Face config.json")
    parser.add_argument("--inventory", required=True, metavar="I", help="device inventory YAML (docs/inputs.md)")
    parser.add_argument("--seq-length", type=int, metavar="N", help="override the model's sequence length")
    parser.add_argument("--cost-model", metavar="DIR",
                        help="a learned cost model from 'hetauto fit' (default: the analytic model); device types "
                             "it has no data for fall back to the analytic model")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="what-if: override the inventory without editing it (repeatable): "
                             "link.A-B.bandwidth_gbps, link.A-B.latency_ms, cluster.NAME.nodes, "
                             "cluster.NAME.devices_per_node, cluster.NAME.memory_gib, cluster.NAME.peak_tflops, "
                             "cluster.NAME.inter_node.bandwidth_gbps, ... (docs/explain.md); e.g. "
                             "--set link.h800-ascend.bandwidth_gbps=100 --set cluster.ascend.nodes=8")
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")


def load_inputs(args):
    from ..cost.learned import load_cost_model
    from ..errors import InputError
    from ..spec.inventory import load_inventory
    from ..spec.model import load_model
    from ..spec.whatif import apply_overrides
    if args.seq_length is not None and args.seq_length < 1:
        raise InputError(f"must be at least 1, got {args.seq_length}", field="--seq-length")
    model = load_model(args.model, seq_length=args.seq_length)
    inventory = apply_overrides(load_inventory(args.inventory), getattr(args, "set", None))
    return model, inventory, load_cost_model(args.cost_model)
