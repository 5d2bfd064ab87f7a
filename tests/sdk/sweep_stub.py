"""A stand-in for the sweep API on a stdlib ``http.server``: what ``mado agent`` calls, answered from a script.

``claims`` is the list of claim answers to give in order (each ``{"trial", "done"}``; ``program`` and
``project`` are added); once it is empty every claim answers ``done``. ``reports`` records each trial
report as ``(number, body)``, ``agents`` the ``agent`` of each claim; ``GET sweeps/7/`` answers the program.
``checkpoints`` maps an id to ``(resource, tar bytes)`` for ``GET checkpoints/{id}/`` and ``…/tar``; a tar is sent
``tar_delay`` seconds after ``tar_requested`` is set. Any other path is a 404 naming it.
"""

import re
import threading
import time

from tests.sdk.stub_api import HttpStub, JsonHandler

TOKEN = "sweep-stub-token"


class SweepStub(HttpStub):
    def __init__(self, *, program: list[str], claims: list[dict], project: str = "vision"):
        self.program = program
        self.project = project
        self.claims = list(claims)
        self.reports: list[tuple[int, dict]] = []
        self.agents: list[str] = []
        self.checkpoints: dict[int, tuple[dict, bytes]] = {}
        self.tar_delay = 0.0
        self.tar_requested = threading.Event()
        super().__init__()

    def _claim(self, body: dict) -> dict:
        with self.lock:
            self.agents.append(body["agent"])
            answer = self.claims.pop(0) if self.claims else {"trial": None, "done": True, "reason": "cap reached"}
        return {"program": self.program, "project": self.project, "reason": "", **answer}

    def _handler(self):
        stub = self

        class Handler(JsonHandler):
            def _missing(self) -> None:
                self._answer(404, {"error": "not_found", "detail": f"nothing at {self.path}", "field": None})

            def do_POST(self):
                body = self._body()
                if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                    return self._answer(401, {"error": "unauthenticated", "detail": "bad token", "field": None})
                if re.fullmatch(r"/api/v1/sweeps/7/claim/", self.path):
                    return self._answer(200, stub._claim(body))
                report = re.fullmatch(r"/api/v1/sweeps/7/trials/(\d+)/report/", self.path)
                if report:
                    with stub.lock:
                        stub.reports.append((int(report.group(1)), body))
                    return self._answer(200, {"number": int(report.group(1))})
                self._missing()

            def do_GET(self):
                if self.path == "/api/v1/sweeps/7/":
                    return self._answer(200, {"id": 7, "program": stub.program, "project": stub.project})
                found = re.fullmatch(r"/api/v1/checkpoints/(\d+)/(tar)?", self.path)
                if not found or int(found.group(1)) not in stub.checkpoints:
                    return self._missing()
                resource, tar = stub.checkpoints[int(found.group(1))]
                if found.group(2):
                    stub.tar_requested.set()
                    time.sleep(stub.tar_delay)
                    return self._send(200, tar, "application/x-tar")
                self._answer(200, resource)

        return Handler
