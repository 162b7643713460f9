"""Bruck's index algorithm of the MPI agreement (collectives.transports.mpi.index), without
processes: its rounds deliver every piece, its choice of where it is used, and its refusal
of blocks that a message does not hold. (Across real instances: the per-rank suite and the
conformance suite.)"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from collectives.errors import TransportError
from collectives.transports.base import agree_block_bytes
from collectives.transports.mpi.agreement import read_blocks
from collectives.transports.mpi.index import EAGER_LIMIT_BYTES, IndexRounds, index_rounds


@pytest.mark.parametrize("size", range(1, 18))
def test_the_rounds_bring_every_piece_to_its_member(size):
    # slot j of member r starts as r's piece for r - j; a round moves the slots with its bit
    # set to member r - distance, into the same slots; afterwards slot j holds (r + j)'s
    held = [{j: (r, (r - j) % size) for j in range(size)} for r in range(size)]
    plan = index_rounds(size)
    for dist, count, slots in plan:
        assert count == min(dist, size - dist)  # the all-gather's blocks in this round
        assert slots == tuple(j for j in range(size) if j & dist)
        sent = [{j: held[r][j] for j in slots} for r in range(size)]
        for r in range(size):
            held[r].update(sent[(r + dist) % size])
    for r in range(size):
        assert held[r] == {j: ((r + j) % size, r) for j in range(size)}
    assert len(plan) == (size - 1).bit_length()


def _index(size: int) -> IndexRounds:
    return IndexRounds(SimpleNamespace(members=tuple(range(size)), rank=0))


def test_it_is_taken_where_its_rounds_are_eager_and_the_all_gathers_are_not():
    for size in (2, 3, 4, 5, 8, 16):
        index = _index(size)
        for piece in (1, 8, 100, 1000, 2000, 3000, 4096, 8192):
            rounds = [16 * count + agree_block_bytes(len(slots) * piece) - 16
                      for _, count, slots in index_rounds(size)]
            gathers = [count * agree_block_bytes(size * piece)
                       for _, count, _ in index_rounds(size)]
            want = max(rounds) <= EAGER_LIMIT_BYTES < max(gathers)
            assert index.takes(piece) is want, (size, piece)
    assert _index(4).takes(1024) and not _index(2).takes(1024)  # 4 KiB payloads
    assert not _index(4).takes(0)
    with pytest.raises(ValueError, match="pieces of 100000 bytes among 4 members"):
        _index(4).send_buffer(100000)


def test_blocks_that_a_message_does_not_hold_are_refused_naming_the_sender():
    words = np.zeros(16, np.int64)
    words[0], words[1] = 5, 8  # [fingerprint 5, 8 bytes | payload]
    words[3], words[4] = 6, 0  # [fingerprint 6, 0 bytes]
    view = memoryview(words)
    assert read_blocks(view, 0, 40, 2, 3) == [(0, 8), (24, 0)]
    for limit, count in ((40, 3), (32, 2), (48, 2)):
        with pytest.raises(TransportError, match="malformed agreement message from "
                                                 "instance 3"):
            read_blocks(view, 0, limit, count, 3)
    words[1] = 1 << 40
    with pytest.raises(TransportError, match="from instance 3"):
        read_blocks(view, 0, 40, 2, 3)


def test_the_pieces_sent_are_counted_each_time_they_move():
    # P / 2 pieces a round for a power of two; one a round between 2 and 3 members
    assert [_index(n).sent_bytes(10) for n in (2, 3, 4, 5, 8, 16)] == [
        10, 20, 40, 50, 120, 320]
