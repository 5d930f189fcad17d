"""Image datasets beyond the embedded digits, read as uint8 arrays: the data kit's npz
subsets (``cifar10-subset``, ``mnist-subset`` under ``../shared/data``, or any npz of that
layout) and Hugging Face datasets (a Hub name found locally or on the Hub, a folder of data
files, or a ``save_to_disk`` folder). No PyTorch and no Flower import; ``datasets`` is
imported only for a Hugging Face dataset.

Nothing is downloaded for the default run (it uses the embedded digits and never reaches
this module's Hugging Face path). A Hugging Face name is resolved by ``datasets`` as usual:
from its cache and, unless ``HF_DATASETS_OFFLINE=1`` / ``HF_HUB_OFFLINE=1``, from the Hub.
"""

from __future__ import annotations

import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from fl_client.contract import SettingsError

REPO_ROOT = Path(__file__).resolve().parents[1]
#: The data kit beside the repository (``../shared/data``, see its MANIFEST.md).
DEFAULT_DATA_ROOT = REPO_ROOT.parent / "shared" / "data"
#: The data kit's image subsets: name → file under the data root.
SHARED_SUBSETS: dict[str, str] = {
    "cifar10-subset": "cifar10-subset.npz",
    "mnist-subset": "mnist-subset.npz",
}
#: Keys every image npz must hold (``classes`` is optional).
NPZ_KEYS = ("x_train", "y_train", "x_test", "y_test")
NPZ_LAYOUT = (
    "x_train, x_test: uint8 N×H×W×3 (or N×H×W×1, N×H×W) images; y_train, y_test: integer "
    "labels of length N in [0, 10); optional classes: 10 names (see ../shared/data/MANIFEST.md)"
)
#: powerfl's image models have ten outputs.
NUM_CLASSES = 10
#: Column names looked for in a Hugging Face dataset, in order.
IMAGE_COLUMNS = ("image", "img")
LABEL_COLUMNS = ("label", "labels", "fine_label")


class ImageDataError(SettingsError):
    """A dataset that cannot be read or lacks the expected layout; the message names the key
    (or the file) and what is missing."""


@dataclass(frozen=True)
class ImageArrays:
    """A labelled image dataset as stored: uint8 N×H×W×C images (C = 1 or 3), int64 labels
    in ``[0, NUM_CLASSES)``; ``x_test``/``y_test`` are None when it has no test split."""

    name: str
    source: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray | None
    y_test: np.ndarray | None
    classes: tuple[str, ...]

    def sizes(self) -> dict[str, int]:
        return {"train": len(self.y_train), "test": 0 if self.y_test is None else len(self.y_test)}


def is_npz_name(name: str) -> bool:
    """Whether ``name`` is read from an npz (a data-kit subset or a path ending in .npz)."""
    return name in SHARED_SUBSETS or name.endswith(".npz")


def npz_path(name: str, data_root: str | Path | None = None) -> Path:
    """The file of ``name``: a data-kit subset under ``data_root`` (default
    ``DEFAULT_DATA_ROOT``), else ``name`` itself as a path."""
    if name in SHARED_SUBSETS:
        root = Path(data_root).expanduser() if data_root else DEFAULT_DATA_ROOT
        return root / SHARED_SUBSETS[name]
    return Path(name).expanduser()


def _check_images(path: Path, key: str, x: np.ndarray) -> np.ndarray:
    if x.dtype != np.uint8:
        raise ImageDataError(
            f"{path}: {key} is {x.dtype}, lacks uint8 pixels; expected {NPZ_LAYOUT}"
        )
    if x.ndim == 3:
        x = x[..., None]
    if x.ndim != 4 or x.shape[-1] not in (1, 3) or min(x.shape[1:3]) < 1:
        raise ImageDataError(
            f"{path}: {key} has shape {x.shape}, lacks the N×H×W×C image layout (C = 1 or 3); "
            f"expected {NPZ_LAYOUT}"
        )
    return x


def _check_labels(path: Path | str, key: str, y: np.ndarray, n: int) -> np.ndarray:
    if y.ndim != 1 or len(y) != n:
        raise ImageDataError(
            f"{path}: {key} has shape {y.shape}, lacks one label per image ({n} images)"
        )
    if not np.issubdtype(y.dtype, np.integer):
        raise ImageDataError(f"{path}: {key} is {y.dtype}, lacks integer class labels")
    if n and (int(y.min()) < 0 or int(y.max()) >= NUM_CLASSES):
        raise ImageDataError(
            f"{path}: {key} holds labels {int(y.min())}..{int(y.max())}, lacks labels in "
            f"[0, {NUM_CLASSES}) (powerfl's image models have {NUM_CLASSES} outputs)"
        )
    return y.astype(np.int64)


def read_npz(path: str | Path, name: str | None = None) -> ImageArrays:
    """Read and check an image npz: refused, naming the file and what it lacks, when a key is
    missing or an array has the wrong type or shape.

    Raises
    ------
    ImageDataError
        The file is missing, unreadable, or not of the layout ``NPZ_LAYOUT``.
    """
    p = Path(path).expanduser()
    if not p.is_file():
        raise ImageDataError(f"{p}: no such file; expected an npz with {', '.join(NPZ_KEYS)}")
    try:
        with np.load(p, allow_pickle=False) as data:
            missing = [k for k in NPZ_KEYS if k not in data.files]
            if missing:
                raise ImageDataError(
                    f"{p}: lacks {', '.join(missing)} (it holds "
                    f"{', '.join(data.files) or 'nothing'}); expected {NPZ_LAYOUT}"
                )
            arrays = {k: np.asarray(data[k]) for k in (*NPZ_KEYS, "classes") if k in data.files}
    except ImageDataError:
        raise
    except (OSError, ValueError, zipfile.BadZipFile) as err:
        raise ImageDataError(f"{p}: not a readable npz ({err}); expected {NPZ_LAYOUT}") from None
    x_train = _check_images(p, "x_train", arrays["x_train"])
    x_test = _check_images(p, "x_test", arrays["x_test"])
    if x_train.shape[1:] != x_test.shape[1:]:
        raise ImageDataError(
            f"{p}: x_train images are {x_train.shape[1:]} but x_test images {x_test.shape[1:]}; "
            "lacks one image shape"
        )
    if len(x_train) == 0:
        raise ImageDataError(f"{p}: x_train is empty, lacks training images")
    y_train = _check_labels(p, "y_train", arrays["y_train"], len(x_train))
    y_test = _check_labels(p, "y_test", arrays["y_test"], len(x_test))
    classes: tuple[str, ...] = tuple(map(str, range(NUM_CLASSES)))
    if "classes" in arrays:
        c = arrays["classes"]
        if c.ndim != 1 or len(c) != NUM_CLASSES:
            raise ImageDataError(
                f"{p}: classes has shape {c.shape}, lacks {NUM_CLASSES} class names"
            )
        classes = tuple(str(v) for v in c.tolist())
    return ImageArrays(name or p.stem, str(p), x_train, y_train, x_test, y_test, classes)


@lru_cache(maxsize=4)
def _read_npz_cached(path: str, mtime_ns: int, name: str) -> ImageArrays:
    return read_npz(path, name)


def load_npz(name: str, data_root: str | Path | None = None) -> ImageArrays:
    """A data-kit subset (``SHARED_SUBSETS``, under ``data_root``) or an npz path, checked
    (``read_npz``) and cached per process while the file is unchanged."""
    path = npz_path(name, data_root)
    if not path.is_file():
        where = f"under {path.parent} (the data root)" if name in SHARED_SUBSETS else "at that path"
        raise ImageDataError(
            f"{path}: no such file; {name!r} is looked for {where}; expected an npz with "
            f"{', '.join(NPZ_KEYS)}"
        )
    return _read_npz_cached(str(path.resolve()), path.stat().st_mtime_ns, name)


# --------------------------------------------------------------------------- Hugging Face


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}"


#: File types a dataset folder is read from: images in class subfolders (``imagefolder``)
#: or data files; a folder with none of them holds no dataset.
DATA_FILE_SUFFIXES = (
    ".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp",
    ".parquet", ".arrow", ".csv", ".json", ".jsonl",
)  # fmt: skip


def check_data_folder(path: Path, key: str = "dataset") -> None:
    """A folder given as a dataset holds images or data files (``DATA_FILE_SUFFIXES``);
    else an ImageDataError naming the folder and what it may hold (the loader itself only
    says "Instruction 'train' corresponds to no data")."""
    files = [p for p in path.rglob("*") if p.is_file() and not p.name.startswith(".")]
    if not any(p.suffix.lower() in DATA_FILE_SUFFIXES for p in files):
        found = f"{len(files)} other file(s)" if files else "no files"
        raise ImageDataError(
            f"{key}: the folder {path} holds no images and no data files ({found}); give a "
            "folder of images in one subfolder per class, of data files "
            f"({', '.join(DATA_FILE_SUFFIXES[8:])}), a save_to_disk folder or an npz"
        )


def _open_hf(name: str, key: str) -> Mapping[str, Any]:
    try:
        import datasets
    except ImportError:  # pragma: no cover - a dependency of powerfl
        raise ImageDataError(
            f"{key}: {name!r} is a Hugging Face dataset, which needs the `datasets` package "
            "(pip install flwr-datasets)"
        ) from None
    path = Path(name).expanduser()
    saved = ("dataset_dict.json", "state.json")
    if path.is_dir() and not any((path / f).is_file() for f in saved):
        check_data_folder(path, key)
    try:
        if path.is_dir() and any((path / f).is_file() for f in saved):
            loaded = datasets.load_from_disk(str(path))
        else:
            loaded = datasets.load_dataset(name)
    except Exception as err:  # any loader failure means "not available here"
        raise ImageDataError(
            f"{key}: {name!r} is not 'digits', not one of the data kit's subsets "
            f"({', '.join(SHARED_SUBSETS)}) and not a Hugging Face dataset that can be loaded "
            f"here ({_first_line(err)}); give a Hub name in the local cache (or reachable "
            "Hub), a folder of data files or a save_to_disk folder"
        ) from None
    if isinstance(loaded, datasets.Dataset):
        return {"train": loaded}
    return dict(loaded)


def _pick(columns: list[str], wanted: tuple[str, ...]) -> str | None:
    return next((c for c in wanted if c in columns), None)


def _images_of(ds: Any, column: str, where: str) -> np.ndarray:
    """The column's images as uint8 N×H×W×C (PIL images converted; differing sizes are
    resized to the first image's size)."""
    try:
        arr = ds.with_format("numpy")[column]
        if isinstance(arr, np.ndarray) and arr.dtype != object:
            x = arr
        else:
            raise ValueError("images of different sizes")
    except ValueError:
        from PIL import Image

        images = [im if isinstance(im, Image.Image) else Image.fromarray(im) for im in ds[column]]
        size = images[0].size if images else (32, 32)
        mode = "RGB" if any(im.mode not in ("L", "1") for im in images) else "L"
        x = np.stack([np.asarray(im.convert(mode).resize(size)) for im in images])
    if np.issubdtype(x.dtype, np.floating) and x.size and float(x.max()) <= 1.0:
        x = np.clip(np.rint(x * 255.0), 0, 255)
    x = np.asarray(x)
    if x.ndim == 3:
        x = x[..., None]
    if x.ndim != 4 or x.shape[-1] not in (1, 3, 4):
        raise ImageDataError(
            f"{where}: column {column!r} has shape {x.shape}, lacks N×H×W×C images"
        )
    return x[..., :3].astype(np.uint8)


def load_hf(name: str, key: str = "dataset") -> ImageArrays:
    """A Hugging Face image-classification dataset: its ``train`` split (and ``test``, if
    any), the first of ``IMAGE_COLUMNS`` and of ``LABEL_COLUMNS``.

    Raises
    ------
    ImageDataError
        Not loadable here (``HF_DATASETS_OFFLINE=1`` and not cached, no such folder), no
        ``train`` split, no image or label column, or labels outside ``[0, 10)``; the
        message names ``key``.
    """
    splits = _open_hf(name, key)
    if "train" not in splits:
        raise ImageDataError(
            f"{key}: {name!r} has splits {', '.join(splits) or 'none'}, lacks a 'train' split"
        )
    out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    classes: tuple[str, ...] = tuple(map(str, range(NUM_CLASSES)))
    for split in ("train", "test"):
        if split not in splits:
            continue
        ds = splits[split]
        columns = list(ds.column_names)
        image_col, label_col = _pick(columns, IMAGE_COLUMNS), _pick(columns, LABEL_COLUMNS)
        if image_col is None or label_col is None:
            lacks = " and ".join(
                f"{what} column ({' or '.join(names)})"
                for what, names, col in (
                    ("an image", IMAGE_COLUMNS, image_col),
                    ("a label", LABEL_COLUMNS, label_col),
                )
                if col is None
            )
            raise ImageDataError(
                f"{key}: {name!r} ({split} split) has columns {', '.join(columns)}; lacks {lacks}"
            )
        where = f"{key}: {name!r} ({split} split)"
        x = _images_of(ds, image_col, where)
        y = _check_labels(where, f"column {label_col!r}", np.asarray(ds[label_col]), len(x))
        out[split] = (x, y)
        names = getattr(ds.features[label_col], "names", None)
        if split == "train" and names and len(names) <= NUM_CLASSES:
            classes = tuple(str(v) for v in names)
    x_tr, y_tr = out["train"]
    if len(y_tr) == 0:
        raise ImageDataError(f"{key}: {name!r} has an empty train split")
    test = out.get("test")
    if test is not None and test[0].shape[1:3] != x_tr.shape[1:3]:
        raise ImageDataError(
            f"{key}: {name!r}: train images are {x_tr.shape[1:3]}, test images "
            f"{test[0].shape[1:3]}; lacks one image size"
        )
    return ImageArrays(
        name,
        name,
        x_tr,
        y_tr,
        None if test is None else test[0],
        None if test is None else test[1],
        classes,
    )


@lru_cache(maxsize=2)
def load_hf_cached(name: str) -> ImageArrays:
    return load_hf(name)


def load_image_dataset(
    name: str, data_root: str | Path | None = None, key: str = "dataset"
) -> ImageArrays:
    """``name`` as image arrays: an npz (data-kit subset or path) or a Hugging Face dataset.

    ``key`` is the setting the name came from, named by every error.
    """
    if is_npz_name(name):
        try:
            return load_npz(name, data_root)
        except ImageDataError as err:
            raise ImageDataError(f"{key}: {err}") from None
    if key == "dataset":
        return load_hf_cached(name)
    return load_hf(name, key)
