"""A workshop room for real: `make room` (lab room serve) starts JupyterHub with the real configurable-http-proxy
and three seats on this CPU machine, each a system user of its own, over HTTPS with the certificate the room made
for the day (requests, websocket-client and chromium trust that one certificate, as a learner who compared its
fingerprint); learners sign up, the instructor authorizes
them, each logs in and gets a token through the hub's REST API; lesson 1 runs in each seat's own kernel, three
at once; a headless chromium logs in as a seat; the idle culler stops the idle seats; stopping the room stops
every process it started. Nothing is mocked: the hub's proxy, NativeAuthenticator, LocalProcessSpawner and the
seats' JupyterLab servers and kernels are the real ones.

Needs root (useradd; the hub starts each seat as its user), npm's configurable-http-proxy (`make room-proxy`)
and Debian's chromium; it skips without them, saying why, and fails instead where CI=true. The seats are
planned as if this host had 6 GPUs (`--gpus 6`: CUDA_VISIBLE_DEVICES 0,1 / 2,3 / 4,5 in the seats; torch sees no
GPU here, so the lessons run the CPU way, as on a real 1-GPU seat) and 48 GiB (the plan's memory floor with 2
GPUs a seat is 11 GiB; the local spawner does not enforce memory limits).

The seats' users (rt1, rt2, rt3) are made for the test and deleted after it. The seats must reach this venv's
Python and the checkout: where a folder on the way is closed to other users (a home directory, a mktemp folder),
the test opens it for search only (o+x) and closes it again after.
"""

from __future__ import annotations

import json
import os
import pwd
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import requests

from lab.course.room import tls
from lab.course.teaching.lesson import free_ports
from tests.conftest import ROOT
from tests.infra import hub_client as hub

PREFIX = "rt"
SEATS = [f"{PREFIX}{i}" for i in (1, 2, 3)]
PASSWORDS = {name: f"{name}-learner-passphrase" for name in SEATS}
# Short, for the culler's test; longer than lesson 1's longest silence on a loaded machine (two test workers at
# once: a torchrun job's start can print nothing for 20 s, and a busy kernel that prints nothing counts as idle)
IDLE_SECONDS = 45
AS_DOCUMENTED = "make room SEATS=3"  # README.md and docs/workshop.md
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CA_BUNDLES = ("REQUESTS_CA_BUNDLE", "WEBSOCKET_CLIENT_CA_BUNDLE")  # whom requests and websocket-client trust
PROXY = Path(sys.prefix) / "room-proxy" / "node_modules" / ".bin" / "configurable-http-proxy"
LESSON = "notebooks/01_baseline_and_ddp.ipynb"


def _skip_or_fail(why: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"{why} (CI=true: the room's test must run)", pytrace=False)
    pytest.skip(why)


def _open_for_search(paths: list[Path]) -> list[tuple[Path, int]]:
    """o+x on every folder on the way to `paths` that lacks it; what was changed, to put back."""
    changed = []
    for path in paths:
        for folder in reversed(path.resolve().parents):
            mode = folder.stat().st_mode
            if not mode & stat.S_IXOTH and (folder, stat.S_IMODE(mode)) not in changed:
                changed.append((folder, stat.S_IMODE(mode)))
                folder.chmod(stat.S_IMODE(mode) | stat.S_IXOTH)
    return changed


def _remove_seats() -> None:
    from lab.course.room import seats
    from lab.course.room.serve import stop_user_processes

    for name in SEATS:
        if seats.made_by_a_room(name):
            stop_user_processes(name)
            seats.remove_user(name)


def _processes_of(names: list[str]) -> list[str]:
    uids = {pwd.getpwnam(n).pw_uid: n for n in names if seats_exist(n)}
    found = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            text = status.read_text()
        except OSError:
            continue
        uid = int(next(line for line in text.splitlines() if line.startswith("Uid:")).split()[1])
        if uid in uids:
            found.append(f"{uids[uid]}: {(status.parent / 'cmdline').read_bytes()[:120]!r}")
    return found


def seats_exist(name: str) -> bool:
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


def cannot_run() -> str | None:
    """Why this machine cannot serve the test's room, or None (tests/notebooks leaves lesson 1 to this test then)."""
    if os.geteuid() != 0 or not shutil.which("useradd"):
        return "the room's seats are system users: the test needs root and useradd"
    if not PROXY.exists():
        return f"configurable-http-proxy is not installed ({PROXY}): `make room-proxy` (npm) installs it"
    return None


@pytest.fixture(scope="module")
def room(tmp_path_factory):
    if cannot_run():
        _skip_or_fail(cannot_run())
    _remove_seats()  # a test run killed before its teardown leaves its users behind
    state = tmp_path_factory.mktemp("room")
    log = state.parent / "room.log"
    port = free_ports(3)  # the proxy's public port, the hub's, the proxy's API
    hub_port, api_port = port + 1, port + 2
    changed = _open_for_search([Path(sys.executable), ROOT / "lab"])
    args = (
        f"--prefix {PREFIX} --gpus 6 --memory 48 --room-dir {state} --port {port} --hub-port {hub_port} "
        f"--proxy-api-port {api_port} --idle-timeout {IDLE_SECONDS} --tls-self-signed"
    )
    # `make room` as the docs type it, with the test's own folder, ports and a short idle timeout
    with log.open("w") as out:
        proc = subprocess.Popen(
            [*shlex.split(AS_DOCUMENTED), f"ROOM_ARGS={args}"],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    base = f"https://127.0.0.1:{port}"  # the room over HTTPS, with the certificate it made for the day
    cert = state / tls.DAY_CERT
    trusted = {name: os.environ.get(name) for name in CA_BUNDLES}
    try:
        deadline = time.monotonic() + 180
        while not cert.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        # requests and websocket-client trust that one certificate (as a learner who compared its fingerprint)
        os.environ.update(dict.fromkeys(CA_BUNDLES, str(cert)))
        hub.wait_until_serving(base, proc, log)
        admin, password = (state / "instructor-password").read_text().split()
        yield {
            "base": base,
            "state": state,
            "proc": proc,
            "log": log,
            "admin": admin,
            "password": password,
            "seats": {},
            "cert": cert,
        }
    finally:
        for name, value in trusted.items():
            os.environ.pop(name, None) if value is None else os.environ.__setitem__(name, value)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=60)
        _remove_seats()
        for folder, mode in reversed(changed):
            folder.chmod(mode)


def test_learners_sign_up_as_seats_and_get_in_once_the_instructor_authorizes_them(room):
    base = room["base"]
    assert (room["state"] / "instructor-password").stat().st_mode & 0o077 == 0  # the instructor's alone
    hub.sign_up(base, "intruder", "intruder-passphrase")
    for name in SEATS:
        assert hub.sign_up(base, name, PASSWORDS[name]).status_code == 200
    assert hub.log_in(base, SEATS[0], PASSWORDS[SEATS[0]]) is None  # signed up, not yet authorized
    assert hub.log_in(base, "intruder", "intruder-passphrase") is None
    assert hub.log_in(base, room["admin"], "a-guess-at-the-password") is None
    instructor = hub.log_in(base, room["admin"], room["password"])
    assert instructor is not None and instructor.landing == "/hub/authorize"  # the instructor runs no server
    # the instructor's authorization page lists the seats waiting, and no other name (the sign-up refused it)
    waiting = instructor.get(f"{base}/hub/authorize", timeout=30).text
    assert all(f"/hub/authorize/{name}" in waiting for name in SEATS) and "intruder" not in waiting
    for name in SEATS:
        assert instructor.get(f"{base}/hub/authorize/{name}", timeout=30).status_code == 200
    for name in SEATS:
        session = hub.log_in(base, name, PASSWORDS[name])
        assert session is not None and session.landing == "/hub/spawn", name  # a learner: on to their seat
        room["seats"][name] = hub.Seat(base, name, hub.token_for(base, session, name))
    # the hub's API refuses a request without a token
    assert requests.get(f"{base}/hub/api/users", timeout=30).status_code == 403
    assert requests.get(f"{base}/hub/api/users/{SEATS[0]}", timeout=30).status_code == 403


def test_each_seat_starts_its_server_with_its_own_gpus_user_and_runs_folder(room):
    seats = room["seats"]
    assert set(seats) == set(SEATS), "the sign-up test did not pass"
    for seat in seats.values():
        seat.start()
    expected = {"rt1": "0,1", "rt2": "2,3", "rt3": "4,5"}
    for name, seat in seats.items():
        shown = _json_line(
            seat.execute(
                "import json, os; print(json.dumps({'uid': os.getuid(), 'cwd': os.getcwd(), "
                "'env': {k: os.environ.get(k) for k in "
                "('CUDA_VISIBLE_DEVICES', 'LAB_SEAT', 'LAB_LESSON_RUNS', 'OMP_NUM_THREADS')}}))"
            )
        )
        home = pwd.getpwnam(name).pw_dir
        assert shown["uid"] == pwd.getpwnam(name).pw_uid
        assert shown["env"] == {
            "CUDA_VISIBLE_DEVICES": expected[name],
            "LAB_SEAT": name,
            "LAB_LESSON_RUNS": f"{home}/runs/lessons",
            "OMP_NUM_THREADS": "1",
        }
        assert stat.S_IMODE(os.stat(home).st_mode) == 0o700
        # the seat's own copy of the lessons: each listed once (the .ipynb; the paired .py is hidden)
        listing = seat.server("GET", "/contents/notebooks").json()["content"]
        names = sorted(item["name"] for item in listing)
        assert names == [f"{p.stem}.ipynb" for p in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.py"))], names


def _json_line(output: dict) -> dict:
    lines = [line for line in output["stdout"].splitlines() if line.startswith("{")]
    assert lines, output
    return json.loads(lines[-1])


def test_a_seat_cannot_reach_another_seats_server_api_or_files(room):
    a, b = room["seats"]["rt1"], room["seats"]["rt2"]
    assert a.server("GET", "/contents", user=b.name).status_code == 403
    assert a.hub("GET", f"/users/{b.name}").status_code in (403, 404)
    assert a.hub("POST", f"/users/{b.name}/server").status_code in (403, 404)
    home_b = pwd.getpwnam(b.name).pw_dir
    tried = a.execute(
        f"import pathlib\ntry:\n    print(sorted(pathlib.Path({home_b!r}).iterdir()))\n"
        f"except PermissionError as e:\n    print('refused', e.errno)\n"
        f"try:\n    print(open({home_b + '/notebooks/01_baseline_and_ddp.ipynb'!r}).read()[:20])\n"
        f"except PermissionError as e:\n    print('refused', e.errno)"
    )["stdout"]
    assert tried.split() == ["refused", "13", "refused", "13"], tried


# Run in a seat's kernel: which answers it can read (by path, or as a copy anywhere it can walk), whether the git
# history opens, and the files beside the answers it must read (so a refusal is about the answers, not the way).
SEEK_ANSWERS = """
import hashlib, json, os
answers, digests, roots, controls = json.loads({given!r})
sizes = set(digests.values())
found = {{"read": [], "copies": [], "history": "refused", "controls": []}}
for path in answers:
    try:
        open(path, "rb").read(1)
        found["read"].append(path)
    except PermissionError:
        pass
try:
    open(roots[0] + "/.git/HEAD").read()
    found["history"] = "readable"
except PermissionError:
    pass
except FileNotFoundError:
    found["history"] = "absent"
for top in roots:
    for folder, _, names in os.walk(top):
        for name in names:
            path = os.path.join(folder, name)
            try:
                if name.startswith("solution.") and name.endswith(".pyc"):
                    open(path, "rb").read(1)
                    found["copies"].append(path)
                elif os.path.getsize(path) in sizes and hashlib.sha256(open(path, "rb").read()).hexdigest() in digests:
                    found["copies"].append(path)
            except OSError:
                pass
for path in controls:
    open(path).read(1)
    found["controls"].append(path)
print(json.dumps(found))
"""


def test_a_seat_reads_no_answer_by_path_or_copy_and_the_files_beside_them(room):
    """Logged in as a seat (a kernel of its own server): no exercise's solution, docs/answers.md or the git history
    that holds them opens, and no copy of one is anywhere the seat can walk (the checkout, the venv, its home);
    the starters and the docs beside them open. The lesson test after this one grades each seat's convert exercise
    in its own kernel: the grader needs no solution."""
    import hashlib

    from lab.course.exercises import EXERCISES
    from lab.course.room import answers

    kept = answers.files()
    assert sum(p.name == "solution.py" for p in kept) == len(EXERCISES) and (ROOT / "docs" / "answers.md") in kept
    assert "the answers:" in room["log"].read_text()  # lab room serve closed them before the seats started
    seat = room["seats"]["rt2"]
    home = pwd.getpwnam(seat.name).pw_dir
    roots = [str(ROOT), home] + ([sys.prefix] if not Path(sys.prefix).is_relative_to(ROOT) else [])
    controls = [
        str(answers.EXERCISES / "convert" / "starter.py"),
        str(ROOT / "docs" / "glossary.md"),
        f"{home}/docs/glossary.md",
    ]
    digests = {hashlib.sha256(p.read_bytes()).hexdigest(): p.stat().st_size for p in kept}
    given = json.dumps([[str(p) for p in kept], digests, roots, controls])
    output = seat.execute(SEEK_ANSWERS.format(given=given), timeout=300)["stdout"]
    found = json.loads(output.strip().splitlines()[-1])
    assert found["controls"] == controls, found
    assert found["read"] == [] and found["copies"] == [], found
    assert found["history"] in ("refused", "absent"), found
    assert not (Path(home) / "docs" / "answers.md").exists()


def test_lesson_one_runs_in_three_seats_own_kernels_at_once(room):
    """Each seat runs lesson 1 as JupyterLab would (a session for the notebook, its cells in order) at the same
    time as the others; every check of the lesson holds, and each seat's runs land in its own home, recorded
    with its seat. The seats' peak memory (PSS, summed over each seat's processes) is printed for the docs."""
    seats = room["seats"]
    results: dict[str, object] = {}
    # The lesson ends with its "your turn" cell (the convert exercise): one seat has done it (the reference solution
    # where the lesson looks for its work), the others run the starter the cell copies, as a learner's first try.
    done = Path(pwd.getpwnam(SEATS[0]).pw_dir) / "exercises" / "convert.py"
    done.parent.mkdir(exist_ok=True)
    shutil.copyfile(ROOT / "lab" / "course" / "exercises" / "convert" / "solution.py", done)
    for path in (done.parent, done):
        shutil.chown(path, SEATS[0], SEATS[0])

    def run(seat: hub.Seat) -> None:
        try:
            results[seat.name] = seat.run_notebook(LESSON, timeout=600)
        except BaseException as exc:
            results[seat.name] = exc

    with hub.PeakMemory(list(seats)) as memory:
        started = time.monotonic()
        threads = [threading.Thread(target=run, args=(seat,)) for seat in seats.values()]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=900)
    wall = time.monotonic() - started
    print(
        f"lesson 1 in {len(seats)} seats at once: {wall:.0f} s; peak PSS per seat: "
        + ", ".join(f"{n} {v / 2**30:.2f} GiB" for n, v in sorted(memory.peaks.items()))
    )
    failures = {n: r for n, r in results.items() if isinstance(r, BaseException)}
    assert not failures, failures
    for name in seats:
        outputs = results[name]
        assert sum(o["stdout"].count("as expected: ") for o in outputs) == 1
        assert sum(o["displays"] for o in outputs) >= 2  # the comparison table and the loss curves
        folder = Path(pwd.getpwnam(name).pw_dir) / "runs" / "lessons" / "01-baseline-and-ddp"
        assert {p.name for p in folder.iterdir() if (p / "summary.json").exists()} == {"baseline", "ddp-2"}
        record = json.loads((folder / "checks.json").read_text())
        assert record["seat"] == name and record["counts"] == {"held": 1} and record["verdict"] == "held"
        assert json.loads((folder / "ddp-2" / "manifest.json").read_text())["seat"] == name
        assert all(p.owner() == name for p in folder.rglob("*"))
        record_path = folder.parent / "exercises" / "convert.json"
        said = "".join(o["stdout"] for o in outputs)[-3000:]
        assert record_path.exists(), f"{name}'s exercise cell recorded nothing; the lesson's last output:\n{said}"
        graded = json.loads(record_path.read_text())
        measured = {c["name"]: c.get("detail") for c in graded.get("checks", [])}
        failing = [c["name"] for c in graded.get("checks", []) if c["verdict"] != "held"]
        assert graded["seat"] == name and (graded["verdict"] == "held") == (name == SEATS[0]), measured
        if name != SEATS[0]:  # the starter is one process per rank, each reading everything
            assert "the model in DistributedDataParallel" in failing, measured


def test_room_status_shows_every_seat_with_lesson_one_passed(room, tmp_path):
    out = tmp_path / "status.json"
    shown = subprocess.run(
        [sys.executable, "-m", "lab", "room", "status", "--room-dir", str(room["state"]), "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert shown.returncode == 0, shown.stderr
    rows = {row["seat"]: row for row in json.loads(out.read_text())["seats"]}
    assert set(rows) == set(SEATS)
    for name, row in rows.items():
        assert row["lessons"]["01"] == "held 1/1", row
        assert all(row["lessons"][n] == "not run" for n in ("02", "03", "04", "05", "06", "07")), row
        assert row["run"]["status"] == "completed" and row["run"]["run_id"] in ("baseline", "ddp-2")
        assert f"| {name} | held 1/1 | not run |" in shown.stdout
        convert = row["exercises"].pop("convert")
        assert convert == "held" if name == SEATS[0] else convert.startswith("failed: "), convert
        assert set(row["exercises"].values()) == {"not run"}, row["exercises"]
    assert f"| {SEATS[0]} | held | not run |" in shown.stdout


def test_a_learner_logs_in_with_a_browser_and_lesson_one_opens_without_a_prompt(room):
    if CHROMIUM is None:
        _skip_or_fail("chromium is not installed (scripts/install-test-tools.sh installs Debian's)")
    from playwright.sync_api import sync_playwright

    name = "rt2"
    with sync_playwright() as p:
        # the browser trusts the room's certificate by its public key, and no other (chromium's pin)
        pin = f"--ignore-certificate-errors-spki-list={tls.spki_hash(room['cert'])}"
        browser = p.chromium.launch(
            executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", pin]
        )
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(f"{room['base']}/hub/login")
            page.fill("input[name=username]", name)
            page.fill("input[name=password]", PASSWORDS[name])
            page.click("input[type=submit], button[type=submit]")
            page.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=180_000)
            page.wait_for_timeout(3000)  # JupyterLab asks about the news a moment after it starts
            listed = page.locator(".jp-DirListing-itemName").all_inner_texts()
            text = page.inner_text("body")
            url = page.url
            shot = room["log"].parent / "room-browser.png"
            page.screenshot(path=str(shot))
        finally:
            browser.close()
    assert url.startswith("https://") and url.endswith(f"/user/{name}/lab/tree/{LESSON}"), url
    assert listed == [f"{p.stem}.ipynb" for p in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.py"))], listed
    assert "Lesson 1: the baseline and DDP at one global batch" in text
    assert "Python 3 (ipykernel)" in text
    assert "official Jupyter news" not in text, shot
    # the settings the seat's JupyterLab runs with: the lab's override is the default it serves
    seat = room["seats"][name]
    served = requests.get(
        f"{room['base']}/user/{name}/lab/api/settings/@jupyterlab/apputils-extension:notification",
        headers=seat.headers,
        timeout=30,
    ).json()
    assert served["schema"]["properties"]["fetchNews"]["default"] == "false", served
    assert not errors, errors


def test_the_idle_culler_stops_idle_seats(room):
    """rt1 and rt3 have been idle since their lessons ended (rt2 had the browser): the culler stops them within
    its timeout and one round of its checks. While the lessons ran, no seat was stopped: their kernels' output
    kept them active (the lesson test above would have failed)."""
    seats = room["seats"]
    idle = {"rt1", "rt3"}
    deadline = time.monotonic() + IDLE_SECONDS * 3 + 30
    while time.monotonic() < deadline:
        running = {n for n in idle if seats[n].hub("GET", f"/users/{n}").json().get("servers")}
        if not running:
            break
        time.sleep(1)
    assert not running, f"still running after {IDLE_SECONDS} s idle and more: {running}"
    assert all(f"Culling server {n}" in room["log"].read_text() for n in idle), room["log"].read_text()[-3000:]


def test_stopping_the_room_stops_everything_it_started(room):
    proc = room["proc"]
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(timeout=90)
    assert _processes_of(SEATS) == []
    with pytest.raises(requests.ConnectionError):
        requests.get(f"{room['base']}/hub/api", timeout=5)


def test_a_seat_name_that_is_someones_account_is_refused(tmp_path):
    """A seat reuses a system user an earlier room made, never an account of someone's: the room would run a
    learner as them, and stop their processes when it stops."""
    if cannot_run():
        _skip_or_fail(cannot_run())
    name = "rtz1"
    subprocess.run(["useradd", "--no-create-home", name], check=True)
    try:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "lab",
                "room",
                "serve",
                "--prefix",
                "rtz",
                "--seats",
                "1",
                "--room-dir",
                str(tmp_path / "room"),
            ],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=ROOT,
        )
        assert done.returncode == 2, done.stderr
        assert "seat rtz1: a system user of that name exists and was not made by lab room" in done.stderr
        assert not (tmp_path / "room").exists()
    finally:
        subprocess.run(["userdel", name], check=True)


def test_a_class_list_seats_each_learner_with_a_password_on_a_slip_and_nobody_signs_up(tmp_path):
    """`lab room serve --class FILE`: each learner a seat, an account made and authorized at the hub's start from
    the password's hash, the password only on the slips (root's alone); the learner logs in with the slip."""
    if cannot_run():
        _skip_or_fail(cannot_run())
    name = "rtc1"
    roster = tmp_path / "class.txt"
    roster.write_text("# the class of the day\nAda Lovelace\n")
    state = tmp_path / "room"
    port = free_ports(3)
    changed = _open_for_search([Path(sys.executable), ROOT / "lab"])
    command = [
        *(sys.executable, "-m", "lab", "room", "serve", "--prefix", "rtc", "--seats", "1", "--memory", "8"),
        *("--room-dir", str(state), "--port", str(port), "--hub-port", str(port + 1)),
        *("--proxy-api-port", str(port + 2), "--proxy", str(PROXY), "--class", str(roster)),
    ]
    log = tmp_path / "room.log"
    with log.open("w") as out:
        proc = subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        hub.wait_until_serving(base, proc, log)
        slips = state / "slips.html"
        assert slips.stat().st_mode & 0o077 == 0 and (state / "class.json").stat().st_mode & 0o077 == 0
        page = slips.read_text()
        assert "Ada Lovelace" in page and f"{base}/hub/login" in page and f"user <b>{name}</b>" in page
        password = page.split("password <b><code>")[1].split("</code>")[0]
        assert password not in (state / "class.json").read_text()  # the hub has its hash only
        assert f"the class: 1 learners seated; print their slips: {slips}" in log.read_text()
        assert hub.log_in(base, name, "a-guess-at-it") is None
        session = hub.log_in(base, name, password)
        assert session is not None and session.landing == "/hub/spawn"  # in, with no sign-up and no authorization
        hub.sign_up(base, name, "someone-elses-passphrase")  # the seat is taken: the slip's password still holds
        assert hub.log_in(base, name, "someone-elses-passphrase") is None and hub.log_in(base, name, password)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=60)
        from lab.course.room import seats

        if seats.made_by_a_room(name):
            seats.remove_user(name)
        for folder, mode in reversed(changed):
            folder.chmod(mode)
