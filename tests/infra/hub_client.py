"""A learner's and an instructor's ways into a JupyterHub room, over HTTP as a browser would go (forms with their
_xsrf fields, cookies) and then the hub's REST API with a token, and a notebook run cell by cell in a seat's own
kernel over the Jupyter kernel protocol (the websocket JupyterLab itself uses). Used by tests/infra/test_room.py,
tests/infra/test_container.py (a DockerSpawner seat) and scripts/room-bench.py."""

from __future__ import annotations

import json
import pwd
import re
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests
import websocket


def wait_until_serving(base: str, serve: subprocess.Popen, log: Path, timeout: float = 180) -> None:
    """Until the hub at `base` answers its API; AssertionError, with the end of `log`, where `serve` (lab room
    serve) exits first or `timeout` seconds pass."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if requests.get(f"{base}/hub/api", timeout=2).status_code == 200:
                return
        except requests.ConnectionError:
            pass
        code = serve.poll()
        if code is not None or time.monotonic() > deadline:
            what = f"exited {code}" if code is not None else f"not serving after {timeout:.0f} s"
            raise AssertionError(f"lab room serve {what} ({log}):\n{log.read_text()[-4000:]}")
        time.sleep(0.5)


def _xsrf(session: requests.Session, url: str) -> str:
    page = session.get(url, timeout=30)
    page.raise_for_status()
    found = re.search(r'name="_xsrf" value="([^"]+)"', page.text)
    assert found, f"no _xsrf field on {url}"
    return found.group(1)


def sign_up(base: str, name: str, password: str) -> requests.Response:
    """NativeAuthenticator's sign-up form, as a learner fills it in."""
    s = requests.Session()
    xsrf = _xsrf(s, f"{base}/hub/signup")
    return s.post(
        f"{base}/hub/signup",
        data={"username": name, "signup_password": password, "signup_password_confirmation": password, "_xsrf": xsrf},
        timeout=60,
    )


def log_in(base: str, name: str, password: str) -> requests.Session | None:
    """The hub's login form; the session with the hub's cookies (and `landing`: where the hub sends the user
    next), or None when the hub refused."""
    s = requests.Session()
    xsrf = _xsrf(s, f"{base}/hub/login")
    reply = s.post(
        f"{base}/hub/login",
        data={"username": name, "password": password, "_xsrf": xsrf},
        allow_redirects=False,
        timeout=60,
    )
    if reply.status_code != 302 or "jupyterhub-session-id" not in s.cookies:
        return None
    s.landing = reply.headers["Location"]  # type: ignore[attr-defined]  # where the hub sent the login, kept on it
    return s


def token_for(base: str, session: requests.Session, name: str) -> str:
    """An API token for the logged-in user, asked of the hub's REST API with the session's cookie."""
    reply = session.post(
        f"{base}/hub/api/users/{name}/tokens",
        json={"note": "the room's test"},
        headers={"X-XSRFToken": session.cookies.get("_xsrf", "")},
        timeout=60,
    )
    reply.raise_for_status()
    return reply.json()["token"]


def admit(base: str, instructor: requests.Session, name: str, password: str) -> Seat:
    """A learner signs up as seat `name`, the instructor authorizes it and it logs in: the seat, with its API token.
    AssertionError naming the step the hub refused."""
    assert sign_up(base, name, password).status_code == 200, f"{name}: the hub refused its sign-up"
    authorized = instructor.get(f"{base}/hub/authorize/{name}", timeout=30)
    assert authorized.status_code == 200, f"{name}: the instructor's authorization got {authorized.status_code}"
    session = log_in(base, name, password)
    assert session is not None, f"{name}: authorized, and still refused at the login form"
    return Seat(base, name, token_for(base, session, name))


@dataclass
class Seat:
    base: str
    name: str
    token: str

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"token {self.token}"}

    def hub(self, method: str, path: str, **kw) -> requests.Response:
        return requests.request(method, f"{self.base}/hub/api{path}", headers=self.headers, timeout=60, **kw)

    def server(self, method: str, path: str, user: str | None = None, **kw) -> requests.Response:
        """The Jupyter server API of `user`'s server (default: this seat's own), through the hub's proxy."""
        return requests.request(
            method,
            f"{self.base}/user/{user or self.name}/api{path}",
            headers=self.headers,
            timeout=60,
            allow_redirects=False,
            **kw,
        )

    def start(self, timeout: float = 180) -> dict:
        reply = self.hub("POST", f"/users/{self.name}/server")
        assert reply.status_code in (201, 202, 400), reply.text  # 400: already running
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            model = self.hub("GET", f"/users/{self.name}").json()
            server = model.get("servers", {}).get("")
            if server and server.get("ready"):
                return server
            time.sleep(0.5)
        raise AssertionError(f"{self.name}'s server not ready in {timeout} s: {model}")

    def run_notebook(self, path: str, timeout: float = 600) -> list[dict]:
        """Every code cell of the seat's notebook `path` (read through its contents API) run in order in a kernel
        of its own server, started the way JupyterLab starts one (a session for the notebook, so the kernel works
        in the notebook's folder); the outputs of each cell. A cell that fails raises, with its error."""
        notebook = self.server("GET", f"/contents/{path}").json()["content"]
        session = self.server(
            "POST", "/sessions", json={"path": path, "type": "notebook", "name": "", "kernel": {"name": "python3"}}
        ).json()
        kernel = session["kernel"]["id"]
        ws_base = "ws" + self.base[len("http") :]  # http -> ws, https -> wss
        channel = _connect(f"{ws_base}/user/{self.name}/api/kernels/{kernel}/channels", self.token, timeout)
        outputs = []
        try:
            for cell in notebook["cells"]:
                if cell["cell_type"] != "code":
                    continue
                outputs.append(_execute(channel, "".join(cell["source"]), timeout))
        finally:
            channel.close()
            self.server("DELETE", f"/sessions/{session['id']}")
        return outputs

    def execute(self, code: str, timeout: float = 120) -> dict:
        """`code` in a fresh kernel of the seat's own server; its outputs."""
        kernel = self.server("POST", "/kernels", json={"name": "python3"}).json()["id"]
        ws_base = "ws" + self.base[len("http") :]  # http -> ws, https -> wss
        channel = _connect(f"{ws_base}/user/{self.name}/api/kernels/{kernel}/channels", self.token, timeout)
        try:
            return _execute(channel, code, timeout)
        finally:
            channel.close()
            self.server("DELETE", f"/kernels/{kernel}")


def _request(channel: websocket.WebSocket, kind: str, content: dict) -> str:
    msg_id = uuid.uuid4().hex
    channel.send(
        json.dumps(
            {
                "header": {
                    "msg_id": msg_id,
                    "msg_type": kind,
                    "username": "",
                    "session": uuid.uuid4().hex,
                    "version": "5.3",
                },
                "parent_header": {},
                "metadata": {},
                "channel": "shell",
                "buffers": [],
                "content": content,
            }
        )
    )
    return msg_id


def _connect(url: str, token: str, timeout: float) -> websocket.WebSocket:
    """A kernel's channels, once its output reaches us: a kernel_info request, asked again until the kernel's
    status for it arrives on iopub (JupyterLab's own handshake: output sent before that would be lost)."""
    channel = websocket.create_connection(url, header=[f"Authorization: token {token}"], timeout=timeout)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        asked = _request(channel, "kernel_info_request", {})
        channel.settimeout(2)
        try:
            while True:
                message = json.loads(channel.recv())
                if message.get("channel") == "iopub" and message.get("parent_header", {}).get("msg_id") == asked:
                    channel.settimeout(timeout)
                    return channel
        except websocket.WebSocketTimeoutException:
            continue
    raise AssertionError(f"the kernel at {url} never answered")


def _execute(channel: websocket.WebSocket, code: str, timeout: float) -> dict:
    msg_id = _request(
        channel,
        "execute_request",
        {
            "code": code,
            "silent": False,
            "store_history": True,
            "user_expressions": {},
            "allow_stdin": False,
            "stop_on_error": True,
        },
    )
    result: dict[str, Any] = {"stdout": "", "displays": 0, "error": None}
    reply = None
    idle = False  # the cell is done when its reply (shell) and its kernel's idle status (iopub, after every
    deadline = time.monotonic() + timeout  # output of the cell) have both come: the two channels are not ordered
    while time.monotonic() < deadline:
        message = json.loads(channel.recv())
        if message.get("parent_header", {}).get("msg_id") != msg_id:
            continue
        kind, content = message["msg_type"], message["content"]
        if kind == "stream":
            result["stdout"] += content["text"]
        elif kind == "display_data":
            result["displays"] += 1
        elif kind == "error":
            result["error"] = f"{content['ename']}: {content['evalue']}"
        elif kind == "status" and content["execution_state"] == "idle":
            idle = True
        elif kind == "execute_reply":
            reply = content
        if reply is not None and idle:
            if reply["status"] != "ok":
                raise AssertionError(
                    f"a cell failed: {result['error'] or reply}\n{code[:300]}\n{result['stdout'][-2000:]}"
                )
            return result
    raise AssertionError(f"a cell ran over {timeout} s:\n{code[:300]}")


class PeakMemory:
    """The peak of each system user's summed PSS (each process's share of its pages, so libraries mapped by
    several processes count once), sampled every half second while the `with` block runs: a seat's memory."""

    def __init__(self, users: list[str]) -> None:
        self.uids = {pwd.getpwnam(name).pw_uid: name for name in users}
        self.peaks = dict.fromkeys(users, 0)
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        self._thread.join(timeout=10)

    def _sample(self) -> None:
        while not self._done.is_set():
            total = dict.fromkeys(self.peaks, 0)
            for status in Path("/proc").glob("[0-9]*/status"):
                try:
                    uid = int(next(x for x in status.read_text().splitlines() if x.startswith("Uid:")).split()[1])
                    if uid in self.uids:
                        rollup = (status.parent / "smaps_rollup").read_text()
                        pss = next(x for x in rollup.splitlines() if x.startswith("Pss:"))
                        total[self.uids[uid]] += int(pss.split()[1]) * 1024
                except (OSError, StopIteration, ValueError):
                    continue  # a process that ended while read
            for name, value in total.items():
                self.peaks[name] = max(self.peaks[name], value)
            time.sleep(0.5)
