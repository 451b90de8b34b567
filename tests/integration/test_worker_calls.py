"""What a traced DataLoader worker records (issue 39, ``worker_calls``): by default the user's own
dataset code and the C calls it makes, none of the library Python code under it; ``"all"``: every
call. On ``examples/vision.py``'s augmenting dataset (NumPy crop/flip/noise, torch's default
collate), two forked workers, a real Trainer.

Before: a worker traced every call of the fetch (torch's fetcher, NumPy's ``pad`` internals, the
collate), ~3,800 events per 32-sample batch here and 47,000 with PIL/torchvision, so a traced fetch
cost several times an untraced one and inflated the window's data wait.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from conftest import recorded_name
from support.vision_fit import fit_vision
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from vt_lightning.analysis.usercode import code_origin, parse_function

USER_FUNCTIONS = {  # as _worker_calls counts them: 3.10's code objects have no qualified name
    name if sys.version_info >= (3, 11) else f"user:{recorded_name(name)}"
    for name in ("AugmentedImages.__getitem__", "AugmentedImages.augment", "decode", "random_crop", "add_noise")
}
BATCH = 16
WINDOW_BATCHES = 2


def _worker_calls(root: Path, loader: Any = None, **options: Any) -> tuple[Counter[str], Counter[str], int]:
    """Fit with one window of two batches; the workers' Python calls by name and by origin
    (user / package / stdlib / builtin for C calls), and how many batches they fetched traced."""
    (trace,) = fit_vision(
        root,
        max_steps=5,
        batch_size=BATCH,
        length=256,
        loader=loader,
        wait=1,
        warmup=1,
        active=WINDOW_BATCHES,
        repeat=1,
        **options,
    )
    workers = {
        e["pid"]
        for e in trace["traceEvents"]
        if e.get("name") == "process_name" and "DataLoader worker" in e["args"]["name"]
    }
    names: Counter[str] = Counter()
    origins: Counter[str] = Counter()
    fetches = 0
    for event in trace["traceEvents"]:
        if event.get("ph") != "X" or event.get("pid") not in workers:
            continue
        if event["name"].startswith("fetch batch "):
            fetches += 1
            continue
        name, file, _ = parse_function(event["name"])
        origin = code_origin(file)[0]
        # 3.10 names a call without its class: a library's ``__getitem__`` is not the user's
        names[name if origin != "user" or sys.version_info >= (3, 11) else f"user:{name}"] += 1
        origins[origin] += 1
    return names, origins, fetches


def test_a_worker_records_the_users_code_and_not_the_library_code_under_it(tmp_path):
    names, origins, fetches = _worker_calls(tmp_path)
    assert fetches == WINDOW_BATCHES, fetches
    samples = fetches * BATCH
    for function in USER_FUNCTIONS:  # every sample's user calls, in full
        assert names[function] == samples, (function, names.most_common(20))
    # No Python call into NumPy, torch (its fetcher) or the standard library, but one span per
    # fetch for the library function the worker calls itself: torch's collate, not its subtree...
    assert names["default_collate"] == fetches, names.most_common(20)
    assert origins["package"] == fetches and origins["stdlib"] == 0, (origins, names.most_common(20))
    # ...only the user's calls and the C calls they make (astype, from_numpy...): a few per sample.
    assert origins["builtin"] > 0 and sum(origins.values()) <= 20 * samples, (origins, names.most_common(20))


def test_worker_calls_all_records_the_library_code_too(tmp_path):
    names, origins, fetches = _worker_calls(tmp_path, worker_calls="all")
    assert fetches == WINDOW_BATCHES, fetches
    assert all(names[function] == fetches * BATCH for function in USER_FUNCTIONS), names.most_common(20)
    assert names["default_collate"] >= fetches and names["pad"] >= fetches * BATCH, names.most_common(30)
    assert origins["package"] > 10 * origins["user"], origins


def _images(length: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return torch.rand(length, 3, 32, 32, generator=generator), torch.randint(0, 10, (length,), generator=generator)


def test_a_library_dataset_shows_one_span_per_item_and_nothing_under_it(tmp_path):
    """torch's ``TensorDataset`` stands for any installed package's dataset (torchvision's
    ``ImageFolder``): its ``__getitem__`` is a span per sample, named by its qualified name (on 3.10
    too), with nothing of the library under it."""
    loader = DataLoader(TensorDataset(*_images(256)), batch_size=BATCH, num_workers=2, collate_fn=_stack)
    names, origins, fetches = _worker_calls(tmp_path, loader)
    assert fetches == WINDOW_BATCHES, fetches
    assert names["TensorDataset.__getitem__"] == fetches * BATCH, names.most_common(20)
    assert origins["package"] == fetches * BATCH and origins["stdlib"] == 0, (origins, names.most_common(20))
    # The user's collate after the library's items: recorded in full (the tracer is back on).
    stack = "_stack" if sys.version_info >= (3, 11) else f"user:{recorded_name('_stack')}"
    assert names[stack] == fetches and names["torch.stack"] == 2 * fetches, names.most_common(20)


def _stack(samples: list[tuple[torch.Tensor, torch.Tensor]]) -> list[torch.Tensor]:
    """The user's collate function."""
    images, labels = zip(*samples)
    return [torch.stack(images), torch.stack(labels)]


class _Stream(IterableDataset):
    """The user's iterable dataset: a generator of its own, per worker."""

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        images, labels = _images(256)
        for k in range(len(labels)):
            yield _sample(images, labels, k)


def _sample(images: torch.Tensor, labels: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    return images[k], labels[k]


def test_an_iterable_datasets_own_code_is_recorded_per_sample(tmp_path):
    names, origins, fetches = _worker_calls(tmp_path, DataLoader(_Stream(), batch_size=BATCH, num_workers=2))
    assert fetches == WINDOW_BATCHES, fetches
    sample = "_sample" if sys.version_info >= (3, 11) else f"user:{recorded_name('_sample')}"
    assert names[sample] == fetches * BATCH, names.most_common(20)
    assert names["default_collate"] == fetches and origins["stdlib"] == 0, (origins, names.most_common(20))
