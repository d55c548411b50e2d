"""Small file helpers shared by the commands and the harness."""
from __future__ import annotations

import json
import os
import stat
from pathlib import Path


def write_json(path: str | Path, obj) -> None:
    """Write ``obj`` to ``path`` as indented JSON with a final newline, creating the folder."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(obj, fh, indent=2)
        fh.write("\n")


def umask() -> int:
    """The process's file-creation mask (read without changing it, from ``/proc`` where there is one)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)  # no /proc: read it by setting it, and put it back at once
    os.umask(mask)
    return mask


def usual_file_modes(folder: str | Path) -> None:
    """Give every regular file under ``folder`` the mode a newly created file gets (``0o666`` less the
    umask; executable bits kept), so a folder this program wrote has one mode throughout. Libraries that
    write through a private temporary file (transformers' ``save_pretrained`` writes
    ``model.safetensors`` via ``mkstemp``: mode 0600) would otherwise leave some files unreadable to
    the group and others while the rest of the folder is readable."""
    want = 0o666 & ~umask()
    for p in Path(folder).rglob("*"):
        if p.is_file() and not p.is_symlink():
            mode = stat.S_IMODE(p.stat().st_mode)
            target = want | (mode & 0o111 & ~umask())
            if mode != target:
                os.chmod(p, target)


def not_utf8(path: str | Path, e: UnicodeDecodeError) -> str:
    """The one-line message for a file that is not UTF-8 text: the file, the first bad byte's offset and
    value (a task's data file, a YAML config, an accelerate config)."""
    return f"{path}: not UTF-8 text (byte {e.start}: {e.object[e.start:e.start + 1]!r}); save the file as UTF-8"


def first_line(e: BaseException) -> str:
    """The first line (and first sentence) of an exception's message, or its type's name."""
    return (str(e).strip().splitlines() or [type(e).__name__])[0].split(". ")[0]


def unreadable_file(folder: str | Path, torch_files: bool = True) -> tuple[Path, str] | None:
    """``(file, why)`` for the first weights or state file directly in ``folder`` that does not read,
    else ``None`` (``torch_files=False``: the ``.safetensors`` files only).

    Cheap checks, never the whole data: a ``.safetensors`` file is opened with ``safetensors.safe_open``
    (header parsed, every tensor's bytes present); a ``torch.save`` file (``.pt``, ``.bin``, ``.pkl``:
    zip archives) must have its zip directory, which sits at its end, so a file cut short fails."""
    import zipfile

    from safetensors import safe_open

    for f in sorted(Path(folder).iterdir()):
        try:
            if f.suffix == ".safetensors":
                with safe_open(str(f), framework="pt") as handle:
                    handle.keys()
            elif torch_files and f.suffix in (".pt", ".bin", ".pkl") and f.is_file():
                with zipfile.ZipFile(f):
                    pass
        except Exception as e:  # noqa: BLE001 - any failure to read is the file's
            return f, first_line(e)
    return None


def check_weights_read(path, what: str) -> None:
    """Refuse a model folder whose ``.safetensors`` file does not read (cut short, corrupt) in one line
    naming the file, before anything loads it (:func:`unreadable_file`: headers only). Anything but an
    existing folder (a Hub id, ``None``) is left to the loader.

    Raises:
        ValueError: naming ``what`` (``"--model"``, ``"model.path"``) and the file.
    """
    if path and Path(path).is_dir():
        bad = unreadable_file(path, torch_files=False)
        if bad:
            raise ValueError(f"{what}: {bad[0]} cannot be read ({bad[1]}); the model folder is damaged (cut short "
                             "or corrupt): save or copy it again, or give another folder")
