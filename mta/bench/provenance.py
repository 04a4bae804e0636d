"""Where and with what a benchmark ran, recorded next to its numbers. A probe whose tool is absent (no GPU, no
nvidia-smi, no git) gives None (or "cpu" for the GPU name), never an exception."""

from __future__ import annotations

import datetime
import hashlib
import importlib.metadata
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Optional

import torch

REPO_ROOT = Path(__file__).resolve().parents[2]


def _run(cmd: list[str], cwd: Optional[Path] = None) -> Optional[str]:
    """stdout of ``cmd`` stripped, or None if it is missing, fails or hangs."""
    try:
        done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def _package_version(name: str) -> Optional[str]:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:  # e.g. triton installed as pytorch-triton
        return None


def gpu_info() -> dict:
    """GPU name ("cpu" without CUDA), compute capability, CUDA, cuDNN and driver versions."""
    has_cuda = torch.cuda.is_available()
    driver = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]) if has_cuda else None
    return {
        "gpu": torch.cuda.get_device_name() if has_cuda else "cpu",
        "compute_capability": ".".join(map(str, torch.cuda.get_device_capability())) if has_cuda else None,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        # One line per GPU; they share a driver.
        "driver": driver.splitlines()[0].strip() if driver else None,
    }


def git_info(root: Path = REPO_ROOT) -> dict:
    """Commit of the checkout and whether ``mta/`` differs from it, None without git. ``MTA_GIT_COMMIT``, when set,
    names the commit instead (dirty unknown): a copy of the tree on a rented GPU machine may have a stale ``.git``."""
    if os.environ.get("MTA_GIT_COMMIT"):
        return {"git_commit": os.environ["MTA_GIT_COMMIT"], "git_dirty": None}
    commit = _run(["git", "rev-parse", "HEAD"], cwd=root)
    if commit is None:
        return {"git_commit": None, "git_dirty": None}
    status = _run(["git", "status", "--porcelain", "--", "mta"], cwd=root)
    return {"git_commit": commit, "git_dirty": None if status is None else bool(status)}


def source_hash(root: Path = REPO_ROOT) -> str:
    """sha256 over ``mta/**/*.py`` (paths and contents): identifies the code even without git."""
    digest = hashlib.sha256()
    for path in sorted((root / "mta").rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def provenance() -> dict:
    """Everything needed to tell which code on which machine produced a result."""
    return {
        **gpu_info(),
        "torch": torch.__version__,
        "triton": _package_version("triton"),
        "python": platform.python_version(),
        **git_info(),
        "mta_source_sha256": source_hash(),
        "utc_time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "argv": list(sys.argv),
    }
