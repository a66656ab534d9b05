"""The sans-IO rules, tested directly: queue choice, acks, tokens, rate limits, names."""

from __future__ import annotations

import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

import mqgate.core.ids as ids_module
from mqgate.core.acks import ALREADY_ACKED, LOCK_EXPIRED, LOCK_TAKEN, OFFSET_MOVED, ack_refusal
from mqgate.core.ids import (
    id_at,
    id_run,
    ids_by_queue,
    in_id_run,
    is_id_run,
    is_valid_run,
    message_id_time_ms,
    new_message_id,
    new_message_ids,
)
from mqgate.core.queue_choice import QueueView, choose_queue, lock_is_held, next_lock_ts
from mqgate.core.ratelimit import TokenBucket
from mqgate.core.tokens import AckToken, decode_token, encode_token
from mqgate.errors import BadRequest, Forbidden
from mqgate.names import validate_name, validate_topic_name

NOW = 1_000_000


def view(
    queue: int,
    max_offset: int,
    committed: int = 0,
    *,
    lock_ts: int = 0,
    deadline: int = 0,
    access: int = 0,
    min_offset: int = 0,
) -> QueueView:
    return QueueView(queue, min_offset, max_offset, committed, lock_ts, deadline, access)


class TestQueueChoice:
    def test_most_unconsumed_first(self) -> None:
        assert choose_queue([view(0, 5), view(1, 9), view(2, 7)], NOW).queue == 1

    def test_ties_go_to_the_queue_consumed_longest_ago(self) -> None:
        qs = [view(0, 5, access=300), view(1, 5, access=100), view(2, 5, access=200)]
        assert choose_queue(qs, NOW).queue == 1

    def test_locked_queues_are_skipped(self) -> None:
        qs = [view(0, 100, lock_ts=NOW - 5, deadline=NOW + 1000), view(1, 2)]
        assert choose_queue(qs, NOW).queue == 1

    def test_expired_locks_are_reclaimed(self) -> None:
        qs = [view(0, 100, lock_ts=NOW - 5000, deadline=NOW - 1), view(1, 2)]
        assert choose_queue(qs, NOW).queue == 0

    def test_nothing_to_consume(self) -> None:
        assert choose_queue([view(0, 5, 5), view(1, 0)], NOW) is None

    def test_backlog_counts_from_min_when_committed_fell_behind_retention(self) -> None:
        assert view(0, 10, committed=2, min_offset=8).backlog == 2

    @given(
        st.lists(
            st.tuples(st.integers(0, 50), st.integers(0, 50), st.booleans(), st.integers(0, 9)),
            min_size=1,
            max_size=16,
        )
    )
    def test_choice_matches_a_simple_model(self, specs: list[tuple[int, int, bool, int]]) -> None:
        qs = [
            view(
                i, mx, min(c, mx), lock_ts=NOW if locked else 0, deadline=NOW + 1 if locked else 0, access=acc
            )
            for i, (mx, c, locked, acc) in enumerate(specs)
        ]
        free = [q for q in qs if q.backlog > 0 and not lock_is_held(q.lock_ts, q.lock_deadline_ms, NOW)]
        chosen = choose_queue(qs, NOW)
        if not free:
            assert chosen is None
            return
        assert chosen is not None
        assert chosen.backlog == max(q.backlog for q in free)
        same = [q for q in free if q.backlog == chosen.backlog]
        assert chosen.last_access_ms == min(q.last_access_ms for q in same)

    def test_new_lock_timestamps_always_differ_from_the_previous(self) -> None:
        assert next_lock_ts(0, NOW) == NOW
        assert next_lock_ts(NOW, NOW) == NOW + 1
        assert next_lock_ts(NOW + 7, NOW) == NOW + 8


class TestAckRules:
    def refusal(self, **kw: int) -> str | None:
        args = {
            "stored_committed": 10,
            "stored_lock_ts": 500,
            "stored_lock_deadline_ms": NOW + 1000,
            "token_offset": 10,
            "token_lock_ts": 500,
            "now_ms": NOW,
        }
        args.update(kw)
        return ack_refusal(**args)

    def test_valid_while_the_lock_is_the_tokens_and_offset_unchanged(self) -> None:
        assert self.refusal() is None

    def test_offset_moved(self) -> None:
        assert self.refusal(stored_committed=12) == OFFSET_MOVED

    def test_lock_expired(self) -> None:
        assert self.refusal(stored_lock_deadline_ms=NOW - 1) == LOCK_EXPIRED

    def test_released_lock_counts_as_expired(self) -> None:
        assert self.refusal(stored_lock_deadline_ms=0) == LOCK_EXPIRED

    def test_a_token_whose_lock_made_the_last_commit_was_acked_already(self) -> None:
        assert self.refusal(stored_committed=20, stored_lock_deadline_ms=0, stored_acked_lock_ts=500) == (
            ALREADY_ACKED
        )
        taken_since = self.refusal(stored_committed=20, stored_lock_ts=600, stored_acked_lock_ts=500)
        assert taken_since == ALREADY_ACKED
        assert self.refusal(stored_committed=20, stored_acked_lock_ts=400) == OFFSET_MOVED

    def test_lock_taken_by_another_pull(self) -> None:
        assert self.refusal(stored_lock_ts=501) == LOCK_TAKEN

    def test_another_lock_that_itself_expired(self) -> None:
        assert self.refusal(stored_lock_ts=501, stored_lock_deadline_ms=NOW - 1) == LOCK_EXPIRED


class TestTokens:
    SECRET = b"k" * 32
    TOKEN = AckToken("orders-c", "", "local", 3, 40, 72, 1_763_000_000_123)

    def test_round_trip_is_url_safe(self) -> None:
        text = encode_token(self.TOKEN, self.SECRET)
        assert set(text) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
        assert decode_token(text, self.SECRET) == self.TOKEN

    def test_wrong_secret_is_forbidden(self) -> None:
        with pytest.raises(Forbidden):
            decode_token(encode_token(self.TOKEN, self.SECRET), b"other")

    @given(st.integers(0, 200), st.integers(1, 255))
    def test_any_altered_byte_is_refused(self, position: int, flip: int) -> None:
        import base64

        raw = bytearray(base64.urlsafe_b64decode(encode_token(self.TOKEN, self.SECRET) + "=="))
        raw[position % len(raw)] ^= flip
        forged = base64.urlsafe_b64encode(bytes(raw)).rstrip(b"=").decode()
        with pytest.raises((Forbidden, BadRequest)):
            decode_token(forged, self.SECRET)

    @pytest.mark.parametrize("mangle", ["!{}", "{} ", " {}", "{}====", "{}==", "{}\n", "{}.", "{}+/"])
    def test_only_the_exact_text_of_a_token_is_accepted(self, mangle: str) -> None:
        """The lenient base64 decoder skips characters outside its alphabet and extra padding;
        a token is accepted only in the exact form the gateway wrote it."""
        text = mangle.format(encode_token(self.TOKEN, self.SECRET))
        with pytest.raises(BadRequest) as err:
            decode_token(text, self.SECRET)
        assert err.value.field == "requestId"

    def test_a_token_with_altered_spare_bits_is_refused(self) -> None:
        text = encode_token(self.TOKEN, self.SECRET)
        alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
        spare = (-len(text) * 6) % 8  # bits of the last character beyond the data
        if spare:
            last = alphabet[alphabet.index(text[-1]) ^ 1]
            with pytest.raises(BadRequest):
                decode_token(text[:-1] + last, self.SECRET)

    @pytest.mark.parametrize("text", ["", "%%%", "abc", "x" * 2000])
    def test_garbage_is_a_bad_request(self, text: str) -> None:
        with pytest.raises(BadRequest) as err:
            decode_token(text, self.SECRET)
        assert err.value.field == "requestId"


class TestRateLimit:
    def test_grants_up_to_the_rate_then_refills(self) -> None:
        t0 = 1_790_000_000_000  # a real clock reading: elapsed time must stay exact
        bucket = TokenBucket.full(10, now_ms=t0)
        assert bucket.take(32, t0) == 10
        assert bucket.take(5, t0) == 0
        assert 0 < bucket.retry_after_s() <= 0.1
        assert bucket.take(5, t0 + 300) == 3
        assert bucket.take(1, t0 + 400) == 1  # exactly one token refilled in 100 ms
        assert bucket.take(100, t0 + 10_000) == 10  # capacity is one second's worth

    def test_slow_rates_still_grant_one_message(self) -> None:
        bucket = TokenBucket.full(0.5, now_ms=0)
        assert bucket.take(10, 0) == 1
        assert bucket.take(10, 1000) == 0
        assert bucket.take(10, 2000) == 1

    def test_a_clock_running_backwards_neither_refills_nor_goes_negative(self) -> None:
        bucket = TokenBucket.full(10, now_ms=5000)
        assert bucket.take(10, 5000) == 10
        assert bucket.take(10, 4000) == 0 and bucket.tokens == 0
        assert bucket.take(10, 5100) == 1


class TestNames:
    @pytest.mark.parametrize("name", ["orders", "a", "A.b_c-9", "x" * 128])
    def test_valid(self, name: str) -> None:
        assert validate_name(name, "topic") == name

    @pytest.mark.parametrize("name", ["", ".", "..", "../etc", "a/b", "a b", "x" * 129, "é", "a\x00", 7])
    def test_invalid_names_name_the_field(self, name: object) -> None:
        with pytest.raises(BadRequest) as err:
            validate_name(name, "producer")
        assert err.value.field == "producer"

    def test_dead_letter_topics(self) -> None:
        assert validate_topic_name("%DLQ%worker") == "%DLQ%worker"
        with pytest.raises(BadRequest):
            validate_topic_name("%DLQ%../x")


def test_message_ids_are_unique_and_time_sortable() -> None:
    ids = [new_message_id(NOW + i // 10) for i in range(1000)]
    assert len(set(ids)) == 1000
    assert ids == sorted(ids)
    assert message_id_time_ms(ids[-1]) == NOW + 99


def test_batch_ids_share_the_time_prefix_and_stay_unique() -> None:
    ids = [*new_message_ids(NOW, 500), new_message_id(NOW)]
    assert len(set(ids)) == 501 and all(message_id_time_ms(i) == NOW for i in ids)


def test_batches_taken_by_threads_at_once_get_distinct_ids() -> None:
    def take(out: list[str]) -> None:
        for _ in range(200):
            out.extend(new_message_ids(NOW, 7))

    outs: list[list[str]] = [[] for _ in range(4)]
    threads = [threading.Thread(target=take, args=(out,)) for out in outs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    every = [i for out in outs for i in out]
    assert len(set(every)) == len(every) == 4 * 200 * 7


def test_a_batch_across_the_counters_end_wraps_to_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ids_module, "_next_counter", 0xFFFFFFFFFFFF - 1)
    ids = new_message_ids(NOW, 4)
    assert [i[20:] for i in ids] == ["fffffffffffe", "ffffffffffff", "000000000000", "000000000001"]
    assert len({i[:20] for i in ids}) == 1


def test_each_queue_s_ids_are_a_run_named_by_its_first_id_and_count() -> None:
    queues = [0, 1, 0, 2, 1, 0, 0]
    ids = ids_by_queue(NOW, queues)
    assert len(set(ids)) == len(ids) and all(message_id_time_ms(i) == NOW for i in ids)
    for q in (0, 1, 2):
        mine = [i for i, at in zip(ids, queues, strict=True) if at == q]
        assert is_id_run(mine[0], mine[-1], len(mine)) and id_run(mine[0], len(mine)) == mine
        assert id_at(mine[0], len(mine) - 1) == mine[-1]
        assert all(in_id_run(i, mine[0], len(mine)) for i in mine)
        others = [i for i in ids if i not in mine]
        assert not any(in_id_run(i, mine[0], len(mine)) for i in others)
    # Ids that are not one run: another millisecond, a gap, a foreign id.
    a, b = new_message_ids(NOW, 2), new_message_ids(NOW + 1, 1)
    assert not is_id_run(a[0], b[0], 2)
    assert not is_id_run(a[0], a[1], 3)
    assert not is_id_run("order-17", "order-18", 2) and not in_id_run("order-17", a[0], 2)
    # A run never passes the counter's end; a count must be positive.
    top = a[0][:20] + "f" * 12
    assert is_valid_run(top, 1) and not is_valid_run(top, 2) and not is_valid_run(a[0], 0)
    assert not is_valid_run("z" * 32, 1) and not is_valid_run("short", 1)
