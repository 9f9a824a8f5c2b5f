#!/usr/bin/python
"""Wait for a vLLM server unit to answer, failing at once if the unit dies while loading."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_server_wait
short_description: Wait until a vLLM systemd unit serves its model, or fail fast with its journal
description:
  - Polls C(/health), then C(/v1/models) until the served model name is listed.
  - On every poll it also reads the unit's state from systemd. If the unit stopped, failed,
    or restarted since the wait began, the model load died; the module fails at once with the
    last journal lines instead of waiting out the timeout.
  - When the load failed (the unit died, or the timeout passed) it stops the unit, so that
    C(Restart=on-failure) does not retry the same bad load for ever; O(stop_on_failure) turns that off.
  - Otherwise it only reads; supports check mode (where it does not wait).
options:
  unit:
    description: The systemd unit, e.g. C(vllm-gen.service).
    type: str
    required: true
  url:
    description: Base URL of the server, e.g. C(http://127.0.0.1:8000).
    type: str
    required: true
  served_model_name:
    description: The name C(/v1/models) must list.
    type: str
    required: true
  timeout:
    description: Seconds to wait for the model to load.
    type: int
    default: 2400
  interval:
    description: Seconds between polls.
    type: float
    default: 5
  journal_lines:
    description: Journal lines to return when the unit died or the wait timed out.
    type: int
    default: 60
  stop_on_failure:
    description: Stop the unit when the load failed, so that systemd does not restart it.
    type: bool
    default: true
author: eagle3-pipeline
"""

EXAMPLES = r"""
- name: Wait for the generation server
  vllm_server_wait:
    unit: vllm-gen.service
    url: http://127.0.0.1:8000
    served_model_name: kimi-k2.5
    timeout: 2400
"""

RETURN = r"""
main_pid:
  description: PID of the server process once it answered.
  type: int
  returned: success
  sample: 4182
waited_s:
  description: Seconds spent waiting.
  type: float
  returned: always
  sample: 41.5
models:
  description: Model ids C(/v1/models) listed.
  type: list
  returned: success
  sample: [kimi-k2.5]
journal:
  description: Last journal lines of the unit (on failure).
  type: list
  returned: failure
  sample: ["RuntimeError: Engine core initialization failed. See root cause above."]
errors:
  description: Distinct error lines from the unit's last start, first first (when it died); warnings are left out.
  type: list
  returned: failure
  sample: ["huggingface_hub.errors.HFValidationError: Repo id must be in the form 'repo_name' or 'namespace/repo_name': '/srv/models/absent'."]
stopped:
  description: Whether the module stopped the unit after the failed load (see O(stop_on_failure)).
  type: bool
  returned: failure
  sample: true
"""

import json
import re
import time
from typing import Any
from urllib.error import HTTPError

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.urls import open_url

DEAD_STATES = {"failed", "inactive", "deactivating"}


def unit_state(module: AnsibleModule, unit: str) -> dict[str, str]:
    _, out, _ = module.run_command(
        ["systemctl", "show", unit, "--property=ActiveState,SubState,Result,NRestarts,MainPID,InvocationID"]
    )
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def journal(module: AnsibleModule, unit: str, lines: int) -> list[str]:
    _, out, _ = module.run_command(["journalctl", "--no-pager", "-o", "cat", "-n", str(lines), "-u", unit])
    return out.splitlines()


ERROR_LINE = re.compile(r"\b\w*(Error|Exception)\b:|\bERROR\b")
# vLLM's logger prefix: "(APIServer pid=1) WARNING 12-02 15:14:53 [file.py:12] " (the process tag
# is absent in a single-process server).
LOG_PREFIX = re.compile(r"^(\(\w+ pid=\d+\) )?(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL) \S+ \S+ \[[^]]+\] ")


def error_lines(lines: list[str], limit: int = 12) -> list[str]:
    """The distinct error lines of a journal, first first: the root cause of a failed load is
    usually far above the tail, under the API server's own traceback. A logged warning or info
    line is not one, even when it names an exception (vLLM's ulimit warning quotes "OSError:")."""
    found: list[str] = []
    for n, line in enumerate(lines):
        prefix = LOG_PREFIX.match(line)
        if prefix and prefix.group("level") in ("DEBUG", "INFO", "WARNING"):
            continue
        text = line[prefix.end() :].strip() if prefix else line.strip()
        if not ERROR_LINE.search(line) or text.startswith(("Traceback", "File ")):
            continue
        # A message that goes on in indented lines (pydantic's "1 validation error for
        # ModelConfig" has its reason below it) keeps its first continuation line.
        after = lines[n + 1] if n + 1 < len(lines) else ""
        if after[:1].isspace() and after.strip() and not after.strip().startswith(("File ", "^", "~")):
            text = f"{text}: {after.strip()}"[:400]
        if text not in found:
            found.append(text)
    return found[:limit]


def stop(module: AnsibleModule, unit: str, timeout: float = 60.0, poll: float = 0.5) -> str:
    """Stop the unit after a failed load and see it stay down; '' when it did, else why not.

    A stop sent while systemd is still tearing the dead server down (``deactivating``) can merge
    with that teardown, after which ``Restart=on-failure`` may still schedule a restart; so the
    unit is stopped again until two reads in a row find it inactive (or failed), not waiting to
    restart."""
    deadline, calm = time.monotonic() + timeout, 0
    while time.monotonic() < deadline:
        now = unit_state(module, unit)
        if now.get("ActiveState") in ("inactive", "failed") and now.get("SubState") != "auto-restart":
            calm += 1
            if calm >= 2:
                return ""
        else:
            calm = 0
            if now.get("ActiveState") != "deactivating":
                rc, _, err = module.run_command(["systemctl", "stop", unit])
                if rc != 0:
                    return err.strip() or f"systemctl stop exited {rc}"
        time.sleep(poll)
    return f"it did not stay stopped within {timeout:.0f} s ({now.get('ActiveState')}, {now.get('SubState')})"


def invocation_journal(module: AnsibleModule, unit: str, invocation: str) -> list[str]:
    """Everything the unit's last start logged (the whole of it, not just the tail)."""
    match = f"_SYSTEMD_INVOCATION_ID={invocation}" if invocation else f"--unit={unit}"
    _, out, _ = module.run_command(["journalctl", "--no-pager", "-o", "cat", "-n", "5000", match])
    return out.splitlines()


def get_json(url: str) -> tuple[int, Any]:
    """The status and JSON body of a GET; status 0 when nothing answered (the server is loading)."""
    try:
        with open_url(url, timeout=10, use_proxy=False) as response:
            body = response.read()
            return response.status, json.loads(body) if body else None
    except HTTPError as err:
        return err.code, None
    except (OSError, ValueError):  # URLError is an OSError; a connection refused while loading
        return 0, None


def died(start: dict[str, str], now: dict[str, str]) -> str | None:
    """Why the unit is no longer the process that was loading, or None while it still is."""
    if now.get("ActiveState") in DEAD_STATES:
        return f"unit is {now.get('ActiveState')} ({now.get('SubState')}, result {now.get('Result')})"
    if now.get("SubState") == "auto-restart":
        return f"unit exited and is waiting to restart (result {now.get('Result')})"
    if now.get("NRestarts", "0") != start.get("NRestarts", "0"):
        return f"unit restarted {now.get('NRestarts')} times (result {now.get('Result')})"
    if start.get("MainPID") not in (None, "0") and now.get("MainPID") != start.get("MainPID"):
        return f"server process changed from pid {start.get('MainPID')} to {now.get('MainPID')}"
    return None


def wait(module: AnsibleModule) -> dict[str, Any]:
    params = module.params
    unit, base = params["unit"], params["url"].rstrip("/")
    began = time.monotonic()
    start = unit_state(module, unit)
    result: dict[str, Any] = {"unit": unit, "url": base}
    while True:
        now = unit_state(module, unit)
        reason = died(start, now)
        if reason:
            errors = error_lines(invocation_journal(module, unit, now.get("InvocationID", "")))
            cause = f" First error: {errors[0]}" if errors else ""
            result.update(
                failed=True,
                msg=f"{unit} died while loading the model: {reason}.{cause} Error lines and journal tail follow.",
                errors=errors,
                journal=journal(module, unit, params["journal_lines"]),
            )
            break
        status, _ = get_json(f"{base}/health")
        if status == 200:
            status, body = get_json(f"{base}/v1/models")
            models = [m.get("id") for m in (body or {}).get("data", [])]
            if status == 200 and params["served_model_name"] in models:
                result.update(main_pid=int(now.get("MainPID", "0")), models=models)
                break
        if time.monotonic() - began > params["timeout"]:
            result.update(
                failed=True,
                msg=(
                    f"{unit} is still running but did not serve {params['served_model_name']!r} at {base} "
                    f"within {params['timeout']} s (raise vllm_server_health_timeout for slower loads)."
                ),
                journal=journal(module, unit, params["journal_lines"]),
            )
            break
        time.sleep(params["interval"])
    result["waited_s"] = round(time.monotonic() - began, 1)
    if result.get("failed") and params["stop_on_failure"]:
        trouble = stop(module, unit)
        result["stopped"] = not trouble
        result["msg"] += (
            f" Stopped {unit} so that systemd does not retry the failed load; fix the cause and run again."
            if not trouble
            else f" Could not stop {unit}: {trouble}"
        )
    return result


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "unit": {"type": "str", "required": True},
            "url": {"type": "str", "required": True},
            "served_model_name": {"type": "str", "required": True},
            "timeout": {"type": "int", "default": 2400},
            "interval": {"type": "float", "default": 5},
            "journal_lines": {"type": "int", "default": 60},
            "stop_on_failure": {"type": "bool", "default": True},
        },
        supports_check_mode=True,
    )
    if module.check_mode:
        module.exit_json(changed=False, skipped=True, msg="check mode: not waiting for the server")
    result = wait(module)
    if result.get("failed"):
        result.pop("failed")
        module.fail_json(changed=bool(result.get("stopped")), **result)
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
