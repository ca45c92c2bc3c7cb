#!/usr/bin/env python3
"""Checks the per-rank logs of examples/ddp_train (lines "epoch E step S indices i j k ...").

coverage: one job ran whole epochs; every epoch must follow PyTorch's DistributedSampler rules:
  equal sample and batch counts per rank; interleaving the ranks' indices (global position
  k * W + r holds rank r's k-th index) gives the epoch's order, which without drop_last is a
  permutation of 0..n-1 followed by its own head as padding, and with drop_last n // W * W distinct
  indices.
resume: a first job logged up to a checkpoint at step S (its lines with step >= S are discarded)
  and a second job (possibly on another number of ranks) resumed from it; across both, every epoch
  must hold every sample exactly once, and in the second job the ranks must have equal batch and
  sample counts in every epoch.
"""
import argparse
import collections
import sys


def read(prefix, ranks, below_step=None):
    """{epoch: {rank: [batches of indices]}}"""
    epochs = collections.defaultdict(lambda: {r: [] for r in range(ranks)})
    for r in range(ranks):
        path = f"{prefix}.rank{r}.log"
        with open(path) as f:
            for line in f:
                words = line.split()
                assert words[0] == "epoch" and words[2] == "step" and words[4] == "indices", line
                epoch, step = int(words[1]), int(words[3])
                if below_step is not None and step >= below_step:
                    continue
                epochs[epoch][r].append([int(w) for w in words[5:]])
    return epochs


def fail(message):
    print("FAIL: " + message)
    sys.exit(1)


def equal_counts(epoch, per_rank, what):
    batches = {r: len(b) for r, b in per_rank.items()}
    samples = {r: sum(len(x) for x in b) for r, b in per_rank.items()}
    if len(set(batches.values())) != 1:
        fail(f"{what} epoch {epoch}: batch counts differ per rank: {batches}")
    if len(set(samples.values())) != 1:
        fail(f"{what} epoch {epoch}: sample counts differ per rank: {samples}")
    return batches[0], samples[0]


def coverage(args):
    logs = read(args.logs, args.ranks)
    if sorted(logs) != list(range(args.epochs)):
        fail(f"epochs logged: {sorted(logs)}, expected 0..{args.epochs - 1}")
    n, w = args.samples, args.ranks
    per_rank = n // w if args.drop_last else (n + w - 1) // w
    for epoch in sorted(logs):
        batches, samples = equal_counts(epoch, logs[epoch], "")
        if samples != per_rank:
            fail(f"epoch {epoch}: {samples} samples per rank, expected {per_rank}")
        flat = {r: [i for b in logs[epoch][r] for i in b] for r in range(w)}
        order = [flat[k % w][k // w] for k in range(per_rank * w)]
        if args.drop_last:
            if len(set(order)) != len(order) or not set(order) <= set(range(n)):
                fail(f"epoch {epoch}: indices repeat or fall outside the dataset")
        else:
            if sorted(order[:n]) != list(range(n)):
                fail(f"epoch {epoch}: the ranks do not cover 0..{n - 1} exactly once")
            if order[n:] != order[: len(order) - n]:
                fail(f"epoch {epoch}: the padding {order[n:]} is not the head of the order")
        sets = [set(flat[r]) for r in range(w)]
        overlap = sum(len(s) for s in sets) - len(set().union(*sets))
        print(f"epoch {epoch}: {w} ranks x {batches} batches x {samples} samples, "
              f"{len(set(order))} distinct of {n}, {len(order) - len(set(order))} padding "
              f"repeats, overlap between ranks {overlap}")


def resume(args):
    first = read(args.first, args.ranks1, below_step=args.checkpoint_step)
    second = read(args.second, args.ranks2)
    for epoch in range(args.epochs):
        seen = collections.Counter()
        for batches in list(first.get(epoch, {}).values()) + list(second.get(epoch, {}).values()):
            for b in batches:
                seen.update(b)
        if sorted(seen) != list(range(args.samples)) or set(seen.values()) != {1}:
            missing = sorted(set(range(args.samples)) - set(seen))
            twice = sorted(i for i, c in seen.items() if c > 1)
            fail(f"epoch {epoch}: missing {missing}, more than once {twice}")
        before = sum(len(b) for bs in first.get(epoch, {}).values() for b in bs)
        counts = ""
        if epoch in second:
            batches, samples = equal_counts(epoch, second[epoch], "resumed job")
            counts = f"; resumed job: {args.ranks2} ranks x {batches} batches x {samples} samples"
        print(f"epoch {epoch}: {args.samples} samples each once ({before} before the checkpoint at "
              f"step {args.checkpoint_step} on {args.ranks1} ranks{counts})")


def main():
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("coverage")
    c.add_argument("--logs", required=True)
    c.add_argument("--ranks", type=int, required=True)
    c.add_argument("--samples", type=int, required=True)
    c.add_argument("--epochs", type=int, required=True)
    c.add_argument("--drop-last", action="store_true")
    r = sub.add_parser("resume")
    r.add_argument("--first", required=True)
    r.add_argument("--ranks1", type=int, required=True)
    r.add_argument("--checkpoint-step", type=int, required=True)
    r.add_argument("--second", required=True)
    r.add_argument("--ranks2", type=int, required=True)
    r.add_argument("--samples", type=int, required=True)
    r.add_argument("--epochs", type=int, required=True)
    args = parser.parse_args()
    coverage(args) if args.command == "coverage" else resume(args)
    print("ok")


if __name__ == "__main__":
    main()
