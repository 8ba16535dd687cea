"""Rendering with `kubectl kustomize`: the overlays render cleanly; a config change updates the map in
place (the orchestrator reloads it), or, without the config-reload component, renames it (a rollout).

kubectl is required (tests/deps.py): a missing kubectl fails these tests with the install hint.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from procmesh_orchestrator.cli.pod.command import render_command
from procmesh_orchestrator.cli.pod.manifests import kustomize, render
from procmesh_orchestrator.errors import DeployError
from tests.deploy.support import K8S, OVERLAYS, one, pod_spec, split_image
from tests.deps import require


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_overlay_renders_without_a_deprecation_warning(overlay: str) -> None:
    done = subprocess.run(
        [require("kubectl"), "kustomize", str(K8S / "overlays" / overlay)],
        capture_output=True,
        text=True,
        check=True,
    )
    # kustomize warns on stderr for deprecated fields (commonLabels, patchesStrategicMerge, ...).
    assert done.stderr == ""
    assert "commonLabels" not in (K8S / "overlays" / overlay / "kustomization.yaml").read_text()


def test_render_command_prints_what_kubectl_kustomize_prints(capsys: pytest.CaptureFixture[str]) -> None:
    dev = K8S / "overlays" / "dev"
    expected = subprocess.run(
        [require("kubectl"), "kustomize", str(dev)], capture_output=True, text=True, check=True
    ).stdout
    assert render_command(str(dev)) == 0
    assert capsys.readouterr().out == expected
    assert render(dev) == [o for o in yaml.safe_load_all(expected) if o]


def _config_map_of(objects: list[dict[str, object]]) -> str:
    (volume,) = [v for v in pod_spec(objects)["volumes"] if "configMap" in v]
    name = str(volume["configMap"]["name"])
    assert one(objects, "ConfigMap")["metadata"]["name"] == name
    return name


def _change_the_config(copy: Path) -> None:
    config = copy / "base" / "config.yaml"
    text = config.read_text(encoding="utf-8")
    assert "maxSteps: 5" in text
    config.write_text(text.replace("maxSteps: 5", "maxSteps: 6"), encoding="utf-8")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_by_default_a_config_change_updates_the_map_in_place_for_a_reload(
    overlay: str, tmp_path: Path
) -> None:
    require("kubectl")
    copy = tmp_path / "k8s"
    shutil.copytree(K8S, copy)
    before = render(copy / "overlays" / overlay)
    _change_the_config(copy)
    after = render(copy / "overlays" / overlay)
    # One name, so `kubectl apply` updates the map and leaves the pod template (no rollout) ...
    assert _config_map_of(before) == _config_map_of(after) == "procmesh-config"
    assert one(before, "Deployment") == one(after, "Deployment")
    # ... and the kubelet refreshes the mounted file only for a whole-volume mount (not subPath).
    (orchestrator,) = [c for c in pod_spec(after)["containers"] if c["name"] == "orchestrator"]
    (mount,) = [m for m in orchestrator["volumeMounts"] if m["name"] == "config"]
    assert "subPath" not in mount
    assert orchestrator["args"][orchestrator["args"].index("--config") + 1].startswith(
        mount["mountPath"] + "/"
    )


def test_without_the_config_reload_component_a_config_change_rolls_the_pods(tmp_path: Path) -> None:
    require("kubectl")
    copy = tmp_path / "k8s"
    shutil.copytree(K8S, copy)
    kustomization = copy / "overlays" / "dev" / "kustomization.yaml"
    text = kustomization.read_text(encoding="utf-8")
    assert "  - ../../components/config-reload\n" in text
    kustomization.write_text(text.replace("  - ../../components/config-reload\n", ""), encoding="utf-8")
    before = _config_map_of(render(copy / "overlays" / "dev"))
    _change_the_config(copy)
    after = _config_map_of(render(copy / "overlays" / "dev"))
    # The Deployment's pod template names the map, so a new name is a new template: a rollout.
    assert before.startswith("procmesh-config-")
    assert after.startswith("procmesh-config-")
    assert after != before


def test_prod_replaces_the_base_config_with_its_own() -> None:
    objects = render(K8S / "overlays" / "prod")
    data = one(objects, "ConfigMap")["data"]
    assert data.keys() == {"config.yaml"}
    assert data["config.yaml"] == (K8S / "overlays" / "prod" / "config.yaml").read_text(encoding="utf-8")


def test_a_missing_kubectl_is_an_error_naming_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "")
    with pytest.raises(DeployError, match=r"kubectl is not installed.*kubectl 1\.27 or newer"):
        kustomize(K8S / "overlays" / "dev")


def test_a_failing_kustomization_is_an_error_with_kubectls_message(tmp_path: Path) -> None:
    require("kubectl")
    (tmp_path / "kustomization.yaml").write_text("resources: [missing.yaml]\n", encoding="utf-8")
    with pytest.raises(DeployError, match=r"kubectl kustomize .* failed: .*missing\.yaml"):
        render(tmp_path)


OLD_KUBECTL = """#!/bin/sh
# Debian's kubectl 1.20: its kustomize v2 rejects the overlays' fields.
if [ "$1" = version ]; then
  echo '{"clientVersion": {"major": "1", "minor": "20", "gitVersion": "v1.20.15"}}'
  exit 0
fi
echo 'Error: json: unknown field "labels"' >&2
exit 1
"""


def test_an_old_kubectl_is_named_with_the_version_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kubectl = tmp_path / "kubectl"
    kubectl.write_text(OLD_KUBECTL, encoding="utf-8")
    kubectl.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(
        DeployError, match=r'unknown field "labels" \(kubectl v1\.20\.15 is older.*1\.27 or newer'
    ):
        kustomize(K8S / "overlays" / "dev")


def test_a_rendered_file_needs_no_kubectl(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    objects = render(K8S / "overlays" / "dev")
    manifest = tmp_path / "pod.yaml"
    listed = {"apiVersion": "v1", "kind": "List", "metadata": {}, "items": objects[1:]}
    manifest.write_text(yaml.safe_dump_all([objects[0], listed]), encoding="utf-8")
    monkeypatch.setenv("PATH", "")
    assert render(manifest) == objects
    (tmp_path / "broken.yaml").write_text("kind: Service\n", encoding="utf-8")
    with pytest.raises(DeployError, match="apiVersion, kind and metadata"):
        render(tmp_path / "broken.yaml")


@pytest.mark.parametrize(
    ("image", "parts"),
    [
        ("procmesh", ("procmesh", "", "")),
        ("procmesh:dev", ("procmesh", "dev", "")),
        ("registry:5000/a/b:1.2@sha256:ff", ("registry:5000/a/b", "1.2", "sha256:ff")),
        ("registry:5000/a/b", ("registry:5000/a/b", "", "")),
    ],
)
def test_split_image(image: str, parts: tuple[str, str, str]) -> None:
    assert split_image(image) == parts
