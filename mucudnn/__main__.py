"""The command line: ``python -m mucudnn bench | optimize | plot | cache`` (or ``mucudnn ...``).

    python -m mucudnn bench --net alexnet --batch 256 --workspace 64MiB --policy powerOfTwo
    python -m mucudnn optimize --net resnet18 --workspace 64MiB --json plans.json
    python -m mucudnn optimize --net resnet50 --devices 0,1   # benchmark on two GPUs
    python -m mucudnn plot --net alexnet --out figures/
    python -m mucudnn cache info | export h100.sqlite.gz | import h100.sqlite.gz | merge a b -o c
    python -m mucudnn --version

Every failure a user can cause or meet (a bad argument, environment variable
or file, no GPU for a GPU backend, a missing optional package) ends the run
before any heavy work with one line, ``python -m mucudnn <command>: error:
...``, and exit code 2; ``-v`` shows its traceback. Anything else is a bug and
keeps its traceback.

Without a GPU (and with no ``--backend``/``MUCUDNN_BACKEND`` chosen) the
NumPy backend runs at most :data:`CPU_BATCH` samples of the network and says
so: CPU timings are a check that everything runs, not a measurement of what a
GPU gains.

>>> parse_size("64MiB"), positive_int("8")
(67108864, 8)
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import re
import sys
from typing import Any, NoReturn, Sequence

from ._version import __version__
from ._optional import install_hint, require
from .cuda import device_count
from .cuda._runtime import missing as cuda_bindings_missing
from .errors import InvalidValueError, MucudnnError
from .networks import DEFAULT_BATCH, NETWORKS, select
from .problem import Direction
from .units import parse_bytes

PROG = "python -m mucudnn"

# Note [commands load what they run]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# `--version` and `--help` import no backend, optimizer, SciPy, networkx, tqdm or
# ml_dtypes (seconds on a cold disk, most of one on a warm disk;
# tests/test_import_budget.py). Each command imports the rooms it runs inside its own
# function, and the parser names the backends from BACKENDS, which tests/test_cli.py
# holds equal to available_backends().
#: The names --backend accepts (get_backend's registry).
BACKENDS = ("numpy", "cudnn", "cudnn-graph", "cudnn-graph+knobs")

#: The largest batch the NumPy backend runs when it stands in for a missing GPU.
#: Measured with ``bench`` (all layers, three directions, a cold cache) on a
#: 2-core Xeon: alexnet 7 s at batch 1, 14 s at 2, 28 s at 4; resnet18 14 s at
#: 1, 20 s at 2; resnet50 81 s and vgg16 75 s at batch 1, so those two stay
#: over a minute at any batch (``--layers`` picks fewer layers). Other loads on
#: the machine stretch these (alexnet at 2 took 83 s next to two test runs).
CPU_BATCH: dict[str, int] = {"alexnet": 2, "resnet18": 2, "resnet50": 1, "vgg16": 1}
#: Networks the NumPy backend cannot finish in a minute even at batch 1 (see above).
CPU_SLOW = {"resnet50": "80 s", "vgg16": "80 s"}
#: Printed after every table of NumPy timings.
CPU_TIMINGS_NOTE = ("note: these are NumPy (CPU) timings: they say nothing about speedups on a "
                    "GPU, and at small batches differences of a few percent are timer noise")


class CommandLineError(MucudnnError, ValueError):
    """An argument, environment variable or file the command line refuses."""


# -- argument types (each error becomes "argument --x: <message>") -------------------------------
def parse_size(text: str) -> int:
    """A size argument in bytes (units as :func:`mucudnn.units.parse_bytes` reads them).

    >>> parse_size("64MiB"), parse_size("1.5GiB"), parse_size("100")
    (67108864, 1610612736, 100)
    """
    try:
        return parse_bytes(text)
    except (TypeError, ValueError) as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("size: ")) from None


def positive_int(text: str) -> int:
    """A count of at least 1 (``--batch``, ``--repeat``)."""
    try:
        n = int(text, 10)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a positive int, got {text!r}")
    return n


def parse_policy(text: str) -> Any:
    """A named policy, or sizes such as ``64,32`` (returned as a list of ints)."""
    from .optimizer.policies import normalize_policy  # Note [commands load what they run]

    value: Any = text
    if re.fullmatch(r"[0-9,\s]+", text):
        value = [int(v) for v in text.split(",") if v.strip()]
    try:
        if value == []:
            raise InvalidValueError("no sizes")
        normalize_policy(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected powerOfTwo, fitted, all, undivided or positive sizes like 64,32; got {text!r}"
        ) from None
    return value


def _directions(text: str) -> list[str]:
    try:
        return [Direction.parse(d).value for d in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a comma-separated list of {', '.join(d.value for d in Direction)}; "
            f"got {text!r}") from None


def parse_devices(text: str) -> list[int]:
    """A ``--devices`` value: comma-separated CUDA device ordinals, each once;
    CommandLineError naming ``--devices`` otherwise.

    >>> parse_devices("0,1"), parse_devices(" 2 ")
    ([0, 1], [2])
    """
    from .optimizer import check_devices  # Note [commands load what they run]

    try:
        ids = [int(v.strip(), 10) for v in str(text).split(",")]
        return list(check_devices(ids))
    except ValueError as exc:  # int() and check_devices (an InvalidValueError)
        why = str(exc).removeprefix("devices: ") if str(exc).startswith("devices:") else ""
        raise CommandLineError(
            f"argument --devices: expected CUDA device ordinals like 0,1, each once; got "
            f"{text!r}{f' ({why})' if why else ''}") from None


def _json_file(text: str) -> str:
    """A file to write: its folder must exist and it must not be a folder."""
    if os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text!r} is a folder; expected a file name")
    folder = os.path.dirname(os.path.abspath(text))
    if not os.path.isdir(folder):
        raise argparse.ArgumentTypeError(f"folder {folder!r} does not exist")
    return text


def _out_dir(text: str) -> str:
    if os.path.exists(text) and not os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text!r} exists and is not a folder")
    return text


# -- the parser ------------------------------------------------------------------------------
def _one_line(message: str) -> str:
    return " ".join(part.strip() for part in str(message).splitlines() if part.strip())


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors: ``<prog>: error: <message>`` (exit code 2)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {_one_line(message)}\n")

    def parse_args(self, args: Any = None,  # type: ignore[override]
                   namespace: Any = None) -> argparse.Namespace:
        # Note: argparse reports a subcommand's unknown options as the top
        # parser's; name the subcommand, as every other error does.
        ns, extras = self.parse_known_args(args, namespace)
        if extras:
            command = getattr(ns, "command", None)
            prog = f"{self.prog} {command}" if command else self.prog
            self.exit(2, f"{prog}: error: unrecognized arguments: {_one_line(' '.join(extras))}\n")
        return ns


def _common(p: argparse.ArgumentParser, offline: bool, devices: bool = False) -> None:
    p.add_argument("--net", required=True, choices=sorted(NETWORKS), help="network")
    p.add_argument("--batch", type=positive_int, default=None,
                   help="mini-batch size (default: the paper's: alexnet 256, resnet 128, "
                        "vgg16 64; without a GPU the NumPy backend runs at most "
                        f"{', '.join(f'{k} {v}' for k, v in CPU_BATCH.items())})")
    p.add_argument("--dtype", default="float32",
                   choices=["float32", "float16", "bfloat16", "float64"])
    p.add_argument("--layout", default="NCHW", choices=["NCHW", "NHWC"])
    p.add_argument("--math", default="default",
                   choices=["default", "fma", "tensor_op", "tensor_op_allow_conversion"])
    p.add_argument("--workspace", type=parse_size, default=64 << 20,
                   help="workspace limit per kernel, e.g. 64MiB (default 64MiB)")
    p.add_argument("--policy", type=parse_policy, default=None,
                   help="batch-size policy: fitted (the default), powerOfTwo, all, undivided or a "
                        "list like 64,32")
    p.add_argument("--mode", default="wr", choices=["wr", "wd"],
                   help="wr: a limit per kernel; wd: one total budget for all kernels")
    p.add_argument("--total-workspace", type=parse_size, default=None,
                   help="WD budget, --mode wd only (default: --workspace x number of kernels)")
    p.add_argument("--backend", default=None, choices=BACKENDS,
                   help="default: $MUCUDNN_BACKEND, else cudnn-graph where a GPU is present, "
                        "else numpy (at a small batch)")
    if offline:
        p.add_argument("--offline", action="store_true",
                       help="answer from the benchmark cache only (measurements made on a GPU "
                            "elsewhere; set MUCUDNN_CACHE to that file)")
    p.add_argument("--layers", default=None, help="comma-separated layer names (default: all)")
    p.add_argument("--directions", type=_directions,
                   default=[d.value for d in Direction],
                   help="comma-separated: forward,backward_data,backward_filter (default: all)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    if devices:
        p.add_argument("--devices", default=None, metavar="0,1",
                       help="benchmark on these CUDA devices (a process each), the distinct kernels "
                            "spread over them, into the one cache (with the numpy backend: "
                            "one host worker per entry)")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="log each plan; show tracebacks of errors")


def cmd_cache(args: argparse.Namespace) -> int:
    """``cache info|export|import|merge`` (see :mod:`mucudnn.optimizer.cache_tools`)."""
    from .optimizer import cache_tools  # Note [commands load what they run]

    if args.cache_command == "info":
        print(cache_tools.info(args.path))
    elif args.cache_command == "export":
        n = cache_tools.export(args.out, backend=args.backend, device=args.device,
                               version=args.version, force=args.force)
        print(f"wrote {n} entries to {args.out}")
    elif args.cache_command == "import":
        read, stored = cache_tools.import_cache(args.file)
        print(f"imported {args.file}: {read} entries read, {stored} added or replaced "
              "(entries measured under a larger workspace cap are kept)")
    else:
        n = cache_tools.merge(args.inputs, args.out, force=args.force)
        print(f"wrote {n} entries to {args.out}")
    return 0


def _cache_parser(sub: Any) -> None:
    c = sub.add_parser("cache", help="inspect, export, import and merge benchmark caches",
                       description="The current cache is MUCUDNN_CACHE's file (default: the "
                       "user cache directory). Portable files are gzipped SQLite caches "
                       "(*.sqlite.gz), usable directly and read-only as MUCUDNN_CACHE.")
    cs = c.add_subparsers(dest="cache_command", required=True)
    i = cs.add_parser("info", help="path, schema version and entries per backend/device/version")
    i.add_argument("path", nargs="?", default=None, help="a cache file (default: the current one)")
    e = cs.add_parser("export", help="write the current cache's entries to a portable file")
    e.add_argument("out", help="output file; *.gz: gzipped SQLite (portable), else plain SQLite")
    e.add_argument("--backend", default=None, help="only this backend (e.g. cudnn-graph)")
    e.add_argument("--device", default=None, help='only this device (e.g. "NVIDIA H100")')
    e.add_argument("--version", default=None, help="only this library version (e.g. 9.19.0)")
    e.add_argument("--force", action="store_true", help="replace OUT if it exists")
    m = cs.add_parser("import", help="merge a cache file (SQLite or .sqlite.gz) into the "
                                     "current cache; larger workspace caps win")
    m.add_argument("file")
    g = cs.add_parser("merge", help="merge cache files into a new one")
    g.add_argument("inputs", nargs="+", help="cache files (SQLite or .sqlite.gz)")
    g.add_argument("-o", "--out", required=True, help="output file (*.gz: gzipped)")
    g.add_argument("--force", action="store_true", help="replace OUT if it exists")
    c.set_defaults(func=cmd_cache, verbose=False)


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(prog=PROG, description=(
        "Micro-batched cuDNN convolutions: benchmark, optimise and plot networks."))
    ap.add_argument("--version", action="version", version=f"mucudnn {__version__}")
    sub = ap.add_subparsers(dest="command", required=True)
    b = sub.add_parser("bench", help="optimise, execute and time every conv layer of a network")
    _common(b, offline=False, devices=True)
    b.add_argument("--repeat", type=positive_int, default=None,
                   help="timed runs per plan (median; default 10 on a GPU, 3 on NumPy)")
    b.add_argument("--json", type=_json_file, default=None,
                   help="write all numbers to this JSON file")
    b.add_argument("--graph", action="store_true",
                   help="time plans replayed as CUDA graphs (as Convolution(graph=True) runs)")
    b.set_defaults(func=cmd_bench)
    o = sub.add_parser("optimize", help="print a table of the plans of a network; "
                                        "--json saves them for mucudnn.load_plans")
    _common(o, offline=True, devices=True)
    o.add_argument("--json", type=_json_file, default=None,
                   help="write the plans to this JSON file (read it with mucudnn.load_plans)")
    o.set_defaults(func=cmd_optimize)
    p = sub.add_parser("plot", help="draw Pareto fronts and the speedup-versus-limit curve")
    _common(p, offline=True)
    p.add_argument("--out", type=_out_dir, default=".", help="folder for the PNG files")
    p.set_defaults(func=cmd_plot)
    _cache_parser(sub)
    return ap


# -- what every command checks first ---------------------------------------------------------------
def _layers(args: argparse.Namespace) -> list[str] | None:
    return args.layers.split(",") if args.layers else None


def _resolve(args: argparse.Namespace) -> tuple[Any, int]:
    """Backend (a name, None for the default, or the offline CachedBackend) and
    batch, after checking the environment and the arguments that depend on
    each other; prints first a line saying so when offline or falling back to
    the CPU, and which benchmark cache the command uses (Note [say which cache]).
    A missing ``--policy`` becomes the default policy."""
    from .exec.workspace import env_workspace_limit
    from .optimizer import CachedBackend, check_ordinals
    from .optimizer.cache import default_cache
    from .optimizer.policies import DEFAULT_POLICY

    if args.policy is None:
        args.policy = DEFAULT_POLICY
    if args.total_workspace is not None and args.mode != "wd":
        raise CommandLineError("argument --total-workspace: is the budget of --mode wd; "
                               "use --workspace for a limit per kernel")
    env = os.environ.get("MUCUDNN_BACKEND", "").strip().lower()
    if env and env not in BACKENDS:
        raise CommandLineError(f"MUCUDNN_BACKEND: expected one of {list(BACKENDS)}, "
                               f"got {env!r}")
    env_workspace_limit()  # a bad MUCUDNN_WORKSPACE_LIMIT fails now, naming itself
    select(args.net, _layers(args))  # unknown layer names fail now
    batch = args.batch if args.batch is not None else DEFAULT_BATCH[args.net]
    devices = getattr(args, "devices", None)
    if devices is not None:
        args.devices = devices = parse_devices(devices)
        if getattr(args, "offline", False):
            raise CommandLineError("argument --devices: --offline answers from the cache and "
                                   "benchmarks nothing; leave out one of them")
    if getattr(args, "offline", False):
        be = CachedBackend(args.backend or "cudnn-graph")
        _cache_notice(be.cache)
        print(f"offline: plans from cached measurements of {be.name} on {be.device_name} "
              f"({be.version})", flush=True)
        args.no_progress = True  # nothing is measured: no bar to show
        return be, batch
    backend = args.backend or env or None
    have_gpu = device_count() > 0
    # without cuda-bindings no GPU can be seen, whether or not one is there: say so
    why = (f" (cuda-bindings is not installed: {install_hint('cudnn')})"
           if not have_gpu and cuda_bindings_missing() else "")
    if backend in ("cudnn", "cudnn-graph") and not have_gpu:
        how = f"--backend {backend}" if args.backend else f"MUCUDNN_BACKEND={env}"
        raise CommandLineError(
            f"{how} needs a CUDA GPU and none was found{why}; use --backend numpy (CPU), or "
            "optimize/plot --offline with measurements made on a GPU")
    if backend is None and not have_gpu:
        backend = "numpy"
        small = min(batch, CPU_BATCH[args.net])
        note = (f"note: no CUDA GPU found{why}; running on the NumPy (CPU) backend at batch "
                f"{small}")
        if small != batch:
            note += f" instead of {batch}"
        if args.net in CPU_SLOW:
            note += (f" (even so {args.net} takes about {CPU_SLOW[args.net]} on 2 CPU cores; "
                     "--layers picks fewer layers)")
        print(note + "; --backend numpy runs the batch you ask for", flush=True)
        batch = small
    if devices is not None and backend != "numpy" and have_gpu:
        try:
            check_ordinals(tuple(devices))
        except InvalidValueError as exc:  # "devices: this machine has ..."
            raise CommandLineError(f"argument --{exc}") from None
    if args.dtype == "bfloat16" and (backend == "numpy" or args.command == "bench"):
        require("ml_dtypes", "bfloat16", "bfloat16 arrays on the host")
    _cache_notice(default_cache())
    return backend, batch


# Note [say which cache]
# ~~~~~~~~~~~~~~~~~~~~~~
# The default benchmark cache is one file per user, so a command's "first" run
# is warm whenever an earlier run (a test, a tool, another checkout) measured
# the same kernels. Each command that reads it says once, before any work,
# which file it is and how many entries it holds.
def _cache_notice(store: Any) -> None:
    """Print the cache ``store``'s file and its entry count (Note [say which cache])."""
    if not store.enabled:
        print("cache: off (MUCUDNN_CACHE=off): every size is measured, nothing is kept",
              flush=True)
        return
    n = len(store)
    mode = ", read-only" if store.read_only else ""
    print(f"cache: {store.path} ({n} entr{'y' if n == 1 else 'ies'}{mode}; MUCUDNN_CACHE "
          "names another file)", flush=True)


# -- what the commands run, imported on the first call (Note [commands load what they run]) --
def run_network(*args: Any, **kwargs: Any) -> Any:
    """:func:`mucudnn.bench.run_network`."""
    from .bench import run_network as run

    return run(*args, **kwargs)


def optimize_kernels(*args: Any, **kwargs: Any) -> Any:
    """:func:`mucudnn.optimizer.optimize_kernels`."""
    from .optimizer import optimize_kernels as run

    return run(*args, **kwargs)


def optimize_network(*args: Any, **kwargs: Any) -> Any:
    """:func:`mucudnn.optimizer.optimize_network`."""
    from .optimizer import optimize_network as run

    return run(*args, **kwargs)


def plot_network(*args: Any, **kwargs: Any) -> Any:
    """:func:`mucudnn.plot.plot_network`."""
    from .plot import plot_network as run

    return run(*args, **kwargs)


# -- the commands (each imports what it runs: Note [commands load what they run]) --------------
def cmd_bench(args: argparse.Namespace) -> int:
    from .backends import get_backend
    from .bench import format_table, save_json

    backend, batch = _resolve(args)
    backend = get_backend(backend).name
    repeat = args.repeat if args.repeat is not None else (3 if backend == "numpy" else 10)
    r = run_network(args.net, batch, dtype=args.dtype, layout=args.layout, math_mode=args.math,
                    workspace_limit=args.workspace, policy=args.policy, mode=args.mode,
                    total_workspace=args.total_workspace, backend=backend, repeat=repeat,
                    warmup=1 if backend == "numpy" else 3,
                    layers=_layers(args),
                    directions=args.directions, progress=not args.no_progress,
                    graph=args.graph, devices=args.devices)
    print(format_table(r))
    if backend == "numpy":
        print(CPU_TIMINGS_NOTE)
    if args.json:
        save_json([r], args.json)
        print(f"wrote {args.json}")
    return 0


def cmd_optimize(args: argparse.Namespace) -> int:
    backend, batch = _resolve(args)
    probs = {l.name: l.problem(batch, dtype=args.dtype, layout=args.layout, math=args.math)
             for l in select(args.net, _layers(args))}
    dirs = args.directions
    progress = not args.no_progress
    devices = getattr(args, "devices", None)
    # See Note [benchmarking on several devices]: devices= only where asked for.
    more = {"devices": devices} if devices is not None else {}
    if args.mode == "wd":
        total = (args.total_workspace if args.total_workspace is not None
                 else args.workspace * len(probs) * len(dirs))
        plans = optimize_network(probs, total, dirs, policy=args.policy, backend=backend,
                                 progress=progress, **more)
    else:  # a repeated layer (same problem) shares its plan
        plans = optimize_kernels({(name, d): (p, d) for name, p in probs.items() for d in dirs},
                                 args.workspace, args.policy, backend, progress=progress, **more)
    out = []
    for (name, d), plan in plans.items():
        out.append({"layer": name, "direction": str(d), **plan.to_dict()})
        und = f"{plan.undivided_time_ms:.3f}" if math.isfinite(plan.undivided_time_ms) else "n/a"
        print(f"{name:24s} {str(d):16s} {plan.describe():>18s}  predicted {plan.time_ms:8.3f} ms"
              f"  undivided {und:>8s} ms  workspace {plan.workspace_bytes / (1 << 20):7.1f} MiB")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
        print(f"wrote {args.json}")
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    require("matplotlib", "plot", "plotting")
    backend, batch = _resolve(args)
    files = plot_network(args.net, batch, out_dir=args.out, dtype=args.dtype,
                         layout=args.layout, math_mode=args.math, policy=args.policy,
                         backend=backend, workspace_limit=args.workspace,
                         layers=_layers(args),
                         directions=args.directions, progress=not args.no_progress)
    for f in files:
        print(f"wrote {f}")
    return 0


#: Failures a user can cause or meet; anything else is a bug and keeps its traceback.
#: (ValueError and NotImplementedError: rooms not yet on MucudnnError raise them
#: for bad values and for what a backend cannot do.)
EXPECTED = (MucudnnError, ValueError, OSError, MemoryError, NotImplementedError)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(message)s")
    prog = f"{parser.prog} {args.command}"
    try:
        return int(args.func(args) or 0)
    except BrokenPipeError:  # e.g. `... | head`: stop quietly, as a tool killed by SIGPIPE
        _silence_stdout()
        return 141
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except EXPECTED as exc:
        if args.verbose:
            raise
        message = _one_line(str(exc)) or type(exc).__name__
        parser.exit(2, f"{prog}: error: {message}\n")


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's last flush cannot fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass


if __name__ == "__main__":
    sys.exit(main())
