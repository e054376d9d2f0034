"""Reading a ``torch.distributed.checkpoint`` directory (Megatron's torch_dist) safely: no
code runs, and a damaged file is named.

* ``.metadata`` is a pickle; torch's ``FileSystemReader`` unpickles it with ``pickle.load``,
  so a crafted one runs code. :class:`SafeFileSystemReader` unpickles it with
  :class:`MetadataUnpickler`, which resolves only the types a metadata file holds
  (``torch.distributed.checkpoint``'s dataclasses and enums, ``torch.Size``, dtypes,
  layouts, memory formats, a few builtin containers) and refuses any other global. The
  tensors of the ``.distcp`` files are read by torch with ``weights_only=True``.
* Every problem is a :class:`DamagedCheckpointError` (a ValueError: exit status 2) naming
  the file and what is wrong: ``.metadata`` unreadable or holding a foreign type, a
  ``.distcp`` file missing or shorter than its entries in ``.metadata``, or one whose
  content cannot be decoded (found by reading the tensors one by one after a failure).
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
import io
import os
import pickle

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint import load as dcp_load
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import Metadata

__all__ = ["DamagedCheckpointError", "MetadataUnpickler", "SafeFileSystemReader",
           "read_metadata", "check_files", "load_tensors"]

METADATA = ".metadata"
"""The metadata file of a torch.distributed.checkpoint directory."""
_DCP_MODULES = ("torch.distributed.checkpoint.",)
_BUILTINS = {("builtins", name) for name in ("set", "frozenset", "slice", "complex")} | {
    ("pathlib", name) for name in ("Path", "PosixPath", "PurePosixPath", "WindowsPath",
                                   "PureWindowsPath")} | {
    ("collections", "OrderedDict"), ("torch", "Size"), ("torch.serialization", "_get_layout")}


class DamagedCheckpointError(ValueError):
    """A file of a torch_dist checkpoint is missing, truncated, undecodable or holds a
    foreign type (the message names it)."""


class _Refused(pickle.UnpicklingError):
    """A global :class:`MetadataUnpickler` does not resolve."""


class MetadataUnpickler(pickle.Unpickler):
    """Unpickles a ``.metadata`` file, resolving only the globals such a file holds."""

    def find_class(self, module: str, name: str):
        if (module, name) in _BUILTINS:
            return getattr(importlib.import_module(module), name)
        if module == "torch":
            value = getattr(torch, name, None)
            if isinstance(value, (torch.dtype, torch.layout, torch.memory_format)):
                return value
        elif module.startswith(_DCP_MODULES) and "." not in name:
            value = getattr(importlib.import_module(module), name, None)
            if isinstance(value, type) and (dataclasses.is_dataclass(value)
                                            or issubclass(value, enum.Enum)):
                return value
        raise _Refused(f"it refers to {module}.{name}, which a checkpoint's metadata never "
                       f"holds")


def read_metadata(directory: str) -> Metadata:
    """The ``.metadata`` of a checkpoint directory, unpickled by :class:`MetadataUnpickler`;
    :class:`DamagedCheckpointError` naming the file when it is missing, damaged or foreign."""
    path = os.path.join(directory, METADATA)
    try:
        with open(path, "rb") as handle:
            metadata = MetadataUnpickler(handle).load()
    except FileNotFoundError:
        raise DamagedCheckpointError(f"torch_dist checkpoint file {path} is missing") from None
    except _Refused as exc:
        raise DamagedCheckpointError(f"torch_dist checkpoint file {path} was not loaded "
                                     f"(nothing in it ran): {exc}") from None
    except (pickle.UnpicklingError, EOFError, OSError, ValueError, TypeError, AttributeError,
            IndexError, KeyError, UnicodeDecodeError) as exc:
        size = os.path.getsize(path) if os.path.exists(path) else 0
        raise DamagedCheckpointError(f"torch_dist checkpoint file {path} is truncated or "
                                     f"damaged ({size} bytes; unpickling failed with "
                                     f"{type(exc).__name__}: {exc})") from None
    if not isinstance(metadata, Metadata) or metadata.storage_data is None:
        raise DamagedCheckpointError(f"torch_dist checkpoint file {path} holds no "
                                     f"checkpoint metadata (a {type(metadata).__name__})")
    return metadata


def check_files(directory: str, metadata: Metadata) -> None:
    """Every data file ``metadata`` refers to exists and is long enough for its entries;
    :class:`DamagedCheckpointError` naming the first one that is not."""
    needed: dict[str, int] = {}
    for info in metadata.storage_data.values():
        end = int(info.offset) + int(info.length)
        needed[info.relative_path] = max(needed.get(info.relative_path, 0), end)
    for name, end in sorted(needed.items()):
        path = os.path.join(directory, name)
        if not os.path.isfile(path):
            raise DamagedCheckpointError(f"torch_dist checkpoint file {path} is missing (its "
                                         f"{METADATA} locates data in it)")
        size = os.path.getsize(path)
        if size < end:
            raise DamagedCheckpointError(f"torch_dist checkpoint file {path} is truncated: "
                                         f"{size} bytes, its {METADATA} locates data up to "
                                         f"byte {end}")


class SafeFileSystemReader(FileSystemReader):
    """torch's reader with :func:`read_metadata` in place of its ``pickle.load``."""

    def read_metadata(self, *args, **kwargs) -> Metadata:
        metadata = read_metadata(os.fspath(self.path))
        if getattr(metadata, "storage_meta", None) is not None:
            metadata.storage_meta.load_id = self.load_id
        return metadata


def _damaged_entry(directory: str, metadata: Metadata, keys) -> str | None:
    """"FILE is damaged: tensor KEY at bytes A-B ..." for the first stored tensor of
    ``keys`` whose bytes torch cannot decode, or None."""
    entries = sorted(((info.relative_path, int(info.offset), index.fqn, info)
                      for index, info in metadata.storage_data.items() if index.fqn in keys),
                     key=lambda entry: entry[:3])
    for name, offset, key, info in entries:
        if info.transform_descriptors:  # compressed or otherwise transformed: not checked
            continue
        path = os.path.join(directory, name)
        with open(path, "rb") as handle:
            handle.seek(offset)
            chunk = handle.read(int(info.length))
        try:
            torch.load(io.BytesIO(chunk), map_location="cpu", weights_only=True)
        except Exception as exc:
            return (f"torch_dist checkpoint file {path} is damaged: tensor {key!r} at bytes "
                    f"{offset}-{offset + int(info.length)} cannot be decoded ({_reason(exc)})")
    return None


def load_tensors(directory: str, tensors: dict[str, torch.Tensor],
                 metadata: Metadata) -> None:
    """Fill ``tensors`` (preallocated, by key) from the checkpoint, without collectives;
    a failure is a :class:`DamagedCheckpointError` naming the file and the tensor whose
    bytes cannot be decoded (each stored tensor is then decoded on its own to find it)."""
    try:
        dcp_load(tensors, storage_reader=SafeFileSystemReader(directory), no_dist=True)
    except (Exception, CheckpointException) as exc:  # a BaseException: caught here
        found = _damaged_entry(directory, metadata, set(tensors))
        raise DamagedCheckpointError(found or f"torch_dist checkpoint {directory} cannot be "
                                     f"read: {_reason(exc)}") from None


def _reason(exc: BaseException) -> str:
    """The innermost message of a (possibly wrapped) load failure, on one line."""
    if isinstance(exc, CheckpointException) and exc.failures:
        exc = next(iter(exc.failures.values()))[0]
    while exc.__cause__ is not None:
        exc = exc.__cause__
    text = " ".join(str(exc).split())
    text = text.split(". ")[0][:300]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__

