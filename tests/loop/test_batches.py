"""``ring.batches`` (loop/batches.py): which drawn batches a checkpoint holds, and giving them back."""

from __future__ import annotations

import pytest

from ringtrain.errors import RingtrainError
from ringtrain.loop.batches import DrawnBatches


def _counter():
    drawn = []

    def get_batch(split="train"):
        drawn.append(split)
        return f"{split}{len(drawn)}"
    return get_batch, drawn


def test_a_prefetched_batch_is_held_and_a_used_one_is_not():
    get_batch, _ = _counter()
    wrapped = DrawnBatches(get_batch, 0)
    x = wrapped("train")  # before the loop
    wrapped.forward_ran()  # model(x)
    nxt = wrapped("train")  # the prefetch, before backward
    assert wrapped.held() == [("'train'", nxt)] and x != nxt
    wrapped.forward_ran()
    assert wrapped.held() == []


def test_given_back_batches_go_to_the_first_calls_with_their_arguments_and_draw_nothing():
    get_batch, drawn = _counter()
    wrapped = DrawnBatches(get_batch, 0)
    wrapped.give_back([("'train'", "held")])
    assert wrapped("val") == "val1"  # another draw: drawn anew
    assert wrapped("train") == "held" and drawn == ["val"]
    assert wrapped("train") == "train2"


def test_bad_input_is_refused():
    with pytest.raises(RingtrainError, match="not callable"):
        DrawnBatches(3, 0)
    wrapped = DrawnBatches(lambda: 1, 0)
    with pytest.raises(RingtrainError, match="already wraps"):
        DrawnBatches(wrapped, 1)
