"""Simulated training steps for `fastfeed bench --consumer`.

A consumer is a callable `step(images, labels) -> None` that does one step on `device` and returns only when the
device has finished it (`torch.cuda.synchronize`). Synchronising every step is what makes the benchmark's timing
honest with asynchronous CUDA outputs: the host time blocked in the loader's `next()` is then pure data wait, and
any device work the loader queued (H2D copies, GPU decode) lands in the step time of the step that consumes it.

- "none": no compute; only moves the batch to `device` and synchronises (pure loader throughput).
- "resnet18" / "resnet50": torchvision ResNet forward + cross-entropy + backward + SGD(momentum) step,
  channels_last, bf16 autocast on CUDA (autocast is skipped on CPU, where it would measure the emulation).
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from fastfeed.constants import BENCH_CONSUMERS as CONSUMERS

__all__ = ["CONSUMERS", "make_consumer", "synthetic_batch"]


Consumer = Callable[[torch.Tensor, torch.Tensor], None]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def make_consumer(name: str, device: str | torch.device, num_classes: int = 1000, lr: float = 0.01) -> Consumer:
    """Build the step function; the model (if any) is created once, here, not inside the timed loop."""
    if name not in CONSUMERS:
        raise ValueError(f"unknown consumer {name!r}; choose one of {', '.join(CONSUMERS)}")
    device = torch.device(device)
    if name == "none":
        def step_none(images: torch.Tensor, labels: torch.Tensor) -> None:
            images.to(device, non_blocking=True)
            _sync(device)

        return step_none

    import torchvision

    model = getattr(torchvision.models, name)(num_classes=max(int(num_classes), 1))
    model = model.to(device).to(memory_format=torch.channels_last).train()
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    use_autocast = device.type == "cuda"
    n_classes = max(int(num_classes), 1)

    def step_model(images: torch.Tensor, labels: torch.Tensor) -> None:
        x = images.to(device, non_blocking=True)
        if not x.is_floating_point() or (device.type == "cpu" and x.dtype != torch.float32):
            x = x.float()  # half-precision convolutions on CPU are either missing or emulated and slow
        x = x.contiguous(memory_format=torch.channels_last)
        y = labels.to(device, non_blocking=True).long() % n_classes
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=use_autocast):
            loss = loss_fn(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        _sync(device)

    return step_model


def synthetic_batch(batch_size: int, image_size: int, device: str | torch.device,
                    dtype: torch.dtype = torch.float16, num_classes: int = 1000) -> tuple[torch.Tensor, torch.Tensor]:
    """A device-resident batch for the compute-only ceiling (what the step costs with data already there)."""
    g = torch.Generator().manual_seed(0)
    images = torch.randn(batch_size, 3, image_size, image_size, generator=g).to(dtype).to(device)
    labels = torch.randint(0, max(num_classes, 1), (batch_size,), generator=g).to(device)
    return images, labels
