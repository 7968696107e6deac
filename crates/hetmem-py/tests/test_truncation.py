"""Files truncated under hetmem's windows raise ``HetmemError`` naming the file, where each of
these cases ended the interpreter with SIGBUS; each runs in a child interpreter, so a crash
fails the test instead of ending the suite."""

import subprocess
import sys
import textwrap

import pytest

import hetmem
from hetmem import loader

RECORD = (8, 8, 3)


def run_child(script: str, path) -> subprocess.CompletedProcess:
    """Runs ``script`` (with ``hetmem``, ``np`` and ``os`` imported and ``path`` set) in a fresh
    interpreter."""
    prelude = f"import os, sys\nimport numpy as np\nimport hetmem\npath = {str(path)!r}\n"
    return subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(script)],
                          capture_output=True, text=True, timeout=120)


def assert_raised(child: subprocess.CompletedProcess, path) -> None:
    """The child caught a HetmemError that names the file and the truncation, and ended well."""
    report = f"rc {child.returncode}\n{child.stdout}\n{child.stderr}"
    assert child.returncode == 0, report
    assert child.stdout.startswith("raised: "), report
    assert str(path) in child.stdout and "no longer holds bytes" in child.stdout, report
    assert "remedy" in child.stdout, report


def test_a_window_of_a_file_truncated_afterwards_raises(tmp_path):
    path = tmp_path / "shrinks.bin"
    path.write_bytes(bytes(range(256)) * 4096)
    child = run_child("""
        window = hetmem.MappedFile(path).window(0, 1 << 20)
        os.truncate(path, 4096)
        try:
            print(int(window.numpy()[-1]))  # read past the file's end: SIGBUS before
        except hetmem.HetmemError as error:
            print(f"raised: {error}")
    """, path)
    assert_raised(child, path)


def test_a_window_asked_for_past_the_end_of_a_shrunk_file_raises(tmp_path):
    path = tmp_path / "shrunk.bin"
    path.write_bytes(b"\x01" * (1 << 20))
    child = run_child("""
        mapped = hetmem.MappedFile(path)
        os.truncate(path, 4096)
        try:
            print(int(mapped.window(0, mapped.nbytes).numpy()[-1]))
        except hetmem.HetmemError as error:
            print(f"raised: {error}")
    """, path)
    assert_raised(child, path)


@pytest.mark.skipif(hetmem.device().backend == "cuda",
                    reason="skipped: on a GPU the loader reads the records on the GPU, not natively")
def test_the_loader_over_a_records_file_truncated_afterwards_raises(tmp_path):
    images, labels = tmp_path / "images.u8", tmp_path / "labels.i64"
    loader.write_records(images, labels, 512, RECORD, seed=1)
    child = run_child(f"""
        from hetmem import loader
        records = loader.RecordLoader(path, {str(labels)!r}, 64, {RECORD!r}, output="buffer", shuffle=False)
        os.truncate(path, 4096)
        try:
            for images, _ in records:  # the native batch preparation: SIGBUS before
                pass
            print("no error")
        except hetmem.HetmemError as error:
            print(f"raised: {{error}}")
    """, images)
    assert_raised(child, images)


def test_the_staged_gather_over_a_truncated_window_raises(tmp_path):
    path = tmp_path / "records.u8"
    path.write_bytes(bytes(range(256)) * 4096)
    child = run_child("""
        from hetmem import _native
        window = hetmem.MappedFile(path).window(0, 1 << 20)
        out = hetmem.pinned(56 * 4096)
        os.truncate(path, 4096)
        try:
            # the loader's staged gather, natively: np.take over the window's view was SIGBUS
            _native.gather_records(window._memory, 4096, list(range(200, 256)), out._memory)
            print("no error")
        except hetmem.HetmemError as error:
            print(f"raised: {error}")
    """, path)
    assert_raised(child, path)


def test_the_loader_checks_its_file_at_each_epoch(tmp_path):
    images, labels = tmp_path / "images.u8", tmp_path / "labels.i64"
    loader.write_records(images, labels, 512, RECORD, seed=2)
    child = run_child(f"""
        from hetmem import loader
        output = "torch" if hetmem.device().backend == "cuda" else "buffer"
        records = loader.RecordLoader(path, {str(labels)!r}, 64, {RECORD!r}, output=output, shuffle=False)
        for _ in records:
            pass
        os.truncate(path, 4096)
        try:
            iter(records)  # the next epoch: on a GPU, kernels would read the stale pages
            print("no error")
        except hetmem.HetmemError as error:
            print(f"raised: {{error}}")
    """, images)
    assert_raised(child, images)
