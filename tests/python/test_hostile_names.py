"""Names from data are never patterns nor commands (issue 29): ``tar_shards`` given a list (what
``glob.glob`` returns) reads each name as the file it is, and a file named like a ``pipe:``
command runs nothing; a ``str`` is still the user's pattern."""
import glob
import json
import re
import shutil

import pytest

import conveyor
from conftest import CROP, shard_pattern

# Each ran "touch PWNED" in the current folder when read as a pattern.
HOSTILE = ["{pipe:touch PWNED;y-000000,z}.tar", "a.tar,pipe:touch PWNED;x-000000.tar",
           "pipe:touch PWNED;w-000000.tar"]


def first_shard_samples(shards) -> int:
    index = json.loads((shards / "photos.index.json").read_text())
    first = index["shards"][0]["file"]
    return sum(1 for s in index["samples"] if s["shard"] == first)


def samples(ds) -> int:
    loader = conveyor.DataLoader(ds, batch_size=4, num_workers=2)
    return sum(len(batch.indices) for batch in loader)


def test_globbed_shards_named_like_commands_are_read_as_files(shards, tmp_path, monkeypatch):
    first = sorted(shards.glob("photos-*.tar"))[0]
    for name in HOSTILE:
        shutil.copy(first, tmp_path / name)
    monkeypatch.chdir(tmp_path)
    names = sorted(glob.glob("*.tar"))
    assert len(names) == len(HOSTILE)
    ds = conveyor.tar_shards(names, conveyor.RandomResizedCrop(CROP))
    assert ds.literal
    assert samples(ds) == len(HOSTILE) * first_shard_samples(shards)
    # Absolute names, and one path object, too.
    assert samples(conveyor.tar_shards([str(tmp_path / n) for n in HOSTILE],
                                       conveyor.RandomResizedCrop(CROP))) == \
        len(HOSTILE) * first_shard_samples(shards)
    assert samples(conveyor.tar_shards(tmp_path / HOSTILE[0], conveyor.RandomResizedCrop(CROP))) == \
        first_shard_samples(shards)
    assert not list(tmp_path.glob("PWNED*")), "a file name ran a command"


def test_a_str_is_the_users_pattern_and_a_list_is_literal(shards):
    pattern = str(shards / shard_pattern(shards))
    typed = conveyor.tar_shards(pattern, conveyor.RandomResizedCrop(CROP))
    assert not typed.literal and len(typed) == 27
    # The same text in a list is one file name, which does not exist: an error naming it.
    with pytest.raises(RuntimeError, match=re.escape(pattern)):
        conveyor.tar_shards([pattern], conveyor.RandomResizedCrop(CROP))
    listed = conveyor.tar_shards(sorted(str(p) for p in shards.glob("photos-*.tar")),
                                 conveyor.RandomResizedCrop(CROP))
    assert len(listed) == 27
    with pytest.raises(TypeError, match="path or URL"):
        conveyor.tar_shards([1], conveyor.RandomResizedCrop(CROP))
    with pytest.raises(TypeError, match="not bytes"):
        conveyor.tar_shards(b"x.tar", conveyor.RandomResizedCrop(CROP))
