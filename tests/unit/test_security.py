"""Security promises, checked where they live: the code, the shipped files, the README.

The running behaviour is proven elsewhere too: a pickled-code checkpoint and data file are refused
(test_checkpoint, test_data), the container's files belong to uid 1000 (infra/test_container).
"""

from __future__ import annotations

import ast
import re
import urllib.request

import torch
import yaml

from lab.run.cluster.dist import DistContext
from lab.run.config import MetricsConfig
from lab.run.observability import metrics
from tests.conftest import ROOT

SHIPPED = [
    ROOT / "compose.yaml",
    ROOT / "compose.cpu.yaml",
    ROOT / "images" / "Dockerfile",
    *sorted((ROOT / "playbooks").rglob("*.yml")),
    *sorted((ROOT / "playbooks").rglob("*.cfg")),
    *sorted((ROOT / "monitoring").rglob("*.yml")),
]


def test_every_torch_load_in_the_lab_is_weights_only():
    calls = []
    for path in (ROOT / "lab").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "load"
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "torch"
            ):
                flags = {k.arg: k.value for k in node.keywords}
                safe = isinstance(flags.get("weights_only"), ast.Constant) and flags["weights_only"].value is True
                calls.append((f"{path.relative_to(ROOT)}:{node.lineno}", safe))
    assert calls, "no torch.load found: the scan is broken"
    assert all(safe for _, safe in calls), [where for where, safe in calls if not safe]


def test_exporters_listen_on_loopback_unless_configured():
    assert MetricsConfig().bind_address == "127.0.0.1"
    ctx = DistContext(0, 0, 1, 1, 0, torch.device("cpu"), None)
    exporter = metrics.start(MetricsConfig(port_base=0), ctx, "r", {})
    assert exporter.endpoint is None  # metrics off by default: no port at all
    exporter = metrics.RankExporter(
        0, MetricsConfig().bind_address, {"run_id": "r", "rank": "0", "node": "n"}, torch.device("cpu"), {}
    )
    try:
        assert exporter.server.server_address[0] == "127.0.0.1"
        assert urllib.request.urlopen(exporter.endpoint, timeout=5).status == 200
    finally:
        exporter.close()


def test_the_image_runs_as_a_numeric_non_root_user():
    dockerfile = (ROOT / "images" / "Dockerfile").read_text()
    users = re.findall(r"^USER\s+(\S+)", dockerfile, re.MULTILINE)
    assert users and users[-1] not in ("root", "0"), users
    default_uid = re.search(r"^ARG LAB_UID=(\d+)", dockerfile, re.MULTILINE)
    assert users[-1] == "${LAB_UID}" and default_uid and int(default_uid.group(1)) != 0


class _AnyTags(yaml.SafeLoader):
    """compose's !reset / !override and Ansible's !vault: read the value under the tag."""


_AnyTags.add_multi_constructor(
    "!",
    lambda loader, suffix, node: (
        loader.construct_mapping(node)
        if isinstance(node, yaml.MappingNode)
        else loader.construct_sequence(node)
        if isinstance(node, yaml.SequenceNode)
        else loader.construct_scalar(node)
    ),
)

SECRET_KEY = re.compile(r"(password|passwd|secret|token|api_?key|private_?key)", re.IGNORECASE)


def _assignments(node, path=""):
    """(dotted key, scalar value) of every leaf of a YAML document."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _assignments(value, f"{path}.{key}" if path else str(key))
    elif isinstance(node, list):
        for item in node:
            yield from _assignments(item, path)
    else:
        yield path, node


def test_no_secret_ships_in_images_compose_playbooks_or_monitoring():
    found = []
    for path in SHIPPED:
        text = path.read_text()
        if path.suffix == ".yml" or path.suffix == ".yaml":
            for doc in yaml.load_all(text, Loader=_AnyTags):
                for key, value in _assignments(doc):
                    leaf = key.rsplit(".", 1)[-1]
                    # A secret-named key may only point somewhere (a vault, a variable, a file), never hold one.
                    if (
                        SECRET_KEY.search(leaf)
                        and isinstance(value, (str, int))
                        and str(value).strip()
                        and not re.fullmatch(r"\{\{.*\}\}|\$\{[A-Z_]+\}|/.*|lookup\(.*\)", str(value).strip())
                    ):
                        found.append(f"{path.relative_to(ROOT)}: {key}")
        for line_no, line in enumerate(text.splitlines(), 1):
            if (
                re.search(r"(PASSWORD|SECRET|TOKEN)[A-Z_]*\s*[:=]\s*\S", line)
                and not line.lstrip().startswith("#")
                and not re.search(r"\$\{[A-Z_]+\}\s*$|\{\{", line)
            ):
                found.append(f"{path.relative_to(ROOT)}:{line_no}: {line.strip()}")
            if re.search(r"-----BEGIN [A-Z ]*PRIVATE KEY-----", line):
                found.append(f"{path.relative_to(ROOT)}:{line_no}: a private key")
    assert not found, found


def test_ansible_keeps_host_key_checking_on():
    texts = {
        p.relative_to(ROOT): p.read_text()
        for p in [*(ROOT / "playbooks").rglob("*"), ROOT / "ansible.cfg"]
        if p.is_file()
    }
    for name, text in texts.items():
        assert not re.search(r"host_key_checking\s*[=:]\s*(false|no|0)", text, re.IGNORECASE), name
        assert not re.search(r"StrictHostKeyChecking\s*=?\s*no", text, re.IGNORECASE), name
        assert "UserKnownHostsFile=/dev/null" not in text, name


def test_the_docs_name_every_port_the_lab_opens():
    readme = (ROOT / "docs" / "reliability.md").read_text()
    section = readme[readme.index("## Ports") :]
    section = section[: section.index("\n## ", 1)]
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    # "ADDR:HOST_PORT:PORT", each part perhaps "${VAR:-default}": the host port's default is the one to name
    port = re.compile(r"^(?:\$\{[^}]*\}|[^:]*):(?:\$\{\w+:-(\d+)\}|(\d+)):\d+$")
    published = {
        int(next(g for g in port.match(str(p)).groups() if g))
        for svc in compose["services"].values()
        for p in svc.get("ports", [])
    }
    assert published, "compose publishes no port: the scan is broken"
    expected = published | {29400, 9500, 9100, 9400}  # rendezvous, first exporter, node and dcgm exporters
    missing = [port for port in sorted(expected) if str(port) not in section]
    assert not missing, f"docs/reliability.md '## Ports' does not name {missing}"
    assert "firewall" in section.lower()
