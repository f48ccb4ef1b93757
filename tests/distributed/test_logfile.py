"""Rank log files on a node (``_logfile``) and their uploader (``_logupload``): the records, partial lines, rotation
and its cap, reading back, a killed writer, a failing disk, uploads to a folder and to a real S3 endpoint (moto's
server), and the collector configs of docs/guide/logs-collectors.md against files the writer really wrote.

Pure: no Ray, no kernel; a child process only where the test is about a process dying.
"""

from __future__ import annotations

import glob
import gzip
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import tomllib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _poll import wait_for

from gpu_notebook.distributed._logfile import RankLogFile, default_log_dir, read_tail, safe_name
from gpu_notebook.distributed._logupload import LogUploader

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]
FIELDS = ["time", "rank", "node", "cluster", "stream", "line"]


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(raw) for raw in path.read_bytes().splitlines()]


def _numbered(f: RankLogFile, start: int, count: int) -> None:
    for i in range(start, start + count):
        f.write(f"line {i:06d}\n")


def _numbers(records: list[dict[str, Any]]) -> list[int]:
    return [int(r["line"].split()[1]) for r in records]


# ---- records


def test_each_complete_line_is_one_record_with_every_field(tmp_path: Path) -> None:
    with RankLogFile(str(tmp_path), 3, "10.0.0.5", "démo", max_bytes=4096) as f:
        f.write("first\nsecond ünïcode \x1b[1mbold\x1b[0m \r\n")
    recs = _records(tmp_path / "rank-3.jsonl")
    assert [list(r) for r in recs] == [FIELDS, FIELDS]
    assert [r["line"] for r in recs] == ["first", "second ünïcode \x1b[1mbold\x1b[0m \r"]
    assert {(r["rank"], r["node"], r["cluster"], r["stream"]) for r in recs} == {
        (3, "10.0.0.5", "démo", "stdout")
    }
    assert all(isinstance(r["time"], float) and abs(r["time"] - recs[0]["time"]) < 60 for r in recs)
    # UTF-8 kept as it is (collectors read UTF-8), one record a line
    assert "ünïcode".encode() in (tmp_path / "rank-3.jsonl").read_bytes()


def test_undecodable_bytes_still_make_valid_json(tmp_path: Path) -> None:
    """Output decoded with surrogateescape holds lone surrogates, which are no UTF-8: written as JSON escapes."""
    text = b"bad \xff byte\n".decode("utf-8", "surrogateescape")
    with RankLogFile(str(tmp_path), 0, "n", "c", max_bytes=4096) as f:
        f.write(text)
    assert _records(tmp_path / "rank-0.jsonl")[0]["line"] == text[:-1]


def test_partial_lines_wait_for_their_newline_each_stream_its_own(tmp_path: Path) -> None:
    f = RankLogFile(str(tmp_path), 0, "n", "c", max_bytes=4096)
    f.write("hel")
    f.write("wor", "stderr")
    f.write("lo\nnext ")
    assert [r["line"] for r in _records(tmp_path / "rank-0.jsonl")] == ["hello"]
    f.write("ld\n", "stderr")
    f.write("line\ntail without newline")
    got = [(r["stream"], r["line"]) for r in _records(tmp_path / "rank-0.jsonl")]
    assert got == [("stdout", "hello"), ("stderr", "world"), ("stdout", "next line")]
    f.close()  # writes the pending partial line
    got = [(r["stream"], r["line"]) for r in _records(tmp_path / "rank-0.jsonl")]
    assert got[-1] == ("stdout", "tail without newline") and len(got) == 4
    f.write("after close\n")  # ignored, no error
    assert len(_records(tmp_path / "rank-0.jsonl")) == 4


def test_writes_from_many_threads_stay_whole_records(tmp_path: Path) -> None:
    f = RankLogFile(str(tmp_path), 0, "n", "c", max_bytes=2**20)

    def writer(t: int) -> None:
        for i in range(2000):
            f.write(f"thread {t} line {i}\n")

    threads = [threading.Thread(target=writer, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    f.close()
    lines = [r["line"] for r in read_tail(str(tmp_path), 0, None)]
    assert sorted(lines) == sorted(f"thread {t} line {i}" for t in range(4) for i in range(2000))


# ---- rotation and the cap


def test_rotation_caps_the_disk_drops_the_oldest_and_keeps_the_newest(tmp_path: Path) -> None:
    max_bytes, backups = 4096, 2
    f = RankLogFile(str(tmp_path), 0, "n", "c", max_bytes=max_bytes, backups=backups)
    _numbered(f, 0, 2000)  # about 110 bytes a record: some 50 rotations
    f.close()
    names = sorted(os.listdir(tmp_path))
    assert names == ["rank-0.jsonl", "rank-0.jsonl.1", "rank-0.jsonl.2"]
    sizes = [os.path.getsize(tmp_path / n) for n in names]
    one_line = max(len(raw) + 1 for raw in (tmp_path / "rank-0.jsonl").read_bytes().splitlines())
    assert sum(sizes) <= (backups + 1) * max_bytes + one_line
    assert all(s <= max_bytes for s in sizes)
    kept = _numbers(_records(tmp_path / "rank-0.jsonl.2") + _records(tmp_path / "rank-0.jsonl.1"))
    kept += _numbers(_records(tmp_path / "rank-0.jsonl"))
    assert kept == list(range(kept[0], 2000)), "the newest records, in order, none missing"
    assert kept[0] > 1000, "the oldest records are gone"


def test_no_backups_drops_the_file_at_each_rotation(tmp_path: Path) -> None:
    with RankLogFile(str(tmp_path), 0, "n", "c", max_bytes=1024, backups=0) as f:
        _numbered(f, 0, 100)
    assert os.listdir(tmp_path) == ["rank-0.jsonl"] and os.path.getsize(tmp_path / "rank-0.jsonl") <= 1024
    assert _numbers(_records(tmp_path / "rank-0.jsonl"))[-1] == 99


def test_a_very_long_line_is_cut_with_a_note_and_fits_a_record(tmp_path: Path) -> None:
    with RankLogFile(str(tmp_path), 0, "n", "c", max_bytes=4096) as f:
        f.write("x" * 5000 + "\n")
        f.write("\x01" * 1000 + "\n")  # each escaped as \u0001: six bytes a character
        f.write("y" * 2000)  # a line growing without a newline (a progress bar): cut, its tail dropped
        f.write("z" * 500 + " tail\nnext\n")
    raw = [r for path in tmp_path.glob("rank-0.jsonl*") for r in path.read_bytes().splitlines()]
    assert len(raw) == 4 and all(len(r) + 1 <= 4096 // 2 for r in raw)
    lines = [r["line"] for r in read_tail(str(tmp_path), 0, None)]  # across a rotation: four big records
    assert (
        lines[0].startswith("x" * 1024)
        and "line cut at 1024 characters: 5000 characters in all" in lines[0]
        and "x" * 1025 not in lines[0]
    )
    assert lines[1].startswith("\x01") and "characters: 1000 characters in all" in lines[1]
    assert (
        lines[2].startswith("y" * 1024)
        and "line cut at 1024 characters: the rest of the line dropped" in lines[2]
        and "z" not in lines[2]
    )
    assert lines[3:] == ["next"]


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError):
        RankLogFile("/nonexistent-never-made", -1, "n", "c")
    with pytest.raises(ValueError):
        RankLogFile("/nonexistent-never-made", 0, "n", "c", max_bytes=100)
    with pytest.raises(ValueError):
        RankLogFile("/nonexistent-never-made", 0, "n", "c", backups=-1)
    assert not os.path.exists("/nonexistent-never-made")
    for dest in ("s3://", "gs://bucket/x"):
        with pytest.raises(ValueError):
            LogUploader("/nonexistent-never-made", dest)
    with pytest.raises(ValueError):
        LogUploader("/nonexistent-never-made", "/tmp/x", interval_s=0)


# ---- reading back


def test_read_tail_spans_the_rotated_files_in_time_order(tmp_path: Path) -> None:
    with RankLogFile(str(tmp_path), 1, "n", "c", max_bytes=4096, backups=3) as f:
        _numbered(f, 0, 300)
    live = len(_records(tmp_path / "rank-1.jsonl"))
    assert _numbers(read_tail(str(tmp_path), 1)) == list(range(250, 300))
    assert _numbers(read_tail(str(tmp_path), 1, live + 20)) == list(range(300 - live - 20, 300))
    everything = read_tail(str(tmp_path), 1, None)
    assert _numbers(everything) == list(range(300 - len(everything), 300)) and len(everything) > live
    times = [r["time"] for r in everything]
    assert times == sorted(times)
    assert read_tail(str(tmp_path), 1, 0) == [] and read_tail(str(tmp_path), 7) == []
    assert read_tail(str(tmp_path / "missing"), 0) == []


def test_read_tail_skips_a_torn_last_line_and_a_new_writer_starts_on_a_line_of_its_own(
    tmp_path: Path,
) -> None:
    with RankLogFile(str(tmp_path), 0, "n", "c", max_bytes=4096) as f:
        _numbered(f, 0, 5)
    with open(tmp_path / "rank-0.jsonl", "ab") as raw:
        raw.write(b'{"time": 1.5, "rank": 0, "node": "n", "clus')  # a writer killed mid-record
    assert _numbers(read_tail(str(tmp_path), 0, 3)) == [2, 3, 4]
    with RankLogFile(str(tmp_path), 0, "n", "c", max_bytes=4096) as f:  # the rank restarted
        f.write("line 000005\n")
    assert _numbers(read_tail(str(tmp_path), 0, 3)) == [3, 4, 5]


def test_a_written_line_survives_the_process_dying_right_after(tmp_path: Path) -> None:
    code = (
        "import os, sys\n"
        "from gpu_notebook.distributed._logfile import RankLogFile\n"
        "f = RankLogFile(sys.argv[1], 2, 'n', 'c')\n"
        "f.write('last words\\n', 'stderr')\n"
        "f.write('never ended')\n"  # a partial line is not in the file until its newline (or flush)
        "os._exit(1)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path)], timeout=60, capture_output=True)
    assert proc.returncode == 1, proc.stderr.decode()
    assert [(r["stream"], r["line"]) for r in read_tail(str(tmp_path), 2)] == [("stderr", "last words")]


# ---- failures


def test_a_removed_folder_turns_the_file_off_with_one_warning(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "logs"
    f = RankLogFile(str(folder), 0, "n", "c", max_bytes=1024)
    f.write("before\n")
    shutil.rmtree(folder)
    _numbered(f, 0, 50)  # the next rotation renames in a folder that is gone
    _numbered(f, 50, 50)
    f.flush()
    f.close()
    assert not f.active and f.error and "FileNotFoundError" in f.error
    err = capfd.readouterr().err
    assert err.count("log file") == 1 and "is off" in err, err


def test_a_folder_that_cannot_be_made_is_off_from_the_start(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "a-file").write_text("")
    f = RankLogFile(str(tmp_path / "a-file" / "logs"), 0, "n", "c")
    f.write("nowhere to go\n")
    assert not f.active and f.error and "Error" in f.error
    assert capfd.readouterr().err.count("is off") == 1


def test_a_full_disk_turns_the_file_off_and_the_process_goes_on(tmp_path: Path) -> None:
    """A real write error: the child's file size limit (RLIMIT_FSIZE) makes write() fail with EFBIG, as a full
    disk fails it with ENOSPC."""
    code = (
        "import resource, signal, sys\n"
        "from gpu_notebook.distributed._logfile import RankLogFile\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (3000, 3000))\n"
        "f = RankLogFile(sys.argv[1], 0, 'n', 'c')\n"
        "for i in range(200):\n"
        "    f.write(f'line {i:06d} ' + 'x' * 50 + '\\n')\n"
        "print('still running', f.active, f.error)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], timeout=60, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("still running False OSError") and "File too large" in proc.stdout
    assert proc.stderr.count("is off") == 1, proc.stderr
    assert _numbers(read_tail(str(tmp_path), 0, None))[0] == 0  # what fitted is there, whole records


# ---- the folder and its modes


def test_default_log_dir_is_under_the_temp_dir_with_safe_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert default_log_dir("demo") == str(tmp_path / "gpu_notebook-logs" / "demo")
    for name in ("../../etc", "a/b", ".hidden", "with space", "", "x" * 300):
        leaf = os.path.basename(default_log_dir(name))
        assert os.path.dirname(default_log_dir(name)) == str(tmp_path / "gpu_notebook-logs"), name
        assert leaf not in (".", "..") and "/" not in leaf and not leaf.startswith(".") and len(leaf) <= 100
    assert safe_name("a/b") != safe_name("a_b")  # two names never share a folder
    with RankLogFile(default_log_dir("demo"), 0, "n", "demo") as f:
        f.write("hi\n")
    for path, mode in (
        (tmp_path / "gpu_notebook-logs", 0o700),
        (tmp_path / "gpu_notebook-logs" / "demo", 0o700),
        (tmp_path / "gpu_notebook-logs" / "demo" / "rank-0.jsonl", 0o600),
    ):
        assert stat.S_IMODE(os.stat(path).st_mode) == mode, path


def test_a_folder_that_is_a_link_is_refused(tmp_path: Path) -> None:
    """Someone else could plant a link in a shared temp dir to have the rank write where they read."""
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "elsewhere", tmp_path / "logs")
    f = RankLogFile(str(tmp_path / "logs"), 0, "n", "c")
    f.write("secret\n")
    assert not f.active and os.listdir(tmp_path / "elsewhere") == []


# ---- the uploader


def _batches_in_folder(root: Path) -> dict[str, list[dict[str, Any]]]:
    out = {}
    for path in sorted(root.rglob("*.jsonl.gz")):
        out[str(path.relative_to(root))] = [
            json.loads(r) for r in gzip.decompress(path.read_bytes()).splitlines()
        ]
    return out


def test_the_uploader_sends_every_record_once_across_rotations_to_a_folder(tmp_path: Path) -> None:
    logs, dest = tmp_path / "logs", tmp_path / "dest"
    files = [RankLogFile(str(logs), r, "node-a", "demo", max_bytes=4096, backups=3) for r in (0, 1)]
    up = LogUploader(str(logs), str(dest), interval_s=3600)  # passes only when asked
    written = 0
    rotated = False
    for _ in range(8):
        # 60 records (about 1.7 files) between passes: rotations happen between them, but fewer than backups + 1
        for f in files:
            _numbered(f, written, 60)
        written += 60
        rotated = rotated or os.path.exists(logs / "rank-0.jsonl.2")
        assert up.flush_now() >= 2
    assert rotated
    files[1].write("a partial line")
    assert up.flush_now() == 0, "nothing new but a partial line: nothing sent"
    batches = _batches_in_folder(dest)
    assert all(re.fullmatch(r"demo/node-a/rank-[01]/\d{10}\.jsonl\.gz", k) for k in batches), list(batches)
    for r in (0, 1):
        got = [rec for k, recs in batches.items() if f"/rank-{r}/" in k for rec in recs]
        assert _numbers(got) == list(range(written)), "every record once, in order"
        assert {(rec["rank"], rec["node"], rec["cluster"]) for rec in got} == {(r, "node-a", "demo")}
    assert up.errors == 0 and up.batches == len(batches)
    up.close()

    # a new uploader on the same folder (the next kernel's) goes on where this one stopped
    for f in files:
        f.flush()
        _numbered(f, written, 10)
        f.close()
    again = LogUploader(str(logs), str(dest), interval_s=3600)
    again.close()  # close runs a last pass
    batches = _batches_in_folder(dest)
    assert len(batches) == up.batches + again.batches, "no batch overwritten"
    lines = [rec["line"] for k, recs in batches.items() if "/rank-1/" in k for rec in recs]
    expected = [f"line {i:06d}" for i in range(written)] + ["a partial line"]
    assert lines == expected + [f"line {i:06d}" for i in range(written, written + 10)]
    got = [rec for k, recs in batches.items() if "/rank-0/" in k for rec in recs]
    assert _numbers(got) == list(range(written + 10))


def test_the_uploader_counts_a_failure_and_sends_at_the_next_pass(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    logs, blocker = tmp_path / "logs", tmp_path / "dest"
    blocker.write_text("a file where the destination folder should be")
    with RankLogFile(str(logs), 0, "n", "c", max_bytes=4096) as f:
        _numbered(f, 0, 100)
        up = LogUploader(str(logs), str(blocker / "inner"), interval_s=3600)
        assert up.flush_now() == 0 and up.flush_now() == 0
        assert up.errors == 2 and up.last_error and "Error" in up.last_error
        assert capfd.readouterr().err.count("uploading rank logs") == 1
        blocker.unlink()
        _numbered(f, 100, 10)
        assert up.flush_now() >= 1 and up.errors == 2
    up.close()
    got = [rec for recs in _batches_in_folder(blocker / "inner").values() for rec in recs]
    assert _numbers(got) == list(range(110))


def test_the_uploader_thread_uploads_on_its_own(tmp_path: Path) -> None:
    logs, dest = tmp_path / "logs", tmp_path / "dest"
    with RankLogFile(str(logs), 0, "n", "c") as f, LogUploader(str(logs), str(dest), interval_s=0.05) as up:
        f.write("from the thread\n")
        wait_for(lambda: up.batches >= 1, what="a pass of the uploader's thread")
        assert "0 errors" in repr(up) and "<code>" in up._repr_html_()
    assert [r["line"] for recs in _batches_in_folder(dest).values() for r in recs] == ["from the thread"]


@pytest.fixture(scope="module")
def s3() -> Iterator[Any]:
    """The suite's moto S3 server (tests/checkpoint/_s3server.py), with made-up credentials in the environment."""
    pytest.importorskip("moto")
    pytest.importorskip("boto3")
    sys.path.insert(0, str(ROOT / "tests" / "checkpoint"))
    from _s3server import serving

    with serving() as srv:
        yield srv


def test_the_uploader_sends_every_record_once_to_s3(
    tmp_path: Path, s3: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3.endpoint)  # boto3 reads it itself
    bucket = f"logs-{uuid.uuid4().hex[:12]}"
    logs = tmp_path / "logs"
    f = RankLogFile(str(logs), 0, "10.0.0.7", "demo", max_bytes=4096, backups=3)
    up = LogUploader(str(logs), f"s3://{bucket}/runs/exp1/", interval_s=3600)
    _numbered(f, 0, 50)
    assert up.flush_now() == 0 and up.errors == 1, "no such bucket yet: counted, not raised"
    s3.client().create_bucket(Bucket=bucket)
    assert up.flush_now() >= 1
    _numbered(f, 50, 80)  # rotates at least twice before the next pass
    up.close()
    f.close()
    assert up.errors == 1
    client = s3.client()
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=bucket)["Contents"]]
    assert keys and all(
        re.fullmatch(r"runs/exp1/demo/10\.0\.0\.7/rank-0/\d{10}\.jsonl\.gz", k) for k in keys
    ), keys
    got = []
    for key in sorted(keys):
        body = client.get_object(Bucket=bucket, Key=key)["Body"].read()
        got += [json.loads(r) for r in gzip.decompress(body).splitlines()]
    assert _numbers(got) == list(range(130))
    assert [list(r) for r in got] == [FIELDS] * 130


# ---- the collector configs of the guide


DOC = ROOT / "docs" / "guide" / "logs-collectors.md"


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", DOC.read_text(), flags=re.S | re.M)


@pytest.fixture()
def written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, set[str]]:
    """Files the writer really wrote in the default layout under a temp dir of this test's own: two ranks, one
    rotated, an uploader's state file beside them. Returns the temp dir and the live files."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    folder = default_log_dir("demo")
    for rank in (0, 1):
        with RankLogFile(folder, rank, "n", "demo", max_bytes=1024) as f:
            _numbered(f, 0, 5 if rank else 40)
    LogUploader(folder, str(tmp_path / "dest")).close()
    names = set(os.listdir(folder))
    assert {"rank-0.jsonl.1", "rank-1.jsonl"} <= names and any(n.startswith(".uploaded-") for n in names)
    return tmp_path, {os.path.join(folder, "rank-0.jsonl"), os.path.join(folder, "rank-1.jsonl")}


def _matches(pattern: str, tmp: Path) -> set[str]:
    assert pattern.startswith("/tmp/"), pattern
    return set(glob.glob(str(tmp) + pattern[len("/tmp") :]))


def test_the_guides_record_is_what_the_writer_writes(tmp_path: Path) -> None:
    (example,) = _blocks("json")
    with RankLogFile(str(tmp_path), 0, "10.0.0.5", "demo") as f:
        f.write("epoch 3 loss 0.412\n")
    real = _records(tmp_path / "rank-0.jsonl")[0]
    shown = json.loads(example)
    assert list(shown) == list(real) and {k: type(v) for k, v in shown.items()} == {
        k: type(v) for k, v in real.items()
    }


def test_the_vector_config_parses_and_its_glob_finds_the_live_files(written: tuple[Path, set[str]]) -> None:
    tmp, live = written
    (block,) = _blocks("toml")
    config = tomllib.loads(block)
    source = config["sources"]["gpu_notebook"]
    assert source["type"] == "file" and source["max_line_bytes"] >= 5 * 2**20
    transform = config["transforms"]["gpu_notebook_records"]
    assert (
        transform["type"] == "remap"
        and transform["inputs"] == ["gpu_notebook"]
        and "parse_json" in transform["source"]
    )
    assert set().union(*(_matches(p, tmp) for p in source["include"])) == live


def test_the_fluent_bit_and_promtail_configs_parse_and_their_globs_find_the_live_files(
    written: tuple[Path, set[str]],
) -> None:
    yaml = pytest.importorskip("yaml", reason="PyYAML is not in .venv: the YAML configs are not parsed")
    tmp, live = written
    configs = [yaml.safe_load(b) for b in _blocks("yaml")]
    (fluent,) = [c for c in configs if "pipeline" in c]
    (promtail,) = [c for c in configs if "scrape_configs" in c]

    (tail,) = fluent["pipeline"]["inputs"]
    assert tail["name"] == "tail" and tail["parser"] in {p["name"] for p in fluent["parsers"]}
    assert {p["name"]: p["format"] for p in fluent["parsers"]}[tail["parser"]] == "json"
    assert _matches(tail["path"], tmp) == live

    (job,) = promtail["scrape_configs"]
    stages = {next(iter(s)): s[next(iter(s))] for s in job["pipeline_stages"]}
    assert set(stages["json"]["expressions"]) == set(FIELDS)
    assert stages["timestamp"] == {"source": "time", "format": "Unix"} and stages["output"] == {
        "source": "line"
    }
    (static,) = job["static_configs"]
    assert _matches(static["labels"]["__path__"], tmp) == live
