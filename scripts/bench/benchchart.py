"""Grouped bar charts as SVG, shared by scripts/bench/compare and scripts/bench/isolation.

Every chart carries the run's date and commit under its title and the value on each bar. The
axis is logarithmic when the values span more than a decade (cilfs and the kernel filesystems
differ by 10-100x here, and a linear axis flattens the FUSE bars to nothing), or the values are
ratios to a reference series (`ratios_to`), drawn on a log axis around a line at 1x. A cell that
was not run is drawn as a dashed empty box labelled "not run", never as a bar of height 0; a
measured 0 is a flat bar labelled 0.

Only the Python standard library is used.
"""

import math
import subprocess

COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
          "#7f7f7f", "#bcbd22", "#17becf", "#393b79"]


def head_commit(cwd=None):
    """The short commit of the tree the benchmark runs from, with "+dirty" if it has changes."""
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=cwd, capture_output=True,
                             text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd,
                               capture_output=True, text=True, check=True).stdout.strip()
        return rev + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return None


def fmt(v):
    """A value as a bar label: three significant digits, thousands as k, millions as M."""
    if v == 0:
        return "0"
    a = abs(v)
    if a >= 1e6:
        return f"{v / 1e6:.3g}M"
    if a >= 1e3:
        return f"{v / 1e3:.3g}k"
    return f"{v:.3g}"


def _esc(s):
    return str(s).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def ratios(values, groups, series, reference):
    """values[(g, s)] as ratios to values[(g, reference)] (medians, and the range scaled alike);
    None where either is missing or the reference is 0."""
    out = {}
    for g in groups:
        ref = values.get((g, reference))
        ref = ref[0] if isinstance(ref, tuple) else ref
        for s in series:
            v = values.get((g, s))
            if v is None or isinstance(v, str) or not ref or isinstance(ref, str):
                out[(g, s)] = v if isinstance(v, str) else None
                continue
            out[(g, s)] = tuple(x / ref for x in v) if isinstance(v, tuple) else v / ref
    return out


def svg_bars(title, unit, groups, series, values, path, date=None, commit=None, ratios_to=None,
             log=None):
    """Writes a grouped bar chart to `path`: `groups` on x, one bar per series.

    values[(group, series)] is a number, a (median, min, max) tuple (a range is drawn as a whisker),
    None / absent for "not run", or a string: drawn like "not run" and labelled with it ("no
    device"). `ratios_to` names a series: every bar is then its value
    divided by that series' in the same group, on a log axis around 1x. `log` forces the axis
    (default: log when the values span more than a decade)."""
    if ratios_to is not None:
        values = ratios(values, groups, series, ratios_to)
        unit = f"ratio to {ratios_to}"
        log = True

    def med(v):
        return v[0] if isinstance(v, tuple) else v

    def rng(v):
        return (v[1], v[2]) if isinstance(v, tuple) and len(v) >= 3 else (med(v), med(v))

    present = [v for v in values.values() if v is not None and not isinstance(v, str)]
    positive = [x for v in present for x in (med(v),) + rng(v) if x and x > 0]
    vmax = max(positive + [1e-9])
    vmin = min(positive + [vmax])
    if log is None:
        log = vmax / max(vmin, 1e-12) > 10
    W, H, left, bottom, top = 1100, 480, 80, 110, 62
    plot_w, plot_h = W - left - 20, H - top - bottom
    if log:
        lo_e = math.floor(math.log10(vmin))
        hi_e = max(math.ceil(math.log10(vmax)), lo_e + 1)
        if ratios_to is not None:
            lo_e, hi_e = min(lo_e, -1), max(hi_e, 1)

        def y_of(v):
            return plot_h * (math.log10(max(v, 10 ** lo_e)) - lo_e) / (hi_e - lo_e)
        ticks = [(plot_h * i / (hi_e - lo_e), fmt(10 ** (lo_e + i)) + ("x" if ratios_to else ""))
                 for i in range(hi_e - lo_e + 1)]
    else:
        raw = vmax / 5
        mag = 10 ** math.floor(math.log10(raw))
        step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
        top_v = step * math.ceil(vmax / step)

        def y_of(v):
            return plot_h * v / top_v
        ticks = [(y_of(step * i), fmt(step * i)) for i in range(int(round(top_v / step)) + 1)]
    gw = plot_w / max(len(groups), 1)
    bw = gw * 0.8 / max(len(series), 1)
    sub = " | ".join(x for x in (f"run {date}" if date else "run date not recorded",
                                 f"commit {commit}" if commit else "commit not recorded") if x)
    axis = unit + (" (log scale)" if log and ratios_to is None else "")
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
           f'font-family="sans-serif" font-size="11">',
           f'<defs><pattern id="notrun" width="6" height="6" patternUnits="userSpaceOnUse" '
           f'patternTransform="rotate(45)"><line x1="0" y1="0" x2="0" y2="6" stroke="#bbb"/></pattern></defs>',
           f'<text x="{W/2}" y="20" text-anchor="middle" font-size="14">{_esc(title)}</text>',
           f'<text x="{W/2}" y="38" text-anchor="middle" font-size="11" fill="#555">{_esc(sub)}</text>',
           f'<text x="16" y="{top + plot_h/2}" transform="rotate(-90 16 {top + plot_h/2})" '
           f'text-anchor="middle">{_esc(axis)}</text>']
    for y, label in ticks:
        yy = top + plot_h - y
        out.append(f'<line x1="{left}" x2="{W-20}" y1="{yy:.1f}" y2="{yy:.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{left-5}" y="{yy+4:.1f}" text-anchor="end">{label}</text>')
    if ratios_to is not None:
        yy = top + plot_h - y_of(1.0)
        out.append(f'<line x1="{left}" x2="{W-20}" y1="{yy:.1f}" y2="{yy:.1f}" stroke="#000" '
                   f'stroke-dasharray="4 3"/>')
    for gi, g in enumerate(groups):
        x0 = left + gi * gw + gw * 0.1
        for si, s in enumerate(series):
            x = x0 + si * bw
            v = values.get((g, s))
            if v is None or isinstance(v, str):
                why = "not run" if v is None else v
                h = plot_h * 0.25
                out.append(f'<rect x="{x:.1f}" y="{top+plot_h-h:.1f}" width="{bw*0.9:.1f}" height="{h:.1f}" '
                           f'fill="url(#notrun)" stroke="{COLORS[si % len(COLORS)]}" stroke-dasharray="3 2">'
                           f'<title>{_esc(g)} {_esc(s)}: {_esc(why)}</title></rect>')
                out.append(f'<text x="{x + bw*0.45:.1f}" y="{top+plot_h-h-3:.1f}" text-anchor="middle" '
                           f'font-size="9" fill="#777">{_esc(why)}</text>')
                continue
            m = med(v)
            h = y_of(m) if m > 0 else 0
            label = fmt(m) + ("x" if ratios_to is not None else "")
            out.append(f'<rect x="{x:.1f}" y="{top+plot_h-h:.1f}" width="{bw*0.9:.1f}" height="{max(h, 1):.1f}" '
                       f'fill="{COLORS[si % len(COLORS)]}"><title>{_esc(g)} {_esc(s)}: {m:.4g} '
                       f'{_esc(unit)}</title></rect>')
            lo, hi = rng(v)
            if hi > lo and hi > 0:
                xl = x + bw * 0.45
                out.append(f'<line x1="{xl:.1f}" x2="{xl:.1f}" y1="{top+plot_h-y_of(hi):.1f}" '
                           f'y2="{top+plot_h-(y_of(lo) if lo > 0 else 0):.1f}" stroke="black"/>')
            ty = top + plot_h - max(h, y_of(hi) if hi > 0 else 0) - 3
            out.append(f'<text x="{x + bw*0.45:.1f}" y="{ty:.1f}" text-anchor="middle" '
                       f'font-size="10">{label}</text>')
        out.append(f'<text x="{x0 + gw*0.4:.1f}" y="{top+plot_h+15}" text-anchor="middle">{_esc(g)}</text>')
    per_row = max(1, (W - left) // 170)
    for si, s in enumerate(series):
        x = left + (si % per_row) * 170
        y = H - 60 + (si // per_row) * 18
        out.append(f'<rect x="{x}" y="{y-9}" width="10" height="10" fill="{COLORS[si % len(COLORS)]}"/>'
                   f'<text x="{x+14}" y="{y}">{_esc(s)}</text>')
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")
