"""What the command line prints: one aligned line per fact, sizes in GiB/MiB with exact bytes."""

from __future__ import annotations

import argparse
from typing import Any

from autotune.units import format_bytes
from autotune.units import format_sized as _sized

__all__ = ["print_fit", "print_simulation", "print_verification"]


def _print_order_edges(
    edges: tuple[tuple[str, ...], ...], loops: Any = (), shown: int = 3, saved: str = ""
) -> None:
    """The plan's order edges and serial loops (`--serialize`), what they save if known, the
    first few edges by name."""
    if loops:
        which = "loop runs" if len(loops) == 1 else "loops run"
        more = f" and {len(loops) - shown} more" if len(loops) > shown else ""
        names = ", ".join(loops[:shown]) + more
        print(f"  serial     {len(loops)} {which} one iteration at a time: {names}")
        if not edges and saved:
            print(f"             ({saved})")
    if not edges:
        return
    keep = "edge reorders" if len(edges) == 1 else "edges reorder"
    print(f"  ordered    {len(edges)} order {keep} the backward pass{f' ({saved})' * bool(saved)}:")
    for before, after in edges[:shown]:
        print(f"             {after} waits for {before}")
    if len(edges) > shown:
        print(f"             ... and {len(edges) - shown} more (see --json)")


def _print_cpu_kernels(k: dict[str, Any], schedule: str) -> None:
    """Which CPU kernels the prediction models: their temporary buffers depend on it."""
    if k["onednn"]:
        as_run = schedule != "categorized"
        what = ": its graph pass merged filter and bias gradients, pooling workspaces"
        print(f"kernels      this CPU's, oneDNN on{what if as_run else ''}")
        return
    print(
        "kernels      this CPU's, oneDNN off: TensorFlow's convolution gradients with their "
        f"im2col buffers ({k['threads']} threads)"
    )


def _print_run_ahead(graph: Any, peak_op: str, serial: tuple[str, ...]) -> None:
    """What the loop the peak is at holds for the iterations its executor runs ahead (how far
    they get depends on the machine's threads, so the measured peak varies around it), gone
    with --serialize."""
    op = graph.ops.get(peak_op)
    if op is None or not op.ahead or peak_op in serial:
        return
    print(
        f"  run-ahead  {_sized(op.ahead)} of it is held for the loop's iterations running "
        "ahead, which varies from run to run; --serialize runs them one at a time"
    )


def print_simulation(
    args: argparse.Namespace, sim: Any, preset: Any, op_times: str | None = None
) -> None:
    r = sim.result
    where = preset.name if preset else "CPU allocator model"
    print(f"model        {args.model}, batch {args.batch_size}, on {where}")
    print(f"ops          {len(sim.graph.ops)} in {r.order.n_levels} levels")
    print(f"persistent   {_sized(r.persistent_bytes)}  (weights, optimizer slots, input batch)")
    print(f"peak         {_sized(r.peak_bytes)}  (BFC allocator model, {sim.schedule} order)")
    if preset is None and sim.schedule != "categorized":
        print(
            "             (the step as this CPU runs it; to size a GPU budget, simulate with "
            "--device: fit plans in the categorized order)"
        )
    if sim.order_peaks:
        low, high = format_bytes(sim.order_peaks[0]), format_bytes(sim.order_peaks[-1])
        print(f"  orders     median of {len(sim.order_peaks)} executor orders: {low} to {high}")
    _print_run_ahead(sim.graph, r.peak_op, sim.plan.serial_loops)
    recomputes = sim.plan.recomputes
    if sim.swapped_tensors or sim.evaluation.params.n_tensors != 0 or recomputes:
        print(f"  no swap    {_sized(sim.baseline.peak_bytes)}")
        print(f"  swapped    {sim.swapped_tensors} tensors, {_sized(sim.plan.swapped_bytes)}")
        if recomputes:
            added = sim.recompute_seconds
            rerun = f", {added * 1e3:.2f} ms re-run per step" if added is not None else ""
            made = _sized(sim.plan.recomputed_bytes)
            print(f"  recomputed {sim.plan.recomputed_tensors} tensors, {made}{rerun}")
        print(f"peak host    {_sized(r.host_peak_bytes)}")
    _print_order_edges(sim.plan.order_edges, sim.plan.serial_loops)
    print(f"lower bound  {_sized(sim.lower_bound_bytes)}  (resident + largest op working set)")
    print(f"live peak    {_sized(r.live_peak_bytes)}  (sum of live tensors)")
    print(f"peak at      level {r.peak_level}, op {r.peak_op}  ({sim.schedule} order)")
    for i, (tensor, nbytes) in enumerate(r.largest_at_peak(5)):
        print(f"{'at the peak' if i == 0 else '':<12} {_sized(nbytes)}  {tensor}")
    if sim.step_seconds is not None:
        print(
            f"step time    {sim.step_seconds * 1e3:.2f} ms  (no swap "
            f"{sim.baseline_step_seconds * 1e3:.2f} ms, overhead {sim.overhead:.3f}x)"
        )
    print_waits(sim.evaluation.waits_seconds)
    if sim.time_bound_seconds is not None and sim.baseline_step_seconds:
        bound = sim.time_bound_seconds
        print(
            f"time bound   {bound * 1e3:.2f} ms  ({bound / sim.baseline_step_seconds:.3f}x: the "
            "least any plan could reach within the device memory)"
        )
    if op_times:
        print(f"op times     {op_times}")
    if preset is not None and preset.memory_bytes:
        fits = "fits" if r.peak_bytes <= preset.memory_bytes else "does NOT fit"
        print(f"device       {fits} in {_sized(preset.memory_bytes)}")
    if sim.cpu_kernels is not None:
        _print_cpu_kernels(sim.cpu_kernels, sim.schedule)
    print(f"simulation   {sim.simulate_seconds * 1e3:.1f} ms (tracing {sim.trace_seconds:.1f} s)")
    if sim.profiled_peak_bytes:
        print(f"profiled     {_sized(sim.profiled_peak_bytes)}  (measured in the recorded step)")


def print_verification(v: Any) -> None:
    """The measured peaks and step times of a verification next to the prediction."""
    made = f", recomputed {v.plan.recomputed_tensors}" if v.plan.recomputes else ""
    added = "ops added" if v.plan.recomputes else "swap ops"
    print(
        f"swapped      {len(v.plan.swaps)} tensors{made}; {len(v.executed)} of {v.swap_ops} "
        f"{added} ran (read from the executed graphs)"
    )
    if v.gating is not None:
        print(f"gating       {v.gating.summary()}")
        print(f"             (checked on {v.gating_place}, from the executed graphs and a profile)")
        for gate in [g for g in v.gating.gates if not g.gated][:3]:
            print(f"             NOT gated: {gate.swap_in}: {gate.reason}")
    _print_order_edges(v.plan.order_edges, v.plan.serial_loops)
    for label, run, pred, seconds in (
        ("tuned", v.tuned, v.predicted_peak_bytes, v.predicted_step_seconds),
        ("original", v.baseline, v.baseline_predicted_peak_bytes,
         v.baseline_predicted_step_seconds),
    ):  # fmt: skip
        measured = _sized(run.peak_bytes) if run.peak_bytes else run.error
        print(f"{label:<12} measured {measured}, predicted {_sized(pred)}")
        if run.step_seconds is not None:
            said = f", predicted {seconds * 1e3:.1f} ms ({v.time_model})" if seconds else ""
            print(f"{'':<12} step {run.step_seconds * 1e3:.1f} ms (median of {v.steps}){said}")
    if v.error_percent is not None:
        print(f"error        {v.error_percent:+.1f} % (predicted against measured, tuned)")
    if v.as_run_error_percent is not None:
        error = f"{v.as_run_error_percent:+.1f} %"
        print(f"as run       predicted {_sized(v.as_run_peak_bytes)}, {error} against measured")
        print(f"{'':<12} (simulated on what TensorFlow runs: the rewritten step after Grappler)")
    if v.memory_bytes is not None:
        verdict = "fits" if v.fits else "does NOT fit"
        print(f"{verdict:<12} {_sized(v.memory_bytes)} of device memory (measured, tuned)")


def print_fit(
    args: argparse.Namespace, tuned: Any, name: str, report: Any, d: dict[str, Any]
) -> None:
    """`autotune fit`'s lines; `d`: its JSON fields."""
    from autotune.report.facts import edge_saving, params_line
    from autotune.report.write import batches_table, methods_table

    cube = f", cube {d['cube']}" if "cube" in d else ""
    print(
        f"model        {args.model}, batch {d['batch_size']}{cube}, on {d['device']}; budget "
        f"{_sized(d['budget_bytes'])} = {d['safety_ratio']:.2f} x {_sized(d['gpu_memory_bytes'])}"
    )
    print(f"lower bound  {_sized(d['lower_bound_bytes'])}  (resident + largest op working set)")
    if tuned.fits_without_swapping:
        print(
            f"no swap      fits without swapping: predicted peak {_sized(d['baseline_peak_bytes'])}"
            " is within the budget; the step is returned untouched"
        )
    else:
        print(f"tuned        {params_line(d['params'])}")
        print(
            f"             peak {_sized(d['predicted_peak_bytes'])} (no swap, categorized order: "
            f"{_sized(d['baseline_peak_bytes'])}), overhead {_times(d['predicted_overhead'])}, "
            f"{d['swapped_tensors']} tensors swapped{_recomputed(d)}"
        )
        if d.get("as_run_peak_bytes") is not None:
            print(
                f"             as run {_sized(d['as_run_peak_bytes'])} (simulated on the graph "
                "TensorFlow runs: Grappler regroups what reads its swap-ins)"
            )
        print_waits(d["waits_seconds"])
        _print_time_bound(d)
        edges = tuple(map(tuple, d["order_edges"]))
        _print_order_edges(edges, d["serial_loops"], saved=edge_saving(d))
    _print_host(d)
    if d["replicas"] > 1:
        _print_machine(d)
    batches = batches_table(tuned)
    if batches is not None:
        size = tuned.size_name
        print(f"\nlargest {size} that fits, per method:")
        print(batches.to_string(index=False))
        print(f"limited by   {d['max_batch_limited_by']} (at the next {size} up, tuned)")
    print(f"\nmethods at batch {d['batch_size']}{cube}:")
    print(methods_table(tuned).to_string(index=False))
    if tuned.verification is not None:
        print(f"\nverified: the tuned and the original step run on {tuned.verification.place}")
        print_verification(tuned.verification)
    print(f"\ntuning {d['tuning_seconds']:.1f} s, tracing {d['trace_seconds']:.1f} s")
    html = report.with_suffix(".html")
    print(f"report       {report} and {html.name} beside it")
    print(f"study        {name!r}: resume it by running the same command")


def _recomputed(d: dict[str, Any]) -> str:
    if not d["recomputed_tensors"]:
        return ""
    seconds = d["recompute_seconds"]
    rerun = f" ({seconds * 1e3:.1f} ms re-run)" if seconds is not None else ""
    return f", {d['recomputed_tensors']} recomputed{rerun}"


def print_waits(waits: dict[str, float] | None) -> None:
    """What a plan's step waits for, where it waits at all (the time model's)."""
    from autotune.report.timeview import WAIT_ROWS

    if not waits or not any(waits.values()):
        return
    parts = ", ".join(f"{WAIT_ROWS[k]} {v * 1e3:.1f} ms" for k, v in waits.items() if v)
    print(f"stalls       {parts}")


def _print_time_bound(d: dict[str, Any]) -> None:
    bound, base = d["time_bound_seconds"], d["baseline_step_seconds"]
    if bound is not None and base:
        print(f"time bound   {bound / base:.3f}x  (the least overhead any plan could reach here)")


def _print_host(d: dict[str, Any]) -> None:
    """The plan's host peak against the host limit, and the variable to raise if needed."""
    from autotune.search.host import pinned_hint

    peak, limit = d["predicted_host_peak_bytes"], d["host_memory_bytes"]
    against = f"of {_sized(limit)} allowed" if limit else "(no host limit: --host-memory)"
    print(f"host peak    {_sized(peak)} {against}")
    hint = pinned_hint(peak)
    if hint:
        print(f"             {hint}")


def machine_figures(d: dict[str, Any], replicas: int, host: int | None) -> dict[str, Any]:
    """The fit's figures for the whole machine when `replicas` GPUs each run the tuned step
    (`d`: `TuningResult.to_dict`, per replica; `host`: the machine's host limit)."""
    out = {
        "replicas": replicas,
        "global_batch_size": replicas * d["batch_size"] if d["batch_size"] else None,
        "machine_host_peak_bytes": replicas * d["predicted_host_peak_bytes"],
        "machine_host_memory_bytes": host,
    }
    for key in ("max_batch_no_swap", "max_batch_tuned"):
        if d.get(key) is not None:
            out[f"global_{key}"] = replicas * d[key]
    return out


def _print_machine(d: dict[str, Any]) -> None:
    """The global batch and the host memory all replicas of the machine take together."""
    from autotune.search.host import pinned_hint

    n, peak, limit = d["replicas"], d["machine_host_peak_bytes"], d["machine_host_memory_bytes"]
    against = f"of {_sized(limit)} allowed" if limit else "(no host limit: --host-memory)"
    print(f"replicas     {n}: batch {d['batch_size']} each, {d['global_batch_size']} in all")
    print(f"machine host {_sized(peak)} for {n} replicas {against}")
    hint = pinned_hint(peak)  # TensorFlow's pinned cap is one per process
    if hint:
        print(f"             {hint}")


def _times(value: float | None) -> str:
    """An overhead such as 1.154x, or a note when no time model ran (no per-op costs)."""
    return "n/a (no op costs)" if value is None else f"{value:.3f}x"
