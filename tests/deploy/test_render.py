"""The pure-Python kustomize renderer (orchestrator.pod.render) on small kustomizations."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from procmesh_orchestrator.cli.pod import PodError, render, render_yaml, split_image, strategic_merge

DEPLOYMENT = {
    "apiVersion": "apps/v1",
    "kind": "Deployment",
    "metadata": {"name": "web", "labels": {"app": "web"}},
    "spec": {
        "selector": {"matchLabels": {"app": "web"}},
        "template": {
            "metadata": {"labels": {"app": "web"}},
            "spec": {
                "topologySpreadConstraints": [
                    {"maxSkew": 1, "topologyKey": "zone", "labelSelector": {"matchLabels": {"app": "web"}}}
                ],
                "initContainers": [{"name": "side", "image": "img:1", "restartPolicy": "Always"}],
                "containers": [
                    {
                        "name": "main",
                        "image": "registry:5000/team/img:1",
                        "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}],
                        "ports": [{"containerPort": 80, "name": "http"}],
                        "resources": {"requests": {"cpu": "1"}},
                    },
                    {"name": "other", "image": "busybox"},
                ],
            },
        },
    },
}
SERVICE = {
    "apiVersion": "v1",
    "kind": "Service",
    "metadata": {"name": "web"},
    "spec": {"selector": {"app": "web"}, "ports": [{"port": 80}]},
}
PDB = {
    "apiVersion": "policy/v1",
    "kind": "PodDisruptionBudget",
    "metadata": {"name": "web"},
    "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": "web"}}},
}
MONITOR = {
    "apiVersion": "monitoring.coreos.com/v1",
    "kind": "ServiceMonitor",
    "metadata": {"name": "web"},
    "spec": {"selector": {"matchLabels": {"app": "web"}}, "endpoints": [{"port": "http"}]},
}


def write(directory: Path, files: dict[str, Any]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        text = (
            content
            if isinstance(content, str)
            else yaml.safe_dump_all(content if isinstance(content, list) else [content])
        )
        (directory / name).write_text(text, encoding="utf-8")
    return directory


@pytest.fixture
def base(tmp_path: Path) -> Path:
    return write(
        tmp_path / "base",
        {
            "kustomization.yaml": {"resources": ["app.yaml", "pdb.yaml", "monitor.yaml"]},
            "app.yaml": [DEPLOYMENT, SERVICE],
            "pdb.yaml": PDB,
            "monitor.yaml": MONITOR,
        },
    )


def by_kind(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {o["kind"]: o for o in objects}


def test_an_overlay_applies_patches_images_replicas_namespace_and_labels(base: Path, tmp_path: Path) -> None:
    patch = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web"},
        "spec": {
            "template": {
                "spec": {
                    "containers": [
                        {
                            "name": "main",
                            "env": [{"name": "B", "value": "two"}, {"name": "C", "value": "3"}],
                            "resources": {"requests": {"cpu": None, "memory": "1Gi"}},
                        },
                        {"name": "other", "$patch": "delete"},
                    ]
                }
            }
        },
    }
    overlay = write(
        tmp_path / "overlay",
        {
            "kustomization.yaml": {
                "namespace": "ns",
                "commonLabels": {"env": "dev"},
                "resources": ["../base"],
                "patches": [
                    {"path": "patch.yaml"},
                    {
                        "patch": "apiVersion: v1\nkind: Service\nmetadata: {name: web}\n"
                        "spec: {type: NodePort}\n"
                    },
                ],
                "images": [
                    {"name": "img", "newTag": "2"},
                    {"name": "registry:5000/team/img", "newName": "example.com/img", "digest": "sha256:abc"},
                ],
                "replicas": [{"name": "web", "count": 3}],
            },
            "patch.yaml": patch,
        },
    )
    objects = render(overlay)
    assert [o["kind"] for o in objects] == ["Service", "Deployment", "PodDisruptionBudget", "ServiceMonitor"]
    kinds = by_kind(objects)
    deployment = kinds["Deployment"]
    spec = deployment["spec"]["template"]["spec"]
    (main,) = spec["containers"]
    assert main["env"] == [
        {"name": "A", "value": "1"},
        {"name": "B", "value": "two"},
        {"name": "C", "value": "3"},
    ]
    assert main["resources"] == {"requests": {"memory": "1Gi"}}
    assert main["image"] == "example.com/img@sha256:abc"
    assert spec["initContainers"][0]["image"] == "img:2"
    assert deployment["spec"]["replicas"] == 3
    assert all(o["metadata"]["namespace"] == "ns" for o in objects)
    labels = {"app": "web", "env": "dev"}
    assert deployment["spec"]["selector"]["matchLabels"] == labels
    assert deployment["spec"]["template"]["metadata"]["labels"] == labels
    assert spec["topologySpreadConstraints"][0]["labelSelector"]["matchLabels"] == labels
    assert kinds["Service"]["spec"] == {"selector": labels, "ports": [{"port": 80}], "type": "NodePort"}
    assert kinds["PodDisruptionBudget"]["spec"]["selector"]["matchLabels"] == labels
    # A custom resource gets the labels on its metadata only, as with kustomize.
    assert kinds["ServiceMonitor"]["metadata"]["labels"] == {"env": "dev"}
    assert kinds["ServiceMonitor"]["spec"]["selector"]["matchLabels"] == {"app": "web"}
    assert list(yaml.safe_load_all(render_yaml(objects))) == objects


def test_a_delete_patch_removes_a_resource_and_a_target_patches_by_kind(base: Path, tmp_path: Path) -> None:
    overlay = write(
        tmp_path / "overlay",
        {
            "kustomization.yaml": {
                "resources": ["../base"],
                "patches": [
                    {
                        "patch": "apiVersion: policy/v1\nkind: PodDisruptionBudget\n"
                        "metadata: {name: web}\n$patch: delete\n"
                    },
                    {
                        "target": {"kind": "Service", "name": "w.*"},
                        "patch": "kind: Service\nmetadata: {name: x}\nspec: {type: LoadBalancer}\n",
                    },
                ],
            }
        },
    )
    kinds = by_kind(render(overlay))
    assert "PodDisruptionBudget" not in kinds
    assert kinds["Service"]["spec"]["type"] == "LoadBalancer"
    assert kinds["Service"]["metadata"]["name"] == "web"


@pytest.mark.parametrize(
    ("kustomization", "files", "message"),
    [
        ({"resources": ["../base"], "configMapGenerator": []}, {}, "unsupported kustomization fields"),
        ({"resources": ["missing.yaml"]}, {}, "not found"),
        ({"resources": ["../base", "../base/app.yaml"]}, {}, "defined twice"),
        (
            {"resources": ["../base"], "patches": [{"path": "p.yaml"}]},
            {"p.yaml": [[{"op": "remove", "path": "/spec"}]]},
            "JSON 6902",
        ),
        (
            {"resources": ["../base"], "patches": [{"path": "p.yaml"}]},
            {"p.yaml": {**SERVICE, "metadata": {"name": "nope"}}},
            "no resource matches",
        ),
        ({"resources": ["../base"], "replicas": [{"name": "nope", "count": 1}]}, {}, "no workload"),
    ],
)
def test_what_the_renderer_does_not_support_is_an_error(
    base: Path, tmp_path: Path, kustomization: dict[str, Any], files: dict[str, Any], message: str
) -> None:
    overlay = write(tmp_path / "overlay", {"kustomization.yaml": kustomization, **files})
    with pytest.raises(PodError, match=message):
        render(overlay)


def test_strategic_merge_keeps_its_inputs() -> None:
    base = {"a": {"b": 1, "c": [1, 2]}, "ports": [{"containerPort": 1, "name": "x"}]}
    patch = {"a": {"b": None, "c": [3]}, "ports": [{"containerPort": 1, "name": "y"}, {"containerPort": 2}]}
    assert strategic_merge(base, patch) == {
        "a": {"c": [3]},
        "ports": [{"containerPort": 1, "name": "y"}, {"containerPort": 2}],
    }
    assert base == {"a": {"b": 1, "c": [1, 2]}, "ports": [{"containerPort": 1, "name": "x"}]}


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
