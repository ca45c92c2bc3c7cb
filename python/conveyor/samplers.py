"""The order of dataset indices in each epoch. These name the engine's C++ samplers (pure
functions of seed and epoch, so resume is bit-exact); they are passed to ``conveyor.DataLoader``,
not iterated from Python."""

from __future__ import annotations

from typing import Optional

__all__ = ["Sampler", "SequentialSampler", "RandomSampler", "DistributedSampler", "RASampler"]


class Sampler:
    """Base of Conveyor's samplers."""

    kind = ""

    def _spec(self, loader_seed: int) -> dict:
        raise NotImplementedError


class SequentialSampler(Sampler):
    """0, 1, ..., n-1 every epoch."""

    kind = "sequential"

    def __init__(self, data_source=None) -> None:
        pass

    def _spec(self, loader_seed: int) -> dict:
        return dict(sampler="sequential", sampler_seed=0, rank=0, world_size=1, shuffle=False,
                    sampler_drop_last=False)

    def __repr__(self) -> str:
        return "conveyor.SequentialSampler()"


class RandomSampler(Sampler):
    """A permutation per epoch, a pure function of (seed, epoch): the same for any number of
    workers. ``seed`` defaults to the loader's ``seed``."""

    kind = "random"

    def __init__(self, data_source=None, *, seed: Optional[int] = None) -> None:
        self.seed = seed

    def _spec(self, loader_seed: int) -> dict:
        seed = loader_seed if self.seed is None else self.seed
        return dict(sampler="random", sampler_seed=int(seed), rank=0, world_size=1, shuffle=True,
                    sampler_drop_last=False)

    def __repr__(self) -> str:
        return f"conveyor.RandomSampler(seed={self.seed})"


class DistributedSampler(Sampler):
    """PyTorch's ``DistributedSampler``: each of ``num_replicas`` ranks gets a disjoint share of
    one permutation of (seed, epoch) (0..n-1 without ``shuffle``), padded by repeating its head
    so every rank gets ceil(n / num_replicas) samples (with ``drop_last``: floor, tail dropped).
    Every rank thus has the same number of batches.

    ``rank`` and ``num_replicas`` default to ``torch.distributed.get_rank()`` and
    ``get_world_size()``. ``set_epoch(e)`` makes the next ``iter(loader)`` start epoch ``e``, as
    with PyTorch. A loader state saved on N ranks loads on M ranks (elastic resume: the M ranks
    share out what the N had not consumed).
    """

    kind = "distributed"

    def __init__(self, dataset=None, num_replicas: Optional[int] = None,
                 rank: Optional[int] = None, shuffle: bool = True, seed: int = 0,
                 drop_last: bool = False) -> None:
        if num_replicas is None or rank is None:
            import torch.distributed as dist

            if not (dist.is_available() and dist.is_initialized()):
                raise ValueError(
                    "conveyor: DistributedSampler needs rank and num_replicas, or an "
                    "initialized torch.distributed (torch.distributed.init_process_group) to "
                    "take them from")
            if num_replicas is None:
                num_replicas = dist.get_world_size()
            if rank is None:
                rank = dist.get_rank()
        if isinstance(num_replicas, bool) or int(num_replicas) < 1:
            raise ValueError(f"conveyor: DistributedSampler num_replicas must be >= 1, "
                             f"not {num_replicas!r}")
        if not 0 <= int(rank) < int(num_replicas):
            raise ValueError(f"conveyor: DistributedSampler rank must be in [0, {num_replicas}), "
                             f"not {rank!r}")
        self.num_replicas = int(num_replicas)
        self.rank = int(rank)
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.drop_last = bool(drop_last)
        self._pending_epoch: Optional[int] = None

    def set_epoch(self, epoch: int) -> None:
        """The next ``iter()`` of the loader using this sampler starts ``epoch``."""
        self._pending_epoch = int(epoch)

    def _spec(self, loader_seed: int) -> dict:
        return dict(sampler="distributed", sampler_seed=self.seed, rank=self.rank,
                    world_size=self.num_replicas, shuffle=self.shuffle,
                    sampler_drop_last=self.drop_last)

    def __repr__(self) -> str:
        return (f"conveyor.DistributedSampler(num_replicas={self.num_replicas}, rank={self.rank}, "
                f"shuffle={self.shuffle}, seed={self.seed}, drop_last={self.drop_last})")


def _distributed_defaults(who: str, num_replicas, rank, required: bool):
    if num_replicas is None or rank is None:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            num_replicas = dist.get_world_size() if num_replicas is None else num_replicas
            rank = dist.get_rank() if rank is None else rank
        elif required:
            raise ValueError(
                f"conveyor: {who} needs rank and num_replicas, or an initialized "
                f"torch.distributed (torch.distributed.init_process_group) to take them from")
        else:
            num_replicas = 1 if num_replicas is None else num_replicas
            rank = 0 if rank is None else rank
    if isinstance(num_replicas, bool) or int(num_replicas) < 1:
        raise ValueError(f"conveyor: {who} num_replicas must be >= 1, not {num_replicas!r}")
    if not 0 <= int(rank) < int(num_replicas):
        raise ValueError(f"conveyor: {who} rank must be in [0, {num_replicas}), not {rank!r}")
    return int(num_replicas), int(rank)


class RASampler(Sampler):
    """DeiT's ``RASampler`` (repeated augmentation): each sample is drawn ``num_repeats`` times
    per epoch, every draw with its own random choices (crop, flip and the batch transform's
    draws: the repeat number enters each per-sample stream; repeat 0 draws what the sample draws
    unrepeated), the repeats spread over the ranks.

    The epoch's global order is a permutation of (seed, epoch) (0..n-1 without ``shuffle``) with
    each index repeated ``num_repeats`` times in a row; entry p goes to rank p % num_replicas.
    As DeiT's, an epoch keeps the dataset's length: the ranks take the first
    floor(T / num_replicas) entries each, T = n rounded down to a multiple of ``selected_round``
    (256 as DeiT; 0: T = n). Every rank gets the same number of batches.

    ``rank`` and ``num_replicas`` default to ``torch.distributed``'s when it is initialized,
    else to one process. ``seed`` defaults to the loader's ``seed``. ``set_epoch(e)`` as
    DistributedSampler's. ``state_dict`` resume is bit-exact; a state saved on N ranks loads on M
    (elastic: the M ranks go on with the global order where the N left it). ``Batch.repeats``
    tells each row's repeat number.
    """

    kind = "repeated_augmentation"

    def __init__(self, dataset=None, num_replicas: Optional[int] = None,
                 rank: Optional[int] = None, shuffle: bool = True, num_repeats: int = 3, *,
                 seed: Optional[int] = None, selected_round: int = 256) -> None:
        self.num_replicas, self.rank = _distributed_defaults("RASampler", num_replicas, rank,
                                                             required=False)
        if isinstance(num_repeats, bool) or not 1 <= int(num_repeats) <= 1024:
            raise ValueError(f"conveyor: RASampler num_repeats must be in [1, 1024], "
                             f"not {num_repeats!r}")
        if isinstance(selected_round, bool) or int(selected_round) < 0:
            raise ValueError(f"conveyor: RASampler selected_round must be >= 0, "
                             f"not {selected_round!r}")
        self.shuffle = bool(shuffle)
        self.num_repeats = int(num_repeats)
        self.seed = seed
        self.selected_round = int(selected_round)
        self._pending_epoch: Optional[int] = None

    def set_epoch(self, epoch: int) -> None:
        """The next ``iter()`` of the loader using this sampler starts ``epoch``."""
        self._pending_epoch = int(epoch)

    def _spec(self, loader_seed: int) -> dict:
        seed = loader_seed if self.seed is None else self.seed
        return dict(sampler="repeated_augmentation", sampler_seed=int(seed), rank=self.rank,
                    world_size=self.num_replicas, shuffle=self.shuffle, sampler_drop_last=False,
                    num_repeats=self.num_repeats, selected_round=self.selected_round)

    def __repr__(self) -> str:
        return (f"conveyor.RASampler(num_replicas={self.num_replicas}, rank={self.rank}, "
                f"shuffle={self.shuffle}, num_repeats={self.num_repeats}, seed={self.seed}, "
                f"selected_round={self.selected_round})")


def from_torch(sampler, loader_seed: int) -> Sampler:
    """A torch.utils.data sampler translated to the engine's, where one means the same order."""
    import torch.utils.data as tud

    if isinstance(sampler, tud.DistributedSampler):
        return DistributedSampler(num_replicas=sampler.num_replicas, rank=sampler.rank,
                                  shuffle=sampler.shuffle, seed=sampler.seed,
                                  drop_last=sampler.drop_last)
    if type(sampler) is tud.SequentialSampler:
        return SequentialSampler()
    raise ValueError(
        f"conveyor: sampler must be conveyor.SequentialSampler, RandomSampler, "
        f"DistributedSampler or RASampler (or torch's DistributedSampler/SequentialSampler), not "
        f"{type(sampler).__module__}.{type(sampler).__qualname__}: the engine's samplers are "
        f"pure functions of (seed, epoch), which is what makes resume bit-exact. For a shuffled "
        f"order use shuffle=True (seeded by the loader's seed)")
