"""Who may do what: roles granted per project (pure rules, no I/O).

A grant is (user, role, project); project "*" is every project. Roles rise in order: a viewer
reads, a member also applies for topics, producers and consumers, an owner also changes them
and approves applications, an admin does everything everywhere, users included.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

import msgspec

VIEWER: Final = "viewer"
MEMBER: Final = "member"
OWNER: Final = "owner"
ADMIN: Final = "admin"
ROLES: Final = (VIEWER, MEMBER, OWNER, ADMIN)
LEVEL: Final = {role: i + 1 for i, role in enumerate(ROLES)}
EVERY_PROJECT: Final = "*"


class Grant(msgspec.Struct, frozen=True):
    role: str
    project: str


def check_grant(role: str, project: str) -> str | None:
    """Why the grant is refused, or None."""
    if role not in ROLES:
        return f"role must be one of {', '.join(ROLES)}"
    if role == ADMIN and project != EVERY_PROJECT:
        return "admin is granted on every project (*) only"
    if not project:
        return "name a project, or * for every project"
    return None


class Principal(msgspec.Struct, frozen=True):
    """A signed-in user and what they were granted."""

    name: str
    grants: tuple[Grant, ...] = msgspec.field(default_factory=tuple)

    def level(self, project: str) -> int:
        return max((LEVEL[g.role] for g in self.grants if g.project in (project, EVERY_PROJECT)), default=0)

    @property
    def is_admin(self) -> bool:
        return any(g.role == ADMIN for g in self.grants)

    def can_view(self, project: str) -> bool:
        return self.level(project) >= LEVEL[VIEWER]

    def can_apply(self, project: str) -> bool:
        return self.level(project) >= LEVEL[MEMBER]

    def can_change(self, project: str) -> bool:
        """Change topics, producers and consumers of `project`, and approve applications."""
        return self.level(project) >= LEVEL[OWNER]

    def visible(self, projects: Iterable[str]) -> list[str]:
        return sorted(p for p in set(projects) if self.can_view(p))

    def applicable(self, projects: Iterable[str]) -> list[str]:
        return sorted(p for p in set(projects) if self.can_apply(p))

    def changeable(self, projects: Iterable[str]) -> list[str]:
        return sorted(p for p in set(projects) if self.can_change(p))

    @property
    def can_change_any(self) -> bool:
        return any(LEVEL[g.role] >= LEVEL[OWNER] for g in self.grants)

    @property
    def deciding(self) -> list[str] | None:
        """The projects whose applications this user decides: None for every project."""
        owned = [g.project for g in self.grants if LEVEL[g.role] >= LEVEL[OWNER]]
        return None if EVERY_PROJECT in owned else sorted(set(owned))

    @property
    def can_apply_any(self) -> bool:
        return any(LEVEL[g.role] >= LEVEL[MEMBER] for g in self.grants)
