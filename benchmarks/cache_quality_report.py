"""The cache benchmark's report on quality: each labeled set at the configured threshold, and the
error budget against fixed thresholds on simulated traffic (``cache_quality``)."""

from __future__ import annotations

from typing import Any

from benchmarks.cache_quality import LATER_HELDOUT

SET_NAMES = {
    "project": "project's pairs (training)",
    "calibration": "calibration pairs (training)",
    "written": "pairs written for training (training)",
    "heldout": "**held-out pairs**",
    **{f"heldout_{letter.lower()}": f"**held-out pairs {letter}**" for letter in LATER_HELDOUT},
}


def _pct(value: float) -> str:
    return f"{100 * value:.1f}%"


def set_rows(results: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    header = ["set", "pairs (paraphrases)", "paraphrases hit", "false-hit rate (false hits)",
              "cosine ≥ 0.8 alone: hit / false",
              "pairs also in training; the rest: hit / false"]  # fmt: skip
    rows = []
    for name, row in results["per_set"].items():
        unseen = "–"
        if "also_in_training" in row:
            unseen = (f"{row['also_in_training']}; {_pct(row['unseen_recall'])} / "
                      f"{_pct(row['unseen_false_hit_rate'])}")  # fmt: skip
        cells = [
            SET_NAMES.get(name, name), f"{row['pairs']} ({row['should_hit']})",
            _pct(row["recall"]), f"{_pct(row['false_hit_rate'])} ({row['false_hits']})",
            f"{_pct(row['baseline_recall'])} / {_pct(row['baseline_false_hit_rate'])}", unseen,
        ]  # fmt: skip
        rows.append(cells)
    return header, rows


def traffic_rows(results: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    header = [
        "traffic", "max_error_rate", "seed", "realized error", "hit rate",
        "paraphrase / near-miss requests served", "extra model calls / 1,000",
        "threshold learned", "best fixed threshold in hindsight: threshold, hit rate, error",
    ]  # fmt: skip
    rows = []
    traffic = results["traffic"]
    runs = [("project + held-out", traffic), ("held-out", traffic["heldout_only"])]
    for name, result in runs:
        rows += _traffic_rows(name, result)
    return header, rows


def _traffic_rows(name: str, result: dict[str, Any]) -> list[list[str]]:
    rows = []
    for run in result["runs"]:
        for row in run["budget"]:
            delta = row["max_error_rate"]
            best = run["best_fixed"][str(delta)]
            fixed = (f"{best['threshold']:g}, {_pct(best['hit_rate'])}, "
                     f"{_pct(best['error_rate'])}" if best else "none stays within it")  # fmt: skip
            learned = row["final_threshold"]
            rows.append([
                name, f"{delta:g}", str(run["seed"]),
                f"**{_pct(row['error_rate'])}** ({row['wrong']} of {row['served']})",
                _pct(row["hit_rate"]),
                f"{_pct(row['paraphrase_hit_rate'])} / {_pct(row['near_miss_hit_rate'])}",
                f"{row['extra_calls_per_1000']:.1f}",
                "none" if learned is None else f"{learned:g}", fixed,
            ])  # fmt: skip
    return rows


def quality_lines(results: dict[str, Any], table: Any, traffic_png_link: str) -> list[str]:
    traffic = results["traffic"]
    lines = [
        "### Error budget on simulated traffic",
        "",
        f"{traffic['requests']:,} requests per seed, drawn with Zipf-like popularity from the "
        f"queries of the {' and '.join(traffic['sets'])} pairs ({traffic['distinct_queries']} "
        f"distinct; {traffic['with_candidate']} find a cached question at similarity ≥ "
        f"{traffic['floor']:g} that the guards let through); every repeat is a semantic "
        "decision (exact caching off). The cache holds the answers of every cached question; "
        "a served answer is right when the pair is labeled a paraphrase (or the texts are "
        "equal), and a verification learns exactly that. The error budget runs with the "
        f"server's defaults (verify_fraction {traffic['verify_fraction']:g}, min_verifications "
        f"{traffic['min_verifications']}, min_similarity {traffic['floor']:g}). Realized error "
        "= wrong answers among the semantic hits served. The fixed threshold compared is the "
        "best one (most hits within the same error) picked in hindsight on the same traffic: "
        "tuned on the data it is judged on. The last rows draw from the held-out pairs alone, "
        "at the default max_error_rate: *paraphrase / near-miss requests served* are, on "
        "traffic, what the static table's paraphrases hit and false-hit rate are.",
        "",
        *table(*traffic_rows(results)),
        "",
        *_loss_lines(results["traffic"]["heldout_only"]),
    ]
    if traffic_png_link:
        lines += [f"![Hit rate against realized error]({traffic_png_link})", ""]
    return lines


def _loss_lines(result: dict[str, Any]) -> list[str]:
    """Where the held-out traffic's paraphrase requests that were not served went, per seed."""
    parts = []
    for run in result["runs"]:
        for row in run["budget"]:
            losses = row.get("paraphrase_losses")
            if losses:
                causes = ", ".join(f"{cause} {_pct(share)}" for cause, share in
                                   sorted(losses.items(), key=lambda item: -item[1]))  # fmt: skip
                parts.append(f"seed {run['seed']}: {causes}")
    if not parts:
        return []
    return ["Paraphrase requests of the held-out traffic not served, as shares of all its "
            "paraphrase requests, by why (the candidate's state when it came): "
            + "; ".join(parts) + ".", ""]  # fmt: skip


def quality_targets(results: dict[str, Any], target: Any) -> list[dict[str, Any]]:
    checks = []
    heldout = results["traffic"]["heldout_only"]["runs"]
    rows = [row for run in heldout for row in run["budget"]]
    checks += [
        target("held-out traffic at the defaults: near-miss requests served (worst seed)",
               100 * max(row["near_miss_hit_rate"] for row in rows), "<=", 1, "%"),
        target("held-out traffic at the defaults: paraphrase requests served (worst seed)",
               100 * min(row["paraphrase_hit_rate"] for row in rows), ">=", 60, "%"),
    ]  # fmt: skip
    runs = results["traffic"]["runs"]
    for delta in sorted({row["max_error_rate"] for run in runs for row in run["budget"]}):
        worst = max(
            row["error_rate"] for run in runs for row in run["budget"]
            if row["max_error_rate"] == delta
        )  # fmt: skip
        name = f"realized error, max_error_rate {delta:g} (worst seed)"
        checks.append(target(name, 100 * worst, "<=", 100 * delta, "%"))
    return checks
