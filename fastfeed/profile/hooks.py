"""The hooks `fastfeed profile` installs in the profiled process (probe.py's `install`), each reporting to the
process's `Probe`. Inside a step, on the training thread:
- data: time in the data iterator's `next` (torch's DataLoader iterators and fastfeed's Loader, patched at the
  class), and host-to-device copies (`Tensor.to`/`.cuda` from a CPU tensor: bytes, pinned or pageable, time); each
  batch is noted with whether autograd was on when it was taken (probe.py: evaluation batches);
- backward: `Tensor.backward` / `torch.autograd.backward`; optimizer: the optimizer's `step`, less what the other
  parts time inside it (a closure's forward and backward: Lightning, LBFGS); the optimizer's post-step hook ends the
  step;
- collectives: `torch.distributed` calls from Python, and DDP's gradient all-reduce, which runs inside backward,
  overlapping it: DDP gets a communication hook (the default all-reduce, or the user's hook) that times each
  bucket from its launch to its completion. The part of backward spent waiting for the last buckets after the
  gradients were all computed (the exposed communication) moves from backward to "comm"; the rest overlapped
  compute (`ddp_comm_s`: the buckets' busy time). A C++ builtin hook (`register_builtin_comm_hook`) is left
  untimed: its time stays in backward.
Framework facts are noted as they are constructed or entered: `DataParallel`, `DistributedDataParallel(
find_unused_parameters=...)`, each DataLoader's workers, `pin_memory` and sampler, autocast regions, `torch.compile`.
"""
from __future__ import annotations

import time
import weakref

__all__ = ["patch_torch"]


def patch_torch(probe) -> None:
    """Every hook below, installed in this process for `probe` (probe.py's Probe, which every hook reports to)."""
    import torch
    import torch.utils.data.dataloader as dl
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    t_opt = {}

    def timed_parts() -> float:
        c = probe._cur
        return c["data_s"] + c["h2d_s"] + c["backward_s"] + c["comm_s"]

    def pre(optimizer, args, kwargs):
        probe.by_optimizer = True
        t_opt["t"] = time.perf_counter()
        # A closure (Lightning's automatic optimization, LBFGS) runs forward and backward inside the step: what the
        # other parts time in there is theirs, not the optimizer's.
        t_opt["parts"] = timed_parts()
        lr = optimizer.param_groups[0].get("lr") if optimizer.param_groups else None
        if isinstance(lr, (int, float)) or torch.is_tensor(lr):  # the peak: a warm-up's first steps are smaller
            probe.facts["lr"] = max(float(lr), probe.facts.get("lr", 0.0))
        if "param_dtype" not in probe.facts:
            params = [p for g in optimizer.param_groups for p in g["params"]]
            if params:
                probe.facts["param_dtype"] = str(params[0].dtype).replace("torch.", "")

    def post(optimizer, args, kwargs):
        if "t" in t_opt:
            inside = timed_parts() - t_opt.pop("parts")
            probe._cur["optimizer_s"] += max(0.0, time.perf_counter() - t_opt.pop("t") - inside)
        probe.end_step()

    register_optimizer_step_pre_hook(pre)
    register_optimizer_step_post_hook(post)

    base_next = dl._BaseDataLoaderIter.__next__

    def next_(self):
        _before_batch(probe)
        batch = probe.timed("data", base_next, self)
        probe.note_batch(batch, torch.is_grad_enabled())
        return batch

    dl._BaseDataLoaderIter.__next__ = next_

    base_dl_init = dl.DataLoader.__init__

    def dl_init(self, *args, **kwargs):
        base_dl_init(self, *args, **kwargs)
        sampler = type(getattr(self, "sampler", None)).__name__
        if len(probe.facts["dataloaders"]) < 8:
            probe.facts["dataloaders"].append({
                "num_workers": self.num_workers, "pin_memory": bool(self.pin_memory),
                "batch_size": self.batch_size, "sampler": sampler, "dataset": type(self.dataset).__name__,
                "dataset_len": _safe_len(self.dataset), "persistent_workers": bool(self.persistent_workers)})

    dl.DataLoader.__init__ = dl_init

    base_backward = torch.Tensor.backward

    def backward(self, *args, **kwargs):
        return probe.backward(base_backward, self, *args, **kwargs)

    torch.Tensor.backward = backward

    def copy_to_gpu(base, tensor, *args, **kwargs):
        """A host-to-device copy: counted (bytes, pageable or pinned) and timed as the step's "h2d"."""
        probe.use_gpu(torch.cuda)
        nbytes = tensor.element_size() * tensor.nelement()
        probe._cur["h2d_bytes"] += nbytes
        if not tensor.is_pinned():
            probe._cur["h2d_pageable_bytes"] += nbytes
        return probe.timed("h2d", base, tensor, *args, **kwargs)

    base_to, base_cuda = torch.Tensor.to, torch.Tensor.cuda

    def to(self, *args, **kwargs):
        if self.device.type == "cpu" and _to_cuda(args, kwargs):
            return copy_to_gpu(base_to, self, *args, **kwargs)
        return base_to(self, *args, **kwargs)

    def cuda(self, *args, **kwargs):
        if self.device.type == "cpu":
            return copy_to_gpu(base_cuda, self, *args, **kwargs)
        return base_cuda(self, *args, **kwargs)

    torch.Tensor.to = to
    torch.Tensor.cuda = cuda

    base_compile = torch.compile

    def compile_(*args, **kwargs):  # so that the verdict does not advise compiling a compiled model
        probe.facts["compiled"] = True
        return base_compile(*args, **kwargs)

    torch.compile = compile_
    base_module_compile = getattr(torch.nn.Module, "compile", None)
    if base_module_compile is not None:
        def module_compile(self, *args, **kwargs):
            probe.facts["compiled"] = True
            return base_module_compile(self, *args, **kwargs)

        torch.nn.Module.compile = module_compile

    autocast = torch.amp.autocast_mode.autocast
    base_enter = autocast.__enter__

    def enter(self):
        if self._enabled and probe.measuring:  # a region of reduced precision inside the window
            probe.facts["autocast"] = str(self.fast_dtype).replace("torch.", "")
        return base_enter(self)

    autocast.__enter__ = enter

    base_dp_init = torch.nn.DataParallel.__init__

    def dp_init(self, *args, **kwargs):
        probe.facts["data_parallel"] = True
        base_dp_init(self, *args, **kwargs)

    torch.nn.DataParallel.__init__ = dp_init

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    base_ddp_init = DDP.__init__

    def ddp_init(self, module, *args, **kwargs):
        base_ddp_init(self, module, *args, **kwargs)
        probe.facts["ddp"].append({"find_unused_parameters": bool(self.find_unused_parameters),
                                   "bucket_cap_mb": kwargs.get("bucket_cap_mb")})
        probe.ddp_modules.append(weakref.ref(self))
        if dist.is_initialized():
            probe.facts["world_size"], probe.facts["rank"] = dist.get_world_size(), dist.get_rank()

    DDP.__init__ = ddp_init
    _patch_ddp_comm(probe, DDP)
    for name in ("all_reduce", "broadcast", "all_gather", "reduce_scatter", "barrier", "all_gather_into_tensor",
                 "reduce_scatter_tensor"):
        fn = getattr(dist, name, None)
        if fn is not None:
            setattr(dist, name, _timed_fn(probe, "comm", fn))
    _patch_fastfeed_loader(probe)


def _patch_ddp_comm(probe, DDP) -> None:
    """DDP's gradient buckets timed through a communication hook: the user's own (wrapped as they register it), or
    the default all-reduce, registered at the first forward when they registered none (DDP takes one hook, once)."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    base_register, base_builtin, base_forward = DDP.register_comm_hook, DDP._register_builtin_comm_hook, DDP.forward

    def register_comm_hook(self, state, hook):
        self._fastfeed_hooked = True
        return base_register(self, state, _timed_hook(probe, hook))

    def register_builtin_comm_hook(self, comm_hook_type):
        self._fastfeed_hooked = True  # C++: nothing to wrap; its time stays in backward
        return base_builtin(self, comm_hook_type)

    def forward(self, *args, **kwargs):
        if not getattr(self, "_fastfeed_hooked", False):
            self._fastfeed_hooked = True
            try:
                base_register(self, self.process_group, _timed_hook(probe, allreduce_hook))
            except Exception:  # noqa: BLE001 - a DDP configuration that takes no Python hook: left untimed
                pass
        return base_forward(self, *args, **kwargs)

    DDP.register_comm_hook = register_comm_hook
    DDP._register_builtin_comm_hook = register_builtin_comm_hook
    DDP.forward = forward


def _timed_hook(probe, hook):
    """`hook` (state, bucket) -> Future, with each bucket's launch and completion noted in probe.comm_spans."""
    def timed(state, bucket):
        launched = time.perf_counter()

        def done(fut):
            probe.comm_spans.append((launched, time.perf_counter()))
            return fut.value()

        return hook(state, bucket).then(done)

    timed.__wrapped__ = hook
    return timed


def _timed_fn(probe, kind: str, fn):
    def wrapper(*args, **kwargs):
        return probe.timed(kind, fn, *args, **kwargs)
    wrapper.__wrapped__ = fn
    wrapper.__name__ = getattr(fn, "__name__", kind)
    return wrapper


def _patch_fastfeed_loader(probe) -> None:
    """fastfeed.Loader's iteration, timed like a DataLoader's (its module is imported only if the script uses it)."""
    import torch

    from fastfeed.loader.loader import Loader

    base_iter = Loader.__iter__

    def iter_(self):
        it = base_iter(self)

        def gen():
            while True:
                _before_batch(probe)
                try:
                    batch = probe.timed("data", next, it)
                except StopIteration:
                    return
                probe.note_batch(batch, torch.is_grad_enabled())
                yield batch
        return gen()

    Loader.__iter__ = iter_


def _before_batch(probe) -> None:
    """In a loop without an optimizer (none seen yet), asking for the next batch ends the step before it."""
    if not probe.by_optimizer and probe._cur["batches"] >= 1:
        probe.end_step()


def _safe_len(x) -> int | None:
    try:
        return len(x)
    except TypeError:
        return None


def _to_cuda(args, kwargs) -> bool:
    dev = kwargs.get("device", args[0] if args else None)
    if dev is None:
        return False
    return "cuda" in str(dev)
