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
