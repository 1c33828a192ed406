"""The deploy recipes of deploy/ (docs/deploying.md): each checked as far as this machine allows."""

from __future__ import annotations

import importlib.util
import math
import os
import re
import secrets
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import redis
import yaml
from dockerfile_parse import DockerfileParser

from django_rtq.broker.redis_config import findings, read_configs
from django_rtq.defaults import DEFAULT_SHUTDOWN_TIMEOUT_SECONDS
from django_rtq.management.commands.rtq_worker import Command as WorkerCommand
from django_rtq.worker.processor.watchdog import SHUTDOWN_STOP_GRACE
from django_rtq.worker.server import EXIT_GRACE_SECONDS
from tests.support import ROOT
from tests.support.servers import RedisProcess

DEPLOY = ROOT / "deploy"
UNIT = DEPLOY / "systemd" / "rtq-worker.service"
DOCKERFILE = DEPLOY / "docker" / "Dockerfile"
COMPOSE = DEPLOY / "docker" / "compose.yaml"
WORKER_MANIFEST = DEPLOY / "kubernetes" / "worker.yaml"
REDIS_MANIFEST = DEPLOY / "kubernetes" / "redis.yaml"
PRODUCTION_SETTINGS = DEPLOY / "docker" / "production.py"

#: Seconds the recipes give a worker beyond its own stop budget before SIGKILL (docs/deploying.md).
MARGIN_SECONDS = 2
#: The probes' and the worker's option for the health file (the probes' interface, issue 27).
HEALTH_FILE_OPTION = "--health-file"


def stop_budget(shutdown_timeout: float) -> float:
    """Longest a worker takes from SIGTERM to its exit: running tasks get `shutdown_timeout`,
    the handlers still running SHUTDOWN_STOP_GRACE to stop, the process EXIT_GRACE_SECONDS."""
    return shutdown_timeout + SHUTDOWN_STOP_GRACE + EXIT_GRACE_SECONDS


def grace_seconds(shutdown_timeout: float) -> int:
    """The grace before SIGKILL the recipes give: the stop budget plus the margin, whole seconds."""
    return math.ceil(stop_budget(shutdown_timeout)) + MARGIN_SECONDS


def worker_options(args: list[str]) -> dict[str, Any]:
    """Parse `rtq_worker`'s arguments with the command's own parser (CommandError if it refuses
    one)."""
    parser = WorkerCommand().create_parser("manage.py", "rtq_worker")
    return vars(parser.parse_args(args))


def worker_args(argv: list[str]) -> list[str]:
    """The arguments after `python manage.py rtq_worker`, asserting that the command is that."""
    assert Path(argv[0]).name.startswith("python"), argv
    assert argv[1:3] == ["manage.py", "rtq_worker"], argv
    return argv[3:]


def health_file(args: list[str]) -> str:
    assert HEALTH_FILE_OPTION in args, args
    return args[args.index(HEALTH_FILE_OPTION) + 1]


def production_shutdown_timeout(monkeypatch: pytest.MonkeyPatch) -> float:
    """SHUTDOWN_TIMEOUT in the settings the image runs (deploy/docker/production.py)."""
    monkeypatch.setenv("DJANGO_SECRET_KEY", "loaded-by-a-test")
    spec = importlib.util.spec_from_file_location("testproject.production", PRODUCTION_SETTINGS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return float(module.RTQ.get("SHUTDOWN_TIMEOUT", DEFAULT_SHUTDOWN_TIMEOUT_SECONDS))


# systemd


def unit_entries() -> list[tuple[str, str, str]]:
    """(section, key, value) of each line of the unit, in order (keys may repeat)."""
    entries, section = [], ""
    for line in UNIT.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        entries.append((section, key.strip(), value.strip()))
    return entries


def unit_value(section: str, key: str) -> str:
    values = [value for s, k, value in unit_entries() if (s, k) == (section, key)]
    assert len(values) == 1, f"{key}= in [{section}]: {values}"
    return values[0]


def test_the_systemd_unit_runs_the_worker_with_options_it_takes() -> None:
    argv = shlex.split(unit_value("Service", "ExecStart"))
    assert Path(argv[0]).is_absolute(), "systemd wants an absolute path to the program"
    options = worker_options(worker_args(argv))
    assert options["processes"] == 1
    assert options["concurrency"] == 10


def test_the_systemd_unit_gives_the_worker_its_graceful_shutdown() -> None:
    args = worker_args(shlex.split(unit_value("Service", "ExecStart")))
    timeout = worker_options(args)["shutdown_timeout"]
    budget = stop_budget(DEFAULT_SHUTDOWN_TIMEOUT_SECONDS if timeout is None else timeout)
    assert unit_value("Service", "KillSignal") == "SIGTERM"
    assert unit_value("Service", "KillMode") == "mixed"  # SIGTERM to the worker (or its supervisor) only
    assert float(unit_value("Service", "TimeoutStopSec")) >= budget + MARGIN_SECONDS


def test_systemd_analyze_verifies_the_unit(tmp_path: Path) -> None:
    """systemd's own parser: every key known and every value valid. The unit's interpreter is
    a placeholder path, which verify wants to exist: the copy runs this test's Python."""
    analyze = shutil.which("systemd-analyze")
    assert analyze, "systemd-analyze is missing: apt-get install -y systemd"
    program = shlex.split(unit_value("Service", "ExecStart"))[0]
    copy = tmp_path / UNIT.name
    copy.write_text(UNIT.read_text().replace(program, sys.executable))
    done = subprocess.run([analyze, "verify", str(copy)], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout + done.stderr) == (0, "")


def test_systemd_analyze_would_tell_a_mistyped_key(tmp_path: Path) -> None:
    """The check above can fail: verify reports a key systemd does not know."""
    copy = tmp_path / UNIT.name
    text = UNIT.read_text().replace(shlex.split(unit_value("Service", "ExecStart"))[0], sys.executable)
    copy.write_text(text.replace("TimeoutStopSec=", "TimeoutStopSecs="))
    done = subprocess.run(
        [shutil.which("systemd-analyze") or "systemd-analyze", "verify", str(copy)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "Unknown key 'TimeoutStopSecs'" in done.stdout + done.stderr


# Kubernetes


def manifests(path: Path) -> list[dict[str, Any]]:
    return [document for document in yaml.safe_load_all(path.read_text()) if document]


def worker_pod() -> dict[str, Any]:
    (deployment,) = manifests(WORKER_MANIFEST)
    assert deployment["kind"] == "Deployment"
    return deployment["spec"]["template"]["spec"]


@pytest.mark.parametrize("path", [WORKER_MANIFEST, REDIS_MANIFEST], ids=lambda path: path.name)
def test_the_kubernetes_manifests_validate_against_the_schemas(path: Path) -> None:
    documents = manifests(path)
    assert documents
    for document in documents:
        kubernetes_validate.validate(document, kubernetes_validate.latest_version(), strict=True)


def test_the_schemas_refuse_a_mistyped_field() -> None:
    (deployment,) = manifests(WORKER_MANIFEST)
    pod = deployment["spec"]["template"]["spec"]
    pod["terminationGracePeriod"] = pod.pop("terminationGracePeriodSeconds")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, kubernetes_validate.latest_version(), strict=True)


def test_the_worker_pod_grace_period_is_the_stop_budget_plus_the_margin(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pod = worker_pod()
    (container,) = pod["containers"]
    timeout = worker_options(container["args"])["shutdown_timeout"]
    if timeout is None:
        timeout = production_shutdown_timeout(monkeypatch)
    assert pod["terminationGracePeriodSeconds"] == grace_seconds(timeout)
    # At the defaults: 8 s for running tasks + 2 s to stop them + 3 s to exit + 2 s of margin.
    assert grace_seconds(DEFAULT_SHUTDOWN_TIMEOUT_SECONDS) == 15


def test_the_worker_pod_runs_one_worker_process_and_probes_its_health_file() -> None:
    (container,) = worker_pod()["containers"]
    args = container["args"]
    assert worker_options(worker_args([*container["command"], *args]))["processes"] == 1
    path = health_file(args)
    for probe, check in (("livenessProbe", "live"), ("readinessProbe", "ready")):
        command = container[probe]["exec"]["command"]
        assert command == ["python", "-m", "django_rtq.probe", check, "--file", path]
    # The root file system is read-only: the health file's directory is a volume of its own.
    mounts = [mount["mountPath"] for mount in container["volumeMounts"]]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert str(Path(path).parent) in mounts


def test_a_worker_rollout_starts_a_ready_worker_before_it_stops_one() -> None:
    (deployment,) = manifests(WORKER_MANIFEST)
    assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}


# Redis as the recipes configure it, on a real server, read by the configuration guard


def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


def compose_redis_flags() -> list[str]:
    command = compose()["services"]["redis"]["command"]
    assert command[0] == "redis-server"
    return command[1:]


def kubernetes_redis_flags() -> list[str]:
    """The ConfigMap's redis.conf as command-line flags (`--key value`, as redis-server reads a
    config line), less `dir`: the test's server keeps its files in a directory of its own."""
    (config,) = [document for document in manifests(REDIS_MANIFEST) if document["kind"] == "ConfigMap"]
    flags = []
    for line in config["data"]["redis.conf"].splitlines():
        key, _, value = line.strip().partition(" ")
        if key and not key.startswith("#") and key != "dir":
            flags += [f"--{key}", value]
    return flags


@pytest.fixture
def recipe_redis(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[RedisProcess]:
    """A real redis-server with a recipe's configuration (its flags override the test server's
    `--save '' --appendonly no`, so the server persists only as the recipe says)."""
    server = RedisProcess(*request.param(), directory=str(tmp_path)).start()
    yield server
    server.stop()


@pytest.mark.parametrize(
    "recipe_redis",
    [compose_redis_flags, kubernetes_redis_flags],
    ids=["compose", "kubernetes"],
    indirect=True,
)
def test_the_recipes_redis_is_what_the_guard_wants(recipe_redis: RedisProcess) -> None:
    client = redis.Redis.from_url(recipe_redis.url, decode_responses=True)
    try:
        assert client.config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}
        assert client.config_get("appendonly") == {"appendonly": "yes"}
        assert findings(read_configs(client)) == []
    finally:
        client.close()


# Docker


def dockerfile() -> DockerfileParser:
    parser = DockerfileParser(path=str(DOCKERFILE.parent), cache_content=True)
    parser.content = DOCKERFILE.read_text()
    return parser


def instructions(name: str) -> list[str]:
    return [item["value"] for item in dockerfile().structure if item["instruction"] == name]


def build_context() -> Path:
    build = compose()["x-app"]["build"]
    assert (COMPOSE.parent / build["context"] / build["dockerfile"]).resolve() == DOCKERFILE
    return (COMPOSE.parent / build["context"]).resolve()


def interpolate(value: str, variables: dict[str, str]) -> str:
    """Compose's `${NAME}`, `${NAME:-default}` and `${NAME:?error}` (refused if NAME is unset)."""

    def one(match: re.Match[str]) -> str:
        name, kind, rest = match.group(1), match.group(2), match.group(3)
        if variables.get(name):
            return variables[name]
        assert kind != ":?", f"compose refuses to start without {name}: {rest}"
        return rest or ""

    return re.sub(r"\$\{(\w+)(:[-?])?([^}]*)\}", one, value)


def seconds(duration: str) -> float:
    """A compose duration: "15s", "1m30s", "500ms"."""
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h)", duration)
    assert "".join(number + unit for number, unit in parts) == duration, duration
    return sum(float(number) * units[unit] for number, unit in parts)


def test_the_compose_worker_runs_the_worker_and_gets_its_graceful_shutdown(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    services = compose()["services"]
    assert {"redis", "web", "worker", "migrate"} <= set(services)
    worker = services["worker"]
    args = worker_args(worker["command"])
    timeout = worker_options(args)["shutdown_timeout"]
    if timeout is None:
        timeout = production_shutdown_timeout(monkeypatch)
    assert worker["stop_signal"] == "SIGTERM"
    assert seconds(worker["stop_grace_period"]) == grace_seconds(timeout)
    assert worker["healthcheck"]["test"] == [
        "CMD",
        *("python", "-m", "django_rtq.probe", "live", "--file", health_file(args)),
    ]
    # One image for the web servers and the workers, migrated before either starts.
    assert worker["build"] == services["web"]["build"] == services["migrate"]["build"]
    for name in ("web", "worker"):
        assert services[name]["depends_on"]["migrate"] == {"condition": "service_completed_successfully"}


def test_the_dockerfile_copies_what_it_builds() -> None:
    context = build_context()
    for value in instructions("COPY"):
        *sources, _ = shlex.split(value)
        for source in sources:
            assert (context / source).exists(), f"COPY {source}: not in the build context"


@pytest.fixture
def image_tree(tmp_path: Path) -> Path:
    """The image's files as the Dockerfile's COPY lays them out, under tmp_path (/src, /app)."""
    context = build_context()
    for value in instructions("COPY"):
        *sources, destination = shlex.split(value)
        target = tmp_path / destination.lstrip("/")
        for source in sources:
            path = context / source
            into = target / path.name if destination.endswith("/") else target
            into.parent.mkdir(parents=True, exist_ok=True)
            if path.is_dir():
                shutil.copytree(path, into, dirs_exist_ok=True)
            else:
                shutil.copy(path, into)
    return tmp_path


def image_environment(tree: Path, **extra: str) -> dict[str, str]:
    """The Dockerfile's ENV, with `python` this test's interpreter and django-rtq the one COPY
    put in /src (which the image installs)."""
    shims = tree / "shims"
    shims.mkdir(exist_ok=True)
    python = shims / "python"
    python.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} "$@"\n')
    python.chmod(0o755)
    environment = {key: value for key, value in os.environ.items() if not key.startswith("DJANGO_")}
    environment.update(dockerfile().envs)
    environment.update(extra)
    environment["PATH"] = f"{shims}{os.pathsep}{environment['PATH']}"
    environment["PYTHONPATH"] = str(tree / "src")
    return environment


def workdir(tree: Path) -> Path:
    (path,) = instructions("WORKDIR")
    return tree / path.lstrip("/")


def test_the_dockerfiles_build_steps_run(image_tree: Path) -> None:
    """Every RUN step that runs the project (collectstatic) runs, with the image's settings, on
    its files as COPY lays them out. The pip install needs the network: docs/deploying.md."""
    steps = [value for value in instructions("RUN") if "manage.py" in value]
    assert steps
    for step in steps:
        done = subprocess.run(
            ["sh", "-c", step],
            cwd=workdir(image_tree),
            env=image_environment(image_tree),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stdout + done.stderr
    collected = workdir(image_tree) / "staticfiles"
    assert (collected / "admin" / "css" / "base.css").is_file()
    assert (collected / "django_rtq" / "rtq.css").is_file()


@pytest.mark.parametrize("recipe_redis", [compose_redis_flags], ids=["compose"], indirect=True)
def test_check_deploy_passes_with_the_compose_settings(image_tree: Path, recipe_redis: RedisProcess) -> None:
    """The migrate service's `check --deploy`, with the compose's environment (Redis: the
    compose's configuration, on a port of the test's), finds nothing, not even a warning."""
    migrate = compose()["services"]["migrate"]["command"]
    assert migrate[:2] == ["sh", "-c"]
    (check,) = [part.strip() for part in migrate[2].split("&&") if "check --deploy" in part]
    variables = {"DJANGO_SECRET_KEY": secrets.token_urlsafe(50), "POSTGRES_PASSWORD": "unused-by-check"}
    environment = {
        name: interpolate(str(value), variables) for name, value in compose()["x-app"]["environment"].items()
    }
    environment["RTQ_REDIS_URL"] = recipe_redis.url
    done = subprocess.run(
        [*shlex.split(check), "--fail-level", "WARNING"],
        cwd=workdir(image_tree),
        env=image_environment(image_tree, **environment),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "System check identified no issues" in done.stdout


# The docs


def test_the_docs_quote_the_recipes_as_they_are() -> None:
    """Each block docs/deploying.md quotes from a file of deploy/ (the block after a link to
    it) is, line by line (indented as may be), in that file."""
    docs = (ROOT / "docs" / "deploying.md").read_text()
    quotes = re.findall(r"\]\(\.\./(deploy/[^)]+)\)(?:(?!\n\n).)*?:\n\n```\w*\n(.*?)```", docs, re.DOTALL)
    assert {path for path, _ in quotes} >= {
        "deploy/systemd/rtq-worker.service",
        "deploy/docker/compose.yaml",
        "deploy/kubernetes/worker.yaml",
        "deploy/kubernetes/redis.yaml",
    }
    for path, block in quotes:
        lines = {line.strip() for line in (ROOT / path).read_text().splitlines()}
        for line in block.splitlines():
            assert line.strip() in lines, f"docs/deploying.md quotes {path} with a line it lacks: {line!r}"
