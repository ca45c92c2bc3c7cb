// conveyor/conveyor.h: the whole public API of Conveyor, a data-loading engine for LibTorch.
//
//   pinned.h    HostBuffer and SlotRing: page-locked host memory and the ring of batch slots.
//   prefetch.h  CopyEngine (side-stream host-to-device copies) and normalize_images.
//   datasets.h  SampleSource, ImageSource (ImageFolder, file list, in memory), transforms,
//               the photo-like dataset generator; jpeg.h, the libjpeg-turbo decoder.
//   augment.h   batch ops (Normalize, RandomErasing, MixUp, CutMix) the loader's batch stage runs.
//   loader.h    DataLoader, LoaderOptions, samplers, Batch, errors and statistics.
//   torch_data.h  make_data_loader and DataLoaderOptions: the drop-in for torch::data's loader.
#pragma once

#include "conveyor/augment.h"
#include "conveyor/datasets.h"
#include "conveyor/jpeg.h"
#include "conveyor/loader.h"
#include "conveyor/pinned.h"
#include "conveyor/prefetch.h"
#include "conveyor/random.h"
#include "conveyor/torch_data.h"
