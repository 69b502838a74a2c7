"""Predicted peak memory per GPU against Sailor's measured GH200 runs (data/sailor/validation-runs.json).

Sailor trains with its Megatron-DeepSpeed fork as plan/memory_fit.py `sailor_deepspeed_job` describes it (the one
definition, also what `hetauto plan --memory-job sailor-deepspeed` checks): fp32 (its launch scripts pass neither
--fp16 nor --bf16, and its DeepSpeed config has no fp16 section), Adam state on every rank (ZeRO stage 0), no
sequence parallelism, Megatron's unfused attention keeping the s x s softmax output and no dropout on it (the
fork's OPT and GPT-Neo attention feeds the softmax output straight to the context GEMM), and 8 bytes per parameter
for DeepSpeed's extra model copy and gradient communication buffer. The models as the fork builds them
(cost/learned/sailor.py SAILOR_MODELS): OPT-350's output layer is a layer of its own, not tied to the embedding
(opt_model.py, OPTLMHeadPipe), and GPT-Neo has none (gpt_neo_model.py: its last stage ends at the final norm and
the loss reads the norm's outputs, so no vocabulary-wide weights, logits or pipe-buffer logits).
Nothing is fitted to the runs. Printed four ways:
  plan defaults   what `hetauto plan` assumes for a bf16 Megatron-Core job (distributed optimizer,
                  Transformer Engine layers): the figure the issue reported (about a third of the measurement)
  Sailor's job    sailor_deepspeed_job, with our nvidia runtime overheads (context, NCCL, workspace)
  + fork context  the same, with the fixed bytes Sailor's simulator documents for its fork instead of ours
                  (sailor/Planner/simulations/runtime_simulator.py: 4.76e9 + 300e6 bytes of kernel loading and context)
  16-bit, attn dropout  the same fork constants, 16-bit activations with dropout on the attention probabilities:
                  not what the fork runs, shown because it fits the activations about as well (5 bytes per score
                  element kept, against the fp32 softmax output's 4), which an earlier version took for the job
What Sailor measured (ae_scripts/clariden_scripts/process_results.py, its deepspeed/pipe_engine.py): the largest,
over the job's ranks, of the GPU's total used memory (NVML: context, NCCL buffers and PyTorch's reserved pool)
logged after the last pipeline instruction of the run; the reserved pool keeps the step's peak. Stage memory here
is the max over the pipeline's stages (in flight: min(p - i, micro-batches)); the embedding and head entries
Sailor counts as layers are the first and last stage's embedding and head. A record whose layout does not hold its
model's layers is left out, as in benchmarks/sailor_iterations.py (GPT-Neo N4 D4 records OPT-350's 26 entries).

    python benchmarks/memory_sailor.py
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from hetauto_megatron.cost.learned.sailor import SAILOR_MODELS  # noqa: E402
from hetauto_megatron.cost.activations import TRANSFORMER_ENGINE, LayerImpl  # noqa: E402
from hetauto_megatron.cost.memory import GIB, JobMemory, job_stage_memory_bytes, stage_memory_bytes  # noqa: E402
from hetauto_megatron.plan.memory_fit import sailor_deepspeed_job  # noqa: E402
from hetauto_megatron.plan.settings import default_settings  # noqa: E402
from hetauto_megatron.plan.vocab_padding import padded_vocab_size  # noqa: E402

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "hetauto_megatron", "data",
                    "sailor", "validation-runs.json")
FORK_FIXED_BYTES = 4.76e9 + 300e6      # Sailor's documented kernel loading and context for its fork
SAILOR_JOB = sailor_deepspeed_job()
SIXTEEN_BIT_WITH_ATTENTION_DROPOUT = JobMemory("16-bit, attention dropout",
                                               dataclasses.replace(SAILOR_JOB.settings, attention_dropout=0.1),
                                               LayerImpl(flash_attention=False), 2, SAILOR_JOB.extra_bytes_per_param)


def predicted_peak(run: dict, *, job: JobMemory | None, fork_fixed: bool = False) -> float:
    """The largest stage's bytes: `job` None is what `hetauto plan` assumes by default (bf16 Megatron-Core)."""
    model = SAILOR_MODELS[run["model"]]
    model = model.replace(vocab_size=padded_vocab_size(model.vocab_size, run["tp"]))
    p = len(run["stage_layers"])
    micro = run["global_batch_size"] // (run["micro_batch_size"] * run["dp"][0])
    peaks = []
    for i, entries in enumerate(run["stage_layers"]):
        first, last = i == 0, i == p - 1
        kw = dict(layers=entries - first - last, tp=run["tp"][i], dp=run["dp"][i],
                  micro_batch_size=run["micro_batch_size"], recompute="none", in_flight=min(p - i, micro),
                  first=first, last=last, vendor="nvidia")
        if job is None:
            b = stage_memory_bytes(model, settings=default_settings(run["tp"][i]), dtype_bytes=2,
                                   impl=TRANSFORMER_ENGINE, **kw)
        else:
            b = job_stage_memory_bytes(job, model, **kw)
        peaks.append(b["total"] + (FORK_FIXED_BYTES - b["reserved"] if fork_fixed else 0.0))
    return max(peaks)


VARIANTS = {
    "plan defaults": dict(job=None),
    "Sailor's job": dict(job=SAILOR_JOB),
    "+ fork context": dict(job=SAILOR_JOB, fork_fixed=True),
    "16-bit+dropout": dict(job=SIXTEEN_BIT_WITH_ATTENTION_DROPOUT, fork_fixed=True),
}
JOB = "Sailor's job"        # the configuration that describes Sailor's job (the one `--memory-job sailor-deepspeed` checks)


def layout_holds_model(run: dict) -> bool:
    """Whether the recorded layer entries are the model's (its layers plus the embedding and the head)."""
    return sum(run["stage_layers"]) == SAILOR_MODELS[run["model"]].num_layers + 2


def ratios(runs: list[dict]) -> dict[str, list[tuple[dict, float]]]:
    """Per configuration: (run, predicted / measured peak) of every run whose layout holds its model."""
    return {k: [(r, predicted_peak(r, **kw) / r["measured_max_mem_bytes"]) for r in runs if layout_holds_model(r)]
            for k, kw in VARIANTS.items()}


def load_runs() -> list[dict]:
    with open(DATA) as f:
        return json.load(f)


def summary(rs: list[float]) -> str:
    return (f"median {statistics.median(rs):.2f}, range {min(rs):.2f}-{max(rs):.2f}, "
            f"MAPE {100 * statistics.mean(abs(x - 1) for x in rs):.1f} % over {len(rs)} runs")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.parse_args()
    runs = load_runs()
    print(f"{'run':<42} {'mbs':>3} {'measured':>9}  " + "  ".join(f"{k:>13}" for k in VARIANTS) + "   (GiB)")
    for r in runs:
        if not layout_holds_model(r):
            print(f"left out: {r['model']} {r['file']}: {sum(r['stage_layers'])} layer entries recorded, the model "
                  f"has {SAILOR_MODELS[r['model']].num_layers + 2}")
            continue
        pred = {k: predicted_peak(r, **kw) for k, kw in VARIANTS.items()}
        print(f"{r['model'] + ' ' + r['file'].split('/')[-1]:<42} {r['micro_batch_size']:>3} "
              f"{r['measured_max_mem_bytes'] / GIB:>9.1f}  " + "  ".join(f"{pred[k] / GIB:>13.1f}" for k in VARIANTS))
    print("predicted / measured peak per GPU:")
    for k, rows in ratios(runs).items():
        print(f"  {k:<14} {summary([x for _, x in rows])}")
        for name, sel in (("micro-batch 1-2", lambda r: r["micro_batch_size"] <= 2),
                          ("micro-batch 4-8", lambda r: r["micro_batch_size"] >= 4)):
            print(f"  {'':<14}   {name}: {summary([x for r, x in rows if sel(r)])}")
    print("target: Sailor's own simulator on these runs, 5.9 % (the issue's figure)")


if __name__ == "__main__":
    main()
