"""Datasets: the embedded 8x8 digits (default) and a synthetic one of any size for throughput runs."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

DIGITS = Path(__file__).parent / "data" / "digits.npz"
SPLIT_SEED = 0          # the train/test split never changes between runs
TEST_FRACTION = 0.2
DIGITS_FEATURES, DIGITS_CLASSES = 64, 10   # 8x8 pixels; the digits 0 to 9


@dataclass
class Dataset:
    train_x: np.ndarray
    train_y: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray
    classes: int


def _split(x: np.ndarray, y: np.ndarray, classes: int) -> Dataset:
    order = np.random.default_rng(SPLIT_SEED).permutation(len(y))
    n_test = int(len(y) * TEST_FRACTION)
    test, train = order[:n_test], order[n_test:]
    return Dataset(x[train], y[train], x[test], y[test], classes)


def digits(dtype) -> Dataset:
    """1438 training and 359 test images of 64 pixels scaled to [0, 1]."""
    with np.load(DIGITS, allow_pickle=False) as f:
        images, labels = f["images"], f["labels"]
    return _split((images / 16.0).astype(dtype), labels.astype(np.int64), classes=DIGITS_CLASSES)


SEPARATION = 4.0     # typical distance between class centres, in units of the noise: the clusters overlap
LABEL_NOISE = 0.1    # this share of the labels is drawn at random: no model reaches 100%


def synthetic(samples: int, features: int, classes: int, dtype, seed: int = 1) -> Dataset:
    """Overlapping Gaussian clusters, one per class, with some labels drawn at random: of any size,
    deterministic, and hard enough that the curves keep improving over many epochs (the best
    possible accuracy is below 100% - LABEL_NOISE * (1 - 1/classes) whatever the size).

    Centres are scaled by 1/sqrt(features), so how much the clusters overlap does not depend on
    the number of features."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(classes, features)) * (SEPARATION / np.sqrt(2 * features))
    labels = rng.integers(0, classes, size=samples)
    x = centres[labels] + rng.normal(size=(samples, features))
    noisy = rng.random(samples) < LABEL_NOISE
    labels[noisy] = rng.integers(0, classes, size=int(noisy.sum()))
    return _split(x.astype(dtype), labels, classes)
