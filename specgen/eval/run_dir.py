"""A benchmark run folder (`--run-dir`): config, each shard's machine and per-item records (layout: docs/cluster.md)."""

from __future__ import annotations

import fcntl
import json
import os
import threading
import time
import warnings
import weakref
from datetime import timedelta
from dataclasses import asdict, dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Annotated, Any, Callable, Collection, Iterator, Sequence

from specgen.errors import RuntimeFailure, UsageError
from specgen.eval import json_shape
from specgen.paths import atomic_write_text, check_space, nearest_existing, write_new, written_elsewhere
from specgen.shard import Shard

FORMAT = 1  # run.json layout version
SUITES = ("humaneval", "text", "images", "meshes")  # what a run folder may hold


class RunNotFinished(UsageError):
    """The run folder lacks records of some items (a shard still running, or killed: rerun it to finish)."""


class LauncherGone(RuntimeFailure):
    """The launcher that started this rank died while the rank waited for the others (killed alone: SIGKILL)."""


LAUNCHER_POLL_S = 1.0  # how often a waiting rank looks for its launcher


def wait_for_ranks(launcher: int, run_dir: Path) -> None:
    """Block until every launcher rank got here (gloo; torchrun/accelerate set the rendezvous variables), so rank 0
    merges only finished shards; a benchmark shard may take hours, so the meeting's timeout is a week. Its rendezvous
    needs the launcher (torchrun's agent holds the store), and a launcher killed alone cannot stop its ranks: they
    would wait out the week. So the meeting runs in a thread while this one checks each LAUNCHER_POLL_S that the
    launcher (pid `launcher`, this rank's parent when it started) is still its parent (a dead parent's children are
    given to another), and raises LauncherGone when it is not."""
    import torch.distributed as dist  # deferred: start-up (this module is read by torch-free `specgen --help`)

    failed: list[BaseException] = []

    def meet() -> None:
        try:
            if not dist.is_initialized():
                dist.init_process_group("gloo", timeout=timedelta(days=7))
            dist.barrier()
            dist.destroy_process_group()
        except BaseException as e:  # raised again by the waiting thread, once it has looked for the launcher
            failed.append(e)

    # a daemon: a meeting left blocked (connecting to the dead launcher's store) does not hold this process's exit
    meeting = threading.Thread(target=meet, name="wait_for_ranks", daemon=True)
    meeting.start()
    meeting.join(LAUNCHER_POLL_S)
    while meeting.is_alive():  # (a meeting that took place stands, whatever happens to the launcher after it)
        check_launcher(launcher, run_dir)
        meeting.join(LAUNCHER_POLL_S)
    if failed:
        time.sleep(LAUNCHER_POLL_S)  # a dying launcher closes its store's connections before its ranks are reparented
        check_launcher(launcher, run_dir)
        raise failed[0]


def check_launcher(launcher: int, run_dir: Path) -> None:
    if os.getppid() != launcher:
        raise LauncherGone(f"the launcher that started this rank (pid {launcher}) died before every rank was done; "
                           f"the items measured are recorded in {run_dir}: rerun the same command to measure the "
                           "rest (items with a record are skipped) and print the table")


def flatten(doc: Any, prefix: str = "") -> dict[str, Any]:
    """{'a': {'b': 1}} -> {'a.b': 1}: config keys as a user writes them in overrides."""
    if isinstance(doc, dict) and doc:
        return {k: v for key, sub in doc.items() for k, v in flatten(sub, f"{prefix}{key}.").items()}
    return {prefix.rstrip("."): doc}


def defaults_of(config_type: type) -> dict:
    """A config dataclass's defaults (key -> value), as a run folder records a config (`RunDir.check_continues`)."""
    return json_ready(asdict(config_type()))


def json_ready(obj: Any) -> Any:
    """The value as it reads back from JSON (tuples -> lists, paths -> strings), so configs compare equal."""
    return json.loads(json.dumps(obj, default=str))


@dataclass(frozen=True)
class Line:
    """A whole line of a records file: the record it holds, or None and why it holds none."""

    number: int  # from 1
    end: int  # the offset just past it
    record: dict | None
    fault: str = ""


def read_lines(path: Path) -> Iterator[Line]:
    """Every whole line of `path`, to a torn tail (the writer was killed mid-line); a line that is not JSON, or JSON
    without an item and its runs (edited or foreign), holds no record."""
    offset = 0
    with open(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            offset += len(raw)
            if not raw.endswith(b"\n"):
                return
            try:
                rec = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):  # (nested thousands deep)
                yield Line(number, offset, None, "it is not JSON")
                continue
            if isinstance(rec, dict) and isinstance(rec.get("item"), str) and isinstance(rec.get("runs"), (dict, list)):
                yield Line(number, offset, rec)
            else:
                yield Line(number, offset, None, "it is JSON without an item and its runs")


def other_files(path: Path) -> str:
    """The first few names in an existing folder that holds no run.json ("" when it has one, is empty or is missing):
    a run folder starts with its run.json, so anything else there is not a run's. Listed before run.json is looked
    for, so a shard that starts the run meanwhile (its run.json's temporary and its space probe first, then its files)
    is no stranger (`written_elsewhere`)."""
    if not path.is_dir():
        return ""
    names = sorted(e.name for e in path.iterdir() if e.name != "run.json" and not written_elsewhere(e, "run.json"))
    if not names or (path / "run.json").exists():
        return ""
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


class RunDir:
    """One benchmark run's folder (layout, torn lines, resumes: docs/cluster.md)."""

    def __init__(self, path: Path, suite: str, config: dict, resolved: dict | None = None) -> None:
        self.path, self.suite, self.config = Path(path), suite, json_ready(config)
        # what the run's plan read beyond its config, which a report on another machine may not find (text: each
        # prompt's category and digest, each row's model from the registry)
        self.resolved = json_ready(resolved)
        self.made: list[Path] | None = None  # `open` started the run here: the folders it made (`discard`)

    # -- opening -------------------------------------------------------------------------------------------
    @classmethod
    def open(cls, path: Path, suite: str, config: dict, resolved: dict | None = None,
             spelled: dict[str, str] | None = None, defaults: dict | None = None) -> "RunDir":
        """Create the folder (or reopen it): a folder holding another suite's run, another config (naming the keys
        that differ, each as `spelled` gives it: key -> the option that set it; `defaults`: the config's defaults,
        `check_continues`), another `resolved` plan (an edited prompt file) or files and no run (`--run-dir .`) is
        refused before anything is written."""
        path = Path(path)
        cls.check_place(path)
        made = [p for p in (path, *path.parents) if not p.exists()]  # (missing parents included)
        path.mkdir(parents=True, exist_ok=True)
        run = cls(path, suite, config, resolved)
        doc = {"format": FORMAT, "suite": suite, "config": run.config,
               **({"resolved": run.resolved} if resolved else {})}
        if write_new(path / "run.json", json.dumps(doc, indent=1, sort_keys=True) + "\n"):
            run.made = made
            return run
        started = cls.existing(path)
        run.check_continues(started, spelled, defaults)
        if started.resolved is not None and run.resolved != started.resolved:  # an older specgen's folder has none
            old, new = flatten(started.resolved), flatten(run.resolved or {})
            key = next(k for k in dict.fromkeys([*new, *old]) if old.get(k) != new.get(k))  # the first in order
            raise UsageError(f"--run-dir {path} was started on other inputs: {key} ({old.get(key, '<unset>')!r} -> "
                             f"{new.get(key, '<unset>')!r}; an edited prompt file?); restore them to resume, or name "
                             "a new folder")
        return run

    def check_continues(self, started: "RunDir", spelled: dict[str, str] | None = None,
                        defaults: dict | None = None) -> None:
        """Refuse in one line to continue `started`, the run its folder records, as this run: another suite, or
        another config (naming the keys that differ, each as `spelled` gives it: key -> the option that set it).
        A key the config gained since the run started (a newer specgen's) changes nothing when it holds its default
        (`defaults`: the config type's, as `defaults_of` gives them) or is left empty (`sweep: {}`): the run
        measured what that value measures. `open` checks it, and a dry run, which has the config but not the plan's
        inputs (`resolved`)."""
        path = started.path
        if started.suite != self.suite:
            raise UsageError(f"--run-dir {path} holds a {started.suite} run, not {self.suite}; name another folder")
        old, new = flatten(started.config), flatten(self.config)
        default = flatten(json_ready(defaults or {}))
        added = {k for k in new.keys() - old.keys() if new[k] in ({}, []) or (k in default and new[k] == default[k])}
        changed = sorted(k for k in old.keys() | new.keys() - added if old.get(k, "<unset>") != new.get(k, "<unset>"))
        if changed:
            name = (spelled or {}).get
            shown = ", ".join(f"{name(k, k)} ({old.get(k, '<unset>')!r} -> {new.get(k, '<unset>')!r})"
                              for k in changed[:4])
            more = f" and {len(changed) - 4} more" if len(changed) > 4 else ""
            raise UsageError(f"--run-dir {path} was started with another config: {shown}{more}; rerun with "
                             "the same options to resume, or name a new folder")

    @staticmethod
    def check_place(path: Path) -> None:
        """What `open` refuses before it writes (also a dry run's check): a file, a folder under a file, a read-only
        or full disk, a folder of files and no run."""
        if path.exists() and not path.is_dir():
            raise UsageError(f"--run-dir {path} is a file; name a folder (new or from an earlier run)")
        probe = nearest_existing(path)  # missing parents are made (`--run-dir runs/he` in a checkout without runs/)
        if not probe.is_dir():
            raise UsageError(f"--run-dir {path}: {probe} is a file, not a folder")
        check_space(probe, f"--run-dir {path}")  # read-only or full: before the work
        foreign = other_files(path)
        if foreign:
            raise UsageError(f"--run-dir {path} holds files of no specgen run ({foreign}) and no run.json; name a "
                             "new or empty folder for the run (or the folder of an earlier run to resume it)")

    @classmethod
    def existing(cls, path: Path) -> "RunDir":
        """An existing run folder as it is (for `benchmark report`, and to compare a resumed run with)."""
        file = Path(path) / "run.json"
        if not file.is_file():
            raise UsageError(f"{path} is not a benchmark run folder (no run.json); "
                             "make one with `specgen benchmark --run-dir DIR ...`")
        try:
            doc = json.loads(file.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError, OSError, RecursionError) as e:
            raise UsageError(f"{file} is unreadable ({type(e).__name__}); it is not a specgen run file") from None
        if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("config"), dict) \
                or not isinstance(doc.get("suite"), str) or not isinstance(doc.get("resolved", {}), dict):
            raise UsageError(f"{file} is not a specgen run file of format {FORMAT}")
        return cls(Path(path), doc.get("suite"), doc["config"], doc.get("resolved"))

    # -- writing -------------------------------------------------------------------------------------------
    def write_machine(self, shard: Shard, info: dict) -> None:
        atomic_write_text(self.path / f"machine-{shard.label}.json", json.dumps(json_ready(info), indent=1) + "\n")

    def start_shard(self, shard: Shard) -> None:
        """Take the shard's lock, an exclusive flock on shard-<label>.lock held until this RunDir is dropped or the
        process ends, or refuse in one line naming the process holding it (the kernel drops the lock when its holder
        dies, so a lock file left by a killed run holds nothing); then cut a torn last line off its record file, so
        the next append starts on a line of its own."""
        fd = os.open(self.path / f"shard-{shard.label}.lock", os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise UsageError(f"--run-dir {self.path}: shard {shard.index}/{shard.count} is being written by process "
                             f"{holder}; wait for it to finish or stop it (two writers would measure every item "
                             "twice)") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        weakref.finalize(self, os.close, fd)
        file = self.path / f"records-{shard.label}.jsonl"
        if file.exists():  # to the end of its last whole line: a file without a torn tail keeps its length
            os.truncate(file, max((line.end for line in read_lines(file) if line.record is not None), default=0))

    def discard(self) -> None:
        """Undo `open` where it started the run and no item has a record: its files and the folders it made go (bad
        input found as the models load, an interrupted load, leaves nothing behind). Another run's folder, or one
        with records, stays: rerunning resumes it. For a shard alone in the folder (another may be starting)."""
        if self.made is None or self.records():
            return
        for file in self.path.iterdir():  # run.json, the shard's lock and machine file: the folder was new or empty
            file.unlink()
        for folder in self.made:
            folder.rmdir()

    def claim_table(self, shard: Shard) -> str | None:
        """Make `shard` the one that prints the finished run's table: None, or the shard that did (an exclusive
        create of printed-by: of shards finishing at once, one prints and writes --out)."""
        try:
            fd = os.open(self.path / "printed-by", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            return (self.path / "printed-by").read_text().strip() or "another shard"
        os.write(fd, f"shard {shard.index}/{shard.count}\n".encode())
        os.close(fd)
        return None

    def append(self, shard: Shard, record: dict) -> None:
        """One record as one line, one write, flushed to disk before the next item starts; a write the device refuses
        (full: the rest of a short write fails) is an OSError naming the file (its torn line is cut on resume)."""
        data = memoryview((json.dumps(json_ready(record), separators=(",", ":")) + "\n").encode())
        file = self.path / f"records-{shard.label}.jsonl"
        fd = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o666)
        try:
            while data:
                data = data[os.write(fd, data):]
            os.fsync(fd)
        except OSError as e:
            raise OSError(e.errno, e.strerror, str(file)) from None
        finally:
            os.close(fd)

    # -- reading -------------------------------------------------------------------------------------------
    def records(self, grids: Sequence[Grid] = ()) -> dict[str, dict]:
        """item key -> record over every shard file (sorted by name: the first file holding an item wins). A line that
        holds no record, or no record of its item in `grids` (`Grid.fault`: edited, or another run's), is skipped
        with a warning naming it: a run measures its item again."""
        return self.read(grids)[0]

    def finished(self, grids: Sequence[Grid], what: str) -> dict[str, dict]:
        """The `records` of a run whose `grids` are its items; RunNotFinished while some of its `what` (items,
        images, meshes) have none, naming the first line skipped."""
        found, skipped = self.read(grids)
        gone = sum(g.missing(found) for g in grids)
        if gone:
            more = f" (and {len(skipped) - 1} more such lines)" if len(skipped) > 1 else ""
            why = f"; {skipped[0]}{more}" if skipped else ""
            raise RunNotFinished(f"the run is not finished: {gone} of its {what} have no record yet (rerun the same "
                                 f"command, or wait for the other shards){why}")
        return found

    def read(self, grids: Sequence[Grid]) -> tuple[dict[str, dict], list[str]]:
        """(`records`, each line skipped: where it is and why it holds no record), each skipped line warned of."""
        found: dict[str, dict] = {}
        skipped = []
        absent = self.skipped_rows()
        for file in sorted(self.path.glob("records-*.jsonl")):
            for line in read_lines(file):
                why = line.fault or json_shape.first(g.fault(line.record, absent) for g in grids)
                if why:
                    skipped.append(f"{file} line {line.number} is no record of this run: {why}")
                else:
                    found.setdefault(line.record["item"], line.record)
        for line in skipped:
            warnings.warn(f"{line} (skipped: a run of the folder measures its item again)", stacklevel=3)
        return found, skipped

    def skipped_rows(self) -> dict[str, str]:
        """row -> why a shard could not run it (a text peer row: llamacpp without llama-cpp-python), from the machine
        files: its records lack it."""
        return {m: str(why) for info in self.machines().values() if isinstance(info.get("skipped"), dict)
                for m, why in info["skipped"].items()}

    def machines(self) -> dict[str, dict]:
        """shard label -> its machine file; one whose keys are not of the types the summaries read (MACHINE) is
        refused in one line, as a run.json of another shape is: skipped, its cost curve would leave a table short."""
        out = {}
        for file in sorted(self.path.glob("machine-*.json")):
            try:
                doc = json.loads(file.read_text())
            except (json.JSONDecodeError, UnicodeDecodeError, OSError, RecursionError):
                continue  # a machine file is replaced atomically; an unreadable one is not ours
            if isinstance(doc, dict):  # (nor is JSON of another shape)
                why = json_shape.keys_fault(doc, {k: hint for k, hint in MACHINE.items() if k in doc})
                if why:
                    raise UsageError(f"{file} is not a specgen machine file: {why}")
                out[file.stem.removeprefix("machine-")] = doc
        return out


# the keys of a machine file that summaries read, each checked where present (each suite writes its own): text's
# (text_bench), images' (image_bench), meshes' (mesh_bench), captured steps' (graph_use); the others are not read
MACHINE = {"machine": str, "versions": dict[str, str], "cost_rows": list[int], "cost": list[float],
           "skipped": dict[str, str], "streamed_bytes": dict[str, int], "bandwidth_gbs": float,
           "timed_captures": dict[str, int], "conditions": dict[str, list[int | str]],
           "reference_features": list[list[float]], "quality_note": str, "branches": int,
           "references": dict[str, float | None]}


def batched(records: dict[str, dict], prefix: str) -> tuple[dict[int, dict], dict[str, float]]:
    """One batched row's runs by item index and its wall seconds per shard, from the records whose keys start with
    `prefix` (one record per shard; the first record holding an index wins)."""
    by_index: dict[int, dict] = {}
    walls: dict[str, float] = {}
    for key, rec in sorted(records.items()):
        if key.startswith(prefix):
            for i, run in zip(rec["indices"], rec["runs"]):
                by_index.setdefault(i, run)
            walls[rec["shard"]] = rec["wall"]
    return by_index, walls


@dataclass(frozen=True)
class Grid:
    """A suite's resumable items (docs/cluster.md): item i at batch 1 with every row run on it, interleaved (record
    key `single.format(i)`), and per batch size B > 1 each row over a shard's items (`{prefix}b{B}/{row}/{shard}`).
    `run`: the dataclass each run of a record is read as (its record holds it as an object of its fields)."""

    n: int
    rows: tuple[str, ...]
    batch_sizes: tuple[int, ...]  # batch-1 items only when 1 is among them
    single: str
    prefix: str = ""
    run: type = field(kw_only=True)

    @cached_property
    def single_keys(self) -> frozenset[str]:
        return frozenset(self.single.format(i) for i in range(self.n)) if 1 in self.batch_sizes else frozenset()

    @cached_property
    def batched_keys(self) -> frozenset[str]:
        """`key(B, row)` of every batched row: a record's key without its shard."""
        return frozenset(self.key(b, m) for b in self.batch_sizes if b > 1 for m in self.rows)

    def fault(self, rec: dict, absent: Collection[str] = ()) -> str | None:
        """Why `rec` (a line with an item and its runs) is not the record of its item that `runs` reads (edited, of
        another config, of another suite), or None: it is, or it is no item of this grid. `absent`: rows a shard could
        not run (`RunDir.skipped_rows`), which its records lack."""
        key, runs = rec["item"], rec["runs"]
        if key in self.single_keys:
            if type(runs) is not dict:
                return f"its runs are a list, not an object of {self.run.__name__}s by row"
            gone = next((m for m in self.rows if m not in runs and m not in absent), None)
            if gone is not None:
                return f"its runs lack row {gone!r} (another config's record?)"
            return json_shape.first(json_shape.fault(runs[m], self.run, f"runs.{m}") for m in self.rows if m in runs)
        if key.rpartition("/")[0] + "/" in self.batched_keys:
            why = json_shape.keys_fault(rec, {"shard": str, "indices": list[int], "wall": Annotated[float, "> 0"],
                                              "runs": list[self.run]})
            if why is None and len(runs) != len(rec["indices"]):
                why = f"it has {len(runs)} runs for {len(rec['indices'])} indices"
            return why
        return None

    def key(self, batch: int, row: str, shard: str = "") -> str:
        return f"{self.prefix}b{batch}/{row}/{shard}"

    def mine(self, shard: Shard) -> list[int]:
        return list(range(shard.index, self.n, shard.count))

    def left(self, done: dict, shard: Shard) -> tuple[list[int], list[tuple[int, str]]]:
        """This shard's items without a record: batch-1 positions, and (batch size, row) pairs."""
        mine = self.mine(shard)
        single = [i for i in mine if self.single.format(i) not in done] if 1 in self.batch_sizes else []
        return single, [(b, m) for b in self.batch_sizes if b > 1 for m in self.rows
                        if mine and self.key(b, m, shard.label) not in done]

    def measure(self, sink: RunDir, shard: Shard, one: Callable[[int], dict],
                batch: Callable[[int, str, list[int]], tuple[list, float]], on_item: Callable[[], None]) -> None:
        """Record this shard's items that `sink` has none of: at batch 1 `one(i)` (row -> run of item i), then at
        B > 1 `batch(B, row, positions)` (the row's runs over the shard's items in order, its wall seconds)."""
        single, batches = self.left(sink.records([self]), shard)
        mine = self.mine(shard)
        for i in single:
            sink.append(shard, {"item": self.single.format(i), "shard": shard.label, "index": i, "runs": one(i)})
            on_item()
        for b, m in batches:
            runs, wall = batch(b, m, mine)
            sink.append(shard, {"item": self.key(b, m, shard.label), "shard": shard.label, "batch_size": b,
                                "method": m, "indices": mine, "wall": wall, "runs": runs})
            on_item()

    def runs(self, records: dict[str, dict], batch: int) -> tuple[dict[str, list[dict]], dict | None]:
        """(row -> its runs in item order, row -> shard -> wall seconds; None at batch 1) of a finished run."""
        if batch == 1:
            return {m: [records[self.single.format(i)]["runs"][m] for i in range(self.n)] for m in self.rows}, None
        runs, walls = {}, {}
        for m in self.rows:
            by_index, walls[m] = batched(records, self.key(batch, m))
            runs[m] = [by_index[i] for i in range(self.n)]
        return runs, walls

    def missing(self, records: dict[str, dict]) -> int:
        """How many items have no record: batch-1 items, and the items of each batched row."""
        gone = sum(self.single.format(i) not in records for i in range(self.n)) if 1 in self.batch_sizes else 0
        return gone + sum(self.n - len(set(batched(records, self.key(b, m))[0]) & set(range(self.n)))
                          for b in self.batch_sizes if b > 1 for m in self.rows)
