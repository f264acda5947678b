"""A workshop room's plan, its refusals, its hub configuration and its seats' container options, without starting
anything (tests/infra/test_room.py runs the real hub, proxy and seats).

DockerSpawner's options are checked against DockerSpawner's own traits and docker-py's own HostConfig, which
build and validate them the way they would for a real engine; no container is started here. A real seat
container would need the room's image (the jupyter stage with JupyterHub: a build of its own, minutes beyond the
room tests' budget) on the container test's private engine, which has no NVIDIA runtime to take the device
requests anyway: the GPU half of the options can only be exercised on a GPU server."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from lab.course.room import mig, plan_table
from lab.course.room import plan as room_plan
from lab.course.room.host import core_list
from lab.course.room.settings import RoomSettings
from lab.errors import LabError
from tests.conftest import PYTHON, ROOT

GIB = 2**30
DGX = room_plan.Host(tuple("01234567"), tuple(range(112)), 2048 * GIB)


def lab(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, "-m", "lab", *args], capture_output=True, text=True, timeout=120, cwd=ROOT)


def test_eight_gpus_make_four_seats_of_two_each_with_its_own_gpus_and_cores():
    room = room_plan.make_plan(DGX, seats=4)
    assert [s.devices for s in room.seats] == [("0", "1"), ("2", "3"), ("4", "5"), ("6", "7")]
    cores = [set(s.cpus) for s in room.seats]
    assert all(len(c) == 28 for c in cores) and set().union(*cores) == set(range(112))
    assert sum(s.memory_bytes for s in room.seats) <= DGX.memory_bytes - DGX.reserve_bytes
    assert room_plan.make_plan(DGX).names == ["seat1", "seat2", "seat3", "seat4"]  # 2 GPUs a seat by default


def test_a_seat_of_one_gpu_or_a_mig_instance_is_told_its_lessons_run_the_cpu_way():
    one = room_plan.make_plan(DGX, seats=8)
    assert all(len(s.devices) == 1 and "DDP needs a GPU per rank" in s.lessons() for s in one.seats)
    mig = room_plan.make_plan(room_plan.Host(("MIG-a", "MIG-b", "MIG-c"), tuple(range(12)), 256 * GIB))
    assert [s.devices for s in mig.seats] == [("MIG-a",), ("MIG-b",), ("MIG-c",)]  # one instance a seat
    assert all("NCCL cannot run DDP across MIG instances" in s.lessons() for s in mig.seats)
    assert "on its 2 GPUs (NCCL, GPU sizes)" in room_plan.make_plan(DGX, seats=4).seats[0].lessons()


def test_cpu_seats_share_cores_when_there_are_fewer_cores_than_seats():
    room = room_plan.make_plan(room_plan.Host((), (0, 1), 24 * GIB), seats=3)
    assert all(s.cpus == () and s.threads == 1 for s in room.seats)
    assert any("share 2 cores" in note for note in room.notes)
    pinned = room_plan.make_plan(room_plan.Host((), tuple(range(8)), 64 * GIB), seats=2)
    assert [s.cpus for s in pinned.seats] == [(0, 1, 2, 3), (4, 5, 6, 7)]


@pytest.mark.parametrize(
    "args, says",
    [
        (
            ["--gpus", "8", "--seats", "16", "--cores", "112", "--memory", "2048"],
            "split each GPU into 2 MIG slices (--mig-per-gpu 2",
        ),
        (
            ["--gpus", "8", "--seats", "60", "--cores", "112", "--memory", "2048"],
            "at most 56 seats of one MIG slice (--mig-per-gpu 7)",
        ),
        (
            ["--gpus", "8", "--mig-per-gpu", "2", "--seats", "17", "--cores", "112", "--memory", "2048"],
            "17 seats on 16 MIG slices: two seats would share a slice",
        ),
        (["--devices", "MIG-a,MIG-b", "--mig-per-gpu", "2", "--memory", "24"], "the devices are already named"),
        (["--gpus", "8", "--mig-per-gpu", "5", "--memory", "24"], "--mig-per-gpu: invalid choice: 5"),
        (
            ["--gpus", "8", "--gpus-per-seat", "3", "--seats", "3", "--cores", "112", "--memory", "2048"],
            "3 seats of 3 GPUs need 9; this host has 8",
        ),
        (["--gpus", "0", "--seats", "9", "--cores", "2", "--memory", "24"], "holds at most 7 seats of 3.0 GiB"),
        (["--gpus", "8", "--seats", "4", "--cores", "112", "--memory", "40"], "holds at most 3 seats of 11.0 GiB"),
        (["--gpus", "0", "--gpus-per-seat", "1", "--memory", "24"], "this host has no GPU"),
        (["--gpus", "0", "--prefix", "Seat", "--memory", "24"], "a seat's name is a system user name"),
    ],
)
def test_a_plan_the_host_cannot_hold_is_refused_in_one_line(args, says, tmp_path):
    done = lab("room", "plan", *args, "--json", str(tmp_path / "plan.json"))
    assert done.returncode == 2 and says in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    assert not (tmp_path / "plan.json").exists()


def test_the_plan_is_printed_and_written_for_serve(tmp_path):
    out = tmp_path / "plan.json"
    done = lab("room", "plan", "--gpus", "8", "--seats", "4", "--cores", "112", "--memory", "2048", "--json", str(out))
    assert done.returncode == 0, done.stderr
    assert "| seat1 | 0,1 | 0-27 | 460.8 GiB | 1-7 on its 2 GPUs (NCCL, GPU sizes) |" in done.stdout
    assert room_plan.load(out).names == ["seat1", "seat2", "seat3", "seat4"]


@pytest.mark.parametrize(
    "learners, args, seats, device",
    [
        (12, ["--mig-per-gpu", "2", "--seats", "12"], 12, "gpu0/mig1"),
        (16, ["--mig-per-gpu", "2"], 16, "gpu7/mig2"),
        (24, ["--mig-per-gpu", "3"], 24, "gpu7/mig3"),
    ],
)
def test_more_learners_than_gpus_are_planned_on_mig_slices_with_the_commands_that_make_them(
    learners, args, seats, device, tmp_path
):
    out = tmp_path / "plan.json"
    done = lab("room", "plan", "--gpus", "8", *args, "--cores", "112", "--memory", "2048", "--json", str(out))
    assert done.returncode == 0, done.stderr
    plan = room_plan.load(out)
    assert len(plan.seats) == seats == learners and device in [d for s in plan.seats for d in s.devices]
    assert all(len(s.devices) == 1 and "NCCL cannot run DDP across MIG instances" in s.lessons() for s in plan.seats)
    per_gpu = int(args[1])
    ids = ",".join([str(room_plan.MIG_SPLITS[per_gpu][0])] * per_gpu)
    assert f"sudo nvidia-smi mig -i 0,1,2,3,4,5,6,7 -cgi {ids} -C" in done.stdout
    assert f"host: 8 GPUs as {8 * per_gpu} MIG slices" in done.stdout
    # a slice that is only planned cannot be served: the seat would get a device that does not exist
    refused = lab("room", "serve", "--plan", str(out), "--room-dir", str(tmp_path / "room"))
    assert refused.returncode == 2 and "is a MIG slice planned, not made" in refused.stderr, refused.stderr
    assert not (tmp_path / "room").exists()


def test_a_host_whose_gpus_have_mig_slices_hands_out_their_uuids(tmp_path, monkeypatch):
    # A stand-in nvidia-smi (no GPU here): the listing's shape is `nvidia-smi -L`'s on a DGX H100 with MIG on
    fake = tmp_path / "bin" / "nvidia-smi"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\ncat <<'EOF'\n" + room_plan.EXAMPLE_LISTING + "EOF\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:/usr/bin:/bin")
    assert mig._host_devices(2) == ("MIG-11aa", "MIG-22bb", "1")
    assert [
        s.devices for s in room_plan.make_plan(room_plan.Host(("MIG-11aa", "MIG-22bb"), (0, 1), 64 * GIB)).seats
    ] == [
        ("MIG-11aa",),
        ("MIG-22bb",),
    ]
    fake.write_text("#!/bin/sh\nexit 9\n")  # a driver that fails to list: the GPUs by index, as NVML counts them
    assert mig._host_devices(2) == ("0", "1")


def test_an_edited_plan_that_gives_two_seats_one_gpu_is_refused_before_anything_starts(tmp_path):
    path = room_plan.save(room_plan.make_plan(DGX, seats=4), tmp_path / "plan.json")
    edited = json.loads(path.read_text())
    edited["seats"][1]["devices"] = ["1", "2"]  # seat2 now also holds seat1's GPU 1
    path.write_text(json.dumps(edited))
    with pytest.raises(LabError, match=r"plan.json: seats seat1 and seat2 both have GPU 1; each GPU belongs to one"):
        room_plan.load(path)
    done = lab("room", "serve", "--plan", str(path), "--room-dir", str(tmp_path / "room"))
    assert done.returncode == 2 and "seats seat1 and seat2 both have GPU 1" in done.stderr
    assert not (tmp_path / "room").exists()  # refused before the room's folder was made
    path.write_text("{not json")
    assert "not a room plan" in lab("room", "serve", "--plan", str(path)).stderr


def _configure(tmp_path: Path, **settings) -> object:
    from traitlets.config import Config

    from lab.course.room import hub

    room_plan.save(room_plan.make_plan(DGX, seats=4), tmp_path / "plan.json")
    RoomSettings(**settings).save(tmp_path)
    c = Config()
    hub.configure(c, tmp_path)
    return c


def test_the_hub_listens_on_loopback_admits_only_the_seats_and_culls_idle_ones(tmp_path):
    c = _configure(tmp_path, idle_timeout_seconds=1800)
    assert c.JupyterHub.bind_url == "http://127.0.0.1:8000" and c.JupyterHub.hub_bind_url.startswith("http://127.0.0.1")
    assert c.Authenticator.username_pattern == "^(instructor|seat1|seat2|seat3|seat4)$"
    assert c.Authenticator.admin_users == {"instructor"}
    assert c.NativeAuthenticator.open_signup is False  # a sign-up waits for the instructor
    culler = c.JupyterHub.services[0]
    assert culler["name"] == "idle-culler" and "--timeout=1800" in culler["command"]
    assert set(c.JupyterHub.load_roles[0]["scopes"]) >= {"list:users", "read:users:activity", "delete:servers"}
    assert c.JupyterHub.db_url == f"sqlite:///{tmp_path.resolve() / 'hub.sqlite'}"


def test_seat_containers_get_their_gpus_cores_memory_and_volume_as_dockerspawner_and_docker_take_them(tmp_path):
    docker = pytest.importorskip("docker")
    from dockerspawner import DockerSpawner

    from lab.course.room import hub

    c = _configure(tmp_path, spawner="docker", image="lab-hub:0.1.0")
    assert c.JupyterHub.spawner_class == "dockerspawner.DockerSpawner" and c.DockerSpawner.network_name == "lab-room"
    room = room_plan.load(tmp_path / "plan.json")
    options = hub.docker_options(room.seat("seat2"), RoomSettings(spawner="docker"))
    # the hub's user, as far as DockerSpawner's names for the container and volume read it
    spawner = DockerSpawner(user=SimpleNamespace(name="seat2", id=2, url="/user/seat2/"))
    for trait, value in options.items():  # DockerSpawner's own traits, validated as it validates them
        assert spawner.has_trait(trait), trait
        setattr(spawner, trait, value)
    assert spawner.mem_limit == room.seat("seat2").memory_bytes and spawner.cpu_limit == 28.0
    assert spawner.volumes == {"lab-room-seat2": "/lab/seat"}
    assert spawner.environment["LAB_SEAT"] == "seat2" and spawner.environment["CUDA_VISIBLE_DEVICES"] == "0,1"
    # paths of the hub's host are not the container's: the image's own PATH and JupyterLab settings stay
    assert not {"PATH", "JUPYTER_CONFIG_PATH"} & set(spawner.environment), spawner.environment
    # the host config as DockerSpawner hands it to docker-py, which turns it into the engine's API fields
    client = docker.APIClient(base_url="unix:///nonexistent.sock", version="1.44")
    made = client.create_host_config(mem_limit=spawner.mem_limit, **spawner.extra_host_config)
    assert made["DeviceRequests"] == [
        {"Driver": "nvidia", "Count": 0, "DeviceIDs": ["2", "3"], "Capabilities": [["gpu"]], "Options": {}}
    ]
    assert made["CpusetCpus"] == "28-55" and made["Memory"] == room.seat("seat2").memory_bytes
    assert {u["Name"]: u["Hard"] for u in made["Ulimits"]} == {"memlock": -1, "stack": 67108864}  # NCCL's
    capped = hub.docker_options(room.seat("seat2"), RoomSettings(spawner="docker", memlock=8 * 2**20))
    assert capped["extra_host_config"]["ulimits"][0] == {"Name": "memlock", "Soft": 8 * 2**20, "Hard": 8 * 2**20}


def test_a_slurm_room_asks_slurm_for_each_seats_gpus(tmp_path):
    pytest.importorskip("batchspawner")
    c = _configure(tmp_path, spawner="slurm", slurm_partition="gpu", slurm_account="course42", slurm_qos="normal")
    assert c.JupyterHub.spawner_class == "batchspawner.SlurmSpawner" and c.SlurmSpawner.req_partition == "gpu"
    assert c.SlurmSpawner.req_account == "course42" and c.SlurmSpawner.req_qos == "normal"  # a production cluster's


def test_lesson_checks_are_recorded_with_the_seat(tmp_path, monkeypatch):
    from lab.course.teaching import lesson

    monkeypatch.setenv("LAB_SEAT", "seat7")
    monkeypatch.delenv("LAB_PUSHGATEWAY", raising=False)
    folder = lesson.output_dir("01-demo", root=tmp_path)
    lesson.expect(True, "it held")
    with pytest.raises(lesson.NotWhatYouShouldSee):
        lesson.expect(False, "it did not")
    record = json.loads((folder / "checks.json").read_text())
    assert record["seat"] == "seat7" and record["counts"] == {"held": 1, "failed": 1}
    assert [c["verdict"] for c in record["checks"]] == ["held", "failed"] and record["verdict"] == "failed"
    lesson.output_dir("01-demo", root=tmp_path)  # the lesson again: a fresh record
    assert json.loads((folder / "checks.json").read_text())["checks"] == []


def test_the_guides_room_table_is_what_lab_room_plan_prints(tmp_path):
    """docs/workshop.md's "How many seats" table: each row's plan made by the command it names, and compared."""
    guide = (ROOT / "docs" / "workshop.md").read_text()
    section = guide.split("### How many seats", 1)[1].split("\n#", 1)[0]
    base = re.search(r"`\.venv/bin/lab room plan ([^`]+)` and:", section)
    assert base, "the section no longer names the command its rows add to"
    rows = [line for line in section.splitlines() if re.match(r"^\| \d+ \| `", line)]
    assert {int(r.split("|")[1]) for r in rows} == {8, 12, 16, 24}, "the guide plans 8, 12, 16 and 24 learners"
    for row in rows:
        learners, more, seats, seat1, lessons, checks = (cell.strip() for cell in row.strip("|").split("|")[:6])
        out = tmp_path / f"{learners}-{seats}.json"
        args = ["room", "plan", *base[1].split(), *more.strip("`").split(), "--json", str(out)]
        done = lab(*args)
        assert done.returncode == 0, done.stderr
        plan = room_plan.load(out)
        first = plan.seats[0]
        devices = f"GPUs {first.cuda_visible_devices}" if len(first.devices) > 1 else first.cuda_visible_devices
        devices = f"GPU {devices}" if devices.isdigit() else devices
        printed = f"{devices}, cores {core_list(first.cpus)}, {first.memory_bytes / GIB:.1f} GiB"
        assert (len(plan.seats), printed) == (int(seats), seat1), row
        assert plan.lessons(first).startswith(lessons), (row, plan.lessons(first))
        # every seat's multi-rank checks on GPUs, with the wait the plan prints when the whole class checks at once
        assert all(plan.multi_rank(s).startswith("on ") for s in plan.seats), row
        where, _, wait = checks.partition(": the last of ")
        assert plan.multi_rank(first) == where, row
        if wait:
            longest, _ = plan_table.queue_waits(len(plan.seats), len(plan.queue), plan.check_seconds)
            assert wait == f"{seats} waits ~{longest:.0f} s", row
            assert f"{seats} seats checking at once: the last waits ~{longest:.0f} s" in done.stdout, row


def test_the_answers_are_closed_to_all_but_their_owner_and_left_out_of_a_seats_docs(tmp_path, monkeypatch):
    """On a copy of the layout (the checkout's own files keep their modes here): every solution, its compiled copy,
    docs/answers.md and .git lose their group and others' access, the starters and the other docs keep theirs; a
    seat's copy of docs/ has no answers.md. tests/infra/test_room.py tries to read them as a seat, for real."""
    from lab.course.room import answers, seats

    checkout = tmp_path / "checkout"
    exercises = checkout / "lab" / "course" / "exercises"
    for path in (
        exercises / "convert" / "solution.py",
        exercises / "convert" / "starter.py",
        exercises / "convert" / "__pycache__" / "solution.cpython-311.pyc",
        checkout / "docs" / "answers.md",
        checkout / "docs" / "glossary.md",
        checkout / "notebooks" / "01_baseline_and_ddp.py",
    ):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("# x\n")
        path.chmod(0o644)
    (checkout / ".git").mkdir(mode=0o755)
    (checkout / ".git").chmod(0o755)
    monkeypatch.setattr(answers, "EXERCISES", exercises)
    monkeypatch.setattr(seats, "CHECKOUT", checkout)
    monkeypatch.delenv(seats.LESSONS_ENV, raising=False)

    closed = answers.close()
    mode = {p.relative_to(checkout).as_posix(): p.stat().st_mode & 0o777 for p in checkout.rglob("*") if p.is_file()}
    assert mode == {
        "lab/course/exercises/convert/solution.py": 0o600,
        "lab/course/exercises/convert/__pycache__/solution.cpython-311.pyc": 0o600,
        "docs/answers.md": 0o600,
        "lab/course/exercises/convert/starter.py": 0o644,
        "docs/glossary.md": 0o644,
        "notebooks/01_baseline_and_ddp.py": 0o644,
    }
    assert (checkout / ".git").stat().st_mode & 0o777 == 0o700 and len(closed) == 4
    assert answers.said(closed).startswith("the answers: 3 files and the git history closed")
    assert answers.close() == [] and "closed to the seats already" in answers.said([])

    home = tmp_path / "home"
    seats.copy_lessons(home, checkout / "notebooks")
    assert (home / "docs" / "glossary.md").exists() and not (home / "docs" / "answers.md").exists()


def test_closing_answers_another_user_owns_is_refused_in_one_line(monkeypatch, capsys):
    """chmod of another user's file raises PermissionError: one line naming the file, exit 2, no traceback."""
    from lab.course.room import answers

    def not_ours() -> list[Path]:
        raise PermissionError(1, "Operation not permitted", "/opt/lab/docs/answers.md")

    monkeypatch.setattr(answers, "close", not_ours)
    assert answers.main() == 2
    said = capsys.readouterr().err.strip().splitlines()
    assert said == ["lab.course.room.answers: /opt/lab/docs/answers.md is not this user's to close: run it as root"]


def test_an_instructor_seat_is_one_more_seat_with_no_gpu_and_the_admin_may_start_it(tmp_path, monkeypatch):
    from tornado import web

    from lab.course.room import hub, seats

    monkeypatch.setattr(seats, "prepare_home", lambda name: tmp_path / name)  # its system user: lab room serve's

    room = room_plan.make_plan(DGX, seats=4, instructor=room_plan.INSTRUCTOR)
    assert room.names == ["seat1", "seat2", "seat3", "seat4", "instructor"]
    assert room.seat("instructor").devices == () and room.seat("seat4").devices == ("6", "7")
    assert len({s.memory_bytes for s in room.seats}) == 1  # a share like any seat's, of 5
    assert "| instructor | none |" in plan_table.table(room)
    # planned slices: the command that plans the room again with their UUIDs keeps its learners and its options
    sliced = room_plan.make_plan(
        room_plan.Host(room_plan.planned_slices(4, 7) + ("4", "5", "6", "7"), tuple(range(112)), 2048 * GIB),
        seats=24,
        queue_gpus=4,
        instructor=room_plan.INSTRUCTOR,
    )
    assert "lab room plan --seats 24 --queue-gpus 4 --instructor-seat   #" in plan_table.table(sliced)
    assert RoomSettings().admin == room_plan.INSTRUCTOR  # the hub's admin is the seat's user
    for plan in (room, room_plan.make_plan(DGX, seats=4)):
        spawner = SimpleNamespace(
            user=SimpleNamespace(name="instructor"), environment={}, cmd=["jupyterhub-singleuser"]
        )
        if "instructor" in plan.names:
            hub.before_spawn(spawner, plan, RoomSettings(spawner="slurm"))  # its server, as any seat's
            assert spawner.environment["LAB_SEAT"] == "instructor"
        else:
            with pytest.raises(web.HTTPError, match="only in a room planned with --instructor-seat"):
                hub.before_spawn(spawner, plan, RoomSettings(spawner="slurm"))
