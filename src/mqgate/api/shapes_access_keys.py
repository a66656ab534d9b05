"""Request and answer shapes of access keys (issue 30): the keys AWS SDKs sign SQS requests
with (`mqgate.accesskeys`)."""

from __future__ import annotations

from typing import Annotated

from msgspec import Meta

from mqgate.api.answers import Output
from mqgate.api.shapes import Input, Name, PageIn

AccessKeyId = Annotated[str, Meta(description="20 characters: MQGA and 16 of base32")]
Account = Annotated[str, Meta(description="12 digits, the same for every key of a project")]


class AccessKeyIn(Input, kw_only=True, frozen=True):
    name: Name
    project: Name  # an existing project


class AccessKeyNameIn(Input, kw_only=True, frozen=True):
    name: Name


class AccessKeysIn(PageIn, kw_only=True, frozen=True):
    project: Name | None = None


class AccessKeyCreatedOut(Output, kw_only=True):
    """A new key with its secret: the only answer that holds it."""

    name: str
    project: str
    account: Account
    access_key_id: AccessKeyId
    secret_access_key: Annotated[str, Meta(description="40 characters, shown this once")]
    created_ms: int


class AccessKeyOut(Output, kw_only=True):
    name: str
    project: str
    account: Account
    access_key_id: AccessKeyId
    created_ms: int
    revoked: bool
    revoked_ms: int | None = None


class AccessKeysOut(Output, kw_only=True):
    access_keys: list[AccessKeyOut]  # by name, revoked ones too
    next: str | None = None  # the cursor of the next page; absent on the last
