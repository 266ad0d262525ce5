"""One controller rolling out (and soaking) a simulated fleet of 16, 64 and 256 hosts: cost per
host.

Each host is the in-process simulated docker host of ``tests/rollout/sim.py`` (the engine's
``HostOps`` seam: no SSH) and its serving endpoint is a real vLLM emulator HTTP server on its own
loopback address (``127.42.X.Y:8000``); the rollout goes through the real engine, waves, soak
gates (the soak engine's HTTP client against the emulator, a short soak) and the SQLite ledger.
The emulators run in their own processes (several endpoints per process), started once for the
largest fleet; each rollout runs in a fresh controller process, which reports its own CPU
(user + system, its children included), peak RSS and wall time, plus the peak number of threads
and open file descriptors it held (every fan-out is bounded: these must stop growing with the
fleet). Per fleet size: the median of ``--repeats`` runs, the figures per host, and the growth of
each per-host figure from the smallest to the largest fleet (1.0 = linear cost; 16 -> 256 at 2.0
means each host costs twice as much in the big fleet). ``--progress live`` renders the CLI's live
table (80 columns, to /dev/null) on every event, as ``fleetctl rollout`` does on a terminal.

    .venv/bin/python bench/fleet_scale.py [--sizes 16,64,256] [--repeats 3] [--progress null|live]
        [--waves 1,10%,100%] [--max-unavailable 16] [--emulator-procs 4] [--json
        bench/results/fleet_scale.json] [--baseline-rev REV] [--profile FILE]

``--baseline-rev REV`` runs REV's controller (``git archive``) too, each repeat right after or
before this checkout's on the same emulators, and prints CPU per host before and after with their
ratio; ``--profile FILE`` adds one run of the largest fleet under cProfile (every thread's profile
merged): ``python -m pstats FILE``, then ``sort cumtime``/``stats 30``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # tests.rollout.sim: the simulated docker hosts

OLD, NEW = "v0.23.0", "v0.24.0"
PORT = 8000
SERVED = ("qwen36-35b-heretic", "qwen36-fast", "qwen36-deep")
RECIPE = "qwen36-35b-heretic"
#: A soak of about a second that passes on a healthy emulator: every phase the gate runs
#: (readiness, identity, smoke, classes, sweep, long decode, sustained windows), few requests.
SOAK: dict[str, Any] = {
    "profile": "lab",
    "concurrency": [1, 4],
    "classes": ["coding", "math"],
    "class_requests": 1,
    "max_tokens": 16,
    "readiness_timeout": 60,
    "readiness_poll": 0.1,
    "smoke_max_tokens": 64,
    "sustained": {
        "duration": 1.0,
        "concurrency": 2,
        "window": 0.5,
        "shared_prefix_tokens": 256,
        "turns": 2,
    },
    "checks": {
        "acceptance_decay": {"enabled": False},
        "long_context": {"enabled": False},
        "correctness": {"long_decode_tokens": 32, "canary_max_tokens": 24},
        # Two sustained windows of a second hold few drafts: only a collapse fails.
        "acceptance": {"min_ratio": 0.1},
    },
}
EMU_ENV = {"EMU_LOAD_SECONDS": "0", "EMU_SPEED": "20"}


def address(i: int) -> str:
    """Host i's loopback address (all of 127/8 is the loopback interface on Linux)."""
    return f"127.42.{i // 250}.{i % 250 + 1}"


def host_name(i: int) -> str:
    return f"sim-{i + 1:03d}"


# -- the emulators' processes ----------------------------------------------------------------

def serve_emulators(model_dir: Path, addrs: list[str]) -> None:
    """Child: one emulator server per address, all in this process's event loop, until killed."""
    from fleetctl.lab.emulator.args import parse
    from fleetctl.lab.emulator.knobs import from_env
    from fleetctl.lab.emulator.main import run

    drafter = model_dir.parent / "drafter"
    spec = json.dumps({"method": "dflash", "model": str(drafter), "num_speculative_tokens": 4})

    def quiet(_line: str) -> None:
        return None

    parent = os.getppid()

    async def orphaned() -> None:
        # The servers share one loop, so SIGTERM stops only one of them: leave with the driver.
        while os.getppid() == parent:
            await asyncio.sleep(1)
        os._exit(0)

    async def all_of() -> None:
        knobs = from_env()
        await asyncio.gather(
            orphaned(),
            *(
                run(
                    parse(
                        [
                            "serve",
                            str(model_dir),
                            "--host",
                            a,
                            "--port",
                            str(PORT),
                            "--served-model-name",
                            *SERVED,
                            "--max-num-seqs",
                            "64",
                            "--max-num-batched-tokens",
                            "8192",
                            "--speculative-config",
                            spec,
                            "--disable-uvicorn-access-log",
                        ]
                    ),
                    knobs,
                    quiet,
                )
                for a in addrs
            ),
        )

    asyncio.run(all_of())


def start_emulators(work: Path, n: int, procs: int) -> list[subprocess.Popen[bytes]]:
    from fleetctl.lab import models

    models.write_model(work / "models" / "body", "qwen36-35b-a3b-nvfp4")
    models.write_model(work / "models" / "drafter", "qwen36-35b-a3b-dflash")
    addrs = [address(i) for i in range(n)]
    out = []
    for k in range(procs):
        mine = addrs[k::procs]
        if mine:
            out.append(
                subprocess.Popen(
                    [sys.executable, __file__, "_emulators", str(work / "models" / "body"), *mine],
                    env={**os.environ, **EMU_ENV},
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
    deadline = time.monotonic() + 120
    for a in addrs:
        while True:
            with socket.socket() as s:
                s.settimeout(1)
                if s.connect_ex((a, PORT)) == 0:
                    break
            if time.monotonic() > deadline or any(p.poll() is not None for p in out):
                raise SystemExit(f"the emulator on {a}:{PORT} did not start")
            time.sleep(0.05)
    return out


def cpu_of(pids: list[int]) -> float:
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += (int(f[11]) + int(f[12])) / tick
    return total


# -- the inventory -----------------------------------------------------------------------------

def write_inventory(d: Path, n: int) -> Path:
    """``d/hosts.yml`` with n hosts on loopback, and the lab's recipes with the short soak."""
    hosts = {host_name(i): {"ansible_host": address(i), "ansible_user": "root"} for i in range(n)}
    (d / "group_vars" / "all").mkdir(parents=True, exist_ok=True)
    (d / "hosts.yml").write_text(
        yaml.safe_dump({"all": {"children": {"sparks": {"hosts": hosts}}}})
    )
    recipes = yaml.safe_load(
        (ROOT / "inventory" / "lab" / "group_vars" / "all" / "recipes.yml").read_text()
    )
    recipes["fleetctl_recipe"] = RECIPE
    recipes["fleetctl_recipes"] = {RECIPE: {**recipes["fleetctl_recipes"][RECIPE], "soak": SOAK}}
    (d / "group_vars" / "all" / "recipes.yml").write_text(yaml.safe_dump(recipes))
    return d / "hosts.yml"


# -- one controller run (a child process) ------------------------------------------------------

class _Peaks:
    """Samples this process's thread and open-descriptor counts every 50 ms; keeps the peaks."""

    def __init__(self) -> None:
        self.threads = 0
        self.fds = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            self.threads = max(self.threads, threading.active_count())
            self.fds = max(self.fds, len(os.listdir("/proc/self/fd")))

    def __enter__(self) -> _Peaks:
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join()


def controller(inv_path: Path, state: Path, opts_json: str, progress_kind: str) -> dict[str, Any]:
    prof_to = os.environ.get("FLEET_SCALE_PROFILE")
    if not prof_to:
        return _controller(inv_path, state, opts_json, progress_kind)
    # cProfile sees only its own thread: every thread (host steps, soak gates, fan-outs) gets a
    # profiler of its own, merged at the end into one pstats file. Timed by each thread's CPU clock:
    # wall time would count every wait of 50 threads (locks, sockets, queues) as cost.
    import cProfile
    import pstats

    profs: list[cProfile.Profile] = []
    lock = threading.Lock()
    run = threading.Thread.run

    def profiled(self: threading.Thread) -> None:
        prof = cProfile.Profile(time.thread_time)
        with lock:
            profs.append(prof)
        prof.runcall(run, self)

    threading.Thread.run = profiled  # type: ignore[method-assign]
    main_prof = cProfile.Profile(time.thread_time)
    try:
        return main_prof.runcall(_controller, inv_path, state, opts_json, progress_kind)
    finally:
        threading.Thread.run = run  # type: ignore[method-assign]
        stats = pstats.Stats(main_prof)
        with lock:
            for pr in profs:
                with contextlib.suppress(TypeError):  # a thread still running has nothing to give
                    stats.add(pr)
        stats.dump_stats(prof_to)


def _controller(inv_path: Path, state: Path, opts_json: str, progress_kind: str) -> dict[str, Any]:
    from tests.rollout.sim import NAME, OK, SimFleet, SimGates

    from fleetctl import container as model
    from fleetctl import inventory, ssh
    from fleetctl.cli.output import Ctx
    from fleetctl.inventory import Host
    from fleetctl.progress import NULL
    from fleetctl.recipes import Recipe
    from fleetctl.rollout import gate
    from fleetctl.rollout.api import Engine
    from fleetctl.rollout.results import Options
    from fleetctl.rollout.session import Seams
    from fleetctl.soak.verdict import SoakTarget

    class SimContainer:
        """The simulated container's state, as ``docker inspect`` over SSH would tell it."""

        def __init__(self, fleet: SimFleet, host: str) -> None:
            self.fleet, self.host = fleet, host

        def logs(self, tail: int = 50) -> str:
            return ""

        def state(self) -> model.Container:
            with self.fleet.mu:
                c = self.fleet.hosts[self.host].containers.get(NAME)
                if c is None:
                    return model.absent(NAME)
                return model.Container(NAME, running=c.running, status=c.status, image=c.tag)

    class BenchGates(gate.SoakGates):
        """The real soak gate against each host's emulator; container state from the simulated
        host."""

        def __init__(self, fleet: SimFleet) -> None:
            super().__init__({})
            self.fleet = fleet

        def _target(self, host: Host, recipe: Recipe, tag: str) -> SoakTarget:
            return SoakTarget(
                host.name,
                f"http://{host.address}:{recipe.port}",
                SimContainer(self.fleet, host.name),
                tag,
            )

    _ = SimGates  # the harness's instant gates: not used here, the soak is real
    inv = inventory.load(inv_path)
    fleet = SimFleet(dict.fromkeys(inv.hosts, OLD), {OLD: OK, NEW: OK})
    o = json.loads(opts_json)
    devnull = open(os.devnull, "w")  # noqa: SIM115 - open for the whole run
    ctx = Ctx(err=Console(file=devnull, force_terminal=True, width=80))
    with Peaks() as peaks, (ctx.progress("rollout", ("wave", "phase", "tag", "health", "message"))
                            if progress_kind == "live" else _null(NULL)) as progress:
        t0 = time.monotonic()
        eng = Engine(inv, progress, state_dir=state, secrets={},
                     seams=Seams(ops=fleet.ops, gates=BenchGates(fleet), resolve=fleet.resolve))
        r = eng.rollout(Options(tag=NEW, waves=o["waves"], max_unavailable=o["max_unavailable"],
                                soak=o["soak"], on_inconclusive="fail",
                                failure_budget=o["failure_budget"]))
        eng.close()
        wall = time.monotonic() - t0
    ssh.close_all()
    self_ru = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    statuses: dict[str, int] = {}
    for h in r.hosts:
        statuses[h.status] = statuses.get(h.status, 0) + 1
    bad = [f"{h.host}: {h.error or h.verdict}" for h in r.hosts if h.status != "done"][:3]
    return {
        "hosts": len(r.hosts),
        "status": r.status,
        "statuses": statuses,
        "examples": bad,
        "wall_s": wall,
        "cpu_s": self_ru.ru_utime + self_ru.ru_stime + kids.ru_utime + kids.ru_stime,
        "peak_rss_mb": self_ru.ru_maxrss / 1024,
        "peak_threads": peaks.threads,
        "peak_fds": peaks.fds,
        "wave_s": list(r.wave_seconds),
        "ledger_bytes": (state / "ledger.sqlite3").stat().st_size,
    }


Peaks = _Peaks


class _null:
    def __init__(self, v: Any) -> None:
        self.v = v

    def __enter__(self) -> Any:
        return self.v

    def __exit__(self, *exc: object) -> None:
        return None


# -- the driver ----------------------------------------------------------------------------------

def checkout(rev: str, work: Path) -> Path:
    """The controller, tests and bench of git revision ``rev`` (``git archive``), to run the same
    bench on."""
    d = work / f"rev-{rev.replace('/', '_')}"
    d.mkdir()
    arch = subprocess.run(
        ["git", "-C", str(ROOT), "archive", rev, "controller", "tests", "bench", "inventory"],
        capture_output=True,
        check=True,
    )
    subprocess.run(["tar", "-x", "-C", str(d)], input=arch.stdout, check=True)
    return d


def one_run(
    work: Path, n: int, a: argparse.Namespace, emus: list[int], root: Path = ROOT
) -> dict[str, Any]:
    """One controller run on ``n`` hosts, with the code of ``root`` (this checkout, or a
    --baseline-rev)."""
    run_dir = Path(tempfile.mkdtemp(prefix=f"n{n}-", dir=work))
    inv = write_inventory(run_dir / "inv", n)
    opts = json.dumps({"waves": a.waves, "max_unavailable": a.max_unavailable, "soak": a.soak,
                       "failure_budget": a.failure_budget})
    emu0 = cpu_of(emus)
    env = {**os.environ, "PYTHONPATH": str(root / "controller")} if root != ROOT else None
    p = subprocess.run(
        [
            sys.executable,
            str(root / "bench" / "fleet_scale.py"),
            "_controller",
            str(inv),
            str(run_dir / "state"),
            opts,
            a.progress,
        ],
        capture_output=True,
        text=True,
        cwd=root,
        env=env,
    )
    if p.returncode != 0:
        raise SystemExit(f"controller run failed (exit {p.returncode}):\n{p.stderr[-3000:]}")
    out: dict[str, Any] = json.loads(p.stdout.strip().splitlines()[-1])
    out["emulator_cpu_s"] = cpu_of(emus) - emu0
    shutil.rmtree(run_dir, ignore_errors=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="16,64,256")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--waves", default="1,10%,100%")
    ap.add_argument("--max-unavailable", default="16")
    ap.add_argument(
        "--failure-budget", default="5%", help="hosts whose short soak may flap on a loaded machine"
    )
    ap.add_argument("--soak", type=float, default=1.0, help="sustained soak seconds per host")
    ap.add_argument("--progress", choices=("null", "live"), default="null")
    ap.add_argument("--emulator-procs", type=int, default=4)
    ap.add_argument("--json", default="bench/results/fleet_scale.json")
    ap.add_argument(
        "--baseline-rev",
        metavar="REV",
        help="also run git revision REV's controller, interleaved with this one, on the same "
             "emulators "
        "(before/after figures from one run)",
    )
    ap.add_argument(
        "--profile",
        metavar="FILE",
        help="one more run of the largest fleet under cProfile (every thread), not counted; pstats "
        "to FILE (with --baseline-rev, REV's to FILE.base)",
    )
    a = ap.parse_args()
    sizes = [int(s) for s in a.sizes.split(",")]
    con = Console(width=80)
    work = Path(tempfile.mkdtemp(prefix="fleet-scale-"))
    emus = start_emulators(work, max(sizes), a.emulator_procs)
    roots = {"this": ROOT}
    if a.baseline_rev:
        roots = {"base": checkout(a.baseline_rev, work), "this": ROOT}
    every: dict[str, dict[int, list[dict[str, Any]]]] = {k: {} for k in roots}
    try:
        for n in sizes:
            for r in range(a.repeats):
                for which, root in roots.items():
                    res = one_run(work, n, a, [p.pid for p in emus], root)
                    every[which].setdefault(n, []).append(res)
                    done = ",".join(f"{k} {v}" for k, v in res["statuses"].items())
                    con.print(
                        f"{which} n={n} #{r + 1}: {res['status']} ({done}) {res['wall_s']:.1f}s, "
                        f"cpu {res['cpu_s']:.1f}s, {res['peak_rss_mb']:.0f} MB",
                        highlight=False,
                    )
                    for ex in res["examples"]:
                        con.print(f"  {ex[:76]}", highlight=False)
        if a.profile:
            for which, root in roots.items():
                to = a.profile + (".base" if which == "base" else "")
                os.environ["FLEET_SCALE_PROFILE"] = str(Path(to).resolve())
                try:
                    one_run(work, max(sizes), a, [p.pid for p in emus], root)
                finally:
                    del os.environ["FLEET_SCALE_PROFILE"]
                con.print(f"profile of {which} at n={max(sizes)}: {to}", highlight=False)
    finally:
        for p in emus:
            p.kill()
            p.wait()
        shutil.rmtree(work, ignore_errors=True)
    rows = medians(every["this"])
    base_rows = medians(every["base"]) if "base" in every else None
    report(con, a, rows, every["this"], base_rows)


def medians(runs: dict[int, list[dict[str, Any]]]) -> dict[int, dict[str, float]]:
    """Per fleet size, the median of each figure over the repeats, and the per-host figures."""
    rows = {}
    for n, rs in runs.items():
        med = {
            k: statistics.median(x[k] for x in rs)
            for k in (
                "wall_s",
                "cpu_s",
                "peak_rss_mb",
                "peak_threads",
                "peak_fds",
                "emulator_cpu_s",
            )
        }
        med.update(
            {
                "wall_per_host_s": med["wall_s"] / n,
                "cpu_per_host_ms": 1000 * med["cpu_s"] / n,
                "rss_per_host_kb": 1024 * med["peak_rss_mb"] / n,
            }
        )
        rows[n] = med
    return rows


def report(
    con: Console,
    a: argparse.Namespace,
    rows: dict[int, dict[str, float]],
    runs: dict[int, list[dict[str, Any]]],
    base_rows: dict[int, dict[str, float]] | None,
) -> None:
    """The table, the growth line, the before/after ratios (with --baseline-rev) and the JSON
    file."""
    lo, hi = min(rows), max(rows)
    growth = {k: rows[hi][k] / rows[lo][k] for k in ("cpu_per_host_ms", "wall_per_host_s")}
    # What one more host costs, without the start-up (imports, inventory, plan) every run pays once.
    growth["cpu_marginal_per_host_ms"] = (
        1000 * (rows[hi]["cpu_s"] - rows[lo]["cpu_s"]) / max(1, hi - lo)
    )
    # RSS is mostly the interpreter and its imports: growth of what each extra host adds.
    growth["rss_added_per_host_kb"] = (
        1024 * (rows[hi]["peak_rss_mb"] - rows[lo]["peak_rss_mb"]) / max(1, hi - lo)
    )
    t = Table(
        "hosts",
        "wall s",
        "s/host",
        "cpu s",
        "ms/host",
        "rss MB",
        "thr",
        "fds",
        "emu s",
        title=f"one controller, simulated fleet (median of {a.repeats}; progress {a.progress})",
    )
    for n, m in rows.items():
        t.add_row(
            str(n),
            f"{m['wall_s']:.1f}",
            f"{m['wall_per_host_s']:.2f}",
            f"{m['cpu_s']:.1f}",
            f"{m['cpu_per_host_ms']:.0f}",
            f"{m['peak_rss_mb']:.0f}",
            f"{m['peak_threads']:.0f}",
            f"{m['peak_fds']:.0f}",
            f"{m['emulator_cpu_s']:.1f}",
        )
    con.print(t)
    con.print(
        f"growth {lo}->{hi} per host: cpu {growth['cpu_per_host_ms']:.2f}x, wall "
        f"{growth['wall_per_host_s']:.2f}x; each host adds "
        f"{growth['cpu_marginal_per_host_ms']:.0f} ms CPU, "
        f"{growth['rss_added_per_host_kb']:.0f} kB RSS",
        highlight=False,
    )
    versus: dict[int, dict[str, float]] = {}
    if base_rows is not None:
        t = Table(
            "hosts",
            "ms/host before",
            "ms/host now",
            "ratio",
            "wall before",
            "wall now",
            title=f"controller CPU per host: {a.baseline_rev} (before) vs this checkout, same run",
        )
        for n, m in rows.items():
            b = base_rows[n]
            versus[n] = {
                "cpu_per_host_ms_before": b["cpu_per_host_ms"],
                "cpu_per_host_ms": m["cpu_per_host_ms"],
                "ratio": m["cpu_per_host_ms"] / b["cpu_per_host_ms"],
                "wall_s_before": b["wall_s"],
                "wall_s": m["wall_s"],
            }
            t.add_row(str(n), f"{b['cpu_per_host_ms']:.0f}", f"{m['cpu_per_host_ms']:.0f}",
                      f"{versus[n]['ratio']:.2f}", f"{b['wall_s']:.1f}", f"{m['wall_s']:.1f}")
        con.print(t)
    out = Path(a.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "args": vars(a),
                "cpu_count": os.cpu_count(),
                "runs": runs,
                "medians": rows,
                "growth": growth,
                "baseline_medians": base_rows,
                "versus_baseline": versus,
            },
            indent=2,
        )
        + "\n"
    )
    con.print(f"wrote {out}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_emulators":
        serve_emulators(Path(sys.argv[2]), sys.argv[3:])
    elif len(sys.argv) > 1 and sys.argv[1] == "_controller":
        print(
            json.dumps(controller(Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4], sys.argv[5]))
        )
    else:
        main()
