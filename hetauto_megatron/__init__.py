"""hetauto-megatron: plan and run one model's training across clusters of different accelerators."""


def tool_version() -> str:
    """The installed package's version (setup.py); 'unknown' when this code runs uninstalled."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("hetauto-megatron")
    except PackageNotFoundError:
        return "unknown"
