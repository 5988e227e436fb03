"""Where every benchmark records its figures: keys merged into results.json, one section of RESULTS.md each.

Each bench owns its keys and the section between its own markers, so running
one bench never erases another's figures.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable
from pathlib import Path

BENCH = Path(__file__).resolve().parent
RESULTS_JSON = BENCH / "results.json"
RESULTS_MD = BENCH / "RESULTS.md"
HISTORY = "\n# History\n"  # measurement history, kept by hand at the end of RESULTS.md


def merge_results(new: dict, replace: tuple[str, ...] = (), keep: tuple[str, ...] = ()) -> dict:
    """Update results.json with `new` (other benches' keys stay); keys starting with
    one of `replace` go first (but those starting with one of `keep`): a bench's run
    replaces all of its earlier figures."""
    current = json.loads(RESULTS_JSON.read_text()) if RESULTS_JSON.exists() else {}
    if replace:
        current = {
            k: v for k, v in current.items() if not k.startswith(replace) or k.startswith(keep)
        }
    current.update(new)
    RESULTS_JSON.write_text(json.dumps(current, indent=2, sort_keys=True) + "\n")
    return current


def write_section(tag: str, body: str) -> None:
    """Replace (or add) the RESULTS.md section between `<!-- <tag>: begin/end -->`.

    A new section goes before the closing "# History" part, which stays last.
    """
    begin, end = f"<!-- {tag}: begin -->", f"<!-- {tag}: end -->"
    section = f"{begin}\n{body.rstrip()}\n{end}\n"
    text = RESULTS_MD.read_text() if RESULTS_MD.exists() else "# Benchmark results\n"
    if begin in text and end in text:
        head, _, rest = text.partition(begin)
        _, _, tail = rest.partition(end)
        text = head + section.rstrip("\n") + tail
    elif HISTORY in text:
        head, _, tail = text.partition(HISTORY)
        text = head.rstrip("\n") + "\n\n" + section + HISTORY + tail
    else:
        text = text.rstrip("\n") + "\n\n" + section
    RESULTS_MD.write_text(text)


def spread(values: Iterable[float]) -> dict:
    """The median of per-round figures with their range: {"median", "min", "max"}."""
    values = list(values)
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def fmt_spread(d: dict, digits: int = 0) -> str:
    """A `spread` as "median [min-max]"."""
    return f"{d['median']:.{digits}f} [{d['min']:.{digits}f}-{d['max']:.{digits}f}]"


def cpu_capability() -> str:
    """torch's CPU capability and whether the CPU does bf16 arithmetic natively, e.g.
    "AVX2, bf16 emulated": recorded beside CPU figures. Without AVX512-BF16 or AMX
    (x86) or BF16 (Arm), bf16 arithmetic is emulated (a bf16 linear layer measured 15x
    slower than fp32 on an AVX2 host), so a bf16 engine's figures from such a host
    describe another regime."""
    import torch

    base = str(torch.backends.cpu.get_cpu_capability())
    native = bf16_native()
    return base if native is None else f"{base}, bf16 {'native' if native else 'emulated'}"


def bf16_native() -> bool | None:
    """Whether the CPU has bf16 arithmetic instructions (None: cannot tell on this OS)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    flags = set()
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):
            flags.update(line.partition(":")[2].split())
    return bool(flags & {"avx512_bf16", "amx_bf16", "bf16"})


def public_command(script: str, argv: list[str], hide: dict[str, str]) -> str:
    """`python <script> <argv>` with the values of the flags in `hide` named, not spelled
    out (`{"--work": "WORK"}`): a results file never carries this machine's paths."""
    out = []
    for i, arg in enumerate(argv):
        key = arg.split("=", 1)[0]
        if key in hide and "=" in arg:
            out.append(f"{key} {hide[key]}")
        elif i and argv[i - 1] in hide:
            out.append(hide[argv[i - 1]])
        else:
            out.append(arg)
    return " ".join([f"python {script}", *out])


def paired_ratio(num: dict | None, den: dict | None) -> dict | None:
    """{"ratio", "ci95"} of two evaluation rows' macro tau (each with `per_sample`), the
    interval a paired bootstrap over the samples both have; None without both rows."""
    import math

    from pipeline.evaluate.uncertainty import PerSample, ratio_interval

    if not num or not den:
        return None
    point, lo, hi = ratio_interval(
        PerSample.from_dict(num["per_sample"]), PerSample.from_dict(den["per_sample"])
    )
    return {
        "ratio": round(point, 3),
        "ci95": None if math.isnan(lo) else [round(lo, 3), round(hi, 3)],
    }
