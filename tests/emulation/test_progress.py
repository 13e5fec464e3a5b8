import pytest

from lightning_hetero.emulation.progress import PROGRESS_DIR_ENV, read_progress, write_progress
from lightning_hetero.emulation.reporter import ProgressReporter


def test_records_are_replaced_per_rank(tmp_path):
    write_progress(tmp_path, rank=0, epoch=1, time_s=1.0)
    write_progress(tmp_path, rank=1, epoch=1, time_s=1.0)
    write_progress(tmp_path, rank=0, epoch=2, done=True, time_s=2.0)
    records = read_progress(tmp_path)
    assert (records[0].epoch, records[0].done, records[1].epoch) == (2, True, 1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank0.json", "rank1.json"]


def test_missing_directory_reads_as_empty(tmp_path):
    assert read_progress(tmp_path / "nowhere") == {}


def test_reporter_directory_from_environment(tmp_path, monkeypatch):
    monkeypatch.setenv(PROGRESS_DIR_ENV, str(tmp_path))
    assert ProgressReporter().directory == tmp_path
    monkeypatch.delenv(PROGRESS_DIR_ENV)
    with pytest.raises(ValueError, match=PROGRESS_DIR_ENV):
        ProgressReporter()
