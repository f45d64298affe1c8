"""Which GPU each rank gets, which process group fits, and TensorPipe's device maps.

Pure planning over plain data (the number of visible GPUs is an argument): nothing here calls
into ``torch.cuda``, so the warm template and the join agents, which must never initialise
CUDA, can use it. Rank ``r`` gets ``gpus[r % len(gpus)]`` (the ``LOCAL_RANK`` convention of
``DDP(device_ids=[rank])``): the notebook, rank 0, would take the first, and workers the next
ones, so NCCL, which refuses two ranks on one GPU, has a GPU per rank while there are enough.
Every error says what to do instead.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["GpuPlan", "Setup", "device_maps", "parse_gpus", "plan", "process_group", "setup"]

_FORMS = "--gpus takes auto, none, or a comma list of GPU indices such as 0,2,3"


def parse_gpus(text: str | None) -> tuple[int, ...] | str:
    """``"auto"`` (the default), ``"none"``, or the GPU indices a list names, in its order."""
    value = (text or "auto").strip().lower()
    if value in ("auto", "none"):
        return value
    parts = [p.strip() for p in value.split(",")]
    if not all(p.isdigit() for p in parts):
        raise ValueError(f"{_FORMS} (got {text!r})")
    indices = tuple(int(p) for p in parts)
    if len(set(indices)) != len(indices):
        raise ValueError(f"--gpus {text}: a GPU is named twice; name each once "
                         "(ranks share GPUs round robin by themselves)")
    return indices


@dataclass(frozen=True)
class GpuPlan:
    """The device of every rank (``None``: the CPU), rank 0 first."""

    devices: tuple[int | None, ...]
    hosts: tuple[str | None, ...] = ()  # each rank's host (None: this machine); () all here

    def of(self, rank: int) -> int | None:
        return self.devices[rank]

    @property
    def on_gpu(self) -> bool:
        return any(d is not None for d in self.devices)

    def gpu_per_rank(self) -> bool:
        """Whether every rank has a GPU, and no two share one (what NCCL needs)."""
        hosts = self.hosts or (None,) * len(self.devices)
        used = [(h, d) for h, d in zip(hosts, self.devices, strict=True) if d is not None]
        return len(used) == len(self.devices) and len(set(used)) == len(used)


def plan(gpus: tuple[int, ...] | str, world_size: int, visible: int) -> GpuPlan:
    """Devices for ranks 0..world_size-1 on a machine with ``visible`` GPUs."""
    if gpus == "none" or (gpus == "auto" and visible == 0):
        return GpuPlan((None,) * world_size)
    if gpus == "auto":
        pool: tuple[int, ...] = tuple(range(visible))
    else:
        pool = tuple(gpus)
        missing = [g for g in pool if g >= visible]
        if missing:
            have = f"GPUs 0-{visible - 1}" if visible else "no GPU"
            raise ValueError(f"--gpus {','.join(map(str, pool))}: GPU {missing[0]} does not "
                             f"exist; this process sees {have} (CUDA_VISIBLE_DEVICES decides "
                             "which); name visible ones, or use --gpus auto or --gpus none")
    return GpuPlan(tuple(pool[r % len(pool)] for r in range(world_size)))


def process_group(requested: str | None, gpu_plan: GpuPlan, cuda: bool) -> tuple[str | None,
                                                                                  str]:
    """The backend to start (``None``: no process group) and a note for the start line."""
    if requested in (None, "gloo"):
        return requested, ""
    if requested == "nccl":
        if not cuda:
            raise ValueError("--process-group nccl needs CUDA, and this torch sees none "
                             "(torch.cuda.is_available() is False); use --process-group gloo")
        if None in gpu_plan.devices and gpu_plan.on_gpu:
            raise ValueError("--process-group nccl needs a GPU per rank, and the ranks on "
                             "other hosts have none here (GPUs are planned for this machine's "
                             "ranks only); use --process-group gloo")
        if not gpu_plan.gpu_per_rank():
            n, k = len(gpu_plan.devices), len({d for d in gpu_plan.devices if d is not None})
            raise ValueError(f"--process-group nccl needs a GPU per rank: {n} ranks (the "
                             f"notebook and {n - 1} workers) would share {k} GPU(s), and NCCL "
                             f"refuses two ranks on one GPU; start at most {max(k - 1, 0)} "
                             "workers, or use --process-group gloo")
        return "nccl", ""
    if requested == "auto":
        if cuda and gpu_plan.gpu_per_rank():
            return "nccl", "process group: nccl (a GPU per rank)"
        why = ("no CUDA" if not cuda else "no GPUs" if not gpu_plan.on_gpu
               else "a rank without a GPU" if None in gpu_plan.devices else "ranks share GPUs")
        return "gloo", f"process group: gloo ({why})"
    raise ValueError(f"--process-group {requested!r} is not supported; use gloo, nccl or auto")


def device_maps(names: list[str], gpu_plan: GpuPlan, cuda: bool
                ) -> dict[str, dict[str, dict[str, str]]]:
    """``--device-maps auto``: for each rank, its GPU to each peer's GPU (what TensorPipe needs
    to send a CUDA tensor GPU to GPU), as ``{caller: {peer: {"cuda:i": "cuda:j"}}}``; ranks
    on the CPU neither send nor receive through a map."""
    if not cuda or not gpu_plan.on_gpu:
        raise ValueError("--device-maps auto maps each rank's GPU to its peers', and this world "
                         "has no GPU (no CUDA, or --gpus none); leave it out, and send "
                         "tensors with .cpu()")
    maps: dict[str, dict[str, dict[str, str]]] = {}
    for a, name_a in enumerate(names):
        dev_a = gpu_plan.of(a)
        if dev_a is None:
            continue
        maps[name_a] = {name_b: {f"cuda:{dev_a}": f"cuda:{gpu_plan.of(b)}"}
                        for b, name_b in enumerate(names)
                        if b != a and gpu_plan.of(b) is not None}
    return maps


@dataclass(frozen=True)
class Setup:
    """What a world start does with GPUs: each rank's device, the process group's backend
    (``None``: none), a note for the start line, and each rank's TensorPipe device maps."""

    plan: GpuPlan
    backend: str | None
    note: str
    maps: dict[str, dict[str, dict[str, str]]]

    def device(self, rank: int) -> str | None:
        """``"cuda:i"`` for a rank on a GPU, else ``None``."""
        d = self.plan.of(rank) if rank < len(self.plan.devices) else None
        return None if d is None else f"cuda:{d}"


def setup(gpus: str | None, requested_pg: str | None, maps_flag: str | None,
          names: list[str], local: int, visible: int, cuda: bool,
          remote: tuple[tuple[str, int | None], ...] = ()) -> Setup:
    """Resolve ``--gpus``, ``--process-group`` and ``--device-maps`` for a world whose first
    ``local`` ranks (the notebook and its workers) run on this machine. Ranks on other hosts
    stay on the CPU unless ``remote`` gives each one's ``(host, GPU index there)`` (a
    scheduler's allocation says which GPUs a node's ranks own). Raises ValueError with what
    to do, before anything starts."""
    local_plan = plan(parse_gpus(gpus), local, visible if cuda else 0)
    far = tuple(remote) + ((None, None),) * (len(names) - local - len(remote))
    if parse_gpus(gpus) == "none":
        far = tuple((h, None) for h, _ in far)
    full = GpuPlan(local_plan.devices + tuple(d for _, d in far),
                   (None,) * local + tuple(h for h, _ in far))
    backend, note = process_group(requested_pg, full, cuda)
    maps = device_maps(names, full, cuda) if maps_flag == "auto" else {}
    if full.on_gpu:
        shown = ", ".join(f"{r}->cuda:{d}" for r, d in enumerate(full.devices) if d is not None)
        note = "; ".join(filter(None, [f"GPUs: {shown}", note,
                                       "device maps: auto" if maps else ""]))
    return Setup(full, backend, note, maps)
