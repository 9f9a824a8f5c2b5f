"""What the pre-flight modules (gpu_preflight_gpus, gpu_preflight_host) report: one failed check."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass
class Problem:
    """A check that failed: on which GPU (None for the host or the whole node), the field read,
    the value found, the limit it broke, and why that matters."""

    gpu: int | None
    field: str
    value: str
    limit: str
    message: str

    def record(self) -> dict[str, Any]:
        """The problem as returned to Ansible, with the one-line form the role prints."""
        where = "" if self.gpu is None else f"GPU {self.gpu} "
        return {**asdict(self), "line": f"{where}{self.field} = {self.value} (limit: {self.limit}): {self.message}"}
