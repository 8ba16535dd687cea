"""The rendered overlays: Kubernetes schemas (offline, strict) and the pod's invariants.

Every object is validated with the schemas `kubernetes-validate` ships, for the oldest
Kubernetes the manifests support (1.30: native sidecars and the preStop sleep action are on
by default) and the newest the package knows. The ServiceMonitor is a CRD those schemas lack:
it is checked against the subset of the Prometheus Operator's schema it uses.
"""

from __future__ import annotations

import argparse
import copy
import re
import shutil
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate  # type: ignore[import-untyped]  # ships no type information
import pytest
import yaml

import procmesh
from procmesh_orchestrator.cli.pod.manifests import render
from procmesh_orchestrator.config import BUILTINS, WorkflowRef, parse_config, workflow_refs
from procmesh_orchestrator.processors.binding import DEFAULT_ERROR_PROCESSORS
from procmesh_sidecars.__main__ import SETS
from tests.deploy.support import (
    DOCKERFILE,
    IMAGE,
    K8S,
    OVERLAYS,
    Obj,
    console_scripts,
    containers,
    flag_values,
    one,
    pod_spec,
    rendered,
    sidecars,
    split_image,
    unix_path,
    volume_path,
)

KUBERNETES_VERSIONS = ("1.30.0", kubernetes_validate.latest_version())
HEALTH_SERVICE = "procmesh.v1.ProcessorService"
SECRET = "procmesh-secrets"

_DURATION = {"type": "string", "pattern": r"^(0|(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"}
_LABELS = {"type": "object", "additionalProperties": {"type": "string"}}
SERVICE_MONITOR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "ServiceMonitor"},
        "metadata": {
            "type": "object",
            "required": ["name"],
            "additionalProperties": False,
            "properties": {
                "name": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"},
                "namespace": {"type": "string"},
                "labels": _LABELS,
                "annotations": _LABELS,
            },
        },
        "spec": {
            "type": "object",
            "required": ["selector", "endpoints"],
            "additionalProperties": False,
            "properties": {
                "jobLabel": {"type": "string"},
                "selector": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {"matchLabels": _LABELS, "matchExpressions": {"type": "array"}},
                },
                "namespaceSelector": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "any": {"type": "boolean"},
                        "matchNames": {"type": "array", "items": {"type": "string"}},
                    },
                },
                "endpoints": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            "port": {"type": "string"},
                            "targetPort": {"type": ["string", "integer"]},
                            "path": {"type": "string", "pattern": "^/"},
                            "scheme": {"enum": ["http", "https"]},
                            "interval": _DURATION,
                            "scrapeTimeout": _DURATION,
                            "honorLabels": {"type": "boolean"},
                            "relabelings": {"type": "array", "items": {"type": "object"}},
                            "metricRelabelings": {"type": "array", "items": {"type": "object"}},
                        },
                    },
                },
            },
        },
    },
}


def _validate(obj: Obj) -> None:
    if obj["kind"] == "ServiceMonitor":
        jsonschema.validate(obj, SERVICE_MONITOR_SCHEMA)
        return
    for version in KUBERNETES_VERSIONS:
        kubernetes_validate.validate(obj, version, strict=True)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_object_validates_against_the_kubernetes_schemas(overlay: str) -> None:
    objects = rendered(overlay)
    kinds = {o["kind"] for o in objects}
    assert {"Deployment", "ConfigMap", "Service", "PodDisruptionBudget", "ServiceAccount"} <= kinds
    # prod opts into the Prometheus Operator's ServiceMonitor; dev applies on a plain cluster.
    assert ("ServiceMonitor" in kinds) == (overlay == "prod")
    for obj in objects:
        try:
            _validate(obj)
        except (kubernetes_validate.ValidationError, jsonschema.ValidationError) as exc:
            where = ".".join(map(str, exc.path))
            pytest.fail(f"{overlay}: {obj['kind']} {obj['metadata']['name']}: {where}: {exc.message}")


def test_the_validation_rejects_a_typo_and_an_unknown_field() -> None:
    deployment = copy.deepcopy(one(rendered("dev"), "Deployment"))
    deployment["spec"]["template"]["spec"]["initContainers"][0]["startupProbe"]["grpc"]["prot"] = 9101
    with pytest.raises(kubernetes_validate.ValidationError, match="prot"):
        _validate(deployment)
    monitor = copy.deepcopy(one(rendered("prod"), "ServiceMonitor"))
    monitor["spec"]["endpoints"][0]["intervall"] = "30s"
    with pytest.raises(jsonschema.ValidationError, match="intervall"):
        _validate(monitor)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_processors_are_native_sidecars_started_before_the_orchestrator(overlay: str) -> None:
    spec = pod_spec(rendered(overlay))
    assert [c["name"] for c in spec["containers"]] == ["orchestrator"]
    assert spec["initContainers"], "the processors run as init containers"
    for sidecar in spec["initContainers"]:
        assert sidecar.get("restartPolicy") == "Always", f"{sidecar['name']} is not a native sidecar"
        # The kubelet starts the next container only once this probe passes.
        assert "startupProbe" in sidecar, f"{sidecar['name']} has no startupProbe"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_processor_endpoint_is_a_socket_a_sidecar_of_the_pod_serves(overlay: str) -> None:
    objects = rendered(overlay)
    spec = pod_spec(objects)
    orchestrator = spec["containers"][0]
    config_path = flag_values(orchestrator["args"], "--config")[0]
    config_volume, config_file = volume_path(orchestrator, config_path) or ("", "")
    volume = next(v for v in spec["volumes"] if v["name"] == config_volume)
    config_map = next(
        o
        for o in objects
        if o["kind"] == "ConfigMap" and o["metadata"]["name"] == volume["configMap"]["name"]
    )
    config = parse_config(yaml.safe_load(config_map["data"][config_file]), f"{overlay} ConfigMap")

    emptydirs = {v["name"] for v in spec["volumes"] if "emptyDir" in v}
    served: dict[tuple[str, str], Obj] = {}
    for sidecar in sidecars(objects):
        for address in flag_values(sidecar["args"], "--listen"):
            path = unix_path(address)
            if path is not None:
                where = volume_path(sidecar, path)
                assert where is not None, f"{sidecar['name']}: {address} is on no volume"
                assert where[0] in emptydirs, f"{sidecar['name']}: {address} is not on a shared emptyDir"
                served[where] = sidecar
    hosted: dict[str, set[str]] = {}
    for name, sidecar_config in config.sidecars.items():
        path = unix_path(sidecar_config.address)
        assert path is not None, f"sidecar {name!r}: use a unix socket inside the pod"
        where = volume_path(orchestrator, path)
        assert where in served, f"sidecar {name!r}: no sidecar of the pod serves {sidecar_config.address}"
        sets = [a for a in served[where]["args"] if not a.startswith("-") and a in SETS]
        no_args = argparse.Namespace(scenario=None)
        hosted[name] = {p.id for s in sets for p in SETS[s](no_args)}

    # Declared `builtins`, so that the orchestrator does not start a sidecar of its own in the pod.
    assert BUILTINS in config.sidecars
    assert set(DEFAULT_ERROR_PROCESSORS) <= hosted[BUILTINS]
    for agent_id, agent in config.agents.items():
        refs = [*agent.input_processors, *agent.output_processors, *agent.error_processors]
        for ref in refs:
            steps = config.workflows[ref.workflow].steps if isinstance(ref, WorkflowRef) else [ref]
            for step in steps:
                for processor in workflow_refs(step):
                    assert processor.processor_id in hosted[processor.sidecar], (
                        f"agent {agent_id}: {processor.processor} is not hosted by that sidecar"
                    )


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_probes_match_the_ports_the_containers_listen_on(overlay: str) -> None:
    objects = rendered(overlay)
    names: set[str] = set()
    for container in containers(objects):
        declared = {p["containerPort"] for p in container.get("ports", [])}
        for port in container.get("ports", []):
            assert len(port["name"]) <= 15, f"{port['name']}: port names have at most 15 characters"
            assert port["name"] not in names, f"{port['name']}: port names are unique in a pod"
            names.add(port["name"])
        for key in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert key in container, f"{container['name']} has no {key}"
        args = container["args"]
        if container.get("restartPolicy") == "Always":
            tcp = [a for a in flag_values(args, "--listen") if unix_path(a) is None]
            # The kubelet dials the pod IP: the probe port must not be bound to loopback only.
            assert [a.rsplit(":", 1)[0] for a in tcp] == ["0.0.0.0"], tcp
            port = int(tcp[0].rsplit(":", 1)[1])
            for key in ("startupProbe", "readinessProbe", "livenessProbe"):
                assert container[key]["grpc"] == {"port": port, "service": HEALTH_SERVICE}
            assert {port, *map(int, flag_values(args, "--metrics-port"))} <= declared
        else:
            by_name = {p["name"]: p["containerPort"] for p in container["ports"]}
            assert by_name == {
                "http": int(flag_values(args, "--http-port")[0]),
                "grpc": int(flag_values(args, "--grpc-port")[0]),
            }
            assert flag_values(args, "--http-host") == flag_values(args, "--grpc-host") == ["0.0.0.0"]
            paths = {
                key: container[key]["httpGet"] for key in ("startupProbe", "readinessProbe", "livenessProbe")
            }
            assert paths["readinessProbe"]["path"] == "/readyz"
            assert paths["startupProbe"]["path"] == paths["livenessProbe"]["path"] == "/healthz"
            assert {p["port"] for p in paths.values()} == {"http"}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_container_runs_as_non_root_with_a_locked_down_context(overlay: str) -> None:
    spec = pod_spec(rendered(overlay))
    pod = spec["securityContext"]
    assert pod["seccompProfile"] == {"type": "RuntimeDefault"}
    assert spec["automountServiceAccountToken"] is False
    user = re.search(r"^USER (\d+)", DOCKERFILE.read_text(encoding="utf-8"), re.MULTILINE)
    assert user is not None
    for container in containers(rendered(overlay)):
        ctx = {**pod, **container.get("securityContext", {})}
        name = container["name"]
        assert ctx.get("runAsNonRoot") is True, name
        assert ctx.get("runAsUser") == int(user[1]) != 0, f"{name}: runAsUser must be the image's user"
        assert ctx.get("allowPrivilegeEscalation") is False, name
        assert ctx.get("readOnlyRootFilesystem") is True, name
        assert ctx.get("capabilities") == {"drop": ["ALL"]}, name
        assert not ctx.get("privileged"), name


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_container_sets_requests_and_a_memory_limit(overlay: str) -> None:
    for container in containers(rendered(overlay)):
        resources = container["resources"]
        assert {"cpu", "memory"} <= resources["requests"].keys(), container["name"]
        assert "memory" in resources["limits"], container["name"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_service_budget_autoscaler_and_network_policy_fit_the_pod(overlay: str) -> None:
    objects = rendered(overlay)
    deployment = one(objects, "Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    service = one(objects, "Service")
    assert service["spec"]["selector"].items() <= pod_labels.items()
    ports = {p["name"]: p["containerPort"] for c in containers(objects) for p in c.get("ports", [])}
    targets = {ports[p["targetPort"]] for p in service["spec"]["ports"]}
    budget = one(objects, "PodDisruptionBudget")
    assert budget["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert budget["spec"].get("maxUnavailable") == 1, "minAvailable would block draining one replica"

    policy = one(objects, "NetworkPolicy")
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod_labels.items()
    admitted = {p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]}
    assert targets == admitted, "other pods reach the Service's ports and nothing else"
    for sidecar in sidecars(objects):
        port = sidecar["startupProbe"]["grpc"]["port"]
        assert port not in admitted, f"{sidecar['name']}: its gRPC port (processors too) must stay in the pod"

    autoscalers = [o for o in objects if o["kind"] == "HorizontalPodAutoscaler"]
    if overlay == "dev":
        assert not autoscalers
        assert deployment["spec"]["replicas"] == 1
    else:
        (hpa,) = autoscalers
        assert hpa["spec"]["scaleTargetRef"] == {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "name": "procmesh",
        }
        assert 2 <= hpa["spec"]["minReplicas"] < hpa["spec"]["maxReplicas"]
        assert "replicas" not in deployment["spec"], "the autoscaler owns the replica count"


def _check_service_monitor(objects: list[Obj]) -> None:
    """The ServiceMonitor scrapes, through the Service, exactly the pod's metrics ports."""
    orchestrator = pod_spec(objects)["containers"][0]
    service = one(objects, "Service")
    monitor = one(objects, "ServiceMonitor")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    scraped = {e["port"] for e in monitor["spec"]["endpoints"]}
    by_name = {p["name"]: p for p in service["spec"]["ports"]}
    assert scraped <= by_name.keys()
    container_ports = {p["name"]: p["containerPort"] for c in containers(objects) for p in c.get("ports", [])}
    metrics_ports = {int(flag_values(orchestrator["args"], "--http-port")[0])} | {
        int(p) for s in sidecars(objects) for p in flag_values(s["args"], "--metrics-port")
    }
    assert {container_ports[by_name[p]["targetPort"]] for p in scraped} == metrics_ports


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_metrics_are_scraped_by_annotations_and_a_service_monitor(overlay: str) -> None:
    objects = rendered(overlay)
    deployment = one(objects, "Deployment")
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    orchestrator = pod_spec(objects)["containers"][0]
    assert annotations == {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": flag_values(orchestrator["args"], "--http-port")[0],
        "prometheus.io/path": "/metrics",
    }
    if overlay == "prod":
        _check_service_monitor(objects)


def test_the_service_monitor_component_opts_the_dev_overlay_in(tmp_path: Path) -> None:
    # What the dev overlay's closing comment (and docs/deploy.md) tells a cluster with the Operator.
    shutil.copytree(K8S, tmp_path / "k8s")
    dev = tmp_path / "k8s" / "overlays" / "dev" / "kustomization.yaml"
    text = dev.read_text(encoding="utf-8")
    component = "../../components/servicemonitor"
    opted_in = text.replace(f"  # - {component}", f"  - {component}")
    assert opted_in != text, "the dev overlay no longer shows how to opt in"
    dev.write_text(opted_in, encoding="utf-8")
    objects = render(dev.parent)
    _check_service_monitor(objects)
    monitor = one(objects, "ServiceMonitor")
    jsonschema.validate(monitor, SERVICE_MONITOR_SCHEMA)
    assert monitor["metadata"]["namespace"] == "procmesh-dev"


RECOMMENDED = ("name", "instance", "version", "part-of", "managed-by")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_object_carries_the_recommended_labels(overlay: str) -> None:
    objects = rendered(overlay)
    for obj in objects:
        labels = obj["metadata"].get("labels", {})
        missing = [k for k in RECOMMENDED if f"app.kubernetes.io/{k}" not in labels]
        assert not missing, f"{obj['kind']} {obj['metadata']['name']} lacks {missing}"
        assert labels["app.kubernetes.io/part-of"] == "procmesh"
        assert labels["app.kubernetes.io/managed-by"] == "kustomize"
    deployment = one(objects, "Deployment")
    template = deployment["spec"]["template"]["metadata"]["labels"]
    assert {f"app.kubernetes.io/{k}" for k in RECOMMENDED} <= template.keys()
    assert template["app.kubernetes.io/component"] == "agent-server"
    # Selectors hold only what never changes in place: name and instance.
    assert set(deployment["spec"]["selector"]["matchLabels"]) == {
        "app.kubernetes.io/name",
        "app.kubernetes.io/instance",
    }
    if overlay == "prod":  # the version label is the image's tag and the packages' version
        image = pod_spec(objects)["containers"][0]["image"]
        assert template["app.kubernetes.io/version"] == image.rpartition(":")[2] == procmesh.__version__


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_pod_runs_as_its_own_service_account_without_a_token(overlay: str) -> None:
    objects = rendered(overlay)
    account = one(objects, "ServiceAccount")
    spec = pod_spec(objects)
    assert spec["serviceAccountName"] == account["metadata"]["name"]
    assert account["automountServiceAccountToken"] is False
    assert spec["automountServiceAccountToken"] is False


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_keys_come_from_a_secret_that_only_the_orchestrator_sees(overlay: str) -> None:
    objects = rendered(overlay)
    for container in containers(objects):
        for var in container.get("env", []):
            assert not re.search(r"KEY|TOKEN|SECRET|PASSWORD", var["name"]) or "valueFrom" in var, var
        refs = [e.get("secretRef", {}).get("name") for e in container.get("envFrom", [])]
        if container["name"] == "orchestrator":
            assert refs == [SECRET]
        else:
            assert not refs, f"{container['name']} needs no secrets"
    secrets = [o for o in objects if o["kind"] == "Secret"]
    if overlay == "dev":
        assert [s["metadata"]["name"] for s in secrets] == [SECRET]
        assert "PROCMESH_API_KEYS" in secrets[0]["stringData"]
    else:
        assert not secrets, "production keys are created outside git (docs/deploy.md)"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_container_runs_a_console_script_of_the_image_at_a_pinned_tag(overlay: str) -> None:
    scripts = console_scripts()
    images = set()
    for container in containers(rendered(overlay)):
        assert container["command"][0] in scripts, f"{container['name']}: {container['command']}"
        images.add(container["image"])
    (image,) = images  # one image for the whole pod
    name, tag, digest = split_image(image)
    assert name.rsplit("/", 1)[-1] == IMAGE
    assert digest or tag not in ("", "latest"), f"{overlay}: pin the image ({image})"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_grace_period_covers_pre_stop_drain_and_sidecars(overlay: str) -> None:
    spec = pod_spec(rendered(overlay))
    orchestrator = spec["containers"][0]
    pre_stop = orchestrator["lifecycle"]["preStop"]["sleep"]["seconds"]
    drain = float(flag_values(orchestrator["args"], "--drain-grace-seconds")[0])
    sidecar_grace = max(float(flag_values(s["args"], "--grace-seconds")[0]) for s in spec["initContainers"])
    assert spec["terminationGracePeriodSeconds"] > pre_stop + drain + sidecar_grace
