"""`lab doctor`: one line per check, exit 1 when one fails, JSON for the Ansible preflight role."""

from __future__ import annotations

import json
import socket

import torch

from lab.machine.health import doctor
from tests.conftest import lab


def test_a_healthy_host_passes_with_one_line_per_check_and_json(tmp_path):
    proc = lab(
        "doctor",
        "--output-dir",
        str(tmp_path / "runs"),
        "--json",
        str(tmp_path / "doctor.json"),
        env={"NCCL_SOCKET_IFNAME": "lo", "GLOO_SOCKET_IFNAME": "lo"},
    )
    lines = proc.stdout.strip().splitlines()
    assert all(line.split()[0] in ("held", "not") for line in lines[:-1])  # held, or not applicable
    assert lines[-1].startswith("doctor: ") and "checks held or did not apply" in lines[-1]
    report = json.loads((tmp_path / "doctor.json").read_text())
    assert report["ok"] is True
    names = [c["name"] for c in report["checks"]]
    assert {"python", "torch", "devices", "gloo", "shm", "output", "network", "nccl-if", "gloo-if"} <= set(names)
    assert [c["line"] for c in report["checks"]] == lines[:-1]
    assert "lo" in report["facts"]["interfaces"]
    assert report["facts"]["gpu_count"] == (torch.cuda.device_count() if torch.cuda.is_available() else 0)
    assert not (tmp_path / "runs").exists()  # a check, not a set-up


def test_a_busy_port_and_a_missing_interface_fail_with_exit_1(tmp_path):
    with socket.socket() as busy:
        busy.bind(("", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = lab(
            "doctor",
            "--port",
            str(port),
            "--output-dir",
            str(tmp_path),
            "--json",
            "-",
            env={"NCCL_SOCKET_IFNAME": "=ib9", "GLOO_SOCKET_IFNAME": "lo,ib9"},
            check=False,
        )
    assert proc.returncode == 1
    report = json.loads(proc.stdout)  # --json -: JSON on stdout, the lines on stderr
    failed = {c["name"]: c["detail"] for c in report["checks"] if c["verdict"] == "failed"}
    assert failed.keys() == {"port", "nccl-if", "gloo-if"}
    assert failed["port"].startswith(f"{port} is in use")
    assert "NCCL_SOCKET_IFNAME==ib9 selects no interface" in failed["nccl-if"]
    assert "no interface ib9" in failed["gloo-if"]
    assert proc.stderr.strip().splitlines()[-1].startswith("doctor: 3 of ")


def test_bad_input_exits_2_with_one_line():
    proc = lab("doctor", "--port", "70000", check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "lab: error: --port: '70000' is out of range; ports are 1..65535, FIRST <= LAST"


def test_output_dir_and_shm_checks(tmp_path):
    read_only = tmp_path / "ro"
    read_only.mkdir(mode=0o500)
    assert doctor.check_output_dir(str(tmp_path / "new" / "runs")).verdict == "held"
    if not doctor.os.access(read_only, doctor.os.W_OK):  # root can write anywhere
        assert doctor.check_output_dir(str(read_only / "runs")).verdict == "failed"
    check, size = doctor.check_shm(min_bytes=1 << 62)
    assert check.verdict == "held" and "--ipc host" in check.line() and size > 0


def _fake_cc(folder):
    folder.mkdir()
    cc = folder / "cc"
    cc.write_text("#!/bin/sh\nexit 0\n")
    cc.chmod(0o755)
    return cc


def test_torch_compile_is_ready_with_a_c_compiler_on_path_and_python_h(tmp_path):
    cc, include = _fake_cc(tmp_path / "bin"), tmp_path / "include"
    include.mkdir()
    (include / "Python.h").write_text("/* the header */\n")
    check = doctor.check_compile({"PATH": str(tmp_path / "bin")}, include_dir=str(include))
    assert check.verdict == "held" and str(cc) in check.detail


def test_torch_compile_without_a_compiler_or_python_h_is_a_warning_naming_both_and_the_remedy(tmp_path):
    (tmp_path / "empty").mkdir()
    check = doctor.check_compile({"PATH": str(tmp_path / "empty")}, include_dir=str(tmp_path / "no-include"))
    assert check.verdict == "held" and check.name == "compile"
    assert "C compiler" in check.detail and "Python.h" in check.detail
    assert "apt-get install -y gcc python3." in check.fix and "-dev" in check.fix
    # $CC names the compiler when set; a missing $CC is not rescued by cc on PATH
    _fake_cc(tmp_path / "bin")
    assert (
        "C compiler"
        in doctor.check_compile(
            {"PATH": str(tmp_path / "bin"), "CC": "clang-99"}, include_dir=str(tmp_path / "no-include")
        ).detail
    )
    assert (
        "C compiler"
        not in doctor.check_compile(
            {"PATH": str(tmp_path / "empty"), "CC": str(tmp_path / "bin/cc")}, include_dir=str(tmp_path / "no-include")
        ).detail
    )
