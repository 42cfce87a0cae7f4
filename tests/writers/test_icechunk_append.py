"""A batch into an Icechunk repository appends what it adds: each grown archive is one commit
holding the new references only, and every snapshot reads as its files.

The archive is irregular (files of 28-31 days in chunks of 10, so most files end in a padded
chunk, which becomes interior when a file follows it and is then stored cropped). Ground
truth: ``xr.open_mfdataset`` of the files each snapshot should hold; what a commit changed:
Icechunk's own diff between snapshots.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import xarray as xr

import refgrid
from archive_files import CHUNK, lengths, write_archive
from helpers import RECTILINEAR, closed

icechunk = pytest.importorskip("icechunk")
if int(icechunk.__version__.split(".")[0]) < 2 or not RECTILINEAR:
    pytest.skip("Icechunk >= 2 and zarr >= 3.2 store and read rectilinear grids",
                allow_module_level=True)

from refgrid.writers.icechunk import local_access, local_repository  # noqa: E402


def expected(files: list[Path]) -> xr.Dataset:
    return closed(xr.open_mfdataset(files, combine="nested", concat_dim="time",
                                    data_vars="minimal", coords="minimal", compat="override"))


def snapshot(repo, snapshot_id: str) -> xr.Dataset:
    import zarr

    with zarr.config.set({"array.rectilinear_chunks": True}):
        return closed(xr.open_zarr(repo.readonly_session(snapshot_id=snapshot_id).store,
                                   consolidated=False))


def reopened(path: Path, landing: Path):
    prefix = f"file://{landing.resolve()}/"
    return icechunk.Repository.open(icechunk.local_filesystem_storage(str(path)),
                                    authorize_virtual_chunk_access={
                                        prefix: local_access(icechunk)})


def batch(files, repo, work: Path):
    return refgrid.batch([str(f) for f in files], repo, work_dir=work, progress=False,
                         scheduler="synchronous")


def test_each_append_is_a_commit_of_the_new_references_and_every_snapshot_reads(tmp_path):
    landing = tmp_path / "landing"
    files = write_archive(landing, range(7))
    repo = local_repository(tmp_path / "repo", [str(f) for f in files])
    work = tmp_path / "work"
    steps, snapshots = (2, 4, 5, 7), []
    for n in steps:
        result = batch(files[:n], repo, work)
        assert result.update.startswith("new" if n == 2 else "append"), result.update
        snapshots.append(result.snapshot)
    repo = reopened(tmp_path / "repo", landing)
    for n, snap in zip(steps, snapshots, strict=True):  # every snapshot: its own files
        got, want = snapshot(repo, snap), expected(files[:n])
        xr.testing.assert_equal(got[["tas"]], want[["tas"]])
        np.testing.assert_array_equal(got["time"].values, want["time"].values)
    # what the last commit holds: the chunks from the last file before it on, and the
    # concat coordinate; nothing of the files before
    diff = repo.diff(from_snapshot_id=snapshots[-2], to_snapshot_id=snapshots[-1])
    chunks = [-(-n // CHUNK) for n in lengths(range(7))]
    first = sum(chunks[:steps[-2] - 1])  # the last file's first chunk, in the snapshot before
    touched = sorted({c[0] for c in diff.updated_chunks["/tas"]})
    assert touched == list(range(first, sum(chunks))), touched
    assert set(diff.updated_arrays) <= {"/tas", "/time"}
    # and the same files from scratch read the same
    fresh = batch(files, local_repository(tmp_path / "fresh", [str(f) for f in files]),
                  tmp_path / "fresh-work")
    assert fresh.update.startswith("new")
    xr.testing.assert_identical(snapshot(reopened(tmp_path / "fresh", landing),
                                         fresh.snapshot), snapshot(repo, snapshots[-1]))


@pytest.mark.parametrize("change", ["backfill", "foreign commit", "changed"])
def test_what_an_append_cannot_take_is_committed_whole_and_said(tmp_path, change):
    import os

    landing = tmp_path / "landing"
    files = write_archive(landing, [0, 2, 3])
    repo = local_repository(tmp_path / "repo", [str(f) for f in files])
    work = tmp_path / "work"
    batch(files[:2], repo, work)
    given = files
    if change == "backfill":
        given = sorted([*files, *write_archive(landing, [1])])
    elif change == "foreign commit":
        session = repo.writable_session("main")
        import zarr

        zarr.open_group(session.store, mode="r+").attrs["note"] = "edited by hand"
        session.commit("someone else's commit")
    else:
        os.utime(files[0], (1, 1))
    result = batch(given, repo, work)
    reason = {"backfill": "backfill", "foreign commit": "commits this batch did not make",
              "changed": "changed since it was written"}[change]
    assert result.update.startswith("rebuild") and reason in result.update, result.update
    got = snapshot(reopened(tmp_path / "repo", landing), result.snapshot)
    want = expected(given)
    xr.testing.assert_equal(got[["tas"]], want[["tas"]])


def test_files_named_as_new_are_a_commit_of_their_references(tmp_path):
    """``append=True`` (the new files named, the archive's neither listed nor checked)
    commits as a batch over every file would, and refuses backfill with the branch kept."""
    landing = tmp_path / "landing"
    files = write_archive(landing, range(5))
    repo = local_repository(tmp_path / "repo", [str(f) for f in files])
    work = tmp_path / "work"
    first = batch(files[:3], repo, work)
    head = repo.lookup_branch("main")
    with pytest.raises(refgrid.BatchError, match="backfill"):
        refgrid.batch([str(files[4]), str(files[1].rename(landing / "early.nc"))], repo,
                      work_dir=work, progress=False, scheduler="synchronous", append=True)
    assert repo.lookup_branch("main") == head
    (landing / "early.nc").rename(files[1])
    added = refgrid.batch([str(f) for f in files[3:]], repo, work_dir=work, progress=False,
                          scheduler="synchronous", append=True)
    assert added.update == "append: 2 file(s) named as new: a commit of the new references"
    assert added.snapshot not in (None, first.snapshot)
    xr.testing.assert_identical(snapshot(repo, added.snapshot), expected(files))
    xr.testing.assert_identical(snapshot(repo, first.snapshot), expected(files[:3]))


def test_an_append_commits_the_last_piece_of_the_time_coordinate_and_the_new_ones(
        tmp_path, monkeypatch):
    """The concat coordinate in pieces of 40 steps: a commit holds the last stored piece
    (written again, longer) and the new ones, nothing before."""
    monkeypatch.setattr("refgrid.model.virtual.INLINE_PIECE", 40)
    landing = tmp_path / "landing"
    files = write_archive(landing, range(7))
    repo = local_repository(tmp_path / "repo", [str(f) for f in files])
    work = tmp_path / "work"
    first = batch(files[:5], repo, work)
    pieces = -(-sum(lengths(range(5))) // 40)
    added = refgrid.batch([str(f) for f in files[5:]], repo, work_dir=work, progress=False,
                          scheduler="synchronous", append=True)
    repo = reopened(tmp_path / "repo", landing)
    diff = repo.diff(from_snapshot_id=first.snapshot, to_snapshot_id=added.snapshot)
    assert sorted(c[0] for c in diff.updated_chunks["/time"]) == \
        list(range(pieces - 1, -(-sum(lengths(range(7))) // 40)))
    xr.testing.assert_identical(snapshot(repo, added.snapshot), expected(files))
    xr.testing.assert_identical(snapshot(repo, first.snapshot), expected(files[:5]))
