"""vLLM's hidden-states connector for CPU workers.

vLLM's ``ExampleHiddenStatesConnector`` (used with the ``extract_hidden_states``
speculative method) copies hidden states device-to-host on a CUDA stream into pinned
memory. A CPU worker has neither, so this subclass copies synchronously and keeps
everything else (file naming, locking, the writer thread pool) from vLLM's class.
Load it with::

    --kv-transfer-config '{"kv_connector": "CpuHiddenStatesConnector",
                           "kv_connector_module_path": "eagle3_cpu_hidden_states",
                           "kv_role": "kv_producer", ...}'

GPU hosts keep vLLM's own connector. ``CpuFP8HiddenStatesConnector`` writes what speculators'
``hs_connectors.fp8_hidden_states_connector.FP8HiddenStatesConnector`` writes on a GPU (FP8
states with a float32 scale per token, half the bytes), through that class's own writer.
"""

from __future__ import annotations

import fcntl
import os
from functools import partial

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
    ExampleHiddenStatesConnector,
    PendingSave,
    extract_from_kv_cache,
)


class _CopyDone:
    """Stands in for the CUDA event vLLM waits on: a synchronous copy is done at once."""

    def synchronize(self) -> None:
        return None

    def query(self) -> bool:
        return True


class CpuHiddenStatesConnector(ExampleHiddenStatesConnector):
    """``ExampleHiddenStatesConnector`` without CUDA streams or pinned memory."""

    def _submit_async_write(self, pending: PendingSave) -> None:
        if not self._is_tp_rank_zero:
            return
        assert self._kv_cache is not None
        block_ids = torch.tensor(pending.block_ids, dtype=torch.long)
        offsets = torch.arange(self._block_size, dtype=torch.long)
        slots = (offsets.reshape(1, -1) + block_ids.reshape(-1, 1) * self._block_size).flatten()
        hidden = extract_from_kv_cache(self._kv_cache, slots, pending.token_ids.shape[0]).clone()
        tensors = {"hidden_states": hidden, "token_ids": pending.token_ids.clone()}

        os.makedirs(os.path.dirname(pending.filename), exist_ok=True)
        lock_fd = self._lock_fds.pop(pending.req_id, None)
        if lock_fd is None and self.use_lock:
            lock_fd = os.open(pending.filename + ".lock", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
        done = _CopyDone()
        future = self._executor.submit(self._write_tensors, tensors, done, pending.filename, lock_fd)
        self._req_copy_events[pending.req_id] = done
        self._req_futures[pending.req_id] = future
        future.add_done_callback(partial(self._on_write_done, pending.req_id))


class CpuFP8HiddenStatesConnector(CpuHiddenStatesConnector):
    """``CpuHiddenStatesConnector`` writing speculators' FP8 format (``hs_connectors``, installed
    with speculators): ``hidden_states`` as float8_e4m3fn, ``hidden_states_scales`` per token."""

    @staticmethod
    def _write_tensors(tensors: dict[str, torch.Tensor], event: _CopyDone, filename: str, lock_fd: int | None) -> None:
        from hs_connectors.fp8_hidden_states_connector import FP8HiddenStatesConnector

        FP8HiddenStatesConnector._write_tensors(tensors, event, filename, lock_fd)
