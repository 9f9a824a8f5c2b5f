"""The pipeline's plan, computed in one place: stage names, inputs, the hash chain, and each host's part.

The action ``eagle3.pipeline.eagle3_plan`` (plugins/action/eagle3_plan.py) runs it in four steps
on every host (roles/eagle3/tasks/plan.yml): ``inputs`` reads the host's settings (its ``eagle3_*``
variables) and the checksums of the files it reads; ``check`` gives every host's inputs to
``stage_plan`` and stops the run on any problem, before anything is built or installed; ``stages``
plans again and asks the host which of its stages are complete (``host_plan``); ``settle``
decides what depends on other hosts' answers (``settle``). The result is ``eagle3_plan``: the stage
files, ``train.yml``, the records and ``jobs.driver`` (through the records) read it, and nothing
rebuilds a stage name or a hash in YAML.

The chain: ``generate-<rank>`` (one per generator) → ``gather`` (only when other generators'
rows must be copied to the trainer) → ``prepare`` → ``extract`` → ``train`` (node 0;
``train-node-<r>`` on the other trainers) → ``validate``. Each stage's inputs include the hash of
the stage before it, so a change to any input reruns its stage and everything after it, and
nothing before. ``INPUTS`` says which setting feeds which stage; a value is normalised to its
type first (``-e eagle3_generate_temperature=0.6`` is the string "0.6": the same input as the
float 0.6 of group_vars, and ``-e eagle3_shared_storage=false`` is false).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

STAGES = ("generate", "gather", "prepare", "extract", "train", "validate")

# setting -> (the first stage whose outputs depend on it, its type)
INPUTS: dict[str, tuple[str, str]] = {
    "eagle3_dataset": ("generate", "str"),
    "eagle3_served_model_name": ("generate", "str"),
    "eagle3_generate_max_tokens": ("generate", "int"),
    "eagle3_generate_temperature": ("generate", "float"),
    "eagle3_generate_top_p": ("generate", "float"),
    "eagle3_hidden_states": ("generate", "str"),
    "eagle3_shared_storage": ("gather", "bool"),
    "eagle3_seq_length": ("prepare", "int"),
    "eagle3_draft_vocab_size": ("train", "int"),
    "eagle3_speculators": ("train", "dict"),
    "eagle3_train_nproc_per_node": ("train", "int"),
    "eagle3_validate_num_speculative_tokens": ("validate", "int"),
    "eagle3_validate_max_tokens": ("validate", "int"),
    "eagle3_validate_server_args": ("validate", "list"),
}
# Settings the plan needs that are not inputs of their own (aux layers feed extract, train and,
# with fused capture, generation: see captured_layers).
OTHER = {
    "eagle3_run_dir": "str",
    "eagle3_num_layers": "int",
    "eagle3_aux_layer_ids": "list",
    "eagle3_target_model": "str",
    "eagle3_heldout": "str",
    # The hidden-state files' format: with fused capture the generators' servers write it (an
    # input of generation), and extraction checks it (an input of extract either way).
    "eagle3_hidden_states_dtype": "str",
}
# The checksums plan.yml reads on each host: which stage each feeds.
FILES = {"dataset_sha256": "generate", "model_config_sha256": "generate", "heldout_sha256": "validate"}
TRUE = {"true", "yes", "on", "1", "y", "t"}
FALSE = {"false", "no", "off", "0", "n", "f", ""}


class PlanError(ValueError):
    pass


def coerce(name: str, value: Any, kind: str) -> Any:
    """A setting as its type, whichever way it came (group_vars, -e key=value, -e JSON)."""
    try:
        if kind == "bool":
            if isinstance(value, bool):
                return value
            text = str(value).strip().lower()
            if text in TRUE | FALSE:
                return text in TRUE
            raise ValueError(value)
        if kind == "int":
            if isinstance(value, bool) or float(value) != int(float(value)):
                raise ValueError(value)
            return int(float(value))
        if kind == "float":
            return float(value)
        if kind == "str":
            return "" if value is None else str(value)
        if kind == "list":
            if isinstance(value, str):
                value = json.loads(value)
            if not isinstance(value, list):
                raise ValueError(value)
            return [str(v) if name == "eagle3_validate_server_args" else int(v) for v in value]
        if kind == "dict":
            if isinstance(value, str):
                value = json.loads(value) if value.strip() else {}
            if not isinstance(value, dict):
                raise ValueError(value)
            return value
    except (TypeError, ValueError) as err:
        raise PlanError(f"{name}={value!r} is not a valid {kind}") from err
    raise AssertionError(kind)


def settings_of(raw: dict[str, Any]) -> dict[str, Any]:
    """Every setting the plan reads (``READ``), each as its type."""
    known = INPUTS | {k: ("", v) for k, v in (OTHER | HOST).items()}
    return {name: coerce(name, raw[name], kind) for name, (_, kind) in known.items() if name in raw}


def digest(inputs: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(inputs, sort_keys=True, default=str).encode()).hexdigest()


def feeding(stage: str, s: dict[str, Any]) -> dict[str, Any]:
    """The settings that feed ``stage`` directly, by their short names."""
    return {name.removeprefix("eagle3_"): s.get(name) for name, (first, _) in INPUTS.items() if first == stage}


def captured_layers(s: dict[str, Any]) -> list[int]:
    """vLLM's extract_hidden_states numbering: the aux layers' inputs, then the last layer's output."""
    return [*s.get("eagle3_aux_layer_ids", []), s.get("eagle3_num_layers", 0)]


def hidden_states_dtype(s: dict[str, Any]) -> str:
    return s.get("eagle3_hidden_states_dtype") or "bf16"


def problems(s: dict[str, Any], generators: list[str], trainers: list[str]) -> list[str]:
    out = []
    if not generators:
        out.append('inventory group "generators" is missing or empty (the hosts that serve the target and generate)')
    if not trainers:
        out.append('inventory group "trainers" is missing or empty (the hosts that train; the first also validates)')
    for name, what in (
        ("eagle3_target_model", "the model directory on the hosts"),
        ("eagle3_served_model_name", "the name the servers serve it under"),
        ("eagle3_dataset", "the questions file on the generators"),
        ("eagle3_heldout", "held-out prompts on the trainer"),
    ):
        if not s.get(name):
            out.append(f"{name} is not set ({what})")
    layers = s.get("eagle3_num_layers", 0)
    if layers < 1:
        out.append("eagle3_num_layers must be the target's layer count")
    aux = s.get("eagle3_aux_layer_ids", [])
    if not aux or max(aux) >= layers or min(aux) < 0 or len(set(aux)) != len(aux):
        out.append(f"eagle3_aux_layer_ids must list distinct layers below eagle3_num_layers ({layers}), not {aux}")
    if s.get("eagle3_hidden_states") not in ("fused", "separate"):
        out.append(f"eagle3_hidden_states must be fused or separate, not {s.get('eagle3_hidden_states')!r}")
    if hidden_states_dtype(s) not in ("bf16", "fp8"):
        out.append(f"eagle3_hidden_states_dtype must be bf16 or fp8, not {s.get('eagle3_hidden_states_dtype')!r}")
    if len(trainers) > 1 and not s.get("eagle3_shared_storage"):
        out.append(
            f"training on {len(trainers)} trainers hosts needs eagle3_shared_storage: true with eagle3_run_dir on "
            "storage they all mount (every node reads the data and resumes from the same checkpoints); or list "
            "one host under trainers"
        )
    return out


def stage_plan(hosts: dict[str, dict[str, Any]], generators: list[str], trainers: list[str]) -> dict[str, Any]:
    """``hosts``: every pipeline host's ``{"settings": {eagle3_*: value}, "files": {checksums}}``.

    Returns ``{"problems": [...]}`` when the settings cannot make a run, else the plan:
    ``trainer``, ``remote_generators`` (rows to copy to the trainer), ``rows_files`` (where the
    trainer reads every generator's rows; ``gathered_rows_files`` those copied from other hosts)
    and ``hosts``: per host its ``rank`` (-1: not a generator), ``node_rank`` (-1: not a
    trainer), ``generate_stage`` and ``train_stage`` ("" where it runs none) and ``stages``, an ordered
    mapping of stage name to ``{"kind", "inputs", "hash", "after"}`` (``after``: the stages it
    reads whose markers it can see, name -> hash; jobs.stage refuses to start it before them).
    """
    generators, trainers = list(generators), list(trainers)
    trainer = trainers[0] if trainers else None
    settings = {h: settings_of(v.get("settings", {})) for h, v in hosts.items()}
    files = {h: v.get("files", {}) for h, v in hosts.items()}
    base = settings.get(trainer) or (settings[generators[0]] if generators and generators[0] in settings else {})
    found = problems(base, generators, trainers)
    for host in generators + trainers:
        if host not in hosts:
            found.append(f"{host} has no settings (it was not reached by the plan)")
    if found:
        return {"problems": found}

    plan_hosts: dict[str, dict[str, Any]] = {
        h: {"rank": -1, "node_rank": -1, "generate_stage": "", "train_stage": "", "stages": {}}
        for h in dict.fromkeys(generators + trainers)
    }
    shared = base["eagle3_shared_storage"]
    remote = [] if shared else [g for g in generators if g != trainer]

    def add(
        host: str, name: str, kind: str, inputs: dict[str, Any], after: list[tuple[str, str]] = ()
    ) -> dict[str, Any]:
        # after: the (host, stage) pairs whose outputs this stage reads. Those whose markers it can
        # see (its own host's, or any host's on shared storage) jobs.stage checks before starting.
        stage = {
            "kind": kind,
            "inputs": inputs,
            "hash": digest(inputs),
            "after": {n: plan_hosts[h]["stages"][n]["hash"] for h, n in after if shared or h == host},
        }
        plan_hosts[host]["stages"][name] = stage
        return stage

    generated = []
    for rank, host in enumerate(generators):
        s = settings[host]
        plan_hosts[host] |= {"rank": rank, "generate_stage": f"generate-{rank}"}
        inputs = {
            **feeding("generate", s),
            "dataset_sha256": files[host].get("dataset_sha256"),
            "model_config_sha256": files[host].get("model_config_sha256"),
            "rank": rank,
            "world_size": len(generators),
        }
        if s["eagle3_hidden_states"] == "fused":
            inputs |= {"captured_layers": captured_layers(s), "hidden_states_dtype": hidden_states_dtype(s)}
        generated.append(add(host, plan_hosts[host]["generate_stage"], "generate", inputs)["hash"])

    s = settings[trainer]
    upstream = {"generate": generated, **feeding("gather", s)}
    before = [(g, plan_hosts[g]["generate_stage"]) for g in generators]
    if remote:
        upstream = {"gather": add(trainer, "gather", "gather", upstream, before)["hash"]}
        before = [(trainer, "gather")]
    prepare = add(
        trainer, "prepare", "prepare",
        {**upstream, **feeding("prepare", s), "model_config_sha256": files[trainer].get("model_config_sha256")},
        before,
    )  # fmt: skip
    extract = add(
        trainer, "extract", "extract",
        {"prepare": prepare["hash"], **feeding("extract", s), "hidden_states": s["eagle3_hidden_states"],
         "captured_layers": captured_layers(s), "hidden_states_dtype": hidden_states_dtype(s)},
        [(trainer, "prepare")],
    )  # fmt: skip
    train_inputs = {
        "extract": extract["hash"],
        **feeding("train", s),
        "aux_layer_ids": s["eagle3_aux_layer_ids"],
        "nnodes": len(trainers),
    }
    for node, host in enumerate(trainers):
        name = "train" if node == 0 else f"train-node-{node}"
        plan_hosts[host] |= {"node_rank": node, "train_stage": name}
        add(host, name, "train", train_inputs, [(trainer, "extract")])
    add(
        trainer, "validate", "validate",
        {"train": digest(train_inputs), **feeding("validate", s), "heldout_sha256": files[trainer].get("heldout_sha256")},
        [(trainer, "train")],
    )  # fmt: skip

    run_dir = s["eagle3_run_dir"]
    rows_files = [
        f"{run_dir}/gen/rows-{rank}.jsonl" if g not in remote else f"{run_dir}/gathered/{g}/rows-{rank}.jsonl"
        for rank, g in enumerate(generators)
    ]
    gathered = [f for f, g in zip(rows_files, generators, strict=True) if g in remote]
    return {
        "problems": [],
        "trainer": trainer,
        "generators": generators,
        "trainers": trainers,
        "remote_generators": remote,
        "rows_files": rows_files,
        "gathered_rows_files": gathered,
        "captured_layers": captured_layers(s),
        "hosts": plan_hosts,
    }


# What the plan reads of a host's settings beyond the stage inputs: where the jobs run, where the
# records go, and how the host's server is named and configured.
HOST = {
    "eagle3_python": "str",
    "eagle3_record_dir": "str",
    "eagle3_server_name": "str",
    "eagle3_server_port": "int",
    "eagle3_hidden_states_dir": "str",
    "eagle3_hidden_states_connector": "str",
    "eagle3_hidden_states_connector_module": "str",
}
READ = tuple(INPUTS) + tuple(OTHER) + tuple(HOST)


def input_files(
    host: str, settings: dict[str, Any], generators: list[str], trainers: list[str]
) -> dict[str, tuple[str, str]]:
    """The files this host's stages read: checksum key -> (path, what to say when it is missing).
    Every host loads the model; generators read the questions, the trainer the held-out prompts."""
    files = {
        "model_config_sha256": (
            f"{settings.get('eagle3_target_model', '')}/config.json",
            "does not exist (eagle3_target_model)",
        )
    }
    if host in generators:
        files["dataset_sha256"] = (
            str(settings.get("eagle3_dataset", "")),
            "does not exist or is unreadable (eagle3_dataset)",
        )
    if trainers and host == trainers[0]:
        files["heldout_sha256"] = (str(settings.get("eagle3_heldout", "")), "does not exist (eagle3_heldout)")
    return files


def stage_states(stages: dict[str, Any], answer: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """``jobs.stage statuses``' answer for ``stages`` (name -> stage), checked; ``None`` (the jobs
    are not installed on the host, as in a check run before the first install): every stage to do."""
    if answer is None:
        reason = "never run on this host (the jobs are not installed)"
        return [{"stage": name, "state": "todo", "reason": reason} for name in stages]
    asked = list(stages)
    named = [a.get("stage") for a in answer]
    if named != asked:
        raise PlanError(f"jobs.stage statuses answered for {named}, asked for {asked}")
    return answer


def server_unit(name: str) -> str:
    """roles/vllm_server's unit for the server named ``name``."""
    return f"vllm-{name}.service"


def server_marker(run_dir: str, host: str) -> str:
    """The file that says a pipeline run started ``host``'s server (and left it running, if a run failed)."""
    return f"{run_dir}/.stages/server-started-{host}"


def server_configs(settings: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The generator's vLLM ``--speculative-config`` and ``--kv-transfer-config``: the server
    writes the captured layers' hidden states of every request it serves (extract_hidden_states)."""
    speculative = {
        "method": "extract_hidden_states",
        "num_speculative_tokens": 1,
        "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": captured_layers(settings)}},
    }
    kv = {
        "kv_connector": settings.get("eagle3_hidden_states_connector", "").strip(),
        "kv_role": "kv_producer",
        "kv_connector_extra_config": {"shared_storage_path": settings.get("eagle3_hidden_states_dir", "")},
    }
    module = settings.get("eagle3_hidden_states_connector_module", "").strip()
    if module:
        kv["kv_connector_module_path"] = module
    return speculative, kv


def host_plan(
    run_plan: dict[str, Any],
    host: str,
    settings: dict[str, Any],
    states: list[dict[str, Any]],
    *,
    jobs_installed: bool,
    jobs_wheel: dict[str, Any],
    server_active: bool,
    server_started_by_pipeline: bool,
) -> dict[str, Any]:
    """This host's ``eagle3_plan``: its stages and their states, the run's shared facts, its server."""
    s = settings_of(settings)
    speculative, kv = server_configs(s)
    shared = {k: v for k, v in run_plan.items() if k not in ("hosts", "problems")}
    name = s.get("eagle3_server_name", "")
    return {
        **run_plan["hosts"][host],
        **shared,
        "todo": [st["stage"] for st in states if st["state"] != "complete"],
        "status": states,
        "run_dir": s.get("eagle3_run_dir", ""),
        "python": s.get("eagle3_python", ""),
        "record_dir": s.get("eagle3_record_dir", ""),
        "hidden_states": s.get("eagle3_hidden_states", ""),
        "hidden_states_dir": s.get("eagle3_hidden_states_dir", ""),
        "jobs_installed": jobs_installed,
        "jobs_wheel": jobs_wheel,
        "server": {
            "name": name,
            "unit": server_unit(name),
            # Written when a pipeline run starts the server, removed when it stops it.
            "marker": server_marker(s.get("eagle3_run_dir", ""), host),
            "port": s.get("eagle3_server_port", 0),
            "model": s.get("eagle3_target_model", ""),
            "served_model_name": s.get("eagle3_served_model_name", ""),
            "speculative_config": speculative,
            "kv_transfer_config": kv,
            # settle() decides: does this run need this host's server?
            "needed": False,
        },
        "server_active": server_active,
        "server_started_by_pipeline": server_started_by_pipeline,
    }


def settle(plans: dict[str, dict[str, Any]], host: str) -> dict[str, Any]:
    """``host``'s plan once every host has answered: the other trainers train when the first one
    does (torchrun needs every node), and a generator needs its server when it generates, or, with
    separate extraction, when it is the first generator and the trainer extracts."""
    plan = dict(plans[host])
    first = plans[plan["trainer"]]
    todo = list(plan["todo"])
    if plan["node_rank"] > 0 and "train" in first["todo"] and plan["train_stage"] not in todo:
        todo.append(plan["train_stage"])
    generators = plan["generators"]
    needed = host in generators and (
        plan["generate_stage"] in todo
        or (plan["hidden_states"] == "separate" and host == generators[0] and "extract" in first["todo"])
    )
    return plan | {"todo": todo, "server": plan["server"] | {"needed": needed}}


def report(host: str, plan: dict[str, Any], check_mode: bool) -> str:
    if not plan["todo"]:
        return f"{host}: nothing to do, every stage is complete"
    return f"{host}: {'would run' if check_mode else 'to run'}: {', '.join(plan['todo'])}"
