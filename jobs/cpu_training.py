"""Let speculators' trainer run on CPU (CI and the tiny target), in one place.

speculators 0.9.0 assumes an accelerator: ``Trainer`` moves the model and each batch with
``.to(local_rank)`` (an int, i.e. ``cuda:<n>``), autocasts on ``"cuda"`` when
``torch.accelerator`` reports none, its step timer calls ``torch.accelerator.synchronize()``,
and ``maybe_setup_distributed`` picks the process-group backend from the accelerator. On a
machine without one, :func:`cpu_accelerator` makes the CPU stand in for it while training runs:

* ``torch.accelerator.current_accelerator()`` answers ``cpu`` (so autocast and the torchrun
  backend are CPU's: ``gloo``); ``synchronize``/``set_device_index`` have nothing to do;
* the trainer's device index becomes ``torch.device("cpu")`` so its ``.to()`` calls stay on CPU,
  and the checkpointer loads a checkpoint onto ``cpu`` when resuming.

Nothing of speculators is copied; on a GPU machine none of this is applied.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from unittest import mock

import torch


def needs_cpu_shim() -> bool:
    return torch.accelerator.current_accelerator() is None


@contextlib.contextmanager
def cpu_accelerator() -> Iterator[None]:
    import speculators.train.checkpointer as checkpointer_module
    import speculators.train.trainer as trainer_module
    import torch.distributed as dist

    cpu = torch.device("cpu")
    real_init = dist.init_process_group

    def current_accelerator(check_available: bool = False) -> torch.device | None:
        # Callers that ask for an *available* accelerator want a device module with caches
        # to empty; the CPU has none.
        return None if check_available else cpu

    def init_process_group(*args: object, **kwargs: object) -> None:
        kwargs.pop("device_id", None)  # gloo binds no device
        real_init(*args, **kwargs)  # type: ignore[arg-type]

    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.object(torch.accelerator, "current_accelerator", current_accelerator))
        # Without this, is_available() would follow the patched current_accelerator() and the
        # DataLoader would try to pin memory for a device that does not exist.
        stack.enter_context(mock.patch.object(torch.accelerator, "is_available", lambda: False))
        stack.enter_context(mock.patch.object(torch.accelerator, "synchronize", lambda *a, **k: None))
        stack.enter_context(mock.patch.object(torch.accelerator, "set_device_index", lambda *a, **k: None))
        # Resuming loads a checkpoint onto get_current_device() ("<accelerator>:<index>").
        stack.enter_context(mock.patch.object(checkpointer_module, "get_current_device", lambda: "cpu"))
        stack.enter_context(mock.patch.object(dist, "init_process_group", init_process_group))
        stack.enter_context(mock.patch.object(trainer_module, "get_local_rank", lambda: cpu))
        yield
