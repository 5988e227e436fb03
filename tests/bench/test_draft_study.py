"""bench/draft_study.py on the toy shards: successive halving, and a rerun that reuses
every finished run instead of training it again."""

from __future__ import annotations

import sys
from pathlib import Path

import yaml
from train_configs import toy_train_config

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from draft_study import Cell, Study, affordable, best_runs, combined, halving  # noqa: E402


def _study(toy_shards, tmp_path) -> Study:
    base = toy_train_config(toy_shards, tmp_path / "unused", checkpoint_every=2)
    path = tmp_path / "train-toy.yaml"
    path.write_text(yaml.safe_dump(base.model_dump(mode="json")))
    return Study(
        data=str(toy_shards),
        work=tmp_path / "study",
        target="toy:trained",
        base={"DSpark": (path, {}), "DFlash": (path, {"draft.kind": "dflash"})},
    )


GRID = (
    Cell("dspark", "DSpark"),
    Cell("dspark-L2", "DSpark", {"draft.num_layers": 2}),
    Cell("dflash", "DFlash"),
    Cell("dspark-warm", "DSpark", warm_from="dflash"),
)


def test_halving_keeps_the_best_and_a_rerun_trains_nothing(toy_shards, tmp_path):
    study = _study(toy_shards, tmp_path)
    study.live = 3  # the last budget's runs also decode 3 prompts live at T=1
    first = halving(study, GRID, [2, 4], [1], [0], [0], left_out_from=99)
    at_2 = [r for r in first["runs"] if r["budget"] == 2]
    at_4 = [r for r in first["runs"] if r["budget"] == 4]
    assert len(at_2) == 4 and all(r["heldout"]["draft"]["tau_macro"] >= 1.0 for r in at_2)
    # One DSpark and one DFlash cell go on, plus a combined cell where changes beat the base.
    kinds = sorted(r["draft"] for r in at_4 if "+" not in r["cell"])
    assert kinds == ["DFlash", "DSpark"]
    assert sorted(first["cut"][2]) == sorted({r["cell"] for r in at_2} - {r["cell"] for r in at_4})
    # The DSpark backbone row (what vLLM's CPU build serves) only at the last budget.
    assert not any("backbone" in r["heldout"] for r in at_2)
    assert {r["draft"] for r in at_4 if "backbone" in r["heldout"]} == {"DSpark"}
    # The live loop at T=1 too, on the same 3 prompts for every draft (paired draws).
    assert not any("live_t1" in r["heldout"] for r in at_2)
    lives = [r["heldout"]["live_t1"] for r in at_4]
    assert all(live["tau_macro"] >= 1.0 and live["num_samples"] == 3 for live in lives)
    assert len({tuple(live["per_sample"]["ids"]) for live in lives}) == 1
    warm = next(r for r in at_2 if r["cell"] == "dspark-warm")
    dflash = next(r for r in at_2 if r["cell"] == "dflash")
    assert warm["changes"]["init_from"] == dflash["run_dir"]
    assert warm["warm_source_seconds"] == dflash["train_seconds"]  # counted in its compute

    stamps = {p: p.stat().st_mtime_ns for p in (tmp_path / "study").rglob("*") if p.is_file()}
    again = halving(study, GRID, [2, 4], [1], [0], [0], left_out_from=99)
    assert again["runs"] == first["runs"]
    after = {p: p.stat().st_mtime_ns for p in (tmp_path / "study").rglob("*") if p.is_file()}
    assert after == stamps  # nothing trained, evaluated or written again
    assert set(best_runs(again["runs"], 4)) == {"DSpark", "DFlash"}


def test_combined_cell_takes_each_change_that_beat_the_base():
    cells = [
        Cell("d", "DSpark"),
        Cell("d-L2", "DSpark", {"draft.num_layers": 2}),
        Cell("d-L3", "DSpark", {"draft.num_layers": 3}),
        Cell("d-B8", "DSpark", {"draft.block_size": 8}),
        Cell("d-R256", "DSpark", {"draft.markov_rank": 256}),
    ]
    scores = {"d": 1.5, "d-L2": 1.6, "d-L3": 1.7, "d-B8": 1.55, "d-R256": 1.4}
    (cell,) = combined(cells, scores)
    assert cell.name == "d+B8+L3"
    assert cell.changes == {"draft.num_layers": 3, "draft.block_size": 8}
    assert combined(cells[:2], {"d": 1.5, "d-L2": 1.4}) == []


def test_combined_cell_warm_starts_when_the_warm_start_beat_the_base():
    cells = [
        Cell("d", "DSpark"),
        Cell("d-R256", "DSpark", {"draft.markov_rank": 256}),
        Cell("d-warm", "DSpark", {}, warm_from="f"),
        Cell("f", "DFlash"),
    ]
    (cell,) = combined(cells, {"d": 1.5, "d-R256": 1.6, "d-warm": 1.7, "f": 1.4})
    assert (cell.name, cell.changes, cell.warm_from) == (
        "d+R256+warm",
        {"draft.markov_rank": 256},
        "f",
    )
    # A cell marked not to combine (another layout) stays out however well it did.
    layout = Cell("d-anchor", "DSpark", {"draft.sample_from_anchor": True}, combine=False)
    (same,) = combined(
        [*cells, layout], {"d": 1.5, "d-R256": 1.6, "d-warm": 1.7, "f": 1.4, "d-anchor": 2.0}
    )
    assert same == cell
    # A warm start that did not beat the base stays out, and one change alone combines nothing.
    assert combined(cells, {"d": 1.5, "d-R256": 1.6, "d-warm": 1.4, "f": 1.4}) == []


def test_a_dear_cell_goes_on_only_when_it_buys_its_compute():
    cells = [
        Cell("d", "DSpark"),
        Cell("d-A128", "DSpark", {"data.num_anchors": 128}),
        Cell("d-L2", "DSpark", {"draft.num_layers": 2}),
    ]
    seconds = {"d": 100.0, "d-A128": 400.0, "d-L2": 150.0}
    scores = {"d": 1.50, "d-A128": 1.53, "d-L2": 1.51}
    assert affordable(cells, scores, seconds) == {"d", "d-L2"}
    assert combined(cells, scores, {"d", "d-L2"}) == []  # A128 is out: L2 alone combines nothing
    scores["d-A128"] = 1.60  # 7% ahead: worth four times the seconds
    assert affordable(cells, scores, seconds) == {"d", "d-A128", "d-L2"}


def test_frontier_keeps_only_runs_no_cheaper_run_beats():
    from draft_study import frontier

    runs = [
        {"cell": c, "train_seconds": s, "heldout": {"draft": {"tau_macro": t}}}
        for c, s, t in (("a", 100, 1.2), ("b", 200, 1.1), ("c", 300, 1.3), ("d", 50, 1.0))
    ]
    assert [r["cell"] for r in frontier(runs)] == ["d", "a", "c"]
