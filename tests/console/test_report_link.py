"""The project page links the project's trace analytics report (issue 14: "the same report
reachable from the console's project page"): served as the job wrote it, with a CSP of its own,
to those who may view the project only."""

from __future__ import annotations

from tests.console.conftest import ConsoleServer, sign_in

REPORT = b"<!doctype html><html><head><style>h1{color:#333}</style></head><body><h1>Report</h1></body></html>"


def test_a_projects_report_is_linked_and_served_to_its_viewers_only(console: ConsoleServer) -> None:
    console.admin("POST", "/admin/projects", name="rep")
    console.add_user("rita-rep", "member", "rep")
    console.add_user("olaf-other", "member", "elsewhere")
    admin = sign_in(console, "admin")
    page = admin.get("/console/projects/rep")
    assert page.status_code == 200 and 'id="report-hint"' in page.text
    assert f"--out {console.data_dir / 'reports' / 'rep'}" in page.text
    assert admin.get("/console/projects/rep/report").status_code == 404

    folder = console.data_dir / "reports" / "rep"
    folder.mkdir(parents=True)
    (folder / "report.html").write_bytes(REPORT)
    (folder / "report.json").write_bytes(b'{"counts": {"produced": 3}}')
    assert 'id="report-link"' in admin.get("/console/projects/rep").text
    member = sign_in(console, "rita-rep")
    r = member.get("/console/projects/rep/report")
    assert r.status_code == 200 and r.content == REPORT
    assert r.headers.get_list("content-security-policy") == [
        "default-src 'none'; style-src 'unsafe-inline'; img-src data:; frame-ancestors 'none'"
    ]
    j = member.get("/console/projects/rep/report?format=json")
    assert j.headers["content-type"] == "application/json" and j.json() == {"counts": {"produced": 3}}
    other = sign_in(console, "olaf-other")
    assert other.get("/console/projects/rep/report").status_code == 403
    assert admin.get("/console/projects/nope/report").status_code == 404
