//! The curves of a run as a PNG (`OUT/metrics.png`), drawn with plotters' bitmap backend. plotters'
//! text needs a font library, so the labels are drawn pixel by pixel with the public-domain 8×8 bitmap
//! font of `font8x8` instead: each panel has its title, its y range (min and max) and its step range.
//!
//! The panels lie in a grid [`WIDTH`] pixels wide ([`columns`] of them a row); the image grows in height
//! with the rows ([`height`]). [`metric_panels`] makes one panel per metric of a run's metrics lines.

use std::path::Path;

use plotters::prelude::*;
use serde_json::{Map, Value};

/// A named curve: its name, colour and points.
pub type Series = (String, RGBColor, Vec<(f64, f64)>);

/// A shaded range around a curve (e.g. the spread over seeds): its colour and (x, low, high) points.
pub type Band = (RGBColor, Vec<(f64, f64, f64)>);

/// One panel: a title, its series and the bands drawn under them.
pub struct Panel {
    pub title: String,
    pub series: Vec<Series>,
    pub bands: Vec<Band>,
}

/// The image's width, whatever the number of panels.
pub const WIDTH: u32 = 1000;
/// The band of the overall title above the panels.
pub const HEADER: u32 = 32;
/// The height of one row of panels.
pub const ROW_HEIGHT: u32 = 334;
/// The height of an image of two rows (3 to 6 panels, e.g. the 2×2 grid of four): `height(4)`.
pub const HEIGHT: u32 = HEADER + 2 * ROW_HEIGHT;

/// The panels a row: 1 for one panel, 2 for two or four (a 2×2 grid), else 3.
pub fn columns(panels: usize) -> usize {
    match panels {
        0 | 1 => 1,
        2 | 4 => 2,
        _ => 3,
    }
}

/// The rows of the grid of `panels` panels (at least one).
pub fn rows(panels: usize) -> usize {
    panels.div_ceil(columns(panels)).max(1)
}

/// The height of the image of `panels` panels: the title band and one [`ROW_HEIGHT`] a row.
pub fn height(panels: usize) -> u32 {
    HEADER + ROW_HEIGHT * rows(panels) as u32
}

const TEXT: RGBColor = RGBColor(30, 30, 30);
const GRID: RGBColor = RGBColor(225, 225, 225);
/// The curves' colours (matplotlib's first four), one per series of a panel.
pub const COLORS: [RGBColor; 4] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
];

/// Draw `text` with its top-left corner at `(x, y)`, each font pixel `scale` pixels wide.
fn text<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    x: i32,
    y: i32,
    text: &str,
    scale: i32,
    color: &RGBColor,
) {
    for (i, c) in text.chars().enumerate() {
        let glyph = font8x8::legacy::BASIC_LEGACY
            .get(c as usize)
            .copied()
            .unwrap_or([0; 8]);
        for (row, bits) in glyph.iter().enumerate() {
            for col in 0..8 {
                if bits & (1 << col) != 0 {
                    for dy in 0..scale {
                        for dx in 0..scale {
                            let px = x + (i as i32 * 8 + col) * scale + dx;
                            let py = y + row as i32 * scale + dy;
                            let _ = area.draw_pixel((px, py), color);
                        }
                    }
                }
            }
        }
    }
}

fn number(v: f64) -> String {
    if v == 0.0 {
        "0".into()
    } else if v.abs() >= 1000.0 || v.abs() < 0.01 {
        format!("{v:.2e}")
    } else {
        format!("{v:.3}")
    }
}

/// `text` cut to at most `max` characters: its head and tail around "..", so that both a metric's
/// group (`signal/…`) and its last part (`…/mean`) stay readable.
fn fit(text: &str, max: usize) -> String {
    let chars: Vec<char> = text.chars().collect();
    if chars.len() <= max {
        return text.to_string();
    }
    if max <= 2 {
        return chars[..max].iter().collect();
    }
    let tail = (max - 2) / 2;
    let head = max - 2 - tail;
    let mut out: String = chars[..head].iter().collect();
    out.push_str("..");
    out.extend(&chars[chars.len() - tail..]);
    out
}

/// Write the panels to `path` as a PNG [`WIDTH`] pixels wide and [`height`]`(panels.len())` high: the
/// overall `title` on top, then the panels in rows of [`columns`]`(panels.len())`, in order.
pub fn write_png(path: &Path, title: &str, panels: &[Panel]) -> Result<(), String> {
    let fail = |e: &dyn std::fmt::Display| format!("cannot write {}: {e}", path.display());
    let root = BitMapBackend::new(path, (WIDTH, height(panels.len()))).into_drawing_area();
    root.fill(&WHITE).map_err(|e| fail(&e))?;
    // The overall title: twice the font's size where it fits, else the font's size, cut to the width.
    let room = (WIDTH as usize - 20) / 8;
    if title.chars().count() <= room / 2 {
        text(&root, 10, 8, title, 2, &TEXT);
    } else {
        text(&root, 10, 12, &fit(title, room), 1, &TEXT);
    }
    let body = root.margin(HEADER, 0, 0, 0);
    let cells = body.split_evenly((rows(panels.len()), columns(panels.len())));
    for (panel, cell) in panels.iter().zip(&cells) {
        let band_points = panel
            .bands
            .iter()
            .flat_map(|b| b.1.iter())
            .flat_map(|&(x, low, high)| [(x, low), (x, high)]);
        let points = panel
            .series
            .iter()
            .flat_map(|s| s.2.iter().copied())
            .chain(band_points);
        let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
        for (x, y) in points.filter(|(x, y)| x.is_finite() && y.is_finite()) {
            x0 = x0.min(x);
            x1 = x1.max(x);
            y0 = y0.min(y);
            y1 = y1.max(y);
        }
        let (cell_width, _) = cell.dim_in_pixel();
        let chars = (cell_width as usize).saturating_sub(16) / 8;
        text(cell, 8, 4, &fit(&panel.title, chars), 1, &TEXT);
        if x0 > x1 {
            text(cell, 8, 40, "(no data)", 1, &TEXT);
            continue;
        }
        if x1 <= x0 {
            x1 = x0 + 1.0;
        }
        if y1 <= y0 {
            let pad = if y0 == 0.0 { 1.0 } else { y0.abs() * 0.1 };
            y0 -= pad;
            y1 += pad;
        }
        let mut chart = ChartBuilder::on(cell)
            .margin_top(18)
            .margin_right(16)
            .margin_bottom(22)
            .margin_left(68)
            .build_cartesian_2d(x0..x1, y0..y1)
            .map_err(|e| fail(&e))?;
        for k in 0..=4 {
            let y = y0 + (y1 - y0) * k as f64 / 4.0;
            chart
                .draw_series(LineSeries::new([(x0, y), (x1, y)], GRID))
                .map_err(|e| fail(&e))?;
        }
        chart
            .draw_series(std::iter::once(Rectangle::new(
                [(x0, y0), (x1, y1)],
                BLACK.stroke_width(1),
            )))
            .map_err(|e| fail(&e))?;
        for (color, points) in &panel.bands {
            let finite: Vec<(f64, f64, f64)> = points
                .iter()
                .copied()
                .filter(|(x, l, h)| x.is_finite() && l.is_finite() && h.is_finite())
                .collect();
            // The polygon of the upper edge left to right, then the lower edge back.
            let outline: Vec<(f64, f64)> = finite
                .iter()
                .map(|&(x, _, h)| (x, h))
                .chain(finite.iter().rev().map(|&(x, l, _)| (x, l)))
                .collect();
            if finite.len() > 1 {
                chart
                    .draw_series(std::iter::once(Polygon::new(
                        outline,
                        color.mix(0.2).filled(),
                    )))
                    .map_err(|e| fail(&e))?;
            }
        }
        for (k, (name, color, points)) in panel.series.iter().enumerate() {
            let finite: Vec<(f64, f64)> = points
                .iter()
                .copied()
                .filter(|(x, y)| x.is_finite() && y.is_finite())
                .collect();
            if finite.len() == 1 {
                chart
                    .draw_series(std::iter::once(Circle::new(finite[0], 3, color.filled())))
                    .map_err(|e| fail(&e))?;
            } else {
                chart
                    .draw_series(LineSeries::new(finite, color.stroke_width(2)))
                    .map_err(|e| fail(&e))?;
            }
            if panel.series.len() > 1 {
                let (lx, ly) = chart.backend_coord(&(x0, y1));
                text(&root, lx + 6, ly + 6 + 10 * k as i32, name, 1, color);
            }
        }
        // Labels, in root coordinates (the chart's backend coordinates are absolute).
        let (bx, by) = chart.backend_coord(&(x0, y0));
        let (tx, ty) = chart.backend_coord(&(x1, y1));
        let top = number(y1);
        let bottom = number(y0);
        text(&root, bx - 4 - 8 * top.len() as i32, ty - 4, &top, 1, &TEXT);
        text(
            &root,
            bx - 4 - 8 * bottom.len() as i32,
            by - 4,
            &bottom,
            1,
            &TEXT,
        );
        let left = format!("{x0:.0}");
        let right = format!("step {x1:.0}");
        text(&root, bx, by + 6, &left, 1, &TEXT);
        text(&root, tx - 8 * right.len() as i32, by + 6, &right, 1, &TEXT);
    }
    root.present().map_err(|e| fail(&e))?;
    Ok(())
}

/// Where a metric's panel goes: the reward, the loss, the recipe's terms, the signals, the held-out
/// evaluation, the other metrics (accuracy, KL, gradient norm, lengths, …), then throughput
/// (`…_per_s`, `…throughput…`) and time (`time/…`, other `…_s`).
fn group(key: &str) -> usize {
    let under = |prefix: &str| key == prefix || key.starts_with(&format!("{prefix}/"));
    if under("reward") {
        0
    } else if under("loss") {
        1
    } else if under("recipe") {
        2
    } else if under("signal") {
        3
    } else if under("eval") {
        4
    } else if key.ends_with("_per_s") || key.contains("throughput") {
        6
    } else if under("time") || key.ends_with("_s") {
        7
    } else {
        5
    }
}

/// A finite number of a metrics line, if `value` is one.
fn finite(value: &Value) -> Option<f64> {
    value.as_f64().filter(|v| v.is_finite())
}

/// One panel per metric of the run: every key of `history` (and of `before`) with a finite number on
/// some line, except "step"; `before`'s values (e.g. the held-out evaluation before the first step) at
/// x = 0, step k's at x = k + 1. A line of `history` without a non-negative numeric `step` is skipped;
/// nulls, strings and other non-numbers are not points. The panels are ordered by group (reward, loss,
/// `recipe/…`, `signal/…`, `eval/…`, the others, then throughput and `time/…`), by key within one,
/// each panel one series named by its key, coloured by its group.
pub fn metric_panels(history: &[Map<String, Value>], before: &Map<String, Value>) -> Vec<Panel> {
    let lines: Vec<(f64, &Map<String, Value>)> = history
        .iter()
        .filter_map(|line| {
            let step = line.get("step").and_then(finite).filter(|s| *s >= 0.0)?;
            Some((step + 1.0, line))
        })
        .collect();
    let mut keys: Vec<&String> = std::iter::once((0.0, before))
        .chain(lines.iter().copied())
        .flat_map(|(_, line)| line.iter())
        .filter(|(key, value)| *key != "step" && finite(value).is_some())
        .map(|(key, _)| key)
        .collect();
    keys.sort_by(|a, b| (group(a), a).cmp(&(group(b), b)));
    keys.dedup();
    keys.into_iter()
        .map(|key| {
            let points = std::iter::once((0.0, before))
                .chain(lines.iter().copied())
                .filter_map(|(x, line)| Some((x, finite(line.get(key)?)?)))
                .collect();
            Panel {
                title: key.clone(),
                series: vec![(key.clone(), COLORS[group(key) % COLORS.len()], points)],
                bands: Vec::new(),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fit_keeps_head_and_tail() {
        assert_eq!(fit("loss", 10), "loss");
        assert_eq!(fit("signal/correctness/mean", 12), "signa../mean");
        assert_eq!(fit("abcdef", 2), "ab");
        assert_eq!(fit("", 0), "");
    }

    #[test]
    fn writes_a_png_of_the_documented_size() {
        let dir = std::env::temp_dir().join(format!("rlx-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("curves.png");
        let line: Vec<(f64, f64)> = (0..20).map(|i| (i as f64, (i as f64).sin())).collect();
        let panels = vec![
            Panel {
                title: "reward/mean".into(),
                series: vec![("reward".into(), COLORS[0], line.clone())],
                bands: vec![(COLORS[0], vec![(0.0, -1.0, 1.0), (19.0, -0.5, 0.5)])],
            },
            Panel {
                title: "accuracy".into(),
                series: vec![
                    ("train".into(), COLORS[0], line),
                    ("eval".into(), COLORS[1], vec![(5.0, 0.5)]),
                ],
                bands: Vec::new(),
            },
            Panel {
                title: "empty".into(),
                series: vec![],
                bands: Vec::new(),
            },
        ];
        write_png(&path, "rlx run", &panels).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
        assert_eq!(&bytes[12..16], b"IHDR");
        let width = u32::from_be_bytes(bytes[16..20].try_into().unwrap());
        let height = u32::from_be_bytes(bytes[20..24].try_into().unwrap());
        assert_eq!((width, height), (WIDTH, super::height(3)));
        assert_eq!(super::height(3), HEADER + ROW_HEIGHT);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
