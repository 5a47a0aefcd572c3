"""A real headless Chromium for the tests, driven over the DevTools protocol on a pipe.

`--remote-debugging-pipe` makes Chromium read NUL-terminated JSON commands on fd 3 and write
replies and events on fd 4, so no port, no websocket library and no extra dependency is needed.
We record every console message, uncaught exception, log entry and network request while a
page loads, evaluate JavaScript in it, and take PNG screenshots at chosen window sizes.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import shutil
import struct
import subprocess
import tempfile
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-extensions", "--disable-default-apps", "--mute-audio",
         "--remote-debugging-pipe"]


def find_chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


@dataclass
class Load:
    """What happened while one page loaded."""

    console: list[dict] = field(default_factory=list)  # {"type", "text"}
    errors: list[str] = field(default_factory=list)  # exceptions, log entries of level error
    requests: list[str] = field(default_factory=list)  # every URL the page asked for
    failed: list[str] = field(default_factory=list)  # URLs that failed to load


class Browser:
    def __init__(self, executable: str, timeout: float = 60.0):
        self.timeout = timeout
        self.profile = tempfile.mkdtemp(prefix="tinygpt-chromium-")
        to_child_r, self._w = os.pipe()
        self._r, from_child_w = os.pipe()
        # Move the child's ends to free numbers above 9, so that the dup2 onto 3 and 4 in the
        # child cannot clobber either of them.
        hi_r = fcntl.fcntl(to_child_r, fcntl.F_DUPFD, 10)
        hi_w = fcntl.fcntl(from_child_w, fcntl.F_DUPFD, 10)
        os.close(to_child_r)
        os.close(from_child_w)

        def wire():
            os.dup2(hi_r, 3)
            os.dup2(hi_w, 4)

        # its home is the profile too: Chromium writes ~/.config/chromium/Crash Reports and
        # dconf ~/.cache/dconf even with a --user-data-dir, and the suite writes nowhere but
        # its temporary folders
        home = {"HOME": self.profile, "XDG_CONFIG_HOME": os.path.join(self.profile, "config"),
                "XDG_CACHE_HOME": os.path.join(self.profile, "cache")}
        self.proc = subprocess.Popen(
            [executable, *FLAGS, f"--user-data-dir={self.profile}", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            preexec_fn=wire, pass_fds=(3, 4, hi_r, hi_w), env={**os.environ, **home})
        os.close(hi_r)
        os.close(hi_w)
        self._next = 0
        self._buf = b""
        self.events: list[dict] = []
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target,
                                 flatten=True)["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.call(f"{domain}.enable", session=True)

    # -------------------------------------------------------------- the protocol

    def _send(self, message: dict) -> None:
        data = json.dumps(message).encode() + b"\0"
        while data:
            data = data[os.write(self._w, data):]

    def _read(self, deadline: float) -> dict:
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._r], [], [], left)[0]:
                raise TimeoutError("chromium did not answer in time")
            chunk = os.read(self._r, 1 << 20)
            if not chunk:
                raise RuntimeError("chromium closed the DevTools pipe")
            self._buf += chunk
        raw, self._buf = self._buf.split(b"\0", 1)
        return json.loads(raw)

    def call(self, method: str, *, session: bool = False, **params) -> dict:
        self._next += 1
        message = {"id": self._next, "method": method, "params": params}
        if session:
            message["sessionId"] = self.session
        self._send(message)
        deadline = time.monotonic() + self.timeout
        while True:
            reply = self._read(deadline)
            if reply.get("id") == self._next:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_for(self, method: str) -> dict:
        deadline = time.monotonic() + self.timeout
        for k, event in enumerate(self.events):
            if event.get("method") == method:
                return self.events.pop(k)
        while True:
            event = self._read(deadline)
            if event.get("method") == method:
                return event
            self.events.append(event)

    # -------------------------------------------------------------- pages

    def resize(self, width: int, height: int) -> None:
        self.call("Emulation.setDeviceMetricsOverride", session=True, width=width,
                  height=height, deviceScaleFactor=1, mobile=width < 500)

    def open(self, path: Path, width: int = 1280, height: int = 900) -> Load:
        """Load a file and report what the page did while loading (and a moment after)."""
        self.resize(width, height)
        self.events.clear()
        self.call("Page.navigate", session=True, url=Path(path).resolve().as_uri())
        self.wait_for("Page.loadEventFired")
        self.evaluate("new Promise(r => requestAnimationFrame(() => setTimeout(r, 50)))")
        return self.report()

    def report(self) -> Load:
        load = Load()
        for e in self.events:
            m, p = e.get("method"), e.get("params", {})
            if m == "Runtime.consoleAPICalled":
                text = " ".join(str(a.get("value", a.get("description", "")))
                                for a in p.get("args", []))
                load.console.append({"type": p.get("type"), "text": text})
                if p.get("type") in ("error", "assert"):
                    load.errors.append(f"console.{p.get('type')}: {text}")
            elif m == "Runtime.exceptionThrown":
                d = p.get("exceptionDetails", {})
                load.errors.append("exception: " + str(d.get("exception", {}).get(
                    "description", d.get("text"))))
            elif m == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
                load.errors.append("log: " + p["entry"].get("text", ""))
            elif m == "Network.requestWillBeSent":
                load.requests.append(p["request"]["url"])
            elif m == "Network.loadingFailed":
                load.failed.append(f"{p.get('errorText')} ({p.get('requestId')})")
        return load

    def evaluate(self, expression: str):
        result = self.call("Runtime.evaluate", session=True, expression=expression,
                           returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def screenshot(self, width: int, height: int) -> bytes:
        self.resize(width, height)
        self.evaluate("new Promise(r => requestAnimationFrame(() => setTimeout(r, 50)))")
        return base64.b64decode(self.call("Page.captureScreenshot", session=True,
                                          format="png", optimizeForSpeed=True)["data"])

    def close(self) -> None:
        try:
            self.call("Browser.close")
        except (RuntimeError, TimeoutError, OSError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._r)
        os.close(self._w)
        shutil.rmtree(self.profile, ignore_errors=True)


# ------------------------------------------------------------------ PNG, decoded by hand


def _paeth(a: int, b: int, c: int) -> int:
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    return a if pa <= pb and pa <= pc else (b if pb <= pc else c)


def decode_png(data: bytes) -> np.ndarray:
    """An 8-bit RGB or RGBA PNG as an array [height, width, channels] (what Chromium writes)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat = 8, b""
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, colour = struct.unpack(">IIBB", body[:10])
            assert depth == 8 and colour in (2, 6), (depth, colour)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    bpp = 3 if colour == 2 else 4
    raw = np.frombuffer(zlib.decompress(idat), dtype=np.uint8).reshape(height, 1 + width * bpp)
    out = np.zeros((height, width * bpp), dtype=np.uint8)
    prev = np.zeros(width * bpp, dtype=np.int64)
    for y in range(height):
        f, line = raw[y, 0], raw[y, 1:].astype(np.int64)
        if f == 0:
            cur = line
        elif f == 2:
            cur = (line + prev) % 256
        elif f == 1:  # each byte adds the one bpp before it: a running sum per channel
            cur = np.cumsum(line.reshape(width, bpp), axis=0).reshape(-1) % 256
        else:
            cur = line.copy()
            for x in range(width * bpp):
                a = cur[x - bpp] if x >= bpp else 0
                if f == 3:
                    cur[x] = (cur[x] + (a + prev[x]) // 2) % 256
                else:
                    c = prev[x - bpp] if x >= bpp else 0
                    cur[x] = (cur[x] + _paeth(a, int(prev[x]), int(c))) % 256
        out[y] = cur
        prev = cur
    return out.reshape(height, width, bpp)
