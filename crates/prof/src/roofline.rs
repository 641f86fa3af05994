//! The roofline figure: on the left, each kernel's achieved FLOP/s against its arithmetic
//! intensity (FLOPs per byte moved), under the copy-bandwidth and FMA ceilings; on the
//! right, each kernel's achieved bandwidth against the copy ceiling. Kernels are numbered
//! in summary order and keep one colour in both panels.

use crate::canvas::{Canvas, Rgb, BLACK, GLYPH, GREY};
use crate::summary::{Ceilings, Summary};

const WIDTH: u32 = 1200;
const HEIGHT: u32 = 640;
/// The roofline plot area.
const PLOT: (i32, i32, i32, i32) = (90, 70, 470, 480);
/// Bars: labels from `BAR_LABEL`, bars from `BAR_X` over `BAR_W` pixels.
const BAR_LABEL: i32 = 620;
const BAR_X: i32 = 830;
const BAR_W: i32 = 250;
const BAR_ROW: i32 = 18;
const MEMORY_ROOF: Rgb = [31, 119, 180];
const COMPUTE_ROOF: Rgb = [214, 39, 40];

const PALETTE: [Rgb; 10] = [
    [31, 119, 180],
    [255, 127, 14],
    [44, 160, 44],
    [214, 39, 40],
    [148, 103, 189],
    [140, 86, 75],
    [227, 119, 194],
    [127, 127, 127],
    [188, 189, 34],
    [23, 190, 207],
];

#[derive(Debug, thiserror::Error)]
pub enum RooflineError {
    #[error("encoding the roofline PNG: {0}")]
    Png(#[from] png::EncodingError),
}

fn colour(i: usize) -> Rgb {
    PALETTE[i % PALETTE.len()]
}

/// A log10 axis over whole decades `lo..hi`, mapped onto `len` pixels from `at`.
struct LogAxis {
    lo: f64,
    hi: f64,
    at: i32,
    len: i32,
}

impl LogAxis {
    /// Decades covering every value of `xs` (positive, finite) with a little room to
    /// spare, at least `span` wide.
    fn covering(xs: &[f64], at: i32, len: i32, span: f64) -> LogAxis {
        let logs: Vec<f64> = xs
            .iter()
            .filter(|x| x.is_finite() && **x > 0.0)
            .map(|x| x.log10())
            .collect();
        let lo = logs.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = logs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let (mut lo, mut hi) = if lo.is_finite() {
            ((lo - 0.1).floor(), (hi + 0.1).ceil())
        } else {
            (0.0, 1.0)
        };
        while hi - lo < span {
            hi += 1.0;
            if hi - lo < span {
                lo -= 1.0;
            }
        }
        LogAxis { lo, hi, at, len }
    }

    /// Pixel offset of log10 value `l` (may fall outside the axis).
    fn pos(&self, l: f64) -> i32 {
        self.at + ((l - self.lo) / (self.hi - self.lo) * self.len as f64).round() as i32
    }

    fn decades(&self) -> impl Iterator<Item = i32> {
        (self.lo as i32)..=(self.hi as i32)
    }
}

/// One kernel's point: index (in summary order), intensity and FLOP/s.
struct Point {
    index: usize,
    intensity: f64,
    flops: f64,
}

fn roofline_panel(c: &mut Canvas, points: &[Point], ceilings: &Ceilings) {
    let (left, top, w, h) = PLOT;
    c.text(left, top - 22, "FLOP/s against FLOP per byte", BLACK, 1);
    let mut xs: Vec<f64> = points.iter().map(|p| p.intensity).collect();
    let mut ys: Vec<f64> = points.iter().map(|p| p.flops).collect();
    if let (Some(bw), Some(peak)) = (ceilings.copy_bytes_per_s, ceilings.flops) {
        xs.push(peak / bw);
    }
    ys.extend(ceilings.flops);
    let x = LogAxis::covering(&xs, left, w, 2.0);
    let mut y_values = ys.clone();
    if let Some(bw) = ceilings.copy_bytes_per_s {
        // Keep the memory roof's left end in view when the points are all compute-heavy.
        y_values.push(bw * 10f64.powf(x.lo + 0.5));
    }
    let y = LogAxis::covering(&y_values, 0, h, 2.0);
    let py = |l: f64| top + h - y.pos(l);

    for d in x.decades() {
        let px = x.pos(d as f64);
        c.line((px, top), (px, top + h), GREY, 3);
        let label = format!("1e{d}");
        c.text(
            px - Canvas::text_width(&label, 1) / 2,
            top + h + 6,
            &label,
            BLACK,
            1,
        );
    }
    for d in y.decades() {
        let p = py(d as f64);
        c.line((left, p), (left + w, p), GREY, 3);
        let label = format!("1e{d}");
        c.text(
            left - Canvas::text_width(&label, 1) - 6,
            p - GLYPH / 2,
            &label,
            BLACK,
            1,
        );
    }
    c.text(left + w / 2 - 60, top + h + 22, "FLOP per byte", BLACK, 1);
    c.text(2, top + h / 2 - GLYPH * 3, "FLOP/s", BLACK, 1);

    // The roofs, column by column: min(bandwidth · intensity, peak).
    let mut prev: Option<(i32, i32, Rgb)> = None;
    for px in left..=left + w {
        let lx = x.lo + (px - left) as f64 / w as f64 * (x.hi - x.lo);
        let memory = ceilings.copy_bytes_per_s.map(|bw| bw.log10() + lx);
        let compute = ceilings.flops.map(f64::log10);
        let (roof, col) = match (memory, compute) {
            (Some(m), Some(p)) if m < p => (m, MEMORY_ROOF),
            (Some(m), None) => (m, MEMORY_ROOF),
            (_, Some(p)) => (p, COMPUTE_ROOF),
            (None, None) => break,
        };
        let p = py(roof);
        if let Some((x0, y0, _)) = prev {
            if (top..=top + h).contains(&p) && (top..=top + h).contains(&y0) {
                c.line((x0, y0), (px, p), col, 0);
                c.line((x0, y0 + 1), (px, p + 1), col, 0);
            }
        }
        prev = Some((px, p, col));
    }
    let mut legend = top + h + 40;
    if let Some(bw) = ceilings.copy_bytes_per_s {
        c.text(
            left,
            legend,
            &format!("copy ceiling {:.0} GB/s", bw / 1e9),
            MEMORY_ROOF,
            1,
        );
        legend += 14;
    }
    if let Some(peak) = ceilings.flops {
        c.text(
            left,
            legend,
            &format!("f32 FMA ceiling {:.1} TFLOP/s", peak / 1e12),
            COMPUTE_ROOF,
            1,
        );
    }
    if points.is_empty() {
        c.text(
            left + 20,
            top + h / 2,
            "no kernel with modeled FLOPs",
            BLACK,
            1,
        );
    }
    for p in points {
        let (mx, my) = (x.pos(p.intensity.log10()), py(p.flops.log10()));
        c.marker(mx, my, 5, colour(p.index));
        c.text(mx + 7, my - 10, &(p.index + 1).to_string(), BLACK, 1);
    }
    c.line((left, top), (left, top + h), BLACK, 0);
    c.line((left, top + h), (left + w, top + h), BLACK, 0);
}

fn bandwidth_panel(c: &mut Canvas, s: &Summary, ceilings: &Ceilings) {
    let top = PLOT.1;
    c.text(
        BAR_LABEL,
        top - 22,
        "achieved bandwidth per kernel (GB/s)",
        BLACK,
        1,
    );
    let rates: Vec<(usize, f64)> = s
        .rows
        .iter()
        .enumerate()
        .filter_map(|(i, r)| r.bytes_per_s().map(|b| (i, b)))
        .collect();
    let most = rates
        .iter()
        .map(|r| r.1)
        .chain(ceilings.copy_bytes_per_s)
        .fold(0.0, f64::max)
        * 1.05;
    let rows = ((HEIGHT as i32 - top - 40) / BAR_ROW) as usize;
    let label_chars = ((BAR_X - BAR_LABEL - 8) / GLYPH) as usize;
    for (n, &(i, rate)) in rates.iter().take(rows).enumerate() {
        let y = top + n as i32 * BAR_ROW;
        let mut name = format!("{} {}", i + 1, s.rows[i].kernel);
        if name.chars().count() > label_chars {
            name = name
                .chars()
                .take(label_chars.saturating_sub(1))
                .collect::<String>()
                + "~";
        }
        c.text(BAR_LABEL, y + 3, &name, BLACK, 1);
        let len = ((rate / most) * BAR_W as f64).round() as i32;
        c.fill_rect(BAR_X, y, len.max(1), BAR_ROW - 4, colour(i));
        let value = match ceilings.copy_bytes_per_s {
            Some(bw) => format!("{:.0} ({:.0}%)", rate / 1e9, 100.0 * rate / bw),
            None => format!("{:.3e}", rate / 1e9),
        };
        c.text(BAR_X + len + 4, y + 3, &value, BLACK, 1);
    }
    if rates.len() > rows {
        c.text(
            BAR_LABEL,
            top + rows as i32 * BAR_ROW,
            &format!("... {} more", rates.len() - rows),
            BLACK,
            1,
        );
    }
    if rates.is_empty() {
        c.text(
            BAR_LABEL,
            top + 20,
            "no kernel with modeled bytes",
            BLACK,
            1,
        );
    }
    if let Some(bw) = ceilings.copy_bytes_per_s {
        let px = BAR_X + ((bw / most) * BAR_W as f64).round() as i32;
        let bottom = top + rates.len().min(rows) as i32 * BAR_ROW;
        c.line((px, top - 6), (px, bottom), MEMORY_ROOF, 3);
        c.text(px - 30, bottom + 4, "copy", MEMORY_ROOF, 1);
    }
}

/// The roofline figure of `summary` as PNG bytes, under `title`. Kernels without modeled
/// bytes are left out of both panels, and those without modeled FLOPs out of the left
/// one; an absent ceiling is not drawn.
pub fn roofline_png(
    summary: &Summary,
    ceilings: &Ceilings,
    title: &str,
) -> Result<Vec<u8>, RooflineError> {
    let mut c = Canvas::new(WIDTH, HEIGHT);
    c.text(20, 12, title, BLACK, 2);
    let points: Vec<Point> = summary
        .rows
        .iter()
        .enumerate()
        .filter_map(|(index, r)| {
            let flops = r.flops_per_s()?;
            Some(Point {
                index,
                intensity: r.flops as f64 / r.bytes as f64,
                flops,
            })
        })
        .filter(|p| p.intensity.is_finite() && p.intensity > 0.0)
        .collect();
    roofline_panel(&mut c, &points, ceilings);
    bandwidth_panel(&mut c, summary, ceilings);
    Ok(c.png()?)
}
