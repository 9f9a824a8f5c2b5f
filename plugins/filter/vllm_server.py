"""Filters that turn the role's structured variables into vLLM's command line and systemd syntax."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

SAFE = re.compile(r"^[A-Za-z0-9_@%+=:,./-]+$")


def vllm_server_argv(server: Mapping[str, Any]) -> list[str]:
    """vLLM's OpenAI server command line (after the interpreter) from the role's variables.

    ``server`` holds the role's variables without the ``vllm_server_`` prefix.
    Options left at their "unset" value (0, "", {}, false) are not passed, so vLLM's own
    defaults apply.
    """
    argv = ["-m", "vllm.entrypoints.openai.api_server", "--model", str(server["model"])]
    argv += ["--served-model-name", str(server["served_model_name"])]
    argv += ["--host", str(server["host"]), "--port", str(server["port"])]
    if int(server.get("tensor_parallel_size") or 1) != 1:
        argv += ["--tensor-parallel-size", str(server["tensor_parallel_size"])]
    if int(server.get("data_parallel_size") or 1) != 1:
        argv += ["--data-parallel-size", str(server["data_parallel_size"])]
    if server.get("max_model_len"):
        argv += ["--max-model-len", str(server["max_model_len"])]
    if server.get("gpu_memory_utilization"):
        argv += ["--gpu-memory-utilization", str(server["gpu_memory_utilization"])]
    if server.get("trust_remote_code"):
        argv.append("--trust-remote-code")
    if server.get("reasoning_parser"):
        argv += ["--reasoning-parser", str(server["reasoning_parser"])]
    if server.get("tool_call_parser"):
        argv += ["--enable-auto-tool-choice", "--tool-call-parser", str(server["tool_call_parser"])]
    if server.get("speculative_config"):
        argv += ["--speculative-config", json.dumps(dict(server["speculative_config"]), separators=(",", ":"))]
    if server.get("kv_transfer_config"):
        argv += ["--kv-transfer-config", json.dumps(dict(server["kv_transfer_config"]), separators=(",", ":"))]
    argv += [str(arg) for arg in server.get("extra_args") or []]
    return argv


def systemd_quote(arg: Any) -> str:
    """One argument quoted for a systemd ``ExecStart=`` line (specifiers and variables escaped)."""
    text = str(arg).replace("%", "%%").replace("$", "$$")
    if text and SAFE.match(text):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def systemd_command(argv: Sequence[Any]) -> str:
    return " ".join(systemd_quote(arg) for arg in argv)


def systemd_env_value(value: Any) -> str:
    """A value for a systemd ``EnvironmentFile=`` line, double-quoted."""
    text = str(value).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{text}"'


def vllm_server_unsatisfied(
    requirements: Sequence[str], packages: Mapping[str, Sequence[Mapping[str, Any]]]
) -> list[str]:
    """The requirements that the installed packages do not satisfy.

    ``packages`` is what ``community.general.pip_package_info`` returns for one pip client: each
    package's name mapped to a list of ``{"name", "version", "source"}``. ``torch==2.13.0`` is
    satisfied by ``torch==2.13.0+cpu`` (PEP 440 local versions), so a CPU build installed from
    another index does not count as a changed pin.
    """
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
    from packaging.version import InvalidVersion, Version

    def satisfies(requirement: Requirement, version: str) -> bool:
        try:
            return requirement.specifier.contains(Version(version), prereleases=True)
        except InvalidVersion:
            return False

    installed = {canonicalize_name(name): [str(p["version"]) for p in found] for name, found in packages.items()}
    missing = []
    for text in requirements:
        requirement = Requirement(text)
        if not any(satisfies(requirement, v) for v in installed.get(canonicalize_name(requirement.name), [])):
            missing.append(text)
    return missing


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "vllm_server_argv": vllm_server_argv,
            "systemd_command": systemd_command,
            "systemd_env_value": systemd_env_value,
            "vllm_server_unsatisfied": vllm_server_unsatisfied,
        }
