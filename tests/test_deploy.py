"""docker/: the images' entry points and the Kubernetes manifest agree with the commands they run.

No cluster or Docker daemon here: these read the files as Docker and Kubernetes would and hand the command lines to
PASU's own parser, so a renamed flag, a moved port or a probe on the wrong port fails here, not in a rollout."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
import yaml

from pasu.cli import build_parser
from pasu.cloud.cli import config_from_args
from pasu.settings import REPO_ROOT

DOCKER = REPO_ROOT / "docker"


def entrypoint(dockerfile: str) -> list[str]:
    """The exec-form ENTRYPOINT of a Dockerfile, as a list."""
    (line,) = re.findall(r"^ENTRYPOINT (\[.*\])$", (DOCKER / dockerfile).read_text(), re.MULTILINE)
    return json.loads(line)


def copied_to(dockerfile: str) -> set[str]:
    """The image paths a Dockerfile's COPY lines fill (destinations resolved against its WORKDIR)."""
    text = (DOCKER / dockerfile).read_text()
    (workdir,) = re.findall(r"^WORKDIR (\S+)$", text, re.MULTILINE)
    return {str(Path(workdir) / destination) for destination in re.findall(r"^COPY \S+ (\S+)$", text, re.MULTILINE)}


@pytest.fixture(scope="module")
def manifest() -> dict[str, dict]:
    return {doc["kind"]: doc for doc in yaml.safe_load_all((DOCKER / "k8s" / "cloud.yaml").read_text())}


@pytest.fixture(scope="module")
def pod_config(manifest):
    """The ServerConfig a cloud pod runs with: the image's entry point plus the manifest's args."""
    (container,) = manifest["Deployment"]["spec"]["template"]["spec"]["containers"]
    command = entrypoint("Dockerfile.cloud")
    assert command[0] == "pasu"
    return config_from_args(build_parser().parse_args(command[1:] + container["args"]))


def test_the_cloud_pods_serve_where_the_manifest_points(manifest, pod_config):
    pod = manifest["Deployment"]["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    config = pod_config  # what the pod runs with
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert (config.host, config.port, config.metrics_port) == ("0.0.0.0", ports["grpc"], ports["metrics"])
    assert container["readinessProbe"]["grpc"]["port"] == container["livenessProbe"]["grpc"]["port"] == config.port
    assert pod["metadata"]["annotations"]["prometheus.io/port"] == str(config.metrics_port)
    # in-flight requests finish before the kubelet kills the pod
    assert config.shutdown_grace_s < pod["spec"]["terminationGracePeriodSeconds"]
    (mount,) = container["volumeMounts"]
    assert Path(config.auth_token_file).parent == Path(mount["mountPath"])
    assert mount["name"] in {volume["name"] for volume in pod["spec"]["volumes"]}


def test_the_service_is_headless_over_the_same_pods(manifest):
    deployment, service = manifest["Deployment"], manifest["Service"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["clusterIP"] == "None"  # DNS returns every pod: the clients balance (round robin)
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"] == labels
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert {port["targetPort"] for port in service["spec"]["ports"]} == {port["name"] for port in container["ports"]}
    namespace = manifest["Namespace"]["metadata"]["name"]
    assert service["metadata"]["namespace"] == deployment["metadata"]["namespace"] == namespace


def test_the_cloud_image_holds_the_model_it_serves():
    command = entrypoint("Dockerfile.cloud")
    model = command[command.index("--model") + 1]
    assert model in copied_to("Dockerfile.cloud")


def test_the_device_image_runs_the_readmes_commands():
    assert entrypoint("Dockerfile.device") == ["pasu"]
    readme = (REPO_ROOT / "README.md").read_text()
    runs = re.findall(r"docker run [^\n]*pasu-device ((?:[^\n]*\\\n)*[^\n]*)", readme)
    assert runs, "the README shows how to run the device image"
    for run in runs:
        args = build_parser().parse_args(shlex.split(run.replace("\\\n", " ")))
        assert args.device_command == "run"


def test_the_ingress_reaches_the_service_over_grpc(manifest, pod_config):
    ingress = yaml.safe_load((DOCKER / "k8s" / "ingress.yaml").read_text())
    service = manifest["Service"]
    assert ingress["metadata"]["namespace"] == service["metadata"]["namespace"]
    annotations = ingress["metadata"]["annotations"]
    assert annotations["nginx.ingress.kubernetes.io/backend-protocol"] == "GRPC"
    # what the proxy lets through is what the server accepts: the server, not nginx, refuses larger uploads
    body_mib = int(annotations["nginx.ingress.kubernetes.io/proxy-body-size"].rstrip("m"))
    assert body_mib * 2**20 == pod_config.max_message_bytes
    (rule,) = ingress["spec"]["rules"]
    assert rule["host"] in ingress["spec"]["tls"][0]["hosts"]  # TLS ends at the ingress
    (path,) = rule["http"]["paths"]
    backend = path["backend"]["service"]
    assert backend["name"] == service["metadata"]["name"]
    assert backend["port"]["name"] in {port["name"] for port in service["spec"]["ports"]}


def test_the_gateway_pods_reach_the_cloud_service_and_probe_their_own_routes(manifest):
    gateway = {doc["kind"]: doc for doc in yaml.safe_load_all((DOCKER / "k8s" / "gateway.yaml").read_text())}
    pod = gateway["Deployment"]["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    assert container["image"] == manifest["Deployment"]["spec"]["template"]["spec"]["containers"][0]["image"]
    assert container["command"][0] == "pasu"
    args = build_parser().parse_args(container["command"][1:])
    assert args.cloud_command == "gateway"
    cloud = manifest["Service"]
    service_dns = f"{cloud['metadata']['name']}.{cloud['metadata']['namespace']}.svc.cluster.local"
    grpc_port = next(p["port"] for p in cloud["spec"]["ports"] if p["name"] == "grpc")
    assert args.cloud == f"dns:///{service_dns}:{grpc_port}"  # every replica, balanced by the gateway's client
    (port,) = container["ports"]
    assert (args.host, args.port) == ("0.0.0.0", port["containerPort"])
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": port["name"]}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": port["name"]}
    service = gateway["Service"]
    assert service["spec"]["selector"] == gateway["Deployment"]["spec"]["selector"]["matchLabels"] == \
        pod["metadata"]["labels"]
    assert [p["targetPort"] for p in service["spec"]["ports"]] == [port["name"]]
