"""Running a heterogeneous plan on Megatron-Core (docs/runtime.md).

device (device type -> torch device and backend; CPU redirections), launcher (fork-after-import local
launcher), ranks (pure rank coordinates and launch checks), rendezvous (joining the world), groups (process
groups, RankContext), transfers (pure activation re-slicing at mesh boundaries), boundary (which blocks a rank
sends and receives at one), communicator (P2PCommunicator for heterogeneous pipelines), gradients (DP rescale,
tied embeddings, global grad norm), model (GPTModel per rank), train / dryrun (the dry-run loop and report),
deepspeed_pipeline (an emitted DeepSpeed config run by DeepSpeed's pipeline engine, docs/deepspeed.md).
Modules import torch and Megatron lazily or at their own import; this package import stays light.
"""
from . import lazy_compile as _lazy_compile

# before any Megatron import this package's modules make: torch.compile deferred to the first call where no
# accelerator is (Megatron-Core's import then skips TorchDynamo and Inductor)
_lazy_compile.install()
