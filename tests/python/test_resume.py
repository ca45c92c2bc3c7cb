"""state_dict()/load_state_dict(): bit-exact resume through torch.save/torch.load at every batch
of an epoch, with another num_workers, and the refusals that name the field."""

from __future__ import annotations

import io
import itertools

import pytest
import torch

import conveyor
from conftest import CROP, batches_of


def make(photos, workers, **kwargs):
    kwargs.setdefault("batch_size", 4)
    ds = conveyor.ImageFolder(photos, transform=conveyor.RandomResizedCrop(CROP, flip=True))
    return conveyor.DataLoader(ds, shuffle=True, seed=11, num_workers=workers, **kwargs)


def through_torch_save(state) -> dict:
    buffer = io.BytesIO()
    torch.save({"loader": state}, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)["loader"]


def test_state_is_a_plain_dict_of_ints_and_strings(photos):
    state = make(photos, 1).state_dict()
    assert isinstance(state, dict)
    assert all(isinstance(v, (int, str)) for v in state.values())
    assert state["batch_size"] == 4 and state["sampler"] == "random"
    assert through_torch_save(state) == state


def test_resume_at_every_batch_is_bit_exact_with_other_workers(photos):
    reference = batches_of(make(photos, 2), epochs=2)
    per_epoch = len(make(photos, 1))
    assert per_epoch == 7
    for stop in range(per_epoch + 1):
        first = make(photos, 2)
        # islice takes exactly `stop` batches (a `break` after the batch would count it too:
        # a batch handed to the loop counts as received).
        taken = [b.indices for b in itertools.islice(first, stop)]
        assert len(taken) == stop
        state = through_torch_save(first.state_dict())
        del first
        resumed = make(photos, 3 if stop % 2 else 1)  # another number of workers
        resumed.load_state_dict(state)
        rest = batches_of(resumed, epochs=1 if stop == per_epoch else 2)
        # The rest of epoch 0, then epoch 1 (after a complete epoch 0: epoch 1).
        expected = reference[stop:]
        assert [b[1] for b in rest] == [b[1] for b in expected], f"stopped at batch {stop}"
        for got, want in zip(rest, expected):
            assert got[0] == want[0]
            assert torch.equal(got[2], want[2]) and torch.equal(got[3], want[3])


def test_a_complete_epoch_resumes_at_the_next_one(photos):
    loader = make(photos, 2)
    batches_of(loader)
    resumed = make(photos, 1)
    resumed.load_state_dict(through_torch_save(loader.state_dict()))
    assert next(iter(resumed)).epoch == 1


def test_load_refuses_a_state_that_does_not_fit_naming_the_field(photos):
    state = make(photos, 1).state_dict()
    for kwargs, field in [(dict(batch_size=5), "batch_size"), (dict(drop_last=True), "drop_last")]:
        with pytest.raises(ValueError, match=field):
            make(photos, 1, **kwargs).load_state_dict(state)
    other_seed = conveyor.DataLoader(
        conveyor.ImageFolder(photos, transform=conveyor.RandomResizedCrop(CROP)), batch_size=4,
        shuffle=True, seed=12)
    with pytest.raises(ValueError, match="seed"):
        other_seed.load_state_dict(state)
    sequential = conveyor.DataLoader(
        conveyor.ImageFolder(photos, transform=conveyor.RandomResizedCrop(CROP)), batch_size=4,
        seed=11)
    with pytest.raises(ValueError, match="sampler"):
        sequential.load_state_dict(state)
    loader = make(photos, 1)
    with pytest.raises(ValueError, match="epoch"):
        loader.load_state_dict({**state, "epoch": [1]})
    with pytest.raises(ValueError, match="batches_received"):
        loader.load_state_dict({k: v for k, v in state.items() if k != "batches_received"})
    with pytest.raises(ValueError, match="dict"):
        loader.load_state_dict([("epoch", 0)])
    # A refused state leaves the loader as it was: it starts epoch 0.
    assert next(iter(loader)).epoch == 0


def test_state_mid_epoch_without_ordering_is_refused(photos):
    loader = make(photos, 2, in_order=False)
    it = iter(loader)
    next(it)
    with pytest.raises(RuntimeError, match="enforce_ordering"):
        loader.state_dict()


def test_numbers_in_a_state_are_checked_naming_the_field(photos):
    """Issue 29: every number of a state is range-checked before it is used, as a ValueError
    that names the field (and its value); a world size of 2**62 used to overflow and replay the
    epoch, and an integer past 64 bits gave pybind's 'Unable to cast'."""
    first = make(photos, 1)
    it = iter(first)
    next(it)
    next(it)
    state = first.state_dict()
    loader = make(photos, 1)
    for key, value, shown in [
        ("epoch", 2**63, "epoch"),
        ("epoch", -(2**63) - 1, "epoch"),
        ("batches_received", 2**200, "batches_received"),
        ("epoch", -1, "-1"),
        ("order_base", -1, "order_base"),
        ("order_base", 10**6, "1000000"),
        ("order_world_size", 2**62, "4611686018427387904"),
        ("order_world_size", 0, "order_world_size"),
        ("batches_received", -5, "batches_received"),
        ("epoch_complete", 7, "epoch_complete"),
        ("epoch", 1.5, "epoch"),
        ("epoch", None, "epoch"),
        ("epoch", [True], "epoch"),
    ]:
        with pytest.raises(ValueError, match=key) as raised:
            loader.load_state_dict({**state, key: value})
        assert shown in str(raised.value), (key, value, str(raised.value))
    # More batches than the epoch holds: refused when the epoch would start.
    loader.load_state_dict({**state, "batches_received": 2**63 - 1})
    with pytest.raises(ValueError, match="batches_received"):
        next(iter(loader))
    fresh = make(photos, 1)
    for key, value in [("epoch", 2**63), ("order_world_size", 2**62)]:
        with pytest.raises(ValueError):
            fresh.load_state_dict({**state, key: value})
    # Refused states leave the loader as it was.
    assert next(iter(fresh)).epoch == 0


def test_a_huge_string_or_key_in_a_state_gives_a_short_escaped_error(photos):
    """Issue 29: a 256 MB string was echoed whole into the error. Strings and keys from a state
    are quoted bounded (with their length) and escaped."""
    state = make(photos, 1).state_dict()
    loader = make(photos, 1)
    with pytest.raises(ValueError, match="sampler") as raised:
        loader.load_state_dict({**state, "sampler": "x" * (256 << 20)})
    assert len(str(raised.value)) < 1000
    assert "268435456" in str(raised.value)
    with pytest.raises(ValueError) as raised:
        loader.load_state_dict({**state, "a\nfake: log line\x1b[2J" * 100000: 1})
    message = str(raised.value)
    assert len(message) < 1000 and "\n" not in message and "\x1b" not in message
    with pytest.raises(ValueError, match="sampler") as raised:
        loader.load_state_dict({**state, "sampler": "random\n\x1b[31mfake"})
    assert "\n" not in str(raised.value) and "\x1b" not in str(raised.value)
    assert next(iter(loader)).epoch == 0
