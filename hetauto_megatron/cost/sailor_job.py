"""How the jobs behind Sailor's packaged measurements (data/sailor) ran: the one statement of their precision, read
by the learned model's fit on those measurements (cost/learned/sailor.py: the element size of every known term it
sets apart and of the features), by the memory job that prices a plan as that framework holds it
(plan/memory_fit.py `sailor_deepspeed_job`) and by the whole-iteration benchmark (benchmarks/sailor_iterations.py).

Evidence, github.com/eth-easl/sailor at the packaged commit cf2c8e3 (read, not copied):
- the layer profiles: `third_party/Megatron-DeepSpeed/profile.sh` runs `profile_all.py`, whose `deepspeed
  pretrain_gpt.py ...` command line has neither `--fp16` nor `--bf16`, and whose `ds_config.json` has no `fp16` or
  `bf16` section; so `megatron/arguments.py` keeps `args.params_dtype = torch.float` and DeepSpeed runs no
  mixed precision (`--loss-scale 12` on that line is read only by fp16 training). Nothing in the profiled path
  autocasts (no `torch.autocast` in `megatron/training.py`, `pretrain_gpt.py` or the models).
- the measured iterations (Clariden, `ae_scripts/clariden_scripts/run_opt.slurm`, and `run.sh`): the same flags
  and DeepSpeed config, fp32.
- the image: `Dockerfile` builds on `nvcr.io/nvidia/pytorch:24.10-py3` (Clariden: `create_image_alps.md`), whose
  PyTorch sets TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1: fp32 GEMMs run on the TF32 tensor cores where the GPU has them.
  That is why the GH200 and A100 layers beat the FP32 CUDA-core peak (docs/cost-model-learned.md, "The arithmetic
  each run used"); runs that never beat it (the V100, which has no TF32, and the A100's OPT-30 and LLAMA-3-8)
  ran on the CUDA cores. Either way the tensors are fp32.
So every activation, TP all-reduce, softmax pass, pipeline send and parameter of those runs is 4 bytes wide, and
Adam keeps no separate master copy.
"""
from __future__ import annotations

from ..spec.devices import PRECISION_BYTES

SAILOR_JOB_PRECISION = "fp32"
SAILOR_ELEMENT_BYTES = PRECISION_BYTES[SAILOR_JOB_PRECISION]     # 4
