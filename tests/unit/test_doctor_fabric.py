"""`lab doctor` on a host whose GPUs torch cannot use: a dead fabric manager is told from a CPU-only torch.

No GPU, NVSwitch or systemd here: the host's commands are canned (their outputs in the form nvidia-smi -q and
`systemctl is-active` print them: the Fabric section's State line, one unit state a line) and given to the
doctor's reader, which is the doctor's own code from there on; the real command runner runs fake executables.
The CUDA error in the first tests is the one torch prints on an NVSwitch node with the fabric manager down.
"""

from __future__ import annotations

import pytest

from lab.machine.health import doctor_torch, fabric_manager
from lab.run.cluster import nvml

ERROR_802 = "CUDA error 802: system not yet initialized"
NOT_INSTALLED = (127, "systemctl: command not found")


def smi_q(state: str, gpus: int = 8, driver: str = "550.54.15") -> str:
    """nvidia-smi -q's lines the reader looks at, for `gpus` GPUs in fabric state `state`."""
    gpu = (
        "GPU 00000000:{bus:02X}:00.0\n    Product Name                          : NVIDIA H100 80GB HBM3\n"
        "    Fabric\n        State                             : {state}\n"
        "        Status                            : N/A\n    Processes                             : None\n"
    )
    return (
        f"==============NVSMI LOG==============\n\nDriver Version                            : {driver}\n"
        f"CUDA Version                              : 12.4\n\nAttached GPUs                             : {gpus}\n"
        + "".join(gpu.format(bus=0x18 + i, state=state) for i in range(gpus))
    )


class canned:
    """A command runner that answers from `outputs` (keyed by the command's first word) and records each call."""

    def __init__(self, outputs: dict[str, tuple[int, str]]) -> None:
        self.outputs = outputs
        self.calls: list[list[str]] = []

    def __call__(self, argv: list[str]) -> tuple[int, str]:
        self.calls.append(argv)
        return self.outputs.get(argv[0], (127, f"{argv[0]}: command not found"))


def node(tmp_path, smi: str | None, systemctl: tuple[int, str], switches: int = 0):
    """The fabric facts of a node: nvidia-smi -q's output, systemctl's answer, NVSwitch device files in /dev."""
    dev = tmp_path / "dev"
    dev.mkdir()
    for i in range(switches):
        (dev / f"nvidia-nvswitch{i}").touch()
    run = canned(
        {"nvidia-smi": (0, smi) if smi is not None else (127, "nvidia-smi: command not found"), "systemctl": systemctl}
    )
    return lambda: fabric_manager.read(run, dev=dev)


def test_an_nvswitch_node_with_the_fabric_manager_inactive_says_start_it_not_install_torch(tmp_path):
    check, facts = doctor_torch.check_unusable_gpus(
        "12.8", ERROR_802, node(tmp_path, smi_q("In Progress"), (3, "inactive\n"), switches=4)
    )
    assert check.verdict == "failed"
    assert check.detail.startswith(
        "torch (CUDA build 12.8) cannot start CUDA: CUDA error 802: system not yet "
        "initialized; this is an NVSwitch system ("
    )
    assert "nvidia-nvswitch0 exists) and nvidia-fabricmanager is inactive" in check.detail
    assert check.fix.startswith(
        "sudo systemctl start nvidia-fabricmanager (its package must be the driver's version, 550.54.15;"
    )
    assert "install" not in check.line().replace("must be", "")  # no torch to install: the manager is the cause
    assert facts["fabric"]["manager"] == "inactive" and facts["fabric"]["states"] == ["In Progress"] * 8


def test_without_device_files_the_fabric_state_in_nvidia_smi_shows_the_switches(tmp_path):
    # Inside a container /dev/nvidia-nvswitch* are usually absent; nvidia-smi -q still shows the fabric state.
    check, _ = doctor_torch.check_unusable_gpus(
        "12.8", ERROR_802, node(tmp_path, smi_q("Not Started"), (3, "failed\n"))
    )
    assert (
        "NVSwitch system (nvidia-smi -q: fabric state Not Started) and nvidia-fabricmanager is failed" in check.detail
    )
    assert check.fix.startswith("sudo systemctl start nvidia-fabricmanager")
    # No switch seen at all (nvidia-smi missing, no device files), yet error 802 and the manager inactive.
    bare = tmp_path / "bare"
    bare.mkdir()
    check, _ = doctor_torch.check_unusable_gpus("12.8", ERROR_802, node(bare, None, (3, "inactive\n")))
    assert "error 802 is the fabric's and nvidia-fabricmanager is inactive" in check.detail


def test_where_systemd_cannot_be_asked_the_doctor_says_so_and_where_to_look(tmp_path):
    no_systemd = (1, "System has not been booted with systemd as init system (PID 1). Can't operate.\n")
    check, _ = doctor_torch.check_unusable_gpus("12.8", ERROR_802, node(tmp_path, smi_q("In Progress"), no_systemd))
    assert "the fabric manager's state cannot be read here (systemctl: System has not been booted" in check.detail
    assert check.fix.startswith(
        "on the host (not in a container): systemctl status nvidia-fabricmanager; if it is "
        "not active, sudo systemctl start nvidia-fabricmanager"
    )
    # Error 802 alone names the fabric manager too: nvidia-smi missing, no device files, no systemctl.
    bare = tmp_path / "bare"
    bare.mkdir()
    check, _ = doctor_torch.check_unusable_gpus("12.8", ERROR_802, node(bare, None, NOT_INSTALLED))
    assert "error 802 is the fabric's, and the fabric manager's state cannot be read here" in check.detail


def test_a_cpu_build_of_torch_is_told_to_install_a_cuda_build_without_asking_the_host(tmp_path):
    def never() -> fabric_manager.Fabric:
        raise AssertionError("a CPU build needs no fabric facts")

    check, facts = doctor_torch.check_unusable_gpus(None, "", never)
    assert check.line() == (
        "failed  devices    NVIDIA devices are present but this torch is a CPU build; install a "
        "CUDA build of torch that matches the driver (or use the lab image)"
    )
    assert facts == {}


@pytest.mark.parametrize(
    "smi, systemctl, switches",
    [
        (smi_q("N/A", gpus=2), (3, "inactive\n"), 0),  # PCIe GPUs: no fabric, the manager is not needed
        (smi_q("Completed"), (0, "active\n"), 4),  # NVSwitch, manager up: the cause is elsewhere
    ],
)
def test_other_cuda_errors_get_cudas_words_and_the_usual_causes_not_the_fabric_manager(
    tmp_path, smi, systemctl, switches
):
    error = "CUDA error 35: CUDA driver version is insufficient for CUDA runtime version"
    check, _ = doctor_torch.check_unusable_gpus("12.8", error, node(tmp_path, smi, systemctl, switches))
    assert check.detail == f"torch (CUDA build 12.8) cannot start CUDA: {error}"
    assert "fabric" not in check.line() and "a newer driver or a torch built for the driver's CUDA" in check.fix


def test_the_doctor_asks_this_torch_why_cuda_failed_and_reads_the_fabric_then(tmp_path, monkeypatch):
    # The real torch here is a CUDA build on a host without a GPU: torch.cuda.init() really fails. The host's GPUs
    # are faked (NVML's answer), as are the fabric facts; check_torch is the doctor's own from there on.
    import torch

    if torch.version.cuda is None or torch.cuda.is_available():
        pytest.skip("needs a CUDA build of torch that cannot start CUDA (a CPU host)")
    monkeypatch.setattr(nvml, "host_has_gpus", lambda: True)
    error = doctor_torch.cuda_init_error(torch)
    assert error and "\n" not in error
    checks, facts = doctor_torch.check_torch(
        None, read_fabric=node(tmp_path, smi_q("In Progress"), (3, "inactive\n"), 4)
    )
    devices = next(c for c in checks if c.name == "devices")
    assert devices.verdict == "failed" and f"cannot start CUDA: {error}; this is an NVSwitch system" in devices.detail
    assert facts["fabric"]["nvswitch"].endswith("nvidia-nvswitch0 exists") and facts["cuda_error"] == error


def test_cudas_error_is_read_from_torchs_message():
    class FakeCuda:  # torch's RuntimeError text on a node with the manager down, as c10 words it
        @staticmethod
        def init():
            raise RuntimeError(
                "Unexpected error from cudaGetDeviceCount(). Did you run some cuda functions before "
                "calling NumCudaDevices() that might have already set an error? Error 802: system not "
                "yet initialized"
            )

    assert doctor_torch.cuda_init_error(type("FakeTorch", (), {"cuda": FakeCuda})) == ERROR_802


def test_the_real_runner_reads_fake_host_commands_on_path(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in (
        ("nvidia-smi", f"cat <<'EOF'\n{smi_q('In Progress', gpus=2)}EOF"),
        ("systemctl", "echo inactive; exit 3"),
    ):
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    fabric = fabric_manager.read(dev=tmp_path)
    assert (fabric.nvswitch, fabric.manager, fabric.driver) == (
        "nvidia-smi -q: fabric state In Progress",
        "inactive",
        "550.54.15",
    )
    assert fabric_manager.run_command(["no-such-tool-here"]) == (127, "no-such-tool-here: command not found")
