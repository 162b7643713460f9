"""The tables ``benchmarks/collectives.py`` prints: one row per op and size (ours against the
raw call, in place, the data path; bus bandwidth and ratios) and the ResNet-50 gradients'
line."""

from __future__ import annotations

__all__ = ["fmt_size", "print_gradients", "print_table"]


def fmt_size(size: int) -> str:
    return f"{size >> 20} MiB" if size >= 1 << 20 else f"{size >> 10} KiB"


def print_table(rows: list[dict]) -> None:
    first = rows[0]
    raw = first["raw"] or "no raw contender"
    fresh = ("raw us: the raw call into a fresh result, like ours (the baseline); in-place: "
             "into a preallocated buffer" if first.get("raw_fresh_result")
             else "raw us: the raw call in place")
    data = any(r.get("ours_data_s") for r in rows)
    print(f"# {first['instances']} instances over {first['transport']} (one replica each), "
          f"float32, against {raw}; times: medians over rounds of the instances' mean; "
          f"GB/s = 1e9 B/s; ratio = raw time / ours (>1: ours "
          f"faster); {fresh}" + ("; data: the op's data path alone (no agreement, "
                                "accounting), data ratio = raw / data" if data else ""))
    print(f"{'op':<18} {'size':>8} {'ours us':>10} {'raw us':>10} {'in-place':>10} "
          + (f"{'data us':>10} " if data else "")
          + f"{'ours busbw':>10} {'ratio':>6} {'in-pl.':>6}" + (f" {'data':>6}" if data else ""))

    def us(t) -> str:
        return f"{t * 1e6:>10.1f}" if t else f"{'-':>10}"

    def ratio(v) -> str:
        return f"{v:>6.2f}" if v else f"{'-':>6}"

    for r in rows:
        print(f"{r['op']:<18} {fmt_size(r['size']):>8} {r['ours_s'] * 1e6:>10.1f} "
              f"{us(r['raw_s'])} {us(r.get('raw_inplace_s'))} "
              + (f"{us(r.get('ours_data_s'))} " if data else "")
              + f"{r['ours_busbw_GBps']:>10.3f} {ratio(r['ratio'])} "
              f"{ratio(r.get('ratio_inplace'))}"
              + (f" {ratio(r.get('data_ratio'))}" if data else ""))


def print_gradients(g: dict, transport: str, instances: int) -> None:
    parts = ", ".join(f"{k.replace('_', ' ')} {g[k] * 1e3:.1f} ms"
                      for k in ("ours_per_tensor", "ours_nest", "raw_per_tensor", "raw_fused")
                      if k in g)
    print(f"# ResNet-50 gradients ({g['tensors']} tensors, {g['floats'] / 1e6:.1f} M floats), "
          f"{instances} instances over {transport}: {parts}")
    if "raw_per_tensor" in g:
        print(f"#   ours per tensor / raw per tensor {g['ours_per_tensor'] / g['raw_per_tensor']:.2f}"
              + (f"; ours nest / raw fused {g['ours_nest'] / g['raw_fused']:.2f}"
                 if "ours_nest" in g else ""))
