"""What a checkpoint file is, told from its bytes: a ``torch.save`` file, a safetensors file, or neither.

``torch.load`` reports a text file, random bytes or a foreign zip with errors that read like a refused
checkpoint (random bytes reach its weights-only unpickler and fail as ``UnpicklingError``), so the file's
structure is read first: ``torch.save``'s zip archive (one folder holding ``data.pkl``), its legacy pickle
(which starts with torch's magic number), torch < 0.4's tar archive, or safetensors' length-prefixed JSON
header. Only a file that is a checkpoint by structure reaches ``torch.load``; when that load is refused, the
pickle is walked (never run) to tell objects the weights-only loader refuses from a truncated pickle.
"""
import io
import pickle
import pickletools
import struct
import tarfile
import zipfile
from pathlib import Path
from typing import List, Optional

import torch

from timm_ext.load_errors import HubError, first_line

__all__ = ['LEGACY', 'SAFETENSORS', 'TAR', 'ZIP', 'checkpoint_format', 'pickled_globals']

ZIP, LEGACY, TAR, SAFETENSORS = 'zip', 'legacy', 'tar', 'safetensors'
EXPECTED = ('expected a file written by torch.save (train.py\'s last.pth.tar or model_best.pth.tar, a .pth '
            'state_dict) or a .safetensors file')
_HEAD = 512  # a tar header is 512 bytes; every other signature sits in the first 32
# legacy torch.save writes MAGIC_NUMBER as the first pickle: PROTO, then LONG1 with 10 little-endian bytes
_LEGACY_MAGIC = b'\x8a\x0a' + torch.serialization.MAGIC_NUMBER.to_bytes(10, 'little')
# globals of a torch.save pickle that are not user objects (named in the refusal message when others are present)
_TENSOR_MODULES = ('torch', 'collections', '_codecs', 'builtins')
_STRING_OPS = ('SHORT_BINUNICODE', 'BINUNICODE', 'BINUNICODE8', 'UNICODE', 'SHORT_BINSTRING', 'BINSTRING', 'STRING')


def checkpoint_format(path: Path) -> str:
    """``ZIP``, ``LEGACY``, ``TAR`` (``torch.save`` files) or ``SAFETENSORS``; any other file is a HubError that says
    what the file is and what was expected."""
    try:
        with path.open('rb') as f:
            head = f.read(_HEAD)
        size = path.stat().st_size
    except OSError as e:
        raise HubError(f'{path} cannot be read ({e.strerror or type(e).__name__}): check its permissions') from None
    if head.startswith((b'PK\x03\x04', b'PK\x05\x06')):
        return _zip_format(path)
    if head[:1] == b'\x80' and _LEGACY_MAGIC in head[:32]:
        return LEGACY
    if _is_safetensors(head, size):
        return SAFETENSORS
    if head[257:262] == b'ustar' and _is_torch_tar(path):
        return TAR
    raise HubError(f'{path} is not a PyTorch checkpoint ({_describe(head, size)}): {EXPECTED}')


def _zip_format(path: Path) -> str:
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
    except (zipfile.BadZipFile, OSError) as e:
        raise HubError(f'{path} is not a readable PyTorch checkpoint (a zip archive that is truncated or corrupt: '
                       f'{first_line(e)}): copy it again, or save it again with torch.save') from None
    if any(n.count('/') == 1 and n.endswith('/data.pkl') for n in names):
        return ZIP
    shown = ', '.join(names[:3]) if names else 'no files'
    raise HubError(f'{path} is not a PyTorch checkpoint (a zip archive of {shown}, without torch.save\'s '
                   f'<name>/data.pkl): {EXPECTED}')


def _is_safetensors(head: bytes, size: int) -> bool:
    # an 8-byte little-endian header length, then a JSON object of that length
    if len(head) < 10:
        return False
    (length,) = struct.unpack('<Q', head[:8])
    return 2 <= length <= size - 8 and head[8:9] == b'{'


def _is_torch_tar(path: Path) -> bool:
    try:
        with tarfile.open(path) as archive:
            return {'storages', 'tensors', 'pickle'} <= set(archive.getnames())
    except (tarfile.TarError, OSError):
        return False


def _describe(head: bytes, size: int) -> str:
    if size == 0:
        return 'it is empty'
    if head[:1] == b'\x80':
        return 'a Python pickle that torch.save did not write'
    text = _text(head)
    if text is not None:
        line = next((s.strip() for s in text.splitlines() if s.strip()), '')
        return f'it is text: {line[:40]!r}'
    return f'unknown binary data starting {head[:8].hex(" ")}'


def _text(head: bytes) -> Optional[str]:
    if b'\x00' in head:
        return None
    try:
        text = head.decode('utf-8')
    except UnicodeDecodeError as e:
        if e.start < len(head) - 3:  # not only a character cut at the end of the sample
            return None
        text = head[:e.start].decode('utf-8')
    text = text.lstrip('\ufeff')  # a byte-order mark
    return text if all(c.isprintable() or c in '\t\n\r\f' for c in text) else None


def pickled_globals(path: Path, fmt: str) -> Optional[List[str]]:
    """The classes and functions a ``torch.save`` file's pickle refers to, other than torch's and containers'
    (``module.name``, in order); ``None`` when the pickle is truncated or corrupt. Read with pickletools: nothing
    is imported or run."""
    try:
        if fmt == ZIP:
            with zipfile.ZipFile(path) as archive:
                name = next(n for n in archive.namelist() if n.count('/') == 1 and n.endswith('/data.pkl'))
                return _globals(io.BytesIO(archive.read(name)), pickles=1)
        with path.open('rb') as f:  # LEGACY: magic number, protocol, sys_info, then the saved object
            return _globals(f, pickles=4)
    except (ValueError, EOFError, pickle.PickleError, zipfile.BadZipFile, OSError, StopIteration):
        return None


def _globals(stream, pickles: int) -> List[str]:
    found: List[str] = []
    for _ in range(pickles):
        strings: List[str] = []
        for opcode, arg, _pos in pickletools.genops(stream):
            if opcode.name == 'GLOBAL':
                found.append(arg.replace(' ', '.'))
            elif opcode.name == 'STACK_GLOBAL' and len(strings) >= 2:
                found.append('.'.join(strings[-2:]))
            elif opcode.name in _STRING_OPS:
                strings.append(str(arg))
    return [g for g in dict.fromkeys(found) if g.split('.')[0] not in _TENSOR_MODULES and g != 'argparse.Namespace']
