"""Plan the pipeline run (action plugin of eagle3.pipeline.eagle3_plan; the logic is plugin_utils/plan.py)."""

from __future__ import annotations

import json
from typing import Any

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible_collections.eagle3.pipeline.plugins.plugin_utils import plan

SPEC = {
    "step": {"type": "str", "required": True, "choices": ["inputs", "check", "stages", "settle"]},
    "inputs_var": {"type": "str", "default": "eagle3__inputs"},
    "plan_var": {"type": "str", "default": "eagle3_plan"},
    "jobs_wheel": {"type": "dict", "default": {}},
}


class ActionModule(ActionBase):
    TRANSFERS_FILES = False

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        _, args = self.validate_argument_spec(argument_spec=SPEC)
        host = task_vars["inventory_hostname"]
        groups = task_vars.get("groups", {})
        self._generators = list(groups.get("generators", []))
        self._trainers = list(groups.get("trainers", []))
        try:
            if args["step"] == "inputs":
                result["host"] = self._inputs(host, task_vars)
            elif args["step"] == "check":
                self._run_plan(args, task_vars)
            elif args["step"] == "stages":
                result["plan"] = self._stages(host, args, task_vars)
            else:
                plans = {h: task_vars["hostvars"][h][args["plan_var"]] for h in self._pipeline_hosts(task_vars)}
                result["plan"] = plan.settle(plans, host)
                result["msg"] = plan.report(host, result["plan"], bool(task_vars.get("ansible_check_mode")))
        except plan.PlanError as err:
            raise AnsibleActionFail(str(err)) from err
        result["changed"] = False
        return result

    def _pipeline_hosts(self, task_vars: dict[str, Any]) -> list[str]:
        return list(task_vars.get("ansible_play_hosts_all", []))

    def _module(self, name: str, args: dict[str, Any], task_vars: dict[str, Any]) -> dict[str, Any]:
        answer = self._execute_module(module_name=name, module_args=args, task_vars=task_vars)
        if answer.get("failed") and name != "ansible.builtin.command":
            raise AnsibleActionFail(f"{name} failed: {answer.get('msg', answer)}")
        return answer

    def _settings(self, task_vars: dict[str, Any]) -> dict[str, Any]:
        """The settings the plan reads, as this host sees them (inventory, -e, the role's defaults)."""
        return {name: self._templar.template(task_vars[name]) for name in plan.READ if name in task_vars}

    def _stat(self, path: str, task_vars: dict[str, Any]) -> dict[str, Any]:
        args = {"path": path, "checksum_algorithm": "sha256", "get_mime": False, "get_attributes": False}
        return self._module("ansible.builtin.stat", args, task_vars)["stat"]

    def _inputs(self, host: str, task_vars: dict[str, Any]) -> dict[str, Any]:
        settings = self._settings(task_vars)
        files, missing = {}, []
        for key, (path, why) in plan.input_files(host, settings, self._generators, self._trainers).items():
            st = self._stat(path, task_vars)
            if not st["exists"]:
                missing.append(f"{path} {why}")
            # A directory (datasets format) is identified by its path and mtime; a file by its content.
            files[key] = st.get("checksum") or str(st.get("mtime", ""))
        if missing:
            raise AnsibleActionFail(f"{host}: {'; '.join(missing)}")
        return {"settings": settings, "files": files}

    def _run_plan(self, args: dict[str, Any], task_vars: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """The whole run's plan from every host's inputs step, and those inputs; every problem named."""
        hostvars = task_vars["hostvars"]
        inputs = {}
        for h in self._pipeline_hosts(task_vars):
            answer = hostvars[h].get(args["inputs_var"]) or {}
            if "host" in answer:
                inputs[h] = answer["host"]
        try:
            run_plan = plan.stage_plan(inputs, self._generators, self._trainers)
        except plan.PlanError as err:
            raise AnsibleActionFail(f"Cannot run the pipeline: {err}") from err
        if run_plan["problems"]:
            raise AnsibleActionFail(f"Cannot run the pipeline: {'; '.join(run_plan['problems'])}")
        return run_plan, inputs

    def _stages(self, host: str, args: dict[str, Any], task_vars: dict[str, Any]) -> dict[str, Any]:
        run_plan, inputs = self._run_plan(args, task_vars)
        settings = inputs[host]["settings"]
        stages = run_plan["hosts"][host]["stages"]
        answer = self._ask_states(settings, stages, task_vars)
        unit = plan.server_unit(settings.get("eagle3_server_name", ""))
        active = self._module(
            "ansible.builtin.command",
            {"argv": ["systemctl", "show", "--property=ActiveState", "--value", unit]},
            task_vars,
        )
        marker = self._stat(plan.server_marker(settings.get("eagle3_run_dir", ""), host), task_vars)
        return plan.host_plan(
            run_plan,
            host,
            settings,
            plan.stage_states(stages, answer),
            jobs_installed=answer is not None,
            jobs_wheel=args["jobs_wheel"],
            server_active=active.get("rc") == 0 and active.get("stdout", "").strip() == "active",
            server_started_by_pipeline=bool(marker["exists"]),
        )

    def _ask_states(
        self, settings: dict[str, Any], stages: dict[str, Any], task_vars: dict[str, Any]
    ) -> list[dict[str, Any]] | None:
        """``jobs.stage statuses`` in the jobs' Python, one command for all the host's stages; None
        where that Python or the jobs are not there yet (every stage is then to do)."""
        python = settings.get("eagle3_python", "")
        if not self._stat(python, task_vars)["exists"]:
            return None
        argv = [python, "-m", "jobs.stage", "statuses", "--dir", settings.get("eagle3_run_dir", "")]
        for name, stage in stages.items():
            argv += ["--stage", f"{name}={stage['hash']}"]
        answer = self._module("ansible.builtin.command", {"argv": argv}, task_vars)
        if answer.get("rc") != 0:
            stderr = answer.get("stderr", "")
            # No jobs there yet, or jobs older than this plan (a check run does not upgrade them).
            if "No module named jobs" in stderr or "invalid choice: 'statuses'" in stderr:
                return None
            raise AnsibleActionFail(
                f"{python} -m jobs.stage statuses failed (exit {answer.get('rc')}): "
                f"{(answer.get('stderr') or answer.get('msg') or '').strip()[-2000:]}"
            )
        try:
            return json.loads(answer["stdout"])
        except ValueError as err:
            raise AnsibleActionFail(f"jobs.stage statuses answered {answer['stdout']!r}: {err}") from err
