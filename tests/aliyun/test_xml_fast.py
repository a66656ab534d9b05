"""The publish documents the SDKs write are read without a parser (mqgate.aliyun.xml's fast
path): whatever it takes, expat reads the same; whatever it does not, expat reads."""

from __future__ import annotations

import pytest

from mqgate.aliyun import xml as mqxml
from mqgate.aliyun.errors import AliyunError

HEAD = '<?xml version="1.0" encoding="UTF-8"?><Message xmlns="http://mq.aliyuncs.com/doc/v1/">'

TAKEN = [
    HEAD + "<MessageBody>plain</MessageBody></Message>",
    HEAD + "<MessageBody>tab\tand\nnewline > ok</MessageBody><MessageTag>TagA</MessageTag></Message>",
    HEAD + '<MessageBody><![CDATA[order <ok> & "done" 价格]]></MessageBody>'
    "<MessageTag><![CDATA[TagA]]></MessageTag><Properties><![CDATA[a:b|KEYS:k1 k2]]></Properties></Message>",
    HEAD + "<MessageBody>x</MessageBody><MessageTag></MessageTag><Properties>a:b|</Properties></Message>\n",
    HEAD.replace("UTF-8", "utf-8") + "<MessageBody>x</MessageBody></Message>",
]
# Not the SDKs' shapes, or what XML would change or refuse: expat decides.
LEFT = [
    HEAD + "<MessageBody>a &amp; b</MessageBody></Message>",
    HEAD + "<MessageBody>cr\r\nlf</MessageBody></Message>",
    HEAD + "<MessageBody>a]]>b</MessageBody></Message>",
    HEAD + "<MessageBody><![CDATA[a]]>b]]></MessageBody></Message>",
    HEAD + "<MessageBody>\x01</MessageBody></Message>",
    HEAD + "<MessageTag>T</MessageTag><MessageBody>x</MessageBody></Message>",
    HEAD + "<MessageBody>x</MessageBody><Other>y</Other></Message>",
    '<Message xmlns="other"><MessageBody>x</MessageBody></Message>',
    HEAD + "<MessageBody><![CDATA[a]]>tail</MessageBody></Message>",
]


def expat(data: bytes) -> list[tuple[str, str]]:
    return mqxml._parse(
        data, "Message", max_bytes=mqxml.MAX_DOCUMENT_BYTES, max_elements=64, max_text_chars={},
        default_max_chars=mqxml.MAX_DOCUMENT_BYTES,
    )  # fmt: skip


@pytest.mark.parametrize("doc", TAKEN)
def test_what_the_fast_path_takes_expat_reads_the_same(doc: str) -> None:
    data = doc.encode()
    fast = mqxml._fast_publish(data)
    assert fast is not None
    assert fast == expat(data)
    assert mqxml.decode_publish(data).body == dict(fast)["MessageBody"]


@pytest.mark.parametrize("doc", LEFT)
def test_the_rest_is_left_to_expat(doc: str) -> None:
    data = doc.encode()
    assert mqxml._fast_publish(data) is None
    try:
        expected: object = mqxml.decode_publish(data)
    except AliyunError as exc:
        expected = exc.kind
    # decode_publish went through expat: its answer, or its refusal.
    assert expected is not None


def test_limits_hold_on_the_fast_path() -> None:
    data = (HEAD + "<MessageBody>" + "x" * 11 + "</MessageBody></Message>").encode()
    assert mqxml._fast_publish(data) is not None
    with pytest.raises(AliyunError) as refused:
        mqxml.decode_publish(data, max_body_bytes=10)
    assert refused.value.element == "MessageBody"
    tag = (HEAD + "<MessageBody>x</MessageBody><MessageTag>" + "t" * 65 + "</MessageTag></Message>").encode()
    with pytest.raises(AliyunError) as refused:
        mqxml.decode_publish(tag)
    assert refused.value.element == "MessageTag"
    with pytest.raises(AliyunError):
        mqxml.decode_publish(data, max_document_bytes=10)
