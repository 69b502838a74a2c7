"""hetauto-megatron: plan and run one model's training across clusters of different accelerators."""
import functools


def tool_version() -> str:
    """The installed package's version (setup.py); 'unknown' when this code runs uninstalled."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("hetauto-megatron")
    except PackageNotFoundError:
        return "unknown"


@functools.lru_cache(maxsize=None)
def code_digest() -> str:
    """sha256 (hex) of this package's Python code: every .py file under it, by relative path and content. The
    version alone does not tell two installs apart (an edited checkout keeps it); every cluster of a job must run
    the same code (megatron/job_agreement.py), and `hetauto --version` prints the digest's first 12 digits."""
    import hashlib
    import os

    root = os.path.dirname(os.path.abspath(__file__))
    files = sorted(os.path.relpath(os.path.join(d, f), root).replace(os.sep, "/")
                   for d, dirs, names in os.walk(root) for f in names if f.endswith(".py"))
    digest = hashlib.sha256()
    for name in files:
        with open(os.path.join(root, name), "rb") as fh:
            content = fh.read()
        digest.update(f"{name}\0{len(content)}\0".encode())
        digest.update(content)
    return digest.hexdigest()
