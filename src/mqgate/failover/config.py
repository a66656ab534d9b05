"""The shared failover configuration (SPEC P8): the store clusters and each project's primary
and backup, in the registry's database so that every gateway works from the same set.

Tables `mqgate_clusters(name, url, pool, broker, created_ms)`,
`mqgate_project_clusters(project, primary_cluster, backup_cluster, auto_failback)`, and the
failover's shared bookkeeping: `mqgate_drain_claims` and `mqgate_resent_ids`. Every
gateway reads both at each switch check (`Failover.sync`), so a cluster added through one
gateway is probed and used by all of them within one check interval. Blocking calls: run them
in a thread.
"""

from __future__ import annotations

import msgspec
import sqlalchemy as sa

from mqgate.errors import AlreadyExists, BadRequest, Conflict, NotFound
from mqgate.failover.pool import ClusterSpec
from mqgate.sqlschema import create_all_shared, upsert_insert

metadata = sa.MetaData()
clusters_table = sa.Table(
    "mqgate_clusters",
    metadata,
    sa.Column("name", sa.String(128), primary_key=True),
    sa.Column("url", sa.String(2048), nullable=False),
    sa.Column("pool", sa.String(128), nullable=False),
    sa.Column("broker", sa.String(128), nullable=True),
    sa.Column("created_ms", sa.BigInteger, nullable=False),
)
project_clusters_table = sa.Table(
    "mqgate_project_clusters",
    metadata,
    sa.Column("project", sa.String(128), primary_key=True),
    sa.Column("primary_cluster", sa.String(128), nullable=False),
    sa.Column("backup_cluster", sa.String(128), nullable=True),
    sa.Column("auto_failback", sa.Boolean, nullable=False),
)

# Which gateway drains a cluster a project left (failover/drain.py): one at a time, the claim
# expires so a gateway that died mid-drain does not block the others.
drain_claims_table = sa.Table(
    "mqgate_drain_claims",
    metadata,
    sa.Column("project", sa.String(128), primary_key=True),
    sa.Column("cluster", sa.String(128), primary_key=True),
    sa.Column("owner", sa.String(64), nullable=False),
    sa.Column("until_ms", sa.BigInteger, nullable=False),
)


# Messages the spool resent after a send that may have stored them already (a possible
# duplicate), and the cluster the latest resend went to: the drain into that cluster skips the
# copy in the left cluster's topic (failover/drain.py). Rows go once older than the project's
# longest retention (no copy is kept longer).
resent_ids_table = sa.Table(
    "mqgate_resent_ids",
    metadata,
    sa.Column("project", sa.String(128), primary_key=True),
    sa.Column("msg_id", sa.String(64), primary_key=True),
    sa.Column("cluster", sa.String(128), nullable=False),
    sa.Column("at_ms", sa.BigInteger, nullable=False),
)


class Assignment(msgspec.Struct, frozen=True):
    """A project's clusters as configured."""

    project: str
    primary: str
    backup: str | None
    auto_failback: bool


class FailoverConfig(msgspec.Struct, frozen=True):
    clusters: dict[str, ClusterSpec]
    projects: dict[str, Assignment]


class SqlFailoverConfig:
    def __init__(self, engine: sa.Engine) -> None:
        self.engine = engine

    def create_schema(self) -> None:
        create_all_shared(metadata, self.engine)

    def read(self) -> FailoverConfig:
        with self.engine.connect() as conn:
            clusters = conn.execute(sa.select(clusters_table)).all()
            projects = conn.execute(sa.select(project_clusters_table)).all()
        return FailoverConfig(
            {r.name: ClusterSpec(r.name, r.url, r.pool, r.broker) for r in clusters},
            {
                r.project: Assignment(r.project, r.primary_cluster, r.backup_cluster, r.auto_failback)
                for r in projects
            },
        )

    def add_cluster(self, spec: ClusterSpec, created_ms: int) -> None:
        try:
            with self.engine.begin() as conn:
                conn.execute(
                    sa.insert(clusters_table).values(
                        name=spec.name,
                        url=spec.url,
                        pool=spec.pool,
                        broker=spec.broker,
                        created_ms=created_ms,
                    )
                )
        except sa.exc.IntegrityError as exc:
            raise AlreadyExists(f"cluster {spec.name} already exists", field="name") from exc

    def remove_cluster(self, name: str) -> None:
        """Refused (409) while a project names the cluster."""
        c = project_clusters_table.c
        with self.engine.begin() as conn:
            users = conn.execute(
                sa.select(c.project).where((c.primary_cluster == name) | (c.backup_cluster == name))
            ).all()
            if users:
                names = ", ".join(sorted(r.project for r in users))
                raise Conflict(f"cluster {name} serves projects {names}", field="name")
            done = conn.execute(sa.delete(clusters_table).where(clusters_table.c.name == name))
        if done.rowcount == 0:
            raise NotFound(f"no cluster named {name!r}", field="cluster")

    def assign(self, a: Assignment) -> None:
        """Set a project's clusters; both must exist (BadRequest naming `primary` or `backup`)."""
        if a.backup is not None and a.backup == a.primary:
            raise BadRequest(f"the backup of project {a.project} is its primary", field="backup")
        values = {"primary_cluster": a.primary, "backup_cluster": a.backup, "auto_failback": a.auto_failback}
        with self.engine.begin() as conn:
            known = {r.name for r in conn.execute(sa.select(clusters_table.c.name)).all()}
            for field, name in (("primary", a.primary), ("backup", a.backup)):
                if name is not None and name not in known:
                    raise BadRequest(f"no cluster named {name!r}", field=field)
            c = project_clusters_table.c
            done = conn.execute(
                sa.update(project_clusters_table).where(c.project == a.project).values(**values)
            )
            if done.rowcount == 0:
                conn.execute(sa.insert(project_clusters_table).values(project=a.project, **values))

    def unassign(self, project: str) -> None:
        with self.engine.begin() as conn:
            conn.execute(sa.delete(project_clusters_table).where(project_clusters_table.c.project == project))

    def claim_drain(self, project: str, cluster: str, owner: str, now_ms: int, hold_ms: int) -> bool:
        """True when `owner` may drain (project, cluster) until now + hold_ms."""
        t = drain_claims_table
        values = {"owner": owner, "until_ms": now_ms + hold_ms}
        try:
            with self.engine.begin() as conn:
                done = conn.execute(
                    sa.update(t)
                    .where(t.c.project == project, t.c.cluster == cluster)
                    .where((t.c.owner == owner) | (t.c.until_ms < now_ms))
                    .values(**values)
                )
                if done.rowcount == 1:
                    return True
                held = conn.execute(
                    sa.select(t.c.owner).where(t.c.project == project, t.c.cluster == cluster)
                ).first()
                if held is not None:
                    return False
                conn.execute(sa.insert(t).values(project=project, cluster=cluster, **values))
                return True
        except sa.exc.IntegrityError:
            return False  # another gateway claimed it first

    def release_drain(self, project: str, cluster: str, owner: str) -> None:
        t = drain_claims_table
        with self.engine.begin() as conn:
            conn.execute(
                sa.delete(t).where(t.c.project == project, t.c.cluster == cluster, t.c.owner == owner)
            )

    def record_resent(self, project: str, cluster: str, msg_ids: list[str], at_ms: int) -> None:
        """These messages of `project`, possibly stored elsewhere before, were resent to
        `cluster` (their latest resend)."""
        if not msg_ids:
            return
        t = resent_ids_table
        rows = [{"project": project, "msg_id": m, "cluster": cluster, "at_ms": at_ms} for m in msg_ids]
        insert = upsert_insert(self.engine)(t).values(rows)
        latest = {"cluster": insert.excluded.cluster, "at_ms": insert.excluded.at_ms}
        with self.engine.begin() as conn:
            conn.execute(insert.on_conflict_do_update(index_elements=[t.c.project, t.c.msg_id], set_=latest))

    def resent_to(self, project: str, cluster: str) -> set[str]:
        """Ids of `project`'s messages whose latest resend went to `cluster`."""
        t = resent_ids_table
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.select(t.c.msg_id).where(t.c.project == project, t.c.cluster == cluster)
            ).all()
        return {r.msg_id for r in rows}

    def forget_resent(self, project: str, before_ms: int) -> int:
        t = resent_ids_table
        with self.engine.begin() as conn:
            done = conn.execute(sa.delete(t).where(t.c.project == project, t.c.at_ms < before_ms))
        return int(done.rowcount or 0)


def parse_clusters(text: str) -> list[ClusterSpec]:
    """The `failover_clusters` setting: whitespace- or comma-separated `[pool/]name=url` items
    (e.g. `main/p=redis://10.0.0.1:6379/0 main/b=redis://10.0.0.2:6379/0`)."""
    specs = []
    for item in text.replace(",", " ").split():
        head, sep, url = item.partition("=")
        if not sep or not url:
            raise BadRequest(f"failover_clusters: {item!r} is not [pool/]name=url", field="failover_clusters")
        pool, _, name = head.rpartition("/")
        specs.append(ClusterSpec(name, url, pool or "default"))
    return specs
