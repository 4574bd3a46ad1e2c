"""ringtrain env: print what a distributed-training bug report needs, as plain text.

Versions (ringtrain, Python, torch and the CUDA/cuDNN/NCCL it was built with), the
machine (OS, CPU cores usable by this process), the GPUs torch can see with their
memory, which torch.distributed backends this build has (gloo, nccl, mpi, ucc), which
launcher environment ringtrain detects for this process, and the launcher variables
that are set (RANK, WORLD_SIZE, MASTER_ADDR, SLURM_*, OMPI_*, PMI_*, HOROVOD_*, ...).

Paste the whole output into the issue. Run it the way the failing job runs (inside
``srun``, ``mpirun`` or the container) so it reports that environment.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys

from ..errors import RingtrainError
from ..parallel.environments import detect

EXACT_VARS = (
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK",
    "MASTER_ADDR", "MASTER_PORT", "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS",
    "TORCHELASTIC_RUN_ID", "NCCL_DEBUG", "NCCL_SOCKET_IFNAME", "NCCL_IB_DISABLE",
    "NCCL_P2P_DISABLE", "GLOO_SOCKET_IFNAME", "TORCH_DISTRIBUTED_DEBUG",
)
PREFIXES = ("SLURM_", "OMPI_", "PMI_", "PMIX_", "HOROVOD_", "MPI_LOCAL")


def _ringtrain_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("ringtrain")
    except PackageNotFoundError:
        return "unknown (not installed)"


def usable_cpus() -> int:
    """CPU cores this process may run on: what a cgroup cpuset or ``taskset`` leaves it (all elsewhere)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on macOS/Windows
        return os.cpu_count() or 1


def open_files_limit() -> int | None:
    """This process's soft limit on open file descriptors (``ulimit -n``); None where unknown or unlimited."""
    try:
        import resource
    except ImportError:  # Windows
        return None
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else soft


def cuda_gpus() -> int:
    """The CUDA GPUs torch sees in this process (0 without CUDA); imports torch."""
    import torch  # noqa: PLC0415 - only a command line that names GPUs asks

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _cpus() -> str:
    total = os.cpu_count()
    usable = usable_cpus()
    return f"{usable} usable of {total}" if usable != total else str(total)


def _torch_section() -> list[tuple[str, str]]:
    try:
        import torch
    except ImportError as e:
        return [("torch", f"NOT IMPORTABLE: {e}")]
    rows = [
        ("torch", f"{torch.__version__} ({os.path.dirname(torch.__file__)})"),
        ("torch built with CUDA", torch.version.cuda or "no (CPU-only or ROCm build)"),
    ]
    if getattr(torch.version, "hip", None):
        rows.append(("torch built with ROCm", str(torch.version.hip)))
    available = torch.cuda.is_available()
    rows.append(("CUDA available", str(available)))
    if available:
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            rows.append((f"  cuda:{i}", f"{props.name}, {props.total_memory / 2**30:.1f} GiB, "
                         f"compute capability {props.major}.{props.minor}"))
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    rows.append(("cuDNN", str(cudnn) if cudnn else "not available"))
    if available and hasattr(torch.cuda, "nccl"):
        try:
            rows.append(("NCCL", ".".join(map(str, torch.cuda.nccl.version()))))
        except Exception as e:  # a build without NCCL raises here
            rows.append(("NCCL", f"not available ({type(e).__name__})"))
    rows.append(("distributed backends", _backends(torch)))
    return rows


def _backends(torch) -> str:
    dist = torch.distributed
    if not dist.is_available():
        return "torch.distributed is NOT available in this build"
    checks = {"gloo": "is_gloo_available", "nccl": "is_nccl_available", "mpi": "is_mpi_available",
              "ucc": "is_ucc_available", "xccl": "is_xccl_available"}
    names = [name for name, fn in checks.items() if getattr(dist, fn, lambda: False)()]
    return ", ".join(names) or "none"


def _environment() -> str:
    try:
        return detect().describe()
    except RingtrainError as e:
        return f"INCONSISTENT: {e}"


def collect() -> list[tuple[str, str]]:
    """The report as (label, value) rows; a label with an empty value is a section title."""
    rows = [
        ("ringtrain", _ringtrain_version()),
        ("python", f"{platform.python_version()} ({sys.executable})"),
        ("OS", f"{platform.platform()}"),
        ("CPU cores", _cpus()),
        *_torch_section(),
        ("detected environment", _environment()),
        ("launcher variables", ""),
    ]
    names = sorted(k for k in os.environ if k in EXACT_VARS or k.startswith(PREFIXES))
    rows += [(f"  {k}", os.environ[k]) for k in names] or [("  (none set)", "")]
    return rows


def format_report(rows: list[tuple[str, str]]) -> str:
    width = max(len(label) for label, _ in rows)
    return "\n".join(f"{label.ljust(width)}  {value}".rstrip() if value else label for label, value in rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="ringtrain env",
        description=__doc__.partition("\n\n")[0].replace("ringtrain env: ", "", 1),
        epilog=__doc__.partition("\n\n")[2],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.parse_args(sys.argv[1:] if argv is None else argv)
    print(format_report(collect()))
    return 0
