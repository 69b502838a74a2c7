"""The megatron-core versions the --hetauto hook was written for, and the training loop's signature it relies on:
checked before anything else, so that another version fails with one paragraph, not deep in Megatron."""
from __future__ import annotations

import inspect

from ..errors import InputError

# megatron-core releases whose training loop has the seams the hook uses (pretrain's p2p_communicator,
# pg_collection, skip_model_parallel_init; the parallel_state globals the hook fills).
SUPPORTED_MEGATRON_CORE = ((0, 19),)
SUPPORTED_TEXT = "0.19.x"
_PRETRAIN_PARAMS = ("p2p_communicator", "pg_collection", "skip_model_parallel_init")


def megatron_core_version() -> str:
    try:
        from megatron.core.package_info import __version__
    except ImportError:
        raise InputError("megatron-core is not installed", field="--hetauto",
                         fix="pip install 'megatron-core~=0.19.0'") from None
    return str(__version__)


def check_megatron_version(version: str | None = None) -> str:
    """Fail clearly on a megatron-core this hook was not written for. Returns the version."""
    version = version or megatron_core_version()
    try:
        major_minor = tuple(int(x) for x in version.split(".")[:2])
    except ValueError:
        major_minor = None
    if major_minor not in SUPPORTED_MEGATRON_CORE:
        raise InputError(f"megatron-core {version} is not supported by hetauto's Megatron integration "
                         f"(supported: {SUPPORTED_TEXT})", field="--hetauto",
                         fix=f"install megatron-core {SUPPORTED_TEXT} (pip install 'megatron-core~=0.19.0') and a "
                             "Megatron-LM checkout of the matching branch core_r0.19.0")
    return version


def _check_pretrain_signature() -> None:
    from megatron.training import pretrain
    params = inspect.signature(pretrain).parameters
    missing = [p for p in _PRETRAIN_PARAMS if p not in params]
    if missing:
        raise InputError(f"this megatron.training.pretrain lacks the parameters {', '.join(missing)} that --hetauto "
                         "hands it", field="--hetauto",
                         fix=f"install megatron-core {SUPPORTED_TEXT}, whose training loop accepts them")
