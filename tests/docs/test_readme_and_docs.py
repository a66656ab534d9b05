"""The README tour, run as written; and the docs against the code and the benchmark results.
The CLI against a real gateway is in tests/cli/test_cli_admin.py."""

from __future__ import annotations

import json
import os
import re
import subprocess
import typing
from pathlib import Path

import httpx

from mqgate import errors
from mqgate.core.acks import AckRefusal
from tests.conftest import ROOT, Server


def tour_script() -> str:
    text = (ROOT / "README.md").read_text()
    block = re.search(r"<!-- tour:start -->\s*```bash\n(.*?)```\s*<!-- tour:end -->", text, re.S)
    assert block, "README.md has no tour block"
    return block.group(1)


def test_readme_tour_runs_as_written_and_again(server: Server) -> None:
    """Twice against the same gateway: a reader trying the tour a second time gets the same."""
    for _ in range(2):
        out = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", tour_script()],
            env={**os.environ, "MQGATE_URL": server.url, "MQGATE_ADMIN_TOKEN": server.admin_token},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert out.returncode == 0, out.stderr + out.stdout
        lines = out.stdout.strip().splitlines()
        assert lines[-1] == "1", out.stdout
        assert lines[-3] == "order 2 paid", out.stdout
        assert json.loads(lines[-2])["status"] == 200


def error_codes() -> set[str]:
    """Every `code` an error answer can carry: the error classes', the codes given where one is
    raised (`code="..."`, or written out as `"code":"..."`), and the ack refusals."""
    classes, codes = [errors.MqgateError], set()
    while classes:
        cls = classes.pop()
        classes.extend(cls.__subclasses__())
        if cls.__module__ == "mqgate.errors":
            codes.add(cls.code)
    for path in (ROOT / "src" / "mqgate").rglob("*.py"):
        if "client" not in path.parts:  # the client's own `unreachable` is never an answer
            codes.update(re.findall(r"""\bcode=["']([a-z_]+)["']|"code":\s*"([a-z_]+)""", path.read_text()))
    codes = {c for pair in codes for c in (pair if isinstance(pair, tuple) else (pair,)) if c}
    return codes | set(typing.get_args(AckRefusal))


def test_protocol_lists_every_route_and_error_code(tmp_path: Path) -> None:
    doc = (ROOT / "docs" / "PROTOCOL.md").read_text()
    server = Server(tmp_path / "data").start()
    try:
        spec = httpx.get(server.url + "/openapi.json", timeout=10).json()
    finally:
        server.stop()
    routes = [f"{method.upper()} {path}" for path, ops in spec["paths"].items() for method in ops]
    assert len(routes) > 20
    assert [r for r in routes if not re.search(f"`{re.escape(r)}[`?]", doc)] == []  # `GET /mq/read?…`
    errors_section = doc[doc.index("## Errors") :]
    statuses = {int(s) for ops in spec["paths"].values() for op in ops.values() for s in op["responses"]}
    listed = {int(s) for s in re.findall(r"^\| (\d{3}) \|", errors_section, re.M)}
    assert statuses - {200} <= listed, statuses - listed
    codes = error_codes()
    assert {"bad_request", "no_route", "offset_moved", "corrupt_record"} <= codes
    assert sorted(c for c in codes if f"`{c}`" not in errors_section) == []


def test_pipeline_doc_quotes_the_benchmark_results() -> None:
    """Every figure of docs/PIPELINE.md's performance section is in the pipeline benchmark's
    sections of benchmarks/RESULTS.md."""
    doc = (ROOT / "docs" / "PIPELINE.md").read_text()
    section = doc[doc.index("## Performance") :]
    section = section[: section.find("\n## ", 4) if "\n## " in section[4:] else None]
    results = (ROOT / "benchmarks" / "RESULTS.md").read_text()
    runs = "".join(
        results[m.start() :].split("\n## ", 1)[0] for m in re.finditer("## .*event pipeline", results)
    )
    assert runs, "RESULTS.md has no pipeline benchmark"
    number = r"\d+(?:,\d{3})*(?:\.\d+)?"
    figures = set(re.findall(number, section))
    assert len(figures) > 15
    in_results = set(re.findall(number, runs))
    assert sorted(figures - in_results) == []
