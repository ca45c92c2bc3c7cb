"""train.py: the small CNN of examples/train_images.cpp, trained from Python through Conveyor, with
a checkpoint that survives Ctrl-C: a restart continues at the next batch.

    python examples/train.py --generate /tmp/photos --checkpoint /tmp/ckpt.pt
    # Ctrl-C mid-epoch: it finishes the step, saves, and exits; run the same command again and
    # it resumes with the batch after the last one it trained on.

Settings (tiny defaults, so it runs on a CPU in seconds): --data DIR (an ImageFolder) or
--generate DIR (writes a photo-like one first), --classes 4 --per-class 16, --size 64 --batch 16
--workers 2 --epochs 2 --lr 0.05 --seed 0, --checkpoint FILE, --checkpoint-every N (steps; 0:
only at Ctrl-C and at each epoch's end), --step-delay SECONDS (slows each step, to try Ctrl-C).
With a GPU, batches arrive on it (device="cuda") and are normalized there.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

import torch
from torch import nn

import conveyor


class SmallCnn(nn.Module):
    """conv-relu-pool, conv-relu, global average pool, linear (as train_images.cpp)."""

    def __init__(self, classes: int) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Linear(32, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


class StopRequest:
    """The first Ctrl-C asks the loop to stop after the step in progress (so the checkpoint holds
    exactly the batches trained on); a second one raises KeyboardInterrupt at once."""

    def __init__(self) -> None:
        self.requested = False
        signal.signal(signal.SIGINT, self._handle)

    def _handle(self, signum, frame) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        print("\nCtrl-C: stopping after this step (again to abort)", flush=True)


def save_atomically(state: dict, path: str) -> None:
    """Writes to a temporary name, then renames: a crash mid-save keeps the last checkpoint."""
    temporary = f"{path}.partial"
    torch.save(state, temporary)
    os.replace(temporary, path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--data", help="an ImageFolder (DIR/<class>/<image>.jpg)")
    source.add_argument("--generate", help="write a small photo-like ImageFolder here first")
    parser.add_argument("--classes", type=int, default=4)
    parser.add_argument("--per-class", type=int, default=16)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checkpoint", help="save here; resume from here if it exists")
    parser.add_argument("--checkpoint-every", type=int, default=0)
    parser.add_argument("--step-delay", type=float, default=0.0)
    args = parser.parse_args()

    root = args.data
    if args.generate:
        made = conveyor.generate_image_folder(args.generate, classes=args.classes,
                                              images_per_class=args.per_class,
                                              threads=args.workers)
        print(f"dataset: {made['images']} images in {made['root']} "
              f"({'reused' if made['reused'] else 'generated'})", flush=True)
        root = made["root"]

    device = "cuda" if torch.cuda.is_available() and conveyor.cuda_available() else "cpu"
    train = conveyor.ImageFolder(root, transform=conveyor.RandomResizedCrop(args.size, flip=True))
    loader = conveyor.DataLoader(train, batch_size=args.batch, shuffle=True,
                                 num_workers=args.workers, drop_last=True, device=device,
                                 seed=args.seed)
    torch.manual_seed(args.seed)
    model = SmallCnn(len(train.classes)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    print(f"training on {device}, {len(train.classes)} classes; {loader.mode}", flush=True)

    step, start_epoch = 0, 0
    if args.checkpoint and os.path.exists(args.checkpoint):
        saved = torch.load(args.checkpoint, weights_only=True)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        loader.load_state_dict(saved["loader"])  # the next iter() continues with the next batch
        step, start_epoch = saved["step"], saved["epoch"]
        print(f"resumed from {args.checkpoint} at step {step} (epoch {start_epoch})", flush=True)

    def checkpoint(epoch: int) -> None:
        if args.checkpoint:
            save_atomically({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                             "loader": loader.state_dict(), "step": step, "epoch": epoch},
                            args.checkpoint)

    stop = StopRequest()
    for epoch in range(start_epoch, args.epochs):
        asked = time.perf_counter()
        for batch in loader:
            images, labels = batch  # uint8 [B,3,S,S] and int64 [B], on `device`
            waited = time.perf_counter() - asked
            x = conveyor.normalize(images)  # uint8 NCHW -> float, on the batch's device
            loss = nn.functional.cross_entropy(model(x), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            print(f"epoch {batch.epoch} batch {batch.sequence} step {step} loss {loss.item():.4f} "
                  f"wait {waited * 1000:.1f} ms indices {','.join(map(str, batch.indices))}",
                  flush=True)
            if args.step_delay:
                time.sleep(args.step_delay)
            if stop.requested:
                checkpoint(epoch)  # mid-epoch: the state says which batches were trained on
                print(f"saved {args.checkpoint} at step {step}; run again to resume"
                      if args.checkpoint else "stopped (no --checkpoint given)", flush=True)
                return 130
            if args.checkpoint_every and step % args.checkpoint_every == 0:
                checkpoint(epoch)
            asked = time.perf_counter()
        checkpoint(epoch + 1)
    print(f"done: {step} steps", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
